"""Training from the stored features: a shuffled epoch of featdump.FeatureDataset against a sequential chunk-by-chunk
h5py read of the same dataset (the limit) and the usual per-row map-style Dataset with a shuffled sampler.

    python -m benchmarks.reader [--wide-rows 2700] [--images 5100] [--naive-batches 10] [--epochs 3] [--cold]

Two files, written once into benchmarks/data by featdump's own writer (random values): a wide layer of 400 KB rows
(100 x 32 x 32 float32; 2,700 rows: 1.1 GB) and a ViT-like token layer (197 tokens x 768 float32 per image, 3 KB a
token; 5,100 images: 1.0M token rows, 3.1 GB) read as token rows (tokens="all"). Batches of 1024 rows (wide: 64).
Each method runs with 0 and 2 loader workers; rows/s and GB/s of feature bytes delivered. A row measures the
DataLoader's own cost of handing over batches of that size from 2 workers (made in memory, no file): the most any
loader with workers can deliver here. The page cache is warm
(each file read once first), or dropped before every step with --cold (root only). Warm, the sequential read and
FeatureDataset's epochs run --epochs times after a first one: their median is the row, the first epoch (the
process's first touch of its buffers and threads) its own column. The naive loader is timed over --naive-batches
batches and its rate extrapolated.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import featdump
from benchmarks.common import drop_caches
from featdump.output.layout import DatasetSpec
from featdump.output.writer import FeatureWriter

HERE = Path(__file__).resolve().parent



def write(path: Path, shape: tuple[int, ...], rows: int, batch: int = 64) -> Path:
    """PATH holding ROWS random rows of SHAPE (float32) as layer `layer`, written once."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    writer = FeatureWriter.open(path, {"layer": DatasetSpec(shape, "float32")}, {"image_count": rows},
                                {"model": "synthetic", "layers": ["layer"]}, ["a"], batch, overwrite=True)
    for start in range(0, rows, batch):
        stop = min(start + batch, rows)
        values = rng.standard_normal((stop - start, *shape), dtype=np.float32)
        writer.append({"layer": values}, [f"{row:07d}.jpg" for row in range(start, stop)], [0] * (stop - start),
                      [], stop)
    return writer.finish()


def sequential(path: Path) -> tuple[float, int]:
    """Seconds and bytes of reading the layer chunk by chunk (slices of whole chunks), kept nowhere."""
    started = time.perf_counter()
    with h5py.File(path, "r") as h5file:
        data = h5file["features/layer"]
        step, total = data.chunks[0], 0
        for start in range(0, data.shape[0], step):
            total += data[start:start + step].nbytes
    return time.perf_counter() - started, total


def epoch(path: Path, batch: int, workers: int, tokens: str | None) -> tuple[float, int, int]:
    """Seconds, rows and bytes of one shuffled FeatureDataset epoch through a DataLoader."""
    dataset = featdump.FeatureDataset(path, "layer", batch_size=batch, tokens=tokens)
    started, rows, total = time.perf_counter(), 0, 0
    for got in DataLoader(dataset, batch_size=None, num_workers=workers):
        rows += len(got["row"])
        total += got["features"]["layer"].nbytes
    return time.perf_counter() - started, rows, total


class Handover(IterableDataset):
    """The DataLoader's own cost: workers yielding COUNT batches of SHAPE made from memory (no file)."""

    def __init__(self, count: int, shape: tuple[int, ...]):
        self.count, self.shape = count, shape

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        source = np.ones(self.shape, dtype=np.float32)
        for _ in range(worker, self.count, workers):
            yield {"x": torch.from_numpy(source.copy())}


def handover(count: int, shape: tuple[int, ...], workers: int) -> tuple[float, int, int]:
    started, total = time.perf_counter(), 0
    for got in DataLoader(Handover(count, shape), batch_size=None, num_workers=workers):
        total += got["x"].nbytes
    return time.perf_counter() - started, count * shape[0], total


