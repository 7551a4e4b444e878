"""Loader: the dataset of a job's images, its batches in source order, and the workers that decode them."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing
import multiprocessing.util  # registers its exit handler first, so ours (below) runs before it
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from featdump.errors import FeatdumpError, ReaderFailed
from featdump.inputs import Encoded, ImageList
from featdump.inputs.decode import JPEG_EXTENSIONS, describe_failure, open_rgb, plain_jpeg
from featdump.inputs.imagelist import UNKNOWN_STAT, stat_as_read
from featdump.inputs.preprocess import Preprocess


@dataclass
class Batch:
    """Images of consecutive source positions: decoded, still encoded (for the GPU), or failed."""

    positions: list[int]  # source positions of the decoded images, rows of `pixels`
    pixels: torch.Tensor | None  # (n, C, H, W), uint8 when the preprocessing is split
    failures: list[tuple[int, str]]  # (source position, reason) of images that could not be used
    end: int  # one past the last source position of this batch
    jpeg_bytes: torch.Tensor | None = None  # the JPEGs left to the GPU, end to end: one shared-memory tensor
    jpeg_index: list[tuple[int, int, int]] = field(default_factory=list)  # (position, start, stop) in jpeg_bytes
    file_stats: dict[int, tuple[int, int]] = field(default_factory=dict)  # position: (size, mtime_ns) when read
    mixed_sizes: dict[int, tuple[int, ...]] = field(default_factory=dict)  # position: shape, when they differ
    fatal: Exception | None = None  # why this batch's images could not be fetched at all (the store is away)

    @property
    def encoded(self) -> list[tuple[int, torch.Tensor]]:
        """(position, that JPEG's bytes: a view into jpeg_bytes)."""
        return [(position, self.jpeg_bytes[start:stop]) for position, start, stop in self.jpeg_index]

    @property
    def size(self) -> int:
        """How many source images this batch covers."""
        return len(self.positions) + len(self.failures) + len(self.jpeg_index)

    def pin_memory(self) -> Batch:
        """Called by the DataLoader's pinning thread, so the copy to the GPU can be asynchronous."""
        if self.pixels is not None:
            self.pixels = self.pixels.pin_memory()
        return self


@dataclass
class Item:
    """One source image as a worker hands it over: decoded pixels, its JPEG bytes left to the GPU, or why it
    could not be used; numpy arrays, never many small tensors."""

    position: int  # in the job's image list
    file_stat: tuple[int, int] = UNKNOWN_STAT  # the file's (size, mtime_ns) when it was read (`stat_as_read`)
    pixels: np.ndarray | None = None
    jpeg: np.ndarray | None = None
    failure: str | None = None
    fatal: Exception | None = None  # the store stayed away: the job stops

    @property
    def kind(self) -> str:
        return "pixels" if self.pixels is not None else "jpeg" if self.jpeg is not None else "failed"


class ImageDataset(Dataset):
    """Item i of the image list: decoded by the preprocessing's pixels(), or (GPU_JPEGS) a plain JPEG's bytes."""

    def __init__(self, images: ImageList, preprocess: Preprocess, gpu_jpegs: bool = False):
        self.images = images
        self.preprocess = preprocess
        self.gpu_jpegs = gpu_jpegs and preprocess.split

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, position: int) -> Item:
        return self.__getitems__([position])[0]

    def __getitems__(self, positions: list[int]) -> list[Item]:
        """The items of a batch: their bytes requested together (concurrently where they live in a store), each
        decoded as it arrives. A store that stays away (or refuses) fails the batch: its items carry the error,
        not a skip."""
        items: list[Item | None] = [None] * len(positions)
        try:
            for index, encoded in self.images.open_as_ready(positions):  # each decoded as soon as it is here
                items[index] = self._decoded(positions[index], encoded)
        except FeatdumpError as error:
            return [Item(position, fatal=error) for position in positions]
        except Exception as error:  # noqa: BLE001 - a reader's own failure: one line for the user, not a traceback
            return [Item(position, fatal=reader_failed(self.images, positions, error)) for position in positions]
        return items

    def _decoded(self, position: int, encoded: Encoded | Exception) -> Item:
        item = Item(position, file_stat=stat_as_read(encoded))
        try:
            if isinstance(encoded, Exception):
                raise encoded
            if self.gpu_jpegs and encoded.suffix in JPEG_EXTENSIONS and plain_jpeg(encoded.source,
                                                                                    self.preprocess.draft):
                item.jpeg = encoded.array()
            else:
                item.pixels = self.preprocess.pixels(open_rgb(encoded.source, self.preprocess.draft))
        except Exception as error:  # any decoding failure is recorded, not raised
            item.failure = describe_failure(error)
        return item


def reader_failed(images: ImageList, positions: list[int], error: Exception) -> ReaderFailed:
    """ERROR, raised by IMAGES' storage reading the batch at POSITIONS, as one line naming the reader (its storage's
    class) and the input."""
    storage = type(images.storage)
    message = " ".join(str(error).split())  # one line, whatever the reader's message holds
    return ReaderFailed(f"The reader of {images.root} ({storage.__module__}.{storage.__qualname__}) failed on "
                        f"{images.row_key(positions[0])!r} (a batch of {len(positions)}): {type(error).__name__}: "
                        f"{message or 'no message'}. Check that input, or the package that reads it.")


