"""Repair: cut a file that a kill left mid-batch back to its commit counters, so that it can be written on.

A kill can also leave chunks that HDF5 allocated past the end of the space the file's superblock records: the
chunk index was flushed, the superblock not. Cutting the rows back frees them ("addr overflow"), and new chunks
would be given the same addresses (rows written after the resume read back as another's). So first the recorded
end is moved past them and past the file's last byte (`cover_allocations`), through HDF5's H5Fget_eoa and
H5Fincrement_filesize (not in h5py's API: called in the libhdf5 h5py loaded).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import logging
import os

import h5py
import numpy as np

from featdump.output import netcdf
from featdump.output import skipped as skips
from featdump.output.layout import Committed

log = logging.getLogger("featdump")


def discard_uncommitted(h5file: h5py.File, limit: int) -> None:
    """Cut every row dataset back to its committed length (a kill may have left more); LIMIT bounds the rows
    any run of this file can have written."""
    committed = Committed.of(h5file)
    rows, skipped = committed.rows, committed.skipped
    layers = [h5file["features"][name] for name in netcdf.layer_names(h5file)]
    cover_allocations(h5file, [(dataset, rows) for dataset in (*layers, h5file["labels"], h5file["file_stats"])])
    for dataset in [*layers, h5file["labels"], h5file["file_stats"]]:
        dataset.resize(rows, axis=0)
    h5file["skipped/reasons"].resize(skipped, axis=0)
    skips.cut_to(h5file, skipped)
    _clear_strings_beyond(h5file["skipped/reasons"], skipped, limit)
    for group, kept in ((h5file, rows), (h5file["skipped"], skipped)):
        _clear_strings_beyond(group["paths"], kept, limit)
        raw_kept = int(np.count_nonzero(group["raw_paths/rows"][:] < kept))
        group["raw_paths/rows"].resize(raw_kept, axis=0)
        _clear_strings_beyond(group["raw_paths/bytes"], raw_kept, limit)
    h5file.flush()


def _clear_strings_beyond(dataset: h5py.Dataset, keep: int, limit: int) -> None:
    """Resize a variable-length dataset to KEEP rows after zeroing the raw heap references of later rows.

    HDF5 frees the heap object that an overwritten variable-length element points to. After a kill,
    uncommitted elements can point into heap blocks that never reached the disk, and overwriting them
    fails ("bad heap index") on every later run. Their chunks are rewritten raw, never converted.
    """
    chunk_rows = dataset.chunks[0]
    dataset.resize(max(limit, keep, dataset.shape[0]), axis=0)  # chunks a kill left past the extent too
    for start in range(keep - keep % chunk_rows, dataset.shape[0], chunk_rows):
        if dataset.id.get_chunk_info_by_coord((start,)).byte_offset is None:
            continue  # never written
        _, raw = dataset.id.read_direct_chunk((start,))
        kept_bytes = max(keep - start, 0) * (len(raw) // chunk_rows)
        dataset.id.write_direct_chunk((start,), raw[:kept_bytes] + bytes(len(raw) - kept_bytes))
    dataset.resize(keep, axis=0)


def cover_allocations(h5file: h5py.File, datasets: list[tuple[h5py.Dataset, int]]) -> None:
    """Move the end of space the file records past the file's last byte and past every chunk of DATASETS beyond
    their committed rows (dataset, rows), when a kill left it short of them."""
    hdf5 = _hdf5()
    if hdf5 is None:
        return
    recorded = ctypes.c_uint64()
    if hdf5.H5Fget_eoa(h5file.id.id, ctypes.byref(recorded)) < 0:
        return
    end = os.path.getsize(h5file.filename)
    for dataset, kept in datasets:
        end = max(end, _chunks_end(dataset, kept))
    if end > recorded.value:
        log.info("%s: a kill left %d bytes allocated past the end its superblock records; taken in before "
                 "resuming.", h5file.filename, end - recorded.value)
        if hdf5.H5Fincrement_filesize(h5file.id.id, ctypes.c_uint64(end - recorded.value)) < 0:
            raise OSError(f"{h5file.filename}: HDF5 could not take in the space a killed run allocated")


def _chunks_end(dataset: h5py.Dataset, kept: int) -> int:
    """The end (file offset) of DATASET's last chunk at rows KEPT and beyond, as its index holds them (0: none)."""
    if dataset.chunks is None:
        return 0
    chunk_rows, end = dataset.chunks[0], 0
    origin = (0,) * (len(dataset.shape) - 1)
    for start in range(kept - kept % chunk_rows, dataset.shape[0], chunk_rows):
        info = dataset.id.get_chunk_info_by_coord((start, *origin))
        if info.byte_offset is not None:
            end = max(end, info.byte_offset + info.size)
    return end


@functools.cache
def _hdf5():
    """The libhdf5 h5py uses (its wheel's copy, else the system's), with the two calls typed; None if not found."""
    found = glob.glob(os.path.join(os.path.dirname(h5py.__file__), os.pardir, "h5py.libs", "libhdf5-*.so*"))
    path = found[0] if found else ctypes.util.find_library("hdf5")
    try:
        hdf5 = ctypes.CDLL(path) if path else None
        hdf5.H5Fget_eoa.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_uint64)]
        hdf5.H5Fincrement_filesize.argtypes = [ctypes.c_int64, ctypes.c_uint64]
    except (OSError, AttributeError):
        log.debug("libhdf5's H5Fget_eoa not found: allocations a kill left past the recorded end are not checked")
        return None
    return hdf5
