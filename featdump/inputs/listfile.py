"""List file input: the images a .txt or .csv file names, in its order; the list, and any of its entries, may be
URLs (`inputs.objects.ListedURLs` reads those)."""

from __future__ import annotations

import csv
import io
from pathlib import Path, PurePosixPath

from featdump.errors import NoImages
from featdump.inputs.imagelist import ImageList
from featdump.inputs.objects import ListedURLs, check_access
from featdump.inputs.stores import Patience, fetch_all
from featdump.locations import Location

LIST_SUFFIXES = (".txt", ".csv")


def read_image_list(path: Path | str, named: str = "IMAGES", patience: Patience | None = None) -> ImageList:
    """The images a list file names, in its order: .txt, one path per line (blank lines and lines starting
    with # ignored), or .csv with a `path` column and an optional integer `label` column. Relative paths
    are relative to the list's folder; a listed file that is missing becomes a skipped image later. Entries may
    be URLs, and PATH itself may be one: their stores' access is checked before any work."""
    patience = patience or Patience()
    remote = Location.of(path).remote
    suffix = PurePosixPath(str(path)).suffix.lower()
    if suffix not in LIST_SUFFIXES:
        raise NoImages(f"{str(path)!r} is a file: {named} must be a folder, a .txt list or a .csv list.")
    with _list_text(path, patience) as handle:
        if suffix == ".txt":
            entries = [(line.rstrip("\r\n"), -1) for line in handle]
            entries = [(name, label) for name, label in entries if name.strip() and not name.startswith("#")]
        else:
            entries = _csv_entries(path, handle)
    if not entries:
        raise NoImages(f"The list {str(path)!r} names no image.")
    paths = tuple(name for name, _ in entries)
    labels = tuple(label for _, label in entries)
    urls = [name for name in paths if Location.of(name).remote]
    if not remote and not urls:
        return ImageList(path.parent, paths, labels, ())
    root = str(Location.of(str(path)).parent) if remote else path.parent
    check_access(urls or [str(Location.of(str(root)).join(paths[0]))], patience)
    return ImageList(root, paths, labels, (), ListedURLs(patience))


def _list_text(path: Path | str, patience: Patience):
    if not Location.of(path).remote:
        return open(path, newline="", encoding="utf-8", errors="surrogateescape")
    found = fetch_all([str(path)], patience)[0]
    if isinstance(found, BaseException):
        raise NoImages(f"The list {str(path)!r} cannot be read ({found}).")
    return io.StringIO(found.decode("utf-8", "surrogateescape"), newline="")


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


def one_object(url: str, patience: Patience) -> ImageList:
    """The single image at URL, read as a list naming it alone (relative to its folder, as a prefix's keys are)."""
    check_access([url], patience)
    return ImageList(str(Location.of(url).parent), (url.rsplit("/", 1)[1],), (-1,), (), ListedURLs(patience))
