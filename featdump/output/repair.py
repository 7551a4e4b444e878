"""Repair: cut a file that a kill left mid-batch back to its commit counters, so that it can be written on."""

from __future__ import annotations

import h5py
import numpy as np

from featdump.output import netcdf
from featdump.output.layout import Committed


def discard_uncommitted(h5file: h5py.File, limit: int) -> None:
    """Cut every row dataset back to its committed length (a kill may have left more); LIMIT bounds the rows
    any run of this file can have written."""
    committed = Committed.of(h5file)
    rows, skipped = committed.rows, committed.skipped
    layers = [h5file["features"][name] for name in netcdf.layer_names(h5file)]
    for dataset in [*layers, h5file["labels"], h5file["file_stats"]]:
        dataset.resize(rows, axis=0)
    h5file["skipped/reasons"].resize(skipped, axis=0)
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
