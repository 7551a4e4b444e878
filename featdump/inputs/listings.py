"""Folder listings kept between commands: a walk's finds (each image's and video's path, size and modification
time) kept in the user's cache (`caches.user_cache`) with the modification time of every folder walked, and used
again while none of those folders has changed: a file added, removed or renamed anywhere under the root changes
its folder's time. A resume, a rerun of a finished command and the shards of an array job over a million files
then stat a folder each instead of every file.

What a folder's time does not show is a file rewritten in place under the same name: a kept listing holds the size
and time the file had, and `--update`, whose work is to find such files, always walks (`fresh`). A listing whose
folders changed within RACY_SECONDS before its walk started is not kept (a change in the same tick of the clock
would not show), nor one that cannot be written (a read-only home): either costs a walk next time, never a wrong
row. The last KEEP_AT_MOST listings written are kept, the older deleted."""

from __future__ import annotations

import hashlib
import logging
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featdump.caches import user_cache

log = logging.getLogger("featdump")
FORMAT = 1
RACY_SECONDS = 2.0
KEEP_AT_MOST = 64  # listings kept, the last written: a folder listed long ago is walked again


@dataclass
class Walk:
    """What a walk of a root found: images and videos as {path relative to it: (size, mtime_ns)}, and every folder
    it walked as {path relative to the root ('.' for itself): mtime_ns}."""

    images: dict
    videos: dict
    folders: dict


def kept_walk(root: Path) -> Walk | None:
    """The walk of ROOT kept by an earlier command, if every folder it walked still has the time it had."""
    try:
        with np.load(_place(root), allow_pickle=False) as held:
            if int(held["format"]) != FORMAT or _text(held["root"]) != [os.path.realpath(root)]:
                return None
            folders = dict(zip(_text(held["folders"]), held["folder_times"].tolist()))
            if any(_mtime_ns(root / folder) != when for folder, when in folders.items()):
                return None
            images = dict(zip(_text(held["images"]), map(tuple, held["image_stats"].tolist())))
            videos = dict(zip(_text(held["videos"]), map(tuple, held["video_stats"].tolist())))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):  # none, another version's, or damaged: walk
        return None
    log.debug("Listing of %s kept from an earlier command: %d images, none of its %d folders changed since (a file "
             "rewritten in place is found by --update).", root, len(images), len(folders))
    return Walk(images, videos, folders)


def keep_walk(root: Path, walk: Walk, started_ns: int) -> None:
    """Keep WALK of ROOT, begun at STARTED_NS (time.time_ns()), for later commands; nothing where a folder changed
    within RACY_SECONDS of its start or the cache cannot be written."""
    if any(when >= started_ns - RACY_SECONDS * 1e9 for when in walk.folders.values()):
        return
    place = _place(root)
    temporary = place.with_name(f".{place.stem}.{os.getpid()}.npz")
    try:
        place.parent.mkdir(parents=True, exist_ok=True)
        np.savez(temporary, format=FORMAT, root=_bytes([os.path.realpath(root)]),
                 folders=_bytes(list(walk.folders)), folder_times=np.array(list(walk.folders.values()), np.int64),
                 images=_bytes(list(walk.images)), image_stats=_stats(walk.images),
                 videos=_bytes(list(walk.videos)), video_stats=_stats(walk.videos))
        os.replace(temporary, place)
        _forget_oldest(place.parent)
    except OSError as error:
        log.debug("The listing of %s was not kept (%s).", root, error)
        temporary.unlink(missing_ok=True)


def _forget_oldest(folder: Path) -> None:
    """The listings in FOLDER beyond the KEEP_AT_MOST last written, deleted (a cache, not an archive)."""
    kept = sorted(folder.glob("*.npz"), key=lambda path: path.stat().st_mtime_ns, reverse=True)
    for path in kept[KEEP_AT_MOST:]:
        path.unlink(missing_ok=True)


def _place(root: Path) -> Path:
    key = hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()[:32]
    return user_cache("listings", f"{key}.npz")


def _mtime_ns(folder: Path) -> int | None:
    try:
        return os.stat(folder).st_mtime_ns
    except OSError:
        return None


def _bytes(names: list[str]) -> np.ndarray:
    """NAMES as one array of bytes, each ended by a NUL (no file name holds one); non-UTF-8 bytes kept as they are."""
    return np.frombuffer(b"".join(os.fsencode(name) + b"\0" for name in names), dtype=np.uint8)


def _text(held: np.ndarray) -> list[str]:
    return [os.fsdecode(name) for name in held.tobytes().split(b"\0")[:-1]]


def _stats(found: dict) -> np.ndarray:
    return np.array(list(found.values()), dtype=np.int64).reshape(-1, 2)
