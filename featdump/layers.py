"""Layers: parse selectors (PATH, PATH:K, PATH@PART), probe a model's modules with dry forwards, resolve and
validate. A module whose output is a tuple, a list, a dict or a ModelOutput has parts: PATH@0, PATH@KEY."""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from featdump.errors import AmbiguousLayer, NotPerImage, UnknownLayer

log = logging.getLogger("featdump")
_SELECTOR = re.compile(r"^(?P<path>[^:@\s]+)(?::(?P<call>\d+))?(?:@(?P<part>[^:@\s]+))?$")


@dataclass(frozen=True)
class Part:
    """One tensor of a module's output that is not a tensor itself: PATH@NAME."""

    name: str  # "0" for a tuple's first item, "last_hidden_state" for a dict's or ModelOutput's key
    shape: tuple[int, ...]  # without the batch dimension
    batch_dim: int | None


@dataclass(frozen=True)
class Fold:
    """A dimension holding ROWS rows per image, images one after another (LeViT's BatchNorm1d over
    (batch x 49, C)), found by the probe: 2 images give 2 x ROWS rows, 3 give 3 x ROWS."""

    axis: int
    rows: int
    contiguous: bool  # each image's rows are one block (changing one image changes only its block)


@dataclass(frozen=True)
class LayerInfo:
    """One module as seen in a dry forward: where it is, what it is, what it outputs, how often it runs."""

    path: str  # dotted module path, e.g. "layer1.0.relu"
    type_name: str  # class name, e.g. "ReLU"
    calls: int  # times the module ran in one forward
    shapes: tuple  # output shape of each call, without the batch dimension (None: not a tensor)
    tuple_output: bool  # the output is a tuple/list; its first tensor is what gets stored
    batch_dims: tuple = ()  # per call: the dimension that follows the batch (None: none does, not per image)
    parts: tuple = ()  # per call: the Parts of a tuple/list/dict output (empty for a tensor)
    kind: str = "tensor"  # what the module returns: tensor, tuple (or list), dict (or ModelOutput), other
    folds: tuple = ()  # per call: a Fold when the batch is folded into a dimension with other rows, else None

    @property
    def depth(self) -> int:
        return self.path.count(".") + 1


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


def first_tensor(output):
    """The tensor a module's output stands for: itself, or the first tensor of a tuple/list."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((item for item in output if isinstance(item, torch.Tensor)), None)
    return None


def output_kind(output) -> str:
    if isinstance(output, torch.Tensor):
        return "tensor"
    if isinstance(output, Mapping):  # a dict, or transformers' ModelOutput (an OrderedDict)
        return "dict"
    return "tuple" if isinstance(output, (tuple, list)) else "other"


def tensor_parts(output) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of each tensor in a tuple/list/dict/ModelOutput output (None and other items left out)."""
    kind = output_kind(output)
    if kind == "dict":
        return [(str(key), value) for key, value in output.items() if isinstance(value, torch.Tensor)]
    if kind == "tuple":
        return [(str(index), item) for index, item in enumerate(output) if isinstance(item, torch.Tensor)]
    return []


def take_part(output, part: str | None, name: str = "") -> torch.Tensor:
    """PART of a module's OUTPUT (None: the output itself, a tuple's first tensor, or a dict's only tensor);
    UnknownLayer, naming what there is, when it holds no such tensor."""
    if part is None:
        tensor = first_tensor(output)
        if tensor is not None:
            return tensor
        parts = tensor_parts(output)
        if len(parts) == 1:
            return parts[0][1]
        if parts:
            raise UnknownLayer(f"Layer {name!r} outputs a {type(output).__name__} with several tensors: select one "
                               f"as {', '.join(f'{name}@{key}' for key, _ in parts)}.")
        raise UnknownLayer(f"Layer {name!r} outputs a {type(output).__name__}, not a tensor (nor a tuple, list or "
                           "dict holding one), so it cannot be captured; select a module inside it.")
    found = dict(tensor_parts(output))
    if part not in found:
        offered = ", ".join(found) or "none"
        raise UnknownLayer(f"Layer {name!r}: the output ({type(output).__name__}) has no tensor part {part!r}; "
                           f"its tensor parts: {offered}.")
    return found[part]


