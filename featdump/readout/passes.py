"""Passes: one layer read from its file to fit every fold, within a memory budget, in whichever of two forms is the
smaller (as scikit-learn's RidgeCV picks its `gram` or `cov` mode).

    wide (D >= N)    one pass: the N x N Gram in float64 (`analysis.gram`, slabs of features holding every row);
                     every fold's fit and held-out predictions come from it (`ridge.dual_fold`)
    narrow (D < N)   pass 1, whole rows in blocks: each fold's moments (count, sums, X^T X, X^T y; K of D x D);
                     each fold's eigenbasis from the others' moments. Pass 2: every row in each basis that trains
                     on it, for its leave-one-out errors, and in its own fold's basis, for its held-out predictions
                     at every alpha, kept while they fit the budget; otherwise a third pass predicts with the
                     alphas chosen.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import h5py
import numpy as np
import torch

from featdump.analysis.gram import gram
from featdump.errors import UsageProblem
from featdump.forward.device import free_memory
from featdump.output.space import human_bytes
from featdump.output.views import read_span
from featdump.readout.delays import delayed_gram, delayed_nonfinite, gram_rows
from featdump.readout.ridge import FoldFit, PrimalFold, choose, dual_fold

log = logging.getLogger("featdump")

ROW_BLOCK_BYTES = 64 * 1024**2  # a block of whole rows at most, whatever the budget (two exist at once)
ROW_BLOCK_ROWS_AT_MOST = 8192


def is_wide(rows: int, features: int) -> bool:
    """Whether the Gram (N x N) is the smaller matrix: RidgeCV's `gram` mode (n_samples <= n_features)."""
    return rows <= features


def working_bytes(rows: int, features: int, targets: int, folds: int, alphas: int, memory: int) -> int:
    """Bytes a layer's fit holds beyond the slabs (MEMORY): the matrices of its form, their eigendecompositions."""
    if is_wide(rows, features):
        return 8 * (rows * rows + 3 * rows * rows + 2 * rows * targets)  # the Gram; a fold's centred copy, Q, Q*Q
    moments = folds * features * (features + targets) + 3 * features * features
    held = rows * alphas * targets if rows * alphas * targets * 8 <= memory else 0
    return 8 * (moments + folds * features * features + held)


class FitClock:
    """Says each fold's fit as it ends, with the time the layer's other fits will take at that pace (a fit of a
    wide layer of thousands of images takes minutes, while the progress bar, which counts the bytes read, stands
    still); quiet for fits under a second."""

    quiet_below = 1.0  # seconds a fit

    def __init__(self, folds: int, say: Callable[[str], None]):
        self.folds, self.say, self.started, self.done = folds, say, time.perf_counter(), 0

    def fitted(self) -> None:
        self.done += 1
        spent = time.perf_counter() - self.started
        if spent / self.done >= self.quiet_below:
            left = spent / self.done * (self.folds - self.done)
            self.say(f"fold {self.done} of {self.folds} fitted ({spent:.0f} s so far"
                     + (f"; about {left:.0f} s for the other {self.folds - self.done})" if left else ")"))


def eigh_seconds(size: int, device: torch.device) -> float:
    """About how long an eigendecomposition of a SIZE x SIZE float64 matrix takes on DEVICE: one of 384 x 384
    timed here, scaled by the cube of the size."""
    sample = torch.randn(384, 384, dtype=torch.float64, device=device)
    sample = sample @ sample.T
    torch.linalg.eigh(sample)  # warm
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    torch.linalg.eigh(sample)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - started) * (size / 384) ** 3


@dataclass
class Fitting:
    """How a layer's folds are fitted: the ALPHAS each fold chooses from by leave-one-out (one for all targets, or
    PER_TARGET), the MEMORY a block of rows may take on DEVICE, ADVANCE(bytes read) for the progress, SAY for a
    note, CLOCK for the folds' times."""

    alphas: torch.Tensor
    per_target: bool
    memory: int
    device: torch.device
    advance: Callable[[int], None]
    say: Callable[[str], None] = lambda line: None
    clock: FitClock | None = None


