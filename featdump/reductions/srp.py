"""SRP: a very sparse random projection (Li, Hastie & Church, 2006) of each image's flattened output to K values.

The matrix R (D x K) is a pure function of (seed, layer name, D, K), the same on every machine and device,
so resumed runs, shards and later runs project alike, and anyone can rebuild it with `srp_matrix`:

    stored_row == torch.flatten(output_of_one_image) @ featdump.srp_matrix(seed, layer, D, K)

Each input coordinate feeds exactly c = max(1, round(K / sqrt(D))) of the K outputs, one drawn in each of c
equal blocks of them (so the c are distinct), with a random sign; every nonzero is +-1/sqrt(c). The density is
c/K, about 1/sqrt(D), and E ||x R||^2 = ||x||^2 exactly, so squared distances are kept in expectation
(Johnson-Lindenstrauss). The random numbers are numpy's PCG64 raw 64-bit stream (a fixed algorithm, unlike
its samplers) seeded with SHA-256 of (seed, layer, D, K). The projection accumulates in float32 on the device.

`countsketch:K` is the same with c = 1 (each input feeds one output, with a random sign, weight 1: a count
sketch, Charikar et al. 2002): squared distances are kept in expectation too (as tightly as SRP's on dense
activations; more loosely where a few coordinates hold the mass), and it costs 1/c of SRP's scattered
additions (which, at about 3 G/s on 2 CPU cores, are what SRP costs on a CPU).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from featdump.errors import UsageProblem
from featdump.reductions.record import Reduction, flat_in_memory_order


def nonzeros_per_input(dim: int, k: int) -> int:
    """c: how many of the K outputs each of the DIM inputs feeds."""
    return max(1, min(k, round(k / math.sqrt(dim))))


def srp_columns(seed: int, layer: str, dim: int, k: int, method: str = "srp") -> np.ndarray:
    """(c, DIM) int64: for each input, its c output columns (c = 1 for a count sketch), each plus K where the entry
    is negative."""
    count = nonzeros_per_input(dim, k) if method == "srp" else 1
    digest = hashlib.sha256(f"featdump-{method}\0{seed}\0{layer}\0{dim}\0{k}".encode()).digest()
    raw = np.random.PCG64(int.from_bytes(digest[:16], "little")).random_raw(count * dim).reshape(count, dim)
    starts = np.array([block * k // count for block in range(count + 1)], dtype=np.uint64)
    sizes = (starts[1:] - starts[:-1]).reshape(count, 1)
    columns = starts[:-1].reshape(count, 1) + (raw >> np.uint64(1)) % sizes
    negative = (raw & np.uint64(1)).astype(bool)
    return (columns + negative * np.uint64(k)).astype(np.int64)


def srp_matrix(seed: int, layer: str, dim: int, k: int, method: str = "srp") -> torch.Tensor:
    """The (DIM, K) sparse float32 matrix that `--reduce srp:K[:SEED]` (METHOD 'countsketch': `countsketch:K`)
    applies to layer LAYER (its dataset name, e.g. "layer2" or "layer1.0.relu:2") whose flattened per-image output
    has DIM values."""
    columns = srp_columns(seed, layer, dim, k, method)
    count = columns.shape[0]
    rows = np.broadcast_to(np.arange(dim), columns.shape)
    values = np.where(columns >= k, -1.0, 1.0).astype(np.float32) / math.sqrt(count)
    indices = torch.from_numpy(np.stack([rows.reshape(-1), columns.reshape(-1) % k]))
    values = torch.from_numpy(values.reshape(-1))
    return torch.sparse_coo_tensor(indices, values, (dim, k), check_invariants=True).coalesce()


def sparse_projection(layer_name: str, shape: tuple[int, ...], k: int, seed: int, method: str = "srp") -> Reduction:
    """The srp:K (or countsketch:K) reduction of layer LAYER_NAME with per-image SHAPE; UsageProblem when K exceeds
    its size."""
    dim = math.prod(shape)
    if k > dim:
        raise UsageProblem(f"--reduce {method}:{k}: layer {layer_name!r} has only {dim} values per image {shape}; "
                           f"a projection to more would not reduce it. Choose K below {dim}, or store it whole.")
    columns = torch.from_numpy(srp_columns(seed, layer_name, dim, k, method))
    scale = 1.0 / math.sqrt(columns.shape[0])
    placed: dict[tuple, torch.Tensor] = {}  # the columns by device and input order, made once

    def apply(batch: torch.Tensor) -> torch.Tensor:
        flat, order = flat_in_memory_order(batch)
        key = (flat.device, order is None)
        if key not in placed:
            placed[key] = (columns if order is None else columns[:, order]).to(flat.device)
        index = placed[key]
        sums = torch.zeros((flat.shape[0], 2 * k), dtype=torch.float32, device=flat.device)
        flat = flat.float()
        for row in index:  # each input's c entries, one pass each: sums[:, column] += flat[:, input]
            sums.index_add_(1, row, flat)
        return (sums[:, :k] - sums[:, k:]) * scale

    text = f"{method}:{k}" if seed == 0 else f"{method}:{k}:{seed}"
    rebuild = f"featdump.srp_matrix({seed}, {layer_name!r}, {dim}, {k}" + (")" if method == "srp" else f", {method!r})")
    attributes = {"srp_seed": seed, "srp_input_dim": dim, "srp_k": k, "srp_nonzeros_per_input": columns.shape[0],
                  "srp_density": columns.shape[0] / k, "srp_rebuild": rebuild}
    return Reduction(text, (k,), apply, attributes, device_bytes=columns.numel() * columns.element_size())
