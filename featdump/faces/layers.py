"""`list-layers` as text: every module path of a model with its type, calls per forward and output shape of one
image (or clip), as a tree or one JSON object per module, from one dry forward of the randomly initialised model."""

from __future__ import annotations

import json


def layer_listing(model: str, depth: int | None = None, as_json: bool = False, transform: str | None = None,
                  trust_pickle: bool = False, pattern: str | None = None) -> list[str]:
    """The lines `featdump list-layers MODEL` prints: modules down to DEPTH, those PATTERN selects, as JSON."""
    from featdump.forward.patterns import match_pattern
    from featdump.forward.probe import probe
    from featdump.inputs.clips import preprocess_for
    from featdump.sources.models import load_model

    lines: list[str] = []
    loaded = load_model(model, transform=transform, trust_pickle=trust_pickle, structure_only=True)
    shape = preprocess_for(loaded).input_shape  # a video model's: one clip of its own frames
    infos = [info for info in probe(loaded.module, shape, loaded.rows_within, loaded.stated_axes)
             if depth is None or info.depth <= depth]
    selected = {}
    if pattern:
        for name in match_pattern(pattern, infos, model):
            selected.setdefault(name.split("@")[0].split(":")[0], []).append(name)
        infos = [info for info in infos if info.path in selected]
    if as_json:
        for info in infos:
            row = {"path": info.path, "selector": info.selector, "type": info.type_name, "depth": info.depth,
                   "calls": info.calls, "shapes": [list(s) if s else None for s in info.shapes],
                   "batch_dims": list(info.batch_dims),
                   "per_image": all(dim is not None for dim in info.batch_dims) and not info.refusal,
                   "tuple_output": info.tuple_output}
            if any(info.parts):  # a tuple, list, dict or ModelOutput: its tensor parts, per call
                row["kind"] = info.kind
                row["parts"] = [[{"name": part.name, "shape": list(part.shape), "batch_dim": part.batch_dim,
                                  "folded_rows": part.fold.rows if part.fold and part.fold.contiguous else None}
                                 for part in call] for call in info.parts]
            if pattern:
                row["selected"] = selected[info.path]
            lines.append(json.dumps(row))
        return lines
    if pattern:
        count = sum(len(names) for names in selected.values())
        lines.append(f"{pattern!r} selects {count} layer{'s' * (count != 1)} of {model}: "
                   f"{', '.join(name for names in selected.values() for name in names)}")
    lines.append(f"{model}: {len(infos)} modules; PATH, type, calls per forward, output shape of one "
               f"({', '.join(map(str, shape))}) {'clip' if loaded.clip.takes_clips else 'image'} (no batch dimension)")
    width = max(len("  " * (info.depth - 1) + info.selector) for info in infos)
    width = max([width, *(len("  " * info.depth + f"{info.path}@{part.name}") for info in infos
                          for call in info.parts for part in call)])
    for info in infos:
        lines += _layer_lines(info, width)
    return lines


def _layer_lines(info, width: int) -> list[str]:
    """The module's line, then one line per tensor part of a tuple/dict output (PATH@NAME)."""
    lines = [_layer_line(info, width)]
    for part in () if info.refusal else dict.fromkeys(part for call in info.parts for part in call):
        name = ("  " * info.depth + f"{info.path}@{part.name}").ljust(width)
        fold = part.fold if part.batch_dim is None and part.fold is not None and part.fold.contiguous else None
        note = "" if part.batch_dim == 0 else \
            f"  (the batch folded into dimension {fold.axis}: N x {fold.rows} rows)" if fold else \
            "  (not per image)" if part.batch_dim is None else \
            f"  (batch in dimension {part.batch_dim}: stored batch-first)"
        shape = part.shape if fold is None else \
            (fold.rows, *(size for axis, size in enumerate(part.shape) if axis != fold.axis))
        lines.append(f"{name}  {'part':<22}     {shape}{note}")
    return lines


def _layer_line(info, width: int) -> str:
    name = ("  " * (info.depth - 1) + info.selector).ljust(width)
    shapes = " | ".join(sorted({str(shape) for shape in info.shapes})) or "(never runs)"
    if info.kind == "dict" and any(info.parts):
        shapes = "(its parts below)"
    elif any(fold is not None and fold.contiguous for fold in info.folds):
        shapes = " | ".join(sorted({str((fold.rows, *(size for axis, size in enumerate(shape) if axis != fold.axis)))
                                    for fold, shape in zip(info.folds, info.shapes) if fold is not None}))
    line = f"{name}  {info.type_name:<22} {info.calls}x  {shapes}"
    if info.refusal:
        return f"{name}  {info.type_name:<22}     (not a row of an image: selecting it says which layers are)"
    if not info.path:
        line += "  (the model's own output)"
    if info.calls > 1:
        line += f"  -> select {info.path}:1 ... {info.path}:{info.calls}"
    if info.kind == "tuple" and any(info.parts):
        line += "  (tuple output: its first tensor is stored, or select PATH@INDEX)"
    elif info.kind == "dict" and any(info.parts):
        line += "  (dict output: select PATH@KEY)" if len(info.parts[0]) > 1 else "  (dict output of one tensor)"
    folds = [fold for fold in info.folds if fold is not None]
    if info.kind == "dict":
        pass  # each part says whether it follows the batch
    elif folds and folds[0].contiguous:
        line += f"  (the batch folded into dimension {folds[0].axis}: N x {folds[0].rows} rows, stored as N rows of " \
                "this shape)"
    elif folds:
        line += f"  (the batch folded into dimension {folds[0].axis}, {folds[0].rows} rows per image, interleaved: " \
                "not stored per image)"
    elif any(dim is None for dim in info.batch_dims):
        line += "  (not per image: the output does not follow the batch)"
    elif any(info.batch_dims):
        line += f"  (batch in dimension {max(info.batch_dims)}: stored batch-first)"
    return line
