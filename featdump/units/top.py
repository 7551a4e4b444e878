"""Top: for each unit of a stored layer (a channel of a map, a feature of a token layer, a neuron of a pooled one),
the K images that drive it most and least, in one pass over the layer, out of core: memory is K x units plus a
slab of rows that fits --memory, never the layer. An image's score for a unit is its maximum over the unit's
positions (map positions, tokens) by default, or their mean; with the maximum, the position it lies at (the flat
index into the unit's map or tokens) is kept, so a page can show where. Equal to a stable argsort of the scores
over the whole layer: ties go to the lower row. Written to TOP.h5 (beside the output by default) a layer at a time,
so a killed pass resumes at the first layer not written.

    /top/LAYER/rows, values, positions      (units, K): highest first
    /top/LAYER/bottom_rows, bottom_values   (units, K): lowest first
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featdump.analysis.results import Results, computed_into, finished
from featdump.analysis.stored import Stored, listed
from featdump.errors import BadOption
from featdump.job.channels import channel_axis
from featdump.output.layout import open_to_read
from featdump.output.space import human_bytes, parse_bytes
from featdump.output.views import read_span
from featdump.progress import NoProgress, Progress

log = logging.getLogger("featdump")
GROUP = "top"
SCORES = ("max", "mean")
DEFAULT_K = 16


@dataclass
class Ranking:
    """One layer's units ranked: (units, K) rows and values, highest first and lowest first, and where the highest
    lie in each unit's map (-1 where a unit has one position or the score is the mean)."""

    rows: np.ndarray
    values: np.ndarray
    positions: np.ndarray
    bottom_rows: np.ndarray
    bottom_values: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {key: getattr(self, key) for key in ("rows", "values", "positions", "bottom_rows", "bottom_values")}


def default_place(output: str | Path) -> Path:
    """Where `featdump top OUTPUT` writes by default: OUTPUT's name with .top.h5, beside it."""
    output = Path(output)
    return output.with_name(output.name.removesuffix(".h5") + ".top.h5")


def top(output: str | Path, layers: list[str] | str | None = None, *, k: int = DEFAULT_K, score: str = "max",
        memory: str | int = "1GB", to: str | Path | None = None, overwrite: bool = False,
        progress: Progress | None = None) -> dict[str, Ranking]:
    """Each unit's K highest and lowest images in every layer LAYERS names (all by default) of the featdump output
    OUTPUT (merged, a view of shards), as {layer: Ranking}; also written to TO (default: beside OUTPUT), resumable
    layer by layer. SCORE: max (and its position) or mean over a unit's positions; MEMORY bounds the slab read."""
    if score not in SCORES:
        raise BadOption(f"--score {score!r}: use max or mean.")
    if k < 1:
        raise BadOption(f"-k {k}: give at least 1.")
    stored = Stored.read(output)
    names = stored.select(listed(layers))
    budget, place = parse_bytes(memory), Path(to) if to is not None else default_place(output)
    made_from = {"source": stored.identity(), "k": k, "score": score, "layers": names}
    if not overwrite and finished(place, made_from):
        log.info("%s is finished already, made by this same command: nothing to do.", place)
        return read_top(place, names)
    results = Results.open(place, made_from, stored.paths, stored.labels, stored.classes, overwrite)
    progress = progress or NoProgress()
    return computed_into(results, progress, lambda: _compute(stored, names, k, score, budget, results, progress),
                         {"k": k, "score": score, "layers": names})


def read_top(place: Path, names: list[str]) -> dict[str, Ranking]:
    """The rankings a finished TOP.h5 holds for NAMES."""
    with open_to_read(place) as h5file:
        return {name: Ranking(**{key: h5file[GROUP][name][key][:] for key in ("rows", "values", "positions",
                                                                              "bottom_rows", "bottom_values")})
                for name in names}


def _compute(stored: Stored, names: list[str], k: int, score: str, budget: int, results: Results,
             progress: Progress) -> dict[str, Ranking]:
    done = {name: Ranking(**{key: results.read(f"{GROUP}/{name}", key) for key in Ranking.__dataclass_fields__})
            for name in names if results.has(GROUP, name)}
    if done:
        log.info("Resuming: %d of %d layers ranked in %s already.", len(done), len(names), results.output)
    todo = [name for name in names if name not in done]
    progress.start(sum(stored.size(name) for name in todo), 0, "MB")
    for name in todo:
        ranking = rank_layer(stored, name, k, score, budget, progress)
        results.commit(GROUP, name, ranking.as_dict(), {"score": score, "k": k})
        done[name] = ranking
    return {name: done[name] for name in names}


