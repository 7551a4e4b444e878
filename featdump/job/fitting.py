"""Fitting: the PCA fit pass of a job, run before its main loop when a layer is reduced with pca:K.

The fit images' activations of every pca:K layer are staged on disk (OUT.pca-stage.h5, written, committed and
resumed like any output, so a kill during the fit resumes where it stopped); each layer is then fitted from
them (`featdump.reductions.pca`), and the fits are kept in OUT.pca.h5 beside the job's output: the shards of a job share
it (the first to come fits, the others wait for it and read it), later runs with the same fit set reuse it
(delete it to fit again), and each output stores its layers' fits in /pca. The staged activations are
removed once the fits are written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import h5py

from featdump.errors import UsageProblem
from featdump.inputs import ImageList, find_images
from featdump.job.batches import fill
from featdump.job.model import Model
from featdump.job.settings import Settings
from featdump.output import fingerprint as fingerprints
from featdump.output.layout import Output, open_to_read, partial_path
from featdump.output.lock import OutputLock, waiting_lock
from featdump.output.space import check_space, human_bytes
from featdump.output.writer import FeatureWriter
from featdump.progress import Progress
from featdump.reductions.methods import bind
from featdump.reductions.pca import MEMORY_LIMIT, PcaFit, check_fit_fits, fit

log = logging.getLogger("featdump")

# What makes a fit's activations: the fingerprint's keys that a fit depends on (not the job's images).
_FIT_KEYS = ("model", "weights", "seed", "transform", "preprocessing", "decode", "precision", "fast_decode",
             "model_source")


@dataclass(frozen=True)
class FitSet:
    """The images a PCA is fitted on, and how the file describes them."""

    images: ImageList
    description: str


def fit_set(pca_fit: str, job_images: ImageList, images_argument: Path) -> FitSet:
    """--pca-fit N (the first N images of the job's list, shards and all) or --pca-fit PATH."""
    text = pca_fit.strip()
    if text.isdigit():
        count = int(text)
        if count > len(job_images):
            raise UsageProblem(f"--pca-fit {count}: {images_argument} has only {len(job_images)} images; give at most "
                               f"{len(job_images)}, or a folder or list file of reference images.")
        return FitSet(job_images.part(0, count), f"the first {count} images of {images_argument}")
    images = find_images(text, named="--pca-fit")
    return FitSet(images, f"{len(images)} images of {text}")


def fit_digests(fingerprint: dict, reductions: dict[str, str], fits: FitSet) -> dict[str, str]:
    """What each pca:K layer's fit is made from, by layer: the model and its inputs' processing, the layer and its
    K, the fit images. A fit belongs to its layer: adding another pca layer leaves the others' fits as they are."""
    made_from = {key: fingerprint.get(key) for key in _FIT_KEYS}
    made_from["fit_images"] = fits.images.digest()
    return {name: hashlib.sha256(json.dumps({**made_from, "layer": name, "pca": text}, sort_keys=True).encode())
            .hexdigest() for name, text in reductions.items() if text.startswith("pca:")}


def fingerprint_entries(fits: FitSet, digests: dict[str, str]) -> dict[str, dict]:
    """What a file's fingerprint records of each pca layer's fit (`pca_fit`, by layer)."""
    return {name: {"fitted_on": fits.description, "images": len(fits.images), "digest": digest}
            for name, digest in digests.items()}


def recorded_entries(fingerprint: dict) -> dict[str, dict]:
    """The fingerprint's `pca_fit` by layer; a file of an earlier version recorded one entry for all its pca
    layers, which each of them gets."""
    recorded = fingerprint.get("pca_fit") or {}
    if "digest" in recorded:
        return {name: recorded for name, text in fingerprint.get("reduce", {}).items() if text.startswith("pca:")}
    return dict(recorded)


def fit_path(job_output: Path) -> Path:
    """OUT.pca.h5: the fits of the job writing OUT."""
    return job_output.with_name(job_output.name + ".pca.h5")


def stage_path(job_output: Path) -> Path:
    """OUT.pca-stage.h5: the fit images' activations while the fit is made."""
    return job_output.with_name(job_output.name + ".pca-stage.h5")


def check_fits(fits: FitSet, dims: dict[str, tuple[int, int]]) -> None:
    """UsageProblem before anything is written when a layer's K or its fit's memory does not fit (DIMS: name ->
    (values per image, K))."""
    for name, (dim, k) in dims.items():
        check_fit_fits(name, len(fits.images), dim, k)


@dataclass(frozen=True)
class Stager:
    """What stages the fit images' activations: the run's SETTINGS, MODEL, LOCK and PROGRESS, through the run's
    loop (`batches.fill`)."""

    settings: Settings
    model: Model
    lock: OutputLock
    progress: Progress

    def stage(self, path: Path, images: ImageList, layers: Iterable[str], fingerprint: dict) -> Path:
        """The flattened float32 activations of LAYERS for IMAGES, written to a finished file at PATH (with
        FINGERPRINT, unlocked: the fit's lock guards it)."""
        chosen = [layer for layer in self.model.layers if layer.name in set(layers)]
        staged = dataclasses.replace(self.model, layers=chosen, dtype="float32",
                                     reductions={layer.name: bind("flatten", layer.name, layer.shape)
                                                 for layer in chosen})
        writer = FeatureWriter.open(path, staged.specs, fingerprint, {}, list(images.classes),
                                    self.settings.batch_size, locking=False)
        settings = dataclasses.replace(self.settings, output=path, proof=0)
        return fill(writer, images, settings, staged, self.lock, self.progress)


def obtain_fits(job_output: Path, digests: dict[str, str], dims: dict[str, tuple[int, int]], fits: FitSet,
                stager: Stager, already: list[Path], overwrite: bool = False) -> dict[str, PcaFit]:
    """The fits of DIMS' layers (DIGESTS: what each is made from): each read where it is already (ALREADY: the
    output being resumed or updated, then OUT.pca.h5), the others made from the fit images' flattened
    activations, staged by STAGER; the fits are added to OUT.pca.h5.

    The staged activations are resumed where a kill left them (staging or fitting), discarded when made for
    another fit or when OVERWRITE, and removed when the fit is made or refused: none blocks a later run."""
    found = _read_fits([*already, fit_path(job_output)], digests, dims)
    if len(found) == len(dims):
        return found
    lock = job_output.with_name(job_output.name + ".pca.lock")
    with waiting_lock(lock, f"the PCA fit of {job_output.name}"):
        try:
            return {**found, **_fit_under_lock(job_output, digests, _without(dims, found), fits, stager, overwrite)}
        finally:
            lock.unlink(missing_ok=True)  # whoever waits on it then finds the fits; whoever comes later needs none


def _without(dims: dict[str, tuple[int, int]], found: dict) -> dict[str, tuple[int, int]]:
    return {name: dim for name, dim in dims.items() if name not in found}


def _fit_under_lock(job_output: Path, digests: dict[str, str], dims: dict[str, tuple[int, int]], fits: FitSet,
                    stager: Stager, overwrite: bool) -> dict[str, PcaFit]:
    found = _read_fits([fit_path(job_output)], digests, dims)  # a shard before us made them while we waited
    if len(found) == len(dims):
        return found
    dims = _without(dims, found)
    digest = hashlib.sha256(json.dumps({name: digests[name] for name in dims}, sort_keys=True).encode()).hexdigest()
    staged_bytes = len(fits.images) * sum(dim * 4 for dim, _ in dims.values())
    log.info("PCA fit: staging the activations of %s (%s on disk beside the output), then fitting %s with at "
             "most %s of memory (FEATDUMP_PCA_MEMORY_GB).", fits.description, human_bytes(staged_bytes),
             ", ".join(f"{name} ({k} of {dim})" for name, (dim, k) in dims.items()), human_bytes(MEMORY_LIMIT))
    if overwrite:  # under the lock: no shard of the job is staging now
        remove_staging(job_output)
    _discard_other_staging(job_output, digest)
    staged = stage_path(job_output)
    if not staged.exists():  # else staged by a run killed while fitting: fitted from it now
        check_space(job_output, staged_bytes, "The PCA fit's staged activations", "use a smaller --pca-fit")
        staged = stager.stage(staged, fits.images, dims, {"pca_stage": digest, "image_count": len(fits.images)})
    try:
        made = _fit_staged(staged, dims, fits.description, digests)
    finally:
        remove_staging(job_output)  # made or refused: the staged activations are not needed again
    _write_fits(fit_path(job_output), made)
    return {**found, **made}


def remove_staging(job_output: Path) -> None:
    """OUT.pca-stage.h5 and its partial file gone."""
    for path in (stage_path(job_output), partial_path(stage_path(job_output))):
        path.unlink(missing_ok=True)


def _discard_other_staging(job_output: Path, digest: str) -> None:
    """Remove staged activations made for another fit (another K, model or fit set)."""
    for path in (stage_path(job_output), partial_path(stage_path(job_output))):
        try:
            with open_to_read(path) as h5file:
                made_for = fingerprints.stored(h5file.attrs).get("pca_stage")
        except (OSError, ValueError):  # missing, or unreadable (a kill while creating it)
            made_for = None
        if made_for != digest:
            path.unlink(missing_ok=True)


def _fit_staged(staged: Path, dims: dict[str, tuple[int, int]], description: str,
                digests: dict[str, str]) -> dict[str, PcaFit]:
    made = {}
    with Output.open(staged) as output:
        rows, skipped = output.committed.rows, output.named_rows("skipped", output.committed.skipped)
        if skipped:
            description += f", {len(skipped)} of them skipped"
        for name, (dim, k) in dims.items():
            check_fit_fits(name, rows, dim, k, skipped=len(skipped))  # the rows actually staged
            started = time.perf_counter()
            made[name] = fit(output.features(name), rows, k, description)
            made[name].digest, made[name].skipped = digests[name], [tuple(entry) for entry in skipped]
            log.info("PCA fit of %s: %d components of %d values over %d images (%s), %.1f%% of the variance, "
                     "in %.1f s.", name, k, dim, rows, made[name].method,
                     100 * made[name].explained_variance.sum() / max(made[name].total_variance, 1e-30),
                     time.perf_counter() - started)
    return made


def _write_fits(path: Path, fits: dict[str, PcaFit]) -> None:
    """FITS added to the fits PATH holds (those of other layers kept): written whole, then renamed into place (a
    reader never sees half a fit file)."""
    kept = {}
    try:
        with open_to_read(path) as h5file:
            kept = {name: PcaFit.read(h5file["pca"][name]) for name in h5file.get("pca", {}) if name not in fits}
    except (OSError, KeyError):  # none yet, or unreadable: written anew
        kept = {}
    temporary = partial_path(path)
    with h5py.File(temporary, "w") as h5file:
        group = h5file.create_group("pca")
        for name, made in {**kept, **fits}.items():
            made.store(group.create_group(name))
    os.replace(temporary, path)


def _read_fits(paths: list[Path], digests: dict[str, str], dims: dict[str, tuple[int, int]]) -> dict[str, PcaFit]:
    """The fits of DIMS' layers made from their DIGESTS that PATHS hold (each from the first that has it)."""
    found = {}
    for path in paths:
        if not path.exists() or len(found) == len(dims):
            continue
        try:
            with open_to_read(path) as h5file:
                here = {}
                for name, (dim, k) in _without(dims, found).items():
                    group = h5file.get(f"pca/{name}")
                    if group is not None and group.attrs.get("fit_digest") == digests[name]:
                        fit_read = PcaFit.read(group)
                        if fit_read.components.shape == (k, dim):
                            here[name] = fit_read
        except OSError:
            continue
        if here:
            log.info("PCA fits of %s read from %s.", ", ".join(here), path)
        found.update(here)
    return found


def layer_dims(shapes: dict[str, tuple[int, ...]], reductions: dict[str, str]) -> dict[str, tuple[int, int]]:
    """name -> (values per image, K) of every pca:K layer."""
    return {name: (math.prod(shapes[name]), int(text.split(":")[1])) for name, text in reductions.items()
            if text.startswith("pca:")}
