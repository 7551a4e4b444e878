"""featdump's own costs at 10,000 to 1,000,000 rows: what a cron job or a cluster pays as a collection grows.

    python -m benchmarks.scale [--rows 10000,100000,1000000] [--files 10000,100000] [--write-results]
                               [--checkout PATH]

A tiny model (two 3x3 convolutions over 32x32 images: `featdump.testing.models`'s `small`) so that what is
measured is featdump, not the forward pass. Per size, each command in its own process, its CPU seconds (user +
system) and peak memory as the kernel counts them:

- an NSD-style HDF5 brick (N x 32 x 32 x 3 uint8): extract; the same command again (finished: nothing to do);
  `info`; `--update` with nothing new; `--update` after the brick grew by 1% (the stale rows it records are
  counted: a grown array's old rows are the same rows, so 0); extract as 4 shards, the last killed (SIGKILL) half
  way and resumed, and merged (`merge --copy`); `top -k 16`; and `FeatureDataset`'s epoch in file order against a
  plain h5py read of the same rows (in this process);
- a folder of N PNG files (`--files`): extract; the same command again (the listing kept: `inputs/listings.py`);
  `--update` with nothing new (it walks).

No figure per stored row may grow with the rows: each is printed as CPU seconds and as microseconds a row.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from benchmarks.common import REPO, machine, measured, write_section

EXTRACT = ["extract", "-m", "featdump.testing.models:small", "--transform", "featdump.testing.models:small_transform",
           "-l", "2,4"]


def brick(path: Path, rows: int, start: int = 0) -> None:
    """Rows START..ROWS of the brick at PATH (made, or grown to ROWS), pixels from each row's index."""
    with h5py.File(path, "a") as h5file:
        if "imgBrick" not in h5file:
            h5file.create_dataset("imgBrick", shape=(0, 32, 32, 3), maxshape=(None, 32, 32, 3), dtype=np.uint8,
                                  chunks=(256, 32, 32, 3))
        held = h5file["imgBrick"]
        held.resize(rows, axis=0)
        for first in range(start, rows, 65536):
            last = min(first + 65536, rows)
            rng = np.random.default_rng(first)
            held[first:last] = rng.integers(0, 256, (last - first, 32, 32, 3), dtype=np.uint8)


