"""Inputs: the ordered list of images a job reads, from any kind of input: a folder (`inputs.folder`) or a
list file (`inputs.listfile`); each gives the same `ImageList` (paths, labels, classes, a digest)."""

from __future__ import annotations

from pathlib import Path

from featdump.errors import NoImages
from featdump.inputs.folder import IMAGE_EXTENSIONS, read_folder
from featdump.inputs.imagelist import ImageList
from featdump.inputs.listfile import read_image_list

__all__ = ["IMAGE_EXTENSIONS", "ImageList", "find_images"]


def find_images(root: Path) -> ImageList:
    """The images of ROOT: a folder walked recursively (following symlinks once), or a .txt/.csv list file;
    NoImages if there are none."""
    root = Path(root)
    if root.is_file():
        return read_image_list(root)
    if not root.is_dir():
        raise NoImages(f"Image folder {str(root)!r} does not exist or is not a folder.")
    return read_folder(root)
