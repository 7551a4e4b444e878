"""Reductions: bytes per image and img/s of resnet50's 16 bottleneck blocks (`layer*.*`) stored whole, in float16,
average-pooled, projected with srp:4096, and on a pca:256 fit.

    python -m benchmarks.reductions [--images 256] [--fit-images 320] [--only srp:4096,avgpool] [--rounds 3]

ImageNet-size JPEGs (benchmarks/data), resnet50 with random weights, the default workers and batch size, each
configuration a whole `featdump extract` command in its own process. img/s is the command's images over its
wall time, and over the time after the first batch (steady, from the progress log); pca:256 also reports its
fit pass (staging and fitting on --fit-images other images) apart. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import make_images, timed_featdump

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


CONFIGS = {
    "none": [],
    "float16": ["--dtype", "float16"],
    "avgpool": ["--reduce", "avgpool"],
    "srp:4096": ["--reduce", "srp:4096"],
    "countsketch:4096": ["--reduce", "countsketch:4096"],
    "pca:256": ["--reduce", "pca:256", "--pca-fit", "{fit}"],
}


def run(name: str, images: Path, fit: Path, folder: Path) -> dict:
    output = folder / f"{name.replace(':', '_')}.h5"
    arguments = [a.replace("{fit}", str(fit)) for a in CONFIGS[name]]
    seconds, log = timed_featdump("-v", "extract", "-m", "resnet50", "-w", "none", "-l", "layer*.*", *arguments,
                                  images, output, what=name)
    fit_done = re.findall(r"(\d\d:\d\d:\d\d) featdump INFO: PCA fit of", log)
    projection = re.search(r"Projection matrices: ([\d.]+ [KMG]B)", log)
    size = output.stat().st_size
    count = int(re.search(r"Wrote (\d+) images", log)[1])
    fit_seconds = _fit_seconds(log) if fit_done else 0.0
    row = {"name": name, "seconds": seconds, "rate": count / seconds,
           "rate_without_fit": count / (seconds - fit_seconds), "bytes_per_image": size / count, "file": size,
           "matrices": projection[1] if projection else "-",
           "fit_seconds": fit_seconds}
    output.unlink()
    for leftover in folder.glob(f"{output.name}*"):
        leftover.unlink()
    return row


def _fit_seconds(log: str) -> float:
    """From the start of the fit's staging to the first line after the last fit (log timestamps, 1 s resolution)."""
    stamps = [(time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")), line) for line in log.splitlines()
              if re.match(r"\d{4}-\d\d-\d\d ", line)]
    start = next(stamp for stamp, line in stamps if "PCA fit: staging" in line)
    last_fit = max(index for index, (_, line) in enumerate(stamps) if "PCA fit of" in line)
    return stamps[min(last_fit + 1, len(stamps) - 1)][0] - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--fit-images", type=int, default=320)
    parser.add_argument("--only", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=1, help="rounds, interleaved; the table shows medians")
    parser.add_argument("--distortion-images", type=int, default=64, help="images for the distance distortion "
                        "of srp and countsketch (0: not measured)")
    args = parser.parse_args()
    images = make_images(HERE / "data" / f"imagenet_{args.images}", args.images)
    fit = make_images(HERE / "data" / f"reference_{args.fit_images}", args.fit_images)
    folder = Path(tempfile.mkdtemp(prefix="featdump-reductions-", dir=HERE / "data"))
    runs: dict[str, list[dict]] = {}
    try:
        for round_ in range(args.rounds):
            for name in args.only.split(","):
                runs.setdefault(name, []).append(run(name, images, fit, folder))
                print(f"round {round_ + 1}: {name} {runs[name][-1]['seconds']:.1f} s", flush=True)
        distortion = _distortion(images, folder, args.distortion_images) if args.distortion_images else []
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"\n{args.rounds} round(s), interleaved; medians (the time ratio to avgpool: median of the rounds', "
          "min-max)\n")
    print("| --reduce / --dtype | file | bytes per image | img/s (whole command) | img/s (without the fit) "
          "| projection matrices | seconds | vs avgpool |")
    print("|---|---|---|---|---|---|---|---|")
    for name, done in runs.items():
        row = {key: statistics.median(run[key] for run in done) if isinstance(done[0][key], float) else done[0][key]
               for key in done[0]}
        ratio = "-"
        if "avgpool" in runs and name != "avgpool":
            ratios = [run["seconds"] / base["seconds"] for run, base in zip(done, runs["avgpool"])]
            ratio = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        print(f"| {name} | {row['file'] / 1e6:.1f} MB | {row['bytes_per_image'] / 1e3:.1f} KB | "
              f"{row['rate']:.2f} | {row['rate_without_fit']:.2f} | {row['matrices']} | {row['seconds']:.1f} | "
              f"{ratio} |")
    if distortion:
        print(f"\nSquared distances after the projection over before, all pairs of {args.distortion_images} images "
              "(resnet50, random weights):\n")
        print("| layer (D) | reduction | mean ratio | std of the ratio | largest abs(ratio - 1) |")
        print("|---|---|---|---|---|")
        for line in distortion:
            print(line)


def _distortion(images: Path, folder: Path, count: int) -> list[str]:
    """How srp:4096 and countsketch:4096 change squared distances: the whole features of COUNT images, projected
    with the very matrices featdump applies (`featdump.srp_matrix`)."""
    import numpy as np
    import torch

    import featdump

    subset = folder / "subset"
    for path in sorted(images.rglob("*.jpg"))[:count]:
        (subset / path.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, subset / path.parent.name / path.name)
    output = folder / "whole.h5"
    layers = ["layer1.0", "layer3.0", "layer4.2"]
    timed_featdump("extract", "-m", "resnet50", "-w", "none", "-l", ",".join(layers), subset, output,
                   what="the whole features")
    lines = []
    for layer in layers:
        rows = torch.from_numpy(featdump.load(output, layer).features.reshape(count, -1)).double()
        before = torch.pdist(rows) ** 2
        for method in ("srp", "countsketch"):
            matrix = featdump.srp_matrix(0, layer, rows.shape[1], 4096, method).double()
            after = torch.pdist(torch.sparse.mm(matrix.t(), rows.t()).t()) ** 2
            ratio = (after / before).numpy()
            lines.append(f"| {layer} ({rows.shape[1]:,}) | {method}:4096 | {ratio.mean():.4f} | {ratio.std():.4f} | "
                         f"{np.abs(ratio - 1).max():.4f} |")
    return lines


if __name__ == "__main__":
    main()
