"""Gram: one layer's N x N Gram matrix over the rows of an output, accumulated out of core, whatever its width.

The layer is read in slabs of its features (whole rows' slices): every slab holds all N rows, and two slabs (one
used while the next is read, on a thread) fit the memory budget. Each row's slab is read straight from the file
where rows lie raw in chunks (what featdump writes uncompressed), so each byte is read once; compressed or
virtual datasets go through h5py, which reads a row's whole chunk for every slab. A slab's mean over the rows
is removed before its products, so the float32 products (of at most PRODUCT_WIDTH features each) see centred
values (no large common part to cancel later), and the products are summed in float64, giving the row sums and
the means' cross terms too that give back the uncentred Gram:

    C = Y Y^T,  Y = X - 1 mu^T (mu: each feature's mean over the rows)      `centred`
    X X^T = C + s 1^T + 1 s^T + q,  s = Y mu,  q = mu . mu                    `uncentred()`
    row sums of X = r + sum(mu),  r = Y 1

C is the doubly centred Gram (H X X^T H) that CKA takes; the RDMs are functions of C, r, s and q (`rdm.py`).

Correlation and cosine are the same for rows shifted and scaled each by its own constants, so for them X is
taken as each row less its mean and over its spread (ROW_FORMS), both estimated from the first slab (exact when
the layer is one slab): rows that differ mostly in their level or their size (a brightness, a gain) then lose no
digits to the products. A row holding NaN or inf takes no part in the products (its values replaced), and is
named in `nonfinite`; `constant` and `zero` name rows on which correlation or cosine is undefined.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import h5py
import numpy as np
import torch

from featdump.errors import UsageProblem
from featdump.forward.device import exact_float32, free_memory
from featdump.output.space import human_bytes
from featdump.output.views import read_span, sources

log = logging.getLogger("featdump")
_READ_BYTES = 16 * 1024**2  # a read call's size (rows x slab) when the chunks allow
# Features per float32 product: its rounding grows with the length of the sums (here about 1e-7 relative at
# 8192 features, 7e-6 at 200,704 of resnet18's layer1), and the products are summed in float64.
PRODUCT_WIDTH = 8192
# A slab's bytes at most, whatever the budget: the first slab's read and the last one's products are the parts
# that the reading thread cannot overlap, so they are kept short.
SLAB_BYTES = 512 * 1024**2
ROW_BLOCK = 512  # rows per block of the products: of 2,048 rows, 4 blocks compute 10 of 16 (the result is symmetric)


@dataclass
class Gram:
    """A layer's Gram statistics over N rows of D features (float64, on the device they were computed on)."""

    centred: torch.Tensor  # (N, N): Y Y^T
    row_sums: torch.Tensor  # (N,): r = Y 1
    shifts: torch.Tensor  # (N,): s = Y mu
    mean_square: float  # q = mu . mu
    mean_sum: float  # sum(mu)
    features: int  # D
    nonfinite: torch.Tensor  # (N,) bool: rows holding NaN or inf (their statistics mean nothing)
    constant: torch.Tensor  # (N,) bool: rows whose features are all equal (no correlation)
    zero: torch.Tensor  # (N,) bool: rows of zeros (no cosine)

    @property
    def rows(self) -> int:
        return self.centred.shape[0]

    def uncentred(self) -> torch.Tensor:
        """X X^T, made in place of `centred` (no second N x N matrix: the statistics are spent)."""
        gram = self.centred
        gram += self.shifts[:, None]
        gram += self.shifts[None, :]
        gram += self.mean_square
        return gram

    def row_centred(self) -> torch.Tensor:
        """(X - m 1^T)(X - m 1^T)^T, m each row's mean over its features: the covariances correlation takes; made
        in place of `centred` (no second N x N matrix: the statistics are spent)."""
        features = self.features
        adjusted = self.shifts - self.mean_sum * self.row_sums / features  # sum_k (mu_k - mean(mu)) y_ik
        spread = self.mean_square - self.mean_sum ** 2 / features  # sum_k (mu_k - mean(mu))^2
        gram = self.centred.addr_(self.row_sums, self.row_sums, alpha=-1.0 / features)
        gram += adjusted[:, None]
        gram += adjusted[None, :]
        gram += spread
        return gram


CKA_MATRICES = 3  # N x N float64 matrices CKA holds at once: two layers' centred Grams and a product of them


