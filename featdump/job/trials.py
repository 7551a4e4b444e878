"""Trials: a few batches of one model and its layers in each configuration this machine offers (fp32, compiled,
bf16 and fp16 where they are native; on the CPU and on each GPU), each a real extract over generated images with its
proof, timed batch by batch. `featdump doctor` recommends the fastest configuration the proof accepted.

A configuration is timed from its first batch's end to its last's (the model's load, a compile's build and the
first batch's warm-up are left out and reported apart): the rate a long job runs at.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from featdump.errors import FeatdumpError, ProofFailed, UsageProblem
from featdump.forward import hardware
from featdump.job.settings import Settings

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Configuration:
    """How a run computes: its device, precision and whether it is compiled."""

    device: str  # cpu, cuda
    precision: str = "fp32"
    compile: bool = False

    @property
    def name(self) -> str:
        return " ".join([self.device, self.precision, *(["compile"] if self.compile else [])])

    @property
    def options(self) -> list[str]:
        """The extract options that choose it (beside the default: the CPU where there is no GPU, fp32, eager)."""
        return [*(["--device", self.device]), *(["--precision", self.precision] if self.precision != "fp32" else []),
                *(["--compile"] if self.compile else [])]


@dataclass
class Trial:
    """One configuration's outcome: ran (proved where it departs from the reference), stopped by the proof,
    failed, or skipped (and why); its rows per second once warm, and the seconds before its first batch ended."""

    configuration: Configuration
    outcome: str = "skipped"
    why: str = ""
    rows_per_second: float | None = None
    warm_up_seconds: float | None = None
    proved: bool = False

    @property
    def accepted(self) -> bool:
        return self.outcome == "ran"

    def as_json(self) -> dict:
        return {"configuration": self.configuration.name, **dataclasses.asdict(self.configuration),
                **{key: value for key, value in dataclasses.asdict(self).items() if key != "configuration"}}


@dataclass
class _Timing:
    """A Progress that keeps when each batch ended."""

    started: float = field(default_factory=time.perf_counter)
    ends: list[tuple[float, int]] = field(default_factory=list)

    def start(self, total: int, done: int, noun: str = "image") -> None:
        pass

    def advance(self, images: int) -> None:
        self.ends.append((time.perf_counter(), images))

    def found(self, rows: int) -> None:
        pass

    def close(self) -> None:
        pass

    def rate(self) -> float | None:
        """Rows per second after the first batch; None with fewer than two batches."""
        if len(self.ends) < 2:
            return None
        return sum(rows for _, rows in self.ends[1:]) / max(self.ends[-1][0] - self.ends[0][0], 1e-9)


def offered(here: hardware.Cpu, gpus: list[hardware.Gpu], compiles: bool, asked: list[str] | None = None
            ) -> list[Trial]:
    """Every configuration of this machine, each to run or skipped with why. ASKED (words among cpu, cuda, fp32,
    bf16, fp16, compile) keeps the ones it names, and a precision it names is tried even where it is not native."""
    trials = [Trial(Configuration(device, precision, compiled)) for device in ["cpu", *(["cuda"] if gpus else [])]
              for precision in PRECISIONS for compiled in (False, True)]
    if asked:
        trials = [trial for trial in trials if _named(trial.configuration, asked)]
    for trial in trials:
        trial.why = _why_not(trial.configuration, here, gpus, compiles, asked or [])
        trial.outcome = "skipped" if trial.why else "to run"
    return trials


def _named(configuration: Configuration, asked: list[str]) -> bool:
    devices = [word for word in asked if word in ("cpu", "cuda")] or ["cpu", "cuda"]
    precisions = [word for word in asked if word in PRECISIONS] or list(PRECISIONS)
    return (configuration.device in devices and configuration.precision in precisions
            and (not configuration.compile or "compile" in asked))


def _why_not(configuration: Configuration, here: hardware.Cpu, gpus: list[hardware.Gpu], compiles: bool,
             asked: list[str]) -> str:
    """Why CONFIGURATION is not tried here ("" when it is)."""
    if configuration.compile and not compiles:
        return "no C++ compiler for AOTInductor here"
    if configuration.device == "cpu" and not here.native(configuration.precision) and \
            configuration.precision not in asked:
        return f"no native {configuration.precision} kernels on this CPU: about {hardware.EMULATED_COST}"
    if configuration.device == "cuda" and configuration.precision == "bf16" and \
            not all(gpu.native_bf16 for gpu in gpus):
        return "no native bf16 kernels on this GPU"
    return ""


def write_images(folder: Path, count: int, size: int = 320, seed: int = 0) -> Path:
    """COUNT generated JPEGs (smooth random colours, SIZE pixels square) in FOLDER."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for index in range(count):
        coarse = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(coarse).resize((size, size), Image.BICUBIC).save(folder / f"{index:05d}.jpg", quality=90)
    return folder


