"""Extraction: the loop that connects model, hooks, data and writer, batch by batch."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import queue
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import h5py
import torch
import torchvision

from featdump import __version__
from featdump.data import (
    Batch,
    ImageDataset,
    ImageList,
    Preprocess,
    choose_workers,
    find_images,
    make_loader,
    to_device_inputs,
)
from featdump.errors import BadImage, Interrupted, NotEnoughSpace, UsageProblem
from featdump.hooks import Capture
from featdump.layers import Layer, probe, resolve
from featdump.models import check_model_name, load_model
from featdump.progress import ProgressRecord
from featdump.reductions import reduced_shape, snapshot
from featdump.settings import Settings
from featdump.shards import Shard, choose_shard
from featdump.update import plan_update
from featdump.writer import DatasetSpec, FeatureWriter, OutputLock

log = logging.getLogger("featdump")


class Progress(Protocol):
    """What the loop reports to: the CLI's tqdm bar or log lines."""

    def start(self, total: int, done: int) -> None: ...

    def advance(self, images: int) -> None: ...

    def close(self) -> None: ...


class _NoProgress:
    def start(self, total: int, done: int) -> None:
        pass

    def advance(self, images: int) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class Summary:
    """What a finished run wrote."""

    output: Path
    rows: int  # images written (all runs of this output)
    skipped: int  # images skipped (all runs of this output)
    processed: int  # images this run went through
    resumed_from: int  # source position this run started at
    seconds: float
    size_bytes: int
    stale: int = 0  # rows whose image disappeared or changed (--update)

    @classmethod
    def of_finished(cls, output: Path, seconds: float) -> Summary:
        """A finished output this run found done (a shard of a re-submitted array)."""
        with h5py.File(output, "r") as h5file:
            rows, _, skipped = (int(value) for value in h5file.attrs["committed"])
        return cls(output, rows, skipped, 0, 0, seconds, output.stat().st_size)

    def line(self) -> str:
        if self.processed == 0:
            return (f"Nothing new: {self.output} already holds {self.rows} images ({self.skipped} skipped)"
                    f"{self._stale_note()}.")
        rate = self.processed / self.seconds if self.seconds > 0 else 0.0
        resumed = f", resumed at image {self.resumed_from}" if self.resumed_from else ""
        return (
            f"Wrote {self.rows} images ({self.skipped} skipped) to {self.output} in {self.seconds:.1f} s "
            f"({rate:.1f} img/s{resumed}), {_human_bytes(self.size_bytes)}{self._stale_note()}."
        )

    def _stale_note(self) -> str:
        if not self.stale:
            return ""
        return f"; {self.stale} rows are stale (image gone or changed since; listed by featdump info)"


def extract(settings: Settings, progress: Progress | None = None) -> Summary:
    """Run SETTINGS: every image through the model, the selected layers into the HDF5 output.

    Under --shard (or a SLURM array / torchrun) only this process's part of the images, into its shard
    file; under torchrun rank 0 then merges the shards once every rank is done.
    """
    progress = progress or _NoProgress()
    started = time.perf_counter()
    check_model_name(settings.model)
    images = find_images(settings.images)
    shard = choose_shard(settings.shard)
    extra_fingerprint, whole_output = {}, settings.output
    if shard is not None:
        if settings.update:
            raise UsageProblem("--update works on one run's output, not on shards: new images would move the "
                               "shard boundaries. Run the sharded job again over the whole folder instead.")
        settings, images, extra_fingerprint = _as_shard(settings, images, shard)
        if settings.output.exists() and not settings.overwrite:
            log.info("Shard %d of %d is already finished: %s.", shard.index, shard.count, settings.output)
            summary = Summary.of_finished(settings.output, time.perf_counter() - started)
            _merge_when_all_ranks_done(whole_output, settings, shard)
            return summary
    lock = OutputLock.acquire(settings.output, settings.overwrite or settings.update)
    try:
        summary = _extract_locked(settings, images, lock, progress, started, extra_fingerprint)
    finally:
        lock.release()
    if shard is not None:
        _merge_when_all_ranks_done(whole_output, settings, shard)
    return summary


