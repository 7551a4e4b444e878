"""Arrays: images kept as one array in an HDF5 (or NetCDF-4) file, a .npy or a .npz, as studies keep their stimuli
(the Natural Scenes Dataset's nsd_stimuli.hdf5 holds `imgBrick`, 73,000 x 425 x 425 x 3 uint8).

An image array is uint8 (or uint16 whose range its attributes state: `valid_max` or `valid_range`, as CF
conventions write them) of rank 4 with 1 or 3 channels last or first, or of rank 3 (greyscale). A file holding one
is read by itself; one holding several is read by the one --array names. Each row is one index of the array, in
index order, named FILE/ARRAY/INDEX (`nsd_stimuli.hdf5/imgBrick/17`; a .npy's `stimuli.npy/17`), so rows keep the
study's own indices. The loader's workers read a batch's indices at once, each process opening the file itself
(h5py handles do not cross a fork; a .npy, and a .npz member stored uncompressed, are memory-mapped): memory is
bounded by the batch, never the array. Each image reaches the decoder as the uncompressed PPM (PGM) of its pixels,
so that it goes through exactly the preprocessing a decoded file's pixels do.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import h5py
import numpy as np

from featdump.errors import NoImages, UsageProblem
from featdump.inputs.imagelist import ROW_VERSION, Encoded, ImageList, Storage, content_digest, hash_lines

HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5", ".nc", ".nc4")
ARRAY_SUFFIXES = (*HDF5_SUFFIXES, ".npy", ".npz")
_SHAPES = "uint8 (or uint16 with a stated range) of shape (N, H, W, C) or (N, C, H, W) with C 1 or 3, or (N, H, W)"


def is_array_file(path: Path) -> bool:
    """Whether PATH is a file of arrays (HDF5, NetCDF-4, .npy, .npz), by its name."""
    return path.suffix.lower() in ARRAY_SUFFIXES and path.is_file()


@dataclass(frozen=True)
class Layout:
    """How an array holds its images: the channel axis (last, first, or none: greyscale), and the uint8 scale of a
    uint16 array (255 over its stated largest value)."""

    channels: str  # "last", "first" or "none"
    scale: float | None = None

    def image(self, values: np.ndarray) -> np.ndarray:
        """One index's values as (H, W, C) uint8 (C 1 or 3)."""
        if self.channels == "first":
            values = np.moveaxis(values, 0, -1)
        elif self.channels == "none":
            values = values[..., None]
        if self.scale is not None:
            values = np.clip(np.rint(values.astype(np.float64) * self.scale), 0, 255).astype(np.uint8)
        return np.ascontiguousarray(values)


def layout_of(name: str, shape: tuple[int, ...], dtype: np.dtype, attrs) -> Layout | str:
    """The layout of the array NAME, or why it holds no images (in words)."""
    found = f"{name}: {dtype} of shape {tuple(shape)}"
    if dtype == np.uint16:
        stated = _stated_max(attrs)
        if stated is None:
            return f"{found}, uint16 without a stated range (give it a valid_max or valid_range attribute)"
        scale = 255.0 / stated
    elif dtype == np.uint8:
        scale = None
    else:
        return found
    if len(shape) == 4 and shape[-1] in (1, 3):
        return Layout("last", scale)
    if len(shape) == 4 and shape[1] in (1, 3):
        return Layout("first", scale)
    if len(shape) == 3:
        return Layout("none", scale)
    return found


def _stated_max(attrs) -> float | None:
    for key in ("valid_max", "valid_range"):
        if key in attrs:
            value = float(np.max(np.asarray(attrs[key])))
            return value if value > 0 else None
    return None


