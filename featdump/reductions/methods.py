"""Reductions: what is kept of one layer's output, computed on the device before anything is copied to the host.

    none, flatten          the whole output (flattened)
    avgpool, maxpool       pooled over space (conv maps) or tokens (sequences)
    spacepool              a video layer's (C, T, H, W) map averaged over space, its time kept: (C, T)
    cls, patchmean         a ViT's first token, or the mean of its patch tokens (class/register tokens left out)
    channels:A-B           channels A to B (inclusive) of a conv map (C, H, W), or of the last dimension
    srp:K[:SEED]           a sparse random projection of the flattened output to K values (`featdump.reductions.srp`)
    countsketch:K[:SEED]   the same with one nonzero per input (a count sketch): c times cheaper
    pca:K                  the top K principal components of a fit set (`featdump.reductions.pca`, with --pca-fit)

Each is bound to one layer (`bind`) as a Reduction: the per-image shape it stores, the function applied to
a batch-first tensor, the attributes recorded on the layer's dataset, and the device memory it holds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from featdump.errors import UsageProblem
from featdump.forward.layers import Snapshot
from featdump.forward.probe import UNKNOWN_AXES
from featdump.reductions.record import Reduction
from featdump.reductions.rules import CHANNELS, canonical, method_of
from featdump.sources.tokens import TokenLayout


def bind(text: str, layer_name: str, shape: tuple[int, ...], tokens: TokenLayout | None = None, pca_fit=None,
         tokens_unknown: str = "the model does not state its tokens", axes: str | None = None) -> Reduction:
    """The reduction TEXT for the layer LAYER_NAME of per-image SHAPE; UsageProblem where it does not apply.
    TOKENS: the layer's token layout (`featdump.sources.tokens`), else TOKENS_UNKNOWN says why there is none (cls and
    patchmean need one). PCA_FIT: the layer's fit (a featdump.reductions.pca.PcaFit) for pca:K. AXES: a 3-d map's
    axes as the probe found them ("y,x,channel": pooling and channels take the last axis as the channels)."""
    channels_last = axes == CHANNELS_LAST and len(shape) == 3
    text = canonical(text)
    method = method_of(text)
    if axes == UNKNOWN_AXES and len(shape) == 3 and (text in _POOLS or method == "channels"):
        raise UsageProblem(f"--reduce {text} on layer {layer_name!r}: featdump cannot tell which axis of its {shape} "
                           "map holds the channels (the model takes only its own input size and states no format "
                           "for this layer), and will not guess; use --reduce flatten, or a layer whose format the "
                           "model states (a timm model's feature_info stages).")
    if method in ("srp", "countsketch"):
        from featdump.reductions.srp import sparse_projection

        _, k, *seed = text.split(":")
        return sparse_projection(layer_name, shape, int(k), int(seed[0]) if seed else 0, method)
    if method == "pca":
        from featdump.reductions.pca import projection

        return projection(layer_name, shape, int(text.split(":")[1]), pca_fit)
    if method == "channels":
        return _channels(text, layer_name, shape, channels_last)
    if text in ("cls", "patchmean"):
        return _token_reduction(text, layer_name, shape, tokens, tokens_unknown)
    if text == "spacepool":
        return _space_pool(layer_name, shape)
    if channels_last and text in _POOLS:  # (N, H, W, C): over H and W
        pool = _SPACE_POOLS[text]
        return Reduction(text, (shape[2],), pool, {"pooled_over": "space"})
    return _simple(text, shape)


def snapshot(batch_dim: int, fold: int, reduction: Reduction) -> Snapshot:
    """A function turning a layer output into a new tensor to store: batch first, reduced, float32, never a view.

    BATCH_DIM is where the output holds its images (0 for most layers, 1 for a sequence-first (L, N, E));
    the batch is moved first, and the reduction applies to that batch-first view. FOLD rows per image in
    that dimension (LeViT's (N x 49, C)) are unfolded to (N, FOLD, C) first.

    Every reduction computes in float32, outside the forward's autocast: a bf16/fp16 output is widened first, and a
    projection's matmul is not cast down again (under autocast a pca:K projection lost 3 digits). The cast to the
    storage dtype is `featdump.output.storage`'s, on the host.
    """

    def take(output: torch.Tensor) -> torch.Tensor:
        batch_first = output.movedim(batch_dim, 0) if batch_dim else output
        batch_first = batch_first.unflatten(0, (-1, fold)) if fold > 1 else batch_first
        with torch.autocast(batch_first.device.type, enabled=False):
            reduced = reduction.apply(_in_float32(batch_first))
        # Contiguous (a channels_last output is transposed here, on the device, not by h5py on the host).
        return reduced.to(torch.float32, copy=True, memory_format=torch.contiguous_format)

    return take


def _in_float32(output: torch.Tensor) -> torch.Tensor:
    """OUTPUT as float32 (itself when it is; a float64 or integer output is left as it is)."""
    return output.float() if output.dtype in (torch.bfloat16, torch.float16) else output


def _token_reduction(text: str, layer_name: str, shape: tuple[int, ...], tokens: TokenLayout | None,
                     unknown: str) -> Reduction:
    """cls (the class token) or patchmean (the mean of the patch tokens) where the layer's layout is known."""
    if tokens is None:
        raise UsageProblem(f"--reduce {text} on layer {layer_name!r}: featdump does not know which of its tokens are "
                           f"class and patch tokens ({unknown}); use avgpool (all tokens), flatten or none.")
    if text == "cls":
        if tokens.prefix < 1:
            raise UsageProblem(f"--reduce cls on layer {layer_name!r}: the model has no class token (its tokens are "
                               "the patches alone); use avgpool or patchmean.")
        return Reduction(text, (shape[1],), lambda output: output[:, 0], {"prefix_tokens": tokens.prefix})
    return Reduction(text, (shape[1],), _patch_mean(tokens.prefix), {"prefix_tokens": tokens.prefix})


def _simple(text: str, shape: tuple[int, ...]) -> Reduction:
    apply = _SIMPLE[text]
    pooled = {"pooled_over": "space" if len(shape) >= 3 else "tokens"} if text in _POOLS and len(shape) >= 2 else {}
    return Reduction(text, tuple(apply(torch.zeros((1, *shape), device="meta")).shape[1:]), apply, pooled)


def _space_pool(layer_name: str, shape: tuple[int, ...]) -> Reduction:
    """A video layer's (C, T, H, W) averaged over H and W (in float32): its channels at each time step."""
    if len(shape) != 4:
        raise UsageProblem(f"--reduce spacepool: layer {layer_name!r} has shape {shape}, not a video model's "
                           "(channel, time, y, x) map; use avgpool to pool all of it.")
    return Reduction("spacepool", shape[:2], lambda output: _mean_in_float32(output, dim=(3, 4)),
                     {"pooled_over": "space", "kept": "time"})


def _channels(text: str, layer_name: str, shape: tuple[int, ...], channels_last: bool = False) -> Reduction:
    first, last = (int(value) for value in CHANNELS.match(text).groups())
    # (C, H, W) maps: C; (H, W, C) maps, (tokens, dim) and (dim,): the last axis
    axis = 0 if len(shape) >= 3 and not channels_last else len(shape) - 1
    if not shape or last >= shape[axis]:
        raise UsageProblem(f"--reduce {text}: layer {layer_name!r} has shape {shape}, so channels run 0-"
                           f"{shape[axis] - 1 if shape else 0}; choose a range within them.")
    kept = (*shape[:axis], last - first + 1, *shape[axis + 1:])
    return Reduction(text, kept, lambda batch: batch.narrow(axis + 1, first, last - first + 1),
                     {"channels": [first, last]})


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


_POOLS = ("avgpool", "maxpool")  # recorded as `pooled_over`: space (what is left are channels) or tokens
CHANNELS_LAST = "y,x,channel"  # a map's axes (`featdump.forward.probe`) that put its channels last
_SPACE_POOLS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {  # of (N, H, W, C) maps
    "avgpool": lambda output: _mean_in_float32(output, dim=(1, 2)),
    "maxpool": lambda output: torch.amax(output, dim=(1, 2)),
}
_SIMPLE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda output: output,
    "flatten": lambda output: output.flatten(1),
    "avgpool": lambda output: _pool(output, _mean_in_float32),
    "maxpool": lambda output: _pool(output, torch.amax),
}
