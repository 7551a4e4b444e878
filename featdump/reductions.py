"""Reductions: what is kept of a captured output (all of it, flattened, pooled, the CLS token, or the mean of the
patch tokens of a ViT-like (N, L, D) output)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from featdump.errors import UsageProblem

Snapshot = Callable[[torch.Tensor], torch.Tensor]


def snapshot(reduce: str, dtype: str, prefix_tokens: int | None = None) -> Snapshot:
    """A function turning a layer output into a new tensor to store: batch first, reduced, cast, never a view.

    BATCH_DIM is where the output holds its images (0 for most layers, 1 for a sequence-first (L, N, E));
    the batch is moved first, and the reduction applies to that batch-first view. FOLD rows per image in
    that dimension (LeViT's (N x 49, C)) are unfolded to (N, FOLD, C) first. PREFIX_TOKENS: the class and
    register tokens before the patch tokens (patchmean leaves them out).
    """
    storage = getattr(torch, dtype)
    reducer = _patch_mean(prefix_tokens or 0) if reduce == "patchmean" else _REDUCERS[reduce]

    def take(output: torch.Tensor, batch_dim: int = 0, fold: int = 1) -> torch.Tensor:
        batch_first = output.movedim(batch_dim, 0) if batch_dim else output
        reduced = reducer(batch_first.unflatten(0, (-1, fold)) if fold > 1 else batch_first)
        # Contiguous (a channels_last output is transposed here, on the device, not by h5py on the host).
        return reduced.to(storage, copy=True, memory_format=torch.contiguous_format)

    return take


def reduced_shape(reduce: str, shape: tuple[int, ...], layer_name: str,
                  prefix_tokens: int | None = None) -> tuple[int, ...]:
    """The per-image shape stored for a layer of SHAPE, or UsageProblem if REDUCE does not apply."""
    if reduce == "patchmean":
        if len(shape) != 2:
            raise UsageProblem(f"--reduce patchmean averages the patch tokens of a (tokens, dim) output, but layer "
                               f"{layer_name!r} has shape {shape}; use avgpool, maxpool, flatten or none.")
        if prefix_tokens is None:
            raise UsageProblem("--reduce patchmean must know how many class or register tokens come before the "
                               "patch tokens, and this model does not say (timm, hf:, open_clip: and torchvision "
                               "ViTs do); use avgpool (all tokens) or cls.")
        return (shape[1],)
    if reduce == "cls" and len(shape) != 2:
        raise UsageProblem(
            f"--reduce cls takes the first token of a (tokens, dim) output, but layer {layer_name!r} "
            f"has shape {shape}; use avgpool, maxpool, flatten or none."
        )
    return tuple(_REDUCERS[reduce](torch.zeros((1, *shape), device="meta")).shape[1:])


def token_layout(shape: tuple[int, ...], prefix_tokens: int | None) -> tuple[int, int, int] | None:
    """(prefix tokens, grid rows, grid columns) of a (tokens, dim) output whose tokens after the prefix fill a
    square grid (a ViT's); None for anything else or when the model does not say its prefix."""
    if prefix_tokens is None or len(shape) != 2 or shape[0] <= prefix_tokens:
        return None
    side = math.isqrt(shape[0] - prefix_tokens)
    return (prefix_tokens, side, side) if side * side == shape[0] - prefix_tokens else None


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


def _patch_mean(prefix_tokens: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The mean of the tokens after the first PREFIX_TOKENS (class, distillation, register tokens), in float32."""
    return lambda output: _mean_in_float32(output[:, prefix_tokens:], dim=1)


_REDUCERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda output: output,
    "flatten": lambda output: output.flatten(1),
    "avgpool": lambda output: _pool(output, _mean_in_float32),
    "maxpool": lambda output: _pool(output, torch.amax),
    "cls": lambda output: output[:, 0],
}
