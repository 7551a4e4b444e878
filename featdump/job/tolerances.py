"""Tolerances: how far a run's rows may be from the reference path's (CPU, fp32, eager, hooks, the original files
decoded on the CPU), per layer, and what to run instead when they are farther. One table; `featdump.job.proof`
judges by it.

A departure the CPU can emulate (bf16 or fp16 autocast, --fast-decode's decoding) is judged against its own
emulation: the proof computes each sampled row twice, fp32 and emulated, and a layer's rows may be MULTIPLE times
as far from fp32 as the emulation's farthest row, plus the part's floor (for layers the emulation computes almost
exactly). A departure that cannot be emulated here (a CUDA kernel, nvJPEG, inductor's code) has a fixed bound. The
errors of the parts add. Two row errors are judged that way: the largest element's, max |got - fp32| / max |fp32|,
and the whole row's, ||got - fp32|| / ||fp32|| (a row of another image is far in the second even where one element
is not). A third test looks at each channel (`axis_kinds`' channel or feature axis): the mean of (got - emulated)
over the proved rows and positions, in units of each row's largest value, may be SHIFT_MULTIPLE standard errors of
the emulation's own mean of that channel (the spread of (emulated - fp32) from row to row; at least the median
channel's) plus SHIFT_FLOOR. The
systematic part of the precision's error (its rounded weights) is in both the run and the emulation and cancels;
what is left is noise, and a systematic error of one channel (a wrong scale or offset) that the row errors are too
coarse to see where the precision's own noise is large. It is judged from `proof.MIN_ROWS` proved rows on.

The figures behind the multiples and floors are the panel's (`python benchmarks/proof_panel.py`, table in
benchmarks/RESULTS.md and docs/proof.md): 12 architectures at four depths, two seeds, no false alarm.
"""

from __future__ import annotations

from dataclasses import dataclass

MULTIPLE = 3.0  # how many times the emulation's farthest row a run's may be: kernels that round in another order
SHIFT_MULTIPLE = 6.0  # how many standard errors of the emulation's channel means a run's channel mean may be
SHIFT_FLOOR = 1e-3  # a channel's mean shift, in units of a row's largest value, that is never a fault


@dataclass(frozen=True)
class Part:
    """One way a run departs from the reference: emulated on the CPU or not, its floor (emulated) or bound (not),
    where that figure comes from, and the options of the way back."""

    emulated: bool
    allowance: float  # emulated: the floor added to MULTIPLE x the emulation's error; else the bound
    measured: str  # the figure behind the allowance
    way_out: str  # the options that run without this part


PARTS: dict[str, Part] = {
    "cuda": Part(False, 1e-3, "not measured on a GPU yet: fp32 with TF32 off differs from the CPU by kernel order "
                              "alone (the CUDA tests allow 1e-4 per row)", "--device cpu"),
    "bf16": Part(True, 2.0**-8, "emulated by CPU bf16 autocast; the floor is one bf16 rounding (2^-8)",
                 "--precision fp32"),
    "fp16": Part(True, 2.0**-10, "emulated by CPU fp16 autocast; the floor is one fp16 rounding (2^-10)",
                 "--precision fp32"),
    "compile": Part(False, 1e-4, "largest 3.0e-6 compiled vs eager in fp32 on the CPU (resnet18 layer4); under "
                                 "bf16/fp16 the precision's emulated allowance covers inductor's other rounding",
                    "no --compile"),
    "gpu decode": Part(False, 5e-2, "not measured on a GPU yet: nvJPEG upsamples chroma unlike libjpeg (inputs "
                                    "differ by about 1 level of 255)", "--decode cpu"),
    "fast decode": Part(True, 1e-3, "emulated by the same reduced decode on the CPU", "no --fast-decode"),
}

# Rows stored as float16 are rounded to 11 bits (half a unit: 2^-11 of the value); the reference's are compared in
# float32, so that rounding is allowed on top of the configuration's.
STORAGE_ROUNDING = {"float32": 0.0, "float16": 2.0**-11}


def bound(parts: list[str], emulated_error: float, storage: str = "float32") -> float:
    """How far a layer's rows may be (either row error) for a run departing in PARTS, whose emulation's farthest
    row is EMULATED_ERROR away (0 when nothing is emulated), stored as STORAGE."""
    emulated = [PARTS[part] for part in parts if PARTS[part].emulated]
    fixed = sum(PARTS[part].allowance for part in parts if not PARTS[part].emulated)
    spread = MULTIPLE * emulated_error + sum(part.allowance for part in emulated) if emulated else 0.0
    return spread + fixed + STORAGE_ROUNDING[storage]


def shift_bound(noise):
    """How far a channel's mean may be from the emulation's, where that has the standard error NOISE (a float, or
    an array of them: one bound per channel)."""
    return SHIFT_MULTIPLE * noise + SHIFT_FLOOR


def emulated(parts: list[str]) -> list[str]:
    """The parts of PARTS that the proof emulates on the CPU."""
    return [part for part in parts if PARTS[part].emulated]


def way_out(parts: list[str]) -> str:
    """How to run without PARTS, as the words after "Run again": "with --precision fp32 and without --compile"."""
    options = [PARTS[part].way_out for part in parts]
    flags = " ".join(option for option in options if option.startswith("--"))
    dropped = ", ".join(option.removeprefix("no ") for option in options if option.startswith("no "))
    return " and ".join(words for words in (flags and f"with {flags}", dropped and f"without {dropped}") if words)
