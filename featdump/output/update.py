"""Update: what a finished output lacks of what a command names (--update): new images, new layers; which of its
rows went stale; the staging files the new values are written to; the short final commit that joins them.

The output stays readable by anyone while an update runs: the new layers of the rows already stored are
extracted into OUT.grow.partial, the new images (every layer) into OUT.update.partial, both ordinary featdump
files, resumable like any other; only the final commit opens OUT to write: it copies the new layers' datasets
in (into the hidden group `growing`, then moved under `features` at once), appends the staged rows under the
usual commit protocol (counters last), records what it added (the fingerprint last), and removes the staging
files. A kill at any moment leaves OUT with every row and layer it had; the next --update finishes the work.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from featdump.errors import ResumeMismatch, UsageProblem
from featdump.inputs import ImageList
from featdump.output import fingerprint as fingerprints
from featdump.output import netcdf
from featdump.output import skipped as skips
from featdump.output.layout import (
    Committed,
    Output,
    append_proof,
    as_text,
    copy_coordinates,
    create_named_rows,
    name_dimensions,
    partial_path,
    raw_paths,
    text_array,
    write_paths,
    write_rows,
)
from featdump.output.repair import discard_uncommitted
from featdump.output.row_matching import positions_of_rows, unknown_positions
from featdump.output.skipped import Skip
from featdump.output.writer import close_quietly, fsync_path, write_error

log = logging.getLogger("featdump")
_COPY_ROWS = 1024


UPDATE_TOKEN = "update_token"  # an update's staging file's own name for it (kept across a kill)
LAYER_KEYS = ("layers", "layouts", "reduce", "pca_fit")  # the fingerprint's keys an update may extend (new layers)


@dataclass(frozen=True)
class UpdatePlan:
    """What an --update adds to a finished output."""

    images: ImageList  # the new images, labelled against the output's classes (new class folders appended)
    stale: list[tuple[str, str]]  # (path, why) of rows whose image disappeared or changed
    base: Committed  # the output's counters when the update was planned
    fingerprint: dict  # the new images' staging file's: the run's own (every layer), plus the rows it extends
    stored_layers: list[str]  # the layers OUT holds, in its order
    new_layers: list[str]  # the layers the command names that OUT lacks (computed for every stored row too)
    rows: ImageList | None  # the images of OUT's rows, in row order, when there are new layers
    grow_fingerprint: dict | None  # the new layers' staging file's
    recorded_stale: list[tuple[str, str]] = ()  # the stale rows OUT records now
    retried: tuple[Skip, ...] = ()  # OUT's skipped inputs read again (changed since, or --retry-skipped)
    kept_skips: tuple[Skip, ...] = ()  # the others, when some are retried: the list they leave

    @property
    def nothing_new(self) -> bool:
        """No new image, no new layer, and the stale rows as OUT records them: nothing to write."""
        stale = [(as_text(path), reason) for path, reason in self.stale]  # as the file holds them: text
        return not len(self.images) and not self.new_layers and stale == list(self.recorded_stale) and \
            not self.retried

    @property
    def before(self) -> Committed:
        """OUT's counters without the retried inputs' entries: what the update's outcome adds to."""
        base, retried = self.base, len(self.retried)
        return Committed(base.rows, base.images - retried, base.skipped - retried)

    def after(self, added: Committed) -> Committed:
        """OUT's counters once the staged ADDED are in: a retried input's old entry is replaced by its outcome."""
        base = self.base
        if not self.retried:
            return Committed(base.rows + added.rows, base.images + added.images, base.skipped + added.skipped)
        return Committed(base.rows + added.rows, base.images - len(self.retried) + added.images,
                         len(self.kept_skips) + added.skipped)


