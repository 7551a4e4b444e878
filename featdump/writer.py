"""Writer: the HDF5 output file, written as OUT.partial, committed batch by batch, renamed when complete.

Layout (plain h5py reads it):
    /features/<layer>   (rows, *shape), chunked along rows
    /paths              (rows,) UTF-8 paths relative to the image root, row-aligned with the features
    /raw_paths/rows, /raw_paths/bytes  the exact bytes of the names that are not UTF-8 (shown in /paths
                        with those bytes as \\xNN), by row
    /labels             (rows,) int64, attribute `classes`
    /file_stats         (rows, 2) int64: each image's size and modification time (ns) when it was read
    /stale/paths, /stale/reasons   rows whose image disappeared or changed, as found by the last --update
    /skipped/paths, /skipped/reasons   images that could not be used, and why (with /skipped/raw_paths)
    attributes          model, weights, ..., `complete`, and the commit counters below

After each batch the data is flushed first, then the attribute `committed` = [rows, images, skipped]
(rows written, source images done, images skipped) is overwritten in place in one write and flushed,
so a file killed at any instant holds exact data up to its counters; resuming discards anything beyond
them.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import shutil
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from featdump.errors import OutputExists, OutputLocked, OutputWriteError, ResumeMismatch, UsageProblem

FORMAT = "featdump/2"
MIN_CHUNK_BYTES = 64 * 1024
MAX_CHUNK_BYTES = 4 * 1024 * 1024
STRING = h5py.string_dtype("utf-8")
_BYTES = h5py.vlen_dtype(np.uint8)
log = logging.getLogger("featdump")


@dataclass(frozen=True)
class DatasetSpec:
    """One feature dataset: per-row shape and storage dtype."""

    shape: tuple[int, ...]
    dtype: str
    layout: str | None = None  # "(197, N, 768) -> (N, 197, 768)" when the model's output is not batch-first

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def partial_path(output: Path) -> Path:
    return output.with_name(output.name + ".partial")


def chunk_shape(spec: DatasetSpec, batch_size: int) -> tuple[int, ...]:
    """Chunks of 64 KiB to 4 MiB aligned with batches: whole batches, or an equal part of one, so that no
    chunk is written twice; a row over 4 MiB is split along its first dimensions."""
    row_bytes = max(spec.row_bytes, 1)
    batch_bytes = batch_size * row_bytes
    if batch_bytes < MIN_CHUNK_BYTES:
        batches = min(-(-MIN_CHUNK_BYTES // batch_bytes), max(1, MAX_CHUNK_BYTES // batch_bytes))
        return (batches * batch_size, *spec.shape)
    if batch_bytes <= MAX_CHUNK_BYTES:
        return (batch_size, *spec.shape)
    if row_bytes <= MAX_CHUNK_BYTES:
        fitting = MAX_CHUNK_BYTES // row_bytes
        return (max(rows for rows in range(1, fitting + 1) if batch_size % rows == 0), *spec.shape)
    dims = list(spec.shape)
    itemsize = np.dtype(spec.dtype).itemsize
    for axis in range(len(dims)):
        while dims[axis] > 1 and math.prod(dims) * itemsize > MAX_CHUNK_BYTES:
            dims[axis] = -(-dims[axis] // 2)
    return (1, *dims)


class FeatureWriter:
    """Owns OUT.partial (and its lock) from open to finish; `append` writes and commits one batch.

    With --update it owns a finished OUT instead, appending new rows under the same commit protocol:
    the rows it had are never rewritten, and a kill leaves it readable with all of them.
    """

    def __init__(self, output: Path, h5file: h5py.File, lock: OutputLock, in_place: bool = False):
        self.output = output
        self._file = h5file
        self._lock = lock
        self._in_place = in_place

    @property
    def path(self) -> Path:
        """The file being written: OUT.partial, or OUT itself when updating."""
        return self.output if self._in_place else partial_path(self.output)

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        output: Path,
        specs: dict[str, DatasetSpec],
        fingerprint: dict,
        attributes: dict,
        classes: list[str],
        batch_size: int,
        compression: str = "none",
        overwrite: bool = False,
        lock: OutputLock | None = None,
    ) -> FeatureWriter:
        """Create OUT.partial, or reopen it to resume when its fingerprint matches, under LOCK (taken if None)."""
        output = Path(output)
        lock = lock or OutputLock.acquire(output, overwrite)
        try:
            partial = partial_path(output)
            if partial.exists() and not overwrite:
                h5file = _reopen(partial, fingerprint, lock.hdf5_locking)
            else:
                h5file = _create(partial, specs, fingerprint, attributes, classes, batch_size, compression,
                                 lock.hdf5_locking)
        except BaseException:
            lock.release()
            raise
        return cls(output, h5file, lock)

    @classmethod
    def open_finished(cls, output: Path, fingerprint: dict, lock: OutputLock) -> FeatureWriter:
        """Reopen a finished OUT to append rows (--update), when it was made with the same configuration."""
        try:
            h5file = h5py.File(output, "r+", locking=lock.hdf5_locking)
        except OSError as error:
            lock.release()
            raise OutputWriteError(f"{str(output)!r} cannot be opened to update it ({error}).") from error
        try:
            if "merged_from" in h5file.attrs:
                raise UsageProblem(
                    f"{str(output)!r} is a merged view over shards; --update works on one run's output. Write it "
                    "self-contained with `featdump merge --copy`, or run the sharded job again over the new folder."
                )
            _check_fingerprint(h5file, output, fingerprint, ignore=("images", "image_count"))
            _discard_uncommitted(h5file, int(json.loads(h5file.attrs["fingerprint"]).get("image_count", 0)))
        except BaseException:
            h5file.close()
            lock.release()
            raise
        return cls(output, h5file, lock, in_place=True)

    @property
    def classes(self) -> list[str]:
        return [name.decode() if isinstance(name, bytes) else str(name)
                for name in self._file["labels"].attrs.get("classes", [])]

    def known_paths(self) -> set[str]:
        """Paths (as the image walk names them) of every committed row and skipped image."""
        rows, skipped = self.committed_rows, self.committed_skipped
        named = raw_paths(self._file)[:rows] + raw_paths(self._file, "skipped/")[:skipped]
        return {os.fsdecode(name) for name in named}

    def row_files(self) -> list[tuple[str, int, int]]:
        """(path, size, mtime_ns) of every committed row when its image was read."""
        rows = self.committed_rows
        stats = self._file["file_stats"][:rows]
        return [(os.fsdecode(name), int(size), int(mtime)) for name, (size, mtime)
                in zip(raw_paths(self._file)[:rows], stats)]

    def begin_update(self, fingerprint: dict, classes: list[str], stale: list[tuple[str, str]]) -> None:
        """Record what this update will add (new image count, classes) and the stale rows it found, durably,
        before the first new row: a kill from here on leaves a file that the next --update finishes."""
        self._file.attrs["fingerprint"] = json.dumps(fingerprint, sort_keys=True)
        self._file["labels"].attrs["classes"] = np.array([as_text(name) for name in classes], dtype=STRING)
        self._file.attrs["updating"] = True
        if "stale" in self._file:
            del self._file["stale"]
        group = self._file.create_group("stale")
        create_path_datasets(group, 256)
        group.create_dataset("reasons", shape=(0,), maxshape=(None,), dtype=STRING, chunks=(256,))
        if stale:
            write_paths(self._file, "stale/", 0, [path for path, _ in stale])
            write_rows(group["reasons"], 0, len(stale), np.array([reason for _, reason in stale], dtype=object))
        self._file.flush()

    # -- state -----------------------------------------------------------------------------------

    @property
    def committed_rows(self) -> int:
        return int(self._file.attrs["committed"][0])

    @property
    def committed_images(self) -> int:
        """How many source images (written or skipped) are done: where a resumed run starts."""
        return int(self._file.attrs["committed"][1])

    @property
    def committed_skipped(self) -> int:
        return int(self._file.attrs["committed"][2])

    # -- writing ---------------------------------------------------------------------------------

    def append(
        self,
        features: dict[str, np.ndarray],
        paths: list[str],
        labels: list[int],
        skipped: list[tuple[str, str]],
        images_done: int,
        file_stats: list[tuple[int, int]] | None = None,
    ) -> None:
        """Write one batch's rows and skipped images, then commit: counters last, in one write, flushed."""
        rows, skipped_before = self.committed_rows, self.committed_skipped
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
            new_skipped = skipped_before + len(skipped)
            if skipped:
                write_paths(self._file, "skipped/", skipped_before, [path for path, _ in skipped])
                write_rows(self._file["skipped/reasons"], skipped_before, new_skipped,
                            np.array([as_text(reason) for _, reason in skipped], dtype=object))
            self._file.flush()
            self._file.attrs.modify("committed", np.array([new_rows, images_done, new_skipped], dtype=np.int64))
            self._file.flush()
        except OSError as error:
            raise _write_error(self.path, error, rows) from error

    def _check_space(self, features: dict[str, np.ndarray], committed_rows: int) -> None:
        """Refuse a batch the disk cannot hold before touching the file, which then stays consistent."""
        datasets = self._file["features"]
        needed = sum(values.nbytes for values in features.values()) + 1024 * 1024
        needed += sum(math.prod(datasets[name].chunks) * datasets[name].dtype.itemsize for name in features)
        free = shutil.disk_usage(self.output.parent).free
        if free < needed:
            no_space = OSError(errno.ENOSPC, "No space left on device")
            raise _write_error(self.path, no_space, committed_rows)

    def finish(self, images_digest: str | None = None) -> Path:
        """Mark complete, make it durable, and atomically rename OUT.partial to OUT (an update stays in place;
        IMAGES_DIGEST then records the image set it now covers)."""
        partial = self.path
        try:
            self._file.attrs.modify("complete", True)
            if self._in_place:
                fingerprint = json.loads(self._file.attrs["fingerprint"])
                fingerprint["images"] = images_digest
                self._file.attrs["fingerprint"] = json.dumps(fingerprint, sort_keys=True)
                self._file.attrs["updating"] = False
            self._file.close()
            fsync_path(partial)
            if not self._in_place:
                os.replace(partial, self.output)
            fsync_path(self.output.parent)
        except OSError as error:
            raise _write_error(partial, error, None) from error
        finally:
            self._lock.release()
        return self.output

    def close(self) -> None:
        """Close without finishing: the partial file stays, resumable from its committed rows."""
        try:
            if self._file.id.valid:
                self._file.close()
        except Exception as error:  # after a failed write HDF5 may raise anything while flushing
            log.warning("Closing %s failed (%s); it stays resumable from its last commit.", self.path, error)
        finally:
            self._lock.release()


