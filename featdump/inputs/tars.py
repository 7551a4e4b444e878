"""Tar input: the samples of webdataset-style tar shards (one .tar, a brace pattern, a glob, or a list of tars), in
tar order, shard after shard, read straight from the tars and never unpacked.

A sample is the consecutive members sharing a key (the member name up to the first dot of its last component:
`a/b.seg.png` has key `a/b`); each of its members with an image extension is a row (the frames of a sequence,
`clip/frame.0000.jpg` ... `clip/frame.0003.jpg`, are four rows), all labelled with the integer in the sample's
`.cls` member (else -1); every other member is left out, and counted. The tars' headers are read once, when the
job lists its images (tarfile seeks over the data); the loader's workers then read each image's bytes with one
pread at its offset. A corrupt or truncated tar keeps the members before the damage; the rest becomes one skipped
entry, `TAR@OFFSET`, whose reason says what was found there.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featdump.errors import NoImages
from featdump.inputs.folder import images_or_videos
from featdump.inputs.imagelist import (
    ROW_VERSION,
    Encoded,
    ImageList,
    Storage,
    Window,
    changed_on_reading,
    content_digest,
    hash_lines,
)
from featdump.inputs.tar_names import TAR_SUFFIX
from featdump.inputs.tar_scan import ROW_SUFFIXES, DamagedTar, TarScan, scan_tar
from featdump.inputs.video import is_video_name
from featdump.locations import Location

_OPEN_TARS = 32  # tar files a process keeps open to read from
log = logging.getLogger("featdump")


# -- which tars IMAGES names -----------------------------------------------------------------------


@dataclass(frozen=True)
class TarShard:
    """One tar file as the job listed it."""

    name: str  # POSIX path relative to the shards' common folder
    size: int
    mtime_ns: int


# -- the image list ---------------------------------------------------------------------------------------


def read_tars(paths: Sequence[Path]) -> ImageList:
    """The samples of the tars PATHS, in order, as an ImageList (paths TAR/MEMBER relative to the tars' common
    folder); NoImages when they hold no image."""
    absolute = [Path(os.path.abspath(path)) for path in paths]
    root = Path(os.path.commonpath([str(path.parent) for path in absolute]))
    shards, scans = [], []
    for path in absolute:
        found = os.stat(path)
        shards.append(TarShard(path.relative_to(root).as_posix(), found.st_size, found.st_mtime_ns))
        try:
            scans.append(scan_tar(path))
        except OSError as error:  # unreadable (permissions, an I/O error): one skipped entry, like a bad image
            scans.append(TarScan(damage=(0, f"cannot be read ({error.strerror or error})")))
    return tar_image_list(root, shards, scans, str(paths[0]), TarMembers)


def tar_image_list(root: Path | str, shards: list[TarShard], scans: list[TarScan], first: str, storage) -> ImageList:
    """The ImageList of the tars SHARDS under ROOT as SCANS found them, read by STORAGE (a TarMembers class)."""
    names, labels, tar_of, offsets, sizes, damage = [], [], [], [], [], {}
    ignored, without_image, left_out = collections.Counter(), 0, []
    for index, (shard, scan) in enumerate(zip(shards, scans)):
        path = Location.of(root).join(shard.name)
        for member, offset, size, label in scan.images:
            names.append(f"{shard.name}/{member}")
            labels.append(label)
            tar_of.append(index)
            offsets.append(offset)
            sizes.append(size)
        if scan.damage is not None:
            offset, reason = scan.damage
            log.warning("Tar %s is damaged at byte %d (%s): its %d images before that are read, the rest is recorded "
                        "as one skipped entry.", path, offset, reason, len(scan.images))
            names.append(f"{shard.name}@{offset}")
            labels.append(-1)
            tar_of.append(index)
            offsets.append(offset)
            sizes.append(-1)
            damage[(index, offset)] = reason
        ignored.update(scan.ignored)
        left_out += [(index, suffix, count) for suffix, count in sorted(scan.ignored.items())]
        without_image += scan.without_image
    _log_left_out(ignored, without_image)
    members = [position for position, size in enumerate(sizes) if size >= 0]
    if not members and damage:  # nothing but damage: no tar at all (a junk file), refused before any model loads
        (index, offset), reason = next(iter(damage.items()))
        raise NoImages(f"No images in the {len(shards)} tar file{'s' * (len(shards) != 1)} from {first!r}: "
                       f"{Location.of(root).join(shards[index].name)} is damaged at byte {offset} ({reason}); is "
                       "it a tar?")
    kept = set(members[i] for i in images_or_videos([names[p] for p in members], f"The tars from {first!r}"))
    chosen = [position for position, size in enumerate(sizes) if size < 0 or position in kept]
    names, labels, tar_of, offsets, sizes = ([values[p] for p in chosen]
                                             for values in (names, labels, tar_of, offsets, sizes))
    if not names:
        raise NoImages(f"No images in the {len(shards)} tar files from {first!r} (looked for members named "
                       f"KEY.EXT with EXT one of {', '.join(sorted(ext.lstrip('.') for ext in ROW_SUFFIXES))}).")
    located = storage(tuple(shards), np.asarray(tar_of, np.int32), np.asarray(offsets, np.int64),
                      np.asarray(sizes, np.int64), damage, tuple(left_out))
    listing = {"tars": {shard.name: [shard.size, shard.mtime_ns] for shard in shards}, "row_version": ROW_VERSION}
    return ImageList(root, tuple(names), tuple(labels), (), located, listing)


def _log_left_out(ignored: collections.Counter, without_image: int) -> None:
    if without_image:
        log.info("%d samples in the tars have no image member; they are left out.", without_image)
    if ignored:
        log.debug("Tar members left out: %s.", ", ".join(f"{count} {suffix}" for suffix, count in ignored.items()))


@dataclass(frozen=True)
class TarMembers(Storage):
    """Where each image of a tar list lies: its tar, the offset and size of its bytes (-1: a damaged tail)."""

    tars: tuple[TarShard, ...]
    tar: np.ndarray  # int32 per image: index into tars
    offset: np.ndarray  # int64 per image
    size: np.ndarray  # int64 per image; -1 for the entry standing for a damaged tail
    damage: dict[tuple[int, int], str]  # (tar, offset) -> reason
    members_left_out: tuple[tuple[int, str, int], ...] = ()  # (tar, suffix, count) of members that are no image

    def open(self, root: Path, relative: str, position: int) -> Encoded:
        tar, offset, size = int(self.tar[position]), int(self.offset[position]), int(self.size[position])
        if size < 0:
            raise DamagedTar(self.damage[(tar, offset)])
        shard = self.tars[tar]
        if is_video_name(relative):  # read where it lies, in the parts its clips need
            def read_at(start: int, count: int) -> bytes:
                return os.pread(_tar_descriptor(root / shard.name, shard), count, start)

            return Encoded(relative, (size, shard.mtime_ns), opener=lambda: Window(read_at, offset, size))
        data = os.pread(_tar_descriptor(root / shard.name, shard), size, offset)
        if len(data) != size:
            raise DamagedTar(f"{shard.name} ends before this member's bytes (truncated after it was listed)")
        return Encoded(relative, (size, content_digest(data)), data=data)

    def stat(self, root, relative: str, position: int) -> tuple[int, int] | None:
        """What the member records of itself now (its size and the digest of its bytes), read again; None when it
        cannot be read."""
        found = next(iter(self.open_as_ready(root, [relative], [position])))[1]
        return None if isinstance(found, Exception) else found.file_stat

    def stale(self, root, paths: Sequence[str], positions: np.ndarray, recorded: np.ndarray, listed: dict,
              suspects: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows gone: no longer listed. Rows changed: their bytes differ from the digest they recorded, read again
        only from tars whose size or time changed since the output LISTED them (a tar with members appended keeps
        its old ones) and the SUSPECTS (rows recorded stale). Outputs made before members recorded digests: a row
        changed when its tar did (what they recorded: the member's size and its tar's time)."""
        gone = positions < 0
        at = np.maximum(positions, 0)
        tars = self.tar[at] if len(self.tar) else np.zeros(len(positions), np.int32)
        times = np.array([shard.mtime_ns for shard in self.tars] or [0], dtype=np.int64)
        if listed.get("row_version") != ROW_VERSION:
            now = np.stack([self.size[at] if len(self.size) else np.zeros(len(at), np.int64), times[tars]], axis=1)
            return gone, ~gone & (recorded[:, 0] >= 0) & (now != recorded).any(axis=1)
        was = listed.get("tars", {})
        moved = np.array([was.get(shard.name) != [shard.size, shard.mtime_ns] for shard in self.tars] or [False])
        looked_at = np.flatnonzero(~gone & (recorded[:, 0] >= 0) & (moved[tars] | suspects))
        return gone, changed_on_reading(self, root, paths, positions, recorded, looked_at)

    def select(self, positions: Sequence[int]) -> TarMembers:
        chosen = np.asarray(positions, dtype=np.int64)
        return dataclasses.replace(self, tar=self.tar[chosen], offset=self.offset[chosen], size=self.size[chosen])

    def left_out(self) -> dict[str, int]:
        """Members of this list's tars that are not images, by suffix."""
        mine, counts = set(self.tar.tolist()), collections.Counter()
        for tar, suffix, count in self.members_left_out:
            if tar in mine:
                counts[suffix] += count
        return dict(counts)

    def digest(self, root: Path, paths: Sequence[str], labels: Sequence[int], sizes: bool) -> str:
        """A hash of the member paths and labels (and each tar's name, size and mtime: no stat per member)."""
        digest = hashlib.sha256()
        hash_lines(digest, (f"{relative}\0{label}\n" for relative, label in zip(paths, labels)))
        if sizes:
            for index in sorted(set(self.tar.tolist())):
                shard = self.tars[index]
                digest.update(f"tar\0{shard.name}\0{shard.size}\0{shard.mtime_ns}\n".encode("utf-8", "surrogateescape"))
        return digest.hexdigest()

    def groups(self) -> list[int] | None:
        if not len(self.tar):
            return []
        return [0, *(np.flatnonzero(np.diff(self.tar)) + 1).tolist()]


