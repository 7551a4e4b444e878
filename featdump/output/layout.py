"""Layout: the output file's format, its one owner: creating it, the commit counters, path text and bytes,
and opening an output to read what it holds (info, show, load, merge and update all read through here).

    /features/<layer>   (rows, *shape), chunked along rows; attribute `reduction` (none, avgpool, srp:4096, ...)
                        and what the reduction records (srp_seed, srp_input_dim, ..., pca_k, ...); `axes` of a
                        map whose axes the model showed ("channel,y,x", or "y,x,channel" as Swin keeps them)
    /pca/<layer>/mean, components, explained_variance   a pca:K layer's fit (`featdump.reductions.pca`)
    /paths              (rows,) UTF-8 paths relative to the image root, row-aligned with the features
    /raw_paths/rows, /raw_paths/bytes  the exact bytes of the names that are not UTF-8 (shown in /paths
                        with those bytes as \\xNN), by row
    /labels             (rows,) int64, attribute `classes`
    /file_stats         (rows, 2) int64: each image's size and version when it was read: a file's modification
                        time (ns), an array row's digest of its bytes (`inputs.arrays.row_digest`)
    /stale/paths, /stale/reasons   rows whose image disappeared or changed, as found by the last --update
    /skipped/paths, /skipped/reasons   images that could not be used, and why (with /skipped/raw_paths)
    /image, /channel_64, ...   the datasets' named dimensions, /features/path and /features/label the rows'
                        coordinates: the file is NetCDF-4 that xarray opens (`featdump.output.netcdf`)
    attributes          model, weights, ..., `fingerprint`, `complete`, and `committed` = [rows, images, skipped]

Rows past the counters are not data: a writer killed mid-batch may leave them, and readers stop at the counters.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from featdump.errors import MergedViewBroken, NotAnOutput
from featdump.output import netcdf
from featdump.output.specs import DatasetSpec, chunk_shape, compression_filters, register_filters

FORMAT = "featdump/3"  # 3: named dimensions (NetCDF-4); 2 had none
UPGRADED = ("featdump/2",)  # formats this version resumes and updates, naming their dimensions as it does so
STRING = h5py.string_dtype("utf-8")
_BYTES = h5py.vlen_dtype(np.uint8)


@dataclass(frozen=True)
class Committed:
    """The commit counters: rows written, source images done (written or skipped), images skipped."""

    rows: int
    images: int
    skipped: int

    @classmethod
    def of(cls, h5file: h5py.File) -> Committed:
        rows, images, skipped = (int(value) for value in h5file.attrs["committed"])
        return cls(rows, images, skipped)

    def store(self, h5file: h5py.File) -> None:
        """Overwrite the counters in place, in one write (the commit)."""
        h5file.attrs.modify("committed", np.array([self.rows, self.images, self.skipped], dtype=np.int64))


def partial_path(output: Path) -> Path:
    return output.with_name(output.name + ".partial")


def create_layout(h5file: h5py.File, attributes: dict, classes, feature_group=None) -> None:
    """Every dataset but the features (FEATURE_GROUP(group) makes those), the attributes, zero counters."""
    for key, value in attributes.items():
        set_attribute(h5file, key, value)
    h5file.attrs["format"] = FORMAT
    h5file.attrs["complete"] = False
    features = h5file.create_group("features")
    if feature_group is not None:
        feature_group(features)
    create_path_datasets(h5file, 4096)
    labels = h5file.create_dataset("labels", shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(4096,))
    labels.attrs["classes"] = classes if isinstance(classes, np.ndarray) else text_array(classes)
    h5file.create_dataset("file_stats", shape=(0, 2), maxshape=(None, 2), dtype=np.int64, chunks=(2048, 2))
    create_named_rows(h5file.create_group("skipped"))
    h5file.attrs["committed"] = np.zeros(3, dtype=np.int64)
    name_dimensions(h5file)


def name_dimensions(h5file: h5py.File) -> None:
    """Name the dimensions of every dataset H5FILE holds (idempotent: after a change of its datasets too), which
    brings a file of an earlier format (UPGRADED) to this one."""
    netcdf.label(h5file)
    if text_of(h5file.attrs.get("format")) != FORMAT:
        h5file.attrs["format"] = FORMAT


def create_features(group: h5py.Group, specs: dict[str, DatasetSpec], batch_size: int, compression: str,
                    expected_rows: int | None = None) -> None:
    """GROUP's resizable feature datasets, chunked for BATCH_SIZE (and EXPECTED_ROWS)."""
    filters = compression_filters(compression)
    for name, spec in specs.items():
        dataset = group.create_dataset(name, shape=(0, *spec.shape), maxshape=(None, *spec.shape), dtype=spec.dtype,
                                       chunks=chunk_shape(spec, batch_size, expected_rows), **filters)
        if spec.layout:
            dataset.attrs["layout"] = spec.layout
        if spec.part is not None:
            dataset.attrs["part"] = spec.part
        if spec.tokens is not None:  # the class/register tokens come first, then the patches row by row
            dataset.attrs["prefix_tokens"] = spec.tokens[0]
            dataset.attrs["patch_grid"] = list(spec.tokens[1:])
        if spec.axes is not None:
            dataset.attrs["axes"] = spec.axes
        dataset.attrs["reduction"] = spec.reduction
        dataset.attrs.update(spec.reduction_attributes)
        if spec.fit is not None:
            spec.fit.store(group.file.require_group("pca").create_group(name))


