"""Ridge: one fold's ridge fits (with an unpenalised intercept) for a grid of alphas, their efficient leave-one-out
errors on the fold's training rows, the alpha chosen by them, and the held-out rows' predictions; as scikit-learn's
RidgeCV (and RidgeClassifierCV on +-1 targets) fits the training rows, in float64 on any torch device.

    dual (a wide layer, D >= N: from the Gram matrix)      G^-1 = Q diag(1 / (lambda + alpha)) Q^T,
        Q, lambda the eigenvectors and values of the training rows' centred Gram plus 1 1^T, the intercept's
        direction (1 1^T's own) given weight 0; leave-one-out errors (G^-1 y) / diag(G^-1)
    primal (a narrow layer, D < N: from the covariance)    p = V^T (x - mean), V, s the eigenvectors and values
        of the centred covariance; hat = 1/n + sum_j p_j^2 / (s_j + alpha); fitted = mean(y) + p . c / (s + alpha),
        c = V^T X_c^T y_c; leave-one-out errors (y - fitted) / (1 - hat)

Both are exact rewritings of the same fit, so the two agree where both can run (the tests hold them to
scikit-learn's). The alpha chosen is the first of the grid with the least mean squared leave-one-out error over the
training rows and all targets (or per target), as RidgeCV's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from featdump.errors import BadOption


@dataclass
class FoldFit:
    """One fold's outcome: the alpha chosen (per target) and its held-out predictions."""

    alpha_index: torch.Tensor  # (T,) long: the chosen alpha's place in the grid, per target
    errors: torch.Tensor  # (A, T): mean squared leave-one-out error on the training rows
    predicted: torch.Tensor | None  # (m, T): the held-out rows' predictions (None until they are computed)


def choose(errors: torch.Tensor, per_target: bool) -> torch.Tensor:
    """(T,) the index of each target's alpha: the first with the least mean squared error ERRORS (A, T), over
    all targets unless PER_TARGET."""
    if per_target:
        return torch.argmin(errors, dim=0)  # the first of equal minima
    return torch.argmin(errors.mean(1)).expand(errors.shape[1]).clone()


def dual_fold(gram: torch.Tensor, train: torch.Tensor, test: torch.Tensor, targets: torch.Tensor,
              alphas: torch.Tensor, per_target: bool) -> FoldFit:
    """Ridge on the rows TRAIN of a layer whose Gram over all rows is GRAM (N x N, any centring), for every alpha of
    ALPHAS; the chosen alpha's predictions for the rows TEST. TARGETS: (N, T) float64."""
    train_gram = gram[train][:, train]
    row_means = train_gram.mean(1)
    grand_mean = row_means.mean()
    centred = train_gram - row_means[:, None] - row_means[None, :] + grand_mean
    del train_gram
    centred += 1.0  # the intercept's direction, 1 1^T: an eigenvector of its own (value n) to leave unpenalised
    values, vectors = torch.linalg.eigh(centred)
    del centred
    intercept = int(torch.argmax(torch.abs(vectors.sum(0))))  # the column most aligned with 1 / sqrt(n)
    values = values.clamp(min=0.0)
    mean_target = targets[train].mean(0)
    projected = vectors.T @ (targets[train] - mean_target)  # Q^T y_c  (n, T)
    squares = vectors * vectors
    errors = torch.empty(len(alphas), targets.shape[1], dtype=torch.float64, device=gram.device)
    for index, alpha in enumerate(alphas.tolist()):
        weights = _weights(values, alpha, intercept)
        inverse_diagonal = squares @ weights
        dual = vectors @ (weights[:, None] * projected)
        errors[index] = ((dual / inverse_diagonal[:, None]) ** 2).mean(0)
    chosen = choose(errors, per_target)
    cross = gram[test][:, train]  # the held-out rows against the training ones, centred on the training mean
    cross = cross - cross.mean(1, keepdim=True) - row_means[None, :] + grand_mean
    cross_vectors = cross @ vectors
    del cross
    predicted = torch.empty(len(test), targets.shape[1], dtype=torch.float64, device=gram.device)
    for index in torch.unique(chosen).tolist():
        columns = chosen == index
        weights = _weights(values, float(alphas[index]), intercept)
        predicted[:, columns] = mean_target[columns] + cross_vectors @ (weights[:, None] * projected[:, columns])
    return FoldFit(chosen, errors, predicted)


