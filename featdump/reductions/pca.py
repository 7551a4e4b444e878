"""PCA: the mean and top-K principal components of a layer over a fit set, computed exactly from the fit set's
activations staged on disk, with bounded memory; and the pca:K reduction that projects every image on them.

The fit reads the staged (N, D) rows in blocks: the mean first, then either the D x D covariance (when D <= N)
or the N x N Gram matrix of the centred rows (when D > N, the usual case for conv maps), both in float64;
an eigendecomposition of that matrix gives the components (for the Gram matrix, mapped back through the
rows) and their variances, equal to an SVD of the centred rows. Each component's largest entry is made
positive, so a fit is the same whoever computes it. Memory: the matrix (twice, for the eigensolver), the
components in float64 and two blocks of rows, kept under MEMORY_LIMIT (FEATDUMP_PCA_MEMORY_GB, default 4);
a fit that cannot is refused with the numbers.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import h5py
import numpy as np
import torch

from featdump.errors import UsageProblem
from featdump.reductions.record import Reduction, flat_in_memory_order

MEMORY_LIMIT = int(float(os.environ.get("FEATDUMP_PCA_MEMORY_GB", "4")) * 1024**3)


@dataclass
class PcaFit:
    """One layer's fit: MEAN (D,), COMPONENTS (K, D) with unit rows, their EXPLAINED_VARIANCE (K,), and the
    fit set's TOTAL_VARIANCE, size (IMAGES) and description (FITTED_ON)."""

    mean: np.ndarray
    components: np.ndarray
    explained_variance: np.ndarray
    total_variance: float
    images: int
    fitted_on: str
    method: str  # "covariance" (D x D) or "gram" (N x N)
    digest: str = ""  # what the fit was made from (model, layer, K, fit images): fits are reused only on a match
    skipped: list = field(default_factory=list)  # (path, why) of the fit images that could not be used

    def store(self, group: h5py.Group) -> None:
        """Write the fit into GROUP (/pca/<layer> of an output)."""
        group.create_dataset("mean", data=self.mean.astype(np.float32))
        group.create_dataset("components", data=self.components.astype(np.float32),
                             chunks=(1, *self.components.shape[1:]))
        group.create_dataset("explained_variance", data=self.explained_variance)
        group.attrs.update({"total_variance": self.total_variance, "images": self.images,
                            "fitted_on": self.fitted_on, "method": self.method, "fit_digest": self.digest})
        text = h5py.string_dtype()
        for name, column in (("skipped_paths", 0), ("skipped_reasons", 1)):
            group.create_dataset(name, data=np.array([entry[column] for entry in self.skipped], dtype=object),
                                 dtype=text)

    @classmethod
    def read(cls, group: h5py.Group) -> PcaFit:
        attrs = group.attrs
        skipped = list(zip(group["skipped_paths"].asstr()[:], group["skipped_reasons"].asstr()[:])) \
            if "skipped_paths" in group else []
        return cls(group["mean"][:], group["components"][:], group["explained_variance"][:],
                   float(attrs["total_variance"]), int(attrs["images"]), str(attrs["fitted_on"]), str(attrs["method"]),
                   str(attrs.get("fit_digest", "")), skipped)


def fit_memory(images: int, dim: int, k: int) -> tuple[int, str]:
    """(bytes at the least, method) of fitting K components of DIM values over IMAGES rows."""
    method = "covariance" if dim <= images else "gram"
    side = dim if method == "covariance" else images
    return 2 * side * side * 8 + k * dim * 8 + 2 * dim * 8, method


def check_fit_fits(layer_name: str, images: int, dim: int, k: int, limit: int = MEMORY_LIMIT,
                   skipped: int = 0) -> None:
    """UsageProblem, with the numbers, when K components of the layer cannot be fitted (too few images, or
    more memory than LIMIT). SKIPPED: fit images that could not be read (IMAGES are those that could)."""
    if k >= images:
        read = f"{images} that could be read ({skipped} skipped)" if skipped else f"{images}"
        raise UsageProblem(f"--reduce pca:{k} needs more fit images than components: the fit set has {read} "
                           f"(--pca-fit); use at least {k + 1}, or a smaller K.")
    if k > dim:
        raise UsageProblem(f"--reduce pca:{k}: layer {layer_name!r} has only {dim} values per image; choose K "
                           f"of at most {dim}.")
    needed, method = fit_memory(images, dim, k)
    if needed > limit:
        side = f"{dim} x {dim} covariance" if method == "covariance" else f"{images} x {images} Gram matrix"
        raise UsageProblem(
            f"The PCA fit of layer {layer_name!r} ({images} images x {dim} values, {k} components) needs about "
            f"{needed / 1024**3:.1f} GiB (the {side} twice, {k} components in float64), over the limit of "
            f"{limit / 1024**3:.1f} GiB (FEATDUMP_PCA_MEMORY_GB). Use fewer fit images, a smaller K, or srp:K.")