PROOF = "proof"  # the root attribute: a JSON list, one entry per run that wrote rows (extract, update, shard)


def append_proof(h5file: h5py.File, entry: dict) -> None:
    """Add one run's proof (`featdump.job.proof`) to the file's list."""
    h5file.attrs[PROOF] = json.dumps([*proofs_of(h5file.attrs), entry])


def proofs_of(attrs) -> list[dict]:
    """The proofs a file's (or a shard's) attributes record, oldest first."""
    text = text_of(attrs.get(PROOF))
    return json.loads(text) if text else []


def set_attribute(h5file: h5py.File, key: str, value) -> None:
    """An attribute with its text as valid UTF-8 (lists of text as string arrays)."""
    if isinstance(value, list):
        value = np.array([as_text(item) if isinstance(item, str) else item for item in value], dtype=STRING)
    h5file.attrs[key] = as_text(value) if isinstance(value, str) else value


def create_path_datasets(group: h5py.Group, chunk_rows: int) -> None:
    group.create_dataset("paths", shape=(0,), maxshape=(None,), dtype=STRING, chunks=(chunk_rows,))
    raw = group.create_group("raw_paths")
    raw.create_dataset("rows", shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(256,))
    raw.create_dataset("bytes", shape=(0,), maxshape=(None,), dtype=_BYTES, chunks=(256,))


def create_named_rows(group: h5py.Group) -> None:
    """GROUP/paths (with raw_paths) and GROUP/reasons: the skipped images, or the stale rows."""
    create_path_datasets(group, 256)
    group.create_dataset("reasons", shape=(0,), maxshape=(None,), dtype=STRING, chunks=(256,))


# -- rows and names ------------------------------------------------------------------------------


ROW_COORDINATES = tuple(netcdf.ROW_COORDINATES)  # row-aligned datasets beside /paths that a video job writes


def coordinate_rows(h5file: h5py.File, name: str) -> h5py.Dataset:
    """The row-aligned float64 dataset /NAME (a row coordinate such as a clip's start), made when first needed."""
    if name not in h5file:
        h5file.create_dataset(name, shape=(0,), maxshape=(None,), dtype=np.float64, chunks=(4096,), fillvalue=math.nan)
    return h5file[name]


def copy_coordinates(target: h5py.File, source: h5py.File, start: int, rows: int) -> None:
    """SOURCE's first ROWS rows of each row coordinate it holds into TARGET's, from row START (an update's staged
    rows, a shard's)."""
    for name in ROW_COORDINATES:
        if name in source:
            write_rows(coordinate_rows(target, name), start, start + rows, source[name][:rows])


def write_rows(dataset: h5py.Dataset, start: int, stop: int, values: np.ndarray) -> None:
    if dataset.shape[0] != stop:
        dataset.resize(stop, axis=0)
    dataset[start:stop] = values