def write_rows(dataset: h5py.Dataset, start: int, stop: int, values: np.ndarray) -> None:
    if dataset.shape[0] != stop:
        dataset.resize(stop, axis=0)
    dataset[start:stop] = values


def as_text(name: str) -> str:
    """NAME as valid UTF-8 text: a file name's undecodable bytes (surrogate escapes) shown as \\xNN."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace")


def write_paths(h5file: h5py.File, group: str, start: int, paths: list[str]) -> None:
    """Rows START.. of GROUP/paths as text; the exact bytes of names that are not UTF-8 in GROUP/raw_paths."""
    texts = [as_text(path) for path in paths]
    write_rows(h5file[group + "paths"], start, start + len(paths), np.array(texts, dtype=object))
    raw = [(start + index, os.fsencode(path)) for index, (path, text) in enumerate(zip(paths, texts))
           if text is not path]
    if raw:
        rows, names = h5file[group + "raw_paths/rows"], h5file[group + "raw_paths/bytes"]
        count = rows.shape[0]
        write_rows(rows, count, count + len(raw), np.array([row for row, _ in raw], dtype=np.int64))
        names.resize(count + len(raw), axis=0)
        for index, (_, name) in enumerate(raw):  # one by one: h5py cannot slice-assign a single sequence
            names[count + index] = np.frombuffer(name, dtype=np.uint8)


def raw_paths(h5file: h5py.File, group: str = "") -> list[bytes]:
    """The exact bytes of every row's path (GROUP 'skipped/' for the skipped images)."""
    paths = [text.encode("utf-8") for text in h5file[group + "paths"].asstr()[:]]
    raw = h5file.get(group + "raw_paths")
    if raw is not None:
        for row, name in zip(raw["rows"][:], raw["bytes"][:]):
            if row < len(paths):
                paths[row] = name.tobytes()
    return paths


