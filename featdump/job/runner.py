"""Runner: one extract job, in steps: plan (images, shard, model, layers, reductions) → open (lock, writer, or an
update's) → fit (the PCA fits of pca:K layers, `fitting`) → run (batches through the capture, written behind)
→ finish (rename, summary, torchrun merge)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torchvision

from featdump.errors import BadImage, Interrupted, ModelFailed, UsageProblem
from featdump.forward.batch_size import DEFAULT as DEFAULT_BATCH
from featdump.forward.batch_size import choose_batch_size
from featdump.forward.compiling import compile_capture, compiled_note
from featdump.forward.device import (
    autocast,
    free_memory,
    out_of_memory_as_failure,
    padded,
    place_model,
    resolve_decode,
    resolve_device,
)
from featdump.forward.hooks import Capture
from featdump.forward.layers import Layer, Snapshot, in_model_order, resolve
from featdump.forward.memory_format import choose_memory_format, format_name
from featdump.forward.probe import UNKNOWN_AXES, probe
from featdump.inputs import ImageList, Patience, find_images
from featdump.inputs.clips import as_rows, dataset_for, preprocess_for
from featdump.inputs.gpu_decode import to_device_inputs
from featdump.inputs.loader import Batch, batches_of, make_loader
from featdump.inputs.preprocess import Preprocess
from featdump.inputs.workers import choose_workers
from featdump.job import dependencies, fitting, updating, warm
from featdump.job.proof import (
    Emulation,
    Proof,
    Reference,
    channel_axis,
    departures,
    describe_configuration,
    plan_sample,
    reference_copy,
)
from featdump.job.report import NoProgress, Progress, Summary, nothing_read, summarize
from featdump.job.settings import Settings
from featdump.job.shards import Shard, choose_shard, plan_shard, wait_for_all_ranks
from featdump.job.signals import StopSignals
from featdump.locations import Location
from featdump.output import fingerprint as fingerprints
from featdump.output.layout import DatasetSpec, Output, partial_path
from featdump.output.lock import OutputLock, waiting_lock
from featdump.output.merge import merge
from featdump.output.progress import ProgressRecord, remove_record
from featdump.output.space import report_size
from featdump.output.write_behind import WriteBehind
from featdump.output.writer import FeatureWriter
from featdump.reductions.methods import bind, snapshot
from featdump.reductions.record import Reduction
from featdump.reductions.rules import choose, method_of
from featdump.sources.models import LoadedModel, check_model_name, clip_of, cpu_only, load_model
from featdump.sources.tokens import TokenLayout, token_layout
from featdump.version import __version__

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


@dataclass
class Model:
    """The model side of a run: the loaded model on its device, its preprocessing, the layers, what each keeps
    (REDUCTIONS: bound ones; a pca:K layer's is bound once its fit is known) and the storage DTYPE."""

    loaded: LoadedModel
    preprocess: Preprocess
    layers: list[Layer]
    chosen: dict[str, str]  # each layer's reduction, as text
    reductions: dict[str, Reduction]
    device: torch.device
    dtype: str
    memory_format: torch.memory_format  # of the weights and of every batch of inputs
    infos: list = dataclasses.field(default_factory=list)  # the probe's LayerInfos, to resolve more layers by
    reference: torch.nn.Module | None = None  # the model on the reference path (CPU, fp32), for the proof

    def with_layers(self, names: list[str], chosen: dict[str, str], fits: dict | None = None) -> Model:
        """This model capturing the layers NAMES (in the model's order) with the reductions CHOSEN (FITS: the PCA
        fits of pca:K layers, by name); layers this model has keep what they have."""
        own = {layer.name: layer for layer in self.layers}
        missing = [name for name in names if name not in own]
        if missing:
            own.update((layer.name, layer) for layer in resolve(missing, self.infos, "the model"))
        layers = in_model_order([own[name] for name in names], self.infos)
        model = dataclasses.replace(self, layers=layers, chosen={name: chosen[name] for name in names},
                                    reductions={name: self.reductions[name] for name in names
                                                if name in self.reductions})
        for layer in layers:
            if layer.name not in model.reductions:
                layout, unknown = model.tokens(layer)
                model.reductions[layer.name] = bind(chosen[layer.name], layer.name, layer.shape, layout,
                                                    pca_fit=(fits or {}).get(layer.name), tokens_unknown=unknown,
                                                    axes=layer.axes)
        return model

    @property
    def specs(self) -> dict[str, DatasetSpec]:
        """Each layer's dataset."""
        return {layer.name: _dataset_spec(layer, self.reductions.get(layer.name), self.dtype, self.tokens(layer)[0])
                for layer in self.layers}

    def tokens(self, layer: Layer) -> tuple[TokenLayout | None, str]:
        """LAYER's token layout at the input size the preprocessing makes, or why it has none."""
        return token_layout(layer.shape, self.loaded.tokens, self.preprocess.size)

    @property
    def device_bytes(self) -> int:
        """What the reductions hold on the device (projection matrices)."""
        return sum(reduction.device_bytes for reduction in self.reductions.values())

    def snapshots(self) -> dict[str, Snapshot]:
        """Each layer's output to the tensor stored: reduced on the device, float32, a new tensor (the storage
        dtype is the writer's cast)."""
        return {layer.name: snapshot(layer.batch_dim, layer.fold, self.reductions[layer.name])
                for layer in self.layers}


def extract(settings: Settings, progress: Progress | None = None) -> Summary:
    """Run SETTINGS: every image through the model, the selected layers into the HDF5 output.

    Under --shard (or a SLURM array / torchrun) only this process's part of the images, into its shard
    file; under torchrun rank 0 then merges the shards once every rank is done.
    """
    started = time.perf_counter()
    plan = _plan(settings)
    output = plan.settings.output
    with OutputLock.acquire(output, overwrite=True) as lock:  # an existing output (a shard's too): updating's to judge
        ProgressRecord.starting(output)  # `info` answers from the moment the lock is held
        try:
            summary = _run_locked(plan, lock, progress or NoProgress(), started)
        finally:
            remove_record(output)  # only a kill leaves it, for info to report the job as stopped
    _merge_when_all_ranks_done(plan)
    return summary


def job_rows(settings: Settings) -> ImageList:
    """The rows of the whole job SETTINGS describes (every shard's): its images, or its videos' clips."""
    return warm.shared("rows", dependencies.run_key(settings), lambda: as_rows(
        find_images(settings.images, patience=Patience(settings.store_patience), array=settings.array,
                    image_column=settings.image_column, label_column=settings.label_column),
        settings.clip, settings.fps,
        settings.clip_every, clip_of(settings.model), settings.clip_anchor, settings.clip_pad, settings.clip_origin))


def _plan(settings: Settings) -> Plan:
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


def _run_locked(plan: Plan, lock: OutputLock, progress: Progress, started: float) -> Summary:
    model = _prepare_model(plan.settings, resolve_device(plan.settings.device,
                                                         plan.shard.local_rank if plan.shard else None), plan.images)
    plan = dataclasses.replace(plan, settings=_sized(plan.settings, model, plan.images.noun))
    settings = plan.settings
    fingerprint = _fingerprint(plan, model)
    if settings.pca_fit is not None:
        _fit_projections(plan, model, fingerprint, lock, progress)
    attributes = _provenance(settings, model, plan.images)
    if settings.output.exists() and not settings.overwrite:
        job = updating.UpdateJob(settings, plan.images, plan.shard_fingerprint, model, fingerprint, attributes,
                                 lock.hdf5_locking, functools.partial(_fill, lock=lock, progress=progress))
        summary = updating.update(job) if settings.update else updating.finished_as_asked(job)
        return dataclasses.replace(summary, seconds=time.perf_counter() - started)
    report_size(settings.output, model.specs, len(plan.images), settings.space_check, model.device_bytes,
                plan.images.noun)
    writer = FeatureWriter.open(settings.output, model.specs, fingerprint, attributes, list(plan.images.classes),
                                settings.batch_size, settings.compression, settings.overwrite, lock.hdf5_locking)
    before = writer.committed
    if before.images:
        log.info("Resuming at %s %d of %d (%d rows committed).", plan.images.noun, before.images, len(plan.images),
                 before.rows)
    output = _fill(writer, plan.images, settings, model, lock, progress, keep_empty=plan.shard is not None)
    with Output.open(output) as finished:
        after, proofs = finished.committed, finished.proofs
    return summarize(settings.images, output, after, before, len(plan.images) - before.images, before.images, started,
                     left_out=plan.images.left_out(), proof=proofs[-1] if proofs else None, noun=plan.images.noun)


def _fingerprint(plan: Plan, model: Model) -> dict:
    """What the run of PLAN with MODEL records of itself (`output.fingerprint`), before any PCA fit's identity."""
    settings = plan.settings
    resolved = dependencies.fingerprinted(
        settings, layers=[layer.name for layer in model.layers], reduce=model.chosen,
        decode=resolve_decode(settings.decode, model.device, model.preprocess))
    layouts = {layer.name: layer.layout for layer in model.layers if layer.layout}
    return fingerprints.build(resolved, layouts, repr(model.preprocess.transforms), model.loaded.source, plan.images,
                              plan.shard_fingerprint)


def fingerprint_of(settings: Settings) -> dict | None:
    """The fingerprint the run of SETTINGS (its shard's, under --shard) would record, computed without running it;
    None where it names pca:K layers (their fits' identity is known only once they are found or made)."""
    if settings.pca_fit is not None:
        return None
    plan = _plan(settings)
    device = resolve_device(plan.settings.device, plan.shard.local_rank if plan.shard else None)
    return _fingerprint(plan, _prepare_model(plan.settings, device, plan.images))


def _sized(settings: Settings, model: Model, noun: str) -> Settings:
    """SETTINGS with their batch size: -b's, or the default that fits the device's free memory (`batch_size`)."""
    if settings.batch_size is not None:
        return settings
    choice = choose_batch_size(model.infos, model.preprocess.input_shape, 4 if settings.precision == "fp32" else 2,
                               free_memory(model.device))
    if choice.size < DEFAULT_BATCH:
        log.info(choice.reason(noun))
    return dataclasses.replace(settings, batch_size=choice.size)


def _fit_projections(plan: Plan, model: Model, fingerprint: dict, lock: OutputLock, progress: Progress) -> None:
    """Bind every pca:K layer's reduction to its fit (read where it was made before, else made now); FINGERPRINT
    gets the fit's identity."""
    settings = plan.settings
    fits = fitting.fit_set(settings.pca_fit, plan.job_images, settings.images)
    dims = fitting.layer_dims({layer.name: layer.shape for layer in model.layers}, model.chosen)
    stored = updating.stored_fits(settings.output, model.chosen) if settings.update and not settings.overwrite else {}
    for name, (fit, _) in stored.items():  # a layer the output holds keeps its fit, whatever this command's
        layer = next(layer for layer in model.layers if layer.name == name)
        model.reductions[name] = bind(model.chosen[name], name, layer.shape, pca_fit=fit)
    dims = {name: dim for name, dim in dims.items() if name not in stored}
    fitting.check_fits(fits, dims)
    digests = fitting.fit_digests(fingerprint, {name: model.chosen[name] for name in dims}, fits)
    fingerprint["pca_fit"] = {**{name: entry for name, (_, entry) in stored.items()},
                              **fitting.fingerprint_entries(fits, digests)}
    if not dims:
        return

    def stage(path: Path, images: ImageList, stage_fingerprint: dict) -> Path:
        layers = [layer for layer in model.layers if layer.name in dims]
        staged = dataclasses.replace(model, layers=layers, dtype="float32",
                                     reductions={layer.name: bind("flatten", layer.name, layer.shape)
                                                 for layer in layers})
        writer = FeatureWriter.open(path, staged.specs, stage_fingerprint, {}, list(images.classes),
                                    settings.batch_size, locking=False)
        return _fill(writer, images, dataclasses.replace(settings, output=path, proof=0), staged, lock, progress)

    finished = [settings.output] if settings.output.exists() and not settings.overwrite else []  # rerun, update
    made = fitting.obtain_fits(plan.whole_output, digests, dims, fits, stage,
                               [partial_path(settings.output), *finished], settings.overwrite)
    for name, text in model.chosen.items():
        if name in made:
            layer = next(layer for layer in model.layers if layer.name == name)
            model.reductions[name] = bind(text, name, layer.shape, pca_fit=made[name])


def _compiled_from(settings: Settings, model: Model) -> dict:
    """What a compiled forward depends on beyond its weights and input batch (`forward.ahead`'s key)."""
    fits = {name: getattr(reduction.fit, "digest", None) for name, reduction in model.reductions.items()
            if reduction.fit is not None}
    resolved = dependencies.compiled_key(settings, layers=[layer.name for layer in model.layers],
                                         reduce=model.chosen, device=str(model.device))
    return {**resolved, "fits": fits}


def _fill(writer: FeatureWriter, images: ImageList, settings: Settings, model: Model, lock: OutputLock,
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
        graph_key = (dependencies.run_key(settings), tuple(model.chosen.items()), str(model.device),
                     model.memory_format, model.preprocess.input_shape)
        capture = Capture(model.loaded.module, model.layers, model.snapshots(), prune=True,
                          example=example.to(model.device).contiguous(memory_format=model.memory_format),
                          checked=warm.known("graph checked", graph_key))
        with StopSignals() as stop, capture:
            if capture.strategy == "graph":
                warm.note("graph checked", graph_key)
            cache = Path(settings.compile_cache) if settings.compile_cache else None
            compiled = compile_capture(capture, cache, _compiled_from(settings, model), waiting_lock) \
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
    finally:
        record.remove()  # only a kill leaves it, for info to report the job as stopped
        progress.close()
        writer.close()


def _departures(settings: Settings, device: torch.device) -> list[str]:
    """How this run departs from the reference path (none: it is the reference)."""
    return departures(device, settings.precision, settings.compile, settings.decode, settings.fast_decode)


def _proof(settings: Settings, model: Model, images: ImageList, start: int) -> Proof:
    """The proof of a run over IMAGES from position START (`featdump.job.proof`): the sampled recomputation (none
    when the run is the reference path or --proof is 0) and, under bf16/fp16, the watch for non-finite rows."""
    parts = _departures(settings, model.device)
    reference = None
    if model.reference is not None:
        emulation = Emulation(settings.precision, model.preprocess if settings.fast_decode else None)
        reference = Reference(model.reference, model.layers, model.snapshots(),
                              preprocess_for(model.loaded, images), emulation)
    first_batch_end = min(len(images), start + settings.batch_size)
    sample = plan_sample(settings.proof, start, first_batch_end, len(images)) if settings.proof and parts else None
    specs = model.specs
    return Proof(reference, images, parts, describe_configuration(model.device, parts), sample,
                 settings.precision != "fp32", settings.dtype,
                 row_shapes={name: spec.shape for name, spec in specs.items()},
                 channel_axes={name: channel_axis(spec.shape, {"reduction": spec.reduction, **spec.reduction_attributes,
                                                               **({"axes": spec.axes} if spec.axes else {})})
                               for name, spec in specs.items()})


def _dataset_spec(layer: Layer, reduction: Reduction | None, dtype: str, layout: TokenLayout | None) -> DatasetSpec:
    """What LAYER's dataset holds per image; a token layout only where the tokens are stored as they are."""
    if reduction is None:  # a pca:K layer before its fit
        raise UsageProblem(f"Layer {layer.name}: its PCA fit is not made yet.")
    tokens = (layout.prefix, *layout.grid) if layout is not None and reduction.shape == layer.shape else None
    kept = len(reduction.shape) == len(layer.shape) == 3 and layer.axes != UNKNOWN_AXES  # kept whole, or some channels
    axes = layer.axes if kept else None
    return DatasetSpec(reduction.shape, dtype, layer.layout, layer.part, tokens, reduction.text,
                       reduction.attributes, reduction.fit, axes)


def _prepare_model(settings: Settings, device: torch.device, images: ImageList) -> Model:
    """The loaded model on DEVICE, its split preprocessing (of IMAGES' clips, for a video job), the validated
    layers and their datasets."""
    key = dependencies.run_key(settings)
    loaded = warm.loaded_model(key, lambda: load_model(**dict(dependencies.model_key(settings))))
    proved = (settings.proof and _departures(settings, device)) or settings.precision != "fp32"  # bf16/fp16: watched
    reference = reference_copy(loaded.module) if proved else None
    preprocess = preprocess_for(loaded, images, settings.fast_decode)
    memory_format, why = choose_memory_format(loaded.module, preprocess.input_shape)
    log.debug("Memory layout: %s (%s).", format_name(memory_format), why)
    loaded.module = place_model(loaded.module, device, settings.precision, memory_format)
    if settings.fast_decode and preprocess.draft is None:
        log.warning("--fast-decode needs a resize in the preprocessing; decoding every image whole.")
    try:
        infos = warm.shared("probe", (key, str(device), memory_format, preprocess.input_shape),
                            lambda: probe(loaded.module, preprocess.input_shape, loaded.rows_within,
                                          loaded.stated_axes))
    except ModelFailed:
        preprocess.check_one_size(_preprocessing_name(settings))  # the likelier cause, said instead
        raise
    layers = resolve(list(settings.layers), infos, settings.model)
    for layer in layers:
        if layer.layout:
            log.info("Layer %s holds the batch in dimension %d: stored batch-first, %s.", layer.name,
                     layer.batch_dim, layer.layout)
    chosen = choose(settings.reduce, [layer.name for layer in layers], infos, settings.model)
    model = Model(loaded, preprocess, layers, chosen, {}, device, settings.dtype, memory_format, infos, reference)
    for layer in layers:
        if method_of(chosen[layer.name]) != "pca":
            layout, unknown = model.tokens(layer)
            model.reductions[layer.name] = bind(chosen[layer.name], layer.name, layer.shape, layout,
                                                tokens_unknown=unknown, axes=layer.axes)
    return model


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
    loader = make_loader(dataset_for(images, preprocess, gpu_jpegs), job.writer.committed_images,
                         settings.batch_size, choose_workers(settings.num_workers), pin_memory=device.type == "cuda",
                         owned_files=job.owned_files)
    waiting = computing = 0.0
    steady = _SteadyRate()
    # Autocast is entered once for the loop (leaving it clears its cache of cast weights); the inputs are made
    # outside it, in a nested disabled region (which leaves the cache alone).
    with batches_of(loader) as batches, WriteBehind(job.writer, job.record, job.offset,
                                                           inspect=job.proof.check) as sink, \
            autocast(settings.precision, device):
        tick = time.perf_counter()
        for batch in batches:
            tock = time.perf_counter()
            _check_sizes(batch, job)
            with torch.autocast(device.type, enabled=False):
                inputs = to_device_inputs(batch, preprocess, images, device)
            _check_failures(batch, images, settings.on_error)
            features = {}
            if inputs is not None:
                count = inputs.shape[0]
                if device.type == "cuda" or job.capture.strategy == "compiled graph":
                    inputs = padded(inputs, settings.batch_size)  # one shape (cudnn.benchmark, one compile)
                inputs = inputs.contiguous(memory_format=job.model.memory_format)
                with out_of_memory_as_failure(device, settings.batch_size, str(job.writer.path)):
                    features = {name: values[:count] for name, values in job.capture.run(inputs).items()}
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
                                     _preprocessing_name(job.settings))


def _preprocessing_name(settings: Settings) -> str:
    """The preprocessing as the user knows it, for messages."""
    return f"--transform {settings.transform}" if settings.transform else f"the preprocessing of {settings.model}"


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


def _merge_when_all_ranks_done(plan: Plan) -> None:
    """Under torchrun: wait for every rank (a barrier with a timeout), then rank 0 merges the shards."""
    if plan.shard is None or plan.shard.local_rank is None:
        return
    settings = plan.settings
    wait_for_all_ranks(settings.merge_timeout)
    if plan.shard.index == 0:
        merge(plan.whole_output, settings.shard_pattern, overwrite=settings.overwrite or settings.update)
        log.info("Merged %d shards into %s.", plan.shard.count, plan.whole_output)


def _provenance(settings: Settings, model: Model, images: ImageList) -> dict:
    """The attributes a new output records: what made it, from which images, with which versions and command."""
    root = images.root
    return {
        **({"image_listing": json.dumps(images.listing, sort_keys=True)} if images.listing else {}),
        **(images.clips.attributes() if images.clips is not None else {}),
        "model": settings.model,
        "weights": model.loaded.weights,
        "model_source": json.dumps(model.loaded.source, sort_keys=True),
        "seed": settings.seed,
        "layers": [layer.name for layer in model.layers],
        "preprocessing": repr(model.loaded.preprocessing),
        "image_geometry": json.dumps(model.preprocess.geometry()),  # how `show` lays the image under the maps
        "image_root": Location.of(root).absolute,
        "dtype": settings.dtype,
        "reduce": json.dumps(model.chosen),
        "precision": settings.precision,
        "fast_decode": settings.fast_decode,
        "featdump_version": __version__,
        "torch_version": str(torch.__version__),
        "torchvision_version": str(torchvision.__version__),
        "command": settings.command,
        "settings": json.dumps(settings.effective(), sort_keys=True),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
