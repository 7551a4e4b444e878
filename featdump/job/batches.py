"""The batch loop, on one screen: read a batch, forward, capture, write (behind), with its stage times; `fill` runs
a list of images through a model into a writer's file and finishes it. Extraction, updates and PCA fits all fill
through it."""

from __future__ import annotations

import logging
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from featdump.errors import BadImage, Interrupted
from featdump.forward.compiling import compile_capture, compiled_note
from featdump.forward.device import (
    autocast,
    out_of_memory_as_failure,
    padded,
    resolve_decode,
)
from featdump.forward.hooks import Capture
from featdump.inputs import ImageList
from featdump.inputs.clips import dataset_for
from featdump.inputs.gpu_decode import to_device_inputs
from featdump.inputs.loader import Batch, batches_of, make_loader
from featdump.inputs.workers import choose_workers
from featdump.job import warm
from featdump.job.channels import channel_axis
from featdump.job.identity import RunIdentity
from featdump.job.model import Model, departures_of, preprocessing_name
from featdump.job.proof import (
    Emulation,
    Proof,
    Reference,
    describe_configuration,
)
from featdump.job.report import nothing_read
from featdump.job.sampling import plan_sample
from featdump.job.settings import Settings
from featdump.job.signals import StopSignals
from featdump.output.lock import OutputLock, waiting_lock
from featdump.output.progress import ProgressRecord
from featdump.output.write_behind import WriteBehind
from featdump.output.writer import FeatureWriter
from featdump.progress import Progress

log = logging.getLogger("featdump")


def fill(writer: FeatureWriter, images: ImageList, settings: Settings, model: Model, lock: OutputLock,
          progress: Progress, offset: int = 0, task: str | None = None, keep_empty: bool = True) -> Path:
    """Every image of IMAGES that WRITER's file has not committed yet, through the model into it; then finish it.
    OFFSET: the images the job's output held before this list (an update's), for the progress record. A file that
    holds no row at the end is removed unless KEEP_EMPTY (a shard's: its job may have rows elsewhere), and the run
    fails (NothingRead): a job that read nothing never looks finished."""
    start = writer.committed_images
    record = ProgressRecord(settings.output, writer.path, offset + len(images), offset + start,
                            {name: list(spec.shape) for name, spec in model.specs.items()}, task, images.noun)
    try:
        example = torch.randn((2, *model.preprocess.input_shape), generator=torch.Generator().manual_seed(0))
        identity = RunIdentity.of(settings, model)
        graph_key = identity.graph()
        capture = Capture(model.loaded.module, model.layers, model.snapshots(), prune=True,
                          example=example.to(model.device).contiguous(memory_format=model.memory_format),
                          checked=warm.known("graph checked", graph_key))
        with StopSignals() as stop, capture:
            if capture.strategy == "graph":
                warm.note("graph checked", graph_key)
            cache = Path(settings.compile_cache) if settings.compile_cache else None
            compiled = compile_capture(capture, cache, identity.compiled(), waiting_lock) \
                if settings.compile else None
            progress.start(len(images), start, images.noun)
            job = _Job(settings, images, model, capture, writer, record, offset,
                       owned_files=(writer.path, *([lock.path] if lock.path else [])),
                       proof=_proof(settings, model, images, start))
            _run_batches(job, progress, stop)
            if compiled is None or not compiled.result.compiled:
                job.proof.ran_eager()  # what ran is recorded, not what was asked
            writer.note({"compiled": compiled_note(compiled, settings.compile)})
            writer.record_proof(job.proof.entry())
        if stop.signal_number is not None:
            raise Interrupted(
                f"Stopped by {signal.Signals(stop.signal_number).name} after {writer.committed_images} of "
                f"{len(images)} {images.noun}s; run the same command again to resume.",
                stop.signal_number,
            )
        if not keep_empty and writer.committed.rows == 0:
            raise nothing_read(settings.images, settings.output, writer.discard(), images.noun)
        return writer.finish()
    except BaseException:
        if writer.holds_nothing():  # stopped before any image was done: no empty file passed off as resumable
            writer.discard()
        raise
    finally:
        record.remove()  # only a kill leaves it, for info to report the job as stopped
        progress.close()
        writer.close()


def _proof(settings: Settings, model: Model, images: ImageList, start: int) -> Proof:
    """The proof of a run over IMAGES from position START (`featdump.job.proof`): the sampled recomputation (none
    when the run is the reference path or --proof is 0) and, under bf16/fp16, the watch for non-finite rows."""
    parts = departures_of(settings, model.device)
    reference = None
    if model.reference is not None:
        emulation = Emulation(settings.precision, model.preprocess if settings.fast_decode else None)
        reference = Reference(model.reference, model.layers, model.snapshots(), model.exact_preprocess, emulation)
    first_batch_end = min(len(images), start + settings.batch_size)
    sample = plan_sample(settings.proof, start, first_batch_end, len(images)) if settings.proof and parts else None
    specs = model.specs
    return Proof(reference, images, parts, describe_configuration(model.device, parts), sample,
                 settings.precision != "fp32", settings.dtype,
                 row_shapes={name: spec.shape for name, spec in specs.items()},
                 channel_axes={name: channel_axis(spec.shape, {"reduction": spec.reduction, **spec.reduction_attributes,
                                                               **({"axes": spec.axes} if spec.axes else {})})
                               for name, spec in specs.items()})


