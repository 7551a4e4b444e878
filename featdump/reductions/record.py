"""Reduction: what one layer's reduction is (the record every kind of reduction returns), and the flat view of a
batch in memory order that the projections read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import torch


@dataclass
class Reduction:
    """One layer's reduction: TEXT (canonical, as recorded), the per-image SHAPE it stores, APPLY on a
    batch-first tensor, the ATTRIBUTES written on the dataset, DEVICE_BYTES it holds (a projection), and a
    PCA's FIT (stored in the file beside the layer)."""

    text: str
    shape: tuple[int, ...]
    apply: Callable[[torch.Tensor], torch.Tensor]
    attributes: dict = field(default_factory=dict)
    device_bytes: int = 0
    fit: object = None


def flat_in_memory_order(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, D) values of a batch-first tensor without a copy where its memory allows, and the logical
    (C-order) index of each of the D columns, or None when they are in C order already.

    A channels_last (N, C, H, W) output flattens for free in (H, W, C) order; a projection then permutes its
    matrix's rows once (the column order is the only difference) instead of transposing every batch.
    """
    if batch.dim() == 4 and not batch.is_contiguous() and batch.is_contiguous(memory_format=torch.channels_last):
        return batch.permute(0, 2, 3, 1).reshape(batch.shape[0], -1), _channels_last_order(*batch.shape[1:])
    return batch.reshape(batch.shape[0], -1), None


@lru_cache(maxsize=64)
def _channels_last_order(channels: int, height: int, width: int) -> torch.Tensor:
    """The C-order index of each (H, W, C)-order position (made once per shape, not per batch)."""
    return torch.arange(channels * height * width).reshape(channels, height, width).permute(1, 2, 0).reshape(-1)
