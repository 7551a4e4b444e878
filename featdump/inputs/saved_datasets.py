"""Saved datasets: the folders Hugging Face's `Dataset.save_to_disk` writes (`state.json`, `dataset_info.json` and
`data-00000-of-0000N.arrow`, Arrow IPC streams), and a `DatasetDict`'s (`dataset_dict.json` and a folder per split,
one chosen with --split). Rows are read where they lie: each Arrow file memory-mapped, a batch's rows sliced out of
its record batches, never the file loaded. The image column is the dataset's `Image` feature (or --image-column),
the labels its `label` column (or --label-column), its ClassLabel names the classes. A row is named by its dataset
folder and its index over the dataset's files (`train/17`), which a save with rows appended keeps; it records the
length and digest of its image's bytes, so that such a save marks none of the old rows stale. Registered through
the entry point group `featdump.readers` (`--reader saved`), as a plugin would be (extra `featdump[parquet]`:
pyarrow)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from featdump.errors import NoImages, UsageProblem
from featdump.inputs.asked import IMAGE_COLUMN, LABEL_COLUMN, SPLIT
from featdump.inputs.imagelist import (
    ROW_VERSION,
    Encoded,
    ImageList,
    Storage,
    changed_on_reading,
    content_digest,
    hash_lines,
)
from featdump.inputs.readers import Reader
from featdump.inputs.tables import images_column, labels_of

STATE, DICT = "state.json", "dataset_dict.json"


class SavedDatasets(Reader):
    """A folder `Dataset.save_to_disk` (or `DatasetDict.save_to_disk`) wrote."""

    priority = 12  # before Parquet tables and folders: such a folder holds Arrow files, not images
    kind = "a folder Hugging Face's Dataset.save_to_disk wrote (a DatasetDict's: --split)"
    example = "saved_dataset/"
    options = (IMAGE_COLUMN, LABEL_COLUMN, SPLIT)

    def claims(self, where, asked):
        here = where.folder_here
        return here is not None and ((here / STATE).is_file() or (here / DICT).is_file())

    def read(self, where, asked):
        return read_saved(where.folder_here, asked.split, asked.image_column, asked.label_column)

    def read_back(self, root, relative):
        return read_saved_row(root, relative)


@dataclass(frozen=True)
class ArrowFile:
    """One Arrow file of a saved dataset: its name in the dataset's folder, its size and time as listed, and the
    rows of each of its record batches."""

    name: str
    size: int
    mtime_ns: int
    batches: tuple[int, ...]


def read_saved(folder: Path, split: str | None = None, image_column: str | None = None,
               label_column: str | None = None) -> ImageList:
    """The rows of the dataset saved in FOLDER (a DatasetDict's SPLIT), a row an image."""
    dataset, root = _dataset_folder(folder, split), folder.parent
    if (folder / DICT).is_file():
        root = folder
    files = _arrow_files(dataset)
    schema = _schema(dataset / files[0].name)
    column = images_column(schema, image_column, str(dataset))
    label = label_column or ("label" if "label" in schema.names else None)
    if label_column is not None and label_column not in schema.names:
        raise UsageProblem(f"--label-column {label_column}: {dataset} has no such column; it has "
                           f"{', '.join(schema.names)}.")
    labels = [value for arrow in files for value in _labels(dataset / arrow.name, label, sum(arrow.batches))]
    prefix = dataset.relative_to(root).as_posix()
    names = tuple(f"{prefix}/{row}" for row in range(len(labels)))
    if not names:
        raise NoImages(f"IMAGES {str(folder)!r}: the saved dataset holds no row.")
    storage = SavedRows(prefix, tuple(files), column)
    listing = {"arrow_files": {arrow.name: [arrow.size, arrow.mtime_ns] for arrow in files},
               "row_version": ROW_VERSION}
    return ImageList(root, names, tuple(labels), tuple(_class_names(dataset, label)), storage, listing)


def _dataset_folder(folder: Path, split: str | None) -> Path:
    """The folder of the Dataset to read: FOLDER itself, or a DatasetDict's split (SPLIT, or its only one)."""
    if (folder / STATE).is_file():
        if split is not None:
            raise UsageProblem(f"--split {split}: {str(folder)!r} is one saved Dataset, not a DatasetDict of splits.")
        return folder
    splits = json.loads((folder / DICT).read_text()).get("splits") or []
    if split is None and len(splits) == 1:
        split = splits[0]
    if split is None or split not in splits:
        asked = f"--split {split}: not one of its splits" if split is not None else "choose one with --split"
        raise UsageProblem(f"{str(folder)!r} is a saved DatasetDict of the splits {', '.join(splits)}: {asked}.")
    if not (folder / split / STATE).is_file():
        raise NoImages(f"{str(folder / split)!r}: the split's folder holds no {STATE}.")
    return folder / split


def _arrow_files(dataset: Path) -> list[ArrowFile]:
    state = json.loads((dataset / STATE).read_text())
    files = []
    for entry in state.get("_data_files") or []:
        path = dataset / entry["filename"]
        found = os.stat(path)
        with _stream(path) as reader:
            batches = tuple(batch.num_rows for batch in reader)
        files.append(ArrowFile(entry["filename"], found.st_size, found.st_mtime_ns, batches))
    if not files:
        raise NoImages(f"{str(dataset)!r}: its {STATE} names no Arrow file.")
    return files


class _stream:
    """An Arrow IPC stream memory-mapped (its batches sliced, not copied), closed after the block."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        import pyarrow as pa

        self.mapped = pa.memory_map(str(self.path))
        try:
            return pa.ipc.open_stream(self.mapped)
        except pa.ArrowInvalid as error:
            self.mapped.close()
            raise NoImages(f"{str(self.path)!r} is no Arrow stream as Dataset.save_to_disk writes ({error}).") \
                from error

    def __exit__(self, *exc) -> None:
        self.mapped.close()


def _schema(path: Path):
    with _stream(path) as reader:
        return reader.schema


def _labels(path: Path, label: str | None, count: int) -> list[int]:
    """The labels of the Arrow file PATH's COUNT rows (its LABEL column's; -1 without one)."""
    if label is None or not count:
        return [-1] * count
    import pyarrow as pa

    with _stream(path) as reader:
        values = pa.chunked_array([batch.column(label) for batch in reader])
    return labels_of(pa.table({label: values}), label, count)


def _class_names(dataset: Path, label: str | None) -> list[str]:
    """The label column's ClassLabel names, from the dataset's dataset_info.json (none without)."""
    try:
        features = json.loads((dataset / "dataset_info.json").read_text())["features"]
        return [str(name) for name in features[label]["names"]] if label else []
    except (OSError, ValueError, KeyError, TypeError):
        return []


@dataclass(frozen=True)
class SavedRows(Storage):
    """Where each row of a saved dataset lies: its folder (under the list's root), its Arrow files and the image
    column; a row's position is its index over the files."""

    dataset: str
    files: tuple[ArrowFile, ...]
    column: str
    indices: np.ndarray | None = None  # each row's index over the files (None: the rows in order)

    def _index(self, position: int) -> int:
        return position if self.indices is None else int(self.indices[position])

    def open(self, root, relative: str, position: int) -> Encoded:
        found = next(iter(self.open_as_ready(root, [relative], [position])))[1]
        if isinstance(found, Exception):
            raise found
        return found

    def open_as_ready(self, root, relatives: Sequence[str],
                      positions: Sequence[int]) -> Iterator[tuple[int, Encoded | Exception]]:
        """The rows at POSITIONS, file by file, each file's record batches walked once (memory-mapped)."""
        starts = np.cumsum([0, *(sum(arrow.batches) for arrow in self.files)])
        wanted: dict[int, list[tuple[int, int]]] = {}  # file -> (index into positions, row in the file)
        for index, position in enumerate(positions):
            row = self._index(position)
            file = int(np.searchsorted(starts, row, side="right")) - 1
            wanted.setdefault(file, []).append((index, row - int(starts[file])))
        for file, rows in wanted.items():
            path = Path(root) / self.dataset / self.files[file].name
            for index, value in _values(path, self.column, rows):
                yield index, _encoded(relatives[index], value)

    def stat(self, root, relative: str, position: int) -> tuple[int, int] | None:
        found = next(iter(self.open_as_ready(root, [relative], [position])))[1]
        return None if isinstance(found, Exception) else found.file_stat

    def stale(self, root, paths: Sequence[str], positions: np.ndarray, recorded: np.ndarray, listed: dict,
              suspects: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows gone: no longer listed. Rows changed: their bytes differ from the digest they recorded, read again
        only where an Arrow file's size or time changed since the output LISTED it (a save with rows appended
        rewrites the files: their old rows are read and found the same), and the SUSPECTS."""
        gone = positions < 0
        was = listed.get("arrow_files", {})
        moved = any(was.get(arrow.name) != [arrow.size, arrow.mtime_ns] for arrow in self.files) or \
            set(was) != {arrow.name for arrow in self.files}
        looked_at = np.flatnonzero(~gone & (recorded[:, 0] >= 0) & (True if moved else suspects))
        return gone, changed_on_reading(self, root, paths, positions, recorded, looked_at)

    def select(self, positions: Sequence[int]) -> SavedRows:
        chosen = np.asarray([self._index(position) for position in positions], dtype=np.int64)
        return replace(self, indices=chosen)

    def digest(self, root, paths: Sequence[str], labels: Sequence[int], sizes: bool) -> str:
        """A hash of the rows' names and labels (and each Arrow file's name, size and time)."""
        import hashlib

        digest = hashlib.sha256(f"saved\0{self.dataset}\0{self.column}\n".encode())
        hash_lines(digest, (f"{relative}\0{label}\n" for relative, label in zip(paths, labels)))
        if sizes:
            for arrow in self.files:
                digest.update(f"file\0{arrow.name}\0{arrow.size}\0{arrow.mtime_ns}\n".encode())
        return digest.hexdigest()


def _values(path: Path, column: str, rows: list[tuple[int, int]]) -> Iterator[tuple[int, object]]:
    """(index, the image column's value) of each of ROWS ((index, row in the file)) of the Arrow file PATH."""
    by_row = sorted(rows, key=lambda item: item[1])
    at, start = 0, 0
    with _stream(path) as reader:
        for batch in reader:
            end = start + batch.num_rows
            values = None
            while at < len(by_row) and by_row[at][1] < end:
                values = values if values is not None else batch.column(column)
                index, row = by_row[at]
                yield index, values[row - start].as_py()
                at += 1
            if at == len(by_row):
                return
            start = end
    for index, row in by_row[at:]:
        yield index, IndexError(f"{path.name} holds {start} rows, not row {row} (changed since it was listed?)")


def _encoded(relative: str, value) -> Encoded | Exception:
    if isinstance(value, Exception):
        return value
    data = value.get("bytes") if isinstance(value, dict) else value
    if not data and isinstance(value, dict) and value.get("path"):
        try:
            data = Path(value["path"]).read_bytes()  # an image saved by its path (absolute, as datasets keeps it)
        except OSError as error:
            return error
    if not data:
        return ValueError("its row holds no image bytes and no path")
    return Encoded(relative, (len(data), content_digest(bytes(data))), data=bytes(data))


def read_saved_row(root: str, relative: str) -> bytes | None:
    """The image bytes of row path RELATIVE (DATASET/INDEX) of a saved dataset under ROOT, or None."""
    folder, _, index = relative.rpartition("/")
    dataset = Path(root) / folder
    if not index.isdigit() or not (dataset / STATE).is_file():
        return None
    try:
        files = _arrow_files(dataset)
        column = images_column(_schema(dataset / files[0].name), None, str(dataset))
        found = next(iter(SavedRows(folder, tuple(files), column).open_as_ready(root, [relative], [int(index)])))[1]
    except (UsageProblem, NoImages, OSError):
        return None
    return found.data if isinstance(found, Encoded) else None
