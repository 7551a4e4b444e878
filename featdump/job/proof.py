"""Proof: a run that is not the reference path (a CUDA device, bf16/fp16, --compile, --decode gpu, --fast-decode)
proves the rows it stores as it goes. A sample of its images (a quarter from the first batch, spread evenly over it
and the same in every run of the job, so a bad configuration fails within seconds and the precision's fit is judged
on rows every run proves; the rest drawn anew each run, one in each stretch of the job, so a fault that shows later
is met too, and a rerun proves other rows) is recomputed on the reference path: the CPU, fp32, eager, hooks, the
original files decoded on the CPU with the model's exact preprocessing; and, where the run's departures can be
emulated on the CPU (bf16/fp16 autocast, the fast decode), once more in that emulation. The rows judged are the ones
the writer receives, after the copy to the host and the cast to the storage dtype (`output.write_behind` hands them
over), so a raced copy, a wrong cast or a row of another image is seen where it would be stored. Per layer the
errors are recorded in the output and judged by `tolerances`; a layer beyond them stops the run with one line,
before the batch is written.

Under bf16/fp16 every batch is also watched, whatever --proof says: a row holding inf or NaN is recomputed in fp32,
and one that is finite there stops the run (`--proof 0` turns off the sampled recomputation, not the watch).
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from featdump.errors import ProofFailed
from featdump.forward.hooks import Capture
from featdump.forward.layers import Layer, Snapshot
from featdump.inputs import ImageList
from featdump.inputs.clips import dataset_for
from featdump.inputs.gpu_decode import to_device_inputs
from featdump.inputs.loader import collate
from featdump.inputs.preprocess import Preprocess
from featdump.job import tolerances
from featdump.job.channels import MIN_ROWS, ChannelMeans, ChannelScales
from featdump.job.proof_measures import (  # noqa: F401  (row_errors: the proof's measure, named here too)
    Judged,
    by_channel,
    chosen_of,
    finite_max,
    nearest_row,
    plain,
    row_errors,
)
from featdump.job.sampling import Sample

log = logging.getLogger("featdump")
REFERENCE = "cpu, fp32, eager, hooks, the original files decoded on the CPU"
WATCHED = 4  # rows of a batch recomputed when a reduced precision made non-finite values in it
_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def departures(device: torch.device, precision: str, compiled: bool, decode: str, fast_decode: bool) -> list[str]:
    """How a run differs from the reference path (`tolerances.PARTS` names); none for the reference itself."""
    return [part for part, used in (("cuda", device.type == "cuda"), (precision, precision != "fp32"),
                                    ("compile", compiled), ("gpu decode", decode == "gpu"),
                                    ("fast decode", fast_decode)) if used]


def describe_configuration(device: torch.device, parts: list[str]) -> str:
    """The run's configuration in words: its device (the GPU's name), precision, compile and decoding."""
    where = str(device)
    if device.type == "cuda":
        try:
            where += f" ({torch.cuda.get_device_name(device)})"
        except (RuntimeError, AssertionError, AttributeError):  # a CUDA made up by a test has no name
            pass
    return ", ".join([where, *(part for part in parts if part != "cuda")])


def reference_copy(module: nn.Module) -> nn.Module:
    """MODULE as the reference path runs it: a copy, on the CPU, in float32 (made before the run's is placed)."""
    return copy.deepcopy(module).cpu().float().eval()


@dataclass(frozen=True)
class Emulation:
    """The run's departures as the CPU emulates them: its autocast precision and its decoding."""

    precision: str = "fp32"
    preprocess: Preprocess | None = None  # the run's own (--fast-decode); None: the exact one

    @property
    def emulates(self) -> bool:
        return self.precision != "fp32" or self.preprocess is not None


@dataclass
class Reference:
    """The reference path: the model's CPU float32 copy, the layers' snapshots, the exact preprocessing, and the
    emulation of the run's departures."""

    module: nn.Module
    layers: list[Layer]
    snapshots: dict[str, Snapshot]
    preprocess: Preprocess  # the model's own preprocessing (no --fast-decode)
    emulation: Emulation = field(default_factory=Emulation)


@dataclass
class _Evidence:
    """One layer's proof so far: each proved row's errors, the emulation's, and the channel shift."""

    largest: list[float] = field(default_factory=list)  # max |run - fp32| / max |fp32|, per row
    whole: list[float] = field(default_factory=list)  # ||run - fp32|| / ||fp32||, per row
    emulated_largest: list[float] = field(default_factory=list)
    emulated_whole: list[float] = field(default_factory=list)
    shift: ChannelMeans = field(default_factory=ChannelMeans)  # of the run's rows - the emulated rows
    emulated_shift: ChannelMeans = field(default_factory=ChannelMeans)  # of the emulated rows - the fp32 rows
    scale: ChannelScales = field(default_factory=ChannelScales)  # of the run's rows against the emulated rows
    emulated_scale: ChannelScales = field(default_factory=ChannelScales)  # of the emulated rows against fp32's
    fixed: list[bool] = field(default_factory=list)  # per row: one every run of the job proves (its first batch's)


@dataclass
class Proof:
    """Checks the rows the writer receives against the reference path batch by batch; `entry()` is what the output
    records."""

    reference: Reference | None  # None: the run is the reference path (or --proof 0 at fp32)
    images: ImageList
    parts: list[str]
    configuration: str  # the run's configuration, in words
    sample: Sample | None  # None: --proof 0 (the watch alone)
    watch_non_finite: bool  # bf16/fp16: rows with inf or NaN are recomputed in fp32
    storage: str  # the stored dtype: float16 rows are rounded, the reference's are not
    row_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # each layer's stored row
    channel_axes: dict[str, int | None] = field(default_factory=dict)  # per layer (`channel_axis`)
    evidence: dict[str, _Evidence] = field(default_factory=dict)
    proved: list[str] = field(default_factory=list)  # the rows' keys: a path, or a clip's "path @ start s"
    seconds: float = 0.0
    _first_done: bool = False

    def ran_eager(self) -> None:
        """The run's --compile fell back to eager: it departs without "compile", and its record says so; with no
        other departure it ran the reference path, whose record holds no bounds (its rows differ from their
        recomputation in other batches by fp32's rounding alone, which a bound of 0 would call infinitely far)."""
        if "compile" in self.parts:
            self.parts = [part for part in self.parts if part != "compile"]
            self.configuration = ", ".join(words for words in self.configuration.split(", ") if words != "compile")
            if not self.parts:
                self.reference = None

    def check(self, positions: list[int], rows: dict[str, np.ndarray]) -> None:
        """Prove the ROWS the writer is about to store for the source POSITIONS (called on the writer's thread);
        ProofFailed before they are written when a layer is beyond its bound."""
        if self.reference is None or not rows or not positions:
            return
        started = time.perf_counter()
        fixed, drawn = self._sampled_rows(positions)
        sampled = sorted(set(fixed) | set(drawn))
        watched = [row for row in self._non_finite_rows(rows) if row not in sampled][:WATCHED]
        if fixed:
            self._prove(positions, rows, fixed, emulate=True, fixed=True)
        if drawn:
            self._prove(positions, rows, [row for row in drawn if row not in fixed], emulate=True)
        if watched:
            self._prove(positions, rows, watched, emulate=False)
        self.seconds += time.perf_counter() - started
        if sampled or watched:
            self._judge()

    def _sampled_rows(self, positions: list[int]) -> tuple[list[int], list[int]]:
        """The rows of this batch to prove: (those every run of the job proves: the first batch's, spread evenly
        over it; those drawn by this run's seed)."""
        if self.sample is None:
            return [], []
        fixed = []
        if not self._first_done:
            self._first_done = True
            count = min(self.sample.count_first, len(positions))
            fixed = sorted({int(row) for row in np.linspace(0, len(positions) - 1, count).round()}) if count else []
        drawn = [row for row, position in enumerate(positions) if position in self.sample.later and row not in fixed]
        return fixed, drawn

    def _non_finite_rows(self, rows: dict[str, np.ndarray]) -> list[int]:
        if not self.watch_non_finite:
            return []
        flags = np.zeros(len(next(iter(rows.values()))), dtype=bool)
        for values in rows.values():
            flags |= ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
        return np.flatnonzero(flags).tolist()

    def _prove(self, positions: list[int], rows: dict[str, np.ndarray], chosen: list[int], emulate: bool,
               fixed: bool = False) -> None:
        """Recompute the CHOSEN rows (fp32, and emulated when EMULATE) and add their errors to the evidence (FIXED:
        rows every run of the job proves, on which the precision's fit is judged)."""
        if not chosen:
            return
        chosen_positions = [positions[row] for row in chosen]
        reference = self._recompute(chosen_positions, Emulation())
        emulation = self.reference.emulation
        emulated = self._recompute(chosen_positions, emulation) if emulate and emulation.emulates else reference
        for name, expected in reference.items():
            got = rows[name][chosen].astype(np.float64).reshape(len(chosen), -1)
            evidence = self.evidence.setdefault(name, _Evidence())
            evidence.largest += row_errors(got, expected)
            evidence.whole += row_errors(got, expected, whole=True)
            evidence.fixed += [fixed] * len(chosen)
            if emulate:
                evidence.emulated_largest += row_errors(emulated[name], expected)
                evidence.emulated_whole += row_errors(emulated[name], expected, whole=True)
                self._add_channels(evidence.shift, evidence.scale, name, got, emulated[name], expected)
                self._add_channels(evidence.emulated_shift, evidence.emulated_scale, name, emulated[name], expected,
                                   expected)
            else:  # a watched row: judged by the emulation of the sampled ones
                evidence.emulated_largest += [np.nan] * len(chosen)
                evidence.emulated_whole += [np.nan] * len(chosen)
        self.proved += [self.images.row_key(position) for position in chosen_positions]

    def _add_channels(self, means: ChannelMeans, scales: ChannelScales, name: str, got: np.ndarray,
                      base: np.ndarray, expected: np.ndarray) -> None:
        """Add each row of (GOT - BASE) / the row's largest fp32 (EXPECTED) value to MEANS, and GOT against BASE
        to SCALES, by channel."""
        shape, axis = self.row_shapes.get(name, (got.shape[1],)), self.channel_axes.get(name)
        for got_row, base_row, expected_row in zip(got, base, expected):
            scale = float(np.abs(expected_row).max(initial=0.0))
            if scale == 0.0 or not (np.isfinite(got_row).all() and np.isfinite(base_row).all()):
                continue
            means.add(by_channel((got_row - base_row) / scale, shape, axis))
            scales.add(by_channel(got_row / scale, shape, axis), by_channel(base_row / scale, shape, axis))

    def _recompute(self, positions: list[int], emulation: Emulation) -> dict[str, np.ndarray]:
        """The rows of the images at POSITIONS on the reference path, or in EMULATION, by layer, in float64."""
        reference = self.reference
        preprocess = emulation.preprocess or reference.preprocess
        batch = collate(dataset_for(self.images, preprocess).__getitems__(positions))
        inputs = to_device_inputs(batch, preprocess, self.images, torch.device("cpu"))
        if batch.positions != positions:  # the image changed or vanished since the run read it
            raise ProofFailed(f"The proof could not read {len(positions) - len(batch.positions)} of its images again "
                              f"on the CPU ({self.images.paths[positions[0]]}, ...): were they changed while the run "
                              "read them?", "once the images stay as they are, or with --proof 0")
        autocast = _AUTOCAST.get(emulation.precision)
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None), \
                Capture(reference.module, reference.layers, reference.snapshots) as capture:
            captured = capture.run(inputs.float().contiguous())
        return {name: values.double().flatten(1).numpy() for name, values in captured.items()}

    def judged(self, name: str) -> Judged:
        """Layer NAME's evidence against its bounds (`tolerances`), each row by its own emulation."""
        evidence = self.evidence[name]
        largest = nearest_row(evidence.largest, evidence.emulated_largest, self.parts, self.storage, evidence.fixed)
        whole = nearest_row(evidence.whole, evidence.emulated_whole, self.parts, self.storage, evidence.fixed)
        shift, shift_bound, channel = _nearest_channel(evidence)
        fit = evidence.fixed if any(evidence.fixed) else [True] * len(evidence.fixed)  # a resumed run: its rows
        emulated = max(finite_max(chosen_of(evidence.emulated_largest, fit)),
                       finite_max(chosen_of(evidence.emulated_whole, fit)))
        return Judged(largest, whole, (shift, shift_bound, channel), _nearest_scale(evidence, self.parts), emulated)

    def _judge(self) -> None:
        precision, ceiling = tolerances.precision_of(self.parts), tolerances.ceiling(self.parts)
        for name, evidence in self.evidence.items():
            judged = self.judged(name)
            if max(evidence.largest) == np.inf:
                self._fail(name, "non-finite (inf or NaN) where the reference path's are finite")
            if judged.emulated > ceiling:
                raise ProofFailed(
                    f"Layer {name}: {precision} does not fit this model at this layer: the CPU's own {precision} "
                    f"takes its rows {judged.emulated:.1e} (of a row's largest value or size) from fp32's, beyond the "
                    f"{ceiling:.1e} {precision} may cost ({REFERENCE}; docs/proof.md).",
                    tolerances.way_out([precision]))
            (worst, largest_bound), (whole, whole_bound) = judged.largest, judged.whole
            if worst > largest_bound:
                self._fail(name, f"{worst:.1e} of a row's largest value from the reference path's, beyond the "
                                 f"{largest_bound:.1e} allowed for {self.configuration} at this layer")
            if whole > whole_bound:
                self._fail(name, f"{whole:.1e} of a row's size (its L2 norm) from the reference path's, beyond the "
                                 f"{whole_bound:.1e} allowed for {self.configuration} at this layer")
            shift, shift_bound, channel = judged.shift
            if shift > shift_bound:
                self._fail(name, f"shifted by {shift:.1e} of a row's largest value on average in channel {channel}, "
                                 f"beyond the {shift_bound:.1e} allowed for {self.configuration} at this layer (a "
                                 "systematic error)")
            scale, scale_bound, scaled, factor = judged.scale
            if scale > scale_bound:
                self._fail(name, f"scaled by {factor:.4f} in channel {scaled} against the emulation's, which moves "
                                 f"its values by {scale:.1e} of a row's largest value, beyond the {scale_bound:.1e} "
                                 f"allowed for {self.configuration} at this layer (a systematic error)")

    def _fail(self, name: str, what: str) -> None:
        raise ProofFailed(f"Layer {name}: the rows of {self.configuration} are {what} ({REFERENCE}; "
                          "docs/proof.md).", tolerances.way_out(self.parts))

    def entry(self) -> dict:
        """What the output records of this proof (JSON values)."""
        if self.sample is None or self.reference is None:
            return {"configuration": self.configuration, "reference": REFERENCE, "proved": False,
                    "why": "the run is the reference path" if not self.parts else "--proof 0"}
        layers = {}
        for name, evidence in self.evidence.items():
            judged = self.judged(name)
            layers[name] = {"largest": plain(max(evidence.largest)),
                            "median": plain(float(np.median(evidence.largest))),
                            "nearest": plain(judged.largest[0]), "bound": judged.largest[1],
                            "whole": plain(max(evidence.whole)), "whole_nearest": plain(judged.whole[0]),
                            "whole_bound": judged.whole[1],
                            "emulated": plain(finite_max(evidence.emulated_largest)),
                            "emulated_whole": plain(finite_max(evidence.emulated_whole)),
                            "channel_shift": judged.shift[0], "shift_bound": plain(judged.shift[1]),
                            "channel_scale": judged.scale[0], "scale_bound": plain(judged.scale[1]),
                            "scale_factor": judged.scale[3],
                            "used": plain(judged.used)}
        return {"configuration": self.configuration, "reference": REFERENCE, "proved": bool(self.proved),
                "emulated": tolerances.emulated(self.parts), "tolerance": max(
                    (layer["bound"] for layer in layers.values()), default=0.0),
                **({"ceiling": tolerances.ceiling(self.parts)} if tolerances.precision_of(self.parts) else {}),
                "rows": self.images.noun, "images": self.proved, "seed": self.sample.seed,
                "fit_rows": sum(next(iter(self.evidence.values())).fixed) if self.evidence else 0,
                "seconds": round(self.seconds, 2), "layers": layers}


