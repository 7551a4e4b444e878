"""Tokens: which tokens of a transformer's (tokens, dim) output are class/register tokens and which the patch grid.

A layout is recorded only where the model states its prefix (class, distillation, register tokens) and its
patch size, and the layer's token count proves the grid: prefix + (input height / patch) x (input width /
patch) tokens at the input size the preprocessing makes. Anything else (a Swin stage after patch merging, a
model that states nothing, a pooled sequence) has no layout: `cls` and `patchmean` are refused there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenRule:
    """What a model states of its token sequences: tokens before the patches, and a patch's pixels."""

    prefix: int  # class, distillation and register tokens, before the patch tokens
    patch: tuple[int, int]  # patch height and width in pixels

    @classmethod
    def stated(cls, prefix, patch) -> TokenRule | None:
        """The rule from a model's own attributes (PATCH an int or a pair); None when either is missing."""
        if prefix is None or patch is None:
            return None
        pair = tuple(patch) if isinstance(patch, (tuple, list)) else (patch, patch)
        if len(pair) != 2 or not all(isinstance(size, int) and size > 0 for size in pair):
            return None
        return cls(int(prefix), (int(pair[0]), int(pair[1])))


@dataclass(frozen=True)
class TokenLayout:
    """A layer's tokens: PREFIX tokens, then the patch GRID (rows, columns) row by row."""

    prefix: int
    grid: tuple[int, int]


def token_layout(shape: tuple[int, ...], rule: TokenRule | None,
                 input_size: tuple[int, int]) -> tuple[TokenLayout | None, str]:
    """(the layout of a (tokens, dim) output of per-image SHAPE, "") or (None, why it is not known: a clause)."""
    if len(shape) != 2:
        return None, f"its output has shape {shape}, not (tokens, dim)"
    if rule is None:
        return None, ("the model does not state its class/register tokens and patch size (timm, hf:, open_clip: "
                      "and torchvision ViTs do; your own model can, as num_prefix_tokens and patch_size)")
    grid = (input_size[0] // rule.patch[0], input_size[1] // rule.patch[1])
    if shape[0] != rule.prefix + grid[0] * grid[1]:
        return None, (f"its {shape[0]} tokens are not the model's {rule.prefix} prefix tokens and the {grid[0]}x"
                      f"{grid[1]} patches of a {input_size[0]}x{input_size[1]} input")
    return TokenLayout(rule.prefix, grid), ""