def fit_wide(dataset: h5py.Dataset, file_rows: int, used: np.ndarray, targets: torch.Tensor, fold: np.ndarray,
             fitting: Fitting, shifts: np.ndarray | None = None,
             training: np.ndarray | None = None) -> tuple[list[FoldFit], torch.Tensor]:
    """Every fold's fit of a wide layer (rows USED of its first FILE_ROWS) from the Gram of the rows used alone, or of
    their delayed design (`delays`) when SHIFTS (each delay's source file row of each row used) are given; the
    rows' nonfinite mask. TRAINING (N, K): the rows each fold trains on (`folds.training_rows`; by default the
    other folds')."""
    alphas, per_target, device, clock = fitting.alphas, fitting.per_target, fitting.device, fitting.clock
    read = used
    if shifts is not None:  # the rows used and those their delays take from, with or without a target
        read, shifts, places = gram_rows(used, shifts)
    stats = gram(dataset, file_rows if len(read) == file_rows else read, fitting.memory, device, fitting.advance,
                 exact=True)
    matrix, nonfinite = stats.centred, stats.nonfinite
    if shifts is not None:  # the delays need the rows as stored: a zero row is no row, not the mean
        matrix += stats.shifts[:, None] + stats.shifts[None, :] + stats.mean_square
        matrix = delayed_gram(matrix, shifts)
        nonfinite = delayed_nonfinite(nonfinite, shifts, places)
    del stats
    if bool(nonfinite.any()):
        return [], nonfinite
    folds = torch.as_tensor(fold, device=device)
    training = torch.as_tensor(training if training is not None else _others(fold), device=device)
    fits = []
    for number in range(int(fold.max()) + 1):
        train, test = torch.nonzero(training[:, number]).flatten(), torch.nonzero(folds == number).flatten()
        fits.append(dual_fold(matrix, train, test, targets, alphas, per_target))
        if clock is not None:
            clock.fitted()
    return fits, nonfinite


def fit_narrow(dataset: h5py.Dataset, used: np.ndarray, targets: torch.Tensor, fold: np.ndarray, fitting: Fitting,
               training: np.ndarray | None = None) -> tuple[list[FoldFit], torch.Tensor]:
    """Every fold's fit of a narrow layer, in two passes over its rows USED (three when the held-out predictions
    at every alpha would not fit FITTING's memory); the rows' nonfinite mask (no fit when any is). TRAINING (N, K):
    the rows each fold trains on (by default the other folds')."""
    alphas, memory, device, advance = fitting.alphas, fitting.memory, fitting.device, fitting.advance
    folds = int(fold.max()) + 1
    training = training if training is not None else _others(fold)
    features = math.prod(dataset.shape[1:])
    moments = FoldMoments(folds, features, targets.shape[1], device)
    nonfinite = torch.zeros(len(used), dtype=torch.bool, device=device)
    for positions, rows in row_blocks(dataset, used, memory, device, advance):
        bad = ~torch.isfinite(rows).all(1)
        if bool(bad.any()):
            nonfinite[positions] |= bad
            continue
        moments.add(rows, targets[positions], torch.as_tensor(~training[positions], device=device))
    if bool(nonfinite.any()):
        return [], nonfinite
    bases = []
    for number in range(folds):
        bases.append(moments.fold_fit(number))
        if fitting.clock is not None:
            fitting.clock.fitted()
    del moments
    count, width = len(used), targets.shape[1]
    keep_held = count * len(alphas) * width * 8 <= memory
    held = torch.empty(count, len(alphas), width, dtype=torch.float64, device=device) if keep_held else None
    errors = torch.zeros(folds, len(alphas), width, dtype=torch.float64, device=device)
    groups = _alpha_groups(len(alphas), width, memory)
    for positions, rows in row_blocks(dataset, used, memory, device, advance, extra=width * 8 * 3):
        of_rows = torch.as_tensor(fold[positions], device=device)
        trains = torch.as_tensor(training[positions], device=device)
        block_targets = targets[positions]
        for number, basis in enumerate(bases):
            projected = basis.project(rows)  # every row: the training ones' errors, the held-out ones' predictions
            held_out = (of_rows == number).nonzero().flatten()
            for group in groups:
                fitted = basis.fitted(projected, alphas[group])
                errors[number, group] += basis.loo_squared_errors(projected, block_targets, fitted, alphas[group],
                                                                  trains[:, number])
                if held is not None and len(held_out):
                    held[torch.as_tensor(positions, device=device)[held_out], group] = fitted[held_out]
                del fitted
    counts = [basis.count for basis in bases]
    chosen = [choose(errors[number] / counts[number], fitting.per_target) for number in range(folds)]
    if held is not None:
        predicted = _from_held(held, fold, chosen)
    else:
        held_bytes = human_bytes(count * len(alphas) * width * 8)
        fitting.say(f"the held-out predictions at every alpha ({held_bytes}) are more than the memory budget: a "
                    "third pass predicts with the alphas chosen")
        predicted = _third_pass(dataset, used, fold, bases, chosen, fitting, width)
    return [FoldFit(chosen[number], errors[number] / counts[number], predicted[number]) for number in range(folds)], \
        nonfinite


