"""How two sets of RDMs are compared, as rsatoolbox compares them (`rsatoolbox.rdm.compare`, `util.pooling.pool_rdm`,
`inference.boot_noise_ceiling`), on their vectors (the upper triangle, row by row; NaN where a pair is no pair, as
a resample's repeated image makes it, left out of every comparison):

    corr      Pearson's r of the dissimilarities (the mean taken out, then the cosine)
    spearman  Pearson's r of their ranks (ties averaged)
    tau-a     Kendall's tau without the ties' adjustment of its denominator
    cosine    the cosine of the angle between them
    corr_cov, cosine_cov   corr and cosine whitened by the dissimilarities' covariance (images' patterns
              independent, of equal variance: rsatoolbox's sigma_k left out): the cosine of the RDMs' double-
              centred second-moment matrices, the mean dissimilarity first taken out for corr_cov

The noise ceiling of a set of data RDMs (one a subject): its upper bound the mean over subjects of the comparison
of each with the pool of all (the mean RDM in the method's own units: z-scored for corr and corr_cov, normalised
for cosine and cosine_cov, ranked for spearman and tau-a), its lower bound the same with the pool of the
others."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from featdump.analysis.choices import COMPARISONS

METHODS = COMPARISONS
WHITENED = ("corr_cov", "cosine_cov")
BLOCK = 1 << 20  # pairs at a time where two RDMs' vectors are compared in blocks


def compared(first: np.ndarray, second: np.ndarray, method: str) -> np.ndarray:
    """(len(FIRST), len(SECOND)) comparisons by METHOD of the vectors FIRST and SECOND (each (RDMs, pairs)); a
    pair NaN in any RDM is left out of all."""
    if len(first) == len(second) == 1 and method in ("corr", "cosine"):
        return np.array([[_vector_cosine(first[0], second[0], centred=method == "corr")]])
    kept = ~(np.isnan(first).any(axis=0) | np.isnan(second).any(axis=0))
    if method in WHITENED:
        return _cosine(_whitened(first, kept, method), _whitened(second, kept, method))
    if not kept.all():  # (else no copy: an RDM of 10,000 images is 400 MB a vector)
        first, second = first[:, kept], second[:, kept]
    if method == "tau-a":
        return np.array([[_tau_a(one, other) for other in second] for one in first])
    if method == "spearman":
        first, second = _ranked(first), _ranked(second)
    if method in ("corr", "spearman"):
        first = first - first.mean(axis=1, keepdims=True)
        second = second - second.mean(axis=1, keepdims=True)
    return _cosine(first, second)


def _in_pool_units(vector: np.ndarray, method: str) -> np.ndarray:
    """A subject's VECTOR in the units METHOD's pool averages (rsatoolbox's `pool_rdm`, as its `boot_noise_ceiling`
    pools: corr_cov's and cosine_cov's as corr's and cosine's): z-scored, normalised or ranked; NaN kept."""
    method = method.removesuffix("_cov")
    if method == "cosine":
        return vector / np.sqrt(_kept_mean(vector, squared=True))
    if method == "corr":
        centred = vector - _kept_mean(vector)
        centred /= np.sqrt(_kept_mean(centred, squared=True))
        return centred
    return _ranked_with_nan(vector)


def _kept_mean(vector: np.ndarray, squared: bool = False) -> float:
    """The mean of VECTOR's numbers (SQUARED: of their squares), NaN left out, a block at a time (numpy's nanmean
    copies the vector whole)."""
    total, count = 0.0, 0
    for start in range(0, len(vector), BLOCK):
        block = vector[start:start + BLOCK]
        kept = ~np.isnan(block)
        if not kept.all():
            block = block[kept]
        total += float(block @ block) if squared else float(block.sum())
        count += len(block)
    return total / count if count else np.nan


def _vector_cosine(one: np.ndarray, other: np.ndarray, centred: bool) -> float:
    """The cosine of two vectors (CENTRED: less their means: Pearson's r) over the pairs neither is NaN at, a block
    of pairs at a time (views): no centred copy of either (an RDM of 10,000 images is a 400 MB vector)."""
    def blocks():
        return (slice(start, start + BLOCK) for start in range(0, len(one), BLOCK))

    return cosines_in_blocks(blocks, one, [other], centred)[0]


def cosines_in_blocks(places: Callable, one: np.ndarray, others: list[np.ndarray], centred: bool) -> list[float]:
    """The cosine (CENTRED: less the means: Pearson's r) of ONE with each of OTHERS over the pairs PLACES() yields a
    block at a time (slices, or a resample's places: `data_rdms.resampled_places`, none of its vectors held), read
    twice (the means, then the centred products), each block of ONE read once for all; a pair NaN in either left
    out; 0 where either is all zeros."""
    sums = np.zeros((len(others), 3))  # per other: ONE's sum, its sum, the pairs kept
    for index, first, second in _kept_blocks(places, one, others):
        sums[index] += first.sum(), second.sum(), len(first)
    counts = np.maximum(sums[:, 2], 1)
    means = sums[:, :2] / counts[:, None] if centred else np.zeros((len(others), 2))
    products = np.zeros((len(others), 3))  # per other: the dot product, ONE's squared norm, its
    for index, first, second in _kept_blocks(places, one, others):
        first, second = first - means[index, 0], second - means[index, 1]
        products[index] += first @ second, first @ first, second @ second
    return [float(dot / np.sqrt(norm_one) / np.sqrt(norm_other)) if norm_one > 0 and norm_other > 0 else 0.0
            for dot, norm_one, norm_other in products]


def _kept_blocks(places: Callable, one: np.ndarray, others: list[np.ndarray]):
    """(which of OTHERS, ONE's values, its values) at each block of PLACES(), as float64, the pairs NaN in either
    left out."""
    for block in places():
        first = one[block].astype(np.float64, copy=False)
        missing = np.isnan(first)
        for index, other in enumerate(others):
            second = other[block].astype(np.float64, copy=False)
            kept = ~(missing | np.isnan(second))
            yield (index, first, second) if kept.all() else (index, first[kept], second[kept])


def _pool(mean: np.ndarray, method: str) -> np.ndarray:
    """(1, pairs): the pool of the subjects whose mean in pool units is MEAN (NaN where any of them is; changed in
    place)."""
    if method.removesuffix("_cov") == "corr":
        mean -= np.nanmin(mean)
        mean += 0.01
    return mean[None]


def _whitened(vectors: np.ndarray, kept: np.ndarray, method: str) -> np.ndarray:
    """(RDMs, N * N): each of VECTORS' RDMs (its KEPT pairs; the mean taken out first for corr_cov) as its
    double-centred second moment G = -D / 2 less its rows' and columns' effects, fitted over the kept pairs as
    rsatoolbox's `_cov_weighting` fits them, flattened: their dot products are the whitened inner products."""
    values = vectors[:, kept]
    if method == "corr_cov":
        values = values - values.mean(axis=1, keepdims=True)
    size = images_of(vectors.shape[1])
    rows, columns = np.triu_indices(size, k=1)
    rows, columns = rows[kept], columns[kept]
    linked = np.zeros((size, size))
    linked[rows, columns] = linked[columns, rows] = 1.0
    moments = np.zeros((len(values), size, size))
    moments[:, rows, columns] = moments[:, columns, rows] = -0.5 * values
    system = 0.5 * (linked + np.diag(linked.sum(axis=1))) + np.eye(size)
    effects = np.linalg.solve(system, moments.sum(axis=2).T).T
    centred = (moments - 0.5 * (effects[:, :, None] + effects[:, None, :])) * linked
    centred[:, np.arange(size), np.arange(size)] = -effects
    return centred.reshape(len(values), -1)


def images_of(pairs: int) -> int:
    """N, the images of an RDM of PAIRS pairs (N (N - 1) / 2)."""
    return int(round((1 + np.sqrt(1 + 8 * pairs)) / 2))


def noise_ceiling(subject: Callable[[int], np.ndarray], subjects: int, method: str) -> tuple[float, float]:
    """(lower, upper) bounds of the noise ceiling of SUBJECTS data RDMs (SUBJECT(index): one's vector, asked for
    twice, so that one subject's is in memory at a time): each subject compared with the pool of the others, and
    with the pool of all, averaged over subjects."""
    pool = _PoolSum()
    for index in range(subjects):
        pool.add(_in_pool_units(subject(index), method))
    whole = _pool(pool.mean(), method)
    lower, upper = [], []
    for index in range(subjects):
        vector = subject(index)
        others = _pool(pool.mean(without=_in_pool_units(vector, method)), method)
        lower.append(compared(others, vector[None], method)[0, 0])
        del others  # (each held no longer than it is used: an RDM of 10,000 images is a 400 MB vector)
        upper.append(compared(whole, vector[None], method)[0, 0])
        del vector
    return float(np.mean(lower)), float(np.mean(upper))


class _PoolSum:
    """The sum of the subjects' vectors in pool units, and at each pair how many are NaN there: the mean of all
    of them, or of all but one (NaN where one of those is)."""

    def __init__(self):
        self.total = self.missing = None
        self.count = 0

    def add(self, units: np.ndarray) -> None:
        """UNITS (this sum's to change: its NaN made 0) added."""
        missing = np.isnan(units)
        if missing.any():
            self.missing = missing.astype(np.int32) if self.missing is None else self.missing + missing
            units[missing] = 0.0
        if self.total is None:
            self.total = units
        else:
            self.total += units
        self.count += 1

    def mean(self, without: np.ndarray | None = None) -> np.ndarray:
        """The mean of all the vectors added, or of all but WITHOUT (one of them, in pool units; its buffer made
        the mean's: one vector fewer held)."""
        count, missing = self.count, self.missing
        if without is None:
            mean = self.total / count
        else:
            unknown = np.isnan(without)
            mean = np.subtract(self.total, without, out=without)
            mean[unknown] = self.total[unknown]
            mean /= count - 1
            if missing is not None:
                missing = missing - unknown
        if missing is not None:
            mean[missing > 0] = np.nan
        return mean


def _cosine(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """All cosines between the rows of FIRST and SECOND; 0 where a row is all zeros."""
    first_norms = np.sqrt(np.einsum("ij,ij->i", first, first))
    second_norms = np.sqrt(np.einsum("ij,ij->i", second, second))
    cosines = np.einsum("ij,kj->ik", first, second)
    with np.errstate(invalid="ignore", divide="ignore"):
        cosines = cosines / first_norms[:, None] / second_norms[None, :]
    return np.where(np.outer(first_norms > 0, second_norms > 0), cosines, 0.0)


def _ranked(vectors: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(vectors, axis=1)


def _ranked_with_nan(vector: np.ndarray) -> np.ndarray:
    """VECTOR's ranks (ties averaged) with its NaN kept where they are."""
    from scipy.stats import rankdata

    ranks = np.full(vector.shape, np.nan)
    kept = ~np.isnan(vector)
    ranks[kept] = rankdata(vector[kept])
    return ranks


def _tau_a(one: np.ndarray, other: np.ndarray) -> float:
    """Kendall's tau-a of two vectors: (concordant - discordant) pairs over all pairs, from scipy's tau-b and the
    ties of each (tau-b's denominator is the pairs untied in each)."""
    from scipy.stats import kendalltau

    size = len(one)
    total = size * (size - 1) // 2
    tau_b = kendalltau(one, other, variant="b").statistic
    if not np.isfinite(tau_b):  # one of them constant: no concordance either way
        return 0.0
    untied = np.sqrt(float(total - _tied_pairs(one)) * float(total - _tied_pairs(other)))
    return float(min(1.0, max(-1.0, tau_b * untied / total)))


def _tied_pairs(vector: np.ndarray) -> int:
    counts = np.unique(vector, return_counts=True)[1].astype(np.int64)
    return int((counts * (counts - 1) // 2).sum())
