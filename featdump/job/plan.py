"""What a run will do: its rows (the whole job's, listed once per warm worker), its shard, the settings fitted to
the model (a CPU-only model, the batch size), and the fingerprint it records."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from featdump.errors import UsageProblem
from featdump.forward.batch_size import DEFAULT as DEFAULT_BATCH
from featdump.forward.batch_size import choose_batch_size
from featdump.forward.device import (
    free_memory,
)
from featdump.inputs import ImageList, Patience, find_images
from featdump.inputs.clips import as_rows
from featdump.job import dependencies, warm
from featdump.job.identity import RunIdentity
from featdump.job.model import Model
from featdump.job.settings import Settings
from featdump.job.shards import Shard, choose_shard, plan_shard
from featdump.output import fingerprint as fingerprints
from featdump.sources.models import check_model_name, clip_of, cpu_only

log = logging.getLogger("featdump")


@dataclass
class Plan:
    """What this process does: its settings (a shard's own output), its images, and its place in the job."""

    settings: Settings
    images: ImageList
    shard: Shard | None
    whole_output: Path  # the job's output (a shard's merge target)
    shard_fingerprint: dict  # what a shard's file records of the whole job
    job_images: ImageList  # the whole job's images (a shard's are part of them)


def job_rows(settings: Settings) -> ImageList:
    """The rows of the whole job SETTINGS describes (every shard's): its images, or its videos' clips."""
    key = (*dependencies.run_key(settings), ("fresh", settings.update))  # an update walks anew (`listings`)
    return warm.shared("rows", key, lambda: as_rows(
        find_images(settings.images, patience=Patience(settings.store_patience), array=settings.array,
                    image_column=settings.image_column, label_column=settings.label_column, split=settings.split,
                    reader=settings.reader, reader_options=settings.reader_option, image_root=settings.image_root,
                    fresh=settings.update),
        settings.clip, settings.fps,
        settings.clip_every, clip_of(settings.model), settings.clip_anchor, settings.clip_pad, settings.clip_origin))


def make_plan(settings: Settings) -> Plan:
    check_model_name(settings.model)
    settings = _fitted_to_model(settings)
    images = job_rows(settings)
    shard = choose_shard(settings.shard)
    if shard is None:
        return Plan(settings, images, None, settings.output, {}, images)
    part = plan_shard(shard, settings.output, settings.shard_pattern, images)
    return Plan(dataclasses.replace(settings, output=part.output), part.images, shard, settings.output,
                part.fingerprint, images)


def _fitted_to_model(settings: Settings) -> Settings:
    """SETTINGS as the model can run them: a model that runs on the CPU only (quantized) refuses a CUDA device, a
    reduced precision and --compile in one line, and takes --device auto as the CPU."""
    why = cpu_only(settings.model)
    if why is None:
        return settings
    asked = [text for text, used in ((f"--device {settings.device}", settings.device.startswith("cuda")),
                                     (f"--precision {settings.precision}", settings.precision != "fp32"),
                                     ("--compile", settings.compile)) if used]
    if asked:
        raise UsageProblem(f"--model {settings.model}: {why}, so {', '.join(asked)} cannot apply; drop "
                           f"{'it' if len(asked) == 1 else 'them'}, or name the float model "
                           f"({settings.model.removeprefix('quantized_')}).")
    if settings.device == "auto":
        log.info("--model %s: %s; running on the CPU.", settings.model, why)
    return dataclasses.replace(settings, device="cpu")


def sized(settings: Settings, model: Model, noun: str) -> Settings:
    """SETTINGS with their batch size: -b's, or the default that fits the device's free memory (`batch_size`)."""
    if settings.batch_size is not None:
        return settings
    choice = choose_batch_size(model.infos, model.preprocess.input_shape, 4 if settings.precision == "fp32" else 2,
                               free_memory(model.device))
    if choice.size < DEFAULT_BATCH:
        log.info(choice.reason(noun))
    return dataclasses.replace(settings, batch_size=choice.size)


def fingerprint_for(plan: Plan, model: Model) -> dict:
    """What the run of PLAN with MODEL records of itself (`output.fingerprint`), before any PCA fit's identity."""
    resolved = RunIdentity.of(plan.settings, model).fingerprinted()
    layouts = {layer.name: layer.layout for layer in model.layers if layer.layout}
    return fingerprints.build(resolved, layouts, repr(model.preprocess.transforms), model.loaded.source, plan.images,
                              plan.shard_fingerprint)
