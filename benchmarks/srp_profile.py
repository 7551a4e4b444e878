"""Where srp:K's time goes on a CPU, and what was tried to cut it: one block of each resnet50 stage, a batch of
64 random activations, each way of applying the same projection timed alone (best of 3).

    python -m benchmarks.srp_profile [--k 4096] [--batch 64]

Ways: avgpool (the reference), featdump's `index_add_` along the features (what srp:K runs), the same on one
thread, the batch transposed so that each index moves a contiguous vector of images, a sparse CSR matrix
product, row by row 1-D `index_add_`, `bincount` with weights, the rows split across two threads of our own,
and countsketch:K (one nonzero per input).
"""

from __future__ import annotations

import argparse
import math
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from featdump.reductions.srp import sparse_projection, srp_columns

BLOCKS = {"layer1.0": (256, 56, 56), "layer2.0": (512, 28, 28), "layer3.0": (1024, 14, 14), "layer4.0": (2048, 7, 7)}


def best(function, repeats: int = 3) -> float:
    function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times) * 1000


def ways(name: str, shape: tuple[int, ...], k: int, batch: int, pool: ThreadPoolExecutor) -> dict[str, float]:
    dim = math.prod(shape)
    x = torch.rand(batch, *shape, generator=torch.Generator().manual_seed(0))
    flat = x.reshape(batch, dim)
    columns = torch.from_numpy(srp_columns(0, name, dim, k))
    scale = 1 / math.sqrt(columns.shape[0])
    srp, sketch = sparse_projection(name, shape, k, 0), sparse_projection(name, shape, k, 0, "countsketch")
    expected = srp.apply(x)

    def transposed():
        flat_t, sums = flat.T.contiguous(), torch.zeros(2 * k, batch)
        for row in columns:
            sums.index_add_(0, row, flat_t)
        return (sums[:k] - sums[k:]).T * scale

    signs = np.where(columns.numpy() >= k, -scale, scale).reshape(-1).astype(np.float32)
    inputs = np.broadcast_to(np.arange(dim), columns.shape).reshape(-1)
    csr = torch.sparse_coo_tensor(torch.from_numpy(np.stack([(columns.numpy() % k).reshape(-1), inputs])),
                                  torch.from_numpy(signs), (k, dim)).coalesce().to_sparse_csr()

    def row_by_row(first: int = 0, last: int = batch, sums=None):
        sums = torch.zeros(batch, 2 * k) if sums is None else sums
        for index in range(first, last):
            for row in columns:
                sums[index].index_add_(0, row, flat[index])
        return sums

    def bincount():
        out = torch.empty(batch, 2 * k, dtype=torch.float64)
        for index in range(batch):
            out[index] = sum(torch.bincount(row, weights=flat[index], minlength=2 * k) for row in columns)
        return out

    def two_threads():
        sums = torch.zeros(batch, 2 * k)

        def part(first: int, last: int) -> None:
            for row in columns:
                sums[first:last].index_add_(1, row, flat[first:last])
        list(pool.map(lambda bounds: part(*bounds), [(0, batch // 2), (batch // 2, batch)]))
        return sums

    assert torch.allclose(transposed(), expected, rtol=1e-4, atol=1e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    one_thread = best(lambda: srp.apply(x))
    torch.set_num_threads(threads)
    return {"avgpool": best(lambda: x.flatten(2).mean(2)), "srp (index_add_)": best(lambda: srp.apply(x)),
            "srp, one thread": one_thread, "transposed batch": best(transposed),
            "CSR product": best(lambda: (csr @ flat.T).T), "row by row": best(row_by_row), "bincount": best(bincount),
            "our two threads": best(two_threads), "countsketch": best(lambda: sketch.apply(x))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=64)
    arguments = parser.parse_args()
    pool = ThreadPoolExecutor(2)
    rows = {name: ways(name, shape, arguments.k, arguments.batch, pool) for name, shape in BLOCKS.items()}
    names = list(next(iter(rows.values())))
    print(f"ms per batch of {arguments.batch}, K = {arguments.k}, {torch.get_num_threads()} threads\n")
    print("| block (D, c) | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for block, times in rows.items():
        dim = math.prod(BLOCKS[block])
        count = srp_columns(0, block, dim, arguments.k).shape[0]
        print(f"| {block} ({dim:,}, {count}) | " + " | ".join(f"{times[name]:.1f}" for name in names) + " |")


if __name__ == "__main__":
    main()
