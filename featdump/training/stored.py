"""Stored: what a FeatureDataset reads, found once when it is made: the files holding the rows (one output, the
shard files of a merged view, or a job's shard files given as a list), the layers' per-sample shapes (whole rows, or
one token or map position of each row), and the blocks of rows that are read whole (aligned with every layer's
chunks). Bad input is one featdump error."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from featdump.errors import BadOption, NotAnOutput, UsageProblem
from featdump.forward.patterns import select_stored
from featdump.output import netcdf
from featdump.output.layout import Output, partial_path, text_of

TOKENS = (None, "all", "patches")
# A block of rows, the unit of the shuffle, read whole: the common multiple of every layer's chunk rows while that
# stays under 64 MiB (else the largest chunk). Chunks follow the extraction's batches (64 rows by default).
_BLOCK_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class Part:
    """One file's committed rows, the rows OFFSET.. of the whole set."""

    path: Path
    rows: int
    offset: int
    block_rows: int  # rows read whole, the shuffle's unit: every layer's chunks at once


@dataclass(frozen=True)
class LayerForm:
    """How one layer's rows become samples: whole rows, or the tokens of a sequence or the positions of a map."""

    name: str
    row_shape: tuple[int, ...]
    dtype: np.dtype
    kind: str  # "row", "sequence" (tokens, dim), "channels_first" (C, H, W) or "channels_last" (H, W, C)
    first_token: int = 0  # tokens before it are left out (a sequence's class and register tokens, for "patches")

    @property
    def tokens(self) -> int:
        """Samples per row."""
        if self.kind == "row":
            return 1
        if self.kind == "sequence":
            return self.row_shape[0] - self.first_token
        return self.row_shape[1] * self.row_shape[2] if self.kind == "channels_first" else \
            self.row_shape[0] * self.row_shape[1]

    @property
    def sample_shape(self) -> tuple[int, ...]:
        if self.kind == "row":
            return self.row_shape
        return (self.row_shape[0],) if self.kind == "channels_first" else (self.row_shape[-1],)

    @property
    def reads_in_place(self) -> bool:
        """Whole rows are already their samples in order (no token left out, no axes to move)."""
        return self.kind in ("row", "channels_last") or (self.kind == "sequence" and not self.first_token)

    def samples(self, rows: np.ndarray) -> np.ndarray:
        """ROWS (n, *row_shape) as (n x tokens, *sample_shape): row by row, each row's tokens in order."""
        if self.kind == "row":
            return rows
        if self.kind == "sequence":
            kept = rows[:, self.first_token:] if self.first_token else rows
            return kept.reshape(-1, self.row_shape[-1])
        if self.kind == "channels_last":
            return rows.reshape(-1, self.row_shape[-1])
        return rows.reshape(len(rows), self.row_shape[0], -1).transpose(0, 2, 1).reshape(-1, self.row_shape[0])


@dataclass(frozen=True)
class StoredRows:
    """The rows a FeatureDataset serves: its parts, the chosen layers' forms, the classes."""

    parts: list[Part]
    layers: list[LayerForm]
    classes: list[str]
    tokens: int  # samples per row (1 without tokens)

    @property
    def rows(self) -> int:
        return sum(part.rows for part in self.parts)

    @property
    def sample_bytes(self) -> int:
        return sum(math.prod(layer.sample_shape) * layer.dtype.itemsize for layer in self.layers)


def read_stored(path, layers, tokens: str | None) -> StoredRows:
    """PATH (an output, an OUT.partial, a merged view, or a list of a job's shard files) with LAYERS (names or
    patterns; all when None) and TOKENS (None, "all" or "patches") as a FeatureDataset reads it."""
    if tokens not in TOKENS:
        raise BadOption(f"tokens={tokens!r}: use None (whole rows), 'all' (every token of each row) or 'patches' "
                        "(the patch tokens: class and register tokens left out).")
    files = [Path(item) for item in path] if isinstance(path, (list, tuple)) else _files_of(Path(path))
    if not files:
        raise UsageProblem("FeatureDataset: the list of shard files is empty.")
    parts, first, classes, made_by = [], None, (), {}
    offset = 0
    for file in files:
        with _open(file) as output:
            names = _layers(output, layers) if first is None else [layer.name for layer in first]
            if first is not None:
                _check_same_job(file, output, names, classes, made_by)
            forms = [_form(output, name, tokens) for name in names]
            if first is None:
                first, classes, made_by = forms, output.classes, _made_by(output)
            _check_alike(file, forms, first)
            rows = output.committed.rows
            _check_rows(output, names, rows)
            parts.append(Part(file, rows, offset, _block_rows(output, names)))
            offset += rows
    counts = {layer.name: layer.tokens for layer in first}
    if tokens and len(set(counts.values())) > 1:
        raise UsageProblem(f"tokens={tokens!r}: the layers hold different numbers of tokens per image "
                           f"({', '.join(f'{name}: {count}' for name, count in counts.items())}), so their samples "
                           "cannot be aligned; read them with separate datasets.")
    return StoredRows(parts, first, classes, first[0].tokens)


