"""Lock: OUT.lock, held by the one process writing OUT (taken and released by the runner and by merge); and the
waiting lock of a job's shared PCA fit."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import threading
from contextlib import contextmanager
from pathlib import Path

from featdump.errors import OutputExists, OutputLocked, OutputWriteError, UsageProblem

log = logging.getLogger("featdump")


def check_folder(output: Path) -> None:
    """UsageProblem when the folder OUTPUT is to be written in does not exist."""
    if not output.parent.is_dir():
        raise UsageProblem(f"Output folder {str(output.parent)!r} does not exist; create it first.")


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
        refuse_existing(output, overwrite)
        check_folder(output)
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
                raise OutputWriteError(f"Could not write {str(path)!r}: {error}.") from error
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
                    refuse_existing(output, overwrite)  # another run may have finished it meanwhile
                except OutputExists:
                    os.close(descriptor)
                    raise
                return cls(path, descriptor, True)
            os.close(descriptor)  # the lock file was removed by a finishing run: lock the new one

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

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


def refuse_existing(output: Path, overwrite: bool) -> None:
    """OutputExists unless OUTPUT is free to write (or OVERWRITE)."""
    if output.exists() and not overwrite:
        raise OutputExists(f"Output {str(output)!r} already exists; pass --overwrite to replace it.")


def _same_file(descriptor: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(descriptor), os.stat(path))
    except FileNotFoundError:
        return False


@contextmanager
def waiting_lock(path: Path, what: str):
    """An exclusive record lock on PATH, waiting for another process that holds it (the PCA fit that the shards
    of a job share: the first computes it, the others wait, then read it). The lock file stays."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise OutputWriteError(f"Could not write {str(path)!r}: {error}.") from error
    try:
        _lock_waiting(descriptor, path, what)
        yield
    finally:
        os.close(descriptor)  # closing drops the record lock


def _lock_waiting(descriptor: int, path: Path, what: str) -> None:
    try:
        fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            log.warning("This filesystem does not support file locking (%s); %s is not shared safely.",
                        error.strerror, what)
            return
        log.info("Waiting for another process to finish %s (it holds %s).", what, path)
        fcntl.lockf(descriptor, fcntl.LOCK_EX)
