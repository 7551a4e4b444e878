"""Which tars a text names: a .tar, a brace pattern (`shards/{00000..00099}.tar`) or a glob, checked before any
is opened (a compressed tar is refused naming how to unpack it; a list that names other files is refused)."""

from __future__ import annotations

import glob
import re
from collections.abc import Sequence
from pathlib import Path

from featdump.errors import NoImages

TAR_SUFFIX = ".tar"
_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")


def named_tars(images: Path) -> list[Path] | None:
    """The tar files IMAGES names (one .tar, a brace pattern, a glob), in order; None when it names none of
    these (a folder or a list file). NoImages when a pattern's tar is missing or matches no file."""
    text = str(images)
    if images.is_file() or images.is_dir():
        return [images] if images.is_file() and images.suffix.lower() == TAR_SUFFIX else None
    expanded = expand_braces(text)
    if len(expanded) == 1 and not glob.has_magic(text):
        return None  # a path that does not exist: the caller says so
    paths = [Path(found) for name in expanded
             for found in (sorted(glob.glob(name)) if glob.has_magic(name) else [name])]
    if not paths:
        raise NoImages(f"The pattern {text!r} matches no file.")
    return check_tar_names(paths, f"the pattern {text!r}")


_COMPRESSED = {".gz": "gzip", ".tgz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".lz4": "lz4"}


def check_not_compressed(path: Path) -> None:
    """NoImages, saying why and what to do, for a compressed tar (x.tar.gz, x.tgz, ...)."""
    kind = _COMPRESSED.get(path.suffix.lower())
    if kind is None or not (path.suffix.lower() == ".tgz" or path.stem.lower().endswith(TAR_SUFFIX)):
        return
    raise NoImages(f"{str(path)!r} is a {kind}-compressed tar, which featdump does not read: each image is read at "
                   "its offset in the tar (to decode in parallel, resume and split into shards), and a compressed "
                   "stream has no offsets. Decompress it to a plain .tar once (e.g. gunzip -k, zstd -d) and pass "
                   "that.")


def check_tar_names(paths: Sequence[Path], named_by: str) -> list[Path]:
    """PATHS, refused (NoImages) unless every one is an existing .tar file."""
    others = [str(path) for path in paths if path.suffix.lower() != TAR_SUFFIX]
    if others:
        raise NoImages(f"{named_by[0].upper() + named_by[1:]} names {others[0]!r}, which is not a .tar file: "
                       "IMAGES is a folder, a list file, or tar shards (a .tar, a quoted brace pattern or glob of "
                       "them, or a list of .tar files).")
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        verb = "is" if len(missing) == 1 else "are"
        raise NoImages(f"{named_by[0].upper() + named_by[1:]} names {len(paths)} tar files; {len(missing)} of them "
                       f"{verb} missing: {shown}. Nothing was read.")
    return list(paths)


def expand_braces(text: str) -> list[str]:
    """Bash-style brace expansion: `{00000..00099}` (zero-padded when either end is) and `{a,b,c}`, any number of
    them, left to right; braces holding neither are kept as they are."""
    for match in _BRACES.finditer(text):
        choices = _brace_choices(match[1])
        if choices is not None:
            head, tail = text[:match.start()], text[match.end():]
            return [expanded for choice in choices for expanded in expand_braces(head + choice + tail)]
    return [text]


def _brace_choices(body: str) -> list[str] | None:
    numeric = _RANGE.fullmatch(body)
    if numeric:
        first, last = int(numeric[1]), int(numeric[2])
        padded = any(len(end.lstrip("-")) > 1 and end.lstrip("-").startswith("0") for end in numeric.groups())
        width = max(len(numeric[1]), len(numeric[2])) if padded else 0
        step = 1 if last >= first else -1
        return [f"{value:0{width}d}" for value in range(first, last + step, step)]
    return body.split(",") if "," in body else None


# -- reading a tar's index -------------------------------------------------------------------------------