@dataclass(frozen=True)
class StoredLayers:
    """The layers a finished output holds, as its fingerprint records them: names in order, reductions, layouts."""

    names: list[str]
    reductions: dict[str, str]
    layouts: dict[str, str]
    fingerprint: dict  # the whole of it

    @classmethod
    def of(cls, output: Path) -> StoredLayers:
        with Output.open(output) as held:
            recorded = held.fingerprint
        return cls(list(recorded.get("layers", [])), dict(recorded.get("reduce", {})),
                   dict(recorded.get("layouts", {})), recorded)

    def check_named(self, layers: list[str], reductions: dict[str, str], output: Path) -> None:
        """ResumeMismatch when a layer the command names is stored with another reduction (both named)."""
        for name in layers:
            stored, asked = self.reductions.get(name, "none"), reductions.get(name, "none")
            if name in self.names and stored != asked:
                raise ResumeMismatch(f"{str(output)!r} holds layer {name} reduced with {stored}; this command asks "
                                     f"for {asked}. Name it with --reduce '{name}={stored}', or write another "
                                     "output (or --overwrite to start over).")


def grow_path(output: Path) -> Path:
    """OUT.grow: the finished staging file of the new layers of the stored rows (written as OUT.grow.partial)."""
    return output.with_name(output.name + ".grow")


def staging_path(output: Path) -> Path:
    """OUT.update: the finished staging file (written as OUT.update.partial)."""
    return output.with_name(output.name + ".update")


def plan_update(output: Path, images: ImageList, fingerprint: dict, new_layers: list[str],
                grow_fingerprint: dict | None = None, retry_skipped: bool = False) -> UpdatePlan:
    """Read the finished OUTPUT (briefly, read-only): refuse what cannot be updated, and find what is new: new
    images, and skipped inputs to read again (those whose file changed; all of them with RETRY_SKIPPED).
    FINGERPRINT: the run's, over every layer (the stored ones and NEW_LAYERS); GROW_FINGERPRINT: the run's over
    NEW_LAYERS alone (their staging file's, over the stored rows)."""
    with Output.open(output) as held:
        if "merged_from" in held.attrs and held.attrs.get("virtual", False):
            raise UsageProblem(
                f"{str(output)!r} is a merged view over shards; --update works on a self-contained file. Write one "
                "with `featdump merge --copy`, or run the sharded job again over the new folder."
            )
        fingerprints.check(held.attrs, output, fingerprint, ignore=(*fingerprints.UPDATE_IGNORES, *LAYER_KEYS))
        recorded = skips.read(held.file, held.committed.skipped)
        again = set(skips.to_retry(recorded, _stat_by_path(images), retry_skipped)) if recorded else set()
        if again:
            present = set(images.paths)  # an input no longer listed keeps its entry: nothing would replace it
            again = {index for index in again if recorded[index].path in present}
        retried = [skip for index, skip in enumerate(recorded) if index in again]
        kept = [skip for index, skip in enumerate(recorded) if index not in again]
        stored = held.raw_paths()
        positions = positions_of_rows(stored, images)
        unknown = unknown_positions(images, stored, positions, {skip.path for skip in kept},
                                     {(skip.path, skip.onset) for skip in retried})
        new = new_images(images, unknown, tuple(held.classes))
        recorded_stale = [(path, reason) for path, reason in held.named_rows("stale", held.stale_count())]
        stale = stale_rows(held, images, stored, positions, {path for path, _ in recorded_stale})
        base = held.committed
        stored_layers = list(held.fingerprint.get("layers", []))
        rows = _row_images(held, images, output, stored, positions) if new_layers else None
    if new_layers and stale:
        raise UsageProblem(f"{len(stale)} of the rows of {str(output)!r} are stale (their image is gone or changed "
                           f"since: {stale[0][0]!r}, {stale[0][1]}), so the new layers "
                           f"{', '.join(new_layers)} cannot be computed for them. Restore those images, or write the "
                           "layers to another output (or --overwrite to start over).")
    extends = [base.rows, base.images, base.skipped]
    staged = {**fingerprint, "images": new.digest(), "image_count": len(new), "update_of": extends}
    grown = None
    if new_layers:
        grown = {**grow_fingerprint, "images": rows.digest(), "image_count": len(rows), "grow_of": extends,
                 "stored_layers": stored_layers}
    if retried:
        log.info("Reading again %d skipped input(s) (%s): %s.", len(retried),
                 "--retry-skipped" if retry_skipped else "changed since they were skipped",
                 ", ".join(skip.key for skip in retried[:3]) + (", ..." if len(retried) > 3 else ""))
    return UpdatePlan(new, stale, base, staged, stored_layers, list(new_layers), rows, grown, recorded_stale,
                      tuple(retried), tuple(kept) if retried else ())


