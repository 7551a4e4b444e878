"""Folder input: every image under a folder, in sorted order of relative path, ImageFolder-style labels."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from featdump.errors import NoImages
from featdump.inputs.imagelist import Files, ImageList
from featdump.inputs.listings import Walk, keep_walk, kept_walk
from featdump.inputs.video import VIDEO_SUFFIXES, is_video_name

LISTING_EVERY = 10.0  # seconds between the lines of a long folder walk
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"})
log = logging.getLogger("featdump")


def read_folder(root: Path, fresh: bool = False) -> ImageList:
    """The images under ROOT (walked recursively, symlinks followed once; or as an earlier command's walk found
    them, where no folder under ROOT changed since and not FRESH: `listings`), or its videos when it holds no
    image; labels from first-level folders."""
    walk = None if fresh else kept_walk(root)
    if walk is None:
        started = time.time_ns()
        walk = _walk(root)
        keep_walk(root, walk, started)
    images, videos = walk.images, walk.videos
    found = images or videos
    paths = sorted(found)
    warn_videos_left_out(str(root), len(images), sorted(videos))
    if not paths:
        extensions = ", ".join(sorted(ext.lstrip(".") for ext in IMAGE_EXTENSIONS))
        videos = ", ".join(sorted(ext.lstrip(".") for ext in VIDEO_SUFFIXES))
        tars = sorted(root.glob("*.tar"))
        hint = f" It holds {len(tars)} .tar files: for tar shards, pass '{root / '*.tar'}' (quoted)." if tars else ""
        arrays = sorted(path.name for path in root.iterdir() if path.is_file() and path.suffix.lower() in
                        (".h5", ".hdf5", ".hdf", ".nc", ".npy", ".npz"))
        if arrays:  # a study's stimuli kept as an array (NSD's nsd_stimuli.hdf5): the file is IMAGES
            hint += f" It holds {', '.join(arrays[:3])}: for images kept as an array, pass the file itself."
        hint += _arrow_hint(root)
        raise NoImages(f"No images in {str(root)!r} (looked for {extensions}, in any case, in all subfolders; and "
                       f"for videos: {videos}).{hint}")
    labels, classes = class_labels(paths)
    return ImageList(root, tuple(paths), labels, classes, Files(np.array([found[path] for path in paths],
                                                                          dtype=np.int64)))


def _arrow_hint(root: Path) -> str:
    """A hint for a folder holding what `datasets`' save_to_disk wrote deeper down (Arrow files): the folder it
    wrote is read as a saved dataset."""
    saved = sorted({path.parent for path in root.rglob("*.arrow")})[:2]
    if not saved:
        return ""
    return (f" It holds Arrow files in {', '.join(repr(str(folder)) for folder in saved)}, as Hugging Face's "
            "Dataset.save_to_disk writes: pass the folder save_to_disk wrote (the one holding state.json, or a "
            "DatasetDict's dataset_dict.json).")


def class_labels(paths: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(each path's label, the classes) as ImageFolder gives them: the classes are the first-level folders, sorted,
    when every path lies in one; else no class, every label -1."""
    in_class_folders = all("/" in path for path in paths)
    classes = sorted({path.split("/", 1)[0] for path in paths}) if in_class_folders else []
    index = {name: i for i, name in enumerate(classes)}
    return tuple(index[path.split("/", 1)[0]] if in_class_folders else -1 for path in paths), tuple(classes)


def images_or_videos(names: list[str], where: str) -> list[int]:
    """The positions of the rows of NAMES (found at WHERE): its images, or its videos where it holds no image; the
    others are left out, and said."""
    images = [position for position, name in enumerate(names) if not is_video_name(name)]
    videos = [position for position, name in enumerate(names) if is_video_name(name)]
    warn_videos_left_out(where, len(images), [names[position] for position in videos])
    return images or videos


def warn_videos_left_out(where: str, images: int, videos: list[str]) -> None:
    if images and videos:
        log.warning("%s: %d images and %d videos (%s, ...): the images are the rows, the videos are left out; give "
                    "the videos as a folder (or list, tars, prefix) of their own.", where, images, len(videos),
                    videos[0])


def _walk(root: Path, every_seconds: float = LISTING_EVERY) -> Walk:
    """The images and videos under ROOT, found in one walk, as {POSIX path relative to it: (size, mtime_ns)}: each
    file stat'ed once, here, for the whole command (its fingerprint, its update's staleness); one that cannot be
    stat'ed (a dangling link) is listed with (-1, -1), to be skipped when read; and the folders walked, with their
    times. A walk that takes longer than EVERY_SECONDS says how far it got, every EVERY_SECONDS (a million files on
    a cold disk take minutes)."""
    images, videos, folders = {}, {}, {}
    started = said = time.monotonic()
    for folder, name in _files(root, folders):
        suffix = os.path.splitext(name)[1].lower()
        kept = images if suffix in IMAGE_EXTENSIONS else videos if suffix in VIDEO_SUFFIXES else None
        if kept is not None:
            kept[(folder / name).as_posix()] = _stat_of(os.path.join(root, folder, name))
        if len(images) % 1024 == 0 and time.monotonic() - said >= every_seconds:
            said = time.monotonic()
            log.info("Listing %s: %d images found so far (%.0f s), in %s.", root, len(images), said - started, folder)
    if said > started:
        log.info("Listed %s: %d images in %.0f s.", root, len(images), time.monotonic() - started)
    return Walk(images, videos, folders)


def _stat_of(path: str) -> tuple[int, int]:
    try:
        found = os.stat(path)
    except OSError:
        return -1, -1
    return found.st_size, found.st_mtime_ns


def _files(root: Path, folders: dict):
    """(folder relative to ROOT, file name) of every file under ROOT; FOLDERS gets each folder walked and its
    time (mtime_ns)."""
    seen_folders = set()

    def unreadable(error: OSError) -> None:
        log.warning("Cannot read folder %s (%s); its images are left out.", error.filename, error.strerror)
        folders[os.path.relpath(error.filename, root)] = -1  # no time it can have: a kept listing never serves

    for folder, subfolders, files in os.walk(root, followlinks=True, onerror=unreadable):
        real = os.path.realpath(folder)
        if real in seen_folders:  # a symlink loop or a folder linked twice
            subfolders.clear()
            continue
        seen_folders.add(real)
        subfolders.sort()
        relative_folder = Path(folder).relative_to(root)
        with contextlib.suppress(OSError):  # gone since: the walk finds nothing in it either
            folders[relative_folder.as_posix()] = os.stat(folder).st_mtime_ns
        for name in files:
            yield relative_folder, name
