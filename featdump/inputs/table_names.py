"""Which IMAGES name Parquet tables, told before any is read: a name ending in .parquet or a dataset at hf://, a
folder holding tables and no image, a store prefix holding tables (`inputs.tables` reads them)."""

from __future__ import annotations

import os
from pathlib import Path

from featdump.inputs.stores import Patience, filesystem, store_path
from featdump.locations import Location

TABLE_SUFFIX = ".parquet"


def names_tables(source: str) -> bool:
    """Whether SOURCE (a path, a pattern or a URL) names Parquet files by its name: it ends in .parquet, or is a
    dataset at hf://."""
    return str(source).lower().endswith(TABLE_SUFFIX) or Location.of(source).protocol == "hf"


def folder_of_tables(path: Path) -> bool:
    """Whether PATH is a folder of Parquet tables: it holds some, directly or in folders (split folders,
    `default/{train,test}/0000.parquet`; a clone of a Hugging Face dataset, its tables under data/ beside
    README.md), and no image; hidden files and folders (.git, .ipynb_checkpoints) are passed by. The walk stops at
    the first image (a folder of images is told at once)."""
    if not path.is_dir():
        return False
    found = False
    for _, subfolders, files in os.walk(path):
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        for name in files:
            suffix = os.path.splitext(name)[1].lower()
            if suffix in _IMAGE_SUFFIXES and not name.startswith("."):
                return False
            found = found or (suffix == TABLE_SUFFIX and not name.startswith("."))
    return found


_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")


def prefix_of_tables(prefix: str, patience: Patience) -> bool:
    """Whether the store PREFIX (ending in /) holds Parquet files directly: one listing, within PATIENCE (a store
    that stays away stops the job as its listing of images would)."""
    if not prefix.endswith("/"):
        return False
    fs = filesystem(prefix, patience)
    fs.invalidate_cache()

    def listed() -> list[str]:
        try:
            return fs.ls(store_path(prefix), detail=False)
        except FileNotFoundError:
            return []

    return any(str(name).lower().endswith(TABLE_SUFFIX) for name in patience.call(listed, f"Listing {prefix}"))
