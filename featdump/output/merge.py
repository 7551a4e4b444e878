"""Merge: N finished shards into one output that reads like a single run's (virtual datasets, or a copy)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import h5py
import numpy as np

from featdump.errors import NotAnOutput, ShardProblem
from featdump.output import fingerprint as fingerprints
from featdump.output import netcdf
from featdump.output import skipped as skips
from featdump.output.layout import (
    FORMAT,
    PROOF,
    STRING,
    UPGRADED,
    Committed,
    Output,
    copy_coordinates,
    create_layout,
    name_dimensions,
    open_to_read,
    partial_path,
    proofs_of,
    set_attribute,
    text_of,
    write_paths,
    write_rows,
)
from featdump.output.lock import OutputLock
from featdump.output.shard_files import shard_count, shard_path
from featdump.output.space import check_space, human_bytes
from featdump.output.specs import DatasetSpec
from featdump.output.writer import close_quietly, publish, write_error

log = logging.getLogger("featdump")
_COPY_ROWS = 1024
VIEW_FROM_BYTES = 64 * 2**20  # a shard's rows, on average, from which a view reads near one file's rate (view_rate.py)
_NOT_COPIED = ("committed", "fingerprint", "complete", "command", "created", "format")


def find_shards(output: Path, pattern: str | None = None) -> list[Path]:
    """The N shard files of OUTPUT (N read from their names), in order; ShardProblem naming any that is not done."""
    output = Path(output)
    count = shard_count(output, pattern)
    paths = [shard_path(output, index, count, pattern) for index in range(count)]
    problems = [problem for index, path in enumerate(paths) if (problem := _shard_problem(index, count, path))]
    if problems:
        raise ShardProblem(f"Cannot merge {str(output)!r}: " + "; ".join(problems) + ".")
    return paths


def _shard_problem(index: int, count: int, path: Path) -> str | None:
    if path.exists():
        return None
    partial = partial_path(path)
    if partial.exists():
        try:
            with Output.open(partial, locking=False) as unfinished:
                done = unfinished.committed.images
                total = unfinished.fingerprint.get("image_count", "?")
            progress = f", {done} of {total} images done"
        except (NotAnOutput, KeyError, ValueError):
            progress = ""
        return f"shard {index} of {count} is incomplete ({partial}{progress}): run its task again to finish it"
    return f"shard {index} of {count} is missing ({path}): run its task"


def merge_problem(output: Path, pattern: str | None = None) -> str | None:
    """Why `merge` would refuse OUTPUT's shards (not all finished, or made differently), or None: read-only."""
    try:
        shards = find_shards(output, pattern)
        _common_fingerprint(shards, [_summary(index, path) for index, path in enumerate(shards)])
    except ShardProblem as error:
        return str(error)
    return None


def merge(output: Path, pattern: str | None = None, copy: bool | None = None, overwrite: bool = False) -> Path:
    """Write OUTPUT over its finished shards: virtual datasets pointing into them, or (COPY) a self-contained
    file; COPY None: a copy of small shards (`copies_small_shards`), a view of others. Paths, labels, file stats
    and skipped images are joined in order; attributes say what was merged. Shards are opened one at a time
    (thousands of them stay within the open-file limit)."""
    output = Path(output)
    shards = find_shards(output, pattern)
    summaries = [_summary(index, path) for index, path in enumerate(shards)]
    fingerprint = _common_fingerprint(shards, summaries)
    needed = sum(summary["committed"].rows * DatasetSpec(shape, str(dtype)).row_bytes
                 for summary in summaries for shape, dtype, _, _ in summary["features"].values())
    packed = copy is None and copies_small_shards(output, needed, len(shards))
    if copy:
        check_space(output, needed, "The --copy of the shards", "merge without --copy (virtual datasets, no copy)")
    with OutputLock.acquire(output, overwrite or _replaced_freely(output)) as lock:
        partial = partial_path(output)
        try:
            merged = new_merged_file(partial, lock.hdf5_locking)
            try:
                _write_merged(merged, output, shards, summaries, fingerprint, bool(copy) or packed)
                merged.attrs["packed"] = packed
            finally:
                close_quietly(merged)
            publish(partial, output)
        except (OSError, RuntimeError) as error:  # a full disk (h5py says RuntimeError at times): one line
            partial.unlink(missing_ok=True)
            raise write_error(partial, error, None) from error
    return output


