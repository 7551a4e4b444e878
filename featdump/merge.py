"""Merge: N finished shards into one output that reads like a single run's (virtual datasets, or a copy)."""

from __future__ import annotations

import json
import logging
import os
import re
from datetime import timedelta
from pathlib import Path

import h5py
import numpy as np

from featdump.errors import FeatdumpError, UsageProblem
from featdump.shards import shard_path, shard_pattern
from featdump.writer import (
    FORMAT,
    STRING,
    OutputLock,
    create_path_datasets,
    describe_differences,
    fsync_path,
    partial_path,
    raw_paths,
    write_paths,
)

log = logging.getLogger("featdump")
SHARD_KEYS = ("shard", "images", "image_count")  # the fingerprint keys in which shards differ
_COPY_ROWS = 1024


class ShardProblem(UsageProblem):
    """A shard is missing, unfinished, or was made differently from the others."""


class RanksDidNotFinish(FeatdumpError):
    """Under torchrun, not every rank reached the merge in time."""


def find_shards(output: Path, pattern: str | None = None) -> list[Path]:
    """The N shard files of OUTPUT (N read from their names), in order; ShardProblem naming any that is not done."""
    output = Path(output)
    count = shard_count(output, pattern)
    paths = [shard_path(output, index, count, pattern) for index in range(count)]
    problems = [problem for index, path in enumerate(paths) if (problem := _shard_problem(index, count, path))]
    if problems:
        raise ShardProblem(f"Cannot merge {str(output)!r}: " + "; ".join(problems) + ".")
    return paths


def shard_count(output: Path, pattern: str | None = None) -> int:
    """N, from the names of OUTPUT's shard files (finished or partial); ShardProblem when there are none."""
    template = Path(shard_pattern(output, pattern))
    folder = output.parent / template.parent
    pieces = re.split(r"(\{k\}|\{n\})", template.name)
    name_regex = "".join({"{k}": r"(?P<k>\d+)", "{n}": r"(?P<n>\d+)"}.get(piece, re.escape(piece)) for piece in pieces)
    counts = set()
    for name in os.listdir(folder) if folder.is_dir() else []:
        match = re.fullmatch(name_regex, name.removesuffix(".partial"))
        if match:
            counts.add(int(match["n"]))
    if not counts:
        raise ShardProblem(f"No shards of {str(output)!r} found (looked for {template.name} in {str(folder)!r}); "
                           "run the sharded extract first.")
    if len(counts) > 1:
        raise ShardProblem(f"Shards of {str(output)!r} from runs with different shard counts ({sorted(counts)}) "
                           "lie side by side; remove the ones of the other run.")
    return counts.pop()


def _shard_problem(index: int, count: int, path: Path) -> str | None:
    if path.exists():
        return None
    partial = partial_path(path)
    if partial.exists():
        try:
            with h5py.File(partial, "r", locking=False) as h5file:
                done = int(h5file.attrs["committed"][1])
                total = json.loads(h5file.attrs["fingerprint"]).get("image_count", "?")
            progress = f", {done} of {total} images done"
        except (OSError, KeyError, ValueError):
            progress = ""
        return f"shard {index} of {count} is incomplete ({partial}{progress}): run its task again to finish it"
    return f"shard {index} of {count} is missing ({path}): run its task"


def merge(output: Path, pattern: str | None = None, copy: bool = False, overwrite: bool = False) -> Path:
    """Write OUTPUT over its finished shards: virtual datasets pointing into them, or (COPY) a self-contained
    file. Paths, labels, file stats and skipped images are joined in order; attributes say what was merged."""
    output = Path(output)
    shards = find_shards(output, pattern)
    lock = OutputLock.acquire(output, overwrite)
    try:
        with _open_all(shards) as files:
            fingerprint = _common_fingerprint(shards, files)
            partial = partial_path(output)
            with h5py.File(partial, "w", locking=lock.hdf5_locking) as merged:
                _write_merged(merged, output, shards, files, fingerprint, copy)
            fsync_path(partial)
            os.replace(partial, output)
            fsync_path(output.parent)
    finally:
        lock.release()
    return output


class _open_all:
    """Every shard open for reading, closed together."""

    def __init__(self, paths: list[Path]):
        self.paths, self.files = paths, []

    def __enter__(self) -> list[h5py.File]:
        try:
            for path in self.paths:
                self.files.append(h5py.File(path, "r"))
        except BaseException:
            self.__exit__()
            raise
        return self.files

    def __exit__(self, *exc_info) -> None:
        for h5file in self.files:
            h5file.close()


def _common_fingerprint(paths: list[Path], files: list[h5py.File]) -> dict:
    first = None
    for index, (path, h5file) in enumerate(zip(paths, files)):
        if h5file.attrs.get("format") != FORMAT or not h5file.attrs.get("complete", False):
            raise ShardProblem(f"Shard {index} ({path}) is not a finished featdump output of this version.")
        stored = json.loads(h5file.attrs["fingerprint"])
        mine = {key: value for key, value in stored.items() if key not in SHARD_KEYS}
        if first is None:
            first = mine
            continue
        differences = describe_differences(first, mine)
        if differences:
            raise ShardProblem(f"Shard {index} ({path}) was made differently from shard 0 ({'; '.join(differences)}); "
                               "run every task with the same command.")
    return first