class Naive(Dataset):
    """The usual recipe: one row (or one token of a row) per __getitem__, the file opened in each worker."""

    def __init__(self, path: Path, tokens: int | None):
        self.path, self.tokens, self.file = path, tokens, None
        with h5py.File(path, "r") as h5file:
            self.rows = h5file["features/layer"].shape[0]

    def __len__(self) -> int:
        return self.rows * (self.tokens or 1)

    def __getitem__(self, index: int):
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        data = self.file["features/layer"]
        if self.tokens:
            return torch.from_numpy(data[index // self.tokens, index % self.tokens])
        return torch.from_numpy(data[index])


def naive(path: Path, batch: int, workers: int, tokens: int | None, batches: int) -> tuple[float, int, int]:
    loader = DataLoader(Naive(path, tokens), batch_size=batch, shuffle=True, num_workers=workers,
                        generator=torch.Generator().manual_seed(0))
    started, rows, total = time.perf_counter(), 0, 0
    for index, got in enumerate(loader):
        rows, total = rows + len(got), total + got.nbytes
        if index + 1 == batches:
            break
    return time.perf_counter() - started, rows, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wide-rows", type=int, default=2700)
    parser.add_argument("--images", type=int, default=5100)
    parser.add_argument("--naive-batches", type=int, default=10)
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each step (root)")
    parser.add_argument("--epochs", type=int, default=3, help="warm: epochs timed after the first (their median)")
    options = parser.parse_args()
    repeats = 1 if options.cold else options.epochs
    files = {"wide rows (400 KB)": (write(HERE / "data" / f"reader-wide-{options.wide_rows}.h5", (100, 32, 32),
                                          options.wide_rows), 64, None, None),
             "token rows (3 KB)": (write(HERE / "data" / f"reader-tokens-{options.images}.h5", (197, 768),
                                         options.images), 1024, "all", 197)}
    print(f"page cache: {'dropped before each step' if options.cold else 'warm'}; torch threads "
          f"{torch.get_num_threads()}")
    print("| data | method | workers | rows | seconds | rows/s | GB/s | vs sequential | first epoch |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, (path, batch, tokens, per_row) in files.items():
        if not options.cold:
            sequential(path)  # warm the page cache
        if options.cold:
            drop_caches()
        seconds, total = sequential(path)
        first = seconds
        seconds = statistics.median([seconds] if options.cold else [sequential(path)[0] for _ in range(repeats)])
        limit = total / seconds
        with h5py.File(path, "r") as h5file:
            rows = h5file["features/layer"].shape[0] * (per_row or 1)
        print(f"| {label} | sequential h5py read, chunk by chunk | 0 | {rows} | {seconds:.2f} | {rows / seconds:,.0f} "
              f"| {limit / 1e9:.2f} | 1.00 | {first:.2f} s |")
        for workers in (0, 2):
            if options.cold:
                drop_caches()
            first, rows, total = epoch(path, batch, workers, tokens)
            seconds = statistics.median([first] if options.cold else
                                        [epoch(path, batch, workers, tokens)[0] for _ in range(repeats)])
            print(f"| {label} | FeatureDataset, shuffled epoch | {workers} | {rows} | {seconds:.2f} | "
                  f"{rows / seconds:,.0f} | {total / seconds / 1e9:.2f} | {total / seconds / limit:.2f} | "
                  f"{first:.2f} s |")
        sample = (768,) if per_row else (100, 32, 32)
        seconds, rows, total = handover(-(-rows // batch), (batch, *sample), 2)
        print(f"| {label} | DataLoader handover alone: ready batches of that size, no file | 2 | {rows} | "
              f"{seconds:.2f} | {rows / seconds:,.0f} | {total / seconds / 1e9:.2f} | "
              f"{total / seconds / limit:.2f} | |")
        for workers in (0, 2):
            if options.cold:
                drop_caches()
            seconds, rows, total = naive(path, batch, workers, per_row, options.naive_batches)
            print(f"| {label} | per-row Dataset, shuffled sampler ({options.naive_batches} batches) | {workers} | "
                  f"{rows} | {seconds:.2f} | {rows / seconds:,.0f} | {total / seconds / 1e9:.3f} | "
                  f"{total / seconds / limit:.3f} | |")


if __name__ == "__main__":
    main()