def _as_shard(settings: Settings, images: ImageList, shard: Shard):
    """This shard's settings (its own output, its GPU under torchrun), its images, and what its file records."""
    start, stop = shard.bounds(len(images))
    output = shard.path(settings.output, settings.shard_pattern)
    log.info("Shard %d of %d (from %s): images %d to %d of %d, into %s.", shard.index, shard.count, shard.source,
             start, stop - 1, len(images), output)
    changes = {"output": output}
    if shard.local_rank is not None and settings.device in ("auto", "cuda") and torch.cuda.is_available():
        changes["device"] = f"cuda:{shard.local_rank}"
    extra = {"shard": [shard.index, shard.count], "all_images": images.digest(sizes=False),
             "all_image_count": len(images)}
    return dataclasses.replace(settings, **changes), images.part(start, stop), extra


def _merge_when_all_ranks_done(output: Path, settings: Settings, shard: Shard) -> None:
    """Under torchrun: wait for every rank (a barrier with a timeout), then rank 0 merges the shards into OUTPUT."""
    if shard.local_rank is None:
        return
    from featdump.merge import merge, wait_for_all_ranks

    wait_for_all_ranks(settings.merge_timeout)
    if shard.index == 0:
        merge(output, settings.shard_pattern, overwrite=settings.overwrite or settings.update)
        log.info("Merged %d shards into %s.", shard.count, output)


def _extract_locked(settings: Settings, images: ImageList, lock: OutputLock, progress: Progress,
                    started: float, extra_fingerprint: dict) -> Summary:
    device = resolve_device(settings.device)
    loaded, preprocess, layers = _prepare_model(settings, device)
    specs = {layer.name: DatasetSpec(reduced_shape(settings.reduce, layer.shape, layer.name), settings.dtype,
                                     layer.layout) for layer in layers}
    for layer in layers:
        if layer.layout:
            log.info("Layer %s holds the batch in dimension %d: stored batch-first, %s.", layer.name,
                     layer.batch_dim, layer.layout)
    fingerprint = {**_fingerprint(settings, images, preprocess, device), "model_source": loaded.source,
                   "layers": [layer.name for layer in layers],  # patterns expanded
                   "layouts": {layer.name: layer.layout for layer in layers if layer.layout}, **extra_fingerprint}
    stale: list[tuple[str, str]] = []
    if settings.update and settings.output.exists() and not settings.overwrite:
        writer = FeatureWriter.open_finished(settings.output, fingerprint, lock)
        images, stale = plan_update(writer, images)
        _report_size(settings, specs, len(images))
        writer.begin_update({**fingerprint, "image_count": writer.committed_images + len(images)},
                            list(images.classes), stale)
        base = writer.committed_images
        log.info("Updating %s: %d new images, %d rows already there%s.", settings.output, len(images),
                 writer.committed_rows, f", {len(stale)} of them stale (see featdump info)" if stale else "")
    else:
        _report_size(settings, specs, len(images))
        writer = FeatureWriter.open(
            settings.output, specs, fingerprint, _attributes(settings, loaded, layers, images.root),
            list(images.classes), settings.batch_size, settings.compression, settings.overwrite, lock,
        )
        base = 0
    start = writer.committed_images - base
    if start:
        log.info("Resuming at image %d of %d (%d rows committed).", start, len(images), writer.committed_rows)
    record = ProgressRecord(settings.output, writer.path, base + len(images), writer.committed_images,
                            {name: list(spec.shape) for name, spec in specs.items()})
    try:
        example = torch.randn((2, 3, *preprocess.size), generator=torch.Generator().manual_seed(0)).to(device)
        capture = Capture(loaded.module, layers, snapshot(settings.reduce, settings.dtype), prune=True,
                          example=example)
        with _StopSignals() as stop, capture:
            progress.start(len(images), start)
            _run_batches(settings, images, preprocess, capture, device, writer, progress, stop, start, base,
                         record, owned_files=(writer.path, *([lock.path] if lock.path else [])))
        if stop.signal_number is not None:
            raise Interrupted(
                f"Stopped by {signal.Signals(stop.signal_number).name} after {writer.committed_images - base} of "
                f"{len(images)} images; run the same command again to resume.",
                stop.signal_number,
            )
        rows, skipped = writer.committed_rows, writer.committed_skipped
        output = writer.finish(fingerprint["images"])  # the whole image set's (an update's records it)
    finally:
        record.remove()  # only a kill leaves it, for info to report the job as stopped
        progress.close()
        writer.close()
    return Summary(output, rows, skipped, len(images) - start, start, time.perf_counter() - started,
                   output.stat().st_size, stale=len(stale))


