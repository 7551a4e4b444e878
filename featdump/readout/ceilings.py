"""Noise ceilings of an encoding model's targets from repeated measurements (trials) of the same images, as the
Natural Scenes Dataset computes them (Allen et al. 2022, "noise ceiling SNR"):

    noise variance     the mean over images of the variance of an image's trials (ddof 1; images of 2+ trials)
    signal variance    the variance of all the trials less the noise variance (0 where the noise exceeds it)
    ncsnr              sqrt(signal variance / noise variance)
    ceiling            ncsnr^2 / (ncsnr^2 + mean over images of 1 / its trials): the share of the variance of the
                       trials' mean that the images can explain (NSD's NC / 100), the most an encoding model's R^2
                       on those means can reach; sqrt(ceiling) bounds its Pearson r

The targets an encoding model fits are each image's mean over its trials (`averaged_trials`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Ceilings:
    """Each target's ncsnr and ceiling (T,), and each image's number of trials (N,)."""

    ncsnr: np.ndarray
    ceiling: np.ndarray
    trials: np.ndarray

    @property
    def r_ceiling(self) -> np.ndarray:
        """The most a Pearson r on the trials' means can reach, per target."""
        return np.sqrt(self.ceiling)


def trial_groups(keys: list) -> tuple[list, np.ndarray]:
    """(each of KEYS once, in first-seen order; each row's index into them): rows sharing a key are trials of one
    image."""
    first_seen: dict = {}
    group = np.array([first_seen.setdefault(key, len(first_seen)) for key in keys], dtype=np.int64)
    return list(first_seen), group


def averaged_trials(values: np.ndarray, group: np.ndarray, images: np.ndarray) -> tuple[np.ndarray, Ceilings]:
    """(the mean of each of IMAGES' trials, in IMAGES' order; the targets' Ceilings over those images) of trials
    VALUES (rows, T) of images GROUP (rows,); IMAGES are indices of groups."""
    place = np.full(int(group.max()) + 1 if len(group) else 0, -1, dtype=np.int64)
    place[images] = np.arange(len(images))
    kept = place[group] >= 0
    group, values = place[group[kept]], values[kept]
    trials = np.bincount(group, minlength=len(images))
    means = np.zeros((len(images), values.shape[1]))
    np.add.at(means, group, values)
    means /= trials[:, None]
    return means, ceilings(values, group, means, trials)


def ceilings(values: np.ndarray, group: np.ndarray, means: np.ndarray, trials: np.ndarray) -> Ceilings:
    """The Ceilings of trials VALUES (rows, T) of images GROUP (rows,), whose MEANS and TRIALS are given."""
    repeated = trials[group] > 1
    deviations = (values - means[group]) ** 2
    per_image = np.zeros_like(means)
    np.add.at(per_image, group[repeated], deviations[repeated])
    several = trials > 1
    noise = (per_image[several] / (trials[several, None] - 1)).mean(axis=0) if several.any() \
        else np.full(values.shape[1], np.nan)
    signal = np.maximum(values.var(axis=0, ddof=1) - noise, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ncsnr = np.where(noise > 0, np.sqrt(signal / np.where(noise > 0, noise, 1.0)), np.inf)
        squared = ncsnr ** 2
        ceiling = np.where(np.isinf(squared), 1.0, squared / (squared + np.mean(1.0 / trials)))
    return Ceilings(ncsnr, ceiling, trials)
