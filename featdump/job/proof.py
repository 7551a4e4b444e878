"""Proof: a run that is not the reference path (a CUDA device, bf16/fp16, --compile, --decode gpu, --fast-decode)
proves its rows as it goes. A seeded sample of its images (most from the first batch, so a bad configuration fails
within seconds, the rest spread over the job, so a fault that shows later is caught too) is recomputed on the
reference path: the CPU, fp32, eager, hooks, the original files decoded on the CPU with the model's exact
preprocessing. Per layer the largest and the median relative error are recorded in the output; a layer beyond its
configuration's tolerance (`tolerances`), or non-finite where the reference is finite, stops the run with one line.
Under fp16 every batch is also watched for values that overflowed (inf where fp32 is finite).
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
from featdump.inputs.loader import Batch, collate
from featdump.inputs.preprocess import Preprocess
from featdump.job.tolerances import tolerance, ways_out

log = logging.getLogger("featdump")
REFERENCE = "cpu, fp32, eager, hooks, the original files decoded on the CPU"
SEED = 0  # the sample is the same for every run of the same images
WATCHED = 4  # rows of a batch recomputed when fp16 made non-finite values in it


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


@dataclass
class Reference:
    """The reference path: the model's CPU float32 copy, the layers' snapshots, and the exact preprocessing."""

    module: nn.Module
    layers: list[Layer]
    snapshots: dict[str, Snapshot]
    preprocess: Preprocess  # the model's own preprocessing (no --fast-decode)


@dataclass
class _Sample:
    """Which source positions are proved: COUNT_FIRST of the first batch's (seeded), and LATER ones spread over
    the rest of the job."""

    count_first: int
    later: set[int]


def plan_sample(count: int, start: int, first_end: int, end: int) -> _Sample:
    """COUNT images of positions START..END: three quarters (at most the whole first batch, START..FIRST_END) from
    the first batch, the rest one per stretch of the positions after it, seeded."""
    count_first = min(count - min(count // 4, end - first_end), first_end - start)
    spread = min(count - count_first, end - first_end)
    rng = np.random.default_rng(SEED)
    stretches = np.linspace(first_end, end, spread + 1).astype(int)
    later = {int(rng.integers(low, high)) for low, high in zip(stretches[:-1], stretches[1:]) if high > low}
    return _Sample(count_first, later)


@dataclass
class Proof:
    """Checks the run's rows against the reference path batch by batch; `entry()` is what the output records."""

    reference: Reference | None  # None: the run is the reference path, or --proof 0
    images: ImageList
    parts: list[str]
    configuration: str  # the run's configuration, in words
    sample: _Sample
    watch_overflow: bool
    output: str  # where the committed rows are kept, for the message
    storage: str  # the stored dtype: float16 rows are rounded, the reference's are not
    errors: dict[str, list[float]] = field(default_factory=dict)  # layer: each proved row's error
    proved: list[str] = field(default_factory=list)  # the images' paths
    seconds: float = 0.0
    _first_done: bool = False

    @property
    def tolerance(self) -> float:
        return tolerance(self.parts, self.storage)

    def check(self, batch: Batch, features: dict[str, torch.Tensor]) -> None:
        """Prove the rows of BATCH this run's sample holds (FEATURES: the run's rows, in batch.positions' order)."""
        if self.reference is None or not features or not batch.positions:
            return
        rows = self._rows_to_prove(batch, features)
        if not rows:
            return
        started = time.perf_counter()
        positions = [batch.positions[row] for row in rows]
        got = {name: values[rows].float().cpu().double().flatten(1).numpy() for name, values in features.items()}
        expected = self._recompute(positions)
        for name, reference in expected.items():
            self.errors.setdefault(name, []).extend(row_errors(got[name], reference))
        self.proved += [self.images.paths[position] for position in positions]
        self.seconds += time.perf_counter() - started
        self._judge()

    def _rows_to_prove(self, batch: Batch, features: dict[str, torch.Tensor]) -> list[int]:
        rows = []
        if not self._first_done:
            self._first_done = True
            chosen = np.random.default_rng(SEED).permutation(len(batch.positions))[:self.sample.count_first]
            rows += sorted(int(row) for row in chosen)
        rows += [row for row, position in enumerate(batch.positions) if position in self.sample.later]
        if self.watch_overflow:
            rows += [row for row in _non_finite_rows(features) if row not in rows][:WATCHED]
        return sorted(set(rows))

    def _recompute(self, positions: list[int]) -> dict[str, np.ndarray]:
        """The reference path's rows of the images at POSITIONS, by layer, in float64."""
        reference = self.reference
        preprocess = reference.preprocess
        batch = collate(dataset_for(self.images, preprocess).__getitems__(positions))
        inputs = to_device_inputs(batch, preprocess, self.images, torch.device("cpu"))
        if batch.positions != positions:  # the image changed or vanished since the run read it
            raise ProofFailed(f"The proof could not read {len(positions) - len(batch.positions)} of its images again "
                              f"on the CPU ({self.images.paths[positions[0]]}, ...): were they changed while the run "
                              "read them? Run again once the images stay as they are, or with --proof 0.")
        with torch.autocast("cpu", enabled=False), Capture(reference.module, reference.layers,
                                                           reference.snapshots) as capture:
            captured = capture.run(inputs.float().contiguous())
        return {name: values.double().flatten(1).numpy() for name, values in captured.items()}

    def _judge(self) -> None:
        for name, errors in self.errors.items():
            worst = max(errors)
            if worst <= self.tolerance:
                continue
            what = ("non-finite (inf or NaN) where the reference path's are finite" if worst == np.inf else
                    f"{worst:.1e} of a row's largest value from the reference path's, beyond the {self.tolerance:.0e} "
                    f"documented for {self.configuration}")
            raise ProofFailed(f"Layer {name}: the rows of {self.configuration} are {what} ({REFERENCE}); the rows "
                              f"committed so far are kept in {self.output}. Run with {ways_out(self.parts)} "
                              "(docs/speed.md lists each configuration's tolerance).")

    def entry(self) -> dict:
        """What the output records of this proof (JSON values)."""
        if self.reference is None:
            return {"configuration": self.configuration, "reference": REFERENCE, "proved": False,
                    "why": "the run is the reference path" if not self.parts else "--proof 0"}
        return {"configuration": self.configuration, "reference": REFERENCE, "proved": bool(self.proved),
                "tolerance": self.tolerance, "images": self.proved, "seconds": round(self.seconds, 2),
                "layers": {name: {"largest": _plain(max(errors)), "median": _plain(float(np.median(errors)))}
                           for name, errors in self.errors.items()}}


