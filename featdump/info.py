"""Info: a human-readable description of an output file, finished or partial."""

from __future__ import annotations

import json
from pathlib import Path

import h5py

from featdump.errors import NotAnOutput
from featdump.writer import partial_path


def describe(output: Path) -> list[str]:
    """Lines saying what OUTPUT (or OUTPUT.partial) holds and how far its run got."""
    path = Path(output)
    if not path.exists() and partial_path(path).exists():
        path = partial_path(path)
    if not path.exists():
        raise NotAnOutput(f"No file {str(output)!r} (nor {str(partial_path(Path(output)))!r}).")
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