def as_text(name: str) -> str:
    """NAME as valid UTF-8 text: a file name's undecodable bytes (surrogate escapes) shown as \\xNN."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace")


def text_array(names) -> np.ndarray:
    return np.array([as_text(name) for name in names], dtype=STRING)


def write_paths(h5file: h5py.File, group: str, start: int, paths: list[str]) -> None:
    """Rows START.. of GROUP/paths as text; the exact bytes of names that are not UTF-8 in GROUP/raw_paths."""
    texts = [as_text(path) for path in paths]
    write_rows(h5file[group + "paths"], start, start + len(paths), np.array(texts, dtype=object))
    raw = [(start + index, os.fsencode(path)) for index, (path, text) in enumerate(zip(paths, texts))
           if text is not path]
    if raw:
        rows, names = h5file[group + "raw_paths/rows"], h5file[group + "raw_paths/bytes"]
        count = rows.shape[0]
        write_rows(rows, count, count + len(raw), np.array([row for row, _ in raw], dtype=np.int64))
        names.resize(count + len(raw), axis=0)
        for index, (_, name) in enumerate(raw):  # one by one: h5py cannot slice-assign a single sequence
            names[count + index] = np.frombuffer(name, dtype=np.uint8)


def raw_paths(h5file: h5py.File, group: str = "", count: int | None = None) -> list[bytes]:
    """The exact bytes of every row's path (GROUP 'skipped/' for the skipped images; the first COUNT)."""
    held = h5file[group + "paths"]
    paths = held[:count if count is not None else len(held)].tolist()  # the UTF-8 bytes as written
    raw = h5file.get(group + "raw_paths")
    if raw is not None:
        for row, name in zip(raw["rows"][:], raw["bytes"][:]):
            if row < len(paths):
                paths[row] = name.tobytes()
    return paths


def occurrences(paths) -> list[int]:
    """For each of PATHS (rows in order), how many rows before it have the same path: the k-th row of a path is
    its k-th image (a video's k-th clip; a tar member named twice, its k-th copy)."""
    seen: dict[str, int] = {}
    found = []
    for path in paths:
        seen[path] = seen.get(path, -1) + 1
        found.append(seen[path])
    return found


def text_of(value) -> str | None:
    """An attribute's value as str (h5py gives bytes or str)."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


# -- reading -------------------------------------------------------------------------------------


def open_to_read(path) -> h5py.File:
    """PATH opened to read, as every featdump reader opens a file: without HDF5's file lock (featdump's own lock
    guards writers, and readers must not block a growth's final commit). One way everywhere, because HDF5 refuses
    a second open of a file in one process with other locking flags ("file locking flag values don't match"): a
    FeatureDataset iterating while `featdump.load` or `probe` reads the same file. When a script of the same
    process holds the file with h5py's default flags, it is opened with those instead."""
    try:
        return h5py.File(path, "r", locking=False)
    except OSError as error:
        if "locking flag values don't match" not in str(error):
            raise
        return h5py.File(path, "r")  # as the handle already open in this process (h5py's default)


