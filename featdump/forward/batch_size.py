"""The default batch size: 64 rows, or fewer when a batch of the model's input would not fit the memory the device
has (a batch of 64 r3d_18 clips needed 4.5-5.3 GB on a CPU). A row's working memory in the forward is estimated from
the dry forward (`probe`): WORKING_MULTIPLE times the largest output any module makes of one row, plus the row
itself; a batch may take BUDGET_SHARE of the device's free memory, BUDGET_AT_MOST at most. `-b N` overrides it."""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT = 64
WORKING_MULTIPLE = 6  # r3d_18: 70-83 MB a clip measured, 12.8 MB its largest output (the stem's)
BUDGET_SHARE = 0.25
BUDGET_AT_MOST = 2 * 10**9


@dataclass(frozen=True)
class BatchChoice:
    size: int
    row_bytes: int  # the estimated working memory of one row
    budget: int

    def reason(self, noun: str) -> str:
        return (f"Batch size {self.size} (not {DEFAULT}): a {noun} takes about {self.row_bytes / 1e6:.0f} MB in the "
                f"forward ({WORKING_MULTIPLE}x the largest output a module makes of it), and a batch may take "
                f"{self.budget / 1e9:.1f} GB ({BUDGET_SHARE:.0%} of the free memory, {BUDGET_AT_MOST / 1e9:.1f} GB "
                "at most); -b N sets it.")


def largest_output(infos) -> int:
    """Elements of the largest tensor any module outputs for one row (the probe's shapes, without the batch)."""
    sizes = [math.prod(shape) for info in infos for shape in info.shapes
             if isinstance(shape, tuple) and all(isinstance(side, int) for side in shape)]
    return max(sizes, default=0)


def choose_batch_size(infos, input_shape: tuple[int, ...], element_bytes: int, free_bytes: int) -> BatchChoice:
    """The batch size for a model whose dry forward found INFOS, on inputs of INPUT_SHAPE (one row), computing in
    ELEMENT_BYTES per value, with FREE_BYTES free on its device."""
    row_bytes = (WORKING_MULTIPLE * largest_output(infos) + math.prod(input_shape)) * element_bytes
    budget = int(min(BUDGET_SHARE * free_bytes, BUDGET_AT_MOST))
    size = DEFAULT if row_bytes == 0 else max(1, min(DEFAULT, budget // row_bytes))
    return BatchChoice(size, row_bytes, budget)