def new_merged_file(path: Path, locking: bool | None) -> h5py.File:
    """PATH created for a merge in HDF5's 1.8 format, which stores attributes past 64 KiB (10,000 shards' sizes
    alone take 80 KB; the old format's limit failed such a merge); netCDF-4 and every HDF5 reader since 2008 open
    it."""
    return h5py.File(path, "w", locking=locking, libver="v108")


def copies_small_shards(output: Path, needed: int, count: int) -> bool:
    """Whether a merge of COUNT shards holding NEEDED bytes of rows copies them into OUTPUT by itself: when they
    are small (a view opens a shard file for each shard's rows it reads, a few ms: a view of shards under
    VIEW_FROM_BYTES reads at under 0.8x one file's rate) and the copy fits beside OUTPUT."""
    each = needed / max(count, 1)
    if each >= VIEW_FROM_BYTES:
        return False
    free = shutil.disk_usage(output.resolve().parent).free
    if needed > free // 2:
        log.info("The shards hold %s of rows each, which a view reads slowly, but their copy (%s) would take over "
                 "half the free space (%s): merging as a view.", human_bytes(each), human_bytes(needed),
                 human_bytes(free))
        return False
    log.info("The shards hold %s of rows each: copied into one file, %s (a view over them would open a file for "
             "every %s it reads; `featdump merge --view` makes one).", human_bytes(each), human_bytes(needed),
             human_bytes(each))
    return True


def merged_view(output: Path) -> bool:
    """Whether the merged OUTPUT is a view over its shards (else it holds their rows)."""
    with open_to_read(output) as held:
        return bool(held.attrs.get("virtual", False))


def _replaced_freely(output: Path) -> bool:
    """Whether OUTPUT is a merge that merging again replaces without --overwrite: a view (no rows of its own) or a
    copy the merge chose (its shards are there, found finished)."""
    if not output.exists():
        return False
    try:  # plain h5py: a view whose shards have grown since is what is merged again
        with open_to_read(output) as held:
            return "merged_from" in held.attrs and bool(held.attrs.get("virtual", False) or
                                                          held.attrs.get("packed", False))
    except OSError:  # not an HDF5 file: not ours to replace
        return False


def _summary(index: int, path: Path) -> dict:
    """What merging needs of one shard without keeping it open: attributes, counts, feature shapes."""
    try:
        with Output.open(path) as shard:
            if text_of(shard.attrs.get("format")) not in (FORMAT, *UPGRADED) or not shard.complete:
                raise ShardProblem(f"Shard {index} ({path}) is not a finished featdump output of this version.")
            features = {name: (dataset.shape[1:], dataset.dtype, dataset.chunks, dataset.compression)
                        for name in shard.layers for dataset in [shard.features(name)]}
            layer_attrs = {name: netcdf.without_netcdf(shard.features(name).attrs) for name in shard.layers}
            return {"attrs": dict(shard.attrs), "committed": shard.committed, "features": features,
                    "layer_attrs": layer_attrs,
                    "classes": shard.file["labels"].attrs["classes"], "fingerprint": shard.fingerprint}
    except NotAnOutput as error:
        raise ShardProblem(f"Shard {index} cannot be read: {error}") from error


def _common_fingerprint(paths: list[Path], summaries: list[dict]) -> dict:
    return common_fingerprint([str(path) for path in paths], [summary["fingerprint"] for summary in summaries])


