"""How sure a score is, from its bootstrap: a test of each score above zero and tests between every pair, as
rsatoolbox's `t_test_0` and `t_tests` make them (a t-test on the bootstrap's mean and covariance), corrected for
the number of pairs (Bonferroni, or Benjamini-Hochberg's FDR). `compare` (over subjects and images) and the
encoding models' regions (`readout.bounds`, over images) use them."""

from __future__ import annotations

import numpy as np


def zero_tests(evaluations: np.ndarray, dof: int) -> np.ndarray:
    """Each layer's one-sided p of a score above 0: a t-test of the bootstrap's mean over its variance (rsatoolbox's
    `t_test_0`); NaN without a bootstrap."""
    from scipy import stats

    if len(evaluations) < 2:
        return np.full(evaluations.shape[1], np.nan)
    means, variances = np.nanmean(evaluations, axis=0), np.var(evaluations, axis=0, ddof=1)
    return 1 - stats.t.cdf(means / np.sqrt(np.maximum(variances, np.finfo(float).eps)), dof)


def pair_tests(names: list[str], evaluations: np.ndarray, dof: int, fdr: bool) -> list[dict]:
    """Every pair of layers: the difference of their bootstrap means, its two-sided p (rsatoolbox's `t_tests`: the
    bootstrap covariance of the difference), and p corrected for the number of pairs (Bonferroni, or FDR)."""
    from scipy import stats

    if len(evaluations) < 2 or len(names) < 2:
        return []
    means, covariance = np.nanmean(evaluations, axis=0), np.atleast_2d(np.cov(evaluations.T))
    pairs = []
    for first in range(len(names) - 1):
        for second in range(first + 1, len(names)):
            variance = covariance[first, first] + covariance[second, second] - 2 * covariance[first, second]
            difference = float(means[first] - means[second])
            t = difference / np.sqrt(max(variance, np.finfo(float).eps))
            pairs.append({"first": names[first], "second": names[second], "difference": difference,
                          "p": float(2 * (1 - stats.t.cdf(abs(t), dof)))})
    found = [pair["p"] for pair in pairs]
    corrected = fdr_adjusted(found) if fdr else [min(1.0, p * len(pairs)) for p in found]
    for pair, p in zip(pairs, corrected):
        pair.update(p_corrected=float(p), correction="fdr" if fdr else "bonferroni", significant=bool(p < 0.05))
    return pairs


def fdr_adjusted(p_values: list[float]) -> np.ndarray:
    """Benjamini-Hochberg's adjusted p values."""
    p = np.asarray(p_values)
    order = np.argsort(p)
    ranked = p[order] * len(p) / np.arange(1, len(p) + 1)
    adjusted = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty_like(p)
    out[order] = np.minimum(adjusted, 1.0)
    return out
