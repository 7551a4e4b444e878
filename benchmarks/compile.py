"""--compile against eager: the batch loop's img/s, the compile time cold and with a warm cache, the whole command.

    python benchmarks/compile.py [--images 512] [--models resnet50:avgpool,resnet18:layer3]

ImageNet-size JPEGs (500x375, benchmarks/data), random weights, the default workers and batch size, each run a
whole `featdump -v extract` command in its own process, in this order per model: eager, compiled with an empty
cache folder (cold), compiled again with that folder (warm). "steady img/s" is the rate after the first batch
(the -v "Stage times" line; compiling happens in the first batch, and its time, that batch included, is the
"compile" column); "command" is the whole process's wall time. The compiled rows are compared with the eager
ones (max difference over the max |value| of the layer). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from benchmarks.run import make_images, timed_featdump  # noqa: E402


def extract(model: str, layer: str, images: Path, output: Path, *options: str) -> dict:
    seconds, log = timed_featdump("-v", "extract", "-m", model, "-w", "none", "-l", layer, "--overwrite", *options,
                                  images, output, what=f"{model} {options}")
    if "--compile" in options and "Compiled the forward" not in log:
        raise SystemExit(f"{model} {options} ran eager:\n{log[-3000:]}")
    steady = re.search(r"after the first batch \d+ images in [\d.]+ s, ([\d.]+) img/s", log)
    compiled = re.search(r"Compiled the forward in ([\d.]+) s, its first batch included "
                         r"\(inductor; cache .*?: (.*?)\); it differs", log)
    with h5py.File(output, "r") as h5file:
        values = h5file["features"][layer][:]
    return {"seconds": seconds, "loop_rate": float(steady[1]) if steady else float("nan"),  # nan: one batch only
            "compile": float(compiled[1]) if compiled else None, "cache": compiled[2] if compiled else "",
            "values": values}


def measure(model: str, layer: str, images: Path, scratch: Path) -> list[str]:
    cache = scratch / f"cache-{model}"
    shutil.rmtree(cache, ignore_errors=True)
    runs = {"eager": extract(model, layer, images, scratch / "eager.h5"),
            "compiled, cold cache": extract(model, layer, images, scratch / "cold.h5", "--compile", "--compile-cache",
                                            str(cache)),
            "compiled, warm cache": extract(model, layer, images, scratch / "warm.h5", "--compile", "--compile-cache",
                                            str(cache))}
    eager = runs["eager"]
    scale = float(np.abs(eager["values"]).max())
    rows = []
    for name, run in runs.items():
        difference = float(np.abs(run["values"] - eager["values"]).max()) / scale
        compiling = "-" if run["compile"] is None else f"{run['compile']:.1f} s ({run['cache']})"
        rows.append(f"| {model} `{layer}` | {name} | {run['loop_rate']:.2f} | "
                    f"{run['loop_rate'] / eager['loop_rate']:.2f}x | {compiling} | "
                    f"{run['seconds']:.1f} s | {run['seconds'] / eager['seconds']:.2f}x | {difference:.1e} |")
        print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--models", default="resnet50:avgpool,resnet18:layer3")
    args = parser.parse_args()
    images = make_images(HERE / "data" / f"imagenet_{args.images}", args.images)
    scratch = Path(tempfile.mkdtemp(prefix="featdump-compile-", dir=HERE / "data"))
    header = ["| model, layer | run | steady img/s | vs eager | compile | command | vs eager | max rel. diff |",
              "|---|---|---|---|---|---|---|---|"]
    rows = []
    try:
        for pair in args.models.split(","):
            model, layer = pair.split(":")
            rows += measure(model, layer, images, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("\n".join(["", *header, *rows]))


if __name__ == "__main__":
    main()