def _weights(values: torch.Tensor, alpha: float, intercept: int) -> torch.Tensor:
    weights = 1.0 / (values + alpha)
    weights[intercept] = 0.0
    return weights


@dataclass
class PrimalFold:
    """A fold's fit in the eigenbasis of its training rows' covariance: what its second pass needs."""

    count: int  # n, its training rows
    mean: torch.Tensor  # (D,) the training rows' mean
    mean_target: torch.Tensor  # (T,)
    values: torch.Tensor  # (D,) s, the covariance's eigenvalues
    vectors: torch.Tensor  # (D, D) V
    coefficients: torch.Tensor  # (D, T) c = V^T X_c^T y_c

    @classmethod
    def fit(cls, count: int, mean: torch.Tensor, mean_target: torch.Tensor, covariance: torch.Tensor,
            cross: torch.Tensor) -> PrimalFold:
        """From the training rows' COUNT, means, centred covariance (D x D) and CROSS = X_c^T y_c (D x T)."""
        values, vectors = torch.linalg.eigh(covariance)
        return cls(count, mean, mean_target, values.clamp(min=0.0), vectors, vectors.T @ cross)

    def project(self, rows: torch.Tensor) -> torch.Tensor:
        """(b, D) ROWS in the eigenbasis: V^T (x - mean)."""
        return (rows - self.mean) @ self.vectors

    def fitted(self, projected: torch.Tensor, alphas: torch.Tensor) -> torch.Tensor:
        """(b, A, T) the fit's values at rows PROJECTED (b, D) for every alpha of ALPHAS: a training row's fitted
        value, a held-out row's prediction."""
        shrink = 1.0 / (self.values[:, None] + alphas[None, :])  # (D, A)
        scaled = (self.coefficients[:, None, :] * shrink[:, :, None]).reshape(len(self.values), -1)  # (D, A T)
        return self.mean_target + (projected @ scaled).reshape(len(projected), len(alphas), -1)

    def loo_squared_errors(self, projected: torch.Tensor, targets: torch.Tensor, fitted: torch.Tensor,
                           alphas: torch.Tensor, training: torch.Tensor) -> torch.Tensor:
        """(A, T) the sums over the TRAINING rows (a (b,) bool mask) of PROJECTED (b, D) of their squared
        leave-one-out errors, from their FITTED values (b, A, T) at ALPHAS and their TARGETS (b, T)."""
        shrink = 1.0 / (self.values[:, None] + alphas[None, :])
        hat = 1.0 / self.count + (projected * projected) @ shrink  # (b, A)
        errors = (targets[:, None, :] - fitted) / (1.0 - hat)[:, :, None]
        errors *= errors
        return (training.to(errors.dtype) @ errors.reshape(len(errors), -1)).reshape(len(alphas), -1)

    def weights(self, alphas: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """(D, T) the ridge weights on x - mean for each target's CHOSEN alpha: V diag(1 / (s + alpha)) c."""
        return self.vectors @ (self.coefficients / (self.values[:, None] + alphas[chosen][None, :]))


def parse_alphas(alphas) -> np.ndarray:
    """The grid from '0.1,1,10', '1e-2:1e6:9' (log-spaced, ends included) or numbers; BadOption otherwise."""
    if isinstance(alphas, str):
        text = alphas.strip()
        try:
            if ":" in text:
                low, high, count = text.split(":")
                grid = np.logspace(np.log10(float(low)), np.log10(float(high)), int(count))
            else:
                grid = np.array([float(part) for part in text.split(",") if part.strip()])
        except ValueError:
            grid = np.array([])
    else:
        grid = np.asarray(list(np.atleast_1d(alphas)), dtype=np.float64)
    if not len(grid) or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
        raise BadOption(f"--alphas {alphas!r}: give positive numbers, as 0.1,1,10 or 1e-2:1e6:9 (from, to, how many, "
                        "log-spaced).")
    return grid
