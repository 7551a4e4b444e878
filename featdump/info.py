"""Info: a human-readable description of an output file, finished or partial."""

from __future__ import annotations

import json
from pathlib import Path

import h5py

from featdump.errors import NotAnOutput
from featdump.writer import partial_path


def _merged_lines(path: Path, attrs) -> list[str]:
    shards = [str(name) for name in attrs["merged_from"]]
    kind = "virtual datasets reading the shards" if attrs.get("virtual", False) else "a self-contained copy"
    lines = [f"merged:     {len(shards)} shards, {kind}"]
    if attrs.get("virtual", False):
        missing = [name for name in shards if not (path.parent / name).exists()]
        if missing:
            lines.append(f"  missing shard files (their rows read as zeros): {', '.join(missing)}")
    return lines


def _stale_lines(h5file: h5py.File) -> list[str]:
    if "stale" not in h5file or not len(h5file["stale/paths"]):
        return []
    stale = list(zip(h5file["stale/paths"].asstr()[:], h5file["stale/reasons"].asstr()[:]))
    lines = [f"stale:      {len(stale)} rows whose image disappeared or changed since it was read "
             "(kept; --overwrite recomputes)"]
    lines += [f"  {name}: {reason}" for name, reason in stale[:20]]
    if len(stale) > 20:
        lines.append(f"  ... and {len(stale) - 20} more (h5py: f['stale/paths'], f['stale/reasons'])")
    return lines


def describe_shards(output: Path) -> list[str]:
    """Lines on the shards of an OUTPUT not merged yet (none: no shard found)."""
    from featdump.merge import ShardProblem, find_shards

    try:
        find_shards(output)
        return [f"{output}: not merged yet; all shards are finished: run `featdump merge {output}`"]
    except ShardProblem as problem:
        if str(problem).startswith("No shards"):
            return []
        return [f"{output}: not merged yet. {problem}"]


def describe(output: Path) -> list[str]:
    """Lines saying what OUTPUT (or OUTPUT.partial) holds and how far its run got."""
    path = Path(output)
    if not path.exists() and partial_path(path).exists():
        path = partial_path(path)
    if not path.exists():
        shards = describe_shards(path)
        if shards:
            return shards
        raise NotAnOutput(f"No file {str(output)!r} (nor {str(partial_path(Path(output)))!r}, nor shards of it).")
    try:
        h5file = h5py.File(path, "r")
    except OSError as error:
        raise NotAnOutput(f"{str(path)!r} is not a readable HDF5 file ({error}).") from error
    with h5file:
        if "committed" not in h5file.attrs or "features" not in h5file:
            raise NotAnOutput(f"{str(path)!r} is an HDF5 file, but not one featdump wrote.")
        attrs = h5file.attrs
        complete = bool(attrs.get("complete", False))
        rows, images_done, skipped = (int(value) for value in attrs["committed"])
        lines = [
            f"file:       {path}",
            f"model:      {attrs.get('model')} (weights {attrs.get('weights')}, seed {attrs.get('seed')})",
            f"complete:   {'yes' if complete else 'no'}",
            f"rows:       {rows}",
        ]
        fingerprint = json.loads(attrs.get("fingerprint", "{}"))
        if "shard" in fingerprint:
            index, count = fingerprint["shard"]
            lines.append(f"shard:      {index} of {count} (0-based) of {fingerprint.get('all_image_count')} images; "
                         "`featdump merge` joins the shards")
        if "merged_from" in attrs:
            lines += _merged_lines(path, attrs)
        if attrs.get("updating", False):
            lines.append("update:     interrupted (or running): the rows shown are valid; run the same "
                         "--update command again to finish it")
        lines += _stale_lines(h5file)
        if not complete:
            total = json.loads(attrs.get("fingerprint", "{}")).get("image_count", "?")
            lines.append(f"progress:   {images_done} of {total} images done; "
                         "run the same extract command again to resume")
        lines.append("layers:")
        for name, dataset in h5file["features"].items():
            lines.append(f"  {name}: {tuple(dataset.shape[1:])} {dataset.dtype}")
        labels = h5file["labels"]
        classes = list(labels.attrs.get("classes", []))
        if classes:
            names = [c.decode() if isinstance(c, bytes) else str(c) for c in classes]
            lines.append(f"classes:    {len(names)} ({', '.join(names[:8])}{', ...' if len(names) > 8 else ''})")
        lines.append(f"skipped:    {skipped}")
        for index in range(min(skipped, 5)):
            lines.append(f"  {h5file['skipped/paths'].asstr()[index]}: {h5file['skipped/reasons'].asstr()[index]}")
        for key in ("preprocessing", "command", "featdump_version", "torch_version", "created"):
            if key in attrs:
                value = str(attrs[key]).replace("\n", " ")
                lines.append(f"{key + ':':<11} {value}")
    return lines