def _write_error(partial: Path, error: OSError, committed_rows: int | None) -> OutputWriteError:
    done = f"; {committed_rows} rows are committed" if committed_rows is not None else ""
    if error.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) or "space" in str(error).lower():
        return OutputWriteError(
            f"No space left while writing {str(partial)!r}{done}. Free some space and run the same command "
            "again to resume."
        )
    return OutputWriteError(f"Could not write {str(partial)!r}: {error}{done}.")


# -- file creation and resume --------------------------------------------------------------------


def _create(partial, specs, fingerprint, attributes, classes, batch_size, compression, locking) -> h5py.File:
    try:
        h5file = h5py.File(partial, "w", locking=locking)
    except OSError as error:
        raise _write_error(partial, error, None) from error
    try:
        for key, value in attributes.items():
            if isinstance(value, list):
                value = np.array([as_text(item) if isinstance(item, str) else item for item in value], dtype=STRING)
            h5file.attrs[key] = as_text(value) if isinstance(value, str) else value
        h5file.attrs["format"] = FORMAT
        h5file.attrs["fingerprint"] = json.dumps(fingerprint, sort_keys=True)
        h5file.attrs["complete"] = False
        features = h5file.create_group("features")
        filters = compression_filters(compression)
        for name, spec in specs.items():
            dataset = features.create_dataset(name, shape=(0, *spec.shape), maxshape=(None, *spec.shape),
                                              dtype=spec.dtype, chunks=chunk_shape(spec, batch_size), **filters)
            if spec.layout:
                dataset.attrs["layout"] = spec.layout
        create_path_datasets(h5file, 4096)
        labels = h5file.create_dataset("labels", shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(4096,))
        labels.attrs["classes"] = np.array([as_text(name) for name in classes], dtype=STRING)
        h5file.create_dataset("file_stats", shape=(0, 2), maxshape=(None, 2), dtype=np.int64, chunks=(2048, 2))
        skipped = h5file.create_group("skipped")
        create_path_datasets(skipped, 256)
        skipped.create_dataset("reasons", shape=(0,), maxshape=(None,), dtype=STRING, chunks=(256,))
        h5file.attrs["committed"] = np.zeros(3, dtype=np.int64)  # rows, images, skipped
        h5file.flush()
    except BaseException:
        h5file.close()
        partial.unlink(missing_ok=True)  # nothing was committed to it
        raise
    return h5file


