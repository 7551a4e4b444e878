"""A layer's spectrum (`units.top`'s pass keeps it): each unit's histogram over every row, in BINS bins between
the lowest and highest score of a seeded sample of SAMPLE rows, each drawn on its own and read first, and a bin below
and above them for the rest; and the sample's images at QUANTILES."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from featdump.output.direct import DirectRows
from featdump.output.views import read_span, sources
from featdump.units.scores import unit_scores

BINS = 32  # a histogram's bins between the sample's lowest and highest score (and one each side for the rest)
SAMPLE = 1024  # rows drawn (seeded, each on its own) to place the bins and the quantile images
SAMPLING = "rows"  # ... drawn one by one (a file sorted by class is no cluster sample); recorded with the ranking
SAMPLE_READERS = 16  # ... this many rows read at once (direct reads: a disk serves them together)
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
ROUNDING = 1e-9  # a score this near (relatively) the sample's lowest or highest is in the first or last bin


def sample_rows(rows: int) -> np.ndarray:
    """The SAMPLE rows (all of them where fewer) the spectrum is placed by: each drawn on its own, seeded, so that
    the sample does not follow the file's order (a file sorted by class is no cluster sample); sorted."""
    return np.sort(np.random.default_rng(0).choice(rows, size=min(rows, SAMPLE), replace=False)).astype(np.int64)


def _sample_scores(dataset, chosen: np.ndarray, axis: int | None, score: str, step: int) -> np.ndarray:
    """(sample rows, units) scores of the rows CHOSEN, read SAMPLE_READERS at a time (reads a disk serves at
    once; directly where the layout allows, the chunks' places looked up once), consecutive rows in one read; no
    more rows held than a slab's STEP."""
    at_once = max(1, min(SAMPLE_READERS, step))
    longest = max(1, step // at_once)
    runs = [part for run in np.split(chosen, np.flatnonzero(np.diff(chosen) != 1) + 1)
            for part in np.split(run, range(longest, len(run), longest))]
    direct = None if sources(dataset) else DirectRows.of(dataset)

    def read(run: np.ndarray) -> np.ndarray:
        start, stop = int(run[0]), int(run[-1]) + 1
        found = direct.read(start, stop) if direct is not None else None
        return found if found is not None else read_span(dataset, start, stop)

    scores = []
    with ThreadPoolExecutor(max_workers=at_once) as readers:
        for group in range(0, len(runs), at_once):
            scores.extend(unit_scores(values, axis, score) for values in readers.map(read, runs[group:group + at_once]))
    return np.concatenate(scores)


class Spectrum:
    """A layer's units over every row: each unit's histogram (BINS bins between its lowest and highest score in a
    seeded sample of SAMPLE rows, read first, and a bin below and above for the rest) and its sample's images at
    QUANTILES (ties: the lower row)."""

    def __init__(self, dataset, rows: int, axis: int | None, score: str, step: int):
        self.sample_rows = sample_rows(rows)
        self.sample = _sample_scores(dataset, self.sample_rows, axis, score, step).T.astype(np.float64)
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a unit all NaN in the sample: its bins from 0 to 1
            low, high = np.nanmin(self.sample, axis=1), np.nanmax(self.sample, axis=1)
        low = np.where(np.isnan(low), 0.0, low)
        high = np.where(high > low, high, low + 1.0)
        self.edges = low[:, None] + (high - low)[:, None] * np.linspace(0.0, 1.0, BINS + 1)
        self.counts = np.zeros((len(low), BINS + 2), dtype=np.int64)

    def add(self, scores: np.ndarray) -> None:
        """SCORES (units, rows) counted into each unit's bins, a few million at a time."""
        step = max(1, 2**20 // max(1, len(scores)))
        low, high = self.edges[:, :1], self.edges[:, -1:]
        width = (high - low) / BINS
        slack = ROUNDING * (np.abs(low) + np.abs(high))  # a mean summed in another slab's shape rounds otherwise
        floor, ceiling = low - slack, high + slack
        for start in range(0, scores.shape[1], step):
            part = scores[:, start:start + step]
            missing = np.isnan(part) if np.isnan(part).any() else None  # NaN: in no bin
            inside = np.subtract(part, low)
            inside /= width
            np.floor(inside, out=inside)
            np.clip(inside, 0, BINS - 1, out=inside)
            if missing is not None:
                inside[missing] = 0
            places = inside.astype(np.int64) + 1  # bins 1..BINS; 0 below the sample's lowest, BINS + 1 above
            places[part < floor] = 0
            places[part > ceiling] = BINS + 1
            places += np.arange(len(scores))[:, None] * (BINS + 2)  # each unit's own bins
            counted = places.ravel() if missing is None else places[~missing]
            self.counts += np.bincount(counted, minlength=self.counts.size).reshape(self.counts.shape)

    def quantiles(self) -> tuple[np.ndarray, np.ndarray]:
        """(units, len(QUANTILES)) rows and scores: the sample's order statistic at each quantile."""
        order = np.lexsort((np.broadcast_to(self.sample_rows, self.sample.shape), self.sample), axis=-1)
        at = np.round(np.array(QUANTILES) * (self.sample.shape[1] - 1)).astype(np.int64)
        picked = order[:, at]
        return self.sample_rows[picked], np.take_along_axis(self.sample, picked, axis=1)
