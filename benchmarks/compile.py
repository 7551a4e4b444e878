"""--compile against eager: the batch loop's img/s, the compile time cold and with a warm cache, the whole command.

    python -m benchmarks.compile [--images 512] [--models resnet50:avgpool,resnet18:layer3] [--rounds 3]
    python -m benchmarks.compile --images 128 --rounds 1 --models vit_b_16:vit-blocks   # ViT-B/16, its 12 blocks

ImageNet-size JPEGs (500x375, benchmarks/data), random weights, the default workers and batch size, each run a
whole `featdump -v extract` command in its own process, in this order per model and round: eager, compiled
with an empty cache folder (cold: the AOTInductor package is built), compiled again with that folder (warm: it
is loaded). "steady img/s" is the rate after the first batch (the -v "Stage times" line; compiling happens in
the first batch, and its time, that batch included, is the "compile" column); "command" is the whole process's
wall time. The compiled rows are compared with the eager ones (max difference over the max |value| of the
layer). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
from pathlib import Path

import h5py
import numpy as np

from benchmarks.common import machine, make_images, timed_featdump

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


LAYER_SETS = {"vit-blocks": ",".join(f"encoder.layers.encoder_layer_{index}" for index in range(12))}


def extract(model: str, layer: str, images: Path, output: Path, *options: str, reference: dict | None = None) -> dict:
    """One whole command; its rows kept (`values`) when REFERENCE is None, else their largest difference from
    REFERENCE's over the largest |value| of each layer (`difference`)."""
    layers = LAYER_SETS.get(layer, layer)
    seconds, log = timed_featdump("-v", "extract", "-m", model, "-w", "none", "-l", layers, "--overwrite", *options,
                                  images, output, what=f"{model} {options}")
    compiled = re.search(r"(Compiled|Built|Loaded) the (?:compiled )?forward in ([\d.]+) s[,(]? ?(.*?)\)?; it differs",
                         log)
    if "--compile" in options and not compiled:
        raise SystemExit(f"{model} {options} ran eager:\n{log[-3000:]}")
    steady = re.search(r"after the first batch \d+ images in [\d.]+ s, ([\d.]+) img/s", log)
    how = ""
    if compiled:
        how = "torch.compile" if compiled[1] == "Compiled" else f"AOTInductor, {compiled[1].lower()}"
    with h5py.File(output, "r") as h5file:
        values = {name: h5file["features"][name][:] for name in layers.split(",")}
    run = {"seconds": seconds, "loop_rate": float(steady[1]) if steady else float("nan"),  # nan: one batch only
           "compile": float(compiled[2]) if compiled else None, "how": how}
    if reference is None:
        return {**run, "values": values, "difference": 0.0}
    return {**run, "difference": max(float(np.abs(values[name] - wanted).max()) / float(np.abs(wanted).max())
                                     for name, wanted in reference.items())}


def measure(model: str, layer: str, images: Path, scratch: Path, rounds: int) -> list[str]:
    """ROUNDS rounds, each: eager, compiled with an empty cache folder (cold), compiled again with it (warm)."""
    runs: dict[str, list[dict]] = {}
    for round_ in range(rounds):
        cache = scratch / f"cache-{model}-{round_}"
        shutil.rmtree(cache, ignore_errors=True)
        reference = runs["eager"][0]["values"] if runs else None
        runs.setdefault("eager", []).append(extract(model, layer, images, scratch / "eager.h5", reference=reference))
        for name in ("compiled, cold cache", "compiled, warm cache"):
            runs.setdefault(name, []).append(extract(model, layer, images, scratch / "compiled.h5", "--compile",
                                                     "--compile-cache", str(cache),
                                                     reference=runs["eager"][0]["values"]))
        shutil.rmtree(cache, ignore_errors=True)
        print(f"round {round_ + 1}: " + ", ".join(f"{name} {run[-1]['seconds']:.1f} s" for name, run in runs.items()),
              flush=True)
    eager = runs["eager"]
    rows = []
    for name, done in runs.items():
        seconds = statistics.median(run["seconds"] for run in done)
        ratios = [run["seconds"] / base["seconds"] for run, base in zip(done, eager)]
        rate = statistics.median(run["loop_rate"] for run in done)
        difference = max(run["difference"] for run in done)
        compiling = "-" if done[0]["compile"] is None else \
            f"{statistics.median(run['compile'] for run in done):.1f} s ({done[0]['how']})"
        eager_rate = statistics.median(run["loop_rate"] for run in eager)
        spread = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        rows.append(f"| {model} `{layer}` | {name} | {rate:.2f} | {rate / eager_rate:.2f}x | "
                    f"{compiling} | {seconds:.1f} s | {spread} | "
                    f"{difference:.1e} |")
        print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--models", default="resnet50:avgpool,resnet18:layer3")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"Machine: {machine()}", flush=True)  # every figure below is this CPU's
    images = make_images(HERE / "data" / f"imagenet_{args.images}", args.images)
    scratch = Path(tempfile.mkdtemp(prefix="featdump-compile-", dir=HERE / "data"))
    header = ["| model, layer | run | steady img/s | vs eager | compile (first batch included) | command | "
              "vs eager (per round: median, min-max) | max rel. diff |",
              "|---|---|---|---|---|---|---|---|"]
    rows = []
    try:
        for pair in args.models.split(","):
            model, layer = pair.split(":")
            rows += measure(model, layer, images, scratch, args.rounds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("\n".join(["", *header, *rows]))


if __name__ == "__main__":
    main()