class Output:
    """An output file opened to read what it holds, up to its commit counters (use as a context manager)."""

    def __init__(self, path: Path, h5file: h5py.File):
        self.path, self.file = Path(path), h5file

    @classmethod
    def open(cls, path: Path, mode: str = "r", locking: bool | None = None) -> Output:
        """PATH as a featdump output; NotAnOutput if it is missing, unreadable, or not one featdump wrote."""
        path = Path(path)
        if not path.exists():
            raise NotAnOutput(f"No file {str(path)!r}.")
        register_filters()
        try:
            h5file = open_to_read(path) if mode == "r" else \
                h5py.File(path, mode) if locking is None else h5py.File(path, mode, locking=locking)
        except OSError as error:
            raise NotAnOutput(f"{str(path)!r} is not a readable HDF5 file ({error}).") from error
        if "committed" not in h5file.attrs or "features" not in h5file:
            result = "made_from" in h5file.attrs
            h5file.close()
            if result:  # analysis/results.py's mark
                raise NotAnOutput(f"{str(path)!r} is what `featdump rdm`, `cka`, `probe`, `encode` or `top` wrote, "
                                  f"not an output of extract: see `featdump info {path}`, or read it with h5py.")
            raise NotAnOutput(f"{str(path)!r} is an HDF5 file, but not one featdump wrote.")
        output = cls(path, h5file)
        if output.attrs.get("virtual", False):
            problems = output.shard_problems()
            if problems:
                output.close()
                raise MergedViewBroken(
                    f"{str(path)!r} is a merged view whose shard files are {'; '.join(problems)} (beside it, in "
                    f"{str(path.parent)!r}): its rows would read as NaN. Keep the shards beside it (move them "
                    "together), or merge again where they are with `featdump merge --copy` for a self-contained file."
                )
        return output

    def shard_problems(self) -> list[str]:
        """For a virtual merged view: each shard file that is missing, or not the size it was when merged."""
        names = [text_of(name) for name in self.attrs.get("merged_from", [])]
        sizes = list(self.attrs.get("merged_sizes", [-1] * len(names)))
        missing, changed = [], []
        for name, size in zip(names, sizes):
            shard = self.path.parent / name
            if not shard.exists():
                missing.append(name)
            elif size >= 0 and shard.stat().st_size != size:
                changed.append(name)
        return ([f"missing: {', '.join(missing)}"] if missing else []) + \
            ([f"changed since the merge: {', '.join(changed)}"] if changed else [])

    def __enter__(self) -> Output:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self.file.id.valid:
            self.file.close()

    @property
    def attrs(self):
        return self.file.attrs

    @property
    def noun(self) -> str:
        """What a row is, as messages name it: a clip (of a video job) or an image."""
        return "clip" if "clip_start" in self.file else "image"

    @property
    def committed(self) -> Committed:
        return Committed.of(self.file)

    @property
    def complete(self) -> bool:
        return bool(self.file.attrs.get("complete", False))

    @property
    def fingerprint(self) -> dict:
        return json.loads(self.file.attrs.get("fingerprint", "{}"))

    @property
    def proofs(self) -> list[dict]:
        return proofs_of(self.file.attrs)

    @property
    def layers(self) -> list[str]:
        """The layers it holds in the one order the file records them in (the model's), then any it does not
        record (never the HDF5 group's alphabetical order)."""
        held = netcdf.layer_names(self.file)
        recorded = [text_of(name) for name in self.file.attrs.get("layers", []) if text_of(name) in held]
        return recorded + [name for name in held if name not in recorded]

    def features(self, layer: str) -> h5py.Dataset:
        return self.file["features"][layer]

    def reduction(self, layer: str) -> str:
        """What LAYER's dataset keeps of the layer's output (files before reductions were recorded: the run's)."""
        dataset = self.features(layer)
        if "reduction" in dataset.attrs:
            return text_of(dataset.attrs["reduction"])
        return text_of(self.attrs.get("reduce", "none"))

    def pca_fit(self, layer: str) -> h5py.Group | None:
        """The group holding LAYER's PCA fit (mean, components, explained_variance), or None."""
        return self.file.get(f"pca/{layer}")

    @property
    def classes(self) -> list[str]:
        return [text_of(name) for name in self.file["labels"].attrs.get("classes", [])]

    def paths(self, group: str = "") -> list[str]:
        """The committed rows' paths as text (GROUP 'skipped/' or 'stale/' for those lists)."""
        return list(self.file[group + "paths"].asstr()[:self._count(group)])

    def raw_paths(self, group: str = "") -> list[bytes]:
        """The committed rows' paths as their exact bytes."""
        return raw_paths(self.file, group, self._count(group))

    def labels(self):
        return self.file["labels"][:self.committed.rows]

    def named_rows(self, group: str, limit: int) -> list[list[str]]:
        """The first LIMIT (path, reason) of GROUP 'skipped' or 'stale'."""
        if group not in self.file:
            return []
        shown = min(self._count(group + "/"), limit)
        return [[name, reason] for name, reason in zip(self.file[f"{group}/paths"].asstr()[:shown],
                                                       self.file[f"{group}/reasons"].asstr()[:shown])]

    def stale_count(self) -> int:
        return len(self.file["stale/paths"]) if "stale" in self.file else 0

    def known_paths(self) -> set[str]:
        """Paths (as the image walk names them) of every committed row and skipped image."""
        return {os.fsdecode(name) for name in self.raw_paths() + self.raw_paths("skipped/")}

    def row_files(self) -> list[tuple[str, int, int]]:
        """(path, size, mtime_ns) of every committed row when its image was read."""
        stats = self.file["file_stats"][:self.committed.rows]
        return [(os.fsdecode(name), int(size), int(mtime)) for name, (size, mtime) in zip(self.raw_paths(), stats)]

    def _count(self, group: str) -> int:
        if group == "":
            return self.committed.rows
        if group == "skipped/":
            return self.committed.skipped
        return len(self.file[group + "paths"])