def read_array(source: Path, array: str | None = None) -> ImageList:
    """The images of the array ARRAY in the file SOURCE (the only image array there when None), a row per index."""
    arrays = _arrays_in(source)
    array = array.strip("/") if array is not None else None  # h5py's /imgBrick is imgBrick
    if array is not None:
        if array not in arrays:
            raise UsageProblem(f"--array {array}: {source.name} holds no array of that name; it holds "
                               f"{', '.join(arrays) or 'none'}.")
        chosen = array
    else:
        usable = [name for name, (shape, dtype, attrs) in arrays.items()
                  if isinstance(layout_of(name, shape, dtype, attrs), Layout)]
        if len(usable) > 1:
            raise UsageProblem(f"{source.name} holds several image arrays ({', '.join(usable)}): choose one with "
                               "--array NAME.")
        if not usable:
            found = "; ".join(str(layout_of(name, *held)) for name, held in list(arrays.items())[:5]) or "no array"
            raise NoImages(f"{source.name} holds no image array ({found}): an image array is {_SHAPES}.")
        chosen = usable[0]
    shape, dtype, attrs = arrays[chosen]
    layout = layout_of(chosen, shape, dtype, attrs)
    if not isinstance(layout, Layout):
        raise UsageProblem(f"--array {chosen}: {layout}, not images: an image array is {_SHAPES}.")
    if not shape[0]:
        raise NoImages(f"{source.name}/{chosen} holds no image (its first axis is 0 long).")
    prefix = source.name if source.suffix.lower() == ".npy" else f"{source.name}/{chosen}"
    stat = source.stat()
    storage = ArrayImages(source.name, None if source.suffix.lower() == ".npy" else chosen, layout,
                          np.arange(shape[0], dtype=np.int64), tuple(shape), str(dtype),
                          (stat.st_size, stat.st_mtime_ns))
    count = shape[0]
    listing = {"array": prefix, "rows": int(count), "file_size": stat.st_size, "file_mtime_ns": stat.st_mtime_ns,
               "row_version": ROW_VERSION}
    return ImageList(source.parent, tuple(f"{prefix}/{index}" for index in range(count)), (-1,) * count, (),
                     storage, listing)


def listed_rows(listed: ImageList) -> ImageList | None:
    """The rows of a list file whose entries name rows of one file of arrays as featdump names them
    (`nsd_stimuli.hdf5/imgBrick/3`, `stimuli.npy/17`), in the list's order with its labels: a subset (NSD's shared
    1,000) read without the rest. None where its entries name no array's rows."""
    if isinstance(listed.root, str) or not listed.paths:
        return None
    parts = [PurePosixPath(path).parts for path in listed.paths]
    at = next((place for place, part in enumerate(parts[0][:-1]) if part.lower().endswith(ARRAY_SUFFIXES)), None)
    if at is None or not is_array_file(Path(listed.root, *parts[0][:at + 1])):
        return None
    source, array = Path(listed.root, *parts[0][:at + 1]), "/".join(parts[0][at + 1:-1]) or None
    prefix = parts[0][:-1]
    if any(entry[:-1] != prefix or not entry[-1].isdigit() for entry in parts):
        raise UsageProblem(f"The list names rows of {source.name}{'/' + array if array else ''} "
                           f"({listed.paths[0]}), and other entries too: a list of an array's rows names only "
                           "that array's rows, FILE/ARRAY/INDEX.")
    whole = read_array(source, array)
    indices = [int(entry[-1]) for entry in parts]
    repeated = len(indices) - len(set(indices))
    if repeated:
        seen: set[int] = set()
        first = next(index for index in indices if index in seen or seen.add(index))
        raise UsageProblem(f"The list names row {first} of {source.name}{'/' + array if array else ''} twice "
                           f"({repeated} repeat{'s' * (repeated > 1)} in all): name each row once (two rows of one "
                           "image would fall in a training fold and its held-out fold alike).")
    beyond = [index for index in indices if index >= len(whole)]
    if beyond:
        raise UsageProblem(f"The list names row {beyond[0]} of {source.name}{'/' + array if array else ''}, which "
                           f"holds {len(whole)} (rows count from 0).")
    return whole.select(indices, listed.labels)


def _arrays_in(source: Path) -> dict[str, tuple[tuple[int, ...], np.dtype, dict]]:
    """Each array of SOURCE: its name, shape, dtype and attributes."""
    suffix = source.suffix.lower()
    try:
        if suffix == ".npy":
            values = np.load(source, mmap_mode="r", allow_pickle=False)
            return {source.stem: (values.shape, values.dtype, {})}
        if suffix == ".npz":
            with np.load(source, allow_pickle=False) as held:
                return {name: _npz_member_header(source, name) for name in held.files}
        found: dict = {}
        with h5py.File(source, "r") as h5file:
            h5file.visititems(lambda name, item: found.__setitem__(name, (item.shape, item.dtype, dict(item.attrs)))
                              if isinstance(item, h5py.Dataset) and item.shape is not None else None)
        return found
    except (OSError, ValueError) as error:
        raise UsageProblem(f"Cannot read {source} as a file of arrays ({type(error).__name__}: {error}).") from error


def _npz_member_header(source: Path, name: str) -> tuple[tuple[int, ...], np.dtype, dict]:
    with zipfile.ZipFile(source) as archive, archive.open(f"{name}.npy") as member:
        shape, _, dtype = _npy_header(member)
    return tuple(shape), dtype, {}


