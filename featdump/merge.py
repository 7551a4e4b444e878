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
    write_rows,
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
    file. Paths, labels, file stats and skipped images are joined in order; attributes say what was merged.
    Shards are opened one at a time (thousands of them stay within the open-file limit)."""
    output = Path(output)
    shards = find_shards(output, pattern)
    summaries = [_summary(index, path) for index, path in enumerate(shards)]
    fingerprint = _common_fingerprint(shards, summaries)
    lock = OutputLock.acquire(output, overwrite)
    try:
        partial = partial_path(output)
        with h5py.File(partial, "w", locking=lock.hdf5_locking) as merged:
            _write_merged(merged, output, shards, summaries, fingerprint, copy)
        fsync_path(partial)
        os.replace(partial, output)
        fsync_path(output.parent)
    finally:
        lock.release()
    return output


def _summary(index: int, path: Path) -> dict:
    """What merging needs of one shard without keeping it open: attributes, counts, feature shapes."""
    with h5py.File(path, "r") as h5file:
        attrs = dict(h5file.attrs)
        if attrs.get("format") != FORMAT or not attrs.get("complete", False):
            raise ShardProblem(f"Shard {index} ({path}) is not a finished featdump output of this version.")
        features = {name: (dataset.shape[1:], dataset.dtype, dataset.chunks, dataset.compression)
                    for name, dataset in h5file["features"].items()}
        classes = h5file["labels"].attrs["classes"]
    rows, _, skipped = (int(value) for value in attrs["committed"])
    return {"attrs": attrs, "rows": rows, "skipped": skipped, "features": features, "classes": classes}


def _common_fingerprint(paths: list[Path], summaries: list[dict]) -> dict:
    first = None
    for index, (path, summary) in enumerate(zip(paths, summaries)):
        stored = json.loads(summary["attrs"]["fingerprint"])
        mine = {key: value for key, value in stored.items() if key not in SHARD_KEYS}
        if first is None:
            first = mine
            continue
        differences = describe_differences(first, mine)
        if differences:
            raise ShardProblem(f"Shard {index} ({path}) was made differently from shard 0 ({'; '.join(differences)}); "
                               "run every task with the same command.")
    return first


def _write_merged(merged: h5py.File, output: Path, shards: list[Path], summaries: list[dict], fingerprint: dict,
                  copy: bool) -> None:
    rows = [summary["rows"] for summary in summaries]
    skipped = [summary["skipped"] for summary in summaries]
    for key, value in summaries[0]["attrs"].items():
        if key not in ("committed", "fingerprint", "complete", "command", "created"):
            merged.attrs[key] = value
    merged.attrs["format"] = FORMAT
    merged.attrs["fingerprint"] = json.dumps({**fingerprint, "shards": len(shards)}, sort_keys=True)
    merged.attrs["merged_from"] = np.array([os.path.relpath(path, output.parent) for path in shards], dtype=STRING)
    merged.attrs["commands"] = np.array([str(summary["attrs"].get("command", "")) for summary in summaries],
                                        dtype=STRING)
    merged.attrs["virtual"] = not copy
    features = merged.create_group("features")
    for name, (shape, dtype, chunks, compression) in summaries[0]["features"].items():
        if copy:  # gzip and lzf kept; a plugin filter's file is copied uncompressed
            features.create_dataset(name, shape=(sum(rows), *shape), maxshape=(None, *shape), dtype=dtype,
                                    chunks=chunks, compression=compression if compression in ("gzip", "lzf") else None)
        else:
            _virtual_rows(features, name, shape, dtype, shards, output.parent, rows)
    create_path_datasets(merged, 4096)
    merged.create_dataset("labels", shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(4096,))
    merged["labels"].attrs["classes"] = summaries[0]["classes"]
    merged.create_dataset("file_stats", shape=(0, 2), maxshape=(None, 2), dtype=np.int64, chunks=(2048, 2))
    skipped_group = merged.create_group("skipped")
    create_path_datasets(skipped_group, 256)
    skipped_group.create_dataset("reasons", shape=(0,), maxshape=(None,), dtype=STRING, chunks=(256,))
    for index, path in enumerate(shards):  # one shard open at a time
        with h5py.File(path, "r") as shard:
            _append_shard(merged, shard, sum(rows[:index]), rows[index], sum(skipped[:index]), skipped[index], copy)
    merged.attrs["committed"] = np.array([sum(rows), sum(rows) + sum(skipped), sum(skipped)], dtype=np.int64)
    merged.attrs["complete"] = True


def _append_shard(merged: h5py.File, shard: h5py.File, row: int, rows: int, skip: int, skipped: int,
                  copy: bool) -> None:
    """One shard's rows (and skipped images) at their place in MERGED; its features too when COPY."""
    if rows:
        if copy:
            for name, target in merged["features"].items():
                for start in range(0, rows, _COPY_ROWS):
                    stop = min(start + _COPY_ROWS, rows)
                    target[row + start:row + stop] = shard["features"][name][start:stop]
        write_paths(merged, "", row, [os.fsdecode(raw) for raw in raw_paths(shard)[:rows]])
        write_rows(merged["labels"], row, row + rows, shard["labels"][:rows])
        write_rows(merged["file_stats"], row, row + rows, shard["file_stats"][:rows])
    if skipped:
        write_paths(merged, "skipped/", skip, [os.fsdecode(raw) for raw in raw_paths(shard, "skipped/")[:skipped]])
        write_rows(merged["skipped/reasons"], skip, skip + skipped,
                   np.array(shard["skipped/reasons"].asstr()[:skipped], dtype=object))


def _virtual_rows(group: h5py.Group, name: str, shape: tuple, dtype, shards: list[Path], folder: Path,
                  rows: list[int]) -> None:
    """GROUP/NAME as a virtual dataset: shard k's rows at their place, read from the shard file (a relative
    name, so the merged file and its shards can move together)."""
    layout = h5py.VirtualLayout(shape=(sum(rows), *shape), dtype=dtype)
    offset = 0
    for path, count in zip(shards, rows):
        if count:
            source = h5py.VirtualSource(os.path.relpath(path, folder), f"features/{name}", shape=(count, *shape))
            layout[offset:offset + count] = source
        offset += count
    group.create_virtual_dataset(name, layout)


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
