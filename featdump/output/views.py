"""Reading a merged view (virtual datasets over N shard files) in spans that open at most MAX_SOURCES shard files at
once. HDF5 opens every source file a read touches, each with its own chunk cache, until the read ends: one read of
a view of 1,000 shards held 1,000 files open and 1.1 GB, and 10,000 would pass the default `ulimit -n` of 1024.
Every reader of rows (`featdump.load`, the Gram slabs of rdm/cka, the read-outs' row blocks) cuts its spans here."""

from __future__ import annotations

import os

import h5py
import numpy as np

MAX_SOURCES = 64  # shard files one read of a view may open
_edges: dict[tuple, np.ndarray] = {}


def source_starts(dataset: h5py.Dataset) -> np.ndarray | None:
    """The first row of each source file of a virtual DATASET, sorted; None for a dataset that holds its rows."""
    if not dataset.is_virtual:
        return None
    key = (dataset.file.filename, dataset.name, os.stat(dataset.file.filename).st_mtime_ns)
    if key not in _edges:
        _edges[key] = np.sort([mapping.vspace.get_select_bounds()[0][0] for mapping in dataset.virtual_sources()])
    return _edges[key]


def row_spans(dataset: h5py.Dataset, start: int, stop: int, step: int) -> list[tuple[int, int]]:
    """[start, stop) cut into spans of at most STEP rows, each touching at most MAX_SOURCES source files."""
    starts = source_starts(dataset)
    spans, low = [], start
    while low < stop:
        high = min(low + max(step, 1), stop)
        if starts is not None:
            following = int(np.searchsorted(starts, low, side="right"))  # sources that begin after LOW
            if following + MAX_SOURCES - 1 < len(starts):
                high = min(high, int(starts[following + MAX_SOURCES - 1]))
        spans.append((low, high))
        low = high
    return spans


def read_rows(dataset: h5py.Dataset, rows: int) -> np.ndarray:
    """DATASET's first ROWS rows in one array, read span by span."""
    values = np.empty((rows, *dataset.shape[1:]), dtype=dataset.dtype)
    for low, high in row_spans(dataset, 0, rows, rows):
        if high > low:
            dataset.read_direct(values, np.s_[low:high], np.s_[low:high])
    return values
