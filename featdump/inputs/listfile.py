"""List file input: the images a .txt or .csv file names, in its order."""

from __future__ import annotations

import csv
from pathlib import Path

from featdump.errors import NoImages
from featdump.inputs.imagelist import ImageList


def read_image_list(path: Path, named: str = "IMAGES") -> ImageList:
    """The images a list file names, in its order: .txt, one path per line (blank lines and lines starting
    with # ignored), or .csv with a `path` column and an optional integer `label` column. Relative paths
    are relative to the list's folder; a listed file that is missing becomes a skipped image later."""
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".csv"):
        raise NoImages(f"{str(path)!r} is a file: {named} must be a folder, a .txt list or a .csv list.")
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as handle:
        if suffix == ".txt":
            entries = [(line.rstrip("\r\n"), -1) for line in handle]
            entries = [(name, label) for name, label in entries if name.strip() and not name.startswith("#")]
        else:
            entries = _csv_entries(path, handle)
    if not entries:
        raise NoImages(f"The list {str(path)!r} names no image.")
    paths = tuple(name for name, _ in entries)
    return ImageList(path.parent, paths, tuple(label for _, label in entries), ())


def _csv_entries(path: Path, handle) -> list[tuple[str, int]]:
    reader = csv.DictReader(handle)
    if not reader.fieldnames or "path" not in reader.fieldnames:
        columns = ", ".join(reader.fieldnames or [])
        raise NoImages(f"The CSV list {str(path)!r} needs a 'path' column (it has: {columns}).")
    entries = []
    for line, row in enumerate(reader, start=2):
        label = (row.get("label") or "").strip()
        if label and not label.lstrip("-").isdigit():
            raise NoImages(f"{path}, line {line}: label {label!r} is not an integer.")
        if row["path"]:
            entries.append((row["path"], int(label) if label else -1))
    return entries
