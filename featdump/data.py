"""Data: the sorted image list with labels, robust decoding with recorded failures, and batching."""

from __future__ import annotations

import contextlib
import csv
import ctypes
import hashlib
import logging
import multiprocessing
import os
import signal
import stat
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import Resize
from torchvision.transforms import functional as F
from torchvision.transforms._presets import ImageClassification

from featdump.errors import DeviceFailure, NoImages

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"})
JPEG_EXTENSIONS = frozenset({".jpg", ".jpeg"})
log = logging.getLogger("featdump")


@dataclass(frozen=True)
class ImageList:
    """Every image under ROOT in sorted order of relative path, with ImageFolder-style labels."""

    root: Path  # the folder, or the list file's folder
    paths: tuple[str, ...]  # POSIX paths relative to root (sorted), or as a list file gives them
    labels: tuple[int, ...]  # index into classes, or -1 when images do not sit in class folders
    classes: tuple[str, ...]  # first-level folder names, sorted

    def __len__(self) -> int:
        return len(self.paths)

    def digest(self, sizes: bool = True) -> str:
        """A hash of the paths (and file sizes): changes when an image is added, removed (or replaced)."""
        digest = hashlib.sha256()
        for relative, label in zip(self.paths, self.labels):
            size = ""
            if sizes:
                try:
                    size = os.stat(self.root / relative).st_size
                except OSError:
                    size = -1
            digest.update(f"{relative}\0{size}\0{label}\n".encode("utf-8", "surrogateescape"))
        return digest.hexdigest()

    def part(self, start: int, stop: int) -> ImageList:
        """Images START..STOP-1 (a shard), labelled against the whole list's classes."""
        return ImageList(self.root, self.paths[start:stop], self.labels[start:stop], self.classes)

    def without(self, known: set[str], classes: tuple[str, ...]) -> ImageList:
        """The images whose paths are not in KNOWN, labelled against CLASSES (as a file stores them: UTF-8 text)
        extended by any new class folder (appended, so that labels already written keep their meaning)."""
        from featdump.writer import as_text

        kept = [(path, label) for path, label in zip(self.paths, self.labels) if path not in known]
        paths = tuple(path for path, _ in kept)
        if not self.classes:  # labels from a list file (or none): they stay as given
            return ImageList(self.root, paths, tuple(label for _, label in kept), tuple(classes))
        new_classes = sorted({as_text(self.classes[label]) for _, label in kept if label >= 0} - set(classes))
        classes = (*classes, *new_classes)
        index = {name: i for i, name in enumerate(classes)}
        labels = tuple(index[as_text(path.split("/", 1)[0])] for path in paths)
        return ImageList(self.root, paths, labels, classes)


def find_images(root: Path) -> ImageList:
    """The images of ROOT: a folder walked recursively (following symlinks once), or a .txt/.csv list file;
    NoImages if there are none."""
    root = Path(root)
    if root.is_file():
        return read_image_list(root)
    if not root.is_dir():
        raise NoImages(f"Image folder {str(root)!r} does not exist or is not a folder.")
    paths = sorted(_walk(root))
    if not paths:
        extensions = ", ".join(sorted(ext.lstrip(".") for ext in IMAGE_EXTENSIONS))
        raise NoImages(f"No images in {str(root)!r} (looked for {extensions}, in any case, in all subfolders).")
    in_class_folders = all("/" in path for path in paths)
    classes = sorted({path.split("/", 1)[0] for path in paths}) if in_class_folders else []
    index = {name: i for i, name in enumerate(classes)}
    labels = [index[path.split("/", 1)[0]] if in_class_folders else -1 for path in paths]
    return ImageList(root, tuple(paths), tuple(labels), tuple(classes))


