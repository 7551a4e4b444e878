"""Runner: one extract job, strung from its rooms: the plan (`plan`: rows, shard, settings fitted to the model) →
the model (`model`) → open (lock, writer, or an update's: `updating`) → fit (the PCA fits of pca:K layers,
`fitting`) → the batches (`batches.fill`) → finish (summary, torchrun merge)."""

from __future__ import annotations

import dataclasses
import logging
import time

from featdump.forward.device import resolve_device
from featdump.job import fitting, updating
from featdump.job.batches import fill
from featdump.job.model import Model, prepare_model
from featdump.job.plan import Plan, fingerprint_for, make_plan, sized
from featdump.job.provenance import provenance
from featdump.job.report import Summary, summarize
from featdump.job.settings import Settings
from featdump.job.shards import wait_for_all_ranks
from featdump.output.layout import Output, partial_path
from featdump.output.lock import OutputLock
from featdump.output.merge import merge
from featdump.output.progress import ProgressRecord, remove_record
from featdump.output.space import report_size
from featdump.output.writer import FeatureWriter
from featdump.progress import NoProgress, Progress
from featdump.reductions.methods import bind

log = logging.getLogger("featdump")


def extract(settings: Settings, progress: Progress | None = None) -> Summary:
    """Run SETTINGS: every image through the model, the selected layers into the HDF5 output.

    Under --shard (or a SLURM array / torchrun) only this process's part of the images, into its shard
    file; under torchrun rank 0 then merges the shards once every rank is done.
    """
    started = time.perf_counter()
    plan = make_plan(settings)
    output = plan.settings.output
    with OutputLock.acquire(output, overwrite=True) as lock:  # an existing output (a shard's too): updating's to judge
        ProgressRecord.starting(output)  # `info` answers from the moment the lock is held
        try:
            summary = _run_locked(plan, lock, progress or NoProgress(), started)
        finally:
            remove_record(output)  # only a kill leaves it, for info to report the job as stopped
    _merge_when_all_ranks_done(plan)
    return summary


def _run_locked(plan: Plan, lock: OutputLock, progress: Progress, started: float) -> Summary:
    model = prepare_model(plan.settings, resolve_device(plan.settings.device,
                                                         plan.shard.local_rank if plan.shard else None), plan.images)
    plan = dataclasses.replace(plan, settings=sized(plan.settings, model, plan.images.noun))
    settings = plan.settings
    fingerprint = fingerprint_for(plan, model)
    if settings.pca_fit is not None:
        _fit_projections(plan, model, fingerprint, lock, progress)
    attributes = provenance(settings, model, plan.images)
    if settings.output.exists() and not settings.overwrite:
        job = updating.UpdateJob(settings, plan.images, plan.shard_fingerprint, model, fingerprint, attributes,
                                 lock, progress)
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
    output = fill(writer, plan.images, settings, model, lock, progress, keep_empty=plan.shard is not None)
    with Output.open(output) as finished:
        after, proofs = finished.committed, finished.proofs
    return summarize(settings.images, output, after, before, plan.images, before.images, started,
                     proof=proofs[-1] if proofs else None)


def fingerprint_of(settings: Settings) -> dict | None:
    """The fingerprint the run of SETTINGS (its shard's, under --shard) would record, computed without running it;
    None where it names pca:K layers (their fits' identity is known only once they are found or made)."""
    if settings.pca_fit is not None:
        return None
    plan = make_plan(settings)
    device = resolve_device(plan.settings.device, plan.shard.local_rank if plan.shard else None)
    return fingerprint_for(plan, prepare_model(plan.settings, device, plan.images))


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
    finished = [settings.output] if settings.output.exists() and not settings.overwrite else []  # rerun, update
    made = fitting.obtain_fits(plan.whole_output, digests, dims, fits, fitting.Stager(settings, model, lock, progress),
                               [partial_path(settings.output), *finished], settings.overwrite)
    for name, text in model.chosen.items():
        if name in made:
            layer = next(layer for layer in model.layers if layer.name == name)
            model.reductions[name] = bind(text, name, layer.shape, pca_fit=made[name])


def _merge_when_all_ranks_done(plan: Plan) -> None:
    """Under torchrun: wait for every rank (a barrier with a timeout), then rank 0 merges the shards."""
    if plan.shard is None or plan.shard.local_rank is None:
        return
    settings = plan.settings
    wait_for_all_ranks(settings.merge_timeout)
    if plan.shard.index == 0:
        merge(plan.whole_output, settings.shard_pattern, overwrite=settings.overwrite or settings.update)
        log.info("Merged %d shards into %s.", plan.shard.count, plan.whole_output)