def check_room(rows: int, memory: int, device: torch.device, what: str, matrices: int) -> None:
    """Say before any work what WHAT over ROWS rows needs (MATRICES N x N float64 matrices, and slabs of at most
    MEMORY bytes) and how many rows DEVICE's free memory allows; UsageProblem, with the numbers and the ways out,
    when they do not fit: said before any work, not as an allocator's error."""
    slabs = min(memory, 2 * SLAB_BYTES)
    need, available = matrices * 8 * rows * rows + slabs, free_memory(device)
    most = math.isqrt(max(0, available - slabs) // (8 * matrices))
    held = f"{matrices} {rows} x {rows} matri{'x' if matrices == 1 else 'ces'} in float64 and its slabs"
    if need > available:
        raise UsageProblem(
            f"{what} over {rows} images needs {human_bytes(need)} for its {held}, and {device} has "
            f"{human_bytes(available)} free (room for {most} images): use fewer images (a shorter output, or a "
            f"merged view of part of it){' or the machine memory (--device cpu)' if device.type == 'cuda' else ''}"
            ", or a smaller --memory.")
    log.info("%s over %d images: %s for its %s; %s free on %s: room for up to %d images.", what, rows,
             human_bytes(need), held, human_bytes(available), device, most)


def piece_width(rows: int, memory: int) -> int:
    """Features per piece widened to float64 for exact products of ROWS rows: PRODUCT_WIDTH, fewer where that
    buffer would take more than an eighth of MEMORY (256 at the least)."""
    return max(256, min(PRODUCT_WIDTH, memory // 8 // max(rows * 8, 1)))


def slabs(shape: tuple[int, ...], budget: int) -> list[tuple[slice, ...]]:
    """Slices of a row's SHAPE covering it in C order, each of at most BUDGET values (one value at the least),
    cut along the first axes: a slab is then contiguous within each row."""
    if math.prod(shape) <= budget or not shape:
        return [tuple(slice(None) for _ in shape)]
    inner = math.prod(shape[1:])
    if inner <= budget:
        step = max(1, budget // inner)
        return [(slice(start, min(start + step, shape[0])), *(slice(None) for _ in shape[1:]))
                for start in range(0, shape[0], step)]
    return [(slice(index, index + 1), *rest) for index in range(shape[0]) for rest in slabs(shape[1:], budget)]


def slab_width(shape: tuple[int, ...], slab: tuple[slice, ...]) -> int:
    return math.prod(len(range(*part.indices(size))) for part, size in zip(slab, shape))


ROW_FORMS = ("raw", "scaled", "standardised")  # rows as stored; over their spread (cosine); less their mean too


def gram(dataset: h5py.Dataset, rows: int | np.ndarray, memory: int, device: torch.device,
         advance: Callable[[int], None] = lambda _: None, form: str = "raw", exact: bool = False) -> Gram:
    """The Gram statistics of the first ROWS rows of DATASET, or of the rows ROWS names (sorted file rows: a
    read-out's rows used), in FORM (one of ROW_FORMS), reading slabs (two at a time: the next is read while one is
    used) of at most MEMORY bytes in all; ADVANCE(bytes) after each read. EXACT: the centring and the products in
    float64, a piece of PRODUCT_WIDTH features at a time (a ridge fit's condition grows as its alpha shrinks: it
    needs every digit)."""
    picked = np.arange(rows) if isinstance(rows, int) else np.asarray(rows, dtype=np.int64)
    rows = len(picked)
    shape = dataset.shape[1:]
    piece = piece_width(rows, memory) if exact else PRODUCT_WIDTH
    widening = rows * piece * 8 if exact else 0  # the float64 buffer each piece is widened into
    budget = max(1, min(max(memory - widening, 0) // 2, SLAB_BYTES) // (max(rows, 1) * 4))
    zeros = dict(dtype=torch.float64, device=device)
    centred, row_sums, shifts = torch.zeros(rows, rows, **zeros), torch.zeros(rows, **zeros), torch.zeros(rows, **zeros)
    mean_square = mean_sum = 0.0
    nonfinite = torch.zeros(rows, dtype=torch.bool, device=device)
    low = torch.full((rows,), math.inf, device=device)
    high = torch.full((rows,), -math.inf, device=device)
    row_form = widened = None
    for block in _prefetched(dataset, picked, slabs(shape, budget), advance):
        values = torch.from_numpy(block).to(device)
        lowest, highest = values.amin(1), values.amax(1)  # NaN in a row makes both NaN, inf one of them
        finite = torch.isfinite(lowest) & torch.isfinite(highest)
        if not bool(finite.all()):
            nonfinite |= ~finite
            values[~finite] = 0.0  # out of the products; the row's entries are undefined anyway
        torch.minimum(low, torch.where(finite, lowest, low), out=low)
        torch.maximum(high, torch.where(finite, highest, high), out=high)
        if form != "raw":
            row_form = _row_form(values, form) if row_form is None else row_form
            values -= row_form[0][:, None]
            values *= row_form[1][:, None]
        # any centre keeps the algebra exact; the mean makes the products' values small
        centre = values.mean(0)
        if exact:
            centre = centre.to(torch.float64)  # subtracted from each piece as it is widened
        else:
            values -= centre
        level = centre.mean()  # r = Y 1 and s = Y c as r and Y (c - level) + level r: the centre's common part
        weights = torch.stack([torch.ones_like(centre), centre - level])  # (large where all features share an
        sums = torch.zeros(rows, 2, **zeros)  # offset) stays out of the float32 products
        with exact_float32():
            for start in range(0, values.shape[1], piece):
                part = values[:, start:start + piece]
                if exact:  # widened into one reused buffer (no new pages for every piece)
                    widened = widened if widened is not None else torch.empty(rows, piece, **zeros)
                    part = widened[:, :part.shape[1]].copy_(part).sub_(centre[start:start + piece])
                _add_upper_products(centred, part)
                sums += part @ weights[:, start:start + piece].T
        row_sums += sums[:, 0]
        shifts += sums[:, 1] + float(level) * sums[:, 0]
        centre = centre.to(torch.float64)
        mean_square += float(centre @ centre)
        mean_sum += float(centre.sum())
        del values, block
    _mirror_upper(centred)
    return Gram(centred, row_sums, shifts, mean_square, mean_sum, math.prod(shape), nonfinite,
                (low == high) & ~nonfinite, (low == 0) & (high == 0) & ~nonfinite)


def _row_form(values: torch.Tensor, form: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(shift, scale) per row for FORM, from a slab's VALUES: its mean (standardised; else 0) and the inverse of
    its root mean square about it (1 where that is 0). Any positive scale and any shift keep correlation (and
    any positive scale cosine) as they are; these make the rows alike in level and size."""
    variance, mean = torch.var_mean(values, dim=1, correction=0)  # no copy of the slab
    shift = mean if form == "standardised" else torch.zeros_like(mean)
    spread = (variance if form == "standardised" else variance + mean.square()).sqrt()
    scale = torch.where(spread > 1e-30, 1.0 / spread.clamp(min=1e-30), torch.ones_like(spread))
    return shift, scale


def _row_blocks(rows: int) -> list[slice]:
    return [slice(start, min(start + ROW_BLOCK, rows)) for start in range(0, rows, ROW_BLOCK)]


def _add_upper_products(centred: torch.Tensor, part: torch.Tensor) -> None:
    """CENTRED's blocks on and above the diagonal += PART's products (the matrix is symmetric: the blocks below
    are mirrored once at the end, `_mirror_upper`), about half the multiplications of PART @ PART.T."""
    blocks = _row_blocks(part.shape[0])
    for index, rows in enumerate(blocks):
        for columns in blocks[index:]:
            centred[rows, columns] += part[rows] @ part[columns].T


def _mirror_upper(centred: torch.Tensor) -> None:
    """The blocks below the diagonal from those above it, and each diagonal block's lower triangle from its upper
    one (a product's two triangles differ in their last bits): the matrix exactly symmetric."""
    blocks = _row_blocks(centred.shape[0])
    for index, rows in enumerate(blocks):
        for columns in blocks[:index]:
            centred[rows, columns] = centred[columns, rows].T
        diagonal = centred[rows, rows]
        diagonal.copy_(torch.triu(diagonal) + torch.triu(diagonal, 1).T)


def _prefetched(dataset: h5py.Dataset, picked: np.ndarray, parts: list[tuple[slice, ...]],
                advance) -> Iterator[np.ndarray]:
    """Each slab of PARTS (of the rows PICKED), read on a thread while the one before is used: at most two slabs
    exist at once."""
    tokens, ready = threading.Semaphore(2), queue.Queue()
    stop = threading.Event()
    offsets = raw_row_offsets(dataset, int(picked[-1]) + 1) if len(parts) > 1 and len(picked) else None
    offsets = offsets[picked] if offsets is not None else None

    def read() -> None:
        descriptor = os.open(dataset.file.filename, os.O_RDONLY) if offsets is not None else None
        try:
            for slab in parts:
                tokens.acquire()
                if stop.is_set():
                    return
                ready.put(_read_slab(dataset, picked, slab, advance, offsets, descriptor))
            ready.put(None)
        except BaseException as error:  # given to the caller, raised there
            ready.put(error)
        finally:
            if descriptor is not None:
                os.close(descriptor)

    reader = threading.Thread(target=read, name="featdump-slabs", daemon=True)
    reader.start()
    try:
        while True:
            block = ready.get()
            if block is None:
                return
            if isinstance(block, BaseException):
                raise block
            yield block
            del block
            tokens.release()
    finally:
        stop.set()
        tokens.release()
        reader.join()


def _read_slab(dataset: h5py.Dataset, picked: np.ndarray, slab: tuple[slice, ...], advance,
               offsets: np.ndarray | None = None, descriptor: int | None = None) -> np.ndarray:
    """The rows PICKED (sorted) of DATASET's SLAB as one (rows, width) float32 array. With OFFSETS (each picked
    row's place in the file, `raw_row_offsets`), each row's slab is read straight from DESCRIPTOR (a slab is
    contiguous within a row): only its bytes; HDF5 would read each row's whole chunk for every slab. Else through
    h5py, in groups."""
    rows = len(picked)
    shape = dataset.shape[1:]
    width = slab_width(shape, slab)
    block = np.empty((rows, width), dtype=np.float32)
    if offsets is not None:
        itemsize = dataset.dtype.itemsize
        start = _flat_start(shape, slab) * itemsize
        raw = block if dataset.dtype == np.float32 else np.empty((rows, width), dtype=dataset.dtype)
        for row in range(rows):
            target = memoryview(raw[row]).cast("B")
            if os.preadv(descriptor, [target], int(offsets[row]) + start) != len(target):
                raise OSError(f"{dataset.file.filename}: a row ended early (the file is shorter than its index says)")
            if (row + 1) % 256 == 0 or row + 1 == rows:
                advance(min(256, (row % 256) + 1) * width * itemsize)
        if raw is not block:
            block[:] = raw
        return block
    view = block.reshape(rows, *(len(range(*part.indices(size))) for part, size in zip(slab, shape)))
    chunk_rows = dataset.chunks[0] if dataset.chunks else 1
    step = max(chunk_rows, (_READ_BYTES // max(width * dataset.dtype.itemsize, 1)) // chunk_rows * chunk_rows)
    every = rows == 0 or int(picked[-1]) == rows - 1  # rows 0..ROWS-1: read straight into place
    merged = bool(sources(dataset))  # a merged view: read from its shard files, one at a time
    for start in range(0, int(picked[-1]) + 1 if rows else 0, step):
        stop = min(start + step, int(picked[-1]) + 1)
        if every and dataset.dtype == np.float32 and not merged:
            dataset.read_direct(view, np.s_[(slice(start, stop), *slab)], np.s_[start:stop])
        elif every:  # float16 (or another type, or a view): read as stored, widened here
            view[start:stop] = read_span(dataset, start, stop, slab)
        else:  # a span of the file, of which the rows picked are kept
            low, high = np.searchsorted(picked, [start, stop])
            if high > low:
                view[low:high] = read_span(dataset, start, stop, slab)[picked[low:high] - start]
        advance((stop - start) * width * dataset.dtype.itemsize)
    return block


def raw_row_offsets(dataset: h5py.Dataset, rows: int) -> np.ndarray | None:
    """Where each of the first ROWS rows starts in the file, when every row lies whole and raw in a chunk (chunked
    along rows, no filter, native byte order: what featdump writes uncompressed); None otherwise (compressed,
    virtual, rows split across chunks), and h5py reads."""
    if (dataset.chunks is None or dataset.is_virtual or tuple(dataset.chunks[1:]) != dataset.shape[1:]
            or dataset.id.get_create_plist().get_nfilters() or not dataset.dtype.isnative):
        return None
    chunk_rows, row_bytes = dataset.chunks[0], math.prod(dataset.shape[1:]) * dataset.dtype.itemsize
    offsets = np.empty(rows, dtype=np.int64)
    origin = (0,) * (len(dataset.shape) - 1)
    for first in range(0, rows, chunk_rows):
        info = dataset.id.get_chunk_info_by_coord((first, *origin))
        if info.byte_offset is None:
            return None
        count = min(chunk_rows, rows - first)
        offsets[first:first + count] = info.byte_offset + np.arange(count) * row_bytes
    return offsets


def _flat_start(shape: tuple[int, ...], slab: tuple[slice, ...]) -> int:
    """The C-order index of SLAB's first value in a row of SHAPE."""
    strides = [math.prod(shape[axis + 1:]) for axis in range(len(shape))]
    return sum((part.indices(size)[0]) * stride for part, size, stride in zip(slab, shape, strides))
