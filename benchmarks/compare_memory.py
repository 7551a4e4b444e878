"""`featdump compare` out of core: LAYERS model RDMs (a `featdump rdm`-style file, (N, N) float64 each) against
SUBJECTS data RDMs (HDF5, condensed float64) over IMAGES images, SAMPLES bootstrap resamples (over BOOTSTRAP: subjects,
images or both), run as a
user runs it (`python -m featdump compare ... --memory MEMORY`) in its own process: its wall time and peak resident
memory (the kernel's, of the child) beside one RDM's size and the memory given. The inputs are written a layer and a
subject at a time.

    python -m benchmarks.compare_memory [--images 10000] [--layers 20] [--subjects 8] [--samples 1000]
                                        [--bootstrap subjects] [--memory 1GB] [--write-results]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from benchmarks.common import machine, write_section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--subjects", type=int, default=8)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--bootstrap", default="subjects", choices=("subjects", "images", "both"))
    parser.add_argument("--memory", default="1GB")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as folder:
        with multiprocessing.get_context("spawn").Pool(1) as making:  # a process of its own: featdump's, started
            # from this one, counts this one's highest resident memory as its own (the kernel's accounting at exec)
            rdms, data = making.apply(_inputs, (Path(folder), args.images, args.layers, args.subjects))
        seconds, peak = _run(["compare", rdms, data, "--samples", str(args.samples), "--bootstrap", args.bootstrap,
                              "--memory", args.memory, "-o", Path(folder) / "result.csv"])
    rdm = args.images**2 * 8
    table = "\n".join([f"Machine: {machine()}", "",
                       "| images | layers | subjects | resamples (of what) | --memory | data RDMs (GB) | "
                       "one RDM (GB) | time (s) | peak RSS (GB) |",
                       "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
                       f"| {args.images} | {args.layers} | {args.subjects} | {args.samples} ({args.bootstrap}) | "
                       f"{args.memory} | "
                       f"{args.subjects * rdm / 2e9:.1f} | {rdm / 1e9:.2f} | {seconds:.0f} | {peak / 1e9:.2f} |"])
    print(table)
    if args.write_results:
        write_section("compare_memory", f"Command: `python -m benchmarks.compare_memory --images {args.images} "
                                        f"--layers {args.layers} --subjects {args.subjects} --samples {args.samples} "
                                        f"--bootstrap {args.bootstrap} --memory {args.memory}`\n\n{table}")


def _inputs(folder: Path, images: int, layers: int, subjects: int) -> tuple[Path, Path]:
    """rdms.h5 (LAYERS (N, N) correlation-distance RDMs of a shared pattern plus noise, and the paths) and data.h5
    (SUBJECTS condensed RDMs of the same pattern plus noise), written one RDM at a time."""
    rng = np.random.default_rng(0)
    pattern = rng.standard_normal((images, 32))
    paths = np.array([f"img/{index:06d}.jpg" for index in range(images)], dtype=h5py.string_dtype())
    upper = np.triu_indices(images, k=1)
    with h5py.File(folder / "rdms.h5", "w") as h5file:
        h5file["paths"] = paths
        for layer in range(layers):
            h5file[f"rdms/layer{layer:02d}"] = 1 - np.corrcoef(pattern + (0.3 + layer) * rng.standard_normal(
                pattern.shape))
    with h5py.File(folder / "data.h5", "w") as h5file:
        h5file["paths"] = paths
        stored = h5file.create_dataset("rdms", (subjects, len(upper[0])), dtype=np.float64)
        for subject in range(subjects):
            stored[subject] = (1 - np.corrcoef(pattern + rng.standard_normal(pattern.shape)))[upper]
    return folder / "rdms.h5", folder / "data.h5"


def _run(arguments: list) -> tuple[float, int]:
    """(wall seconds, peak resident bytes) of `python -m featdump ARGUMENTS` in its own process: that child's own
    figures (`wait4`), not the largest of every child this process has had."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "featdump", *map(str, arguments)])
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"featdump exited {child.returncode}")
    return time.perf_counter() - started, usage.ru_maxrss * 1024


if __name__ == "__main__":
    main()
