"""Reading a merged view (virtual datasets over N shard files) one shard file at a time. HDF5 keeps every source file
a virtual dataset has read open, each with its chunk cache, while the dataset stays open: a `featdump.load` of a
view of 1,000 shards held 1,007 files open and 1.1 GB, and 10,000 shards would pass the default `ulimit -n` of
1024. Every reader of rows (`featdump.load`, the Gram slabs of rdm/cka, the read-outs' row blocks) reads through
`read_span`, which opens the shard files a span covers one after another, straight, and closes each, and reads
whole rows directly from the file where its layout allows (`direct`)."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from featdump.output.direct import read_direct
from featdump.output.layout import open_to_read

_sources: dict[tuple, list[tuple[int, int, int, Path, str]]] = {}


def sources(dataset: h5py.Dataset) -> list[tuple[int, int, int, Path, str]]:
    """A virtual DATASET's sources in row order: (first row, end row, the first row in the source, the source
    file, the dataset in it); [] for a dataset that holds its rows."""
    if not dataset.is_virtual:
        return []
    key = (dataset.file.filename, dataset.name, os.stat(dataset.file.filename).st_mtime_ns)
    if key not in _sources:
        folder = Path(dataset.file.filename).parent
        found = []
        for mapping in dataset.virtual_sources():
            (low, *_), (high, *_) = mapping.vspace.get_select_bounds()
            whole = mapping.src_space.get_select_type() == h5py.h5s.SEL_ALL  # merge maps whole shards
            source_low = 0 if whole else mapping.src_space.get_select_bounds()[0][0]
            found.append((low, high + 1, source_low, folder / mapping.file_name, mapping.dset_name))
        _sources[key] = sorted(found)
    return _sources[key]


def read_span(dataset: h5py.Dataset, start: int, stop: int, part: tuple = (),
              out: np.ndarray | None = None) -> np.ndarray:
    """Rows [START, STOP) of DATASET (PART: slices of a row), from the shard files directly when it is a merged
    view (one open at a time), else from its file; into OUT where given (a C-ordered array of their shape: a buffer
    used again faults no fresh memory in, which costs a large read as much as the read)."""
    found = sources(dataset)
    if not found:
        return _held_rows(dataset, start, stop, part, out)
    if out is None:
        shape = tuple(len(range(*piece.indices(size))) for piece, size in zip(part, dataset.shape[1:]))
        out = np.empty((stop - start, *shape, *dataset.shape[1 + len(part):]), dtype=dataset.dtype)
    for low, high, source_low, path, name in found:
        first, last = max(low, start), min(high, stop)
        if first < last:
            with open_to_read(path) as shard:
                offset = source_low - low
                _held_rows(shard[name], first + offset, last + offset, part, out[first - start:last - start])
    return out


def _held_rows(dataset: h5py.Dataset, start: int, stop: int, part: tuple, out: np.ndarray | None) -> np.ndarray:
    """Rows [START, STOP) of a DATASET that holds its rows: read directly (`direct`: the GIL free while it reads)
    where its layout allows, else through h5py; into OUT where given."""
    whole_rows = read_direct(dataset, start, stop, out) if not part else None
    if whole_rows is not None:
        return whole_rows
    if out is None:
        return dataset[(slice(start, stop), *part)]
    dataset.read_direct(out, source_sel=(slice(start, stop), *part))
    return out


def read_rows(dataset: h5py.Dataset, rows: int) -> np.ndarray:
    """DATASET's first ROWS rows in one array."""
    return read_span(dataset, 0, rows)