def read_image_list(path: Path) -> ImageList:
    """The images a list file names, in its order: .txt, one path per line (blank lines and lines starting
    with # ignored), or .csv with a `path` column and an optional integer `label` column. Relative paths
    are relative to the list's folder; a listed file that is missing becomes a skipped image later."""
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".csv"):
        raise NoImages(f"{str(path)!r} is a file: IMAGES must be a folder, a .txt list or a .csv list.")
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as handle:
        if suffix == ".txt":
            entries = [(line.rstrip("\r\n"), -1) for line in handle]
            entries = [(name, label) for name, label in entries if name.strip() and not name.startswith("#")]
        else:
            entries = _csv_entries(path, handle)
    if not entries:
        raise NoImages(f"The list {str(path)!r} names no image.")
    paths = tuple(name for name, _ in entries)
    return ImageList(path.parent, paths, tuple(label for _, label in entries), ())


def _csv_entries(path: Path, handle) -> list[tuple[str, int]]:
    reader = csv.DictReader(handle)
    if not reader.fieldnames or "path" not in reader.fieldnames:
        columns = ", ".join(reader.fieldnames or [])
        raise NoImages(f"The CSV list {str(path)!r} needs a 'path' column (it has: {columns}).")
    entries = []
    for line, row in enumerate(reader, start=2):
        label = (row.get("label") or "").strip()
        if label and not label.lstrip("-").isdigit():
            raise NoImages(f"{path}, line {line}: label {label!r} is not an integer.")
        if row["path"]:
            entries.append((row["path"], int(label) if label else -1))
    return entries


def _walk(root: Path):
    seen_folders = set()

    def unreadable(error: OSError) -> None:
        log.warning("Cannot read folder %s (%s); its images are left out.", error.filename, error.strerror)

    for folder, subfolders, files in os.walk(root, followlinks=True, onerror=unreadable):
        real = os.path.realpath(folder)
        if real in seen_folders:  # a symlink loop or a folder linked twice
            subfolders.clear()
            continue
        seen_folders.add(real)
        subfolders.sort()
        relative_folder = Path(folder).relative_to(root)
        for name in files:
            if Path(name).suffix.lower() in IMAGE_EXTENSIONS:
                yield (relative_folder / name).as_posix()


