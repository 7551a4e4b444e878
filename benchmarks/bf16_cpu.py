"""bf16 on a CPU node: `--precision bf16` (with its proof on, the default 8 images) against fp32, whole commands.

    python -m benchmarks.bf16_cpu [--images 256] [--vit-images 64] [--rounds 2] [--configurations "fp32;bf16 + proof"]

ImageNet-size JPEGs (500x375, benchmarks/data), random weights, the default workers and batch size, each run a
whole `featdump extract` command in its own process, interleaved per round: fp32, bf16 (proof 8, the default),
bf16 with --proof 0. Jobs: resnet50 `avgpool`, and vit_b_16's 12 encoder blocks (each block's whole output, as a
representational study keeps them). "x fp32" is the median of each round's ratio
to that round's fp32 command. The accuracy it costs is the proof's own record (per layer: the farthest and the
median of the proved rows, max |bf16 - fp32| / max |fp32| of a row), read from the output's `proof` attribute.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import h5py

from benchmarks.common import machine, make_images, timed_featdump

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


VIT_BLOCKS = ",".join(f"encoder.layers.encoder_layer_{index}" for index in range(12))
JOBS = {"resnet50 avgpool": ("resnet50", "avgpool"), "vit_b_16 12 blocks": ("vit_b_16", VIT_BLOCKS)}
CONFIGURATIONS = {"fp32": (), "bf16 + proof": ("--precision", "bf16"),
                  "bf16, --proof 0": ("--precision", "bf16", "--proof", "0")}


def command(model: str, layers: str, images: Path, output: Path, options: tuple[str, ...]) -> float:
    seconds, _ = timed_featdump("extract", "-m", model, "-w", "none", "-l", layers, "--overwrite", *options,
                                images, output, what=f"{model} {options}")
    return seconds


def proof_record(output: Path) -> dict:
    with h5py.File(output, "r") as h5file:
        (entry,) = json.loads(h5file.attrs["proof"])
    return entry


def measure(job: str, images: Path, scratch: Path, rounds: int, configurations: list[str]) -> tuple[list[str], dict]:
    """ROUNDS interleaved rounds of CONFIGURATIONS (fp32 always first): table rows, and the bf16 run's proof
    record."""
    model, layers = JOBS[job]
    chosen = {name: CONFIGURATIONS[name] for name in ["fp32", *(name for name in configurations if name != "fp32")]}
    seconds: dict[str, list[float]] = {name: [] for name in chosen}
    record = {}
    for round_ in range(rounds):
        for name, options in chosen.items():
            output = scratch / f"{name.replace(' ', '_').replace(',', '')}.h5"
            seconds[name].append(command(model, layers, images, output, options))
            if name == "bf16 + proof":
                record = proof_record(output)
        print(f"{job}, round {round_ + 1}: " + ", ".join(f"{name} {times[-1]:.1f} s"
                                                        for name, times in seconds.items()), flush=True)
    rows = []
    for name, times in seconds.items():
        ratios = [time / base for time, base in zip(times, seconds["fp32"])]
        rows.append(f"| {job} | {name} | {statistics.median(times):.1f} s | {statistics.median(ratios):.2f}x "
                    f"({min(ratios):.2f}-{max(ratios):.2f}) |")
    return rows, record


def accuracy_rows(job: str, record: dict) -> list[str]:
    return [f"| {job} | `{name}` | {float(layer['largest']):.1e} | {float(layer['median']):.1e} | "
            f"{float(layer['bound']):.1e} |" for name, layer in record.get("layers", {}).items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--vit-images", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--configurations", default=";".join(CONFIGURATIONS),
                        help="separated by ';', of: " + "; ".join(CONFIGURATIONS))
    args = parser.parse_args()
    print(f"Machine: {machine()}", flush=True)  # every figure below is this CPU's
    scratch = HERE / "data" / "bf16"
    scratch.mkdir(parents=True, exist_ok=True)
    times, accuracy = [], []
    for job in args.jobs.split(","):
        count = args.vit_images if job.startswith("vit") else args.images
        images = make_images(HERE / "data" / f"photos-{count}", count)
        rows, record = measure(job, images, scratch, args.rounds, args.configurations.split(";"))
        times += rows
        accuracy += accuracy_rows(job, record)
    print("\n| job | configuration | command (median) | x fp32 (range) |\n| --- | --- | --- | --- |")
    print("\n".join(times))
    print("\n| job | layer | bf16 vs fp32: farthest proved row | median row | the proof's bound |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(accuracy))


if __name__ == "__main__":
    main()
