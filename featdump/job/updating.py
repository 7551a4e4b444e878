"""Updating: a job whose output is finished already. With --update, the output is brought up to what the command
names: new images (every layer) and new layers (for every image already stored, and the new ones); layers already
stored are kept bit for bit and never recomputed. Both are staged while the output stays readable and joined in
one short final commit (`output.update`). Without --update, the same command again is done already (exit 0);
any other is refused naming what differs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from featdump.errors import NotAnOutput, OutputExists, ShardProblem
from featdump.inputs import ImageList
from featdump.job import fitting
from featdump.job.batches import fill
from featdump.job.model import Model
from featdump.job.report import Summary, summarize
from featdump.job.settings import Settings
from featdump.output import fingerprint as fingerprints
from featdump.output.layout import Output
from featdump.output.lock import OutputLock
from featdump.output.space import report_size
from featdump.output.update import (
    UPDATE_TOKEN,
    StoredLayers,
    UpdatePlan,
    apply_update,
    discard_other_staging,
    grow_path,
    plan_update,
    staging_path,
)
from featdump.output.writer import FeatureWriter
from featdump.progress import Progress
from featdump.reductions.pca import PcaFit

log = logging.getLogger("featdump")


@dataclass
class UpdateJob:
    """What an update works with: the run's settings, images and model (the `runner`'s), its fingerprint over the
    layers the command names, the output's LOCK and the run's PROGRESS (what `batches.fill` reports to)."""

    settings: Settings
    images: ImageList
    shard_fingerprint: dict  # a shard's place in the whole job ({} when not sharded)
    model: Model
    fingerprint: dict
    attributes: dict  # what a new file records of its making
    lock: OutputLock
    progress: Progress

    @property
    def hdf5_locking(self) -> bool:
        return self.lock.hdf5_locking


def finished_as_asked(job: UpdateJob) -> Summary:
    """A finished output made by this same command is done: say so. Any other is refused, naming the difference."""
    output = job.settings.output
    try:
        with Output.open(output) as held:
            judge_finished(str(output), held.fingerprint, held.complete, job.fingerprint)
    except NotAnOutput as error:  # some other file: not featdump's to judge
        raise OutputExists(f"Output {str(output)!r} already exists; pass --overwrite to replace it.") from error
    return Summary.of_finished(output, 0.0)


def judge_finished(name: str, held: dict, complete: bool, fingerprint: dict) -> None:
    """The one judgement of a finished output NAME (on a disk or in a store) that holds the fingerprint HELD: made
    by this same command (FINGERPRINT) and complete, it is done (logged); any other is refused (OutputExists),
    naming the difference and the ways on."""
    differences = fingerprints.describe_differences(held, fingerprint)
    if complete and not differences:
        log.info("%s is finished already, made by this same command: nothing to do.", name)
        return
    grew = bool(differences) and fingerprints.only_the_images_differ(held, fingerprint)
    made = "made by this command over other images" if grew else "made by another command"
    raise OutputExists(f"Output {name!r} already exists" +
                       (f", {made} ({'; '.join(differences)})" if differences else "") +
                       "; pass --update to add new images or layers to it, or --overwrite to replace it.")


def update(job: UpdateJob) -> Summary:
    """--update: the stored rows' new layers into OUT.grow, the new images into OUT.update (OUT stays readable
    meanwhile), then the final commit."""
    settings, output, model = job.settings, job.settings.output, job.model
    stored = StoredLayers.of(output)
    named = [layer.name for layer in model.layers]
    stored.check_named(named, model.chosen, output)
    new_layers = [name for name in named if name not in stored.names]
    kept = [name for name in stored.names if name not in named]
    whole = model.with_layers(stored.names + new_layers, {**stored.reductions, **model.chosen},
                              {name: fit for name, (fit, _) in stored_fits(output, stored.reductions).items()})
    if kept:
        log.info("Layers %s are kept as stored (not named); new images get them too, as recorded.", ", ".join(kept))
    _refuse_new_images_of_shards(job, output)
    grower = model.with_layers(new_layers, model.chosen) if new_layers else None  # the stored rows' new layers
    fit_entries = {**fitting.recorded_entries(stored.fingerprint), **job.fingerprint.get("pca_fit", {})}
    plan = plan_update(output, job.images, _over(job.fingerprint, whole, fit_entries), new_layers,
                       _over(job.fingerprint, grower, fit_entries) if grower else None, settings.retry_skipped)
    discard_other_staging(output, plan)
    if plan.nothing_new:  # decided read-only: the file, its mtime and its readers are left alone
        log.info("%s holds every image and layer this command names: nothing to add.", output)
        return dataclasses.replace(Summary.of_finished(output, 0.0), stale=len(plan.stale))
    log.info("Updating %s: %d new %ss (%d skipped ones read again), %d new layers (%s), %d rows already there%s.",
             output, len(plan.images), plan.images.noun, len(plan.retried), len(new_layers),
             ", ".join(new_layers) or "none", plan.base.rows,
             f", {len(plan.stale)} of them stale (see featdump info)" if plan.stale else "")
    grown = _grow(job, plan, grower) if grower else 0
    staged, start = staging_path(output), 0
    if not staged.exists():
        if len(plan.images):
            report_size(output, whole.specs, len(plan.images), settings.space_check, whole.device_bytes,
                        plan.images.noun)
        writer = FeatureWriter.open(staged, whole.specs, plan.fingerprint,
                                    {**job.attributes, UPDATE_TOKEN: uuid.uuid4().hex},
                                    list(plan.images.classes), settings.batch_size, settings.compression,
                                    locking=False)
        start = writer.committed_images
        fill(writer, plan.images, settings, whole, job.lock, job.progress, offset=plan.base.images)
    record = {"added_by": settings.command, "added_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    seconds = apply_update(output, plan, job.fingerprint["images"], record, job.hdf5_locking)
    with Output.open(output) as updated:
        after = updated.committed
    log.info("Final commit: %d layers and %d rows added to %s in %.2f s (the only time readers wait).",
             len(new_layers), after.rows - plan.base.rows, output, seconds)
    summary = summarize(settings.images, output, after, plan.before, plan.images, start, time.perf_counter(),
                        stale=len(plan.stale))
    return dataclasses.replace(summary, processed=summary.processed + grown, layers_added=new_layers)


def _grow(job: UpdateJob, plan: UpdatePlan, grower) -> int:
    """The new layers of every stored row into OUT.grow (resumed where a kill left it); the rows computed."""
    output, settings = job.settings.output, job.settings
    staged = grow_path(output)
    if staged.exists():
        return 0
    report_size(staged, grower.specs, len(plan.rows), settings.space_check, grower.device_bytes, plan.rows.noun)
    writer = FeatureWriter.open(staged, grower.specs, plan.grow_fingerprint, job.attributes,
                                list(plan.rows.classes), settings.batch_size, settings.compression, locking=False)
    start = writer.committed_images
    if start:
        log.info("Resuming the new layers at row %d of %d.", start, len(plan.rows))
    # Every stored row needs its new values: an image that fails now stops the update (its row cannot be filled).
    fill(writer, plan.rows, dataclasses.replace(settings, on_error="fail"), grower, job.lock, job.progress,
         task=f"adding layers {', '.join(plan.new_layers)} to the {len(plan.rows)} rows stored")
    return len(plan.rows) - start


def _over(fingerprint: dict, model, fit_entries: dict[str, dict]) -> dict:
    """FINGERPRINT of the run, for MODEL's layers, reductions and PCA fits (FIT_ENTRIES: each pca layer's)."""
    over = {key: value for key, value in fingerprint.items() if key != "pca_fit"}
    fits = {layer.name: fit_entries[layer.name] for layer in model.layers if layer.name in fit_entries}
    return {**over, "layers": [layer.name for layer in model.layers],
            "layouts": {layer.name: layer.layout for layer in model.layers if layer.layout},
            "reduce": dict(model.chosen), **({"pca_fit": fits} if fits else {})}


def stored_fits(output: Path, reductions: dict[str, str]) -> dict[str, tuple[PcaFit, dict]]:
    """The PCA fits OUTPUT stores for the layers it holds reduced as REDUCTIONS says, by layer, each with what its
    fingerprint records of it: a stored pca:K layer keeps its fit (for new images), whatever fit set a later
    command names."""
    if not output.exists():
        return {}
    with Output.open(output) as held:
        group, recorded = held.file.get("pca"), held.fingerprint
        entries = fitting.recorded_entries(recorded)
        same = [name for name in recorded.get("layers", []) if recorded.get("reduce", {}).get(name) ==
                reductions.get(name) and group is not None and name in group and name in entries]
        return {name: (PcaFit.read(group[name]), entries[name]) for name in same}


def _refuse_new_images_of_shards(job: UpdateJob, output: Path) -> None:
    """A shard grows by layers; new images would move every shard's boundaries: refused, saying so."""
    if not job.shard_fingerprint:
        return
    with Output.open(output) as held:
        recorded = held.fingerprint.get("all_images")
    if recorded != job.shard_fingerprint.get("all_images"):
        raise ShardProblem(f"The images of this sharded job changed since {str(output)!r} was written: new images "
                           "would move every shard's boundaries. A sharded job grows by layers only; run it over "
                           "the new folder into a new output (or --overwrite).")