def _files_of(path: Path) -> list[Path]:
    """The files holding PATH's rows: itself, or a merged view's shards (read directly, not through the view)."""
    if not path.exists() and partial_path(path).exists():
        with _open(partial_path(path)) as unfinished:
            rows = unfinished.committed.rows
        raise UsageProblem(f"{str(path)!r} is not finished (its run is still going, or was stopped): to train on the "
                           f"{rows} rows it has committed, give {str(partial_path(path))!r}; or finish the run first.")
    with _open(path) as output:
        if output.attrs.get("virtual", False) and "merged_from" in output.attrs:
            return [path.parent / text_of(name) for name in output.attrs["merged_from"]]
    return [path]


def _open(path: Path) -> Output:
    try:
        return Output.open(path, locking=False)
    except NotAnOutput as error:
        raise NotAnOutput(f"FeatureDataset: {error}") from error


def _layers(output: Output, layers) -> list[str]:
    order = output.layers
    if layers is None:
        return order
    selectors = [part.strip() for part in (layers.split(",") if isinstance(layers, str) else layers) if part.strip()]
    return select_stored(selectors, order, repr(str(output.path))) if selectors else order


def _form(output: Output, name: str, tokens: str | None) -> LayerForm:
    dataset = output.features(name)
    shape, dtype = tuple(dataset.shape[1:]), np.dtype(dataset.dtype)
    if tokens is None:
        return LayerForm(name, shape, dtype, "row")
    axes = netcdf.axis_kinds(shape, dataset.attrs)
    if axes == ["token", "feature"]:
        if tokens == "all":
            return LayerForm(name, shape, dtype, "sequence")
        if "prefix_tokens" not in dataset.attrs:
            raise UsageProblem(f"tokens='patches' on layer {name!r}: {str(output.path)!r} does not record which of "
                               "its tokens are class or register tokens (the model did not state them); use "
                               "tokens='all'.")
        return LayerForm(name, shape, dtype, "sequence", int(dataset.attrs["prefix_tokens"]))
    if axes in (["channel", "y", "x"], ["y", "x", "channel"]):
        return LayerForm(name, shape, dtype, "channels_first" if axes[0] == "channel" else "channels_last")
    raise UsageProblem(f"tokens={tokens!r} on layer {name!r} of shape {shape}: it has no tokens (a (tokens, dim) "
                       "sequence, or a (channels, y, x) map whose positions are its tokens); use tokens=None.")


def _made_by(output: Output) -> dict:
    """What makes a file's rows one job's: its model, weights and seed."""
    return {key: text_of(output.attrs.get(key)) for key in ("model", "weights", "seed")}


def _check_same_job(path: Path, output: Output, names: list[str], classes, made_by: dict) -> None:
    """UsageProblem when the file at PATH is not a part of the first file's job: another model, other classes (its
    labels would mean other things), or without one of its layers NAMES."""
    missing = [name for name in names if name not in output.layers]
    mine = _made_by(output)
    differs = [f"{key} {mine[key]!r}, the first file's {made_by[key]!r}" for key in made_by
               if mine[key] != made_by[key]]
    if list(output.classes) != list(classes):
        differs.append(f"classes {list(output.classes)[:4]}, the first file's {list(classes)[:4]}")
    if missing:
        differs.append(f"no layer {missing[0]!r}")
    if differs:
        raise UsageProblem(f"{str(path)!r} is not a part of the first file's job ({'; '.join(differs)}): give the "
                           "shard files of one job, or read each output with its own FeatureDataset.")


def _check_alike(path: Path, forms: list[LayerForm], first: list[LayerForm]) -> None:
    for form, expected in zip(forms, first):
        if (form.row_shape, form.dtype) != (expected.row_shape, expected.dtype):
            raise UsageProblem(f"{str(path)!r} holds layer {form.name!r} as {form.row_shape} {form.dtype}, the first "
                               f"file as {expected.row_shape} {expected.dtype}: not shards of one job.")


def _check_rows(output: Output, names: list[str], rows: int) -> None:
    short = [(name, output.features(name).shape[0]) for name in names if output.features(name).shape[0] < rows]
    if short:
        name, count = short[0]
        raise UsageProblem(f"{str(output.path)!r}: layer {name!r} holds {count} rows where the file has committed "
                           f"{rows}: its layers are of different row counts (a damaged file?); extract it again.")


def _block_rows(output: Output, names: list[str]) -> int:
    """The shuffle's unit of rows in this file: the least common multiple of the layers' chunk rows (one chunk of
    each read whole), or the largest chunk where that multiple is over _BLOCK_BYTES."""
    chunks = [_chunk_rows(output.features(name)) for name in names]
    row_bytes = max(1, sum(math.prod(output.features(name).shape[1:]) * output.features(name).dtype.itemsize
                           for name in names))
    common = math.lcm(*chunks)
    return max(chunks) if common * row_bytes > _BLOCK_BYTES else common


def _chunk_rows(dataset: h5py.Dataset) -> int:
    return int(dataset.chunks[0]) if dataset.chunks else max(1, _BLOCK_BYTES // max(dataset.dtype.itemsize, 1)
                                                               // max(math.prod(dataset.shape[1:]), 1))
