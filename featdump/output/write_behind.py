"""Write-behind: batches written on a background thread behind a bounded queue, so the forward never waits for
the disk; the thread's errors surface in the loop. On that thread each batch's rows, once on the host, are cast to
the storage dtype (`storage`) and handed to an inspector (the proof) before they are written: what is judged is
what is stored."""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from featdump.errors import RowsUntrusted
from featdump.inputs import ImageList
from featdump.inputs.loader import Batch
from featdump.output.progress import ProgressRecord
from featdump.output.skipped import UNKNOWN_STAT, Skip
from featdump.output.storage import to_storage
from featdump.output.writer import FeatureWriter

Inspector = Callable[[list[int], dict[str, np.ndarray]], None]  # (source positions, stored rows): raises to refuse


def host_copy(features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """FEATURES' copies to host memory, started now without waiting (on CUDA; a CPU tensor is itself)."""
    return {name: tensor.to("cpu", non_blocking=True) for name, tensor in features.items()}


@dataclass
class QueuedBatch:
    """One batch on its way to the writer: its outputs (copying to the host), and the rows' facts."""

    host: dict[str, torch.Tensor]  # layer name: the outputs, on the host once `copied` has happened
    copied: torch.cuda.Event | None  # recorded after the device-to-host copies (CUDA), None on the CPU
    positions: list[int]  # the rows' source positions in the job's image list
    paths: list[str]
    labels: list[int]
    skipped: list[Skip]
    images_done: int  # source images done after this batch (the commit counter)
    file_stats: list[tuple[int, int]]
    coordinates: dict  # what the rows record beside their paths (a clip's start)


def skip_of(images: ImageList, batch: Batch, position: int, reason: str) -> Skip:
    """The record of the input at POSITION of IMAGES, skipped in BATCH for REASON: its file's stat when read, and
    a clip's onset."""
    onset = images.row_coordinates([position]).get("clip_start", [math.nan])[0]
    return Skip(images.paths[position], reason, tuple(batch.file_stats.get(position, UNKNOWN_STAT)),
                None if math.isnan(onset) else float(onset))


class WriteBehind:
    """Writes batches on a background thread behind a bounded queue; its errors surface in the loop."""

    def __init__(self, writer: FeatureWriter, record: ProgressRecord | None = None, record_offset: int = 0,
                 depth: int = 3, inspect: Inspector | None = None):
        self._writer = writer
        self._inspect = inspect
        self._record = record
        self._record_offset = record_offset  # images the job's output held before this list (an update's)
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self.seconds = 0.0  # time spent writing
        self._thread = threading.Thread(target=self._work, name="featdump-writer", daemon=True)

    def __enter__(self) -> WriteBehind:
        self._thread.start()
        return self

    def put(self, features: dict, batch: Batch, images: ImageList, device: torch.device) -> None:
        """Queue one batch: its outputs start copying to host memory now, without waiting."""
        host = host_copy(features)
        copied = None
        if device.type == "cuda":
            copied = torch.cuda.Event()
            copied.record()
        item = QueuedBatch(host, copied, list(batch.positions), [images.paths[p] for p in batch.positions],
                           [images.labels[p] for p in batch.positions],
                           [skip_of(images, batch, position, reason) for position, reason in batch.failures],
                           batch.end,
                           [batch.file_stats.get(p, (-1, -1)) for p in batch.positions],
                           images.row_coordinates(batch.positions))
        while True:
            self._raise_if_failed()
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __exit__(self, exc_type, exc, traceback) -> None:
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=0.1)
                break
            except queue.Full:
                continue
        self._thread.join()
        if exc_type is None:
            self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is not None:
                continue  # drain: the main thread raises the error at its next put
            started = time.perf_counter()
            try:
                if item.copied is not None:
                    item.copied.synchronize()
                arrays = to_storage(item.host, self._writer.dtypes)
                if self._inspect is not None:
                    self._inspect(item.positions, arrays)
                self._writer.append(arrays, item.paths, item.labels, item.skipped, item.images_done, item.file_stats,
                                    item.coordinates)
                if self._record is not None:
                    committed = self._writer.committed
                    self._record.update(self._record_offset + item.images_done, committed.rows, committed.skipped)
            except RowsUntrusted as error:  # its way out depends on what is committed
                self._error = error.explain(self._writer.committed_rows, str(self._writer.path))
            except BaseException as error:  # handed to the main thread, which raises it
                self._error = error
            self.seconds += time.perf_counter() - started
