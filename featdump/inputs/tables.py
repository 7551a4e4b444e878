"""Tables: images kept as encoded bytes in the rows of Parquet files, as Hugging Face datasets keep them (ImageNet-1k,
COCO, CIFAR: `train-00000-of-00040.parquet`, an image column holding a struct of `bytes` and `path`, a `label`
column), locally or at a URL (s3://, gs://, hf://datasets/... through fsspec; extra `featdump[parquet]`: pyarrow).

IMAGES is a .parquet file, a folder (or a store prefix, or a dataset at hf://) of them, or a glob or brace pattern of
them; rows come in file order, then row order. The image column is found by itself (the one struct of `bytes` and
`path`, else the one binary column) or named by --image-column; the label column is `label` (or --label-column), its
Hugging Face ClassLabel names recorded as the classes where the file's metadata holds them. A row's path names its
file and its row, then the image's own path where the table has one: `train-00000-of-00040.parquet/17/n0144.JPEG`.
The loader's workers read the row groups a batch falls in (each process opening the files itself) and hand each
image's bytes to the decoder that reads files: a row whose bytes do not decode is a recorded skip, as a bad file is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

import numpy as np

from featdump.errors import NoImages, UsageProblem
from featdump.inputs.imagelist import (
    ROW_VERSION,
    Encoded,
    ImageList,
    Storage,
    changed_on_reading,
    content_digest,
    hash_lines,
)
from featdump.inputs.splits import of_split
from featdump.inputs.stores import filesystem, store_path
from featdump.inputs.table_names import TABLE_SUFFIX
from featdump.inputs.tar_names import expand_braces
from featdump.locations import Location


def _pyarrow():
    try:
        import pyarrow.parquet as parquet
    except ImportError as error:
        raise UsageProblem("Parquet tables need the package pyarrow, which is not installed: pip install "
                           "'featdump[parquet]'.") from error
    return parquet


def _fs_and_path(location: str):
    """The file system LOCATION lies on and its path there, made as every read makes it (`stores.filesystem`: a
    store's with the user's configuration and bounded requests, or the local one), its listings read afresh."""
    fs = filesystem(location)
    fs.invalidate_cache()
    return fs, store_path(location)


@dataclass(frozen=True)
class TableFile:
    """One Parquet file of a job: where it lies (relative to the list's root, or its URL), its size and its
    modification time (or ETag) as listed, and its row groups' lengths."""

    name: str
    size: int
    version: str
    groups: tuple[int, ...]


def read_tables(source: str, image_column: str | None = None, label_column: str | None = None,
                split: str | None = None, image_root: str | None = None) -> ImageList:
    """The rows of the Parquet files SOURCE names (of SPLIT, in Hugging Face's layout), a row an image (see the
    module's docstring)."""
    fs, root, paths = _files_of(str(source))
    if not paths:
        raise NoImages(f"IMAGES {source!r}: no Parquet file there.")
    paths = of_split(paths, split, source)
    parquet = _pyarrow()
    files, names, labels, own_paths, classes = [], [], [], [], None
    chosen = None
    for path in paths:
        with fs.open(path, "rb") as handle:
            table = parquet.ParquetFile(handle)
            schema = table.schema_arrow
            chosen = chosen or images_column(schema, image_column, path)
            label = label_column or ("label" if "label" in schema.names else None)
            if label_column is not None and label_column not in schema.names:
                raise UsageProblem(f"--label-column {label_column}: {path} has no such column; it has "
                                   f"{', '.join(schema.names)}.")
            classes = classes or _class_names(schema, label)
            columns = [column for column in (label, _path_field(schema, chosen)) if column]
            read = table.read(columns=columns) if columns else None  # the images' own paths, not their bytes
        info = fs.info(path)
        relative = _relative(root, path)
        files.append(TableFile(relative, int(info.get("size") or 0), str(_version(info)),
                               tuple(table.metadata.row_group(g).num_rows for g in range(table.num_row_groups))))
        count = table.metadata.num_rows
        labels += labels_of(read, label, count)
        own_paths += _own_paths(read, chosen, count)
        names += [f"{relative}/{row}" for row in range(count)]
    names = [f"{name}/{own.lstrip('/')}" if own else name for name, own in zip(names, own_paths)]  # no "//"
    if not names:
        raise NoImages(f"IMAGES {source!r}: its Parquet files hold no row.")
    storage = TableRows(tuple(files), chosen, *_row_places(files), image_root, os.getcwd())
    listing = {"tables": {table.name: [table.size, table.version] for table in files}, "row_version": ROW_VERSION}
    return ImageList(root, tuple(names), tuple(labels), tuple(classes or ()), storage, listing)


def _files_of(source: str):
    """(file system, the list's root, the Parquet files SOURCE names, sorted within each pattern)."""
    patterns = expand_braces(source)
    fs, _ = _fs_and_path(patterns[0])
    found: list[str] = []
    for pattern in patterns:
        _, path = _fs_and_path(pattern)
        if any(mark in path for mark in "*?["):
            found += sorted(fs.glob(path))
        elif fs.isdir(path):
            found += sorted(item for item in fs.find(path) if item.lower().endswith(TABLE_SUFFIX) and not any(
                part.startswith(".") for part in PurePosixPath(item[len(path):]).parts))  # .ipynb_checkpoints
        elif fs.exists(path):
            found.append(path)
        else:
            raise NoImages(f"IMAGES {pattern!r} does not exist.")
    root = os.path.commonpath([PurePosixPath(path).parent.as_posix() for path in found]) if found else ""
    return fs, Location.of(source).at(root).native, found


def _relative(root, path: str) -> str:
    base = Location.of(root).bare.rstrip("/")
    return path[len(base):].lstrip("/") if base and path.startswith(base) else PurePosixPath(path).name


def _version(info: dict) -> object:
    return info.get("mtime") or info.get("LastModified") or info.get("ETag") or info.get("etag") or ""


def images_column(schema, named: str | None, path: str) -> str:
    """The column holding the images' bytes: NAMED, else the one struct of bytes and path, else the one binary."""
    import pyarrow as pa

    def kind(field) -> str | None:
        if pa.types.is_struct(field.type) and "bytes" in [child.name for child in field.type]:
            return "struct"
        return "binary" if pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type) else None

    if named is not None:
        if named not in schema.names or kind(schema.field(named)) is None:
            raise UsageProblem(f"--image-column {named}: {path} has no column of encoded images by that name; its "
                               f"columns: {', '.join(f'{f.name} ({f.type})' for f in schema)}.")
        return named
    for wanted in ("struct", "binary"):
        found = [field.name for field in schema if kind(field) == wanted]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise UsageProblem(f"{path} has several columns of images ({', '.join(found)}): choose one with "
                               "--image-column NAME.")
    raise NoImages(f"{path} has no column of encoded images (a struct of bytes and path, as Hugging Face writes "
                   f"them, or a binary column); its columns: {', '.join(f'{f.name} ({f.type})' for f in schema)}.")


