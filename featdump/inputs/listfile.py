"""List files: the images a .txt or .csv file names, in its order, read from its text (`inputs.readers` opens the
list, here or at a URL, and reads its entries where they lie)."""

from __future__ import annotations

import csv
from pathlib import PurePosixPath
from typing import TextIO

from featdump.errors import NoImages

LIST_SUFFIXES = (".txt", ".csv")


def list_entries(handle: TextIO, name: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(paths, labels) the list NAME names, read from HANDLE: .txt, one path per line (blank lines and lines
    starting with # ignored), or .csv with a `path` column and an optional integer `label` column (-1 without)."""
    suffix = PurePosixPath(name).suffix.lower()
    if suffix == ".txt":
        entries = [(line.rstrip("\r\n"), -1) for line in handle]
        entries = [(path, label) for path, label in entries if path.strip() and not path.startswith("#")]
    else:
        entries = _csv_entries(name, handle)
    if not entries:
        raise NoImages(f"The list {name!r} names no image.")
    return tuple(path for path, _ in entries), tuple(label for _, label in entries)


def check_list_name(name: str, named: str = "IMAGES") -> None:
    """NoImages when the file NAME is no list (.txt or .csv)."""
    if PurePosixPath(name).suffix.lower() not in LIST_SUFFIXES:
        raise NoImages(f"{name!r} is a file: {named} must be a folder, a .txt list or a .csv list.")


def _csv_entries(name: str, handle: TextIO) -> list[tuple[str, int]]:
    reader = csv.DictReader(handle)
    if not reader.fieldnames or "path" not in reader.fieldnames:
        columns = ", ".join(reader.fieldnames or [])
        raise NoImages(f"The CSV list {name!r} needs a 'path' column (it has: {columns}).")
    entries = []
    for line, row in enumerate(reader, start=2):
        label = (row.get("label") or "").strip()
        if label and not label.lstrip("-").isdigit():
            raise NoImages(f"{name}, line {line}: label {label!r} is not an integer.")
        if row["path"]:
            entries.append((row["path"], int(label) if label else -1))
    return entries