def open_rgb(path: Path, draft: tuple[int, int] | None = None) -> Image.Image:
    """Decode PATH as 8-bit RGB, with EXIF orientation applied; raises on anything undecodable.

    Grayscale, palette, RGBA (alpha dropped, as torchvision's ImageFolder loader does), CMYK and
    16-bit images are converted; images over Pillow's pixel limit are refused as decompression bombs.
    With DRAFT (width, height), a JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8) that keeps
    it at least that large; other formats are decoded whole.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(path) as image:
            if draft is not None and image.format == "JPEG":
                image.draft(image.mode, draft)
            image.load()
            image = ImageOps.exif_transpose(image)
            return _to_rgb(image)


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode.startswith("I") or image.mode == "F":
        gray = _scale_to_8_bits(image)
        return Image.fromarray(gray, mode="L").convert("RGB")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    return image.convert("RGB")


def _scale_to_8_bits(image: Image.Image) -> np.ndarray:
    """16-bit (and 32-bit) grayscale scaled to 0-255 by value, not clipped."""
    values = np.asarray(image).astype(np.float64)
    if image.mode.startswith("I;16") or values.max(initial=0) > 255:
        full_scale = 65535.0
    elif image.mode == "F" and values.max(initial=0) <= 1.0:
        full_scale = 1.0
    else:
        full_scale = 255.0
    return np.clip(np.rint(values * (255.0 / full_scale)), 0, 255).astype(np.uint8)


def describe_failure(error: BaseException) -> str:
    """One line saying why an image could not be used."""
    if isinstance(error, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return f"decompression bomb: {error}"
    if isinstance(error, FileNotFoundError):
        return "file not found (a broken symlink?)"
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class Preprocess:
    """The model's preprocessing split in two: pixels() runs in the workers, normalize() on the device.

    For torchvision's ImageClassification transforms, pixels() resizes and crops the PIL image to a
    uint8 (C, H, W) array and normalize() scales and normalises a batch of them, which gives exactly
    what `transforms(pil_image)` gives. Other transforms run whole in the workers.
    """

    def __init__(self, transforms: nn.Module, fast_decode: bool = False):
        self.transforms = transforms
        self.split = isinstance(transforms, ImageClassification)
        if self.split:
            self.size = (transforms.crop_size[0], transforms.crop_size[-1])
        else:  # any other transform: the size it makes of a photo-shaped image
            self.size = tuple(transforms(Image.new("RGB", (640, 480))).shape[-2:])
        resize = self._resize_target()
        self.draft = (2 * resize, 2 * resize) if fast_decode and resize else None

    def _resize_target(self) -> int | None:
        """The size the preprocessing resizes to (its largest side value), if it starts with a resize."""
        if self.split:
            return max(self.transforms.resize_size) if self.transforms.resize_size else None
        steps = getattr(self.transforms, "transforms", [self.transforms])
        for step in steps:
            if isinstance(step, Resize):
                size = step.size if isinstance(step.size, (list, tuple)) else [step.size]
                return max(size)
        return None

    def pixels(self, image: Image.Image) -> np.ndarray:
        if not self.split:
            return self.transforms(image).numpy()
        return np.asarray(self.resize_and_crop(image), dtype=np.uint8).transpose(2, 0, 1)

    def resize_and_crop(self, image):
        """Resize and centre-crop a PIL image or a uint8 (C, H, W) tensor (the GPU path's)."""
        t = self.transforms
        image = F.resize(image, t.resize_size, interpolation=t.interpolation, antialias=t.antialias)
        return F.center_crop(image, t.crop_size)

    def normalize(self, batch: torch.Tensor) -> torch.Tensor:
        """uint8 (N, C, H, W) -> normalised float, as convert_image_dtype + normalize compute it, with the
        mean and std kept on the batch's device (no host copies, no read-back per batch)."""
        if not self.split:
            return batch.float()
        mean, std = self._constants(batch.device)
        return (batch.float() / 255.0).sub_(mean).div_(std)

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        cached = self.__dict__.setdefault("_on_device", {})
        if device not in cached:
            mean = torch.tensor(self.transforms.mean, dtype=torch.float32).view(-1, 1, 1)
            std = torch.tensor(self.transforms.std, dtype=torch.float32).view(-1, 1, 1)
            cached[device] = (mean.to(device), std.to(device))
        return cached[device]


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


class ImageDataset(Dataset):
    """Item i: (i, "pixels", array, stat) for a decoded image, (i, "jpeg", bytes, stat) for one left to the
    GPU, (i, "failed", reason, stat) for a bad one; stat is the file's (size, mtime_ns) when it was read.
    Workers return numpy arrays, never many small tensors."""

    def __init__(self, images: ImageList, preprocess: Preprocess, gpu_jpegs: bool = False):
        self.images = images
        self.preprocess = preprocess
        self.gpu_jpegs = gpu_jpegs and preprocess.split

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, position: int):
        path = self.images.root / self.images.paths[position]
        file_stat = (-1, -1)
        try:
            found = _check_regular_file(path)
            file_stat = (found.st_size, found.st_mtime_ns)
            if self.gpu_jpegs and path.suffix.lower() in JPEG_EXTENSIONS and _plain_jpeg(path, self.preprocess.draft):
                return position, "jpeg", np.fromfile(path, dtype=np.uint8), file_stat
            return position, "pixels", self.preprocess.pixels(open_rgb(path, self.preprocess.draft)), file_stat
        except Exception as error:  # any decoding failure is recorded, not raised
            return position, "failed", describe_failure(error), file_stat


def _check_regular_file(path: Path) -> os.stat_result:
    """PATH's stat, or raise unless it (followed through links) is a regular file: a FIFO would block a read."""
    found = os.stat(path)
    if not stat.S_ISREG(found.st_mode):
        raise OSError("not a regular file (a pipe, socket or device)")
    return found


