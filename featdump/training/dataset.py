"""Dataset: `featdump.FeatureDataset`, the stored features as a torch IterableDataset that yields whole batches,
shuffled by chunks, split without overlap among loader workers and ranks, and resumable at any batch.

    loader = DataLoader(FeatureDataset("out.h5", "avgpool", batch_size=1024), batch_size=None, num_workers=4)
    for batch in loader:   # {"features": {layer: (B, ...)}, "row": (B,), "label": (B,)[, "token": (B,)]}

Each worker opens the files itself (after the fork) and reads only slices of whole rows, a window at a time
(`plan`): the window's rows land in one array per layer, its samples are put in the plan's order and cut into
batches. A merged view is read through its shard files.
"""

from __future__ import annotations

import math
import numbers
import os
from collections import OrderedDict

import h5py
import numpy as np
import torch

from featdump.errors import BadOption
from featdump.output.layout import open_to_read
from featdump.output.specs import register_filters
from featdump.training.plan import EpochPlan, Order, Window, blocks_of
from featdump.training.stored import StoredRows, read_stored

BUFFER_BYTES = 256 * 1024**2  # the default window: this many bytes of samples, in whole batches (one at the least)


class FeatureDataset(torch.utils.data.IterableDataset):
    """The rows of LAYERS (names or patterns; all when None) of the featdump output PATH (an output, an
    OUT.partial's committed rows, a merged view, or a list of a job's shard files), in batches of BATCH_SIZE rows,
    or of (row, token) samples with TOKENS "all" or "patches" (a sequence's class and register tokens left out; a
    map's positions are its tokens). SHUFFLE: chunks in a random order, mixed in windows of BUFFER_ROWS samples
    (default: whole batches filling 256 MiB); the order depends only on SEED and `set_epoch`. RANK and WORLD
    (default: torch.distributed's, when initialised) split an epoch without overlap; START_BATCH resumes it.
    DTYPE (a torch dtype) converts the features (else as stored)."""

    def __init__(self, path, layers=None, batch_size: int = 1024, shuffle: bool = True, seed: int = 0,
                 tokens: str | None = None, buffer_rows: int | None = None, drop_last: bool = False,
                 rank: int | None = None, world: int | None = None, start_batch: int = 0, dtype=None):
        super().__init__()
        batch_size, buffer_rows, start_batch, seed = _counts(batch_size=(batch_size, 1), buffer_rows=(buffer_rows, 1),
                                                             start_batch=(start_batch, 0), seed=(seed, 0))
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise BadOption(f"FeatureDataset: dtype={dtype!r}: give a torch dtype (torch.float32, torch.float16) or "
                            "None (as stored).")
        self.stored: StoredRows = read_stored(path, layers, tokens)
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.tokens, self.dtype, self.start_batch, self.epoch = tokens, dtype, start_batch, 0
        self.rank, self.world = _rank_and_world(rank, world)
        self.buffer_rows = buffer_rows if buffer_rows is not None else batch_size if not shuffle else \
            max(batch_size, BUFFER_BYTES // max(self.stored.sample_bytes, 1) // batch_size * batch_size)

    @property
    def layers(self) -> list[str]:
        return [layer.name for layer in self.stored.layers]

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each layer's sample shape (a row's, or a token's)."""
        return {layer.name: layer.sample_shape for layer in self.stored.layers}

    @property
    def classes(self) -> list[str]:
        return list(self.stored.classes)

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next iteration yields (call it before each epoch, as with DistributedSampler)."""
        self.epoch = epoch

    def plan(self) -> EpochPlan:
        """This rank's plan of the current epoch."""
        blocks = blocks_of([part.rows for part in self.stored.parts], [part.block_rows for part in self.stored.parts])
        return EpochPlan(blocks, self.stored.tokens, self.batch_size, self.buffer_rows,
                         Order(self.shuffle, self.seed, self.epoch), self.rank, self.world, self.drop_last)

    def __len__(self) -> int:
        """The batches this rank yields in the current epoch, from START_BATCH on."""
        return max(0, len(self.plan()) - self.start_batch)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        plan = self.plan()
        stream = plan.stream(worker, workers, self.start_batch)
        out = _Out(shared=info is not None, dtype=self.dtype)
        # in file order with a window a batch (the default there), each window is read into arrays of its own and
        # handed over as they are (one copy, as a plain read's); else one window's arrays, reused by the next
        as_read = not self.shuffle and plan.buffer == self.batch_size and not out.shared
        buffers = None if as_read else _Buffers(self.stored, plan.buffer)
        with _Files(self.stored) as files:
            current, batches = None, None
            for window, batch in stream:
                if window is not current:
                    current = window
                    batches = _WindowBatches(files, self.stored, plan, window,
                                             buffers or _Buffers(self.stored, window.samples))
                yield batches.whole(out) if as_read else batches.batch(batch, out)


_LABELS = "/labels"


class _Files:
    """The parts' files, opened in this process (after a loader worker's fork) as they are first read, at most
    MAX_OPEN at once, the least recently read closed first: a merged view of 10,000 shards stays within the
    default `ulimit -n` of 1024."""

    MAX_OPEN = 128

    def __init__(self, stored: StoredRows):
        self.stored, self.open, self.datasets, self.descriptors = stored, OrderedDict(), {}, {}
        register_filters()  # a worker started by spawn, not fork, has not read the files through Output yet

    def __enter__(self) -> _Files:
        return self

    def __exit__(self, *exc) -> None:
        while self.open:
            self._close_oldest()

    def dataset(self, part: int, name: str) -> h5py.Dataset:
        """Layer NAME's dataset in part PART (_LABELS: its labels)."""
        if part in self.open:
            self.open.move_to_end(part)
        else:
            if len(self.open) >= self.MAX_OPEN:
                self._close_oldest()
            self.open[part] = open_to_read(self.stored.parts[part].path)
        found = self.datasets.get((part, name))
        if found is None:
            held = self.open[part]
            found = self.datasets[(part, name)] = held["labels"] if name == _LABELS else held["features"][name]
        return found

    def labels(self, part: int) -> np.ndarray:
        """Part PART's labels, read whole the first time (8 bytes a row), kept while its file is open."""
        key = (part, _LABELS + "/read")
        if key not in self.datasets:
            self.datasets[key] = self.dataset(part, _LABELS)[:self.stored.parts[part].rows]
        return self.datasets[key]

    def read_rows(self, part: int, name: str, first: int, end: int, into: np.ndarray) -> None:
        """Rows FIRST..END of layer NAME of part PART into INTO: straight from the file's bytes where its chunks hold
        them raw and whole (uncompressed, as featdump writes; HDF5's own read of a batch over many chunks costs
        about twice as much), a read per run of chunks that lie end to end; else by h5py."""
        dataset = self.dataset(part, name)
        runs = _raw_runs(dataset, self._chunk_offsets(part, name, dataset), first, end)
        if runs is None or not into.flags.c_contiguous or into.dtype != dataset.dtype:
            dataset.read_direct(into, np.s_[first:end])
            return
        if part not in self.descriptors:
            self.descriptors[part] = os.open(self.stored.parts[part].path, os.O_RDONLY)
        target, row_bytes = memoryview(into).cast("B"), math.prod(dataset.shape[1:]) * dataset.dtype.itemsize
        for offset, start, stop in runs:
            piece = target[start * row_bytes:stop * row_bytes]
            if os.preadv(self.descriptors[part], [piece], offset) != len(piece):
                dataset.read_direct(into, np.s_[first:end])  # the file is not as its index says: HDF5 tells why
                return

    def _chunk_offsets(self, part: int, name: str, dataset: h5py.Dataset) -> np.ndarray | None:
        """Where each chunk of layer NAME of part PART starts in its file (-1: none written), read once (HDF5's
        chunk index walked in one call); None where its rows are not raw (`_raw_layout`)."""
        key = (part, name + "/chunks")
        if key not in self.datasets:
            self.datasets[key] = _chunk_offsets(dataset) if _raw_layout(dataset) else None
        return self.datasets[key]

    def _close_oldest(self) -> None:
        part, held = self.open.popitem(last=False)
        for key in [key for key in self.datasets if key[0] == part]:
            del self.datasets[key]
        held.close()
        if part in self.descriptors:
            os.close(self.descriptors.pop(part))


def _raw_layout(dataset: h5py.Dataset) -> bool:
    """Whether DATASET's chunks hold whole rows as they are in memory: no filter, native order, not virtual."""
    chunks = dataset.chunks
    return chunks is not None and not dataset.is_virtual and tuple(chunks[1:]) == dataset.shape[1:] \
        and dataset.dtype.isnative and not dataset.id.get_create_plist().get_nfilters()


def _chunk_offsets(dataset: h5py.Dataset) -> np.ndarray | None:
    """Each chunk's byte offset in the file, by chunk number along the rows (-1: not written); None where this
    HDF5 cannot walk its chunk index in one call."""
    offsets = np.full(-(-dataset.shape[0] // dataset.chunks[0]), -1, dtype=np.int64)

    def note(info) -> None:
        if info.byte_offset is not None:
            offsets[info.chunk_offset[0] // dataset.chunks[0]] = info.byte_offset

    try:
        dataset.id.chunk_iter(note)
    except (AttributeError, RuntimeError, ValueError):  # an HDF5 older than 1.12.3 has no H5Dchunk_iter
        return None
    return offsets


def _raw_runs(dataset: h5py.Dataset, offsets: np.ndarray | None, first: int,
              end: int) -> list[tuple[int, int, int]] | None:
    """(file offset, first row, end row; rows counted from FIRST) of each run of rows FIRST..END that lies whole
    in the file, chunks end to end joined; None where a chunk of them is not written or OFFSETS are unknown."""
    if offsets is None:
        return None
    size, row_bytes = dataset.chunks[0], math.prod(dataset.shape[1:]) * dataset.dtype.itemsize
    runs: list[tuple[int, int, int]] = []
    for chunk in range(first // size, (end - 1) // size + 1):
        start, stop = max(first, chunk * size), min(end, (chunk + 1) * size)
        if chunk >= len(offsets) or offsets[chunk] < 0:
            return None
        offset = int(offsets[chunk]) + (start - chunk * size) * row_bytes
        if runs and runs[-1][0] + (runs[-1][2] - runs[-1][1]) * row_bytes == offset:
            runs[-1] = (runs[-1][0], runs[-1][1], stop - first)
        else:
            runs.append((offset, start - first, stop - first))
    return runs


class _Buffers:
    """Arrays for a window's samples (each layer's, rows, labels, tokens), made once and reused window after
    window (a fresh array would cost its pages' first touch every window)."""

    def __init__(self, stored: StoredRows, samples: int):
        self.values = {layer.name: np.empty((samples, *layer.sample_shape), dtype=layer.dtype)
                       for layer in stored.layers}
        self.rows, self.labels, self.token = (np.empty(samples, dtype=np.int64) for _ in range(3))


class _Out:
    """Where a batch's tensors are made: inside a loader worker, all of them in one block of shared memory (the
    DataLoader then hands them over without a copy, one segment a batch); else by numpy (whose pages are reused
    batch after batch), gathered on torch's threads. Features converted to DTYPE when one is given."""

    def __init__(self, shared: bool, dtype):
        self.shared, self.dtype = shared, dtype

    def batch(self, values: dict[str, np.ndarray], chosen: np.ndarray, meta: dict[str, np.ndarray]) -> dict:
        """{"features": each of VALUES' rows CHOSEN, and META's entries (int64 per sample) at CHOSEN}."""
        if not self.shared:  # gathered by torch, on its threads (numpy's take runs on one)
            index = torch.from_numpy(chosen)
            features = {name: self._converted(torch.index_select(torch.from_numpy(array), 0, index))
                        for name, array in values.items()}
            return {"features": features, **{key: torch.from_numpy(array[chosen]) for key, array in meta.items()}}
        shapes = {name: ((len(chosen), *array.shape[1:]), self.dtype or torch.from_numpy(array[:0]).dtype)
                  for name, array in values.items()}
        shapes.update({key: ((len(chosen),), torch.int64) for key in meta})
        made = _shared_tensors(shapes)
        for name, array in {**values, **meta}.items():
            if made[name].dtype == torch.from_numpy(array[:0]).dtype:  # mode "clip": "raise" would buffer a copy
                np.take(array, chosen, axis=0, out=made[name].numpy(), mode="clip")
            else:
                made[name].copy_(torch.from_numpy(np.take(array, chosen, axis=0, mode="clip")))
        return {"features": {name: made[name] for name in values}, **{key: made[key] for key in meta}}

    def _converted(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.dtype in (None, tensor.dtype) else tensor.to(self.dtype)


def _shared_tensors(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> dict[str, torch.Tensor]:
    """Empty tensors of SHAPES (name: (shape, dtype)) laid one after another in one new block of shared memory."""
    places, size = {}, 0
    for name, (shape, dtype) in shapes.items():
        itemsize = torch.empty(0, dtype=dtype).element_size()
        size = -(-size // 64) * 64  # each aligned to 64 bytes (and so to its item size)
        places[name] = size // itemsize
        size += math.prod(shape) * itemsize
    storage = torch.UntypedStorage._new_shared(max(size, 1))
    return {name: torch.empty(0, dtype=dtype).set_(storage, places[name], shape)
            for name, (shape, dtype) in shapes.items()}


class _WindowBatches:
    """A window's samples read (slices of whole rows, into BUFFERS) and ordered: its batches."""

    def __init__(self, files: _Files, stored: StoredRows, plan: EpochPlan, window: Window, buffers: _Buffers):
        self.plan, self.stored, samples = plan, stored, window.samples
        self.values = {name: values[:samples] for name, values in buffers.values.items()}
        self.rows, self.labels = buffers.rows[:samples], buffers.labels[:samples]
        self.token = buffers.token[:samples] if _has_tokens(stored) else None
        filled = 0
        for piece in window.pieces:
            self._read(files, piece, filled)
            filled += piece.last - piece.first
        self.order = plan.order(window)

    def _read(self, files: _Files, piece, filled: int) -> None:
        """PIECE's samples into the window's arrays from position FILLED on."""
        tokens, block, count = self.stored.tokens, piece.block, piece.last - piece.first
        first_row, end_row = block.start + piece.first // tokens, block.start + math.ceil(piece.last / tokens)
        skip = piece.first - (first_row - block.start) * tokens  # samples of the first row before the piece
        target = slice(filled, filled + count)
        whole_rows = skip == 0 and count == (end_row - first_row) * tokens
        for layer in self.stored.layers:
            values = self.values[layer.name]
            if whole_rows and layer.reads_in_place:  # straight into the window: one copy
                files.read_rows(block.part, layer.name, first_row, end_row,
                                values[target].reshape(end_row - first_row, *layer.row_shape))
            else:
                dataset = files.dataset(block.part, layer.name)
                values[target] = layer.samples(dataset[first_row:end_row])[skip:skip + count]
        positions = np.arange(first_row * tokens + skip, first_row * tokens + skip + count)
        self.rows[target] = self.stored.parts[block.part].offset + positions // tokens
        self.labels[target] = files.labels(block.part)[first_row:end_row][positions // tokens - first_row]
        if self.token is not None:
            self.token[target] = positions % tokens + self.stored.layers[0].first_token

    def batch(self, index: int, out: _Out) -> dict:
        chosen = self.order[index * self.plan.batch_size:(index + 1) * self.plan.batch_size]
        return out.batch(self.values, chosen, self._meta())

    def whole(self, out: _Out) -> dict:
        """The window as one batch, its arrays handed over without a copy (arrays of its own, in file order)."""
        return {"features": {name: out._converted(torch.from_numpy(array)) for name, array in self.values.items()},
                **{key: torch.from_numpy(array) for key, array in self._meta().items()}}

    def _meta(self) -> dict[str, np.ndarray]:
        return {"row": self.rows, "label": self.labels, **({"token": self.token} if self.token is not None else {})}


def _has_tokens(stored: StoredRows) -> bool:
    return stored.layers[0].kind != "row"


def _rank_and_world(rank: int | None, world: int | None) -> tuple[int, int]:
    """RANK and WORLD as given, else torch.distributed's when it is initialised, else 0 of 1."""
    if rank is None or world is None:
        import torch.distributed as distributed

        initialised = distributed.is_available() and distributed.is_initialized()
        rank = rank if rank is not None else (distributed.get_rank() if initialised else 0)
        world = world if world is not None else (distributed.get_world_size() if initialised else 1)
    rank, world = _counts(rank=(rank, 0), world=(world, 1))
    if not 0 <= rank < world:
        raise BadOption(f"FeatureDataset: rank={rank} of world={world}: a rank runs from 0 to world - 1.")
    return rank, world


def _counts(**values: tuple[int | None, int]) -> list[int | None]:
    """Each count (name=(value, least)) as an int (numpy's integers too), up front; BadOption for one that is not a
    whole number of at least its least (None: unset)."""
    counts = []
    for name, (value, least) in values.items():
        if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_))
                                  or value < least):
            raise BadOption(f"FeatureDataset: {name}={value!r}: give a whole number of {least} or more.")
        counts.append(None if value is None else int(value))
    return counts

