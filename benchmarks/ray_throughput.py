"""Ray against SLURM-style processes on this machine: rows per second, and the cost of one more shard.

    python -m benchmarks.ray_throughput [--images 512] [--model resnet18] [--layer avgpool] [--shards 2,8,32]
                                        [--rounds 2]

ImageNet-size JPEGs (500x375, benchmarks/data), random weights, default workers and batch size, whole commands:
- "2 processes": `featdump extract --shard 0/2` and `--shard 1/2` started together (as two SLURM array tasks on
  one node), then `featdump merge`; wall time from the first start to the merge's end.
- "Ray, N shards": `featdump extract --ray ADDRESS --shards N` on a Ray cluster started once before the rounds
  (`ray start --head`, this machine's CPUs: as a cloud cluster is there before its jobs), N tasks of one CPU
  each, merged at the end; wall time of the command (the job's workers start in it, torch imported).
Each round runs them in that order; medians over rounds. The per-shard overhead is the slope of the Ray command's
time against N (least squares), and the shard size at which it falls under 5% of a shard's time follows from it
and the rate.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import make_images, timed_featdump

HERE = Path(__file__).resolve().parent
REPO = HERE.parent



def two_processes(model: str, layer: str, images: Path, work: Path) -> float:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    command = [sys.executable, "-m", "featdump", "extract", "-m", model, "-w", "none", "-l", layer]
    started = time.perf_counter()
    tasks = [subprocess.Popen([*command, "--shard", f"{index}/2", str(images), str(work / "out.h5")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for index in range(2)]
    for task in tasks:
        _, err = task.communicate()
        if task.returncode:
            raise SystemExit(f"a shard failed:\n{err[-2000:]}")
    timed_featdump("merge", work / "out.h5", what="merge")
    return time.perf_counter() - started


def on_ray(model: str, layer: str, images: Path, work: Path, shards: int, address: str) -> float:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    seconds, _ = timed_featdump("extract", "-m", model, "-w", "none", "-l", layer, "--ray", address, "--shards",
                                shards, images, work / "out.h5", what=f"ray {shards} shards")
    return seconds


def start_cluster() -> str:
    ray = str(Path(sys.executable).with_name("ray"))
    subprocess.run([ray, "start", "--head", "--include-dashboard=false", "--disable-usage-stats"], check=True,
                   capture_output=True)
    return "auto"


def stop_cluster() -> None:
    subprocess.run([str(Path(sys.executable).with_name("ray")), "stop", "--force"], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--layer", default="avgpool")
    parser.add_argument("--shards", default="2,8,32")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    images = make_images(HERE / "data" / f"photos-{args.images}", args.images)
    work = Path(tempfile.mkdtemp(prefix="featdump-ray-"))
    counts = [int(text) for text in args.shards.split(",")]
    times: dict[str, list[float]] = {}
    address = start_cluster()
    try:
        rounds(args, images, work, counts, times, address)
    finally:
        stop_cluster()
    report(args, counts, times)


def rounds(args, images: Path, work: Path, counts: list[int], times: dict, address: str) -> None:
    for round_ in range(args.rounds):
        times.setdefault("2 processes", []).append(two_processes(args.model, args.layer, images, work / "slurm"))
        for count in counts:
            times.setdefault(f"Ray, {count} shards", []).append(
                on_ray(args.model, args.layer, images, work / f"ray{count}", count, address))
        print(f"round {round_ + 1}: " + ", ".join(f"{name} {runs[-1]:.1f} s" for name, runs in times.items()),
              flush=True)


def report(args, counts: list[int], times: dict) -> None:
    base = statistics.median(times["2 processes"])
    print(f"\n{args.images} images, {args.model} `{args.layer}`\n")
    print("| how | command (median) | rows/s | x 2 processes |\n| --- | --- | --- | --- |")
    for name, runs in times.items():
        seconds = statistics.median(runs)
        print(f"| {name} | {seconds:.1f} s | {args.images / seconds:.1f} | {base / seconds:.2f}x |")
    medians = [statistics.median(times[f"Ray, {count} shards"]) for count in counts]
    slope, intercept = np.polyfit(counts, medians, 1)
    per_task = args.images / 2 / base  # rows/s one of the 2 processes made
    print(f"\nPer-shard overhead (slope of the Ray command's time against N): {slope:.2f} s; fixed part "
          f"{intercept:.1f} s. It is under 5% of a shard's time from about {20 * slope * per_task:.0f} rows per "
          f"shard at this machine's rate per task ({per_task:.1f} rows/s).")


if __name__ == "__main__":
    main()