def row_errors(got: np.ndarray, reference: np.ndarray) -> list[float]:
    """Per row: max |GOT - REFERENCE| / max |REFERENCE|; inf where GOT is non-finite and the reference is finite
    (values non-finite in both, alike, count as equal)."""
    errors = []
    for got_row, reference_row in zip(got, reference):
        finite = np.isfinite(reference_row)
        if not np.isfinite(got_row[finite]).all():
            errors.append(float("inf"))
            continue
        alike = ~finite & ((got_row == reference_row) | (np.isnan(got_row) & np.isnan(reference_row)))
        if not (finite | alike).all():
            errors.append(float("inf"))
            continue
        scale = max(float(np.abs(reference_row[finite]).max(initial=0.0)), 1e-30)
        errors.append(float(np.abs(got_row[finite] - reference_row[finite]).max(initial=0.0)) / scale)
    return errors


def _non_finite_rows(features: dict[str, torch.Tensor]) -> list[int]:
    """Rows holding inf or NaN in any layer (one synchronisation for all the layers)."""
    flags = torch.stack([~torch.isfinite(values.flatten(1)).all(dim=1) for values in features.values()]).any(dim=0)
    return torch.nonzero(flags.cpu()).flatten().tolist()


def _plain(value: float) -> float | str:
    return value if np.isfinite(value) else "inf"