def _write_merged(merged: h5py.File, output: Path, shards: list[Path], files: list[h5py.File], fingerprint: dict,
                  copy: bool) -> None:
    rows = [int(h5file.attrs["committed"][0]) for h5file in files]
    skipped = [int(h5file.attrs["committed"][2]) for h5file in files]
    for key, value in files[0].attrs.items():
        if key not in ("committed", "fingerprint", "complete", "command", "created"):
            merged.attrs[key] = value
    merged.attrs["format"] = FORMAT
    merged.attrs["fingerprint"] = json.dumps({**fingerprint, "shards": len(files)}, sort_keys=True)
    merged.attrs["merged_from"] = np.array([os.path.relpath(path, output.parent) for path in shards], dtype=STRING)
    merged.attrs["commands"] = np.array([h5file.attrs.get("command", "") for h5file in files], dtype=STRING)
    merged.attrs["virtual"] = not copy
    features = merged.create_group("features")
    for name, dataset in files[0]["features"].items():
        if copy:
            _copy_rows(features, name, [h5file["features"][name] for h5file in files], rows)
        else:
            _virtual_rows(features, name, dataset, shards, output.parent, rows)
    _join(merged, "", files, rows, "paths")
    _concatenate(merged, "labels", [h5file["labels"][: count] for h5file, count in zip(files, rows)])
    merged["labels"].attrs["classes"] = files[0]["labels"].attrs["classes"]
    _concatenate(merged, "file_stats", [h5file["file_stats"][: count] for h5file, count in zip(files, rows)])
    merged.create_group("skipped")
    _join(merged, "skipped/", files, skipped, "paths")
    reasons = [reason for h5file, count in zip(files, skipped) for reason in h5file["skipped/reasons"].asstr()[:count]]
    merged["skipped"].create_dataset("reasons", data=np.array(reasons, dtype=object), dtype=STRING,
                                     maxshape=(None,), chunks=(256,))
    merged.attrs["committed"] = np.array([sum(rows), sum(rows) + sum(skipped), sum(skipped)], dtype=np.int64)
    merged.attrs["complete"] = True


def _virtual_rows(group: h5py.Group, name: str, dataset: h5py.Dataset, shards: list[Path], folder: Path,
                  rows: list[int]) -> None:
    """GROUP/NAME as a virtual dataset: shard k's rows at their place, read from the shard file (a relative
    name, so the merged file and its shards can move together)."""
    layout = h5py.VirtualLayout(shape=(sum(rows), *dataset.shape[1:]), dtype=dataset.dtype)
    offset = 0
    for path, count in zip(shards, rows):
        if count:
            source = h5py.VirtualSource(os.path.relpath(path, folder), f"features/{name}",
                                        shape=(count, *dataset.shape[1:]))
            layout[offset:offset + count] = source
        offset += count
    group.create_virtual_dataset(name, layout)


def _copy_rows(group: h5py.Group, name: str, sources: list[h5py.Dataset], rows: list[int]) -> None:
    first = sources[0]
    target = group.create_dataset(name, shape=(sum(rows), *first.shape[1:]), maxshape=(None, *first.shape[1:]),
                                  dtype=first.dtype, chunks=first.chunks, compression=first.compression)
    offset = 0
    for source, count in zip(sources, rows):
        for start in range(0, count, _COPY_ROWS):
            stop = min(start + _COPY_ROWS, count)
            target[offset + start:offset + stop] = source[start:stop]
        offset += count


def _concatenate(merged: h5py.File, name: str, parts: list[np.ndarray]) -> None:
    values = np.concatenate(parts) if parts else np.zeros((0,))
    merged.create_dataset(name, data=values, maxshape=(None, *values.shape[1:]),
                          chunks=(4096, *values.shape[1:]) if len(values) else None)


def _join(merged: h5py.File, group: str, files: list[h5py.File], counts: list[int], name: str) -> None:
    """GROUP/paths (and raw_paths) of all shards in order."""
    create_path_datasets(merged[group] if group else merged, 4096 if not group else 256)
    offset = 0
    for h5file, count in zip(files, counts):
        if count:
            write_paths(merged, group, offset, [os.fsdecode(raw) for raw in raw_paths(h5file, group)[:count]])
        offset += count


def wait_for_all_ranks(timeout: float) -> None:
    """A barrier over torchrun's ranks (gloo, from its environment); RanksDidNotFinish naming the late ones."""
    import torch.distributed as dist

    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=timeout), wait_all_ranks=True)
    except RuntimeError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RanksDidNotFinish(
            f"Not every torchrun rank finished within {timeout:.0f} s ({first_line}). The finished shards are "
            "kept; rerun the job to finish the others, or run `featdump merge OUT` once they are done."
        ) from error
    finally:
        if started_here:
            dist.destroy_process_group()