def _prepare_model(settings: Settings, device: torch.device):
    """The loaded model on DEVICE, its split preprocessing, and the validated layers."""
    loaded = load_model(settings.model, settings.weights, settings.seed, settings.transform, settings.trust_pickle)
    loaded.module = loaded.module.to(device)
    if device.type == "cuda":
        loaded.module = loaded.module.to(memory_format=torch.channels_last)
        # fp32 means fp32: TF32 convolutions/matmuls would drift from the CPU reference.
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = settings.precision != "fp32"
    preprocess = Preprocess(loaded.preprocessing, settings.fast_decode)
    if settings.fast_decode and preprocess.draft is None:
        log.warning("--fast-decode needs a resize in the preprocessing; decoding every image whole.")
    layers = resolve(list(settings.layers), probe(loaded.module, (3, *preprocess.size)), settings.model)
    return loaded, preprocess, layers


def _run_batches(settings, images, preprocess, capture, device, writer, progress, stop, start, base, record,
                 owned_files) -> None:
    dataset = ImageDataset(images, preprocess, gpu_jpegs=resolve_decode(settings.decode, device, preprocess) == "gpu")
    loader = make_loader(dataset, start, settings.batch_size, choose_workers(settings.num_workers),
                         pin_memory=device.type == "cuda", owned_files=owned_files)
    waiting = computing = 0.0
    # Autocast is entered once for the loop (leaving it clears its cache of cast weights); the inputs are made
    # outside it, in a nested disabled region (which leaves the cache alone).
    with WriteBehind(writer, base, record) as sink, _autocast(settings.precision, device):
        tick = time.perf_counter()
        # A plain for loop: on an error the iterator goes with the frame's stack and shuts its workers down.
        for batch in loader:
            tock = time.perf_counter()
            with torch.autocast(device.type, enabled=False):
                inputs = to_device_inputs(batch, preprocess, images, device)
            _check_failures(batch, images, settings.on_error)
            features = {}
            if inputs is not None:
                count = inputs.shape[0]
                if device.type == "cuda":  # one shape for cudnn.benchmark: the last batch and gappy ones padded
                    inputs = padded(inputs, settings.batch_size).contiguous(memory_format=torch.channels_last)
                features = {name: values[:count] for name, values in capture.run(inputs).items()}
            sink.put(features, batch, images, device)
            waiting, computing = waiting + tock - tick, computing + time.perf_counter() - tock
            progress.advance(batch.size)
            if stop.signal_number is not None:
                break
            tick = time.perf_counter()
    log.debug("Stage times: waiting for decoded images %.2f s, forward and copies %.2f s, "
              "writing %.2f s on a background thread (%s capture).", waiting, computing, sink.seconds,
              capture.strategy)


def padded(inputs: torch.Tensor, size: int) -> torch.Tensor:
    """INPUTS with zero images appended up to SIZE rows (eval-mode layers compute each image on its own)."""
    missing = size - inputs.shape[0]
    if missing <= 0:
        return inputs
    return torch.cat([inputs, inputs.new_zeros((missing, *inputs.shape[1:]))])


def _check_failures(batch: Batch, images: ImageList, on_error: str) -> None:
    for position, reason in batch.failures:
        if on_error == "fail":
            raise BadImage(
                f"Cannot use image {images.paths[position]!r}: {reason}. Fix or remove it, "
                "or pass --on-error skip to record it and go on."
            )
        log.debug("Skipping %s: %s", images.paths[position], reason)


class WriteBehind:
    """Writes batches on a background thread behind a bounded queue; its errors surface in the loop."""

    def __init__(self, writer: FeatureWriter, base: int = 0, record: ProgressRecord | None = None, depth: int = 3):
        self._writer = writer
        self._record = record
        self._base = base  # images the file held before this run's list (an update's)
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self.seconds = 0.0  # time spent writing
        self._thread = threading.Thread(target=self._work, name="featdump-writer", daemon=True)

    def __enter__(self) -> WriteBehind:
        self._thread.start()
        return self

    def put(self, features: dict, batch: Batch, images: ImageList, device: torch.device) -> None:
        """Queue one batch: its outputs start copying to host memory now, without waiting."""
        host = {name: tensor.to("cpu", non_blocking=True) for name, tensor in features.items()}
        copied = None
        if device.type == "cuda":
            copied = torch.cuda.Event()
            copied.record()
        item = (host, copied, [images.paths[p] for p in batch.positions],
                [images.labels[p] for p in batch.positions],
                [(images.paths[p], reason) for p, reason in batch.failures], self._base + batch.end,
                [batch.file_stats.get(p, (-1, -1)) for p in batch.positions])
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
            host, copied, paths, labels, skipped, images_done, file_stats = item
            started = time.perf_counter()
            try:
                if copied is not None:
                    copied.synchronize()
                arrays = {name: tensor.numpy() for name, tensor in host.items()}
                self._writer.append(arrays, paths, labels, skipped, images_done, file_stats)
                if self._record is not None:
                    self._record.update(images_done, self._writer.committed_rows, self._writer.committed_skipped)
            except BaseException as error:  # handed to the main thread, which raises it
                self._error = error
            self.seconds += time.perf_counter() - started