def _nearest_scale(evidence: _Evidence, parts: list[str]) -> tuple[float, float, int, float]:
    """The channel whose scale (run against emulation) is nearest its bound: how far the scale moves its values
    (|factor - 1| x the channel's root mean square, in units of a row's largest value), its bound, its index and its
    factor. The bound (`tolerances.scale_bound`) grows with the emulation's own relative error of that channel (root
    mean square distance from fp32 over its size; at least the median channel's), and with the median channel's
    absolute error where the channel is no larger than that: a channel the precision barely moves is held to a
    small factor, one of near zeros (whose factor means nothing to rounding) is not; inf before MIN_ROWS rows."""
    scale, own = evidence.scale, evidence.emulated_scale
    effects, deviations = scale.effects(), scale.deviations()
    if scale.entries == 0 or own.products is None or own.squares.shape != effects.shape or \
            len(evidence.emulated_largest) < MIN_ROWS:
        channel = int(np.argmax(effects))
        return float(effects[channel]), np.inf, channel, 1.0 + float(deviations[channel])
    size, noise = scale.spread(scale.squares), own.spread(own.apart())
    relative = np.divide(noise, size, out=np.zeros_like(size), where=size > 0)
    bounds = tolerances.scale_bound(parts, np.maximum(relative, np.median(relative)), size, float(np.median(noise)))
    channel = int(np.argmax(effects / bounds))
    factor = float(scale.products[channel] / scale.squares[channel]) if scale.squares[channel] > 0 else 1.0
    return float(effects[channel]), float(bounds[channel]), channel, factor


def _nearest_channel(evidence: _Evidence) -> tuple[float, float, int]:
    """The channel whose mean shift (run - emulation) is nearest its bound (or farthest past it): its |shift|, its
    bound (SHIFT_MULTIPLE of the emulation's standard error of that channel, + SHIFT_FLOOR; inf before MIN_ROWS
    rows are proved) and its index."""
    shifts, errors = np.abs(evidence.shift.means()), evidence.emulated_shift.errors()
    if errors is None or errors.shape != shifts.shape:
        channel = int(np.argmax(shifts))
        return float(shifts[channel]), np.inf, channel
    bounds = tolerances.shift_bound(errors)
    channel = int(np.argmax(shifts / bounds))
    return float(shifts[channel]), float(bounds[channel]), channel