def compression_filters(compression: str) -> dict:
    """h5py create_dataset keywords for COMPRESSION; zstd and blosc (lz4, byte shuffle) come from hdf5plugin,
    which readers then import too."""
    if compression == "none":
        return {}
    if compression in ("lzf", "gzip"):
        return {"compression": compression}
    try:
        import hdf5plugin
    except ImportError as error:
        raise UsageProblem(f"--compression {compression} needs hdf5plugin: pip install 'featdump[compression]'.") \
            from error
    if compression == "zstd":
        return dict(hdf5plugin.Zstd(clevel=3))
    return dict(hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE))


def create_path_datasets(group: h5py.Group, chunk_rows: int) -> None:
    group.create_dataset("paths", shape=(0,), maxshape=(None,), dtype=STRING, chunks=(chunk_rows,))
    raw = group.create_group("raw_paths")
    raw.create_dataset("rows", shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(256,))
    raw.create_dataset("bytes", shape=(0,), maxshape=(None,), dtype=_BYTES, chunks=(256,))


def _reopen(partial: Path, fingerprint: dict, locking: bool) -> h5py.File:
    try:
        h5file = h5py.File(partial, "r+", locking=locking)
    except OSError as error:
        raise OutputWriteError(
            f"The partial output {str(partial)!r} cannot be opened ({error}); pass --overwrite to start over."
        ) from error
    try:
        _check_fingerprint(h5file, partial, fingerprint)
        _discard_uncommitted(h5file, int(json.loads(h5file.attrs["fingerprint"]).get("image_count", 0)))
    except BaseException:
        h5file.close()
        raise
    return h5file


