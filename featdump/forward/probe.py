"""Probe: dry forwards of a model that record, for every module and every call, what it outputs: shapes, the
dimension that follows the batch (or a batch folded with other rows), and the tensor parts of tuple, list,
dict and ModelOutput outputs (PATH@0, PATH@KEY)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from featdump.errors import ModelFailed, StopForward, UnknownLayer, first_sentence
from featdump.forward.meta import forward_on_meta

log = logging.getLogger("featdump")
MODEL_OUTPUT = "@"  # the selector of the model's own output (@KEY, @N: its parts)


@dataclass(frozen=True)
class Fold:
    """A dimension holding ROWS rows per image, images one after another (LeViT's BatchNorm1d over
    (batch x 49, C)), found by the probe: 2 images give 2 x ROWS rows, 3 give 3 x ROWS."""

    axis: int
    rows: int
    contiguous: bool  # each image's rows are one block (changing one image changes only its block)


@dataclass(frozen=True)
class Part:
    """One tensor of a module's output that is not a tensor itself: PATH@NAME."""

    name: str  # "0" for a tuple's first item, "last_hidden_state" for a dict's or ModelOutput's key
    shape: tuple[int, ...]  # without the batch dimension
    batch_dim: int | None
    fold: Fold | None = None  # where no dimension follows the batch: the batch folded with rows (Swin's windows)


@dataclass(frozen=True)
class LayerInfo:
    """One module as seen in a dry forward: where it is, what it is, what it outputs, how often it runs."""

    path: str  # dotted module path, e.g. "layer1.0.relu"; "" for the model itself (selected as @)
    type_name: str  # class name, e.g. "ReLU"
    calls: int  # times the module ran in one forward
    shapes: tuple  # output shape of each call, without the batch dimension (None: not a tensor)
    tuple_output: bool  # the output is a tuple/list; its first tensor is what gets stored
    batch_dims: tuple = ()  # per call: the dimension that follows the batch (None: none does, not per image)
    parts: tuple = ()  # per call: the Parts of a tuple/list/dict output (empty for a tensor)
    kind: str = "tensor"  # what the module returns: tensor, tuple (or list), dict (or ModelOutput), other
    folds: tuple = ()  # per call: a Fold when the batch is folded into a dimension with other rows, else None
    map_axes: tuple = ()  # per call: "channel,y,x" or "y,x,channel" for a 3-d map whose axes the probe told apart
    refusal: str = ""  # why its outputs are no rows of an image whatever their shape (a detector's boxes), or ""

    @property
    def depth(self) -> int:
        """0 for the model itself, 1 for its children, ..."""
        return self.path.count(".") + 1 if self.path else 0

    @property
    def selector(self) -> str:
        """How --layers names this module: its path, or @ for the model's own output."""
        return self.path or MODEL_OUTPUT


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


