"""The chance that the proof sees a fault that touches some rows after the first batch, measured by injecting it
into many real runs, beside the sampler's formula (`featdump.job.sampling.chance_of_seeing`, docs/proof.md).

    python -m benchmarks.proof_chance [--runs 100] [--images 256] [--batch 8] [--proof 8]

A small convolutional network (random, seed 0) over IMAGES small photos in batches of BATCH, bf16, --proof PROOF;
each run draws its own sample, and each fault is injected in the copy of the rows to the host (`tests/faults.py`):
every 7th batch's rows shifted by one; one batch (drawn at random after the first) holding the previous batch's
rows (a stale buffer); two neighbouring rows of one batch swapped. A run that the proof stops has seen it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from featdump.errors import ProofFailed
from featdump.job.runner import extract
from featdump.job.sampling import chance_of_seeing
from featdump.job.settings import Settings
from tests.makers import faults

REPO = Path(__file__).resolve().parents[1]


MODEL = '''
import torch
from torch import nn


def small():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten())
'''


def write_images(folder: Path, count: int) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        small = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
        Image.fromarray(small).resize((40, 40), Image.BICUBIC).save(folder / f"{index:04d}.png")
    return folder


class Batches:
    """A fault keyed by the batch's number (0: the first), counted per run."""

    def __init__(self, change):
        self.change, self.number, self.previous = change, -1, None

    def __call__(self, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.number += 1
        changed = self.change(self.number, rows, self.previous)
        self.previous = {name: values.clone() for name, values in rows.items()}
        return changed


def every_seventh(number, rows, previous):
    return faults.shifted(rows) if number and number % 7 == 0 else rows


def stale_at(chosen: int):
    def fault(number, rows, previous):
        return previous if number == chosen and previous is not None else rows
    return fault


def swapped_at(chosen: int, row: int):
    def fault(number, rows, previous):
        if number != chosen:
            return rows
        swapped = {name: values.clone() for name, values in rows.items()}
        for name, values in swapped.items():
            values[[row, row + 1]] = rows[name][[row + 1, row]]
        return swapped
    return fault


def caught(images: Path, work: Path, fault, batch: int, proof: int) -> bool:
    settings = Settings(model="chance_model:small", layers=("3",), images=images, output=work / "run.h5",
                        precision="bf16", batch_size=batch, proof=proof, overwrite=True, num_workers=0)
    try:
        with faults.injected(Batches(fault)):
            extract(settings)
    except ProofFailed:
        return True
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--proof", type=int, default=8)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="featdump-chance-"))
    (work / "chance_model.py").write_text(MODEL)
    os.chdir(work)  # featdump imports a factory from the current folder
    images = write_images(work / "images", args.images)
    batches = args.images // args.batch
    after = args.images - args.batch  # the rows after the first batch
    rng = np.random.default_rng(0)
    cases = {
        "every 7th batch shifted": (lambda: every_seventh,
                                    len(range(7, batches, 7)) * args.batch / after, "even"),
        "one stale batch": (lambda: stale_at(int(rng.integers(1, batches))), args.batch / after, "one place"),
        "two rows swapped": (lambda: swapped_at(int(rng.integers(1, batches)), int(rng.integers(0, args.batch - 1))),
                             2 / after, "one place"),
    }
    print(f"{args.runs} runs each: {args.images} images in batches of {args.batch}, --proof {args.proof}, bf16\n")
    print("| fault | rows touched after the first batch | seen (measured) | the formula |")
    print("| --- | ---: | ---: | ---: |")
    for name, (make, fraction, kind) in cases.items():
        seen = sum(caught(images, work, make(), args.batch, args.proof) for _ in range(args.runs))
        even, one_place = chance_of_seeing(args.proof, args.batch, args.images, fraction)
        expected = even if kind == "even" else one_place
        print(f"| {name} | {fraction:.1%} | {seen / args.runs:.0%} ({seen} of {args.runs}) | {expected:.0%} |",
              flush=True)


if __name__ == "__main__":
    main()