def _check_fingerprint(h5file: h5py.File, path: Path, fingerprint: dict, ignore: tuple[str, ...] = ()) -> None:
    """ResumeMismatch unless H5FILE was written by this format with FINGERPRINT (keys in IGNORE aside)."""
    if h5file.attrs.get("format") != FORMAT:
        raise ResumeMismatch(
            f"{str(path)!r} was written by another featdump version (format {h5file.attrs.get('format')!r}, "
            f"this one writes {FORMAT!r}); pass --overwrite to start over."
        )
    stored = json.loads(h5file.attrs.get("fingerprint", "{}"))
    differences = describe_differences({k: v for k, v in stored.items() if k not in ignore},
                                       {k: v for k, v in fingerprint.items() if k not in ignore})
    if differences:
        raise ResumeMismatch(
            f"{str(path)!r} was started with a different configuration ({'; '.join(differences)}). "
            "Run the original command to resume it, or pass --overwrite to start over."
        )


def describe_differences(stored: dict, current: dict) -> list[str]:
    """Human-readable differences between two fingerprints."""
    differences = []
    for key in sorted(set(stored) | set(current)):
        before, now = stored.get(key), current.get(key)
        if before == now:
            continue
        if key == "images":
            differences.append(
                f"the image set changed: {stored.get('image_count')} images when started, "
                f"{current.get('image_count')} now, or files were replaced"
            )
        elif key != "image_count":
            differences.append(f"{key}: {_short(before)} when started, {_short(now)} now")
    return differences


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _discard_uncommitted(h5file: h5py.File, limit: int) -> None:
    """Cut every row dataset back to its committed length (a kill may have left more); LIMIT bounds the rows
    any run of this file can have written."""
    rows, _, skipped = (int(value) for value in h5file.attrs["committed"])
    for dataset in [*h5file["features"].values(), h5file["labels"], h5file["file_stats"]]:
        dataset.resize(rows, axis=0)
    h5file["skipped/reasons"].resize(skipped, axis=0)
    _clear_strings_beyond(h5file["skipped/reasons"], skipped, limit)
    for group, kept in ((h5file, rows), (h5file["skipped"], skipped)):
        _clear_strings_beyond(group["paths"], kept, limit)
        raw_kept = int(np.count_nonzero(group["raw_paths/rows"][:] < kept))
        group["raw_paths/rows"].resize(raw_kept, axis=0)
        _clear_strings_beyond(group["raw_paths/bytes"], raw_kept, limit)
    h5file.flush()