def tensor_parts(output, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of each tensor in a tuple/list/dict/ModelOutput output, nested ones named by their dotted
    path (BackboneOutput's `feature_maps.2`); None and other items left out."""
    kind = output_kind(output)
    items = [(str(key), value) for key, value in output.items()] if kind == "dict" else \
        [(str(index), item) for index, item in enumerate(output)] if kind == "tuple" else []
    found = []
    for key, value in items:
        if isinstance(value, torch.Tensor):
            found.append((prefix + key, value))
        elif output_kind(value) in ("dict", "tuple"):
            found += tensor_parts(value, f"{prefix}{key}.")
    return found


def take_part(output, part: str | None, name: str = "") -> torch.Tensor:
    """PART of a module's OUTPUT (None: the output itself, a tuple's first tensor, or a dict's only tensor), as
    values: a quantized tensor dequantized (a quantized model's rows are its values); UnknownLayer, naming what
    there is, when it holds no such tensor."""
    tensor = _take_part(output, part, name)
    return tensor.dequantize() if tensor.is_quantized else tensor


def _take_part(output, part: str | None, name: str = "") -> torch.Tensor:
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


def probe(model: nn.Module, input_shape: tuple[int, ...], rows_within: tuple[str, ...] = (),
          stated_axes: dict[str, str] | None = None) -> list[LayerInfo]:
    """Run forwards on zeros of INPUT_SHAPE (C, H, W) with batches of 2 and 3 and record every module's calls,
    output shapes and batch dimension (the one dimension whose size follows the batch). ROWS_WITHIN: the modules
    whose outputs alone are rows of an image (a detector's backbone); the others' are marked refused. A 3-d map's
    axes come from a forward at a larger size; where the model takes only its own size, from STATED_AXES (module
    path: the axes the model states), else they are UNKNOWN_AXES."""
    runs = [_record_calls(model, input_shape, batch, rows_within) for batch in _PROBE_BATCHES]
    resized = _resized_calls(model, input_shape, rows_within)
    modules = dict(model.named_modules())
    infos = []
    for path in runs[0][0]:
        shapes, batch_dims, parts = [], [], []
        for first, second in zip(runs[0][0][path], runs[1][0][path]):
            shape, batch_dim = _per_image(first.get(None), second.get(None))
            shapes.append(shape)
            batch_dims.append(batch_dim)
            parts.append(tuple(_part(name, size, second.get(name)) for name, size in first.items() if name is not None))
        kinds = runs[0][1][path]
        folds = tuple(_fold(first.get(None), second.get(None)) if batch_dim is None else None
                      for first, second, batch_dim in zip(runs[0][0][path], runs[1][0][path], batch_dims))
        maps = tuple(_map_axes(first.get(None), bigger.get(None), batch_dim) for first, bigger, batch_dim
                     in zip(runs[0][0][path], resized.get(path, []), batch_dims)) if resized else \
            tuple((stated_axes or {}).get(path, UNKNOWN_AXES) if shape is not None and len(shape) == 3 else None
                  for shape in shapes)
        infos.append(LayerInfo(path, type(modules[path]).__name__, len(shapes), tuple(shapes), "tuple" in kinds,
                               tuple(batch_dims), tuple(parts), kinds[0] if kinds else "tensor", folds, maps))
    return _refuse_outside(_check_folds(model, input_shape, infos), rows_within)


def _part(name: str, first: tuple | None, second: tuple | None) -> Part:
    """Part NAME from its shapes at batches 2 and 3: its batch dimension, or where none, the fold of the batch."""
    shape, batch_dim = _per_image(first, second)
    return Part(name, shape, batch_dim, _fold(first, second) if batch_dim is None else None)


def _refuse_outside(infos: list[LayerInfo], rows_within: tuple[str, ...]) -> list[LayerInfo]:
    """INFOS with every module outside ROWS_WITHIN (and the model's own output) refused, naming the layers within."""
    if not rows_within:
        return infos
    by_path = {info.path: info for info in infos}
    offered = [f"{root}@{part.name}" for root in rows_within if root in by_path
               for part in (by_path[root].parts[0] if by_path[root].parts else ())] or list(rows_within)
    within = [info.path for info in infos if any(info.path == root or info.path.startswith(root + ".")
                                                 for root in rows_within)]
    why = (f"its outputs are detections, proposals or per-proposal tensors, not rows of an image; use "
           f"{', '.join(offered)}, or a module inside {' or '.join(rows_within)}")
    return [info if info.path in within else dataclasses.replace(info, refusal=why) for info in infos]


UNKNOWN_AXES = "unknown"  # a 3-d map of a model that takes only its own input size and states no axes for it
_RESIZED = (32, 64)  # pixels added to the input's height and width for the run that tells a map's axes apart


def _resized_calls(model: nn.Module, input_shape: tuple[int, ...], rows_within: tuple[str, ...] = ()
                   ) -> dict[str, list]:
    """Per module, per call, the output shapes of a forward of one input taller and wider than INPUT_SHAPE (by
    _RESIZED); {} for a model that takes only its own input size (a ViT's position embeddings)."""
    if len(input_shape) != 3:
        return {}
    channels, height, width = input_shape
    try:
        return _record_calls(model, (channels, height + _RESIZED[0], width + _RESIZED[1]), 1, rows_within)[0]
    except ModelFailed:
        return {}


def _map_axes(base: tuple | None, bigger: tuple | None, batch_dim: int | None) -> str | None:
    """What the axes of a 3-d per-image map are, from its shapes at two input sizes: the axis whose size does not
    follow the input's is the channel, the two that do are y and x; None when that is not what
    the shapes say."""
    if base is None or bigger is None or batch_dim is None or len(base) != 4 or len(bigger) != 4:
        return None
    pairs = [(a, b) for axis, (a, b) in enumerate(zip(base, bigger)) if axis != batch_dim]
    grew = [b > a for a, b in pairs]
    if grew == [False, True, True]:
        return "channel,y,x"
    if grew == [True, True, False]:
        return "y,x,channel"
    return None


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
    folded = {info.path: info for info in infos
              if any(info.folds) or any(part.fold for call in info.parts for part in call)}
    if not folded:
        return infos
    generator = torch.Generator().manual_seed(0)
    first, second = (torch.rand((1, *input_shape), generator=generator) for _ in range(2))
    same = _call_outputs(model, torch.cat([first, first]), folded)
    changed = _call_outputs(model, torch.cat([first, second]), folded)
    checked = []
    for info in infos:
        if info.path in folded:
            calls = list(zip(same[info.path], changed[info.path]))
            folds = tuple(_judged(fold, *calls[call], None) for call, fold in enumerate(info.folds))
            parts = tuple(tuple(dataclasses.replace(part, fold=_judged(part.fold, *calls[call], part.name))
                                for part in call_parts) for call, call_parts in enumerate(info.parts))
            info = dataclasses.replace(info, folds=folds, parts=parts)
        checked.append(info)
    return checked


def _judged(fold: Fold | None, before: tuple, after: tuple, name: str | None) -> Fold | None:
    """FOLD of output part NAME (None: the output's tensor) marked contiguous or not from one call's (outputs,
    input) BEFORE and AFTER the second image changed."""
    if fold is None:
        return None
    rows = _rows_changed((before[0][name], before[1]), (after[0][name], after[1]), fold)
    return dataclasses.replace(fold, contiguous=bool(rows) and fold.rows <= rows[0] and rows[1] <= 2 * fold.rows)


def _call_outputs(model: nn.Module, inputs: torch.Tensor, paths) -> dict[str, list[tuple[torch.Tensor, ...]]]:
    """Per module, per call: ({None: its output's tensor, part name: each part's}, its first input when a
    tensor)."""
    outputs: dict[str, list] = {path: [] for path in paths}

    def record(module, args, output, path):
        given = args[0].clone() if args and isinstance(args[0], torch.Tensor) else None
        first = first_tensor(output)
        tensors = {None: first.clone() if first is not None else None}
        tensors.update((name, part.clone()) for name, part in tensor_parts(output))
        outputs[path].append((tensors, given))

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
    output's, or the input's when the output did not change and has the input's shape (empty when none, or when the
    two calls do not give the same shape)."""
    (output_before, input_before), (output_after, input_after) = before, after
    if output_before.shape != output_after.shape:
        return []  # rows that come and go with the content (a detector's proposals): no fold of the batch
    if torch.equal(output_before, output_after) and input_before is not None \
            and input_before.shape == output_before.shape:
        output_before, output_after = input_before, input_after
    differs = (output_before != output_after).movedim(fold.axis, 0).flatten(1).any(dim=1).nonzero().flatten().tolist()
    return [differs[0], differs[-1] + 1] if differs else []


def _per_image(first: tuple | None, second: tuple | None) -> tuple[tuple | None, int | None]:
    """(the shape without the batch dimension, the batch dimension) from one output's shapes at batches 2 and 3."""
    batch_dim = _batch_dim(first, second)
    return (None if first is None else tuple(size for axis, size in enumerate(first) if axis != batch_dim)), batch_dim


_PROBE_BATCHES = (2, 3)


def _record_calls(model: nn.Module, input_shape: tuple[int, ...], batch: int, rows_within: tuple[str, ...] = ()):
    """({path: per call, {None: the shape of the output's (first) tensor, part name: its shape}},
    {path: per call, the kind of output}) for one forward of BATCH zeros: on the meta device (shapes without
    arithmetic), or, for a model that does not run there (a detector's data-dependent shapes), for real."""
    try:
        return _recorded(model, input_shape, batch, rows_within, on_meta=True)
    except Exception as error:  # noqa: BLE001 - any failure on meta tensors is answered by the real forward
        log.debug("Probing with real zeros: the model does not run on the meta device (%s).", first_sentence(error))
    return _recorded(model, input_shape, batch, rows_within, on_meta=False)


def _recorded(model: nn.Module, input_shape: tuple[int, ...], batch: int, rows_within: tuple[str, ...],
              on_meta: bool):
    records: dict[str, list] = {path: [] for path, _ in model.named_modules()}  # "" first: the model itself
    kinds: dict[str, list] = {path: [] for path in records}

    def recorder(path):
        def hook(module, args, output):
            tensor = first_tensor(output)
            shapes = {None: tuple(tensor.shape) if tensor is not None else None}
            shapes.update((name, tuple(part.shape)) for name, part in tensor_parts(output))
            records[path].append(shapes)
            kinds[path].append(output_kind(output))

        return hook

    handles = [module.register_forward_hook(recorder(path)) for path, module in model.named_modules()]
    if rows_within:  # nothing after the last module whose outputs are rows is needed: a detector's heads are not run
        handles.append(model.get_submodule(rows_within[-1]).register_forward_hook(_stop))
    try:
        parameter = next(model.parameters(), None)
        device = parameter.device if parameter is not None else torch.device("cpu")
        with torch.inference_mode():
            if on_meta:
                forward_on_meta(model, (batch, *input_shape))
            else:
                model(torch.zeros((batch, *input_shape), device=device))
    except StopForward:
        pass
    except (RuntimeError, ValueError, TypeError, IndexError, AssertionError) as error:  # the model's own refusal
        if on_meta:
            raise
        raise ModelFailed(f"The model fails on a batch of {batch} inputs of shape {input_shape} (the size its "
                          f"preprocessing makes): {first_sentence(error)}.") from error
    finally:
        for handle in handles:
            handle.remove()
    return records, kinds


def _stop(module, args, output):
    raise StopForward


def _batch_dim(first: tuple | None, second: tuple | None) -> int | None:
    """The first dimension that is 2 in FIRST and 3 in SECOND (the probe's batches); None if none is."""
    if first is None or second is None or len(first) != len(second):
        return None
    following = [axis for axis, (a, b) in enumerate(zip(first, second)) if (a, b) == _PROBE_BATCHES]
    if len(following) > 1:
        log.info("Output dimensions %s all follow the batch size; taking dimension %d as the batch.",
                 following, following[0])
    return following[0] if following else None
