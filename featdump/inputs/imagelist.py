"""ImageList: the ordered images of a job, whatever kind of input named them."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ImageList:
    """Every image under ROOT in sorted order of relative path, with ImageFolder-style labels."""

    root: Path  # the folder, or the list file's folder
    paths: tuple[str, ...]  # POSIX paths relative to root (sorted), or as a list file gives them
    labels: tuple[int, ...]  # index into classes, or -1 when images do not sit in class folders
    classes: tuple[str, ...]  # first-level folder names, sorted

    def __len__(self) -> int:
        return len(self.paths)

    def digest(self, sizes: bool = True) -> str:
        """A hash of the paths (and file sizes): changes when an image is added, removed (or replaced)."""
        digest = hashlib.sha256()
        for relative, label in zip(self.paths, self.labels):
            size = ""
            if sizes:
                try:
                    size = os.stat(self.root / relative).st_size
                except OSError:
                    size = -1
            digest.update(f"{relative}\0{size}\0{label}\n".encode("utf-8", "surrogateescape"))
        return digest.hexdigest()

    def part(self, start: int, stop: int) -> ImageList:
        """Images START..STOP-1 (a shard), labelled against the whole list's classes."""
        return ImageList(self.root, self.paths[start:stop], self.labels[start:stop], self.classes)
