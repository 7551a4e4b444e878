"""How sure a probe's accuracies are: each layer's held-out accuracy with its 95% interval (Wilson's score interval
over the test images), and McNemar's exact test between two layers on the same held-out images (the images one
gets right and the other wrong: a binomial of them at one half), corrected for the number of pairs (Bonferroni)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054  # the normal's 97.5% point


@dataclass(frozen=True)
class Paired:
    """McNemar's test of two layers: the images only FIRST gets right, only SECOND gets right, p and p corrected."""

    first: str
    second: str
    only_first: int
    only_second: int
    p: float
    p_corrected: float


def correct(predicted: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(N,) whether each held-out prediction (N, classes: decision values, classes ascending) names its label."""
    return np.argmax(predicted, axis=1) == np.asarray(labels)


def wilson(right: int, total: int) -> tuple[float, float]:
    """The 95% Wilson score interval of an accuracy of RIGHT out of TOTAL."""
    if total == 0:
        return float("nan"), float("nan")
    share = right / total
    middle = (share + Z95 ** 2 / (2 * total)) / (1 + Z95 ** 2 / total)
    half = Z95 * np.sqrt(share * (1 - share) / total + Z95 ** 2 / (4 * total ** 2)) / (1 + Z95 ** 2 / total)
    return float(middle - half), float(middle + half)


def mcnemar(first: np.ndarray, second: np.ndarray) -> tuple[int, int, float]:
    """(images only FIRST gets right, only SECOND, the exact two-sided p) of two layers' correctness."""
    from scipy.stats import binomtest

    only_first, only_second = int((first & ~second).sum()), int((~first & second).sum())
    if only_first + only_second == 0:
        return 0, 0, 1.0
    return only_first, only_second, float(binomtest(only_first, only_first + only_second, 0.5).pvalue)


def paired_tests(names: list[str], rights: list[np.ndarray]) -> list[Paired]:
    """McNemar's test of every pair of layers (their correctness RIGHTS), Bonferroni-corrected over the pairs."""
    pairs = [(first, second) for first in range(len(names)) for second in range(first + 1, len(names))]
    tested = [mcnemar(rights[first], rights[second]) for first, second in pairs]
    return [Paired(names[first], names[second], only_first, only_second, p, min(1.0, p * len(pairs)))
            for (first, second), (only_first, only_second, p) in zip(pairs, tested)]