def _alpha_groups(alphas: int, targets: int, memory: int) -> list[slice]:
    """The alphas in groups whose fitted values for a block (rows x group x targets) stay small beside the block:
    all at once for a few targets (one product), fewer for many."""
    size = max(1, min(alphas, (memory // 8) // max(1, ROW_BLOCK_ROWS_AT_MOST * targets * 8)))
    return [slice(start, min(start + size, alphas)) for start in range(0, alphas, size)]


def _from_held(held: torch.Tensor, fold: np.ndarray, chosen: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each fold's held-out predictions (m, T) at its chosen alphas, from HELD (N, A, T)."""
    predicted = []
    for number, alphas in enumerate(chosen):
        rows = torch.as_tensor(np.flatnonzero(fold == number), device=held.device)
        part = held[rows]  # (m, A, T)
        predicted.append(torch.gather(part, 1, alphas[None, None, :].expand(len(rows), 1, -1)).squeeze(1))
    return predicted


def _third_pass(dataset, used, fold, bases: list[PrimalFold], chosen, fitting: Fitting,
                width: int) -> list[torch.Tensor]:
    device = fitting.device
    weights = [basis.weights(fitting.alphas, alpha) for basis, alpha in zip(bases, chosen)]
    predicted = torch.empty(len(used), width, dtype=torch.float64, device=device)
    for positions, rows in row_blocks(dataset, used, fitting.memory, device, fitting.advance):
        of_rows = fold[positions]
        for number, basis in enumerate(bases):
            mine = of_rows == number
            if mine.any():
                predicted[positions[mine]] = basis.mean_target + (rows[torch.as_tensor(mine, device=device)]
                                                                  - basis.mean) @ weights[number]
    return [predicted[torch.as_tensor(np.flatnonzero(fold == number), device=device)]
            for number in range(len(bases))]


class FoldMoments:
    """The moments of all rows and, per fold, of the rows it does not train on (its own, and a gap's), about a
    shift (the first block's mean: the sums stay small where the features share a large offset): count, sums,
    X^T X, the targets' sums, X^T y; in float64. A fold's training moments are the difference."""

    def __init__(self, folds: int, features: int, targets: int, device: torch.device):
        zeros = dict(dtype=torch.float64, device=device)
        self.counts = [0] * (folds + 1)  # the last: all rows
        self.sums = torch.zeros(folds + 1, features, **zeros)
        self.products = torch.zeros(folds + 1, features, features, **zeros)
        self.target_sums = torch.zeros(folds + 1, targets, **zeros)
        self.cross = torch.zeros(folds + 1, features, targets, **zeros)
        self.shift: torch.Tensor | None = None

    def add(self, rows: torch.Tensor, targets: torch.Tensor, excluded: torch.Tensor) -> None:
        """ROWS (b, D) with their TARGETS; EXCLUDED (b, K) bool: the folds each row does not train."""
        if self.shift is None:
            self.shift = rows.mean(0)
        rows = rows - self.shift
        everyone = torch.ones(len(rows), 1, dtype=torch.bool, device=rows.device)
        for number, mine in enumerate(torch.cat([excluded, everyone], dim=1).T):
            if not bool(mine.any()):
                continue
            part, aims = rows[mine], targets[mine]
            self.counts[number] += len(part)
            self.sums[number] += part.sum(0)
            self.products[number] += part.T @ part
            self.target_sums[number] += aims.sum(0)
            self.cross[number] += part.T @ aims

    def fold_fit(self, number: int) -> PrimalFold:
        """Fold NUMBER's fit: from the moments of its training rows (all rows' less those it excludes)."""
        count = self.counts[-1] - self.counts[number]
        offset = (self.sums[-1] - self.sums[number]) / count  # the training mean less the shift
        covariance = self.products[-1] - self.products[number]
        covariance -= count * torch.outer(offset, offset)
        mean_target = (self.target_sums[-1] - self.target_sums[number]) / count
        cross = self.cross[-1] - self.cross[number] - count * torch.outer(offset, mean_target)
        return PrimalFold.fit(count, self.shift + offset, mean_target, covariance, cross)


def _others(fold: np.ndarray) -> np.ndarray:
    """(N, K) bool: each fold trains on the other folds' rows."""
    return fold[:, None] != np.arange(int(fold.max()) + 1)[None, :]


def row_blocks(dataset: h5py.Dataset, used: np.ndarray, memory: int, device: torch.device,
               advance: Callable[[int], None], extra: int = 0) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
    """(positions in USED, those rows as a (b, D) float64 tensor) for blocks of whole rows of DATASET, the file's
    rows read in chunk-aligned spans, the next read on a thread while one is used. EXTRA: bytes the caller holds
    per row of a block (the block is that much smaller)."""
    features = math.prod(dataset.shape[1:])
    row_bytes = features * dataset.dtype.itemsize
    chunk = dataset.chunks[0] if dataset.chunks else 1
    step = max(1, min(memory // 4, ROW_BLOCK_BYTES) // max(row_bytes + features * 8 * 3 + extra, 1))
    step = min(ROW_BLOCK_ROWS_AT_MOST, max(chunk, step // chunk * chunk))
    last = int(used[-1]) + 1
    spans = [(start, min(start + step, last)) for start in range(0, last, step)]

    def read(span: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        start, stop = span
        low, high = np.searchsorted(used, [start, stop])
        positions = np.arange(low, high)
        block = read_span(dataset, start, stop).reshape(stop - start, features)[used[low:high] - start]
        advance((stop - start) * row_bytes)
        return positions, block

    with ThreadPoolExecutor(1, thread_name_prefix="featdump-rows") as pool:
        pending = pool.submit(read, spans[0])
        for following in [*spans[1:], None]:
            positions, block = pending.result()
            if following is not None:
                pending = pool.submit(read, following)
            if len(positions):
                yield positions, torch.from_numpy(block).to(device, torch.float64)


def refuse_too_large(stored, names: list[str], count: int, targets: int, folds: int, alphas: int, budget: int,
                     device: torch.device) -> dict[str, tuple[int, int]]:
    """{layer: (features, bytes to read)}, after refusing (UsageProblem) a layer whose matrices do not fit here."""
    available = free_memory(device)
    sizes = {}
    for name in names:
        with stored.dataset(name) as dataset:
            features = int(np.prod(dataset.shape[1:]))
            narrow_reads = 2 * (not is_wide(count, features))
            sizes[name] = (features, stored.rows * features * dataset.dtype.itemsize * max(1, narrow_reads))
        need = working_bytes(count, features, targets, folds, alphas, budget)
        if need > available:
            side = min(count, features)
            raise UsageProblem(
                f"Layer {name} ({count} images x {features} features) needs {human_bytes(need)} for its "
                f"{side} x {side} matrices in float64, besides --memory, and {device} has {human_bytes(available)} "
                f"free: extract it reduced (--reduce {name}=srp:4096, or pca:1024), or fit it on fewer images"
                f"{' (or in the machine memory: --device cpu)' if device.type == 'cuda' else ''}.")
    need = max((working_bytes(count, features, targets, folds, alphas, budget)
                for features, _ in sizes.values()), default=0)
    log.info("Working memory: --memory %s for the rows read, and at most %s for the matrices (float64).",
             human_bytes(budget), human_bytes(need))
    return sizes
