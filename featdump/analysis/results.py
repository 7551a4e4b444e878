"""Results: the file an analysis writes (RDMS.h5, CKA.h5, PROBES.h5, ENC.h5), as OUT.partial until it is complete,
one entry at a time (a layer's RDM, a layer's Gram, a layer's read-out), so that a killed analysis resumes at the
first entry not written.

    attributes   what made it (`made_from`: the source files, their rows, the settings), `complete`, `command`
    /paths, /labels   the rows the entries are over (labels with the attribute `classes`)
    /GROUP/NAME       an entry: written under /writing, then moved into place (a kill mid-write leaves none)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import h5py
import numpy as np

from featdump.errors import OutputExists, ResumeMismatch
from featdump.output.layout import STRING, open_to_read, partial_path, text_array
from featdump.output.lock import OutputLock
from featdump.output.repair import cover_allocations
from featdump.output.writer import close_quietly, publish, write_error

_WRITING = "writing"
T = TypeVar("T")


class Results:
    """OUT.partial of an analysis, held (locked) from `open` to `finish` or `close`."""

    def __init__(self, output: Path, h5file: h5py.File, lock: OutputLock):
        self.output, self.file, self._lock = output, h5file, lock

    @classmethod
    def open(cls, output: Path, made_from: dict, paths: list[str], labels: np.ndarray, classes: list[str],
             overwrite: bool = False) -> Results:
        """Lock OUTPUT and create OUTPUT.partial, or reopen the one a killed run left (MADE_FROM equal: its entries
        are kept); ResumeMismatch naming what differs otherwise, OutputExists if OUTPUT is there."""
        output = Path(output)
        lock = OutputLock.acquire(output, overwrite)
        partial = partial_path(output)
        try:
            h5file = _reopen(partial, made_from) if partial.exists() and not overwrite else None
            if h5file is None:
                h5file = _create(partial, made_from, paths, labels, classes)
        except BaseException:
            lock.release()
            raise
        return cls(output, h5file, lock)

    def has(self, group: str, name: str) -> bool:
        """Whether GROUP/NAME (NAME at the top when GROUP is "") is written."""
        if group and group not in self.file:
            return False
        return name in (self.file[group] if group else self.file)

    def discard(self) -> None:
        """Close and delete OUT.partial (a scratch file whose use is over)."""
        self.close()
        partial_path(self.output).unlink(missing_ok=True)

    def read(self, group: str, name: str) -> np.ndarray:
        return self.file[group][name][:]

    def commit(self, group: str, name: str, values: np.ndarray | dict[str, np.ndarray],
               attributes: dict | None = None) -> None:
        """GROUP/NAME written whole and flushed, or not there at all: a dataset of VALUES, or a group of datasets
        when VALUES is a dict (an entry of several arrays, as a layer's read-out)."""
        try:
            writing = self.file.require_group(_WRITING)
            if isinstance(values, dict):
                entry = writing.create_group(name)
                for key, array in values.items():
                    entry.create_dataset(key, data=array)
            else:
                entry = writing.create_dataset(name, data=values)
            for key, value in (attributes or {}).items():
                entry.attrs[key] = text_array(value) if isinstance(value, list) else value
            self.file.flush()
            if group:
                self.file.require_group(group)
            self.file.move(f"{_WRITING}/{name}", f"{group}/{name}" if group else name)
            del self.file[_WRITING]
            self.file.flush()
        except OSError as error:
            raise write_error(self.output, error, None) from error

    def remove(self, group: str) -> None:
        if group in self.file:
            del self.file[group]

    def finish(self, attributes: dict | None = None) -> Path:
        """Mark complete, make durable, rename OUT.partial to OUT, release the lock."""
        partial = partial_path(self.output)
        try:
            for key, value in (attributes or {}).items():
                self.file.attrs[key] = text_array(value) if isinstance(value, list) else value
            self.file.attrs["complete"] = True
            self.file.close()
            publish(partial, self.output)
        except OSError as error:
            raise write_error(partial, error, None) from error
        finally:
            self._lock.release()
        return self.output

    def close(self) -> None:
        """Stop without finishing: OUT.partial stays, its entries kept for the next run."""
        close_quietly(self.file)
        self._lock.release()


def annex(output: Path, group: str, arrays: dict[str, np.ndarray]) -> None:
    """GROUP of the finished result OUTPUT replaced by ARRAYS (a summary of its entries: an encoding's regions),
    under OUTPUT's lock, written under /writing and then moved into place (a kill leaves the old one or none)."""
    lock = OutputLock.acquire(output, overwrite=True)
    try:
        with h5py.File(output, "a") as h5file:
            if _WRITING in h5file:
                del h5file[_WRITING]
            writing = h5file.create_group(_WRITING)
            for key, array in arrays.items():
                writing.create_dataset(key, data=array)
            h5file.flush()
            if group in h5file:
                del h5file[group]
            h5file.move(_WRITING, group)
    except OSError as error:
        raise write_error(output, error, None) from error
    finally:
        lock.release()


def computed_into(results: Results | None, progress, compute: Callable[[], T], attributes: dict) -> T:
    """COMPUTE()'s value, RESULTS (when writing one) finished with ATTRIBUTES after it; if it raises, RESULTS is
    closed unfinished (resumable) instead. PROGRESS is closed either way."""
    try:
        value = compute()
        if results is not None:
            results.finish(attributes)
            results = None
        return value
    finally:
        progress.close()
        if results is not None:
            results.close()


def made_from_of(output: Path) -> dict | None:
    """What the finished result OUTPUT was made from; None when there is none; OutputExists when OUTPUT is some
    other file."""
    output = Path(output)
    if not output.exists():
        return None
    try:
        with open_to_read(output) as h5file:
            before = json.loads(h5file.attrs.get("made_from", "{}")) if h5file.attrs.get("complete", False) else None
    except (OSError, ValueError):
        before = None
    if before is None:
        raise OutputExists(f"Output {str(output)!r} already exists and is not a finished result of featdump rdm, "
                           "cka, probe, encode or top; pass --overwrite to replace it.")
    return before


def finished(output: Path, made_from: dict) -> bool:
    """Whether OUTPUT is a finished result made from MADE_FROM (the same command again: nothing to do); False when
    there is none; OutputExists naming what differs when it is another's."""
    before = made_from_of(output)
    if before is None:
        return False
    if before != made_from:
        changed = sorted(key for key in set(before) | set(made_from) if before.get(key) != made_from.get(key))
        raise OutputExists(f"Output {str(output)!r} already exists, made from other files or settings "
                           f"({', '.join(changed)} differ); pass --overwrite to replace it.")
    return True


def _create(partial: Path, made_from: dict, paths: list[str], labels: np.ndarray, classes: list[str]) -> h5py.File:
    try:
        h5file = h5py.File(partial, "w")
        h5file.attrs["made_from"] = json.dumps(made_from, sort_keys=True)
        h5file.attrs["complete"] = False
        h5file.create_dataset("paths", data=np.array(paths, dtype=object), dtype=STRING)
        h5file.create_dataset("labels", data=np.asarray(labels, dtype=np.int64))
        h5file["labels"].attrs["classes"] = text_array(classes)
        h5file.flush()
    except OSError as error:
        raise write_error(partial, error, None) from error
    return h5file


def _reopen(partial: Path, made_from: dict) -> h5py.File | None:
    try:
        h5file = h5py.File(partial, "r+")
    except OSError:
        return None  # unreadable (killed while it was being created): started anew
    before = json.loads(h5file.attrs.get("made_from", "{}"))
    if before != made_from:
        h5file.close()
        changed = sorted(key for key in set(before) | set(made_from) if before.get(key) != made_from.get(key))
        raise ResumeMismatch(f"{str(partial)!r} was started from other files or settings ({', '.join(changed)} "
                             "differ); run the original command to resume it, or pass --overwrite to start over.")
    cover_allocations(h5file, [])  # an entry a kill left past the recorded end is freed below
    if _WRITING in h5file:
        del h5file[_WRITING]
    return h5file
