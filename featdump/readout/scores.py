"""Scores: a read-out layer's one number, defined once for the summary line, `Readout.score`, `info`, `--plot` and
`show` (this module imports no torch, so the faces read results without it).

    probe    accuracy: the mean over folds of each fold's held-out accuracy
    encode   median r: the median over targets of each target's Pearson r between its measured values and every
             image's held-out prediction (each image predicted by the fold that held it out), Brain-Score's
"""

from __future__ import annotations

import numpy as np

MEASURES = {"probe": "accuracy", "encode": "median r"}


def layer_score(kind: str, accuracy: np.ndarray | None, r: np.ndarray | None) -> float:
    """KIND's one number for a layer, from its folds' ACCURACY (probe) or its targets' R (encode)."""
    if kind == "probe":
        return float(np.mean(accuracy))
    return float(np.nanmedian(r)) if r is not None and np.isfinite(r).any() else float("nan")


def chance(labels: np.ndarray) -> tuple[float, float]:
    """(the majority class's share, 1 / classes) of LABELS: what a probe that learnt nothing scores, and the
    uniform guess."""
    counts = np.bincount(labels[labels >= 0])
    counts = counts[counts > 0]
    return float(counts.max() / counts.sum()), 1.0 / len(counts)