_descriptors: collections.OrderedDict[tuple, int] = collections.OrderedDict()


def _tar_descriptor(path: Path, shard: TarShard) -> int:
    """A read descriptor of PATH, kept open (the last few per process); DamagedTar if it changed since listed."""
    key = (str(path), shard.size, shard.mtime_ns, os.getpid())
    if key in _descriptors:
        _descriptors.move_to_end(key)
        return _descriptors[key]
    descriptor = os.open(path, os.O_RDONLY)
    found = os.fstat(descriptor)
    if (found.st_size, found.st_mtime_ns) != (shard.size, shard.mtime_ns):
        os.close(descriptor)
        raise DamagedTar(f"{shard.name} changed since the job listed it (size or modification time); run the job "
                         "again to list it afresh")
    _descriptors[key] = descriptor
    while len(_descriptors) > _OPEN_TARS:
        os.close(_descriptors.popitem(last=False)[1])
    return descriptor


def read_stored(root: Path | str, relative: str) -> bytes | None:
    """The bytes of row path RELATIVE (TAR/MEMBER, the member's name as the tar spells it, `./` and all) from
    its tar under ROOT (a folder or a URL), or None if it is not there."""
    for found in re.finditer(re.escape(TAR_SUFFIX) + "/", relative, re.IGNORECASE):
        tar, member_name = Location.of(root).join(relative[:found.start() + len(TAR_SUFFIX)]), relative[found.end():]
        try:
            with _open_tar(tar) as handle, tarfile.open(fileobj=handle, mode="r:") as archive:
                member = archive.extractfile(member_name)
                return member.read() if member is not None else None
        except (tarfile.TarError, KeyError, OSError):
            continue
    return None


def _open_tar(tar: Location):
    """A binary file of the tar at TAR (here, or at a URL: read ahead in blocks)."""
    from featdump.inputs.stores import filesystem, store_path

    return filesystem(tar.text).open(store_path(tar.text), "rb", block_size=1 << 22, cache_type="readahead")