@dataclass
class _Job:
    """Everything the batch loop reads."""

    settings: Settings
    images: ImageList
    model: Model
    capture: Capture
    writer: FeatureWriter
    record: ProgressRecord
    offset: int  # images the job's output held before this list (an update's): for the progress record
    owned_files: tuple[Path, ...]  # the output's files, which loader workers close
    proof: Proof  # the run's rows checked against the reference path


def _run_batches(job: _Job, progress: Progress, stop: StopSignals) -> None:
    settings, images, device, preprocess = job.settings, job.images, job.model.device, job.model.preprocess
    gpu_jpegs = resolve_decode(settings.decode, device, preprocess) == "gpu"
    dataset, start = dataset_for(images, preprocess, gpu_jpegs), job.writer.committed_images
    batches = math.ceil((len(dataset) - start) / settings.batch_size)
    loader = make_loader(dataset, start, settings.batch_size, choose_workers(settings.num_workers, batches),
                         pin_memory=device.type == "cuda", owned_files=job.owned_files)
    waiting = computing = 0.0
    steady = _SteadyRate()
    # Autocast is entered once for the loop (leaving it clears its cache of cast weights); the inputs are made
    # outside it, in a nested disabled region (which leaves the cache alone).
    with batches_of(loader) as batches, WriteBehind(job.writer, job.record, job.offset,
                                                           inspect=job.proof.check) as sink, \
            autocast(settings.precision, device):
        tick = time.perf_counter()
        for batch in batches:  # the stages of a batch: its inputs, the forward, the rows handed to the writer
            tock = time.perf_counter()
            inputs = _inputs_of(batch, job)
            features = _forward(inputs, job) if inputs is not None else {}
            sink.put(features, batch, images, device)
            waiting, computing = waiting + tock - tick, computing + time.perf_counter() - tock
            progress.advance(batch.size)
            steady.count(batch.size)
            if stop.signal_number is not None:
                break
            tick = time.perf_counter()
    log.debug("Stage times: waiting for decoded images %.2f s, forward and copies %.2f s, "
              "writing %.2f s on a background thread (%s capture); %s.", waiting, computing, sink.seconds,
              job.capture.strategy, steady)


def _inputs_of(batch, job: _Job) -> torch.Tensor | None:
    """A decoded batch as the model's inputs on the run's device (None: every image of it failed), its sizes and
    failures judged first."""
    _check_sizes(batch, job)
    with torch.autocast(job.model.device.type, enabled=False):  # the inputs are made outside autocast
        inputs = to_device_inputs(batch, job.model.preprocess, job.images, job.model.device)
    _check_failures(batch, job.images, job.settings.on_error)
    return inputs


def _forward(inputs: torch.Tensor, job: _Job) -> dict[str, torch.Tensor]:
    """Each layer's rows of INPUTS, through the capture (padded to the batch size where one shape matters)."""
    settings, device, count = job.settings, job.model.device, inputs.shape[0]
    if device.type == "cuda" or job.capture.strategy == "compiled graph":
        inputs = padded(inputs, settings.batch_size)  # one shape (cudnn.benchmark, one compile)
    inputs = inputs.contiguous(memory_format=job.model.memory_format)
    with out_of_memory_as_failure(device, settings.batch_size, str(job.writer.path)):
        return {name: values[:count] for name, values in job.capture.run(inputs).items()}


class _SteadyRate:
    """img/s after the first batch (which pays for warming up, compiling), for the -v log."""

    def __init__(self):
        self.first_done, self.images = None, 0

    def count(self, images: int) -> None:
        if self.first_done is None:
            self.first_done = time.perf_counter()
        else:
            self.images += images

    def __str__(self) -> str:
        seconds = time.perf_counter() - self.first_done if self.first_done is not None else 0.0
        if not self.images or seconds <= 0:
            return "one batch only"
        return f"after the first batch {self.images} images in {seconds:.2f} s, {self.images / seconds:.2f} img/s"


def _check_sizes(batch: Batch, job: _Job) -> None:
    """MixedSizes, naming the preprocessing, when the images of a batch are not all of the model's input size."""
    sizes = batch.mixed_sizes or ({batch.positions[0]: tuple(batch.pixels.shape[1:])} if batch.pixels is not None
                                  else {})
    job.model.preprocess.check_sizes({job.images.paths[position]: shape for position, shape in sizes.items()},
                                     preprocessing_name(job.settings))


def _check_failures(batch: Batch, images: ImageList, on_error: str) -> None:
    if batch.fatal is not None:  # the store stayed away: the rows before this batch are committed
        raise batch.fatal
    for position, reason in batch.failures:
        if on_error == "fail":
            raise BadImage(
                f"Cannot use image {images.paths[position]!r}: {reason}. Fix or remove it, "
                "or pass --on-error skip to record it and go on."
            )
        log.debug("Skipping %s: %s", images.paths[position], reason)
