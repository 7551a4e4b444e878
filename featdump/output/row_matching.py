"""Which stored row is which listed image, for an `--update`: each stored row's position in the listing (a list
that grew at its end matched without a table of paths), and the listed images no row holds yet."""

from __future__ import annotations

import os

import numpy as np

from featdump.inputs import ImageList
from featdump.output.layout import occurrences


def positions_of_rows(stored: list[bytes], images: ImageList) -> np.ndarray:
    """The position in IMAGES of each row of STORED (its path's exact bytes; the k-th row of a path: its k-th
    image), -1 where there is none. Rows that are the list's first ones, in order (a list that grew at its end), are
    matched without a table of paths."""
    count = len(stored)
    if count <= len(images) and same_paths(stored, images.paths):
        return np.arange(count, dtype=np.int64)
    present: dict[str, list[int]] = {}
    for position, path in enumerate(images.paths):
        present.setdefault(path, []).append(position)
    paths = [os.fsdecode(name) for name in stored]
    return np.array([present[path][k] if k < len(present.get(path, ())) else -1
                     for path, k in zip(paths, occurrences(paths))], dtype=np.int64)


def same_paths(stored: list[bytes], paths: tuple[str, ...], block: int = 65536) -> bool:
    """Whether STORED are the first of PATHS, in order: compared a block at a time as one joined string each (no
    path holds a NUL), not a call a row."""
    for first in range(0, len(stored), block):
        if b"\0".join(stored[first:first + block]) != os.fsencode("\0".join(paths[first:first + block])):
            return False
    return True


def is_prefix(positions: np.ndarray) -> bool:
    """Whether POSITIONS are 0, 1, 2, ... (the stored rows are the list's first ones, in order)."""
    return bool(np.array_equal(positions, np.arange(len(positions))))


def unknown_positions(images: ImageList, stored: list[bytes], positions: np.ndarray, skipped: set[str],
                       again: set[tuple[str, float | None]]) -> list[int]:
    """The positions of IMAGES whose path is neither a stored row's (STORED, matched at POSITIONS) nor a kept
    skipped input's (SKIPPED), and the clips AGAIN names by (path, onset). When the stored rows are the list's
    first ones (a list that grew at its end), only the rest is looked at."""
    starts = images.clips.starts if images.clips is not None else None
    if not again and len(stored) == len(positions) and is_prefix(positions):
        tail = images.paths[len(stored):]
        known = {os.fsdecode(name) for name in {os.fsencode(path) for path in tail}.intersection(stored)} | skipped
        return [len(stored) + offset for offset, path in enumerate(tail) if path not in known]
    known = {os.fsdecode(name) for name in stored} | skipped
    return [position for position, path in enumerate(images.paths)
            if path not in known or (starts is not None and (path, starts[position]) in again)]
