"""Plan: one epoch of a FeatureDataset, fixed before any row is read, from the seed, the epoch, the batch size, the
buffer, the rank and the loader's workers alone:

1. the blocks of rows (each one chunk of every layer) in a seeded random order (file order without shuffle);
2. their samples, one after another, cut into `world` runs of the same length, so that every rank yields as many
   batches (DistributedSampler's rule): ceil(N / world) samples each, the last rank's run wrapping around to the
   first samples again; with drop_last, floor(N / world) each, the last N mod world samples left out;
3. a rank's run cut into windows of `buffer` samples (whole batches): a window's blocks are read at once, in file
   order (neighbours in one read), and its samples put in a seeded random order, then cut into batches; so a batch
   mixes the rows of every chunk in its window, and a window holds buffer / chunk rows chunks drawn from the whole
   file;
4. window i goes to loader worker i % workers, and the DataLoader takes the workers' batches in turn.

Resuming at batch K (`start`): the batches an uninterrupted epoch yields from its K-th on, in the same order; each
worker starts at the window holding its first batch, and nothing before that window is read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Block:
    """Rows START..STOP of part PART: read whole (its layers' chunks)."""

    part: int
    start: int
    stop: int


@dataclass(frozen=True)
class Piece:
    """Samples FIRST..LAST of BLOCK (counted from the block's first row's first token) that a window takes."""

    block: Block
    first: int
    last: int


@dataclass(frozen=True)
class Window:
    index: int  # its place among the rank's windows
    pieces: tuple[Piece, ...]
    samples: int


def blocks_of(part_rows: list[int], block_rows: list[int]) -> list[Block]:
    """Every part's rows in blocks of its BLOCK_ROWS (the last of a part shorter)."""
    return [Block(part, start, min(start + size, rows))
            for part, (rows, size) in enumerate(zip(part_rows, block_rows)) for start in range(0, rows, size)]


@dataclass(frozen=True)
class Order:
    """An epoch's order: shuffled or not, by SEED and the EPOCH's number (every rank draws the same)."""

    shuffle: bool
    seed: int = 0
    epoch: int = 0


class EpochPlan:
    """Which samples a rank serves in an epoch, in which windows and batches, and which worker yields them."""

    def __init__(self, blocks: list[Block], tokens: int, batch_size: int, buffer: int, order: Order, rank: int,
                 world: int, drop_last: bool):
        shuffle, seed, epoch = order.shuffle, order.seed, order.epoch
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.seed, self.epoch, self.rank = seed, epoch, rank
        self.buffer = max(batch_size, buffer // batch_size * batch_size)
        order = blocks
        if shuffle:
            order = [blocks[index] for index in np.random.default_rng([seed, epoch, 0]).permutation(len(blocks))]
        total = sum(block.stop - block.start for block in order) * tokens
        each = total // world if drop_last else -(-total // world)
        first, last = each * rank, each * (rank + 1)
        self.samples = last - first
        laps = -(-last // total) if total else 1  # the run past the last sample wraps around
        self.windows = _windows(order * laps, tokens, first, last, self.buffer)

    def batches_in(self, window: Window) -> int:
        full, rest = divmod(window.samples, self.batch_size)
        return full + (1 if rest and not (self.drop_last and window.index == len(self.windows) - 1) else 0)

    def __len__(self) -> int:
        return sum(self.batches_in(window) for window in self.windows)

    def order(self, window: Window) -> np.ndarray:
        """The order of WINDOW's samples (positions in it) in its batches."""
        if not self.shuffle:
            return np.arange(window.samples)
        return np.random.default_rng([self.seed, self.epoch, 1, self.rank, window.index]).permutation(window.samples)

    def stream(self, worker: int, workers: int, start: int = 0) -> list[tuple[Window, int]]:
        """(window, batch in it) that loader worker WORKER of WORKERS yields, in order, for an epoch resumed at its
        START-th batch: the batches the DataLoader, taking the workers' batches in turn (skipping a worker that has
        none left), places from START on."""
        workers = max(workers, 1)
        streams = [[(window, batch) for window in self.windows[own::workers]
                    for batch in range(self.batches_in(window))] for own in range(workers)]
        taken, cursor, position = [0] * workers, 0, 0
        while position < start and any(taken[own] < len(streams[own]) for own in range(workers)):
            own = cursor % workers
            cursor += 1
            if taken[own] < len(streams[own]):
                taken[own] += 1
                position += 1
        # After START, the workers with batches left go on in turn from the cursor: the resumed loader's worker k
        # plays the k-th of them (its worker 0 is asked first).
        turn = [(cursor + step) % workers for step in range(workers)]
        left = [own for own in turn if taken[own] < len(streams[own])]
        if worker >= len(left):
            return []
        own = left[worker]
        return streams[own][taken[own]:]


def _windows(order: list[Block], tokens: int, first: int, last: int, size: int) -> list[Window]:
    """Samples FIRST..LAST of the blocks in ORDER (TOKENS samples per row), in windows of SIZE samples."""
    windows, pieces, filled, position = [], [], 0, 0
    for block in order:
        count = (block.stop - block.start) * tokens
        begin, end = max(first, position), min(last, position + count)
        while begin < end:
            take = min(end - begin, size - filled)
            pieces.append(Piece(block, begin - position, begin - position + take))
            filled, begin = filled + take, begin + take
            if filled == size:
                windows.append(Window(len(windows), _in_file_order(pieces, tokens), filled))
                pieces, filled = [], 0
        position += count
        if position >= last:
            break
    if filled:
        windows.append(Window(len(windows), _in_file_order(pieces, tokens), filled))
    return windows


def _in_file_order(pieces: list[Piece], tokens: int) -> tuple[Piece, ...]:
    """A window's PIECES sorted by their place in the files, neighbours joined: its reads go forward, one read per
    run of adjacent blocks (the window's samples are put in a random order anyway). A block taken twice (a wrapped
    rank's run) stays twice."""
    joined: list[Piece] = []
    for piece in sorted(pieces, key=lambda piece: (piece.block.part, piece.block.start, piece.first)):
        before = joined[-1] if joined else None
        if before is not None and before.block.part == piece.block.part and before.block.stop == piece.block.start \
                and piece.first == 0 and before.last == (before.block.stop - before.block.start) * tokens:
            block = Block(piece.block.part, before.block.start, piece.block.stop)
            joined[-1] = Piece(block, before.first, before.last + piece.last)
        else:
            joined.append(piece)
    return tuple(joined)
