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

import numpy as np

from featdump.analysis.choices import COMPARISONS

METHODS = COMPARISONS
WHITENED = ("corr_cov", "cosine_cov")


def upper_triangle(matrices: np.ndarray) -> np.ndarray:
    """(RDMs, pairs) vectors of (RDMs, N, N) MATRICES: each upper triangle (above the diagonal), row by row."""
    rows, columns = np.triu_indices(matrices.shape[-1], k=1)
    return matrices[:, rows, columns]


def compared(first: np.ndarray, second: np.ndarray, method: str) -> np.ndarray:
    """(len(FIRST), len(SECOND)) comparisons by METHOD of the vectors FIRST and SECOND (each (RDMs, pairs)); a
    pair NaN in any RDM is left out of all."""
    kept = ~(np.isnan(first).any(axis=0) | np.isnan(second).any(axis=0))
    if method in WHITENED:
        return _cosine(_whitened(first, kept, method), _whitened(second, kept, method))
    first, second = first[:, kept], second[:, kept]
    if method == "tau-a":
        return np.array([[_tau_a(one, other) for other in second] for one in first])
    if method == "spearman":
        first, second = _ranked(first), _ranked(second)
    if method in ("corr", "spearman"):
        first = first - first.mean(axis=1, keepdims=True)
        second = second - second.mean(axis=1, keepdims=True)
    return _cosine(first, second)


def pooled(vectors: np.ndarray, method: str) -> np.ndarray:
    """(1, pairs): the RDM of VECTORS' pool that METHOD compares best with them (rsatoolbox's `pool_rdm`, as its
    `boot_noise_ceiling` pools: corr_cov's and cosine_cov's pools are corr's and cosine's)."""
    method = method.removesuffix("_cov")
    if method == "cosine":
        vectors = vectors / np.sqrt(np.nanmean(vectors ** 2, axis=1, keepdims=True))
    elif method == "corr":
        vectors = vectors - np.nanmean(vectors, axis=1, keepdims=True)
        vectors = vectors / np.nanstd(vectors, axis=1, keepdims=True)
    else:
        vectors = np.array([_ranked_with_nan(vector) for vector in vectors])
    pool = _nan_mean(vectors)
    return pool - np.nanmin(pool) + 0.01 if method == "corr" else pool


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


def noise_ceiling(vectors: np.ndarray, method: str) -> tuple[float, float]:
    """(lower, upper) bounds of the noise ceiling of the data RDMs VECTORS (a subject each): each subject compared
    with the pool of the others, and with the pool of all, averaged over subjects."""
    whole = pooled(vectors, method)
    lower, upper = [], []
    for subject in range(len(vectors)):
        others = np.delete(vectors, subject, axis=0)
        lower.append(np.mean(compared(pooled(others, method), vectors[subject:subject + 1], method)))
        upper.append(np.mean(compared(whole, vectors[subject:subject + 1], method)))
    return float(np.mean(lower)), float(np.mean(upper))


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


def _nan_mean(vectors: np.ndarray) -> np.ndarray:
    """(1, pairs): the mean of VECTORS over the pairs the first one has (NaN elsewhere)."""
    kept = ~np.isnan(vectors[0])
    mean = np.full((1, vectors.shape[1]), np.nan)
    mean[0, kept] = vectors[:, kept].mean(axis=0)
    return mean


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