def _plain_jpeg(path: Path, draft: tuple[int, int] | None = None) -> bool:
    """An RGB/gray JPEG without EXIF rotation, within Pillow's pixel limit, and (with DRAFT) too small for a
    reduced-scale decode, which the CPU does and nvjpeg cannot (reads the header only)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(path) as image:
            orientation = image.getexif().get(0x0112, 1)
            scalable = draft is not None and min(image.size) >= 2 * min(draft)
            return image.format == "JPEG" and image.mode in ("RGB", "L") and orientation == 1 and not scalable


def collate(items) -> Batch:
    """Stack the decoded images into one tensor (one shared-memory handle per batch, not per image)."""
    decoded = [(position, payload) for position, kind, payload, _ in items if kind == "pixels"]
    pixels = torch.from_numpy(np.stack([payload for _, payload in decoded])) if decoded else None
    jpegs = [(position, payload) for position, kind, payload, _ in items if kind == "jpeg"]
    ends = np.cumsum([len(payload) for _, payload in jpegs]).tolist()
    return Batch(
        positions=[position for position, _ in decoded],
        pixels=pixels,
        failures=[(position, payload) for position, kind, payload, _ in items if kind == "failed"],
        end=items[-1][0] + 1,
        jpeg_bytes=torch.from_numpy(np.concatenate([payload for _, payload in jpegs])) if jpegs else None,
        jpeg_index=[(position, end - len(payload), end) for (position, payload), end in zip(jpegs, ends)],
        file_stats={position: file_stat for position, _, _, file_stat in items},
    )


def to_device_inputs(batch: Batch, preprocess: Preprocess, images: ImageList, device: torch.device):
    """The batch's normalised model inputs on DEVICE, in source order (None if no image is usable).

    JPEGs left encoded are decoded in one nvjpeg call on the GPU and resized and cropped there; one
    that nvjpeg cannot decode is decoded on the CPU alone, and recorded as failed if that fails too.
    Afterwards `batch.positions` are the rows of the inputs and nothing is left encoded.
    """
    if not batch.jpeg_index:
        return None if batch.pixels is None else preprocess.normalize(batch.pixels.to(device, non_blocking=True))
    crops = {}
    if batch.pixels is not None:
        on_device = batch.pixels.to(device, non_blocking=True)
        crops.update(zip(batch.positions, on_device.unbind(0)))
    for position, decoded in _decode_on_gpu(batch.encoded, device):
        if decoded is not None:
            crops[position] = preprocess.resize_and_crop(decoded)
            continue
        try:  # only this image's decoding may fail it; a device error below stops the run
            pixels = preprocess.pixels(open_rgb(images.root / images.paths[position], preprocess.draft))
        except Exception as error:  # recorded like a worker's failure
            batch.failures.append((position, describe_failure(error)))
            continue
        crops[position] = torch.from_numpy(pixels).to(device)
    batch.jpeg_bytes, batch.jpeg_index = None, []
    batch.positions = sorted(crops)
    if not crops:
        return None
    return preprocess.normalize(torch.stack([crops[p] for p in batch.positions]))


def _decode_on_gpu(encoded: list[tuple[int, torch.Tensor]], device: torch.device):
    """Yield (position, uint8 CHW tensor on DEVICE or None when nvjpeg failed on it)."""
    if not encoded:
        return
    from torchvision.io import ImageReadMode, decode_jpeg

    tensors = [data for _, data in encoded]
    if device.type == "cuda":
        # nvJPEG's hardware decoder does not wait for work queued on the stream, and its outputs come from
        # the caching allocator: memory the queued forward still uses could be handed to it and overwritten.
        torch.cuda.current_stream(device).synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        decoded = _decode_halving(tensors, lambda part: decode_jpeg(part, mode=ImageReadMode.RGB, device=device))
    yield from zip([position for position, _ in encoded], decoded)


def _decode_halving(tensors: list[torch.Tensor], decode) -> list[torch.Tensor | None]:
    """DECODE(list) on all of TENSORS; when one bad JPEG fails the batched call, the halves are decoded again
    (k bad JPEGs cost about 2k log2(n) calls, not n), and a bad one alone gives None."""
    try:
        return list(decode(tensors))
    except RuntimeError as error:
        raise_if_device_failure(error)
        if len(tensors) == 1:
            return [None]
        half = len(tensors) // 2
        return _decode_halving(tensors[:half], decode) + _decode_halving(tensors[half:], decode)


def raise_if_device_failure(error: BaseException) -> None:
    """Re-raise as DeviceFailure an error of the device itself (out of memory, a sticky CUDA error), which no
    image caused and which would fail every image after it; decode errors of one image pass."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    text = str(error)
    if isinstance(error, torch.cuda.OutOfMemoryError) or (accelerator_error and isinstance(error, accelerator_error)) \
            or "CUDA error" in text or "out of memory" in text:
        raise DeviceFailure(f"The GPU failed while decoding images ({text.strip().splitlines()[0]}); committed rows "
                            "are kept: fix the cause (a smaller --batch-size for out of memory) and run the same "
                            "command again to resume.") from error


