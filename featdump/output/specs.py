"""A layer's dataset as it is made: what it holds per row (`DatasetSpec`), its chunks (aligned with batches, 64 KiB
to 4 MiB) and its compression filters (zstd and blosc through hdf5plugin, which readers then import too)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from featdump.errors import UsageProblem

MIN_CHUNK_BYTES = 64 * 1024
MAX_CHUNK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class DatasetSpec:
    """One feature dataset: per-row shape and storage dtype."""

    shape: tuple[int, ...]
    dtype: str
    layout: str | None = None  # "(197, N, 768) -> (N, 197, 768)" when the model's output is not batch-first
    part: str | None = None  # the part of a tuple/dict output stored ("0", "last_hidden_state")
    tokens: tuple[int, int, int] | None = None  # a ViT-like (L, D) output: (prefix tokens, grid rows, grid columns)
    reduction: str = "none"  # what is kept of the layer's output (featdump.reductions.methods)
    reduction_attributes: dict = field(default_factory=dict)  # what the reduction records on the dataset
    fit: object = None  # a PCA fit (featdump.reductions.pca.PcaFit), stored in /pca/<layer>
    axes: str | None = None  # a 3-d map's axes as the model has them ("channel,y,x" or "y,x,channel"), when known

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def chunk_shape(spec: DatasetSpec, batch_size: int, expected_rows: int | None = None) -> tuple[int, ...]:
    """Chunks of 64 KiB to 4 MiB aligned with batches: whole batches, or an equal part of one, so that no
    chunk is written twice; a row over 4 MiB is split along its first dimensions. A file expecting fewer
    rows than that (a small shard) gets chunks of its size, not a mostly empty chunk."""
    chunks = _batch_aligned_chunks(spec, batch_size)
    if expected_rows and chunks[0] > expected_rows:
        return (expected_rows, *chunks[1:])
    return chunks


def _batch_aligned_chunks(spec: DatasetSpec, batch_size: int) -> tuple[int, ...]:
    row_bytes = max(spec.row_bytes, 1)
    batch_bytes = batch_size * row_bytes
    if batch_bytes < MIN_CHUNK_BYTES:
        batches = min(-(-MIN_CHUNK_BYTES // batch_bytes), max(1, MAX_CHUNK_BYTES // batch_bytes))
        return (batches * batch_size, *spec.shape)
    if batch_bytes <= MAX_CHUNK_BYTES:
        return (batch_size, *spec.shape)
    if row_bytes <= MAX_CHUNK_BYTES:
        fitting = MAX_CHUNK_BYTES // row_bytes
        return (max(rows for rows in range(1, fitting + 1) if batch_size % rows == 0), *spec.shape)
    dims = list(spec.shape)
    itemsize = np.dtype(spec.dtype).itemsize
    for axis in range(len(dims)):
        while dims[axis] > 1 and math.prod(dims) * itemsize > MAX_CHUNK_BYTES:
            dims[axis] = -(-dims[axis] // 2)
    return (1, *dims)


def compression_filters(compression: str) -> dict:
    """h5py create_dataset keywords for COMPRESSION; zstd and blosc (lz4, byte shuffle) come from hdf5plugin,
    which readers then import too."""
    if compression == "none":
        return {}
    if compression in ("lzf", "gzip"):
        return {"compression": compression}
    try:
        import hdf5plugin
    except ImportError as error:
        raise UsageProblem(f"--compression {compression} needs hdf5plugin: pip install 'featdump[compression]'.") \
            from error
    if compression == "zstd":
        return dict(hdf5plugin.Zstd(clevel=3))
    return dict(hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE))


def register_filters() -> None:
    """Make the zstd and blosc filters readable in this process: hdf5plugin registers them with HDF5 when imported
    (a reader that never imported it gets HDF5's "can't open directory" on such a layer); nothing without it."""
    try:
        import hdf5plugin  # noqa: F401
    except ImportError:
        pass
