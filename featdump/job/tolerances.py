"""Tolerances: how far a run's rows may be from the reference path's (CPU, fp32, eager, hooks, the original files
decoded on the CPU) in each configuration, and what to do when they are farther. One table, with the figures that
set each entry; `featdump.job.proof` judges by it.

An error is per row: max |got - reference| / max |reference| over the row. A configuration's tolerance is the sum
of its parts' (their errors add at worst), about 4x the largest error measured, so that a sound run never trips it
while a fault (a copy raced, a kernel wrong, a wrong layer) does: those are errors of order 1.

Measured with `python benchmarks/precision.py` on the CPU (random resnet18 layer2/layer4/avgpool, and the small CNN
and ViT of tests/test_compile.py; 16 images; the table is in benchmarks/RESULTS.md). Where a part runs only on a GPU
its figure is not measured yet: its entry is a bound from the CPU's figures, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    """One way a run departs from the reference: its tolerance, where it comes from, and the way back."""

    tolerance: float
    measured: str  # the figure behind the tolerance, or that none is measured yet
    way_out: str  # what to run instead when the proof fails


PARTS: dict[str, Part] = {
    "cuda": Part(1e-3, "not measured on a GPU yet: fp32 with TF32 off differs from the CPU by kernel order alone "
                       "(the CUDA tests allow 1e-4 per row)", "--device cpu"),
    "bf16": Part(5e-2, "largest 1.2e-2 on the CPU (resnet18 layer4; 8 bits of mantissa)", "--precision fp32"),
    "fp16": Part(1e-2, "largest 1.4e-3 on the CPU (resnet18 layer4)", "--precision bf16 (fp32's range) or fp32"),
    "compile": Part(1e-4, "largest 3.0e-6 compiled vs eager in fp32 on the CPU (resnet18 layer4)", "no --compile"),
    "gpu decode": Part(5e-2, "not measured on a GPU yet: nvJPEG upsamples chroma unlike libjpeg (inputs differ by "
                             "about 1 level of 255)", "--decode cpu"),
    "fast decode": Part(1e-1, "largest 1.8e-2 on the CPU (the small ViT's encoder.ln; 2048x1536 JPEGs decoded "
                              "at half scale)", "no --fast-decode"),
}


# Rows stored as float16 are rounded to 11 bits (half a unit: 2^-11 of the value); the reference's are compared in
# float32, so that rounding is allowed on top of the configuration's.
STORAGE_ROUNDING = {"float32": 0.0, "float16": 2.0**-11}


def tolerance(parts: list[str], storage: str = "float32") -> float:
    """The tolerance of a run departing from the reference in PARTS, storing its rows as STORAGE."""
    return sum(PARTS[part].tolerance for part in parts) + STORAGE_ROUNDING[storage]


def ways_out(parts: list[str]) -> str:
    """What to run instead, for the message of a failed proof."""
    return "; or ".join(PARTS[part].way_out for part in parts)