class _StopSignals:
    """SIGINT/SIGTERM ask the loop to stop after the batch in flight; a second SIGINT exits at once."""

    def __init__(self):
        self.signal_number: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _handle(self, number, frame) -> None:
        if self.signal_number is not None:
            if number == signal.SIGINT:
                sys.stderr.write("featdump: second interrupt, exiting now; committed rows are kept.\n")
                os._exit(130)
            return
        self.signal_number = number
        log.warning("%s received: committing the batch in flight, then stopping (Ctrl-C again to stop now).",
                    signal.Signals(number).name)


def resolve_device(name: str) -> torch.device:
    """auto → cuda when available, else cpu; a clear error for a CUDA device that is not there."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise UsageProblem(f"Unknown device {name!r}: use auto, cpu, cuda or cuda:N.") from error
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageProblem(f"Device {name!r} asked for, but CUDA is not available here; use --device cpu.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageProblem(f"Device {name!r} does not exist: this machine has {torch.cuda.device_count()} GPU(s).")
        # cuda:N is the current device: events, streams and the loader's pinning thread all use it.
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    elif device.type != "cpu":
        raise UsageProblem(f"Unsupported device {name!r}: use auto, cpu, cuda or cuda:N.")
    return device


def resolve_decode(decode: str, device: torch.device, preprocess: Preprocess) -> str:
    """cpu or gpu: auto means cpu for now (gpu decoding is asked for by name)."""
    if decode == "gpu" and device.type != "cuda":
        raise UsageProblem("--decode gpu needs a CUDA device; use --decode cpu (or auto).")
    if decode == "gpu" and not preprocess.split:
        raise UsageProblem("--decode gpu needs torchvision's ImageClassification preprocessing; use --decode cpu.")
    if decode == "auto":  # the CPU decoder until the GPU path (nvJPEG behind its barrier) is measured on a GPU
        return "cpu"
    return decode


def _autocast(precision: str, device: torch.device):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def _fingerprint(settings: Settings, images: ImageList, preprocess: Preprocess, device: torch.device) -> dict:
    return {**settings.fingerprint(), "preprocessing": repr(preprocess.transforms),
            "decode": resolve_decode(settings.decode, device, preprocess),
            "images": images.digest(), "image_count": len(images)}


def _attributes(settings: Settings, loaded, layers: list[Layer], image_root: Path) -> dict:
    return {
        "model": settings.model,
        "weights": loaded.weights,
        "model_source": json.dumps(loaded.source, sort_keys=True),
        "seed": settings.seed,
        "layers": [layer.name for layer in layers],
        "preprocessing": repr(loaded.preprocessing),
        "image_root": str(Path(image_root).resolve()),
        "dtype": settings.dtype,
        "reduce": settings.reduce,
        "precision": settings.precision,
        "fast_decode": settings.fast_decode,
        "featdump_version": __version__,
        "torch_version": str(torch.__version__),
        "torchvision_version": str(torchvision.__version__),
        "command": settings.command,
        "settings": json.dumps(settings.effective(), sort_keys=True),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _report_size(settings: Settings, specs: dict[str, DatasetSpec], image_count: int) -> None:
    """Log bytes per image per layer and the total; refuse when the disk is too small."""
    for name, spec in specs.items():
        log.info("Layer %s: %s per image, shape %s, %s.", name, _human_bytes(spec.row_bytes), spec.shape, spec.dtype)
    total = image_count * sum(spec.row_bytes for spec in specs.values())
    free = shutil.disk_usage(settings.output.resolve().parent).free
    log.info("Expected output: %s for %d images (%s free).", _human_bytes(total), image_count, _human_bytes(free))
    if settings.space_check and total > free:
        raise NotEnoughSpace(
            f"The output needs about {_human_bytes(total)} but only {_human_bytes(free)} is free on "
            f"{settings.output.resolve().parent}; free space, use --dtype float16 or --reduce, "
            "or pass --no-space-check."
        )


def _human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"
