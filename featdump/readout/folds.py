"""Folds: the K cross-validation folds of a read-out's rows, seeded, stratified by class for a probe.

Each class's rows (all rows to encode) are shuffled by the seed and dealt to the folds in turn, the deal going on
from class to class, so every fold holds each class in proportion and the folds' sizes differ by one at most.
The same rows, classes, K and seed give the same folds on any machine (numpy's PCG64).

Clips of videos are never dealt one by one: neighbouring clips of a film are alike (a movie's fMRI, its TRs), so a
fold holds whole videos where there are as many videos as folds (a probe's dealt as rows are, a video's class its
first clip's; an encoding model's balanced by rows, the longest videos first, with a warning when a fold holds
less than half the rows of the largest); with fewer, each video's clips, ordered by onset, are cut into K contiguous
stretches of time, one per fold. Then a fold trains on the other folds' rows less those of the same video within the gap
(seconds) of one of its held-out rows, on both sides (`training_rows`): no neighbouring TRs straddle training and
test. The rows of an image an output holds more than once (a list that names it twice) are kept together the same
way, as a video's: no row is held out while its copy trains.
"""

from __future__ import annotations

import logging

import numpy as np

from featdump.errors import UsageProblem

log = logging.getLogger("featdump")


def assign_folds(count: int, folds: int, seed: int, classes: np.ndarray | None = None,
                 videos: np.ndarray | None = None, onsets: np.ndarray | None = None) -> np.ndarray:
    """(COUNT,) int: each row's fold in 0..FOLDS-1; rows of clips (VIDEOS: each row's video; ONSETS: its time in
    it) kept together by video, or in stretches of time cut by onset, whatever order the rows are in (an update
    appends a video's clips read again). UsageProblem when there are fewer rows than folds."""
    if videos is not None:
        return _video_folds(np.asarray(videos), folds, seed, classes, onsets)
    if folds < 2:
        raise UsageProblem(f"--folds {folds}: cross-validation needs 2 folds at least.")
    if count < folds:
        raise UsageProblem(f"{count} image{'s' * (count != 1)} cannot be split into {folds} folds: use --folds "
                           f"{max(2, count)} or fewer, or more images.")
    rng = np.random.default_rng(seed)
    groups = [np.arange(count)] if classes is None else [np.flatnonzero(classes == label)
                                                           for label in np.unique(classes)]
    assigned = np.empty(count, dtype=np.int64)
    dealt = 0
    for members in groups:
        shuffled = rng.permutation(members)
        assigned[shuffled] = (dealt + np.arange(len(shuffled))) % folds
        dealt += len(shuffled)
    return assigned


def _video_folds(videos: np.ndarray, folds: int, seed: int, classes: np.ndarray | None,
                 onsets: np.ndarray | None = None) -> np.ndarray:
    """Whole videos dealt to FOLDS (stratified by their first clip's class, or balanced by rows) where there are
    enough of them; else each video's clips, in the order of their ONSETS (of the rows without them), cut into FOLDS
    contiguous stretches."""
    order, firsts, sizes = np.unique(videos, return_index=True, return_counts=True)
    if len(order) >= folds and classes is not None:
        dealt = assign_folds(len(order), folds, seed, classes[firsts])
        return dealt[np.searchsorted(order, videos)]
    if len(order) >= folds:
        return _balanced(sizes, folds, seed)[np.searchsorted(order, videos)]
    assign_folds(len(videos), folds, seed)  # the same refusal of too few rows
    assigned = np.empty(len(videos), dtype=np.int64)
    for video in order:
        members = np.flatnonzero(videos == video)
        if onsets is not None:
            members = members[np.argsort(np.asarray(onsets)[members], kind="stable")]
        for fold, stretch in enumerate(np.array_split(members, folds)):
            assigned[stretch] = fold
    return assigned


def _balanced(sizes: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Each video's fold: the longest first (ties in a seeded order), each to the fold with the fewest rows so far."""
    ties = np.random.default_rng(seed).permutation(len(sizes))
    dealt, rows = np.empty(len(sizes), dtype=np.int64), np.zeros(folds, dtype=np.int64)
    for video in sorted(range(len(sizes)), key=lambda index: (-sizes[index], ties[index])):
        dealt[video] = int(np.argmin(rows))
        rows[dealt[video]] += sizes[video]
    if rows.min() < rows.max() / 2:
        log.warning("The folds hold whole videos, and they differ in length: fold %d holds %d rows, fold %d %d; "
                    "fewer --folds (or videos of more even lengths) balance them.", int(np.argmin(rows)),
                    int(rows.min()), int(np.argmax(rows)), int(rows.max()))
    return dealt


def training_rows(fold: np.ndarray, videos: np.ndarray | None = None, starts: np.ndarray | None = None,
                  gap: float = 0.0) -> np.ndarray:
    """(N, K) bool: the rows each fold trains on: the other folds' rows, less those of a video within GAP seconds
    of one of the fold's held-out rows of that video (on both sides)."""
    folds = int(fold.max()) + 1
    training = fold[:, None] != np.arange(folds)[None, :]
    if videos is None or starts is None or gap <= 0:
        return training
    for number in range(folds):
        held_out = fold == number
        for video in np.unique(videos[held_out]):
            mine = np.flatnonzero(videos == video)
            onsets = np.sort(starts[mine[fold[mine] == number]])
            place = np.clip(np.searchsorted(onsets, starts[mine]), 1, len(onsets) - 1) if len(onsets) > 1 else \
                np.zeros(len(mine), dtype=np.int64)
            nearest = np.minimum(np.abs(starts[mine] - onsets[place]), np.abs(starts[mine] - onsets[place - 1])) \
                if len(onsets) > 1 else np.abs(starts[mine] - onsets[0])
            training[mine[nearest <= gap + 1e-6], number] = False
    return training


def sparse_classes(classes: np.ndarray, names: list[str], folds: int) -> list[str]:
    """The classes with fewer images than folds (some folds hold none of them), as 'name (count)'."""
    counts = np.bincount(classes, minlength=len(names))
    return [f"{names[index]} ({count})" for index, count in enumerate(counts) if count < folds]
