"""Reductions: bytes per image and img/s of resnet50's 16 bottleneck blocks (`layer*.*`) stored whole, in float16,
average-pooled, projected with srp:4096, and on a pca:256 fit.

    python benchmarks/reductions.py [--images 256] [--fit-images 320] [--only srp:4096,avgpool]

ImageNet-size JPEGs (benchmarks/data), resnet50 with random weights, the default workers and batch size, each
configuration a whole `featdump extract` command in its own process. img/s is the command's images over its
wall time, and over the time after the first batch (steady, from the progress log); pca:256 also reports its
fit pass (staging and fitting on --fit-images other images) apart. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from benchmarks.run import make_images, timed_featdump  # noqa: E402

CONFIGS = {
    "none": [],
    "float16": ["--dtype", "float16"],
    "avgpool": ["--reduce", "avgpool"],
    "srp:4096": ["--reduce", "srp:4096"],
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
    args = parser.parse_args()
    images = make_images(HERE / "data" / f"imagenet_{args.images}", args.images)
    fit = make_images(HERE / "data" / f"reference_{args.fit_images}", args.fit_images)
    folder = Path(tempfile.mkdtemp(prefix="featdump-reductions-", dir=HERE / "data"))
    rows = []
    try:
        for name in args.only.split(","):
            rows.append(run(name, images, fit, folder))
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print("\n| --reduce / --dtype | file | bytes per image | img/s (whole command) | img/s (without the fit) "
          "| projection matrices |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['name']} | {row['file'] / 1e6:.1f} MB | {row['bytes_per_image'] / 1e3:.1f} KB | "
              f"{row['rate']:.2f} | {row['rate_without_fit']:.2f} | {row['matrices']} |")


if __name__ == "__main__":
    main()