def probe(model: nn.Module, input_shape: tuple[int, ...]) -> list[LayerInfo]:
    """Run forwards on zeros of INPUT_SHAPE (C, H, W) with batches of 2 and 3 and record every module's calls,
    output shapes and batch dimension (the one dimension whose size follows the batch)."""
    runs = [_record_calls(model, input_shape, batch) for batch in _PROBE_BATCHES]
    modules = dict(model.named_modules())
    infos = []
    for path in runs[0][0]:
        shapes, batch_dims, parts = [], [], []
        for first, second in zip(runs[0][0][path], runs[1][0][path]):
            shape, batch_dim = _per_image(first.get(None), second.get(None))
            shapes.append(shape)
            batch_dims.append(batch_dim)
            parts.append(tuple(Part(name, *_per_image(size, second.get(name)))
                               for name, size in first.items() if name is not None))
        kinds = runs[0][1][path]
        folds = tuple(_fold(first.get(None), second.get(None)) if batch_dim is None else None
                      for first, second, batch_dim in zip(runs[0][0][path], runs[1][0][path], batch_dims))
        infos.append(LayerInfo(path, type(modules[path]).__name__, len(shapes), tuple(shapes), "tuple" in kinds,
                               tuple(batch_dims), tuple(parts), kinds[0] if kinds else "tensor", folds))
    return _check_folds(model, input_shape, infos)