def _stat_by_path(images: ImageList):
    """stat(path): the (size, mtime_ns) now of IMAGES' input at PATH, or None when IMAGES lacks it."""
    first: dict[str, int] = {}
    for position, path in enumerate(images.paths):
        first.setdefault(path, position)
    return lambda path: images.stat(first[path]) if path in first else None


def _row_images(held: Output, images: ImageList, output: Path, stored: list[bytes],
                positions: np.ndarray) -> ImageList:
    """The images of HELD's rows (STORED: their paths; POSITIONS: theirs in IMAGES), in row order, to compute new
    layers for: the k-th row of a path is its k-th image (a video's k-th clip; a tar member named twice, its k-th
    copy)."""
    missing = np.flatnonzero(positions < 0)
    if len(missing):
        raise UsageProblem(f"{len(missing)} images of the rows of {str(output)!r} are not in the images given "
                           f"({os.fsdecode(stored[missing[0]])!r}, ...), so the new layers cannot be computed for "
                           "them; run the update over the folder the output was made from.")
    return images.select(positions.tolist(), labels=list(held.labels()), classes=held.classes)


def new_images(images: ImageList, kept: list[int], classes: tuple[str, ...]) -> ImageList:
    """The images at positions KEPT, labelled against CLASSES (as a file stores them: UTF-8 text) extended by any
    new class folder (appended, so that labels already written keep their meaning)."""
    if not images.classes:  # labels from a list file, a .cls member (or none): they stay as given
        return images.select(kept, classes=classes)
    new_classes = sorted({as_text(images.classes[images.labels[p]]) for p in kept if images.labels[p] >= 0}
                         - set(classes))
    classes = (*classes, *new_classes)
    index = {name: i for i, name in enumerate(classes)}
    labels = [index[as_text(images.classes[images.labels[p]])] if images.labels[p] >= 0 else -1 for p in kept]
    return images.select(kept, labels, classes)


def stale_rows(held: Output, images: ImageList, stored: list[bytes], positions: np.ndarray,
               recorded_stale: set[str] = frozenset()) -> list[tuple[str, str]]:
    """(path, why) for the rows of HELD (STORED: their paths; POSITIONS: theirs in IMAGES) whose image is no longer
    in IMAGES, or changed since it was read (its size or modification time; an array row's bytes), in row order.
    RECORDED_STALE: the paths HELD records stale now, looked at again whatever else is known."""
    recorded = np.asarray(held.file["file_stats"][:held.committed.rows], dtype=np.int64)
    listed = json.loads(as_text(held.attrs.get("image_listing", "{}")) or "{}")
    named = {os.fsencode(path) for path in recorded_stale}
    suspects = np.array([name in named for name in stored], dtype=bool) if named else np.zeros(len(stored), bool)
    gone, changed = images.stale(positions, recorded, listed, suspects)
    return [(os.fsdecode(stored[row]), "disappeared" if gone[row] else "changed")
            for row in np.flatnonzero(gone | changed).tolist()]


