"""Writer: appends batches to the output (written as OUT.partial), commits each, and renames it when complete.

After each batch the data is flushed first, then the counters `committed` = [rows, images, skipped] are
overwritten in place in one write and flushed, so a file killed at any instant holds exact data up to its
counters; resuming discards anything beyond them (`repair`). The file's layout is `layout`'s.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import shutil
from pathlib import Path

import h5py
import numpy as np

from featdump.errors import OutputWriteError, ResumeMismatch
from featdump.output import fingerprint as fingerprints
from featdump.output import skipped as skips
from featdump.output.layout import (
    Committed,
    append_proof,
    coordinate_rows,
    create_features,
    create_layout,
    name_dimensions,
    partial_path,
    write_paths,
    write_rows,
)
from featdump.output.lock import refuse_existing
from featdump.output.repair import discard_uncommitted
from featdump.output.skipped import Skip
from featdump.output.specs import DatasetSpec

log = logging.getLogger("featdump")


class FeatureWriter:
    """Owns OUT.partial from open to finish; `append` writes and commits one batch. The caller holds the
    output's lock (LOCKING: whether HDF5's own file locking is on too)."""

    def __init__(self, output: Path, h5file: h5py.File):
        self.output = output
        self._file = h5file

    @property
    def path(self) -> Path:
        """The file being written: OUT.partial."""
        return partial_path(self.output)

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(cls, output: Path, specs: dict[str, DatasetSpec], fingerprint: dict, attributes: dict,
             classes: list[str], batch_size: int, compression: str = "none", overwrite: bool = False,
             locking: bool = True) -> FeatureWriter:
        """Create OUT.partial, or reopen it to resume when its fingerprint matches; OutputExists if OUT is there."""
        output = Path(output)
        refuse_existing(output, overwrite)
        partial = partial_path(output)
        h5file = _reopen(partial, fingerprint, locking) if partial.exists() and not overwrite else None
        if h5file is None:
            h5file = _create(partial, specs, fingerprint, attributes, classes, batch_size, compression, locking)
        return cls(output, h5file)

    # -- state -----------------------------------------------------------------------------------

    @property
    def committed(self) -> Committed:
        return Committed.of(self._file)

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        """Each layer's storage dtype."""
        return {name: dataset.dtype for name, dataset in self._file["features"].items()}

    @property
    def committed_rows(self) -> int:
        return self.committed.rows

    @property
    def committed_images(self) -> int:
        """How many source images (written or skipped) are done: where a resumed run starts."""
        return self.committed.images

    @property
    def committed_skipped(self) -> int:
        return self.committed.skipped

    def holds_nothing(self) -> bool:
        """Whether the file holds nothing a resume would keep: no image done (written or skipped), no PCA fit."""
        return bool(self._file.id.valid) and self.committed.images == 0 and "pca" not in self._file

    # -- writing ---------------------------------------------------------------------------------

    def append(
        self,
        features: dict[str, np.ndarray],
        paths: list[str],
        labels: list[int],
        skipped: list[Skip],
        images_done: int,
        file_stats: list[tuple[int, int]] | None = None,
        coordinates: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Write one batch's rows and skipped images, then commit: counters last, in one write, flushed.
        COORDINATES: what each row records beside its path (a clip's start), one row-aligned dataset each."""
        before = self.committed
        rows, skipped_before = before.rows, before.skipped
        self._check_space(features, rows)
        try:
            new_rows = rows + len(paths)
            if paths:
                for name, values in features.items():
                    write_rows(self._file["features"][name], rows, new_rows, values)
                write_paths(self._file, "", rows, paths)
                write_rows(self._file["labels"], rows, new_rows, np.asarray(labels, dtype=np.int64))
                stats = np.asarray(file_stats if file_stats is not None else [(-1, -1)] * len(paths), dtype=np.int64)
                write_rows(self._file["file_stats"], rows, new_rows, stats)
                for name, values in (coordinates or {}).items():
                    write_rows(self._coordinate(name), rows, new_rows, values)
            new_skipped = skipped_before + len(skipped)
            skips.write(self._file, skipped_before, skipped)
            self._file.flush()
            Committed(new_rows, images_done, new_skipped).store(self._file)
            self._file.flush()
        except OSError as error:
            raise write_error(self.path, error, rows) from error

    def _coordinate(self, name: str) -> h5py.Dataset:
        """The row coordinate /NAME (a clip's start, float64 seconds), made at its first rows and named as a
        coordinate along `image`."""
        if name not in self._file:
            coordinate_rows(self._file, name)
            name_dimensions(self._file)
        return self._file[name]

    def _check_space(self, features: dict[str, np.ndarray], committed_rows: int) -> None:
        """Refuse a batch the disk cannot hold before touching the file, which then stays consistent."""
        datasets = self._file["features"]
        needed = sum(values.nbytes for values in features.values()) + 1024 * 1024
        needed += sum(math.prod(datasets[name].chunks) * datasets[name].dtype.itemsize for name in features)
        free = shutil.disk_usage(self.output.parent).free
        if free < needed:
            no_space = OSError(errno.ENOSPC, "No space left on device")
            raise write_error(self.path, no_space, committed_rows)

    def note(self, attributes: dict) -> None:
        """Record ATTRIBUTES of this run on the file (how it ran, not what it holds: no commit needed)."""
        try:
            self._file.attrs.update(attributes)
            self._file.flush()
        except OSError as error:
            raise write_error(self.path, error, self.committed_rows) from error

    def record_proof(self, entry: dict) -> None:
        """Record this run's proof (`featdump.job.proof`) beside the earlier runs'."""
        try:
            append_proof(self._file, entry)
            self._file.flush()
        except OSError as error:
            raise write_error(self.path, error, self.committed_rows) from error

    def finish(self) -> Path:
        """Mark complete, make it durable, and atomically rename OUT.partial to OUT."""
        partial = self.path
        try:
            self._file.attrs.modify("complete", True)
            self._file.close()
            publish(partial, self.output)
        except OSError as error:
            raise write_error(partial, error, None) from error
        return self.output

    def discard(self) -> list[tuple[str, str]]:
        """Close and remove OUT.partial, for a run that wrote no row (nothing to resume: the same command tries every
        image again); returns the images it skipped and why."""
        skipped = [(skip.key, skip.reason) for skip in skips.read(self._file, self.committed.skipped)]
        close_quietly(self._file)
        self.path.unlink(missing_ok=True)
        return skipped

    def close(self) -> None:
        """Close without finishing: the partial file stays, resumable from its committed rows."""
        error = close_quietly(self._file)
        if error is not None:
            log.warning("Closing %s failed (%s); it stays resumable from its last commit.", self.path, error)


def write_error(path: Path, error: Exception, committed_rows: int | None) -> OutputWriteError:
    """The one-line error for an OSError while writing PATH (a full disk says how to go on)."""
    done = f"; {committed_rows} rows are committed" if committed_rows is not None else ""
    if getattr(error, "errno", None) in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) or "space" in str(error).lower():
        return OutputWriteError(
            f"No space left while writing {str(path)!r}{done}. Free some space and run the same command "
            "again to resume."
        )
    return OutputWriteError(f"Could not write {str(path)!r}: {error}{done}.")


def close_quietly(h5file: h5py.File) -> Exception | None:
    """Close H5FILE; after a failed write HDF5 may raise anything while flushing: returned, not raised."""
    try:
        if h5file.id.valid:
            h5file.close()
    except Exception as error:
        return error
    return None


def publish(partial: Path, output: Path) -> None:
    """Make the closed file PARTIAL durable and atomically rename it to OUTPUT (the rename durable too)."""
    fsync_path(partial)
    os.replace(partial, output)
    fsync_path(output.parent)


def fsync_path(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _create(partial, specs, fingerprint, attributes, classes, batch_size, compression, locking) -> h5py.File:
    """A new PARTIAL with its layout, made whole in PARTIAL.new and renamed: a run killed while creating it leaves
    no PARTIAL that cannot be opened (the next run, holding the lock, removes the stale PARTIAL.new)."""
    staging = partial.with_name(partial.name + ".new")
    try:
        h5file = h5py.File(staging, "w", locking=locking)
    except OSError as error:
        raise write_error(partial, error, None) from error
    try:
        create_layout(h5file, attributes, classes,
                      lambda group: create_features(group, specs, batch_size, compression,
                                                    fingerprint.get("image_count")))
        fingerprints.store(h5file.attrs, fingerprint)
        h5file.close()
        os.replace(staging, partial)
        return h5py.File(partial, "r+", locking=locking)
    except OSError as error:
        raise write_error(partial, error, None) from error
    finally:
        if h5file.id.valid:
            h5file.close()
        staging.unlink(missing_ok=True)  # nothing was committed to it


def _reopen(partial: Path, fingerprint: dict, locking: bool) -> h5py.File | None:
    """PARTIAL reopened to resume; None when it holds nothing committed and was started differently (a run that
    failed before its first batch: nothing to keep, and it must not block the corrected command)."""
    try:
        h5file = h5py.File(partial, "r+", locking=locking)
    except OSError as error:
        raise OutputWriteError(
            f"The partial output {str(partial)!r} cannot be opened ({error}); pass --overwrite to start over."
        ) from error
    try:
        try:
            fingerprints.check(h5file.attrs, partial, fingerprint)
        except ResumeMismatch:
            if Committed.of(h5file).images:
                raise
            log.info("%s holds no committed image and was started differently: starting it anew.", partial)
            h5file.close()
            return None
        discard_uncommitted(h5file, int(fingerprints.stored(h5file.attrs).get("image_count", 0)))
        name_dimensions(h5file)  # a file of the previous format resumed: named as this one's
    except BaseException:
        h5file.close()
        raise
    return h5file
