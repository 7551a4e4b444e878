"""Direct reads: a span of a stored layer's rows read with the operating system's positioned reads straight into the
array that holds them, not through h5py. h5py holds the GIL for the whole of a read, so a reader thread that
reads through it stops the thread that computes; a direct read leaves the GIL free while the disk or the page cache
serves it, and many direct reads (a sample spread over a layer) run at once.

The reads go through the descriptor HDF5 already holds (no second open file: a view of 1,000 shards stays one
shard file at a time). Only where the bytes on disk are the rows themselves: a local file opened read-only (no
handle of this process holds unwritten rows), without a user block, a contiguous dataset or one whose chunks are
unfiltered, hold whole rows and are all written, in this machine's byte order. Anything else answers None, and
the caller reads through h5py: compressed or shuffled chunks, chunks that split a row, a virtual view, a driver
other than the plain one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import h5py
import numpy as np


@dataclass(frozen=True)
class _Layout:
    """Where DATASET's rows lie in its file (open as DESCRIPTOR): from OFFSET on (contiguous), or in chunks of
    CHUNK_ROWS whole rows."""

    descriptor: int
    path: str
    row_bytes: int
    offset: int | None = None
    chunk_rows: int | None = None


def read_direct(dataset: h5py.Dataset, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray | None:
    """Rows [START, STOP) of DATASET read from its file with the GIL released (into OUT, a C-ordered array of their
    shape, where given), or None where its layout does not allow it (the caller reads through h5py)."""
    rows = DirectRows.of(dataset)
    return None if rows is None else rows.read(start, stop, out)


class DirectRows:
    """A dataset's rows read directly, where its rows lie and its chunks' places in the file looked up once: for
    many small reads (a sample spread over a layer), where each read's own look-ups through h5py, which holds its
    lock for each, cost more than the read. Made by `of`; its reads may run on many threads at once."""

    def __init__(self, dataset: h5py.Dataset, layout: _Layout):
        self.dataset, self.layout = dataset, layout
        self.chunks: dict[int, tuple[int | None, int]] = {}  # a chunk's first row: (its byte offset, its size)

    @classmethod
    def of(cls, dataset: h5py.Dataset) -> DirectRows | None:
        """DATASET's DirectRows, or None where its layout does not allow direct reads."""
        layout = _layout(dataset)
        return None if layout is None else cls(dataset, layout)

    def read(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray | None:
        """Rows [START, STOP) (into OUT where given), or None where a chunk of them is not written."""
        pieces = _pieces(self.dataset, self.layout, start, stop, self.chunks)
        if pieces is None:
            return None
        values = np.empty((stop - start, *self.dataset.shape[1:]), dtype=self.dataset.dtype) if out is None else out
        rows = values.reshape(stop - start, -1).view(np.uint8)
        for first, count, offset in pieces:
            _read_fully(self.layout, memoryview(rows[first - start:first - start + count]).cast("B"), offset)
        return values


def _layout(dataset: h5py.Dataset) -> _Layout | None:
    file = dataset.file
    if (not hasattr(os, "preadv") or dataset.is_virtual or file.mode != "r" or file.driver != "sec2"
            or file.userblock_size or not dataset.dtype.isnative or dataset.dtype.hasobject or not dataset.shape):
        return None
    descriptor = file.id.get_vfd_handle()
    row_bytes = int(np.prod(dataset.shape[1:], dtype=np.int64)) * dataset.dtype.itemsize
    plist = dataset.id.get_create_plist()
    if plist.get_layout() == h5py.h5d.CONTIGUOUS:
        offset = dataset.id.get_offset()
        return None if offset is None else _Layout(descriptor, file.filename, row_bytes, offset=offset)
    if plist.get_layout() != h5py.h5d.CHUNKED or plist.get_nfilters() or dataset.chunks[1:] != dataset.shape[1:]:
        return None
    return _Layout(descriptor, file.filename, row_bytes, chunk_rows=dataset.chunks[0])


def _pieces(dataset: h5py.Dataset, layout: _Layout, start: int, stop: int,
            chunks: dict[int, tuple[int | None, int]]) -> list[tuple[int, int, int]] | None:
    """(first row, rows, byte offset in the file) of each run of rows of [START, STOP) that lies together on disk;
    None where a chunk of them is not written. CHUNKS: the chunks looked up before, by first row (added to)."""
    if layout.chunk_rows is None:
        return [(start, stop - start, layout.offset + start * layout.row_bytes)]
    pieces = []
    size = layout.chunk_rows
    for chunk_start in range(start - start % size, stop, size):
        if chunk_start not in chunks:
            info = dataset.id.get_chunk_info_by_coord((chunk_start,) + (0,) * (len(dataset.shape) - 1))
            chunks[chunk_start] = (info.byte_offset, info.size)
        byte_offset, stored = chunks[chunk_start]
        if byte_offset is None or stored != size * layout.row_bytes:
            return None
        first, last = max(start, chunk_start), min(stop, chunk_start + size)
        pieces.append((first, last - first, byte_offset + (first - chunk_start) * layout.row_bytes))
    return pieces


def _read_fully(layout: _Layout, target: memoryview, offset: int) -> None:
    """TARGET filled from LAYOUT's file's bytes at OFFSET (a read may return fewer bytes than asked)."""
    done = 0
    while done < len(target):
        got = os.preadv(layout.descriptor, [target[done:]], offset + done)  # the GIL released while it reads
        if not got:
            raise OSError(f"{layout.path}: {len(target) - done} bytes missing at offset {offset + done}")
        done += got