def pngs(folder: Path, count: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for index in range(count):
        path = folder / f"{index // 1000:04d}" / f"{index:07d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(path, compress_level=0)


def stale_rows(output: Path) -> int:
    with h5py.File(output, "r") as h5file:
        return len(h5file["stale/paths"]) if "stale" in h5file else 0


def killed_half_way(args: list[str], env: dict, folder: Path, seconds: float) -> None:
    """featdump ARGS started and killed (SIGKILL) after SECONDS."""
    process = subprocess.Popen([sys.executable, "-m", "featdump", *map(str, args)], env=env, cwd=folder,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    process.send_signal(signal.SIGKILL)
    process.wait()


def epochs(output: Path, batch: int = 1024) -> tuple[float, float]:
    """CPU seconds of one epoch of FeatureDataset in file order, and of a plain h5py read of the same batches."""
    from featdump.training.dataset import FeatureDataset

    started = time.process_time()
    for _ in FeatureDataset(output, "2", batch_size=batch, shuffle=False):
        pass
    ours = time.process_time() - started
    started = time.process_time()
    with h5py.File(output, "r") as h5file:
        values = h5file["features/2"]
        for first in range(0, len(values), batch):
            values[first:first + batch]
    return ours, time.process_time() - started


def array_rows(rows: int, folder: Path, env: dict) -> list[tuple[str, float, float]]:
    source, output = folder / "stimuli.h5", folder / "out.h5"
    brick(source, rows)
    run = [*EXTRACT, source, output]
    figures = [("extract", *measured(run, env, folder)[:2])]
    figures.append(("the same command again (finished)", *measured(run, env, folder)[:2]))
    figures.append(("info", *measured(["info", output], env, folder)[:2]))
    figures.append(("--update, nothing new", *measured([*run, "--update"], env, folder)[:2]))
    brick(source, rows + rows // 100, start=rows)
    figures.append(("--update, 1% new", *measured([*run, "--update"], env, folder)[:2]))
    figures.append((f"  stale rows recorded after it: {stale_rows(output)}", 0.0, 0.0))
    shards = folder / "sharded.h5"
    cpu = memory = 0.0
    for shard in range(4):
        cpu_shard, memory_shard, _ = measured([*run[:-1], shards, "--shard", f"{shard}/4"], env, folder)
        cpu, memory = cpu + cpu_shard, max(memory, memory_shard)
    last = [*run[:-1], shards, "--shard", "3/4"]
    Path(folder / "sharded.shard-3-of-4.h5").unlink()
    killed_half_way(last, env, folder, max(2.0, cpu / 8))
    figures.append(("4 shards, the last killed half way: its resume", *measured(last, env, folder)[:2]))
    figures.append(("merge --copy of the 4 shards", *measured(["merge", "--copy", shards], env, folder)[:2]))
    figures.append(("top -k 16", *measured(["top", output, "-l", "4", "-k", "16"], env, folder)[:2]))
    ours, plain = epochs(output)
    figures.append((f"FeatureDataset epoch in file order, layer 2 (8x7x7; plain h5py: {plain:.2f} CPU s)", ours, 0.0))
    return figures


def file_rows(count: int, folder: Path, env: dict) -> list[tuple[str, float, float]]:
    """A folder of COUNT PNGs, last changed an hour ago (as a collection is): extract; the same command again (the
    listing the first kept: no image stat'ed); --update with nothing new (it always walks)."""
    images, output = folder / "pngs", folder / "files.h5"
    pngs(images, count)
    then = time.time() - 3600
    for path in [images, *images.iterdir()]:
        os.utime(path, (then, then))
    env = {**env, "XDG_CACHE_HOME": str(folder / "cache")}
    run = [*EXTRACT, images, output]
    figures = [("extract (files)", *measured(run, env, folder)[:2]),
               ("the same command again, the listing kept (files)", *measured(run, env, folder)[:2]),
               ("--update, nothing new: walked (files)", *measured([*run, "--update"], env, folder)[:2])]
    return figures


def measured_in_a_folder(kind, size: int, checkout: Path) -> list[tuple[str, float, float]]:
    """KIND's figures (`array_rows`, `file_rows`) at SIZE, in a scratch folder, CHECKOUT's featdump on the path."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        return kind(size, folder, {**os.environ, "PYTHONPATH": f"{checkout}{os.pathsep}{folder}"})


def table(size: int, figures: list[tuple[str, float, float]]) -> list[str]:
    lines = [f"| {size:,} rows | CPU s | µs a row | peak MiB |", "| --- | ---: | ---: | ---: |"]
    for name, cpu, memory in figures:
        if not cpu:
            lines.append(f"| {name} | | | |")
            continue
        lines.append(f"| {name} | {cpu:.2f} | {cpu / size * 1e6:.1f} | {memory:.0f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="10000,100000,1000000", help="Array sizes, comma-separated.")
    parser.add_argument("--files", default="10000", help="Folder sizes, comma-separated ('' for none).")
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--checkout", type=Path, default=REPO,
                        help="Measure the featdump of this checkout (another commit's, for a before and after).")
    options = parser.parse_args()
    lines = [f"Machine: {machine()}", "Each command in its own process (CPU: user + system).", ""]
    for kind, sizes in ((array_rows, options.rows), (file_rows, options.files)):
        for size in [int(value) for value in sizes.split(",") if value]:
            table_lines = table(size, measured_in_a_folder(kind, size, options.checkout))
            lines += [*table_lines, ""]
            print("\n".join(table_lines), flush=True)
    print("\n".join(lines))
    if options.write_results:
        write_section("scale", "\n".join(lines))


if __name__ == "__main__":
    main()
