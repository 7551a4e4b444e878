"""Splits of Parquet tables, as Hugging Face's `datasets` finds them: its shard names (`train-00000-of-00002`), a
split's word in a file's or folder's name (`train.parquet`, `default/validation/0000.parquet`), and the choice of
one (--split): files of several splits are never read into one output."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from featdump.errors import NoImages, UsageProblem

_SPLIT_FILE = re.compile(r"^(?P<split>[A-Za-z][\w.]*?)-\d{5}-of-\d{5}(-[0-9a-f]+)?\.parquet$", re.IGNORECASE)
# The words `datasets` takes for a split in a file's or folder's name (its data_files patterns), as that split.
SPLIT_WORDS = {"train": "train", "training": "train", "validation": "validation", "valid": "validation",
               "val": "validation", "dev": "validation", "test": "test", "testing": "test", "eval": "test",
               "evaluation": "test"}
_SPLIT_WORD = re.compile(r"(?:^|[-._ 0-9])(" + "|".join(sorted(SPLIT_WORDS, key=len, reverse=True)) +
                         r")(?=[-._ 0-9]|$)", re.IGNORECASE)


def split_of(path: str) -> str | None:
    """The split a Parquet file belongs to, as `datasets` finds it: Hugging Face's shard names
    (`train-00000-of-00002.parquet`), a split's word in the file's name (`train.parquet`, `my_test.parquet`,
    `training-2.parquet`) or in a folder's (`default/validation/0000.parquet`, `default/partial-train/0000.parquet`),
    the word as its split (`valid`, `val` and `dev`: validation; `eval`: test); else None."""
    parts = PurePosixPath(path).parts
    named = _SPLIT_FILE.match(parts[-1])
    if named:
        return SPLIT_WORDS.get(named["split"].lower(), named["split"])
    for name in (PurePosixPath(parts[-1]).stem, *(part.removeprefix("partial-") for part in reversed(parts[:-1]))):
        word = _SPLIT_WORD.search(name)
        if word:
            return SPLIT_WORDS[word.group(1).lower()]
    return None


def of_split(paths: list[str], split: str | None, source: str) -> list[str]:
    """The PATHS of SPLIT; without SPLIT, all of them where they hold one split (UsageProblem naming the splits
    where they hold several: a Hub dataset's folder holds train, validation and test)."""
    splits: dict[str, int] = {}
    for path in paths:
        found = split_of(path)
        if found is not None:
            splits[found] = splits.get(found, 0) + 1
    if split is None:
        if len(splits) > 1:
            raise UsageProblem(f"IMAGES {source!r} holds the splits {_listed(splits)}: choose one with --split NAME "
                               "(rows of several splits in one output are rarely what a study wants).")
        return paths
    split = SPLIT_WORDS.get(split.lower(), split)  # --split val is validation, as `datasets` has it
    chosen = [path for path in paths if split_of(path) == split]
    if not chosen:
        raise NoImages(f"IMAGES {source!r} holds no split {split!r}" + (
            f"; it holds {_listed(splits)}." if splits else "; its files are in no split of Hugging Face's layout."))
    return chosen


def _listed(splits: dict[str, int]) -> str:
    return ", ".join(f"{name} ({count} file{'s' if count > 1 else ''})" for name, count in sorted(splits.items()))
