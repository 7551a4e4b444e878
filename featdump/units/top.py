"""Top: for each unit of a stored layer (a channel of a map, a feature of a token layer, a neuron of a pooled one),
the K images that drive it most and least, in one pass over the layer, out of core: memory is K x units plus a
slab of rows that fits --memory, never the layer. An image's score for a unit is its maximum over the unit's
positions (map positions, tokens) by default, or their mean; with the maximum, the position it lies at (the flat
index into the unit's map or tokens) is kept, so a page can show where. Equal to a stable argsort of the scores
over the whole layer: ties go to the lower row, NaN scores come last.

The same pass keeps each unit's spectrum: a histogram of its scores over every row, in BINS bins between the lowest
and highest score of a seeded sample of SAMPLE rows (read first) and one bin below and one above them for the rest
(a NaN score in none); and, at each of QUANTILES, the sample's image at that quantile of the unit's scores (a
sample of 1,024 rows drawn one by one, whatever the file's order, puts it within about 1.4% of rank, one standard
error, of the layer's own). Written to TOP.h5 (beside the output by default) a layer at a time, so a killed pass
resumes at the first layer not written. A ranking serves any smaller ask: fewer layers, a smaller K; a layer not in
it yet is added to it.

    /top/LAYER/rows, values, positions      (units, K): highest first
    /top/LAYER/bottom_rows, bottom_values   (units, K): lowest first
    /top/LAYER/histogram, edges             (units, BINS + 2) counts, (units, BINS + 1) edges
    /top/LAYER/quantile_rows, quantile_values   (units, len(QUANTILES))
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featdump.analysis.results import Results, computed_into, made_from_of
from featdump.analysis.stored import Stored, listed
from featdump.errors import BadOption, OutputExists, UsageProblem
from featdump.inputs.stores import Patience
from featdump.job.channels import channel_axis
from featdump.output import remote
from featdump.output.layout import open_to_read
from featdump.output.places import InStore, place_of
from featdump.output.space import human_bytes, parse_bytes
from featdump.output.views import read_span
from featdump.progress import NoProgress, Progress
from featdump.units.scores import unit_maps, unit_scores
from featdump.units.spectrum import BINS, QUANTILES, ROUNDING, SAMPLE, SAMPLING, Spectrum  # noqa: F401 (names of the ranking)

log = logging.getLogger("featdump")
GROUP = "top"
SCORES = ("max", "mean")
DEFAULT_K = 16
SERVES_SMALLER = ("k", "layers")  # what a ranking may hold more of than asked and still serve the ask
FIELDS = ("rows", "values", "positions", "bottom_rows", "bottom_values", "histogram", "edges", "quantile_rows",
          "quantile_values")


@dataclass
class Ranking:
    """One layer's units ranked: (units, K) rows and values, highest first and lowest first, and where the highest
    lie in each unit's map (-1 where a unit has one position or the score is the mean); each unit's histogram over
    every row (counts below EDGES[0], in each bin, above EDGES[-1]) and its images at QUANTILES."""

    rows: np.ndarray
    values: np.ndarray
    positions: np.ndarray
    bottom_rows: np.ndarray
    bottom_values: np.ndarray
    histogram: np.ndarray
    edges: np.ndarray
    quantile_rows: np.ndarray
    quantile_values: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {key: getattr(self, key) for key in FIELDS}

    def first(self, k: int) -> Ranking:
        """This ranking of each unit's first K (a stable sort's first K of more are its K)."""
        if self.rows.shape[1] <= k:
            return self
        return dataclasses.replace(self, rows=self.rows[:, :k], values=self.values[:, :k],
                                   positions=self.positions[:, :k], bottom_rows=self.bottom_rows[:, :k],
                                   bottom_values=self.bottom_values[:, :k])

    def to_xarray(self, paths: list[str] | None = None):
        """This ranking as an xarray Dataset: (unit, rank) rows and values (and, given the output's PATHS, the
        images' paths), (unit, bin) histogram, (unit, quantile) images at QUANTILES."""
        try:
            import xarray as xr
        except ImportError as error:
            raise UsageProblem("featdump.top(..., as_xarray=True) needs xarray: pip install xarray.") from error
        unit_rank, unit_quantile = ("unit", "rank"), ("unit", "quantile")
        variables = {"rows": (unit_rank, self.rows), "values": (unit_rank, self.values),
                     "positions": (unit_rank, self.positions), "bottom_rows": (unit_rank, self.bottom_rows),
                     "bottom_values": (unit_rank, self.bottom_values), "histogram": (("unit", "bin"), self.histogram),
                     "edges": (("unit", "edge"), self.edges), "quantile_rows": (unit_quantile, self.quantile_rows),
                     "quantile_values": (unit_quantile, self.quantile_values)}
        if paths is not None:
            names = np.asarray(paths, dtype=object)
            variables.update(paths=(unit_rank, names[self.rows]), bottom_paths=(unit_rank, names[self.bottom_rows]),
                             quantile_paths=(unit_quantile, names[self.quantile_rows]))
        return xr.Dataset(variables, coords={"unit": np.arange(len(self.rows)), "quantile": list(QUANTILES)})


def default_place(output: str | Path) -> Path | str:
    """Where `featdump top OUTPUT` writes by default: OUTPUT's name with .top.h5, beside it (in the store, for an
    output at a URL)."""
    name = str(output).rstrip("/").rsplit("/", 1)[-1].removesuffix(".h5") + ".top.h5"
    return place_of(output).beside(name)


def written_to(output: str | Path, to: str | Path | None = None) -> Path | str:
    """Where `top` writes OUTPUT's ranking: TO; else beside OUTPUT (in its store), or, for an OUTPUT on a web
    server (which takes no uploads), beside its copy on the local scratch disk."""
    place = place_of(output)
    if to is not None:
        return to
    if isinstance(place, InStore) and not place.takes_uploads:
        return default_place(place.scratch_twin(None))
    return default_place(output)


def top(output: str | Path, layers: list[str] | str | None = None, *, k: int = DEFAULT_K, score: str = "max",
        memory: str | int = "1GB", to: str | Path | None = None, overwrite: bool = False,
        progress: Progress | None = None, as_xarray: bool = False) -> dict:
    """Each unit's K highest and lowest images in every layer LAYERS names (all by default) of the featdump output
    OUTPUT (merged, a view of shards), as {layer: Ranking} (AS_XARRAY: {layer: xarray Dataset}, the images' paths
    beside their rows); also written to TO (default: beside OUTPUT), resumable layer by layer. SCORE: max (and its
    position) or mean over a unit's positions; MEMORY bounds the slab read."""
    if score not in SCORES:
        raise BadOption(f"--score {score!r}: use max or mean.")
    if k < 1:
        raise BadOption(f"-k {k}: give at least 1.")
    if isinstance(place_of(output), InStore):  # ranked on its local copy, uploaded beside it
        return _top_in_store(str(output), layers, k, score, memory, to, overwrite, progress, as_xarray)
    stored = Stored.read(output)
    names = stored.select(listed(layers))
    budget, place = parse_bytes(memory), Path(to) if to is not None else default_place(output)
    made_from = {"source": stored.identity(), "k": k, "score": score, "layers": names, "bins": BINS,
                 "sample": SAMPLE, "sampling": SAMPLING, "quantiles": list(QUANTILES)}
    held = None if overwrite else _held(place, made_from)
    if held is not None and held["k"] >= k and set(names) <= set(held["layers"]):
        log.info("%s ranks these layers already (%d images a unit): nothing to do.", place, held["k"])
        ranked = read_top(place, names)
    else:
        made_from = _grown(made_from, held)
        if held is not None:
            log.info("%s ranks %s (%d images a unit): ranking %s into it (%d images a unit).", place,
                     ", ".join(held["layers"]), held["k"], ", ".join(made_from["layers"]), made_from["k"])
        kept = read_top(place, held["layers"]) if held is not None and held["k"] == made_from["k"] else {}
        results = Results.open(place, made_from, stored.paths, stored.labels, stored.classes,
                               overwrite or held is not None)
        progress = progress or NoProgress()
        ranked = computed_into(results, progress, lambda: _compute(stored, made_from["layers"], made_from["k"],
                                                                   score, budget, results, progress, kept),
                               {"k": made_from["k"], "score": score, "layers": made_from["layers"]})
    ranked = {name: ranked[name].first(k) for name in names}
    if as_xarray:
        return {name: ranking.to_xarray(list(stored.paths)) for name, ranking in ranked.items()}
    return ranked


def _held(place: Path, made_from: dict) -> dict | None:
    """What the finished ranking at PLACE was made from, where it ranks the same output the same way (whatever its
    K and layers); None where there is none, or where an earlier featdump's method made it (ranked again).
    OutputExists where it ranks another output, or by another score."""
    before = made_from_of(place)
    if before is None:
        return None
    asked = sorted(key for key in ("source", "score") if before.get(key) != made_from[key])
    if asked:
        raise OutputExists(f"{str(place)!r} already exists, a ranking of other files or settings "
                           f"({', '.join(asked)} differ); pass --overwrite to replace it.")
    method = [key for key in made_from if key not in SERVES_SMALLER and before.get(key) != made_from[key]]
    if method:
        log.info("%s was ranked by an earlier featdump (its %s differ): ranked again.", place, ", ".join(method))
        return None
    return before


def _grown(made_from: dict, held: dict | None) -> dict:
    """MADE_FROM widened to serve what HELD (the ranking there) served too: the larger K, HELD's layers then the
    new ones."""
    if held is None:
        return made_from
    layers = [*held["layers"], *(name for name in made_from["layers"] if name not in held["layers"])]
    return {**made_from, "k": max(made_from["k"], held["k"]), "layers": layers}


def _top_in_store(url: str, layers, k: int, score: str, memory, to, overwrite: bool, progress, as_xarray: bool):
    """`top` of the finished output at URL: read from its copy on the local scratch disk (downloaded once, kept for
    a rerun), written to TO or, by default, beside the copy and then uploaded beside URL (URL.top.h5)."""
    local = place_of(url).local_copy()
    uploaded = to is None and place_of(url).takes_uploads
    if to is None and not uploaded:
        log.info("%s is on a web server, which takes no uploads: the ranking is written beside its local copy, %s "
                 "(or give -o).", url, written_to(url))
    ranked = top(local, layers, k=k, score=score, memory=memory, to=to, overwrite=overwrite, progress=progress,
                 as_xarray=as_xarray)
    if uploaded:
        remote.upload(default_place(local), default_place(url), Patience())
        log.info("Ranked %s into %s.", url, default_place(url))
    return ranked


def read_top(place: Path, names: list[str]) -> dict[str, Ranking]:
    """The rankings a finished TOP.h5 holds for NAMES."""
    with open_to_read(place) as h5file:
        return {name: Ranking(**{key: h5file[GROUP][name][key][:] for key in FIELDS}) for name in names}


def _compute(stored: Stored, names: list[str], k: int, score: str, budget: int, results: Results,
             progress: Progress, kept: dict[str, Ranking]) -> dict[str, Ranking]:
    """Each of NAMES ranked into RESULTS: those a killed pass committed read back, those KEPT (a finished ranking's
    layers being added to) committed as they are, the others computed."""
    for name, ranking in kept.items():
        if not results.has(GROUP, name):
            results.commit(GROUP, name, ranking.as_dict(), {"score": score, "k": k, "quantiles": np.array(QUANTILES)})
    done = {name: Ranking(**{key: results.read(f"{GROUP}/{name}", key) for key in FIELDS})
            for name in names if results.has(GROUP, name)}
    if done:
        log.info("Resuming: %d of %d layers ranked in %s already.", len(done), len(names), results.output)
    todo = [name for name in names if name not in done]
    progress.start(sum(stored.size(name) for name in todo) / 1e6, 0)  # megabytes, as each slab advances it
    for name in todo:
        ranking = rank_layer(stored, name, k, score, budget, progress)
        results.commit(GROUP, name, ranking.as_dict(), {"score": score, "k": k, "quantiles": np.array(QUANTILES)})
        done[name] = ranking
    return {name: done[name] for name in names}


def rank_layer(stored: Stored, name: str, k: int, score: str, budget: int, progress: Progress) -> Ranking:
    """LAYER NAME of STORED ranked, a slab of rows at a time, with its spectrum."""
    with stored.dataset(name) as dataset:
        shape, attributes = dataset.shape[1:], dict(dataset.attrs)
        row_bytes = int(np.prod(shape)) * 8  # as float64 scores are made from it, at most
        axis = channel_axis(shape, attributes)
        step = max(1, budget // max(1, 3 * row_bytes))
        log.info("Ranking %s: %d rows of %s, slabs of %d rows (%s).", name, stored.rows, tuple(shape), step,
                 human_bytes(step * row_bytes))
        spectrum = Spectrum(dataset, stored.rows, axis, score, step)
        best = _Kept(k, highest=True)
        least = _Kept(k, highest=False)
        for start, values, keys in _scored_slabs(dataset, stored.rows, step, axis, score):
            rows = np.arange(start, start + len(values), dtype=np.int64)
            best.add(keys, rows, unit_maps(values, axis) if score == "max" else None)
            least.add(keys, rows, None)
            spectrum.add(keys)
            progress.advance(values.nbytes / 1e6)
    return Ranking(best.rows, best.values.astype(np.float64), best.positions, least.rows,
                   least.values.astype(np.float64), spectrum.counts, spectrum.edges, *spectrum.quantiles())


def _scored_slabs(dataset, rows: int, step: int, axis: int | None, score: str):
    """(start, values, scores) of each slab of STEP rows of DATASET, SCORES its (units, rows) `unit_scores`, in a
    pipeline: the slab after next read on one thread (a direct read frees the GIL), the next one scored on another
    (numpy and torch free it too) while this one is ranked; into three buffers taken in turn (fresh memory each
    slab would cost as much to fault in as to read)."""
    starts = list(range(0, rows, step))
    shape = (min(rows, step), *dataset.shape[1:])
    buffers = [np.empty(shape, dtype=dataset.dtype) for _ in range(min(3, len(starts)))]

    def read(index: int) -> np.ndarray:
        start, stop = starts[index], min(rows, starts[index] + step)
        return read_span(dataset, start, stop, out=buffers[index % len(buffers)][:stop - start])

    def scored(reading) -> tuple[np.ndarray, np.ndarray]:
        values = reading.result()
        return values, units_by_rows(unit_scores(values, axis, score))

    with ThreadPoolExecutor(max_workers=1) as reader, ThreadPoolExecutor(max_workers=1) as scorer:
        readings = [reader.submit(read, index) for index in range(min(2, len(starts)))]
        scoring = scorer.submit(scored, readings[0]) if starts else None
        for index, start in enumerate(starts):
            values, scores = scoring.result()
            if index + 2 < len(starts):  # into the buffer of the slab ranked before this one
                readings.append(reader.submit(read, index + 2))
            if index + 1 < len(starts):
                scoring = scorer.submit(scored, readings[index + 1])
            yield start, values, scores


def units_by_rows(scores: np.ndarray) -> np.ndarray:
    """SCORES (rows, units) as a C-ordered (units, rows) array: torch's transposition, blocked and on every core
    (numpy's takes twice as long on 2,048 units; a top-k down the rows instead, three times the top-k's time)."""
    import torch  # for the ranking's arithmetic; `info` reads this module's names without it

    return torch.from_numpy(scores).t().contiguous().numpy()


class _Kept:
    """Each unit's K best rows so far (highest or lowest scores; ties: the lower row), and where the maxima of the
    highest lie."""

    def __init__(self, k: int, highest: bool):
        self.k, self.highest = k, highest
        self.rows = self.values = self.positions = None

    def add(self, scores: np.ndarray, rows: np.ndarray, maps: np.ndarray | None) -> None:
        """SCORES (units, rows) of ROWS merged into the kept: each unit's K best of the slab chosen first (a top-k,
        linear in the slab), then sorted with the kept; for those, where their maximum lies in MAPS
        (`unit_maps`; None: no position kept)."""
        units = scores.shape[0]
        chosen = _best_of_slab(scores, self.k, self.highest)
        values = np.take_along_axis(scores, chosen, axis=1)
        candidates = rows[chosen]
        if maps is not None and maps.shape[2] > 1:
            places = maps[chosen, np.arange(units)[:, None], :].argmax(axis=-1)
        else:
            places = np.full(chosen.shape, -1, dtype=np.int64)
        if self.rows is not None:
            values = np.concatenate([self.values, values], axis=1)
            candidates = np.concatenate([self.rows, candidates], axis=1)
            places = np.concatenate([self.positions, places], axis=1)
        order = np.lexsort((candidates, -values if self.highest else values), axis=-1)[:, :self.k]
        self.values = np.take_along_axis(values, order, axis=1)
        self.rows = np.take_along_axis(candidates, order, axis=1)
        self.positions = np.take_along_axis(places, order, axis=1)


def _best_of_slab(scores: np.ndarray, k: int, highest: bool) -> np.ndarray:
    """(units, K) indices into the slab of each unit's K highest (or lowest) SCORES (units, rows), as a stable sort
    of the slab would choose them: torch's top-k (on every core), except in a unit whose K-th and next scores are
    equal, or a slab holding NaN, where `_first_smallest` chooses (a tie goes to the lower row; NaN comes last)."""
    if scores.shape[1] <= k:
        return np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
    import torch  # for the ranking's arithmetic; `info` reads this module's names without it

    values, found = torch.topk(torch.from_numpy(scores), k + 1, dim=1, largest=highest, sorted=True)
    values = values.numpy()
    if np.isnan(values).any():  # top-k ranks NaN above every number: in the highest, or where few numbers are left
        return _first_smallest(-scores if highest else scores, k)
    chosen = found[:, :k].numpy().copy()
    tied = np.flatnonzero(values[:, k] == values[:, k - 1])
    if len(tied):
        chosen[tied] = _first_smallest(-scores[tied] if highest else scores[tied], k)
    return chosen


def _first_smallest(keys: np.ndarray, k: int) -> np.ndarray:
    """(units, K) indices, in slab order, of each unit's K smallest KEYS: those below the K-th smallest, then the
    first of those equal to it (the lower rows win a tie, as the reference's stable sort has it), then, where fewer
    than K are numbers, the first NaN rows. A unit at a time: memory of one unit's slab, not of all of them."""
    chosen = np.empty((len(keys), k), dtype=np.int64)
    for unit, row in enumerate(keys):
        kth = np.partition(row, k - 1)[k - 1]
        below = np.flatnonzero(row < kth)
        picked = np.concatenate([below, np.flatnonzero(row == kth)[:k - len(below)]])
        if len(picked) < k:  # a K-th that is NaN: every number, then the first NaN rows
            picked = np.concatenate([np.flatnonzero(~np.isnan(row)), np.flatnonzero(np.isnan(row))[:k]])[:k]
        chosen[unit] = np.sort(picked)
    return chosen