def collate(items: list[Item]) -> Batch:
    """Stack the decoded images into one tensor (one shared-memory handle per batch, not per image). Images the
    preprocessing made in different sizes cannot be stacked: the batch then holds their shapes (`mixed_sizes`),
    for the main process to report; no exception crosses from a worker."""
    fatal = next((item.fatal for item in items if item.fatal is not None), None)
    if fatal is not None:
        return Batch(positions=[], pixels=None, failures=[], end=items[-1].position + 1, fatal=fatal)
    decoded = [item for item in items if item.pixels is not None]
    if len({item.pixels.shape for item in decoded}) > 1:
        return Batch(positions=[], pixels=None, failures=[], end=items[-1].position + 1,
                     mixed_sizes={item.position: tuple(item.pixels.shape) for item in decoded})
    jpegs = [item for item in items if item.jpeg is not None]
    ends = np.cumsum([len(item.jpeg) for item in jpegs]).tolist()
    return Batch(
        positions=[item.position for item in decoded],
        pixels=torch.from_numpy(np.stack([item.pixels for item in decoded])) if decoded else None,
        failures=[(item.position, item.failure) for item in items if item.failure is not None],
        end=items[-1].position + 1,
        jpeg_bytes=torch.from_numpy(np.concatenate([item.jpeg for item in jpegs])) if jpegs else None,
        jpeg_index=[(item.position, end - len(item.jpeg), end) for item, end in zip(jpegs, ends)],
        file_stats={item.position: item.file_stat for item in items},
    )


class _Batches:
    """Consecutive batches of source positions from START to N."""

    def __init__(self, start: int, count: int, batch_size: int):
        self.start, self.count, self.batch_size = start, count, batch_size

    def __iter__(self):
        for first in range(self.start, self.count, self.batch_size):
            yield list(range(first, min(first + self.batch_size, self.count)))

    def __len__(self) -> int:
        return max(0, -(-(self.count - self.start) // self.batch_size))


class _WorkerStart:
    """Run first in every loader worker: the worker belongs to the main process and holds none of its files.

    Workers are forked while the main process holds the output's lock and its open HDF5 file. A worker
    closes its copies of those descriptors (the HDF5 library's own lock on OUT.partial would otherwise
    outlive a killed main process), is killed by the kernel the moment the main process dies, and
    leaves SIGINT/SIGTERM to the main process, which stops it after committing.
    """

    def __init__(self, main_pid: int, owned_files: tuple[str, ...]):
        self.main_pid, self.owned_files = main_pid, owned_files

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _die_with_parent()
        if os.getppid() != self.main_pid:  # the main process died before the line above
            os._exit(1)
        close_descriptors_of(self.owned_files)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (prctl PR_SET_PDEATHSIG); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def close_descriptors_of(paths: tuple[str, ...]) -> list[int]:
    """Close every descriptor of this process open on one of PATHS (absolute); returns the ones closed."""
    wanted = set(paths)
    closed = []
    try:
        descriptors = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: nothing to look through
        return closed
    for descriptor in descriptors:
        try:
            target = os.readlink(f"/proc/self/fd/{descriptor}")
        except OSError:
            continue
        if target in wanted or target.removesuffix(" (deleted)") in wanted:
            with contextlib.suppress(OSError):
                os.close(descriptor)
                closed.append(descriptor)
    return closed


@contextlib.contextmanager
def batches_of(loader: DataLoader) -> Iterator[Iterator[Batch]]:
    """LOADER's batches. Leaving the block (at the end, on an error, on a stop) ends its worker processes within
    seconds: a worker left to the interpreter's exit would hold it forever (workers ignore SIGTERM)."""
    iterator = iter(loader)
    try:
        yield iterator
    finally:
        end_workers(iterator)


def end_workers(iterator) -> None:
    """Shut the workers of a DataLoader ITERATOR down as the DataLoader does, then SIGKILL any still alive."""
    workers = list(getattr(iterator, "_workers", ()))
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    _kill(workers)


def _kill(processes) -> None:
    for process in processes:
        if process.is_alive():
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGKILL)
            process.join(timeout=5)


@atexit.register
def _end_children_at_exit() -> None:
    """The last resort: no worker process outlives this one (multiprocessing's own exit handler, which runs
    after this one, would SIGTERM them and wait forever)."""
    _kill(multiprocessing.active_children())


def make_loader(
    dataset: Dataset, start: int, batch_size: int, num_workers: int, pin_memory: bool = False,
    owned_files: tuple[Path, ...] = (),
) -> DataLoader:
    """A DataLoader yielding Batches in source order from position START.

    Workers are forked (not spawned: no copy of the image list per worker, no second import of torch)
    and close their inherited descriptors of OWNED_FILES (the output and its lock) first thing.
    """
    if num_workers == 0:
        return DataLoader(dataset, batch_sampler=_Batches(start, len(dataset), batch_size), num_workers=0,
                          collate_fn=collate, pin_memory=pin_memory)
    owned = tuple(os.path.realpath(path) for path in owned_files)
    return DataLoader(
        dataset,
        batch_sampler=_Batches(start, len(dataset), batch_size),
        num_workers=num_workers,
        collate_fn=collate,
        pin_memory=pin_memory,
        worker_init_fn=_WorkerStart(os.getpid(), owned),
        multiprocessing_context="fork" if "fork" in multiprocessing.get_all_start_methods() else None,
        prefetch_factor=4,
    )