def discard_other_staging(output: Path, plan: UpdatePlan) -> None:
    """Remove staging files left by an update of another state of OUTPUT, or of other layers (they cannot be
    resumed)."""
    stagings = ((staging_path(output), plan.fingerprint), (grow_path(output), plan.grow_fingerprint))
    for staged_as, fingerprint in stagings:
        for path in (staged_as, partial_path(staged_as)):
            if not path.exists():
                continue
            try:
                if fingerprint is None:
                    raise UsageProblem("no new layer now")
                with Output.open(path, locking=False) as staged:
                    fingerprints.check(staged.attrs, path, fingerprint)
            except (ResumeMismatch, UsageProblem) as error:
                log.info("Starting the update afresh: %s is of an earlier update (%s).", path, error)
                path.unlink()


def apply_update(output: Path, plan: UpdatePlan, images_digest: str, record: dict, locking: bool = True) -> float:
    """The final commit: copy the new layers' datasets in (from OUT.grow), append the finished staging file's rows
    to OUTPUT (counters last, one write), record the new classes, the stale rows, the image set and the layers
    (RECORD: the attributes of what the update adds: its command and time), then remove the staging files.
    Returns its seconds.

    Safe to repeat after a kill: layers or rows OUTPUT already holds are not added twice.
    """
    staged_path = staging_path(output)
    started = time.perf_counter()
    h5file = _open_for_writing(output, locking)
    try:
        _discard_unfinished_growth(h5file)
        if h5file.attrs.get("packed", False):  # a merge's copy of its shards, now with rows of its own
            h5file.attrs["packed"] = False  # merging the shards again must not replace it
        if plan.new_layers:
            with Output.open(grow_path(output), locking=False) as grown:
                _add_layers(h5file, grown, plan, record)
        with Output.open(staged_path, locking=False) as staged:
            _append_staged(h5file, staged, plan, images_digest)
        name_dimensions(h5file)
        error = close_quietly(h5file)
        if error is not None:
            raise error
        fsync_path(output)
    except (OSError, RuntimeError) as error:
        close_quietly(h5file)
        raise write_error(output, error, plan.base.rows) from error
    staged_path.unlink()
    grow_path(output).unlink(missing_ok=True)
    fsync_path(output.parent)
    return time.perf_counter() - started


_GROWING = "growing"  # the hidden group new layers are copied into before they are moved under /features


def _discard_unfinished_growth(h5file: h5py.File) -> None:
    """Drop what a kill during a final commit left: datasets copied but not moved, or moved but not recorded."""
    if _GROWING in h5file:
        for name in list(h5file[_GROWING]):
            netcdf.remove(h5file[_GROWING], name)
        del h5file[_GROWING]
    recorded = set(fingerprints.stored(h5file.attrs).get("layers", []))
    for name in [name for name in netcdf.layer_names(h5file) if name not in recorded]:
        netcdf.remove(h5file["features"], name)


def _add_layers(h5file: h5py.File, grown: Output, plan: UpdatePlan, record: dict) -> None:
    """Copy each new layer's dataset (as many rows as OUT holds) in, then move them under /features together."""
    held_paths = raw_paths(h5file)[:plan.base.rows]  # rows matched by their exact bytes, whatever the names
    if grown.committed.rows != plan.base.rows or grown.raw_paths() != held_paths:
        raise ResumeMismatch(f"{grow_path(Path(h5file.filename))} was staged for other rows of the output; remove "
                             "it and run the update again.")
    holding = h5file.create_group(_GROWING)
    for name in plan.new_layers:
        h5file.copy(grown.features(name), holding, name=name)
        netcdf.forget(holding[name])  # its dimensions are named in OUT once it is under /features
        holding[name].attrs.update(record)
        pca = grown.pca_fit(name)
        if pca is not None and f"pca/{name}" not in h5file:
            h5file.copy(pca, h5file.require_group("pca"), name=name)
            netcdf.forget(h5file["pca"][name])
    for entry in grown.proofs:  # the proof of the run that computed the new layers
        append_proof(h5file, {**entry, "run": f"added {', '.join(plan.new_layers)}"})
    h5file.flush()
    for name in plan.new_layers:
        h5file.move(f"{_GROWING}/{name}", f"features/{name}")
    del h5file[_GROWING]