def rank_layer(stored: Stored, name: str, k: int, score: str, budget: int, progress: Progress) -> Ranking:
    """LAYER NAME of STORED ranked, a slab of rows at a time."""
    with stored.dataset(name) as dataset:
        shape, attributes = dataset.shape[1:], dict(dataset.attrs)
        row_bytes = int(np.prod(shape)) * 8  # as float64 scores are made from it, at most
        axis = channel_axis(shape, attributes)
        step = max(1, budget // max(1, 3 * row_bytes))
        log.info("Ranking %s: %d rows of %s, slabs of %d rows (%s).", name, stored.rows, tuple(shape), step,
                 human_bytes(step * row_bytes))
        best = _Kept(k, highest=True)
        least = _Kept(k, highest=False)
        for start in range(0, stored.rows, step):
            stop = min(stored.rows, start + step)
            values = read_span(dataset, start, stop)
            scores = unit_scores(values, axis, score)
            rows = np.arange(start, stop, dtype=np.int64)
            best.add(scores, rows, unit_maps(values, axis) if score == "max" else None)
            least.add(scores, rows, None)
            progress.advance(values.nbytes / 1e6)
    return Ranking(best.rows, best.values, best.positions, least.rows, least.values)


def unit_maps(values: np.ndarray, axis: int | None) -> np.ndarray:
    """A slab of rows VALUES as (rows, units, positions): the unit axis (within a row) AXIS first (None: every
    entry a unit of one position); a view where the rows are channels first."""
    if axis is None:
        return values.reshape(len(values), -1, 1)
    return np.moveaxis(values, 1 + axis, 1).reshape(len(values), values.shape[1 + axis], -1)


def unit_scores(values: np.ndarray, axis: int | None, score: str) -> np.ndarray:
    """(rows, units) scores of a slab of rows VALUES (`unit_maps`): each unit's maximum over its positions, taken
    in the stored dtype (it is one of the values), or their mean in float64."""
    flat = unit_maps(values, axis)
    if score == "mean":
        return flat.mean(axis=2, dtype=np.float64)
    if flat.shape[2] <= 64:  # a few positions: one pass over the slab per position, each over every row and unit
        scores = flat[:, :, 0].copy()
        for position in range(1, flat.shape[2]):
            np.maximum(scores, flat[:, :, position], out=scores)
    else:
        scores = flat.max(axis=2)
    return scores.astype(np.float64)


class _Kept:
    """Each unit's K best rows so far (highest or lowest scores; ties: the lower row), and where the maxima of the
    highest lie."""

    def __init__(self, k: int, highest: bool):
        self.k, self.sign = k, -1.0 if highest else 1.0
        self.rows = self.values = self.positions = None

    def add(self, scores: np.ndarray, rows: np.ndarray, maps: np.ndarray | None) -> None:
        """SCORES (rows, units) of ROWS merged into the kept: each unit's K best of the slab chosen first (a
        partition, linear in the slab), then sorted with the kept; for those, where their maximum lies in MAPS
        (`unit_maps`; None: no position kept)."""
        units = scores.shape[1]
        values = np.ascontiguousarray(scores.T)
        chosen = _best_of_slab(self.sign * values, self.k)
        values = np.take_along_axis(values, chosen, axis=1)
        candidates = rows[chosen]
        if maps is not None and maps.shape[2] > 1:
            places = maps[chosen, np.arange(units)[:, None], :].argmax(axis=-1)
        else:
            places = np.full(chosen.shape, -1, dtype=np.int64)
        if self.rows is not None:
            values = np.concatenate([self.values, values], axis=1)
            candidates = np.concatenate([self.rows, candidates], axis=1)
            places = np.concatenate([self.positions, places], axis=1)
        order = np.lexsort((candidates, self.sign * values), axis=-1)[:, :self.k]
        self.values = np.take_along_axis(values, order, axis=1)
        self.rows = np.take_along_axis(candidates, order, axis=1)
        self.positions = np.take_along_axis(places, order, axis=1)


def _best_of_slab(keys: np.ndarray, k: int) -> np.ndarray:
    """(units, K) indices, in slab order, of each unit's K smallest KEYS in the slab: those below the K-th smallest,
    then the first of those equal to it (the lower rows win a tie, as the reference's stable sort has it)."""
    count = keys.shape[1]
    if count <= k:
        return np.broadcast_to(np.arange(count), keys.shape)
    kth = np.partition(keys, k - 1, axis=1)[:, k - 1:k]
    below = keys < kth
    equal = keys == kth
    wanted = k - below.sum(axis=1, keepdims=True)
    chosen = below | (equal & (np.cumsum(equal, axis=1) <= wanted))
    return np.nonzero(chosen)[1].reshape(len(keys), k)


def histograms(stored: Stored, name: str, ranking: Ranking, score: str, bins: int, budget: int) -> np.ndarray:
    """(units, BINS) counts of each unit's scores over every row of layer NAME, between its lowest and highest
    (RANKING's): one more pass over the layer, a slab within BUDGET at a time."""
    lows, highs = ranking.bottom_values[:, 0], ranking.values[:, 0]
    widths = np.where(highs > lows, highs - lows, 1.0)
    counts = np.zeros(len(lows) * bins, dtype=np.int64)
    with stored.dataset(name) as dataset:
        shape = dataset.shape[1:]
        axis = channel_axis(shape, dict(dataset.attrs))
        step = max(1, budget // max(1, 3 * int(np.prod(shape)) * 8))
        for start in range(0, stored.rows, step):
            scores = unit_scores(read_span(dataset, start, min(stored.rows, start + step)), axis, score)
            places = np.clip(((scores - lows) / widths * bins).astype(np.int64), 0, bins - 1)
            counts += np.bincount((places + np.arange(len(lows)) * bins).ravel(), minlength=len(counts))
    return counts.reshape(len(lows), bins)
