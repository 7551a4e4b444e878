"""Layers: parse selectors (PATH, PATH:K for a call, PATH@PART for a part of a tuple or dict output), and resolve
them against the probe into validated Layers, with close matches and a list-layers hint when they name nothing."""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from featdump.errors import AmbiguousLayer, NotPerImage, UnknownLayer
from featdump.forward.patterns import expand
from featdump.forward.probe import LayerInfo

log = logging.getLogger("featdump")
Snapshot = Callable[[torch.Tensor], torch.Tensor]  # one layer's output -> the new tensor stored for it
_SELECTOR = re.compile(r"^(?P<path>[^:@\s]+)(?::(?P<call>\d+))?(?:@(?P<part>[^:@\s]+))?$")
_MODEL_OUTPUT = re.compile(r"^@(?P<part>[^:@\s]+)?$")  # @ or @PART: the model's own output


@dataclass(frozen=True)
class Layer:
    """A validated selector: the dataset name, the module path, which call (1-based), its output shape."""

    name: str  # the selector as the dataset name: "avgpool" or "layer1.0.relu:2"
    path: str
    call: int
    shape: tuple[int, ...]  # per image, batch dimension removed
    batch_dim: int = 0  # where the module's output holds the batch (moved first when stored)
    part: str | None = None  # the part of a tuple/dict output stored (None: the output, or a tuple's first tensor)
    fold: int = 1  # rows per image folded into the batch dimension (unfolded to (N, fold, ...) when stored)
    axes: str | None = None  # a 3-d map's axes as the probe found them: "channel,y,x" or "y,x,channel" (Swin's)

    @property
    def layout(self) -> str | None:
        """'(197, N, 768) -> (N, 197, 768)' for an output whose batch is not first; None otherwise."""
        if self.fold > 1:
            rest = [str(size) for size in self.shape[1:]]
            folded = [*rest[: self.batch_dim], f"N*{self.fold}", *rest[self.batch_dim:]]
            return f"({', '.join(folded)}) -> (N, {self.fold}, {', '.join(rest)})"
        if self.batch_dim == 0:
            return None
        dims = [str(size) for size in self.shape]
        original = [*dims[: self.batch_dim], "N", *dims[self.batch_dim:]]
        return f"({', '.join(original)}) -> (N, {', '.join(dims)})"

def resolve(selectors: list[str], infos: list[LayerInfo], model_name: str) -> list[Layer]:
    """Turn selector strings into Layers, or raise with the closest valid names and a list-layers hint."""
    if not selectors:
        raise UnknownLayer(f"No layer selected. Run `featdump list-layers {model_name}` to see the layers.")
    by_path = {info.path: info for info in infos}
    layers: dict[str, Layer] = {}
    for text in expand(selectors, infos, model_name):
        layer = _resolve_one(text, by_path, model_name)
        layers.setdefault(layer.name, layer)
    return in_model_order(list(layers.values()), infos)


def in_model_order(layers: list[Layer], infos: list[LayerInfo]) -> list[Layer]:
    """LAYERS in the one order a file records them in, however they were named: the order of the model's modules
    in the probe (INFOS), then by call and part. `-l a,b` and `-l b,a` (or a file grown by b) record the same."""
    places = {info.path: index for index, info in enumerate(infos)}
    return sorted(layers, key=lambda layer: (places.get(layer.path, len(places)), layer.call, layer.part or ""))

def parse_selector(text: str, hint: str = "") -> tuple[str, int | None, str | None]:
    """'PATH' -> (PATH, None, None); 'PATH:K@PART' -> (PATH, K, PART); '@PART' -> ('', None, PART) (the model's
    own output); UnknownLayer for anything else."""
    whole = _MODEL_OUTPUT.match(text.strip())
    if whole:
        return "", None, whole["part"]
    match = _SELECTOR.match(text.strip())
    if not match:
        raise UnknownLayer(f"Bad layer selector {text!r}: use a module path like layer1.0.conv1, PATH:K for a call, "
                           f"PATH@0 or PATH@KEY for a part of a tuple or dict output, @ for the model's own output. "
                           f"{hint}".strip())
    return match["path"], int(match["call"]) if match["call"] is not None else None, match["part"]


