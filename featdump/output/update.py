"""Update: which images a finished output lacks and which of its rows went stale (--update, for cron), the staging
file the new rows are written to, and the short final commit that appends them to the output.

The output stays readable by anyone while an update runs: the new images are extracted into OUT.update.partial
(an ordinary featdump file, resumable like any other); only the final commit opens OUT to write, appends the
staged rows under the usual commit protocol (counters last), and removes the staging file. A kill at any moment
leaves OUT with every row it had; the next --update finishes the work.
"""

from __future__ import annotations

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
from featdump.output.layout import (
    Committed,
    Output,
    as_text,
    partial_path,
    text_array,
    write_paths,
    write_rows,
    write_stale,
)
from featdump.output.repair import discard_uncommitted
from featdump.output.writer import close_quietly, fsync_path, write_error

log = logging.getLogger("featdump")
_COPY_ROWS = 1024


@dataclass(frozen=True)
class UpdatePlan:
    """What an --update adds to a finished output."""

    images: ImageList  # the new images, labelled against the output's classes (new class folders appended)
    stale: list[tuple[str, str]]  # (path, why) of rows whose image disappeared or changed
    base: Committed  # the output's counters when the update was planned
    fingerprint: dict  # the staging file's: the run's own, plus the output rows it extends


def staging_path(output: Path) -> Path:
    """OUT.update: the finished staging file (written as OUT.update.partial)."""
    return output.with_name(output.name + ".update")


def plan_update(output: Path, images: ImageList, fingerprint: dict) -> UpdatePlan:
    """Read the finished OUTPUT (briefly, read-only): refuse what cannot be updated, and find what is new."""
    with Output.open(output) as held:
        if "merged_from" in held.attrs and held.attrs.get("virtual", False):
            raise UsageProblem(
                f"{str(output)!r} is a merged view over shards; --update works on a self-contained file. Write one "
                "with `featdump merge --copy`, or run the sharded job again over the new folder."
            )
        fingerprints.check(held.attrs, output, fingerprint, ignore=fingerprints.UPDATE_IGNORES)
        new = new_images(images, held.known_paths(), tuple(held.classes))
        stale = stale_rows(held, images)
        base = held.committed
    staged = {**fingerprint, "images": new.digest(), "image_count": len(new),
              "update_of": [base.rows, base.images, base.skipped]}
    return UpdatePlan(new, stale, base, staged)


def new_images(images: ImageList, known: set[str], classes: tuple[str, ...]) -> ImageList:
    """The images whose paths are not in KNOWN, labelled against CLASSES (as a file stores them: UTF-8 text)
    extended by any new class folder (appended, so that labels already written keep their meaning)."""
    kept = [position for position, path in enumerate(images.paths) if path not in known]
    if not images.classes:  # labels from a list file, a .cls member (or none): they stay as given
        return images.select(kept, classes=classes)
    new_classes = sorted({as_text(images.classes[images.labels[p]]) for p in kept if images.labels[p] >= 0}
                         - set(classes))
    classes = (*classes, *new_classes)
    index = {name: i for i, name in enumerate(classes)}
    labels = [index[as_text(images.paths[p].split("/", 1)[0])] for p in kept]
    return images.select(kept, labels, classes)


def stale_rows(held: Output, images: ImageList) -> list[tuple[str, str]]:
    """(path, why) for rows whose image is no longer in IMAGES, or whose size or modification time changed."""
    present = {path: position for position, path in enumerate(images.paths)}
    stale = []
    for path, size, mtime in held.row_files():
        found = images.stat(present[path]) if path in present else None
        if found is None:
            stale.append((path, "disappeared"))
        elif size >= 0 and found != (size, mtime):
            stale.append((path, "changed"))
    return stale


def discard_other_staging(output: Path, plan: UpdatePlan) -> None:
    """Remove a staging file left by an update of another state of OUTPUT (it cannot be resumed)."""
    for path in (staging_path(output), partial_path(staging_path(output))):
        if not path.exists():
            continue
        try:
            with Output.open(path, locking=False) as staged:
                fingerprints.check(staged.attrs, path, plan.fingerprint)
        except (ResumeMismatch, UsageProblem) as error:
            log.info("Starting the update afresh: %s is of an earlier update (%s).", path, error)
            path.unlink()


def apply_update(output: Path, plan: UpdatePlan, images_digest: str, locking: bool = True) -> float:
    """The final commit: append the finished staging file's rows to OUTPUT (counters last, one write), record
    the new classes, the stale rows and the image set, then remove the staging file. Returns its seconds.

    Safe to repeat after a kill: a staging file whose rows OUTPUT already holds is only removed.
    """
    staged_path = staging_path(output)
    started = time.perf_counter()
    h5file = _open_for_writing(output, locking)
    try:
        with Output.open(staged_path, locking=False) as staged:
            _append_staged(h5file, staged, plan, images_digest)
        error = close_quietly(h5file)
        if error is not None:
            raise error
        fsync_path(output)
    except (OSError, RuntimeError) as error:
        close_quietly(h5file)
        raise write_error(output, error, plan.base.rows) from error
    staged_path.unlink()
    fsync_path(output.parent)
    return time.perf_counter() - started


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
    held = Committed.of(h5file)
    if held == Committed(plan.base.rows + added.rows, plan.base.images + added.images,
                         plan.base.skipped + added.skipped):
        return  # a kill came after the commit: the rows are there
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
    if added.skipped:
        write_paths(h5file, "skipped/", skipped, [os.fsdecode(name) for name in staged.raw_paths("skipped/")])
        write_rows(h5file["skipped/reasons"], skipped, skipped + added.skipped,
                   np.array(staged.file["skipped/reasons"].asstr()[:added.skipped], dtype=object))
    h5file["labels"].attrs["classes"] = text_array(staged.classes)
    write_stale(h5file, plan.stale)
    fingerprint = {key: value for key, value in plan.fingerprint.items() if key != "update_of"}
    fingerprints.store(h5file.attrs, {**fingerprint, "images": images_digest,
                                      "image_count": held.images + added.images})
    h5file.flush()
    Committed(rows + added.rows, held.images + added.images, skipped + added.skipped).store(h5file)
    h5file.flush()