def run_trial(trial: Trial, base: Settings, images: Path, work: Path) -> Trial:
    """TRIAL's configuration over IMAGES with BASE's model, layers and batch size, into a file under WORK."""
    from featdump.job.runner import extract

    configuration = trial.configuration
    settings = dataclasses.replace(base, images=str(images), output=work / f"{configuration.name.replace(' ', '-')}.h5",
                                   device=configuration.device, precision=configuration.precision,
                                   compile=configuration.compile, overwrite=True)
    timing = _Timing()
    try:
        summary = extract(settings, timing)
    except ProofFailed as error:
        trial.outcome, trial.why = "stopped by the proof", str(error)
        return trial
    except FeatdumpError as error:
        if isinstance(error, UsageProblem) and configuration == Configuration("cpu"):
            raise  # the model, its weights or layers as asked: wrong in every configuration, said once
        trial.outcome, trial.why = "failed", str(error)
        return trial
    except (RuntimeError, torch.OutOfMemoryError) as error:  # a kernel this machine lacks, a compile that broke
        trial.outcome, trial.why = "failed", f"{type(error).__name__}: {str(error).splitlines()[0]}"
        return trial
    trial.outcome, trial.why = "ran", ""
    trial.rows_per_second = timing.rate()
    trial.warm_up_seconds = round(timing.ends[0][0] - timing.started, 1) if timing.ends else None
    trial.proved = bool(summary.proof and summary.proof.get("proved"))
    return trial


def run_trials(trials: list[Trial], base: Settings, count: int, report=lambda trial: None) -> list[Trial]:
    """Every trial to run over COUNT generated images (REPORT called after each); the skipped ones as they are."""
    with tempfile.TemporaryDirectory(prefix="featdump-doctor-") as folder:
        images = write_images(Path(folder) / "images", count)
        for trial in trials:
            if trial.outcome == "to run":
                run_trial(trial, base, images, Path(folder))
                report(trial)
    return trials


def recommended(trials: list[Trial]) -> Trial | None:
    """The fastest trial the proof accepted."""
    timed = [trial for trial in trials if trial.accepted and trial.rows_per_second]
    return max(timed, key=lambda trial: trial.rows_per_second, default=None)


def reference_trial(trials: list[Trial]) -> Trial | None:
    """The trial of the reference path (the CPU, fp32, eager) where it ran."""
    return next((trial for trial in trials if trial.configuration == Configuration("cpu") and trial.accepted), None)


def payback_rows(trial: Trial, reference: Trial) -> int | None:
    """The rows after which TRIAL's faster rate has won back its later first batch against REFERENCE's (a compile's
    build, a GPU's start); None where it starts no later or runs no faster."""
    if None in (trial.rows_per_second, trial.warm_up_seconds, reference.rows_per_second, reference.warm_up_seconds):
        return None
    later = trial.warm_up_seconds - reference.warm_up_seconds
    saved_per_row = 1 / reference.rows_per_second - 1 / trial.rows_per_second
    return math.ceil(later / saved_per_row) if later > 0 and saved_per_row > 0 else None


def command_line(trial: Trial, base: Settings, images: str = "IMAGES", output: str = "OUT.h5") -> str:
    """The extract command of TRIAL's configuration, for BASE's model, layers and weights, to copy."""
    words = ["featdump", "extract", "-m", base.model, "-l", ",".join(base.layers)]
    if base.weights != "DEFAULT":
        words += ["-w", base.weights]
    if base.batch_size is not None:
        words += ["-b", str(base.batch_size)]
    return shlex.join([*words, *trial.configuration.options, images, output])