def _clear_strings_beyond(dataset: h5py.Dataset, keep: int, limit: int) -> None:
    """Resize a variable-length dataset to KEEP rows after zeroing the raw heap references of later rows.

    HDF5 frees the heap object that an overwritten variable-length element points to. After a kill,
    uncommitted elements can point into heap blocks that never reached the disk, and overwriting them
    fails ("bad heap index") on every later run. Their chunks are rewritten raw, never converted.
    """
    chunk_rows = dataset.chunks[0]
    dataset.resize(max(limit, keep, dataset.shape[0]), axis=0)  # chunks a kill left past the extent too
    for start in range(keep - keep % chunk_rows, dataset.shape[0], chunk_rows):
        if dataset.id.get_chunk_info_by_coord((start,)).byte_offset is None:
            continue  # never written
        _, raw = dataset.id.read_direct_chunk((start,))
        kept_bytes = max(keep - start, 0) * (len(raw) // chunk_rows)
        dataset.id.write_direct_chunk((start,), raw[:kept_bytes] + bytes(len(raw) - kept_bytes))
    dataset.resize(keep, axis=0)


def fsync_path(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# -- locking -------------------------------------------------------------------------------------


class OutputLock:
    """An exclusive lock on OUT.lock held for the whole run, so two featdumps never write one output.

    A POSIX record lock (fcntl F_SETLK), not flock: it belongs to this process alone, so loader workers
    forked while it is held do not keep it after this process dies, and a restart can take it at once.
    Threads of one process are kept apart by a set of the outputs this process holds.
    """

    _held: set[str] = set()
    _held_guard = threading.Lock()

    def __init__(self, path: Path | None, descriptor: int | None, hdf5_locking: bool):
        self.path, self._descriptor, self.hdf5_locking = path, descriptor, hdf5_locking

    @classmethod
    def acquire(cls, output: Path, overwrite: bool = False) -> OutputLock:
        """Check OUTPUT can be written and lock it; OutputLocked at once if another run holds it."""
        output = Path(output)
        _refuse_existing(output, overwrite)
        if not output.parent.is_dir():
            raise OutputWriteError(f"Output folder {str(output.parent)!r} does not exist.")
        if os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() == "FALSE":
            log.info("HDF5_USE_FILE_LOCKING=FALSE: %s is not locked against a second writer.", output)
            return cls(None, None, False)
        path = output.with_name(output.name + ".lock")
        with cls._held_guard:
            if str(path.resolve()) in cls._held:
                raise _locked(output, path)
            lock = cls._acquire_file(output, path, overwrite)
            if lock.path is not None:
                cls._held.add(str(path.resolve()))
            return lock

    @classmethod
    def _acquire_file(cls, output: Path, path: Path, overwrite: bool) -> OutputLock:
        while True:
            try:
                descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise _write_error(path, error, None) from error
            try:
                fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                os.close(descriptor)
                if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise _locked(output, path) from error
                log.warning("This filesystem does not support file locking (%s); continuing without a lock.",
                            error.strerror)
                return cls(None, None, False)
            if _same_file(descriptor, path):
                try:
                    _refuse_existing(output, overwrite)  # another run may have finished it meanwhile
                except OutputExists:
                    os.close(descriptor)
                    raise
                return cls(path, descriptor, True)
            os.close(descriptor)  # the lock file was removed by a finishing run: lock the new one

    def release(self) -> None:
        if self._descriptor is None:
            return
        with self._held_guard:
            self._held.discard(str(self.path.resolve()))
            try:
                self.path.unlink(missing_ok=True)
            finally:
                os.close(self._descriptor)  # closing drops the record lock
                self._descriptor = None


def lock_holder(output: Path) -> int | None:
    """The pid holding OUTPUT's lock (a running featdump), or None; asks the kernel (F_GETLK), takes nothing.

    Never opens the lock file in the process that holds it: closing any descriptor of a file drops that
    process's record locks on it.
    """
    path = Path(output).with_name(Path(output).name + ".lock")
    if str(path.resolve()) in OutputLock._held:
        return os.getpid()
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return None  # no lock file: nobody is writing
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        kind, _, _, _, pid = struct.unpack(_FLOCK, fcntl.fcntl(descriptor, fcntl.F_GETLK, query))
    except OSError:
        return None
    finally:
        os.close(descriptor)
    return None if kind == fcntl.F_UNLCK else pid


_FLOCK = "@hhqqi4x"  # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid


def _locked(output: Path, path: Path) -> OutputLocked:
    return OutputLocked(
        f"Another featdump is writing {str(output)!r} (it holds {str(path)!r}); "
        "wait for it to finish or stop it first."
    )


def _refuse_existing(output: Path, overwrite: bool) -> None:
    if output.exists() and not overwrite:
        raise OutputExists(f"Output {str(output)!r} already exists; pass --overwrite to replace it.")


def _same_file(descriptor: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(descriptor), os.stat(path))
    except FileNotFoundError:
        return False