def common_fingerprint(names: list[str], held: list[dict]) -> dict:
    """The fingerprint the shards NAMES (held: theirs) have in common; ShardProblem naming the first that differs,
    and why: another listing of the images (the remedy: a frozen listing), or another command."""
    first = None
    for index, (name, fingerprint) in enumerate(zip(names, held)):
        mine = {key: value for key, value in fingerprint.items() if key not in fingerprints.SHARD_KEYS}
        if first is None:
            first = mine
            continue
        differences = fingerprints.describe_differences(first, mine)
        if differences:
            remedy = fingerprints.LISTING_REMEDY if fingerprints.listing_changed(first, mine) else \
                "run every task with the same command"
            raise ShardProblem(f"Shard {index} ({name}) was made differently from shard 0 ({'; '.join(differences)}); "
                               f"{remedy}.")
    return first


def _write_merged(merged: h5py.File, output: Path, shards: list[Path], summaries: list[dict], fingerprint: dict,
                  copy: bool) -> None:
    rows = [summary["committed"].rows for summary in summaries]
    skipped = [summary["committed"].skipped for summary in summaries]
    attributes = {key: value for key, value in summaries[0]["attrs"].items() if key not in _NOT_COPIED}

    def feature_datasets(features: h5py.Group) -> None:
        for name, (shape, dtype, chunks, compression) in summaries[0]["features"].items():
            if copy:  # gzip and lzf kept; a plugin filter's file is copied uncompressed
                features.create_dataset(name, shape=(sum(rows), *shape), maxshape=(None, *shape), dtype=dtype,
                                        chunks=chunks,
                                        compression=compression if compression in ("gzip", "lzf") else None)
            else:
                _virtual_rows(features, name, shape, dtype, shards, output.parent, rows)
            features[name].attrs.update(summaries[0]["layer_attrs"][name])  # layout, part, reduction, ...

    create_layout(merged, attributes, summaries[0]["classes"], feature_datasets)
    fingerprints.store(merged.attrs, {**fingerprint, "shards": len(shards)})
    set_attribute(merged, "merged_from", [os.path.relpath(path, output.parent) for path in shards])
    merged.attrs["commands"] = np.array([str(summary["attrs"].get("command", "")) for summary in summaries],
                                        dtype=STRING)
    merged.attrs["virtual"] = not copy
    merged.attrs[PROOF] = json.dumps([{**entry, "shard": index} for index, summary in enumerate(summaries)
                                      for entry in proofs_of(summary["attrs"])])  # each shard proved its own rows
    if not copy:  # what Output.open checks before a virtual view is read
        merged.attrs["merged_sizes"] = np.array([path.stat().st_size for path in shards], dtype=np.int64)
    with Output.open(shards[0]) as first:
        if "pca" in first.file:  # the PCA fits, the same in every shard (their fingerprints agree)
            first.file.copy(first.file["pca"], merged, "pca")
            netcdf.forget(merged["pca"])
    for index, path in enumerate(shards):  # one shard open at a time
        with Output.open(path) as shard:
            _append_shard(merged, shard, sum(rows[:index]), rows[index], sum(skipped[:index]), skipped[index], copy)
    name_dimensions(merged)
    Committed(sum(rows), sum(rows) + sum(skipped), sum(skipped)).store(merged)
    merged.attrs["complete"] = True


def _append_shard(merged: h5py.File, shard: Output, row: int, rows: int, skip: int, skipped: int,
                  copy: bool) -> None:
    """One shard's rows (and skipped images) at their place in MERGED; its features too when COPY."""
    if rows:
        if copy:
            for name in netcdf.layer_names(merged):
                target = merged["features"][name]
                for start in range(0, rows, _COPY_ROWS):
                    stop = min(start + _COPY_ROWS, rows)
                    target[row + start:row + stop] = shard.features(name)[start:stop]
        write_paths(merged, "", row, [os.fsdecode(raw) for raw in shard.raw_paths()])
        write_rows(merged["labels"], row, row + rows, shard.labels())
        write_rows(merged["file_stats"], row, row + rows, shard.file["file_stats"][:rows])
        copy_coordinates(merged, shard.file, row, rows)
    skips.write(merged, skip, skips.read(shard.file, skipped))


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
    # A shard file missing when read gives HDF5's fill value: NaN for features, never zeros that look like data.
    fill = np.nan if np.dtype(dtype).kind == "f" else 0
    group.create_virtual_dataset(name, layout, fillvalue=fill)
