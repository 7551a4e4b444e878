"""Layers: parse selectors (PATH, PATH:K), probe a model's modules with one dry forward, resolve and validate."""

from __future__ import annotations

import difflib
import fnmatch
import logging
import re
from dataclasses import dataclass

import torch
from torch import nn

from featdump.errors import AmbiguousLayer, NotPerImage, UnknownLayer

log = logging.getLogger("featdump")
_SELECTOR = re.compile(r"^(?P<path>[^:\s]+)(?::(?P<call>\d+))?$")


@dataclass(frozen=True)
class LayerInfo:
    """One module as seen in a dry forward: where it is, what it is, what it outputs, how often it runs."""

    path: str  # dotted module path, e.g. "layer1.0.relu"
    type_name: str  # class name, e.g. "ReLU"
    calls: int  # times the module ran in one forward
    shapes: tuple  # output shape of each call, without the batch dimension (None: not a tensor)
    tuple_output: bool  # the output is a tuple/list; its first tensor is what gets stored
    batch_dims: tuple = ()  # per call: the dimension that follows the batch (None: none does, not per image)

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

    @property
    def layout(self) -> str | None:
        """'(197, N, 768) -> (N, 197, 768)' for an output whose batch is not first; None otherwise."""
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


def probe(model: nn.Module, input_shape: tuple[int, ...]) -> list[LayerInfo]:
    """Run forwards on zeros of INPUT_SHAPE (C, H, W) with batches of 2 and 3 and record every module's calls,
    output shapes and batch dimension (the one dimension whose size follows the batch)."""
    runs = [_record_calls(model, input_shape, batch) for batch in _PROBE_BATCHES]
    modules = dict(model.named_modules())
    infos = []
    for path in runs[0][0]:
        shapes, batch_dims = [], []
        for first, second in zip(runs[0][0][path], runs[1][0][path]):
            batch_dim = _batch_dim(first, second)
            shapes.append(None if first is None else
                          tuple(size for axis, size in enumerate(first) if axis != batch_dim))
            batch_dims.append(batch_dim)
        infos.append(LayerInfo(path, type(modules[path]).__name__, len(shapes), tuple(shapes), path in runs[0][1],
                               tuple(batch_dims)))
    return infos


_PROBE_BATCHES = (2, 3)


def _record_calls(model: nn.Module, input_shape: tuple[int, ...], batch: int):
    """({path: full output shape of each call}, {paths with tuple outputs}) for one forward of BATCH zeros."""
    records: dict[str, list] = {path: [] for path, _ in model.named_modules() if path}
    tuple_outputs: set[str] = set()

    def recorder(path):
        def hook(module, args, output):
            tensor = first_tensor(output)
            records[path].append(tuple(tensor.shape) if tensor is not None else None)
            if not isinstance(output, torch.Tensor):
                tuple_outputs.add(path)

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
    return records, tuple_outputs


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
    PATH:* selects every call, PATH:K the K-th. Modules that never run, or whose output is not a tensor
    or not per image, are left out. UnknownLayer when nothing matches or the pattern is malformed.
    """
    hint = f"Run `featdump list-layers {model_name} --match PATTERN` to try patterns."
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
        calls = [index for index in range(1, info.calls + 1)
                 if info.shapes[index - 1] is not None and (not info.batch_dims or info.batch_dims[index - 1]
                                                            is not None)]
        if call.isdigit():
            calls = [index for index in calls if index == int(call)]
        if info.calls == 1 and calls and not call:
            names.append(info.path)
        else:
            names += [f"{info.path}:{index}" for index in calls]
    if not names:
        literal = path_pattern.replace("**", "").replace("*", "").replace("?", "").strip(".")
        close = difflib.get_close_matches(literal, [info.path for info in infos], n=5, cutoff=0.6)
        maybe = f" Close matches: {', '.join(close)}." if close else ""
        raise UnknownLayer(f"Layer pattern {text!r} matches no layer of {model_name}.{maybe} {hint}")
    return names


def _components_match(pattern: list[str], path: list[str]) -> bool:
    if not pattern:
        return not path
    if pattern == ["**"]:  # a trailing ** selects what is below, not the module itself
        return bool(path)
    if pattern[0] == "**":
        return _components_match(pattern[1:], path) or (bool(path) and _components_match(pattern, path[1:]))
    return bool(path) and fnmatch.fnmatchcase(path[0], pattern[0]) and _components_match(pattern[1:], path[1:])


def parse_selector(text: str, hint: str = "") -> tuple[str, int | None]:
    """'PATH' -> (PATH, None); 'PATH:K' -> (PATH, K); UnknownLayer for anything else."""
    match = _SELECTOR.match(text.strip())
    if not match:
        raise UnknownLayer(f"Bad layer selector {text!r}: use a module path like layer1.0.conv1, or PATH:K. {hint}"
                           .strip())
    return match["path"], int(match["call"]) if match["call"] is not None else None


def _resolve_one(text: str, by_path: dict[str, LayerInfo], model_name: str) -> Layer:
    hint = f"Run `featdump list-layers {model_name}` to see every layer."
    path, call = parse_selector(text, hint)
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
    shape = info.shapes[index - 1]
    if shape is None:
        raise UnknownLayer(f"Layer {path!r} does not output a tensor, so it cannot be stored. {hint}")
    batch_dim = info.batch_dims[index - 1] if info.batch_dims else 0
    if batch_dim is None:
        raise NotPerImage(
            f"Layer {text!r} outputs {shape} whatever the batch size: its output does not depend on the batch "
            f"(a table or parameter, not one row per image), so it cannot be stored per image. {hint}"
        )
    return Layer(name=text, path=path, call=index, shape=shape, batch_dim=batch_dim)
