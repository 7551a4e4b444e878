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

Each row is judged by its own emulation (its bound is MULTIPLE times how far the emulation takes that row, plus the
floor), so proving more rows never loosens the test of a row. The emulation tells rounding from a fault, but it must
not widen a bound past what the precision can honestly cost: CEILINGS caps the emulated part of a bound, and a layer
whose emulation itself takes a row beyond its precision's ceiling is not proved at all: that precision does not fit
the model at that layer (the way out: --precision fp32). A fourth test scales each channel: the least-squares factor
between the run's channel and the emulation's, over the proved rows and positions, is judged by what it does to the
values, in units of each row's largest value as the shift is: |factor - 1| times the channel's size (its root mean
square) may be that size times SCALE_MULTIPLE times the emulation's own relative error of that channel (its root
mean square distance from fp32 over its size; at least the median channel's) plus the floors of the emulated parts,
or, for a channel of near zeros, about twice the median channel's absolute error; and then the fixed bounds of the
parts that are not emulated and SCALE_FLOOR, which are not relative to the channel.
A precision's rounding is relative to each value, so a channel scaled by 2% is seen however small it is, where the
precision moves it far less; a kernel's summation order (a GPU, inductor's code) moves a value by a fraction of the
row's largest, so a channel of near zeros, whose factor means nothing there (1% of itself), is not held to one.

The figures behind the multiples, floors and ceilings are the panel's (`python benchmarks/proof_panel.py`, table in
benchmarks/RESULTS.md and docs/proof.md): 12 architectures at four depths, two seeds, no false alarm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MULTIPLE = 3.0  # how many times the emulation's farthest row a run's may be: kernels that round in another order
SHIFT_MULTIPLE = 6.0  # how many standard errors of the emulation's channel means a run's channel mean may be
SHIFT_FLOOR = 3e-3  # a channel's mean shift, in units of a row's largest value, that is never a fault (a sound
# bf16 resnet18 avgpool moves one by up to 2.6e-3 from its emulation: docs/proof.md)
SCALE_MULTIPLE = 2.0  # how many times the emulation's own relative error of a channel its scale may be from 1
SCALE_FLOOR = 1e-5  # a scale's effect on a channel (|factor - 1| x its root mean square, in units of a row's largest
# value) that is never a fault, whatever the configuration: a thousandth of a 2% scale of a typical channel
# The farthest the CPU's emulation of a precision may take a row from fp32 (both row errors) before the precision
# is judged not to fit the model at that layer. The panel's sound cells reach 0.037 (inception_v3 Mixed_7c, bf16)
# and 0.027 (efficientnet_v2_s's classifier, fp16); random mobilenet_v3_large in fp16 reaches 1.0 (its deep values
# underflow to zeros) and is stopped by it, as it should be.
CEILINGS = {"bf16": 0.1, "fp16": 0.1}


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


def bound(parts: list[str], emulated_error: float, storage: str = "float32", capped: bool = True) -> float:
    """How far a row may be (either row error) for a run departing in PARTS, whose emulation takes the same row
    EMULATED_ERROR away (0 when nothing is emulated), stored as STORAGE: the emulated part capped by the
    precision's ceiling (CAPPED: a row every run proves, on which the fit is judged)."""
    emulated = [PARTS[part] for part in parts if PARTS[part].emulated]
    fixed = sum(PARTS[part].allowance for part in parts if not PARTS[part].emulated)
    spread = MULTIPLE * emulated_error + sum(part.allowance for part in emulated) if emulated else 0.0
    return (min(spread, ceiling(parts)) if capped else spread) + fixed + STORAGE_ROUNDING[storage]


def ceiling(parts: list[str]) -> float:
    """The farthest from fp32 the run's precision (among PARTS) may honestly take a row; inf without one."""
    return min((CEILINGS[part] for part in parts if part in CEILINGS), default=float("inf"))


def precision_of(parts: list[str]) -> str | None:
    """The reduced precision among PARTS (bf16, fp16), or None."""
    return next((part for part in parts if part in CEILINGS), None)


def floor(parts: list[str]) -> float:
    """What every test allows whatever the emulation shows: the parts' floors and fixed bounds together."""
    return sum(PARTS[part].allowance for part in parts)


def scale_bound(parts: list[str], relative_noise, size, typical_noise: float = 0.0):
    """How far a channel's scale may move its values (|factor - 1| x its root mean square SIZE, in units of a row's
    largest value), where the emulation's own relative error of that channel is RELATIVE_NOISE (floats, or arrays:
    one per channel) and a typical channel's absolute error TYPICAL_NOISE: relative to the channel, SCALE_MULTIPLE x
    that noise and the emulated parts' floors (rounding is relative to each value); but a channel no larger than
    the typical absolute error (near zeros, left by a cancellation, it keeps the absolute rounding error of the
    values it was made from, the same in every row) is allowed about SCALE_MULTIPLE x that error, a channel far
    larger than it only a share of it that shrinks as the channel grows (`_near_zeros`); then, in the row's units,
    the fixed bounds of the parts not emulated (a kernel's summation order, inductor's code) and SCALE_FLOOR."""
    own = sum(PARTS[part].allowance for part in parts if PARTS[part].emulated)
    fixed = sum(PARTS[part].allowance for part in parts if not PARTS[part].emulated)
    relative = size * (SCALE_MULTIPLE * relative_noise + own)
    return np.maximum(relative, SCALE_MULTIPLE * _near_zeros(size, typical_noise)) + fixed + SCALE_FLOOR


def _near_zeros(size, typical_noise: float):
    """The absolute error a channel of root mean square SIZE may owe to the values it was made from:
    TYPICAL_NOISE x TYPICAL_NOISE / (TYPICAL_NOISE + SIZE), nearly all of TYPICAL_NOISE for a channel far smaller
    than it, half for one as large, and ever less for a larger one (there the precision's error is relative to the
    channel, and its relative error shows it)."""
    return typical_noise**2 / np.maximum(typical_noise + np.asarray(size, dtype=float), np.finfo(float).tiny)


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