def fit(rows: h5py.Dataset, count: int, k: int, fitted_on: str, limit: int = MEMORY_LIMIT) -> PcaFit:
    """The PCA fit of the first COUNT rows (N, D) of ROWS, read in blocks that keep memory under LIMIT."""
    dim = math.prod(rows.shape[1:])
    needed, method = fit_memory(count, dim, k)
    block = int(max(1, min(count, (limit - needed) // (2 * dim * 8))))
    blocks = [(start, min(start + block, count)) for start in range(0, count, block)]

    def read(start: int, stop: int) -> np.ndarray:
        return rows[start:stop].reshape(stop - start, dim).astype(np.float64)

    mean = sum(read(start, stop).sum(axis=0) for start, stop in blocks) / count

    def centred(start: int, stop: int) -> np.ndarray:
        return read(start, stop) - mean

    solve = _from_covariance if method == "covariance" else _from_gram
    components, eigenvalues, scatter_trace = solve(blocks, centred, dim if method == "covariance" else count, k)
    largest = np.abs(components).argmax(axis=1)
    components *= np.sign(components[np.arange(k), largest])[:, None]
    return PcaFit(mean, components, eigenvalues / (count - 1), scatter_trace / (count - 1), count, fitted_on, method)


def _from_covariance(blocks, centred, dim: int, k: int):
    """(components, eigenvalues of the scatter matrix, its trace) from the D x D scatter of the centred rows."""
    scatter = np.zeros((dim, dim))
    for start, stop in blocks:
        values = centred(start, stop)
        scatter += values.T @ values
    eigenvalues, vectors = np.linalg.eigh(scatter)
    top = np.argsort(eigenvalues)[::-1][:k]
    _check_rank(eigenvalues[top], float(np.trace(scatter)), k)
    return vectors[:, top].T.copy(), eigenvalues[top], float(np.trace(scatter))


def _check_rank(eigenvalues: np.ndarray, total: float, k: int) -> None:
    if eigenvalues[-1] <= total * 1e-12:
        rank = int((eigenvalues > total * 1e-12).sum())
        raise UsageProblem(f"--reduce pca:{k}: the fit set's activations span only {rank} dimensions; "
                           f"choose K of at most {rank}.")


def _from_gram(blocks, centred, count: int, k: int):
    """(components, eigenvalues, trace) from the N x N Gram matrix of the centred rows (components mapped back
    through the rows: component j = rows^T u_j / sqrt(lambda_j))."""
    gram = np.zeros((count, count))
    for index, (start, stop) in enumerate(blocks):
        first = centred(start, stop)
        gram[start:stop, start:stop] = first @ first.T
        for other_start, other_stop in blocks[index + 1:]:
            product = first @ centred(other_start, other_stop).T
            gram[start:stop, other_start:other_stop] = product
            gram[other_start:other_stop, start:stop] = product.T
    total = float(np.trace(gram))
    eigenvalues, vectors = np.linalg.eigh(gram)
    top = np.argsort(eigenvalues)[::-1][:k]
    eigenvalues, vectors = eigenvalues[top], vectors[:, top]
    _check_rank(eigenvalues, total, k)
    components = None
    for start, stop in blocks:
        part = vectors[start:stop].T @ centred(start, stop)
        components = part if components is None else components + part
    return components / np.sqrt(eigenvalues)[:, None], eigenvalues, total


def projection(layer_name: str, shape: tuple[int, ...], k: int, fitted: PcaFit | None) -> Reduction:
    """The pca:K reduction of layer LAYER_NAME: each image's centred, flattened output on the fit's components."""
    dim = math.prod(shape)
    if fitted is None or fitted.components.shape != (k, dim):
        raise UsageProblem(f"--reduce pca:{k} of layer {layer_name!r} has no fit of {k} components of {dim} values.")
    mean = torch.from_numpy(np.ascontiguousarray(fitted.mean, dtype=np.float32))
    components = torch.from_numpy(np.ascontiguousarray(fitted.components, dtype=np.float32))
    placed: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def apply(batch: torch.Tensor) -> torch.Tensor:
        flat, order = flat_in_memory_order(batch)
        key = (flat.device, order is None)
        if key not in placed:
            placed[key] = ((mean, components) if order is None else (mean[order], components[:, order].contiguous()))
            placed[key] = tuple(tensor.to(flat.device) for tensor in placed[key])
        centre, axes = placed[key]
        return (flat.float() - centre) @ axes.T

    ratio = fitted.explained_variance / fitted.total_variance if fitted.total_variance else fitted.explained_variance
    attributes = {"pca_k": k, "pca_input_dim": dim, "pca_fit_images": fitted.images, "pca_fitted_on": fitted.fitted_on,
                  "pca_explained_variance_ratio": float(np.sum(ratio)), "pca_fit": f"/pca/{layer_name}"}
    return Reduction(f"pca:{k}", (k,), apply, attributes, device_bytes=(k + 1) * dim * 4, fit=fitted)
