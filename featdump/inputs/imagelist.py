"""ImageList: the ordered images of a job, whatever kind of input named them, and how to read each one's bytes
(`Files` for folders and list files; `inputs.tars.TarMembers` for tar shards)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from featdump.inputs.decode import check_regular_file
from featdump.inputs.video import GRID_DECIMALS

UNKNOWN_STAT = (-1, -1)  # an input's (size, mtime_ns) not known: never seen to change
ABSENT_STAT = (-2, -2)  # an input that was not there when it was read: changed once it is


def stat_as_read(encoded) -> tuple[int, int]:
    """The (size, mtime_ns) to record of an input as a worker got it (ENCODED, or the error opening it raised)."""
    if isinstance(encoded, Encoded):
        return encoded.file_stat
    return ABSENT_STAT if isinstance(encoded, FileNotFoundError) else UNKNOWN_STAT


@dataclass(frozen=True)
class Encoded:
    """One image's bytes as a worker gets them: a file to open, a tar member's bytes read into memory, or (a video
    in a tar or a store) a file read where it lies, in the parts asked."""

    name: str  # its path in the image list (its suffix tells the format)
    file_stat: tuple[int, int]  # (size, mtime_ns) of what was read: the file, or the member and its tar's mtime
    path: Path | None = None  # the file, or
    data: bytes | None = None  # the bytes, or
    opener: Callable[[], io.RawIOBase] | None = None  # a new seekable file of them each time it is called

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix.lower()

    @property
    def source(self) -> Path | io.IOBase:
        """What Pillow (or PyAV) opens (a new stream each time it is asked)."""
        if self.opener is not None:
            return self.opener()
        return self.path if self.data is None else _NamedBytes(self.data, self.name)

    def array(self) -> np.ndarray:
        """The encoded bytes as uint8."""
        if self.opener is not None:
            with self.opener() as handle:
                return np.frombuffer(handle.read(), dtype=np.uint8)
        if self.data is None:
            return np.fromfile(self.path, dtype=np.uint8)
        return np.frombuffer(self.data, dtype=np.uint8)


class Window(io.RawIOBase):
    """SIZE bytes from OFFSET of something READ_AT reads ((start, count) -> bytes: a tar on disk, a tar or an object
    in a store) as a seekable file of their own, read in the parts asked (a video's clips); CLOSE runs when it
    closes."""

    def __init__(self, read_at: Callable[[int, int], bytes], offset: int, size: int,
                 close: Callable[[], None] | None = None):
        super().__init__()
        self._read_at, self._offset, self._size, self._close, self._at = read_at, offset, size, close, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, position: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence]
        self._at = max(0, base + position)
        return self._at

    def readinto(self, buffer) -> int:
        count = max(0, min(len(buffer), self._size - self._at))
        data = self._read_at(self._offset + self._at, count) if count else b""
        buffer[:len(data)] = data
        self._at += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed and self._close is not None:
            self._close()
        super().close()


class _NamedBytes(io.BytesIO):
    """Bytes in memory that Pillow's error messages name by their path in the list, not by an address."""

    def __init__(self, data: bytes, name: str):
        super().__init__(data)
        self.name = name

    def __repr__(self) -> str:
        return repr(self.name)


ROW_VERSION = "blake2b-64 of the row's bytes"  # what a row of an array or a table records as its version


def content_digest(data: bytes) -> int:
    """The version a row of an array or a table records (file_stats' second column): 64 bits of BLAKE2b over its
    bytes, as a signed integer. A row whose bytes are the same is the same row, whatever else its file holds."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def hash_lines(digest, lines: Iterable[str], block: int = 65536) -> None:
    """DIGEST updated with each of LINES (as UTF-8, a surrogate as the byte it stands for), BLOCK lines at a time:
    the hash of one update a line, without a call a line."""
    lines = iter(lines)
    while True:
        text = "".join(itertools.islice(lines, block))
        if not text:
            return
        digest.update(text.encode("utf-8", "surrogateescape"))


class Storage:
    """Where the images of a list lie, aligned with its paths: how to read one, stat one, hash them all. A kind of
    storage says how to open, stat, select and hash its rows; these defaults say the rest: a batch read one image
    at a time, shards split anywhere, nothing left out."""

    def open(self, root: Path, relative: str, position: int) -> Encoded:
        raise NotImplementedError

    def open_as_ready(self, root: Path, relatives: Sequence[str],
                      positions: Sequence[int]) -> Iterator[tuple[int, Encoded | Exception]]:
        """(index, bytes) of each of a batch's images, or why it cannot be read: by default one at a time."""
        return open_each(self, root, relatives, positions)

    def stat(self, root: Path, relative: str, position: int) -> tuple[int, int] | None:
        raise NotImplementedError

    def stale(self, root: Path, paths: Sequence[str], positions: np.ndarray, recorded: np.ndarray, listed: dict,
              suspects: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which of an output's rows went stale, as two boolean arrays over its rows: gone (no longer listed, or no
        longer there) and changed (its input's (size, version) now differs from RECORDED's, (rows, 2) as each row
        recorded it when read; a negative size: unknown, never changed). POSITIONS: each row's position in PATHS
        (-1: none); LISTED: the listing the output recorded; SUSPECTS: the rows it records stale, to look at again
        whatever the listing says. By default each input is stat'ed once."""
        gone = positions < 0
        now = np.array(recorded, dtype=np.int64, copy=True)
        for row in np.flatnonzero(~gone).tolist():
            position = int(positions[row])
            found = self.stat(root, paths[position], position)
            if found is None:
                gone[row] = True
            else:
                now[row] = found
        return gone, ~gone & (recorded[:, 0] >= 0) & (now != recorded).any(axis=1)

    def select(self, positions: Sequence[int]) -> Storage:
        raise NotImplementedError

    def digest(self, root: Path, paths: Sequence[str], labels: Sequence[int], sizes: bool) -> str:
        raise NotImplementedError

    def groups(self) -> list[int] | None:
        """Where shards may split the rows (None: anywhere)."""
        return None

    def left_out(self) -> dict[str, int]:
        """What the input holds that is no image, by suffix (none by default)."""
        return {}


def changed_on_reading(storage: Storage, root, paths: Sequence[str], positions: np.ndarray, recorded: np.ndarray,
                       rows: np.ndarray) -> np.ndarray:
    """Which of ROWS (of an output: POSITIONS, each one's position in PATHS; RECORDED, (rows, 2), what each recorded
    of its input) read now as other bytes than they recorded (or cannot be read): a boolean array over every row,
    read 256 rows at a time."""
    changed = np.zeros(len(positions), dtype=bool)
    for first in range(0, len(rows), 256):
        chosen_rows = rows[first:first + 256]
        chosen = positions[chosen_rows].tolist()
        for index, found in storage.open_as_ready(root, [paths[p] for p in chosen], chosen):
            now = found.file_stat if isinstance(found, Encoded) else None
            changed[chosen_rows[index]] = now is None or tuple(now) != tuple(recorded[chosen_rows[index]])
    return changed


def open_each(storage: Storage, root: Path, relatives: Sequence[str],
              positions: Sequence[int]) -> Iterator[tuple[int, Encoded | Exception]]:
    """(index, bytes) of each image (a file's are read when it is decoded), or why it cannot be read, in turn."""
    for index, (relative, position) in enumerate(zip(relatives, positions)):
        try:
            yield index, storage.open(root, relative, position)
        except OSError as error:
            yield index, error


class Files(Storage):
    """Images stored as files under the list's root (a folder or a list file); a folder's other files are no
    samples (none left out). A folder's walk stat'ed each file once (LISTED: (rows, 2), each one's size and
    mtime_ns, -1 where it could not be stat'ed): the command's fingerprint and its update's staleness read those, no
    second stat (a list file's rows are stat'ed when asked)."""

    listed: np.ndarray | None = None

    def __init__(self, listed: np.ndarray | None = None):
        self.listed = listed

    def open(self, root: Path, relative: str, position: int) -> Encoded:
        path = root / relative
        found = check_regular_file(path)
        return Encoded(relative, (found.st_size, found.st_mtime_ns), path=path)

    def stat(self, root: Path, relative: str, position: int) -> tuple[int, int] | None:
        if self.listed is not None:
            size, mtime = self.listed[position]
            return None if size < 0 else (int(size), int(mtime))
        try:
            found = os.stat(root / relative)
        except OSError:
            return None
        return found.st_size, found.st_mtime_ns

    def stale(self, root: Path, paths: Sequence[str], positions: np.ndarray, recorded: np.ndarray, listed: dict,
              suspects: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """As `Storage.stale`, from the stats the walk took (vectorised) where it took them."""
        if self.listed is None:
            return Storage.stale(self, root, paths, positions, recorded, listed, suspects)
        gone = positions < 0
        now = self.listed[np.maximum(positions, 0)] if len(self.listed) else np.zeros((len(positions), 2), np.int64)
        gone = gone | (now[:, 0] < 0)
        return gone, ~gone & (recorded[:, 0] >= 0) & (now != recorded).any(axis=1)

    def select(self, positions: Sequence[int]) -> Files:
        if self.listed is None:
            return self
        return Files(self.listed[np.asarray(positions, dtype=np.int64)] if len(positions) else self.listed[:0])

    def digest(self, root: Path, paths: Sequence[str], labels: Sequence[int], sizes: bool) -> str:
        """A hash of the paths and labels (and file sizes: as the walk found them, else a stat per file)."""
        digest = hashlib.sha256()
        if sizes and self.listed is not None:
            sized = (int(size) for size in self.listed[:, 0])
        else:
            sized = (_size_of(root / relative) if sizes else "" for relative in paths)
        hash_lines(digest, (f"{relative}\0{size}\0{label}\n" for relative, size, label in zip(paths, sized, labels)))
        return digest.hexdigest()


def _size_of(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


@dataclass(frozen=True)
class ClipTable:
    """Which clip of its video each row of a video job is (`inputs.clips` makes it): the clips' frames and rate,
    each row's start in seconds (NaN: its video gives no clip, for the reason beside it)."""

    frames: int
    fps: float
    every: float
    starts: tuple[float, ...]
    reasons: tuple[str, ...]  # "" for a row with a clip
    infos: tuple = ()  # each row's video's frame times (inputs.video.VideoInfo; None without a clip), as listed
    anchor: str = "start"  # the grid gives the clips' starts, or their ends (inputs.video.ANCHORS)
    pad: str = "skip"  # an end-anchored window before the first frame: left out, or padded
    origin: float = 0.0  # seconds: one time of the grid (--clip-origin)

    def select(self, positions: Sequence[int]) -> ClipTable:
        return dataclasses.replace(self, starts=tuple(self.starts[p] for p in positions),
                                   reasons=tuple(self.reasons[p] for p in positions),
                                   infos=tuple(self.infos[p] for p in positions))

    def attributes(self) -> dict:
        """What an output records of its clips (and its fingerprint holds; the anchor and padding where asked)."""
        anchored = {"clip_anchor": self.anchor, "clip_pad": self.pad} if self.anchor != "start" else {}
        shifted = {"clip_origin": self.origin} if self.origin else {}
        return {"clip_frames": self.frames, "clip_fps": self.fps, "clip_every": self.every, **anchored, **shifted}

    def coordinates(self, positions: Sequence[int]) -> dict[str, np.ndarray]:
        """Each row's onset and offset (`clip_start`, `clip_end`: seconds in its video; a padded window starts
        before 0) and its video's rate, duration and frames as read (`video_rate`, frames a second;
        `video_duration`, seconds from its first frame to its last frame's end; `video_frames`, NaN where not
        counted), for the rows at POSITIONS."""
        starts = np.array([self.starts[p] for p in positions], dtype=np.float64)
        infos = [self.infos[p] if self.infos else None for p in positions]
        rates = np.array([math.nan if info is None else info.rate for info in infos], dtype=np.float64)
        sampled = np.where(rates > 0, rates, math.nan) if not self.fps else np.full(len(starts), self.fps)
        lasts = np.array([math.nan if info is None else info.last for info in infos], dtype=np.float64)
        counts = np.array([math.nan if info is None or info.frames < 0 else info.frames for info in infos],
                          dtype=np.float64)
        ends = starts + self.frames / sampled
        if self.anchor == "end":  # the grid's onsets exactly (as the starts are for clips anchored at their start)
            ends = np.round(ends, GRID_DECIMALS) + 0.0  # + 0.0: TR 0 is 0.0, not the -0.0 rounding can leave
        return {"clip_start": starts, "clip_end": ends, "video_rate": rates,
                "video_duration": lasts + 1 / np.where(rates > 0, rates, math.nan), "video_frames": counts}


@dataclass(frozen=True)
class ImageList:
    """The images of a job in order, with their labels and where their bytes lie; for a job of videos, its rows
    are clips (`clips`: each row's start, the same path once per clip)."""

    root: Path | str  # the folder, the list file's folder, or the tar shards' common folder; or their URL
    paths: tuple[str, ...]  # POSIX paths relative to root (sorted), as a list file gives them, or TAR/MEMBER
    labels: tuple[int, ...]  # index into classes, a list's or a .cls member's integer, or -1
    classes: tuple[str, ...]  # first-level folder names, sorted
    storage: Storage = field(default_factory=Files)
    listing: dict = field(default_factory=dict)  # what listing a store found (its URL, counts, when), to record
    clips: ClipTable | None = None  # a video job's rows: which clip of its video each is

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def noun(self) -> str:
        """What a row is, as messages name it: a clip (of a video) or an image."""
        return "clip" if self.clips is not None else "image"

    def open(self, position: int) -> Encoded:
        """Image POSITION's bytes (raises OSError when they cannot be read)."""
        return self.storage.open(self.root, self.paths[position], position)

    def open_as_ready(self, positions: Sequence[int]) -> Iterator[tuple[int, Encoded | Exception]]:
        """(index into POSITIONS, bytes) of each image as they arrive: requested together where they live in a
        store, an exception for one that cannot be read; StoreUnavailable when the store stays away."""
        return self.storage.open_as_ready(self.root, [self.paths[p] for p in positions], positions)

    def stat(self, position: int) -> tuple[int, int] | None:
        """Image POSITION's (size, mtime_ns) now, or None when it is gone."""
        return self.storage.stat(self.root, self.paths[position], position)

    def stale(self, positions: np.ndarray, recorded: np.ndarray, listed: dict,
              suspects: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of an output's rows (POSITIONS: each one's position here, -1 where none; RECORDED: (rows, 2), what each
        recorded of its input; LISTED: the listing the output recorded; SUSPECTS: the rows it records stale), those
        gone and those changed (`Storage.stale`)."""
        return self.storage.stale(self.root, self.paths, positions, recorded, listed, suspects)

    def digest(self, sizes: bool = True) -> str:
        """A hash of the paths (and sizes): changes when an image is added, removed (or replaced); for clips, of
        their settings and starts too."""
        digest = self.storage.digest(self.root, self.paths, self.labels, sizes)
        if self.clips is None:
            return digest
        starts = ",".join(f"{start:.9g}" for start in self.clips.starts)
        return hashlib.sha256(f"{digest}\0{self.clips.attributes()}\0{starts}".encode()).hexdigest()

    def row_coordinates(self, positions: Sequence[int]) -> dict[str, np.ndarray]:
        """What a row records beside its path and label: a clip's start (seconds), for the rows at POSITIONS."""
        if self.clips is None:
            return {}
        return self.clips.coordinates(positions)

    def row_key(self, position: int) -> str:
        """How the row at POSITION is named to its user: its path, and a clip's start ("film.mp4 @ 1.5 s")."""
        path = self.paths[position]
        return path if self.clips is None else f"{path} @ {self.clips.starts[position]:.6g} s"

    def groups(self) -> list[int] | None:
        """The first position of each group that one process should read whole (a tar), or None."""
        return self.storage.groups()

    def left_out(self) -> dict[str, int]:
        """What the listing found beside the images and left out (tar members that are no image), by suffix."""
        return self.storage.left_out()

    def select(self, positions: Sequence[int], labels: Sequence[int] | None = None,
               classes: Sequence[str] | None = None) -> ImageList:
        """The images at POSITIONS, in that order (relabelled by LABELS and CLASSES when given)."""
        positions = list(positions)
        return ImageList(self.root, tuple(self.paths[p] for p in positions),
                         tuple(labels) if labels is not None else tuple(self.labels[p] for p in positions),
                         tuple(classes) if classes is not None else self.classes, self.storage.select(positions),
                         self.listing, self.clips.select(positions) if self.clips is not None else None)

    def part(self, start: int, stop: int) -> ImageList:
        """Images START..STOP-1 (a shard), labelled against the whole list's classes."""
        return self.select(range(start, min(stop, len(self))))