def _resolve_one(text: str, by_path: dict[str, LayerInfo], model_name: str) -> Layer:
    hint = f"Run `featdump list-layers {model_name}` to see every layer."
    path, call, part = parse_selector(text, hint)
    info = by_path.get(path)
    if info is None:
        close = difflib.get_close_matches(path, list(by_path), n=5, cutoff=0.6)
        maybe = f" Close matches: {', '.join(close)}." if close else ""
        raise UnknownLayer(f"Unknown layer {path!r} in {model_name}.{maybe} {hint}")
    if info.refusal:
        raise NotPerImage(f"Layer {text!r} of {model_name}: {info.refusal}.")
    if info.calls == 0:
        raise UnknownLayer(f"Layer {path!r} of {model_name} never runs in a forward pass. {hint}")
    if call is None and info.calls > 1:
        options = " ".join(f"{path}:{k}" for k in range(1, info.calls + 1))
        raise AmbiguousLayer(
            f"Layer {path!r} runs {info.calls} times per forward pass; select one call: {options}."
        )
    index = call if call is not None else 1
    if not 1 <= index <= info.calls:
        raise UnknownLayer(
            f"Layer {path!r} runs {info.calls} time(s) per forward pass, so {text!r} does not exist. {hint}"
        )
    shape, batch_dim, part, fold = _chosen_output(info, index, part, text, hint)
    fold = fold if batch_dim is None else None
    if fold is not None and not fold.contiguous:
        raise NotPerImage(f"Layer {text!r} folds the batch into dimension {fold.axis} ({fold.rows} rows per image), "
                          "but an image's rows are not one block (they interleave with other images' rows), so they "
                          f"cannot be stored per image. {hint}")
    if fold is not None:  # (N x rows, C) -> (N, rows, C)
        rest = tuple(size for axis, size in enumerate(shape) if axis != fold.axis)
        return Layer(name=text, path=path, call=index, shape=(fold.rows, *rest), batch_dim=fold.axis, part=part,
                     fold=fold.rows)
    if batch_dim is None:
        raise NotPerImage(
            f"Layer {text!r} outputs {shape} whatever the batch size: its output does not depend on the batch "
            f"(a table or parameter, not one row per image), so it cannot be stored per image. {hint}"
        )
    axes = info.map_axes[index - 1] if part is None and len(info.map_axes) >= index else None
    return Layer(name=text, path=path, call=index, shape=shape, batch_dim=batch_dim, part=part, axes=axes)


def _chosen_output(info: LayerInfo, call: int, part: str | None, text: str, hint: str):
    """(shape, batch dimension, part, fold of the batch where no dimension follows it) of what TEXT stores of call
    CALL of INFO's module."""
    parts = info.parts[call - 1] if info.parts else ()
    names = ", ".join(f"{text.split('@')[0]}@{item.name}" for item in parts)
    if part is not None:
        chosen = next((item for item in parts if item.name == part), None)
        if chosen is None:
            offered = f"its tensor parts: {names}" if parts else f"its output is a {info.kind}, which has no parts"
            raise UnknownLayer(f"Layer {info.selector!r} has no output part {part!r}; {offered}. {hint}")
        return chosen.shape, chosen.batch_dim, part, chosen.fold
    if info.kind == "tensor":
        fold = info.folds[call - 1] if info.folds else None
        return info.shapes[call - 1], info.batch_dims[call - 1] if info.batch_dims else 0, None, fold
    if info.kind == "tuple" and parts:
        log.info("Layer %s outputs a tuple: its first tensor (%s@%s) is stored; select another part as %s.",
                 text, text, parts[0].name, names)
        return parts[0].shape, parts[0].batch_dim, parts[0].name, parts[0].fold
    if info.kind == "dict" and len(parts) == 1:
        return parts[0].shape, parts[0].batch_dim, parts[0].name, parts[0].fold
    if info.kind == "dict" and parts:
        raise UnknownLayer(f"Layer {text!r} outputs a dict (or ModelOutput) of several tensors; select one: {names}.")
    raise UnknownLayer(f"Layer {info.selector!r} does not output a tensor, so it cannot be stored. {hint}")
