"""A unit's score for each image of a slab of rows: its maximum over the unit's positions (map positions, tokens),
in the stored dtype, or their mean in float64; what `units.top` ranks and `units.spectrum` counts."""

from __future__ import annotations

import numpy as np


def unit_maps(values: np.ndarray, axis: int | None) -> np.ndarray:
    """A slab of rows VALUES as (rows, units, positions): the unit axis (within a row) AXIS first (None: every
    entry a unit of one position); a view where the rows are channels first."""
    if axis is None:
        return values.reshape(len(values), -1, 1)
    return np.moveaxis(values, 1 + axis, 1).reshape(len(values), values.shape[1 + axis], -1)


def unit_scores(values: np.ndarray, axis: int | None, score: str) -> np.ndarray:
    """(rows, units) scores of a slab of rows VALUES (`unit_maps`): each unit's maximum over its positions, in the
    stored dtype (it is one of the values: exact), or their mean in float64 (torch's reductions: vectorized, on
    every core)."""
    flat = unit_maps(values, axis)
    if flat.shape[2] == 1:
        return flat[:, :, 0] if score == "max" else flat[:, :, 0].astype(np.float64)
    import torch  # for the ranking's arithmetic; `info` reads this module's names without it

    maps = torch.from_numpy(flat)  # strided where the units are the last axis (tokens): reduced without a copy
    if score == "mean":
        return (maps.sum(dim=2, dtype=torch.float64) / flat.shape[2]).numpy()
    return maps.amax(dim=2).numpy()
