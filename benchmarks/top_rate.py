"""`featdump top` against a sequential read of the same layer: a synthetic output of ROWS rows of a (C, H, W) float32
layer (written by featdump's writer), its rows read once front to back through h5py (the page cache dropped before
each, where this process may), then ranked by `featdump.top` (k 16, the maximum and its position), same memory.

    python -m benchmarks.top_rate [--rows 100000] [--shape 256,4,4] [--memory 1GB] [--rounds 3]

Each round measures both cold (the page cache dropped before the read and before top: a disk's rate, which on a
shared VM varies by 2x between runs) and warm (the file cached, as a layer just written is): medians and ranges.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from benchmarks.common import drop_caches, machine
from tests.makers.outputs import write_output


def sequential_read(path: Path, layer: str, rows_per_read: int) -> float:
    started = time.perf_counter()
    with h5py.File(path, "r") as h5file:
        dataset = h5file["features"][layer]
        for start in range(0, dataset.shape[0], rows_per_read):
            dataset[start:start + rows_per_read]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--shape", default="256,4,4")
    parser.add_argument("--memory", default="1GB")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from featdump.output.space import parse_bytes

    print(f"Machine: {machine()}", flush=True)
    shape = tuple(int(part) for part in args.shape.split(","))
    with tempfile.TemporaryDirectory(dir=".") as folder:
        output = Path(folder) / "layer.h5"
        rng = np.random.default_rng(0)
        chunk = 4096
        values = rng.standard_normal((args.rows, *shape), dtype=np.float32)
        write_output(output, {"maps": values}, batch=chunk)
        del values
        size = output.stat().st_size
        rows_per_read = max(1, parse_bytes(args.memory) // (3 * int(np.prod(shape)) * 8))
        rounds = [measure_round(output, args.memory, rows_per_read, Path(folder) / "top.h5")
                  for _ in range(args.rounds)]
    print("| rows | layer | file (MB) | page cache | sequential read (s) | top (s) | top's rate / the read's "
          "(median, range) |")
    print("| ---: | --- | ---: | --- | ---: | ---: | ---: |")
    for cache in ("cold", "warm"):
        reads, tops = [r[cache][0] for r in rounds], [r[cache][1] for r in rounds]
        rates = [read / ranked for read, ranked in zip(reads, tops)]
        print(f"| {args.rows} | {shape} float32 | {size / 1e6:.0f} | {cache} | {statistics.median(reads):.2f} | "
              f"{statistics.median(tops):.2f} | {statistics.median(rates):.2f}x ({min(rates):.2f}-{max(rates):.2f}) |")
    print(f"({args.rounds} rounds; cold: the page cache dropped before each, "
          f"{'as root' if rounds[0]['dropped'] else 'NOT dropped: not root'}; warm: right after, the file cached)")


def measure_round(output: Path, memory: str, rows_per_read: int, ranking: Path) -> dict:
    """(sequential read, top) seconds with the page cache dropped before each, then again with the file cached."""
    import featdump

    times = {}
    for cache in ("cold", "warm"):
        dropped = drop_caches() if cache == "cold" else True
        read = sequential_read(output, "maps", rows_per_read)
        if cache == "cold":
            drop_caches()
        started = time.perf_counter()
        featdump.top(output, "maps", k=16, memory=memory, to=ranking, overwrite=True)
        times[cache] = (read, time.perf_counter() - started)
        times["dropped"] = dropped
    return times

if __name__ == "__main__":
    main()