def _fold(first: tuple | None, second: tuple | None) -> Fold | None:
    """The dimension that is 2k at batch 2 and 3k at batch 3 (k rows per image), if exactly one is."""
    if first is None or second is None or len(first) != len(second):
        return None
    folded = [(axis, a // 2) for axis, (a, b) in enumerate(zip(first, second))
              if a != b and a % 2 == 0 and a // 2 > 1 and b == 3 * (a // 2)]
    unchanged = sum(a == b for a, b in zip(first, second)) == len(first) - 1
    return Fold(folded[0][0], folded[0][1], False) if len(folded) == 1 and unchanged else None


def _check_folds(model: nn.Module, input_shape: tuple[int, ...], infos: list[LayerInfo]) -> list[LayerInfo]:
    """Mark each fold contiguous or not: two forwards of 2 images that differ in the second image only; an
    image's rows are one block when exactly the second block of rows changes (in the output, or, where the
    output does not change at all (a norm initialised to zero), in an input of the same shape)."""
    folded = {info.path: info for info in infos if any(info.folds)}
    if not folded:
        return infos
    generator = torch.Generator().manual_seed(0)
    first, second = (torch.rand((1, *input_shape), generator=generator) for _ in range(2))
    same = _call_outputs(model, torch.cat([first, first]), folded)
    changed = _call_outputs(model, torch.cat([first, second]), folded)
    checked = []
    for info in infos:
        if info.path in folded:
            folds = tuple(None if fold is None else dataclasses.replace(
                fold, contiguous=_rows_changed(same[info.path][call], changed[info.path][call], fold) ==
                [fold.rows, 2 * fold.rows]) for call, fold in enumerate(info.folds))
            info = dataclasses.replace(info, folds=folds)
        checked.append(info)
    return checked


def _call_outputs(model: nn.Module, inputs: torch.Tensor, paths) -> dict[str, list[tuple[torch.Tensor, ...]]]:
    """Per module, per call: (its output's tensor, its first input when a tensor)."""
    outputs: dict[str, list] = {path: [] for path in paths}

    def record(module, args, output, path):
        given = args[0].clone() if args and isinstance(args[0], torch.Tensor) else None
        outputs[path].append((first_tensor(output).clone(), given))

    handles = [model.get_submodule(path).register_forward_hook(
        lambda module, args, output, path=path: record(module, args, output, path)) for path in paths]
    try:
        parameter = next(model.parameters(), None)
        with torch.inference_mode():
            model(inputs.to(parameter.device if parameter is not None else "cpu"))
    finally:
        for handle in handles:
            handle.remove()
    return outputs


def _rows_changed(before: tuple, after: tuple, fold: Fold) -> list[int]:
    """[first, last + 1] of the rows along FOLD's axis that differ between two calls' (output, input): the
    output's, or the input's when the output did not change and has the input's shape (empty when none)."""
    (output_before, input_before), (output_after, input_after) = before, after
    if torch.equal(output_before, output_after) and input_before is not None \
            and input_before.shape == output_before.shape:
        output_before, output_after = input_before, input_after
    differs = (output_before != output_after).movedim(fold.axis, 0).flatten(1).any(dim=1).nonzero().flatten().tolist()
    if not differs or differs != list(range(differs[0], differs[-1] + 1)):
        return []
    return [differs[0], differs[-1] + 1]


def _per_image(first: tuple | None, second: tuple | None) -> tuple[tuple | None, int | None]:
    """(the shape without the batch dimension, the batch dimension) from one output's shapes at batches 2 and 3."""
    batch_dim = _batch_dim(first, second)
    return (None if first is None else tuple(size for axis, size in enumerate(first) if axis != batch_dim)), batch_dim


_PROBE_BATCHES = (2, 3)


def _record_calls(model: nn.Module, input_shape: tuple[int, ...], batch: int):
    """({path: per call, {None: the shape of the output's (first) tensor, part name: its shape}},
    {path: per call, the kind of output}) for one forward of BATCH zeros."""
    records: dict[str, list] = {path: [] for path, _ in model.named_modules() if path}
    kinds: dict[str, list] = {path: [] for path in records}

    def recorder(path):
        def hook(module, args, output):
            tensor = first_tensor(output)
            shapes = {None: tuple(tensor.shape) if tensor is not None else None}
            shapes.update((name, tuple(part.shape)) for name, part in tensor_parts(output))
            records[path].append(shapes)
            kinds[path].append(output_kind(output))

        return hook

    handles = [module.register_forward_hook(recorder(path)) for path, module in model.named_modules() if path]
    try:
        parameter = next(model.parameters(), None)
        device = parameter.device if parameter is not None else torch.device("cpu")
        with torch.inference_mode():
            model(torch.zeros((batch, *input_shape), device=device))
    finally:
        for handle in handles:
            handle.remove()
    return records, kinds


def _batch_dim(first: tuple | None, second: tuple | None) -> int | None:
    """The first dimension that is 2 in FIRST and 3 in SECOND (the probe's batches); None if none is."""
    if first is None or second is None or len(first) != len(second):
        return None
    following = [axis for axis, (a, b) in enumerate(zip(first, second)) if (a, b) == _PROBE_BATCHES]
    if len(following) > 1:
        log.info("Output dimensions %s all follow the batch size; taking dimension %d as the batch.",
                 following, following[0])
    return following[0] if following else None


def resolve(selectors: list[str], infos: list[LayerInfo], model_name: str) -> list[Layer]:
    """Turn selector strings into Layers, or raise with the closest valid names and a list-layers hint."""
    if not selectors:
        raise UnknownLayer(f"No layer selected. Run `featdump list-layers {model_name}` to see the layers.")
    by_path = {info.path: info for info in infos}
    layers: dict[str, Layer] = {}
    for text in expand(selectors, infos, model_name):
        layer = _resolve_one(text, by_path, model_name)
        layers.setdefault(layer.name, layer)
    return list(layers.values())


def is_pattern(text: str) -> bool:
    return any(character in text for character in "*?[")


def expand(selectors: list[str], infos: list[LayerInfo], model_name: str) -> list[str]:
    """SELECTORS with each pattern replaced by the layer names it matches (in model order); plain names as
    they are. Duplicates collapse to their first place."""
    names: dict[str, None] = {}
    for text in (selector.strip() for selector in selectors):
        if not is_pattern(text):
            names.setdefault(text)
            continue
        matched = match_pattern(text, infos, model_name)
        log.info("Pattern %r selects %d layer%s: %s.", text, len(matched), "s" * (len(matched) != 1),
                 ", ".join(matched) if len(matched) <= 12 else ", ".join(matched[:12]) + ", ...")
        for name in matched:
            names.setdefault(name)
    return list(names)


def match_pattern(text: str, infos: list[LayerInfo], model_name: str) -> list[str]:
    """The layer names (PATH, or PATH:K for modules that run several times) that the pattern TEXT selects.

    In the path, * and ? and [...] match within one dotted component, ** any number of components (at
    the end, at least one: layer2.** is everything inside layer2);
    PATH:* selects every call, PATH:K the K-th; @PART (with * ? [...]) parts of tuple or dict outputs.
    Modules that never run, or whose output is not a tensor or not per image, are left out. UnknownLayer
    when nothing matches or the pattern is malformed.
    """
    hint = f"Run `featdump list-layers {model_name} --match PATTERN` to try patterns."
    text, _, part_pattern = text.partition("@")
    path_pattern, _, call = text.partition(":")
    components = path_pattern.split(".")
    if not path_pattern or "" in components or any("**" in part and part != "**" for part in components) \
            or text.count("[") != text.count("]") or (call and call != "*" and not call.isdigit()):
        raise UnknownLayer(f"Bad layer pattern {text!r}: use * ? [...] within a name, ** for any number of "
                           f"names, and :* or :K for calls. {hint}")
    names = []
    for info in infos:
        if not _components_match(components, info.path.split(".")):
            continue
        calls = [index for index in range(1, info.calls + 1) if part_pattern or _default_stored(info, index)]
        if call.isdigit():
            calls = [index for index in calls if index == int(call)]
        for index in calls:
            name = info.path if info.calls == 1 and not call else f"{info.path}:{index}"
            if not part_pattern:
                names.append(name)
                continue
            names += [f"{name}@{part.name}" for part in info.parts[index - 1]
                      if fnmatch.fnmatchcase(part.name, part_pattern) and part.batch_dim is not None]
    if not names:
        literal = path_pattern.replace("**", "").replace("*", "").replace("?", "").strip(".")
        close = difflib.get_close_matches(literal, [info.path for info in infos], n=5, cutoff=0.6)
        maybe = f" Close matches: {', '.join(close)}." if close else ""
        raise UnknownLayer(f"Layer pattern {text!r} matches no layer of {model_name}.{maybe} {hint}")
    return names


def _default_stored(info: LayerInfo, call: int) -> bool:
    """Whether PATH alone (no @PART) names a per-image tensor of call CALL: a tensor output, a tuple's first
    tensor, or a dict's only one."""
    parts = info.parts[call - 1] if info.parts else ()
    fold = info.folds[call - 1] if info.folds else None
    if info.kind == "tensor" or not parts:
        return info.shapes[call - 1] is not None and (not info.batch_dims or info.batch_dims[call - 1] is not None
                                                      or (fold is not None and fold.contiguous))
    if info.kind == "dict" and len(parts) != 1:
        return False
    return parts[0].batch_dim is not None


def _components_match(pattern: list[str], path: list[str]) -> bool:
    if not pattern:
        return not path
    if pattern == ["**"]:  # a trailing ** selects what is below, not the module itself
        return bool(path)
    if pattern[0] == "**":
        return _components_match(pattern[1:], path) or (bool(path) and _components_match(pattern, path[1:]))
    return bool(path) and fnmatch.fnmatchcase(path[0], pattern[0]) and _components_match(pattern[1:], path[1:])


def parse_selector(text: str, hint: str = "") -> tuple[str, int | None, str | None]:
    """'PATH' -> (PATH, None, None); 'PATH:K@PART' -> (PATH, K, PART); UnknownLayer for anything else."""
    match = _SELECTOR.match(text.strip())
    if not match:
        raise UnknownLayer(f"Bad layer selector {text!r}: use a module path like layer1.0.conv1, PATH:K for a call, "
                           f"PATH@0 or PATH@KEY for a part of a tuple or dict output. {hint}".strip())
    return match["path"], int(match["call"]) if match["call"] is not None else None, match["part"]


def _resolve_one(text: str, by_path: dict[str, LayerInfo], model_name: str) -> Layer:
    hint = f"Run `featdump list-layers {model_name}` to see every layer."
    path, call, part = parse_selector(text, hint)
    info = by_path.get(path)
    if info is None:
        close = difflib.get_close_matches(path, list(by_path), n=5, cutoff=0.6)
        maybe = f" Close matches: {', '.join(close)}." if close else ""
        raise UnknownLayer(f"Unknown layer {path!r} in {model_name}.{maybe} {hint}")
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
    shape, batch_dim, part = _chosen_output(info, index, part, text, hint)
    fold = info.folds[index - 1] if info.folds and part is None and batch_dim is None else None
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
    return Layer(name=text, path=path, call=index, shape=shape, batch_dim=batch_dim, part=part)


def _chosen_output(info: LayerInfo, call: int, part: str | None, text: str, hint: str):
    """(shape, batch dimension, part) of what TEXT stores of call CALL of INFO's module."""
    parts = info.parts[call - 1] if info.parts else ()
    names = ", ".join(f"{text.split('@')[0]}@{item.name}" for item in parts)
    if part is not None:
        chosen = next((item for item in parts if item.name == part), None)
        if chosen is None:
            offered = f"its tensor parts: {names}" if parts else f"its output is a {info.kind}, which has no parts"
            raise UnknownLayer(f"Layer {info.path!r} has no output part {part!r}; {offered}. {hint}")
        return chosen.shape, chosen.batch_dim, part
    if info.kind == "tensor":
        return info.shapes[call - 1], info.batch_dims[call - 1] if info.batch_dims else 0, None
    if info.kind == "tuple" and parts:
        log.info("Layer %s outputs a tuple: its first tensor (%s@%s) is stored; select another part as %s.",
                 text, text, parts[0].name, names)
        return parts[0].shape, parts[0].batch_dim, parts[0].name
    if info.kind == "dict" and len(parts) == 1:
        return parts[0].shape, parts[0].batch_dim, parts[0].name
    if info.kind == "dict" and parts:
        raise UnknownLayer(f"Layer {text!r} outputs a dict (or ModelOutput) of several tensors; select one: {names}.")
    raise UnknownLayer(f"Layer {info.path!r} does not output a tensor, so it cannot be stored. {hint}")
