"""Reductions: what is kept of a captured output (all of it, flattened, pooled, or the CLS token)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from featdump.errors import UsageProblem

Snapshot = Callable[[torch.Tensor], torch.Tensor]


def snapshot(reduce: str, dtype: str) -> Snapshot:
    """A function turning a layer output into a new tensor to store: batch first, reduced, cast, never a view.

    BATCH_DIM is where the output holds its images (0 for most layers, 1 for a sequence-first (L, N, E));
    the batch is moved first, and the reduction applies to that batch-first view.
    """
    storage = getattr(torch, dtype)

    def take(output: torch.Tensor, batch_dim: int = 0) -> torch.Tensor:
        reduced = _REDUCERS[reduce](output.movedim(batch_dim, 0) if batch_dim else output)
        # Contiguous (a channels_last output is transposed here, on the device, not by h5py on the host).
        return reduced.to(storage, copy=True, memory_format=torch.contiguous_format)

    return take


def reduced_shape(reduce: str, shape: tuple[int, ...], layer_name: str) -> tuple[int, ...]:
    """The per-image shape stored for a layer of SHAPE, or UsageProblem if REDUCE does not apply."""
    if reduce == "cls" and len(shape) != 2:
        raise UsageProblem(
            f"--reduce cls takes the first token of a (tokens, dim) output, but layer {layer_name!r} "
            f"has shape {shape}; use avgpool, maxpool, flatten or none."
        )
    return tuple(_REDUCERS[reduce](torch.zeros((1, *shape), device="meta")).shape[1:])


def _pool(output: torch.Tensor, pool) -> torch.Tensor:
    """Pool conv maps (N, C, H, W) over H×W and token sequences (N, T, D) over T; leave (N, D) alone."""
    if output.dim() >= 4:
        return pool(output.flatten(2), dim=2)
    if output.dim() == 3:
        return pool(output, dim=1)
    return output


def _mean_in_float32(output: torch.Tensor, dim: int) -> torch.Tensor:
    """A mean accumulated in float32 also for bf16/fp16 outputs (autocast), which lose digits summing."""
    return torch.mean(output, dim=dim, dtype=torch.float32)


_REDUCERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda output: output,
    "flatten": lambda output: output.flatten(1),
    "avgpool": lambda output: _pool(output, _mean_in_float32),
    "maxpool": lambda output: _pool(output, torch.amax),
    "cls": lambda output: output[:, 0],
}