def _open_for_writing(output: Path, locking: bool, patience: float = 600.0) -> h5py.File:
    """OUTPUT opened to write; while readers hold it open (HDF5's shared lock), tried again every 20-200 ms for up
    to PATIENCE seconds: a reader's open is short, and none is refused while this waits."""
    waited, pause = 0.0, 0.02
    while True:
        try:
            return h5py.File(output, "r+", locking=locking)
        except OSError as error:
            if "unable to lock file" not in str(error) or waited >= patience:
                raise write_error(output, error, None) from error
            if waited == 0.0:
                log.info("Waiting for the readers of %s to close it, to append the new rows.", output)
        time.sleep(pause)
        waited, pause = waited + pause, min(pause * 2, 0.2)


def _append_staged(h5file: h5py.File, staged: Output, plan: UpdatePlan, images_digest: str) -> None:
    added = staged.committed
    skips.finish_swap(h5file)
    held, after = Committed.of(h5file), plan.after(added)
    if added.images and held == after:
        return  # a kill came after the commit: the rows are there (and all recorded before them)
    token = str(staged.attrs.get(UPDATE_TOKEN, ""))
    if plan.retried and held == plan.base and skips.swapped_for(h5file, after, token):
        after.store(h5file)  # a kill came between the new skipped list and the counters: all else is written
        h5file.flush()
        return
    if held != plan.base:
        raise ResumeMismatch(f"{staging_path(Path(h5file.filename))} was staged for another state of the output; "
                             "remove it and run the update again.")
    discard_uncommitted(h5file, int(fingerprints.stored(h5file.attrs).get("image_count", 0) or held.images))
    rows, skipped = held.rows, held.skipped
    for name in staged.layers:
        source, target = staged.features(name), h5file["features"][name]
        target.resize(rows + added.rows, axis=0)
        for start in range(0, added.rows, _COPY_ROWS):
            stop = min(start + _COPY_ROWS, added.rows)
            target[rows + start:rows + stop] = source[start:stop]
    if added.rows:
        write_paths(h5file, "", rows, [os.fsdecode(name) for name in staged.raw_paths()])
        write_rows(h5file["labels"], rows, rows + added.rows, staged.labels())
        write_rows(h5file["file_stats"], rows, rows + added.rows, staged.file["file_stats"][:added.rows])
        copy_coordinates(h5file, staged.file, rows, added.rows)
    if not plan.retried:
        skips.write(h5file, skipped, skips.read(staged.file, added.skipped))
    h5file["labels"].attrs["classes"] = text_array(staged.classes)
    write_stale(h5file, plan.stale)
    if "image_listing" in staged.attrs:  # the listing this update read (a prefix's object count, ...)
        h5file.attrs["image_listing"] = staged.attrs["image_listing"]
    fingerprint = {key: value for key, value in plan.fingerprint.items() if key != "update_of"}
    h5file.attrs["layers"] = text_array(fingerprint["layers"])
    h5file.attrs["reduce"] = json.dumps(fingerprint["reduce"])
    fingerprints.store(h5file.attrs, {**fingerprint, "images": images_digest, "image_count": after.images})
    for entry in staged.proofs if added.images else ():  # the update's own proof, when it read images
        append_proof(h5file, {**entry, "run": "update"})
    h5file.flush()
    if plan.retried:  # the retried inputs' old entries give way to their outcome
        skips.replace(h5file, [*plan.kept_skips, *skips.read(staged.file, added.skipped)], after, token)
    after.store(h5file)
    h5file.flush()


def write_stale(h5file: h5py.File, stale: list[tuple[str, str]]) -> None:
    """Replace /stale with STALE's (path, why)."""
    if "stale" in h5file:
        del h5file["stale"]
    create_named_rows(h5file.create_group("stale"))
    if stale:
        write_paths(h5file, "stale/", 0, [path for path, _ in stale])
        write_rows(h5file["stale/reasons"], 0, len(stale), np.array([reason for _, reason in stale], dtype=object))
