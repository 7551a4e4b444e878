"""Skipped inputs: what an output records of each input it could not use, and which of them an --update reads again.

/skipped holds one entry per skipped input: its path (`paths`, with `raw_paths`), why (`reasons`), the file's size
and modification time when it was read (`file_stats`, -1 where unknown) and, for a clip, its onset in seconds
(`clip_start`, NaN for a whole video). Files written before `file_stats` and `clip_start` existed lack them: their
entries read as unknown (never seen to change) and without onset.

An --update reads an entry again when its file changed since it was skipped (size or mtime), or every entry with
--retry-skipped; its new outcome (rows, or a fresh entry) replaces it. The skipped group is then rebuilt as a
hidden group and swapped in before the commit counters move (`replace`), so a kill leaves either the old list
with the old counters or the new list that `swapped_for` recognises (by the counters it was made for and the
update's token, which its staging file keeps: no later update mistakes it for its own).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import h5py
import numpy as np

from featdump.inputs.imagelist import UNKNOWN_STAT
from featdump.output import netcdf
from featdump.output.layout import (
    Committed,
    as_text,
    create_named_rows,
    raw_paths,
    write_paths,
    write_rows,
)

_NEXT = "skipped_next"  # the rebuilt list, until it replaces /skipped
_COMMITS = "commits"  # what the rebuilt list was made for: [rows, images, skipped] and the update's token


@dataclass(frozen=True)
class Skip:
    """One skipped input: its path, why, its file's (size, mtime_ns) when read, and a clip's onset (or None)."""

    path: str
    reason: str
    file_stat: tuple[int, int] = UNKNOWN_STAT
    onset: float | None = None

    @property
    def key(self) -> str:
        """How it is named to a user: its path, and a clip's onset ("film.mp4 @ 1.5 s")."""
        return self.path if self.onset is None else f"{self.path} @ {self.onset:.6g} s"


def write(h5file: h5py.File, start: int, skips: Sequence[Skip], group: str = "skipped") -> None:
    """SKIPS as entries START.. of GROUP (the file's /skipped)."""
    if not skips:
        return
    stop = start + len(skips)
    write_paths(h5file, group + "/", start, [skip.path for skip in skips])
    target = h5file[group]
    write_rows(target["reasons"], start, stop, np.array([as_text(skip.reason) for skip in skips], dtype=object))
    made = "file_stats" not in target
    write_rows(_stats(target), start, stop, np.array([skip.file_stat for skip in skips], dtype=np.int64))
    if "clip_start" in target or any(skip.onset is not None for skip in skips):  # a clip job's
        made = made or "clip_start" not in target
        onsets = np.array([math.nan if skip.onset is None else skip.onset for skip in skips], dtype=np.float64)
        write_rows(_onsets(target), start, stop, onsets)
    if made:  # named along the list's dimension, as its paths are
        netcdf.label_named_rows(target, "skipped")


def read(h5file: h5py.File, count: int | None = None, group: str = "skipped") -> list[Skip]:
    """The first COUNT entries of GROUP (all of them when None)."""
    held = h5file[group]
    count = len(held["paths"]) if count is None else count
    paths = [os.fsdecode(name) for name in raw_paths(h5file, group + "/")[:count]]
    reasons = held["reasons"].asstr()[:count]
    stats = held["file_stats"][:count] if "file_stats" in held else np.full((count, 2), -1, dtype=np.int64)
    onsets = held["clip_start"][:count] if "clip_start" in held else np.full(count, math.nan)
    return [Skip(path, str(reason), (int(size), int(mtime)), None if math.isnan(onset) else float(onset))
            for path, reason, (size, mtime), onset in zip(paths, reasons, stats, onsets)]


def to_retry(skips: Sequence[Skip], stat_now, every: bool) -> list[int]:
    """The indexes of SKIPS to read again: all when EVERY, else those whose file's stat now (STAT_NOW(path): (size,
    mtime_ns), or None when it is gone) differs from the one recorded (an unknown record never differs)."""
    if every:
        return list(range(len(skips)))
    return [index for index, skip in enumerate(skips) if changed(skip, stat_now(skip.path))]


def changed(skip: Skip, now: tuple[int, int] | None) -> bool:
    """Whether SKIP's file is there and differs from when it was skipped (an unknown record: never seen to)."""
    return now is not None and skip.file_stat != UNKNOWN_STAT and tuple(now) != skip.file_stat


def changed_under(h5file: h5py.File, root: str | None, count: int) -> list[Skip]:
    """Of the first COUNT entries, those whose file under ROOT (the job's image folder, when it is a local one) is
    there and changed since it was skipped: what an --update would read again."""
    if not root or not os.path.isdir(root):  # a URL is no folder here
        return []

    def stat_now(path: str) -> tuple[int, int] | None:
        try:
            found = os.stat(os.path.join(root, path))
        except OSError:
            return None
        return found.st_size, found.st_mtime_ns

    entries = read(h5file, count)
    return [entries[index] for index in to_retry(entries, stat_now, every=False)]


def replace(h5file: h5py.File, skips: Sequence[Skip], commits: Committed, token: str) -> None:
    """Rebuild /skipped as SKIPS for the counters COMMITS (stored after this, by the caller) of the update TOKEN
    names: written whole as a hidden group, then swapped in."""
    if _NEXT in h5file:
        del h5file[_NEXT]
    create_named_rows(h5file.create_group(_NEXT))
    write(h5file, 0, skips, _NEXT)
    h5file[_NEXT].attrs[_COMMITS] = json.dumps([commits.rows, commits.images, commits.skipped, token])
    h5file.flush()
    del h5file["skipped"]
    h5file.move(_NEXT, "skipped")
    h5file.flush()


def finish_swap(h5file: h5py.File) -> None:
    """After a kill during `replace`: a rebuilt list not yet swapped in is dropped (the old list still stands); one
    whose old list was already removed is moved into place."""
    if _NEXT not in h5file:
        return
    if "skipped" in h5file:
        del h5file[_NEXT]
    else:
        h5file.move(_NEXT, "skipped")


def swapped_for(h5file: h5py.File, commits: Committed, token: str) -> bool:
    """Whether /skipped is the list the update TOKEN names rebuilt for the counters COMMITS (a kill came before
    they were stored)."""
    recorded = h5file["skipped"].attrs.get(_COMMITS)
    return recorded is not None and json.loads(recorded) == [commits.rows, commits.images, commits.skipped, token]


def cut_to(h5file: h5py.File, count: int) -> None:
    """The per-entry records past COUNT dropped (a kill left more than the counters say)."""
    held = h5file["skipped"]
    for name in ("file_stats", "clip_start"):
        if name in held:
            held[name].resize(count, axis=0)


def _stats(group: h5py.Group) -> h5py.Dataset:
    """GROUP/file_stats, made when first needed (padded with unknowns for entries written before it)."""
    if "file_stats" not in group:
        group.create_dataset("file_stats", data=np.full((len(group["paths"]), 2), -1, dtype=np.int64),
                             maxshape=(None, 2), chunks=(256, 2))
    return group["file_stats"]


def _onsets(group: h5py.Group) -> h5py.Dataset:
    """GROUP/clip_start, made when first needed (NaN for entries written before it)."""
    if "clip_start" not in group:
        group.create_dataset("clip_start", data=np.full(len(group["paths"]), math.nan), maxshape=(None,),
                             chunks=(256,))
        group["clip_start"].attrs["units"] = "s"
    return group["clip_start"]
