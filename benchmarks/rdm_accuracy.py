"""How exact featdump's RDMs are on a layer whose rows correlate highly: resnet18 (random weights) `avgpool` over
ImageNet-size JPEGs (benchmarks/data), against float64 references (rsatoolbox's correlation and euclidean, numpy's
cosine) computed from the same stored float32 rows, and against a plain float32 Gram as the baseline.

    python -m benchmarks.rdm_accuracy [--images 256]

Prints, per metric: the largest entry, featdump's largest error over it, its worst relative error on the 1% of
smallest distances, and the same for the plain float32 Gram. Target (issue 40): 1e-5 of the largest entry.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np

import featdump
from benchmarks.common import make_images, timed_featdump

HERE = Path(__file__).resolve().parent



def references(rows: np.ndarray, metric: str) -> np.ndarray:
    wide = rows.reshape(len(rows), -1).astype(np.float64)
    if metric == "cosine":
        unit = wide / np.linalg.norm(wide, axis=1, keepdims=True)
        return 1.0 - unit @ unit.T
    from rsatoolbox.data import Dataset
    from rsatoolbox.rdm import calc_rdm

    return calc_rdm(Dataset(wide), method=metric).get_matrices()[0]


def plain_float32(rows: np.ndarray, metric: str) -> np.ndarray:
    """The RDM from one float32 Gram of the rows as stored (centred per row for correlation): the usual recipe."""
    values = rows.reshape(len(rows), -1).astype(np.float32)
    if metric == "correlation":
        values = values - values.mean(1, keepdims=True)
    gram = values @ values.T
    norms = np.diag(gram).astype(np.float64)
    if metric == "euclidean":
        return (norms[:, None] + norms[None, :] - 2 * gram) / values.shape[1]
    return 1.0 - gram / np.sqrt(norms[:, None] * norms[None, :])


def errors(ours: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    off = ~np.eye(len(expected), dtype=bool)
    smallest = expected[off] <= np.quantile(expected[off], 0.01)
    worst = np.abs(ours[off] - expected[off])
    return float(worst.max() / expected[off].max()), float((worst[smallest] / expected[off][smallest]).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    count = parser.parse_args().images

    for kind, images in (("plain", make_images(HERE / "data" / "images", count)),
                         ("contrast", make_images(HERE / "data" / "contrast-images", count, contrast=0.5, seed=1))):
        output = HERE / "data" / f"accuracy-avgpool-{kind}-{count}.h5"
        if not output.exists():
            timed_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", images, output,
                           what="the extraction")
        print(f"\nImages: {kind} ({images})")
        compare(output)


def compare(output: Path) -> None:
    rows = featdump.load(output, "avgpool").features
    rows = rows.reshape(len(rows), -1)
    print(f"resnet18 avgpool, {len(rows)} images, {rows.shape[1]} features; median correlation between rows "
          f"{np.median(np.corrcoef(rows)[~np.eye(len(rows), dtype=bool)]):.5f}")
    print("| metric | largest entry | featdump: error / largest | featdump: worst relative, smallest 1% | "
          "plain float32: error / largest | plain float32: worst relative, smallest 1% |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for metric in ("correlation", "cosine", "euclidean"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = references(rows, metric)
        np.fill_diagonal(expected, 0.0)
        ours = featdump.rdm(output, "avgpool", metric=metric, device="cpu")["avgpool"]
        plain = plain_float32(rows, metric)
        print(f"| {metric} | {expected.max():.3e} | {errors(ours, expected)[0]:.1e} | {errors(ours, expected)[1]:.1e} "
              f"| {errors(plain, expected)[0]:.1e} | {errors(plain, expected)[1]:.1e} |")


if __name__ == "__main__":
    main()
