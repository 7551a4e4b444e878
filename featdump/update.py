"""Update: which images a finished output lacks, and which of its rows went stale (--update, for cron)."""

from __future__ import annotations

import os

from featdump.data import ImageList
from featdump.writer import FeatureWriter


def plan_update(writer: FeatureWriter, images: ImageList) -> tuple[ImageList, list[tuple[str, str]]]:
    """The images of IMAGES that WRITER's file holds neither as rows nor as skipped images (labelled against
    its classes, new class folders appended), and its rows whose image disappeared or changed since."""
    known = writer.known_paths()
    classes = tuple(writer.classes)
    new = images.without(known, classes)
    return new, stale_rows(writer, images)


def stale_rows(writer: FeatureWriter, images: ImageList) -> list[tuple[str, str]]:
    """(path, why) for rows whose image is no longer in IMAGES, or whose size or modification time changed."""
    present = set(images.paths)
    stale = []
    for path, size, mtime in writer.row_files():
        if path not in present:
            stale.append((path, "disappeared"))
            continue
        try:
            found = os.stat(images.root / path)
        except OSError:
            stale.append((path, "disappeared"))
            continue
        if size >= 0 and (found.st_size, found.st_mtime_ns) != (size, mtime):
            stale.append((path, "changed"))
    return stale