def _path_field(schema, column: str) -> str | None:
    field = schema.field(column)
    return f"{column}.path" if hasattr(field.type, "names") and "path" in [child.name for child in field.type] \
        else None


def _class_names(schema, label: str | None) -> list[str] | None:
    """The label column's ClassLabel names, from the Hugging Face metadata the file holds (None without)."""
    if not label or not schema.metadata or b"huggingface" not in schema.metadata:
        return None
    try:
        features = json.loads(schema.metadata[b"huggingface"])["info"]["features"]
        names = features[label].get("names")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return [str(name) for name in names] if names else None


def labels_of(read, label: str | None, count: int) -> list[int]:
    if read is None or label is None:
        return [-1] * count
    values = read.column(label).to_pylist()
    try:
        return [-1 if value is None else int(value) for value in values]
    except (TypeError, ValueError) as error:
        raise UsageProblem(f"The label column {label!r} holds {type(values[0]).__name__} values: labels are "
                           "integers (a ClassLabel); name another with --label-column.") from error


def _own_paths(read, column: str, count: int) -> list[str]:
    if read is None or column not in read.column_names:
        return [""] * count
    values = read.column(column).to_pylist()
    return [(value or {}).get("path") or "" if isinstance(value, dict) else "" for value in values]


def _row_places(files: list[TableFile]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: its file's index, its row group, its place in the group."""
    file_of, group_of, place = [], [], []
    for index, table in enumerate(files):
        for group, rows in enumerate(table.groups):
            file_of += [index] * rows
            group_of += [group] * rows
            place += range(rows)
    return (np.asarray(file_of, dtype=np.int32), np.asarray(group_of, dtype=np.int32),
            np.asarray(place, dtype=np.int64))


@dataclass(frozen=True)
class TableRows(Storage):
    """Where each row's image lies: its file, row group and place in it, and the image column."""

    files: tuple[TableFile, ...]
    column: str
    file_of: np.ndarray
    group_of: np.ndarray
    place: np.ndarray
    image_root: str | None = None  # --image-root: the folder a row's relative path (and no bytes) lies under
    working_folder: str = "."  # the command's, where it listed (a loader worker's may differ)

    def open(self, root, relative: str, position: int) -> Encoded:
        return next(self.open_as_ready(root, [relative], [position]))[1]

    def open_as_ready(self, root, relatives: Sequence[str],
                      positions: Sequence[int]) -> Iterator[tuple[int, Encoded | Exception]]:
        """The batch's images, read from each row group a slice at a time (never a whole group: pandas and
        img2dataset-style writers leave a whole file in one); a row that holds a path and no bytes (Hugging Face's
        Image not embedded) reads the file the path names."""
        groups: dict[tuple[int, int], list[int]] = {}
        for index, position in enumerate(positions):
            groups.setdefault((int(self.file_of[position]), int(self.group_of[position])), []).append(index)
        for (file, group), indices in groups.items():
            table = self.files[file]
            try:
                values = _read_rows(root, table, group, self.column,
                                    [int(self.place[positions[index]]) for index in indices])
            except (OSError, ValueError) as error:
                for index in indices:
                    yield index, error
                continue
            for index in indices:
                yield index, _encoded(root, table, relatives[index], values[int(self.place[positions[index]])],
                                      self.image_root or None, self.working_folder)

    def stat(self, root, relative: str, position: int) -> tuple[int, int] | None:
        """What the row records of its image now (`_encoded`: its bytes' length and digest), read again; None when
        it cannot be read."""
        found = self.open(root, relative, position)
        return None if isinstance(found, Exception) else found.file_stat

    def stale(self, root, paths: Sequence[str], positions: np.ndarray, recorded: np.ndarray, listed: dict,
              suspects: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows gone: no longer listed. Rows changed: their bytes differ from the digest they recorded, read again
        only from files whose size or version changed since the output LISTED them (a file rewritten with rows
        appended, as a dataset saved again is, keeps its old rows), and the SUSPECTS (rows recorded stale). Outputs
        made before rows recorded digests: a row changed when its file did (what they recorded)."""
        gone = positions < 0
        files = self.file_of[np.maximum(positions, 0)] if len(self.file_of) else np.zeros(len(positions), np.int32)
        if listed.get("row_version") != ROW_VERSION:  # rows recorded their file's (size, version), as listed then
            now = np.array([(table.size, _stamp(table.version)) for table in self.files] or [(0, 0)], dtype=np.int64)
            return gone, ~gone & (recorded[:, 0] >= 0) & (now[files] != recorded).any(axis=1)
        was = listed.get("tables", {})
        moved = np.array([was.get(table.name) != [table.size, table.version] for table in self.files] or [False])
        looked_at = np.flatnonzero(~gone & (recorded[:, 0] >= 0) & (moved[files] | suspects))
        return gone, changed_on_reading(self, root, paths, positions, recorded, looked_at)

    def select(self, positions: Sequence[int]) -> TableRows:
        chosen = np.asarray(positions, dtype=np.int64)
        return replace(self, file_of=self.file_of[chosen], group_of=self.group_of[chosen], place=self.place[chosen])

    def digest(self, root, paths: Sequence[str], labels: Sequence[int], sizes: bool) -> str:
        """A hash of the rows' names and labels (and each file's size and version)."""
        digest = hashlib.sha256(f"table\0{self.column}\n".encode())
        hash_lines(digest, (f"{relative}\0{label}\n" for relative, label in zip(paths, labels)))
        if sizes:
            for index in sorted(set(self.file_of.tolist())):
                table = self.files[index]
                digest.update(f"file\0{table.name}\0{table.size}\0{table.version}\n".encode())
        return digest.hexdigest()

    def groups(self) -> list[int] | None:
        """Where each file's rows start: shards split by files where there are as many files as shards."""
        if not len(self.file_of):
            return []
        return [0, *(np.flatnonzero(np.diff(self.file_of)) + 1).tolist()]


def _stamp(version: str) -> int:
    """A file's version as the integer a row's stat records (its mtime in ns, or a hash of its ETag)."""
    try:
        return int(float(version) * 1e9) if float(version) < 1e11 else int(float(version))
    except ValueError:
        return int(hashlib.sha256(version.encode()).hexdigest()[:15], 16)


ROWS_PER_READ = 32  # rows of a group decoded at once: memory bounded by these and the batch, not by the group


@dataclass
class _Cursor:
    """One process's place in one row group: the record batches still to come, and the one read last."""

    key: tuple
    batches: Iterator
    start: int = 0  # the group's row of `values[0]`
    values: list = dataclasses.field(default_factory=list)


_CURSORS: dict[int, _Cursor] = {}  # per process: its reads go forward through a group, batch after batch


def _read_rows(root, table: TableFile, group: int, column: str, places: Sequence[int]) -> dict[int, object]:
    """The image COLUMN's values at PLACES of row group GROUP of TABLE under ROOT, read ROWS_PER_READ rows at a
    time from where this process's last read of the group stopped (a loader worker's batches go forward). The
    cursor is the file's version's: a file saved again since (a later run in this process) is opened again."""
    key = (str(root), table.name, table.size, table.version, group, column)
    cursor = _CURSORS.get(os.getpid())
    if cursor is None or cursor.key != key or min(places) < cursor.start:
        cursor = _CURSORS[os.getpid()] = _Cursor(key, _record_batches(root, table.name, group, column))
    found = {}
    for place in sorted(set(places)):
        while place >= cursor.start + len(cursor.values):
            cursor.start += len(cursor.values)
            batch = next(cursor.batches, None)
            if batch is None:
                raise ValueError(f"row group {group} of {table.name} ends before its row {place}: was the file "
                                 "changed?")
            cursor.values = batch.column(0).to_pylist()
        found[place] = cursor.values[place - cursor.start]
    return found


def _record_batches(root, name: str, group: int, column: str) -> Iterator:
    """Row group GROUP's COLUMN of file NAME under ROOT, ROWS_PER_READ rows a record batch, its pages read as they
    are needed (a buffered stream: a group's column is not read whole)."""
    fs, path = _fs_and_path(str(Location.of(root).join(name)))
    with fs.open(path, "rb") as handle:
        table = _pyarrow().ParquetFile(handle, buffer_size=1 << 20, pre_buffer=False)
        yield from table.iter_batches(batch_size=ROWS_PER_READ, row_groups=[group], columns=[column],
                                      use_threads=False)


def _encoded(root, table: TableFile, relative: str, value, image_root: str | None = None,
             working_folder: str = ".") -> Encoded | Exception:
    """A row's image: its bytes, or the file its path names where the row holds a path and no bytes: absolute (or a
    URL) as it is; relative, under IMAGE_ROOT (--image-root), else the first of the table's folder and the
    command's WORKING_FOLDER (where Hugging Face's datasets resolves it) where it lies."""
    data = value.get("bytes") if isinstance(value, dict) else value
    if data:
        return Encoded(relative, (len(data), content_digest(bytes(data))), data=bytes(data))
    own = value.get("path") if isinstance(value, dict) else None
    if not own:
        return ValueError("its row holds no image bytes and no path")
    bases = [Location.of(image_root)] if image_root else \
        [Location.of(root).join(table.name).parent, Location.of(working_folder)]
    places = [base.join(own) for base in bases]  # an absolute path or a URL: itself
    where = next((place for place in places if place.file_here is not None), places[0])  # a URL: the first
    try:
        fs, path = _fs_and_path(str(where))
        with fs.open(path, "rb") as handle:
            data = handle.read()
        info = fs.info(path)
    except OSError as error:
        tried = " nor ".join(str(place) for place in places)
        return OSError(f"its row holds no image bytes, and the file its path names, {tried}, could not be read "
                       f"({error.strerror or error}); --image-root DIR names the folder its path is relative to")
    return Encoded(relative, (int(info.get("size") or len(data)), _stamp(str(_version(info)))), data=data)


def read_table_row(root, relative: str) -> bytes | None:
    """The image bytes of row path RELATIVE (FILE.parquet/ROW[/ITS OWN PATH]) from its file under ROOT, or None."""
    parts = relative.split("/")
    for place, part in enumerate(parts[:-1]):
        if part.lower().endswith(TABLE_SUFFIX) and parts[place + 1].isdigit():
            try:
                listed = read_tables(str(Location.of(root).join("/".join(parts[:place + 1]))))
            except (UsageProblem, NoImages, OSError):
                return None
            found = next(listed.storage.open_as_ready(listed.root, [relative], [int(parts[place + 1])]))[1]
            return found.data if isinstance(found, Encoded) else None
    return None