class _Batches:
    """Consecutive batches of source positions from START to N."""

    def __init__(self, start: int, count: int, batch_size: int):
        self.start, self.count, self.batch_size = start, count, batch_size

    def __iter__(self):
        for first in range(self.start, self.count, self.batch_size):
            yield list(range(first, min(first + self.batch_size, self.count)))

    def __len__(self) -> int:
        return max(0, -(-(self.count - self.start) // self.batch_size))


def job_cpus() -> tuple[int, str]:
    """How many CPUs this job was given, and by whom: SLURM_CPUS_PER_TASK, else this process's affinity mask."""
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "").strip()
    if slurm.isdigit() and int(slurm) > 0:
        return int(slurm), "SLURM_CPUS_PER_TASK"
    try:
        return len(os.sched_getaffinity(0)), "the CPU affinity mask"
    except AttributeError:  # not Linux
        return os.cpu_count() or 1, "os.cpu_count()"


def decode_bytes_per_worker() -> int:
    """The most memory one worker's decode can take: the largest image Pillow accepts (MAX_IMAGE_PIXELS), as
    RGB, held about three times over (decoded, rotated or converted, resized)."""
    return 3 * 3 * int(Image.MAX_IMAGE_PIXELS or 0)


def available_memory() -> int | None:
    """Bytes this job can still use: the smaller of MemAvailable and its cgroup's limit left (SLURM, containers)."""
    values = []
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    values.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        folder = Path("/sys/fs/cgroup") / _cgroup_path()
        with open(folder / "memory.max") as limit, open(folder / "memory.current") as used:
            maximum = limit.read().strip()
            if maximum != "max":
                values.append(int(maximum) - int(used.read()))
    except (OSError, ValueError):
        pass
    return min(values) if values else None


def _cgroup_path() -> str:
    """This process's cgroup (v2) relative to the hierarchy's root: a SLURM job's or a container's."""
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            if line.startswith("0::"):
                return line[3:].strip().lstrip("/")
    return ""


def choose_workers(requested: int | None) -> int:
    """REQUESTED loader workers, or (None) the job's CPUs less one for the main process, at least one; either
    way checked against memory: an automatic count is lowered to fit, an explicit one is warned about."""
    if requested is None:
        cpus, source = job_cpus()
        workers = max(1, cpus - 1)
        log.debug("Using %d loader workers: %d CPUs (%s), one left to the main process.", workers, cpus, source)
    else:
        workers = requested
    free, per_worker = available_memory(), decode_bytes_per_worker()
    if workers and free is not None and per_worker and workers * per_worker > free:
        fitting = max(1, free // per_worker)
        if requested is None:
            log.info("Using %d loader workers instead of %d: one decode of the largest image Pillow accepts can "
                     "take %.1f GB, and %.1f GB is available.", fitting, workers, per_worker / 1e9, free / 1e9)
            return fitting
        log.warning("%d loader workers could each take %.1f GB decoding the largest image Pillow accepts, and only "
                    "%.1f GB is available: lower -j to %d to be safe from the OOM killer.",
                    workers, per_worker / 1e9, free / 1e9, fitting)
    return workers


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

