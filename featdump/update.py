"""Update: which images a finished output lacks, and which of its rows went stale (--update, for cron)."""

from __future__ import annotations

import os

from featdump.inputs import ImageList
from featdump.layout import Output, as_text


def plan_update(held: Output, images: ImageList) -> tuple[ImageList, list[tuple[str, str]]]:
    """The images of IMAGES that the output HELD has neither as rows nor as skipped images (labelled against
    its classes, new class folders appended), and its rows whose image disappeared or changed since."""
    return new_images(images, held.known_paths(), tuple(held.classes)), stale_rows(held, images)


def new_images(images: ImageList, known: set[str], classes: tuple[str, ...]) -> ImageList:
    """The images whose paths are not in KNOWN, labelled against CLASSES (as a file stores them: UTF-8 text)
    extended by any new class folder (appended, so that labels already written keep their meaning)."""
    kept = [(path, label) for path, label in zip(images.paths, images.labels) if path not in known]
    paths = tuple(path for path, _ in kept)
    if not images.classes:  # labels from a list file (or none): they stay as given
        return ImageList(images.root, paths, tuple(label for _, label in kept), tuple(classes))
    new_classes = sorted({as_text(images.classes[label]) for _, label in kept if label >= 0} - set(classes))
    classes = (*classes, *new_classes)
    index = {name: i for i, name in enumerate(classes)}
    labels = tuple(index[as_text(path.split("/", 1)[0])] for path in paths)
    return ImageList(images.root, paths, labels, classes)


def stale_rows(held: Output, images: ImageList) -> list[tuple[str, str]]:
    """(path, why) for rows whose image is no longer in IMAGES, or whose size or modification time changed."""
    present = set(images.paths)
    stale = []
    for path, size, mtime in held.row_files():
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
