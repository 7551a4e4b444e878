"""Folds: the K cross-validation folds of a read-out's rows, seeded, stratified by class for a probe.

Each class's rows (all rows to encode) are shuffled by the seed and dealt to the folds in turn, the deal going on
from class to class, so every fold holds each class in proportion and the folds' sizes differ by one at most.
The same rows, classes, K and seed give the same folds on any machine (numpy's PCG64).

Clips of videos are never dealt one by one: neighbouring clips of a film are alike (a movie's fMRI, its TRs), so a
fold holds whole videos (dealt as rows are, a video's class its first clip's) where there are as many videos as
folds; with fewer, each video's clips are cut into K contiguous stretches of time, one per fold.
"""

from __future__ import annotations

import numpy as np

from featdump.errors import UsageProblem


def assign_folds(count: int, folds: int, seed: int, classes: np.ndarray | None = None,
                 videos: np.ndarray | None = None) -> np.ndarray:
    """(COUNT,) int: each row's fold in 0..FOLDS-1; rows of clips (VIDEOS: each row's video, its rows in time
    order) kept together by video, or in stretches of time. UsageProblem when there are fewer rows than folds."""
    if videos is not None:
        return _video_folds(np.asarray(videos), folds, seed, classes)
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


def _video_folds(videos: np.ndarray, folds: int, seed: int, classes: np.ndarray | None) -> np.ndarray:
    """Whole videos dealt to FOLDS (stratified by their first clip's class) where there are enough of them; else
    each video's clips cut into FOLDS contiguous stretches."""
    order, firsts = np.unique(videos, return_index=True)
    if len(order) >= folds:
        unit_classes = classes[firsts] if classes is not None else None
        dealt = assign_folds(len(order), folds, seed, unit_classes)
        return dealt[np.searchsorted(order, videos)]
    assign_folds(len(videos), folds, seed)  # the same refusal of too few rows
    assigned = np.empty(len(videos), dtype=np.int64)
    for video in order:
        members = np.flatnonzero(videos == video)
        for fold, stretch in enumerate(np.array_split(members, folds)):
            assigned[stretch] = fold
    return assigned


def sparse_classes(classes: np.ndarray, names: list[str], folds: int) -> list[str]:
    """The classes with fewer images than folds (some folds hold none of them), as 'name (count)'."""
    counts = np.bincount(classes, minlength=len(names))
    return [f"{names[index]} ({count})" for index, count in enumerate(counts) if count < folds]