def _npy_header(handle) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of the .npy whose bytes HANDLE reads from their start."""
    version = np.lib.format.read_magic(handle)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return reader(handle)


def read_array_row(root: Path | str, relative: str) -> bytes | None:
    """The image of row path RELATIVE (FILE/ARRAY/INDEX, a .npy's FILE/INDEX) from its file under ROOT, as the
    decoder reads it (`_netpbm`); None when RELATIVE names no array's row there."""
    parts = relative.split("/")
    for place, part in enumerate(parts[:-1]):
        if Path(part).suffix.lower() in ARRAY_SUFFIXES:
            path, key = Path(root).joinpath(*parts[:place + 1]), "/".join(parts[place + 1:-1]) or None
            try:
                arrays = _arrays_in(path)
                name = key or path.stem
                layout = layout_of(name, *arrays[name])
                with _array(path, key) as array:
                    values = np.asarray(array[int(parts[-1])])
            except (UsageProblem, KeyError, ValueError, IndexError, OSError):
                return None
            return _netpbm(layout.image(np.asarray(values))) if isinstance(layout, Layout) else None
    return None


@dataclass(frozen=True)
class ArrayImages(Storage):
    """Where a job's rows lie in an array: the file (under the list's root), the array's name in it (None: a .npy),
    its layout, and each row's index; the array's shape and dtype and the file's (size, mtime_ns) as listed."""

    file: str
    key: str | None
    layout: Layout
    indices: np.ndarray  # int64 per row
    shape: tuple[int, ...]
    dtype: str
    file_stat: tuple[int, int]

    def open(self, root: Path, relative: str, position: int) -> Encoded:
        return next(self.open_as_ready(root, [relative], [position]))[1]

    def open_as_ready(self, root: Path, relatives: Sequence[str],
                      positions: Sequence[int]) -> Iterator[tuple[int, Encoded | Exception]]:
        """The batch's images read in one request (their indices sorted), each as the PPM of its pixels."""
        wanted = self.indices[np.asarray(positions, dtype=np.int64)]
        try:
            order = np.argsort(wanted, kind="stable")
            with _array(Path(root) / self.file, self.key) as array:
                values = _read_rows(array, wanted[order])
        except (OSError, ValueError, KeyError) as error:
            for index in range(len(positions)):
                yield index, error
            return
        pixels = np.empty_like(values)
        pixels[order] = values
        size = self.row_bytes
        for index, relative in enumerate(relatives):
            yield index, Encoded(relative, (size, row_digest(pixels[index])),
                                 data=_netpbm(self.layout.image(pixels[index])))

    @property
    def row_bytes(self) -> int:
        """The bytes of one row's image as the array stores it."""
        return int(np.prod(self.shape[1:])) * np.dtype(self.dtype).itemsize

    def stat(self, root: Path, relative: str, position: int) -> tuple[int, int] | None:
        """What a row records of its input now: its image's bytes and the digest of them (`row_digest`, the row read
        again), None when the array no longer holds its index."""
        index = int(self.indices[position])
        length = _length_now(Path(root) / self.file, self.key)
        if length is None or index >= length:
            return None
        return self.row_bytes, int(row_digests(Path(root) / self.file, self.key, np.array([index]))[0])

    def stale(self, root: Path, paths: Sequence[str], positions: np.ndarray, recorded: np.ndarray, listed: dict,
              suspects: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows gone: the array no longer holds their index. Rows changed: their bytes differ from the digest they
        recorded, read again only when the file changed since the output LISTED it (a file whose size and time are
        as listed is not read, but for the SUSPECTS, the rows recorded stale; a grown array's old rows are read and
        found the same). Rows of outputs made before rows recorded digests are never found changed."""
        path = Path(root) / self.file
        length = _length_now(path, self.key)
        indices = np.where(positions >= 0, self.indices[np.maximum(positions, 0)], -1) if len(self.indices) else \
            np.full(len(positions), -1, dtype=np.int64)
        gone = (positions < 0) | (indices >= (length if length is not None else 0))
        changed = ~gone & (recorded[:, 0] >= 0) & (recorded[:, 0] != self.row_bytes)
        unchanged_file = (listed.get("file_size"), listed.get("file_mtime_ns")) == self.file_stat
        if listed.get("row_version") == ROW_VERSION:
            looked_at = ~gone & ~changed & (recorded[:, 0] >= 0) & (suspects if unchanged_file else True)
            checked = np.flatnonzero(looked_at)
            if len(checked):
                changed[checked] = row_digests(path, self.key, indices[checked]) != recorded[checked, 1]
        return gone, changed

    def select(self, positions: Sequence[int]) -> ArrayImages:
        return replace(self, indices=self.indices[np.asarray(positions, dtype=np.int64)])

    def digest(self, root: Path, paths: Sequence[str], labels: Sequence[int], sizes: bool) -> str:
        """A hash of the rows' names (and the file's size and time, the array's shape and dtype)."""
        digest = hashlib.sha256(f"array\0{self.file}\0{self.key}\0{self.dtype}\0{self.shape[1:]}\n".encode())
        hash_lines(digest, (f"{relative}\0{label}\n" for relative, label in zip(paths, labels)))
        if sizes:
            digest.update(f"{self.file_stat}\0{self.shape}\n".encode())
        return digest.hexdigest()


_DIGEST_BLOCK = 64 << 20  # bytes of rows read at once to digest them again


def row_digest(values: np.ndarray) -> int:
    """The version an array row records: `content_digest` of its bytes as stored."""
    return content_digest(np.ascontiguousarray(values).tobytes())


def row_digests(path: Path, key: str | None, indices: np.ndarray) -> np.ndarray:
    """`row_digest` of the rows at INDICES of the array KEY of PATH (int64, in INDICES' order), read in sorted
    blocks of about 64 MiB: memory bounded by the block, not the array."""
    digests = np.empty(len(indices), dtype=np.int64)
    order = np.argsort(indices, kind="stable")
    with _array(path, key) as array:
        step = max(1, _DIGEST_BLOCK // max(1, int(np.prod(array.shape[1:])) * array.dtype.itemsize))
        for first in range(0, len(order), step):
            chosen = order[first:first + step]
            values = _read_rows(array, indices[chosen])
            digests[chosen] = [row_digest(row) for row in values]
    return digests


def _length_now(path: Path, key: str | None) -> int | None:
    """How many images the array KEY of PATH holds now (None: gone), read once for each size and time of the file."""
    try:
        found = path.stat()
    except OSError:
        return None
    version = (str(path), key, found.st_size, found.st_mtime_ns)
    if version not in _LENGTHS:
        try:
            _LENGTHS[version] = int(_arrays_in(path)[key or path.stem][0][0])
        except (UsageProblem, KeyError):
            _LENGTHS[version] = None
    return _LENGTHS[version]


_LENGTHS: dict[tuple, int | None] = {}
_OPENED: dict[tuple[int, str, str | None], object] = {}  # (process, file, array): an h5py dataset or an ndarray


def _in_loader_worker() -> bool:
    """Whether this process is a DataLoader's worker (whose torch is imported by then: none is imported here)."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


@contextlib.contextmanager
def _array(path: Path, key: str | None) -> Iterator:
    """The array KEY of PATH: a loader worker opens it once and keeps it open (each its own handle: h5py's do not
    cross a fork); the main process opens it for the call and closes it again (the file stays the user's)."""
    if not _in_loader_worker():
        opened = _open(path, key)
        try:
            yield opened
        finally:
            if isinstance(opened, h5py.Dataset):
                opened.file.close()
        return
    handle = (os.getpid(), str(path), key)
    if handle not in _OPENED:
        _OPENED[handle] = _open(path, key)
    yield _OPENED[handle]


def _open(path: Path, key: str | None):
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return np.load(path, mmap_mode="r", allow_pickle=False)
    if suffix == ".npz":
        return _npz_member(path, key)
    return h5py.File(path, "r")[key]


def _npz_member(path: Path, key: str) -> np.ndarray:
    """A .npz member memory-mapped where it is stored uncompressed (as np.savez writes), else read whole."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{key}.npy")
        if info.compress_type != zipfile.ZIP_STORED:
            with np.load(path, allow_pickle=False) as held:
                return held[key]
        with open(path, "rb") as handle:
            handle.seek(info.header_offset)
            local = handle.read(30)
            start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + \
                int.from_bytes(local[28:30], "little")
            handle.seek(start)
            shape, fortran, dtype = _npy_header(handle)
            offset = handle.tell()
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def _read_rows(array, indices: np.ndarray) -> np.ndarray:
    """ARRAY's rows at the sorted INDICES in one read (a slice where they run on, as a batch's usually do)."""
    if len(indices) and indices[-1] - indices[0] + 1 == len(indices):
        return np.asarray(array[int(indices[0]):int(indices[-1]) + 1])
    unique, inverse = np.unique(indices, return_inverse=True)
    return np.asarray(array[unique.tolist()] if isinstance(array, h5py.Dataset) else array[unique])[inverse]


def _netpbm(image: np.ndarray) -> bytes:
    """IMAGE ((H, W, 1 or 3) uint8) as an uncompressed PGM or PPM, which Pillow decodes to exactly these pixels."""
    height, width, channels = image.shape
    return f"P{6 if channels == 3 else 5}\n{width} {height}\n255\n".encode() + image.tobytes()
