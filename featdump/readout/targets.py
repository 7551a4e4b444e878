"""Targets: what a read-out predicts for each image, read from where a lab keeps it and matched to an output's rows
by path.

    probe    class labels: the output's own (class folders, tar .cls) or a CSV/TSV of path,label
    encode   numbers per image: a CSV/TSV with a `path` column and a column per target, an .npy in the output's row
             order, or an HDF5 dataset with its own `paths` (FILE.h5:DATASET, or FILE.h5 holding one besides paths)

Rows are matched by the path the output records (relative to its image root, as `featdump info` shows them).
Paths the two sides do not share are refused with both counts, unless `common` (the images both have).
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from featdump.analysis.stored import Stored
from featdump.errors import UsageProblem
from featdump.locations import Location
from featdump.output.layout import open_to_read
from featdump.readout.ceilings import Ceilings, averaged_trials, trial_groups

log = logging.getLogger("featdump")


@dataclass(frozen=True)
class Targets:
    """The rows a read-out uses and what it predicts for each."""

    rows: np.ndarray  # (n,) indices of the output's rows used, ascending
    values: np.ndarray  # (n, T) float64: the targets (probe: +1 for the row's class, -1 for the others)
    columns: list[str]  # the targets' names (probe: the classes, in ascending label order)
    classes: np.ndarray | None  # (n,) int: each row's class (an index into columns) for a probe; None to encode
    source: str  # where they came from, for the result's record
    ceilings: Ceilings | None = None  # encode --repeats: each target's noise ceiling from the images' trials

    @property
    def count(self) -> int:
        return len(self.rows)


def class_targets(stored: Stored, labels: str | Path | None, common: bool) -> Targets:
    """A probe's targets: the output's labels, or those of the CSV/TSV LABELS (path,label), one-vs-rest in +-1."""
    if labels is None:
        named = np.asarray(stored.labels)
        unlabelled = int((named < 0).sum())
        if unlabelled:
            raise UsageProblem(f"{unlabelled} of {str(stored.path)!r}'s {stored.rows} images have no label (they "
                               "were not in class folders or tar .cls files): give the labels with --labels "
                               "FILE (a CSV/TSV of path,label).")
        rows = np.arange(stored.rows)
        order = sorted(set(named.tolist()))
        names = [stored.classes[label] if label < len(stored.classes) else str(label) for label in order]
        classes = np.searchsorted(np.array(order), named)
        source = f"the labels of {stored.path}"
    else:
        paths, table = _read_table(Path(labels), want_header=False)
        if not table or len(table[0]) < 1:
            raise UsageProblem(f"{str(labels)!r} holds no label column: write path,label on each line.")
        texts = [row[0].strip() for row in table]
        empty = [path for path, text in zip(paths, texts) if not text]
        if empty:
            raise UsageProblem(f"{str(labels)!r} gives {len(empty)} image{'s' * (len(empty) != 1)} an empty label "
                               f"({empty[0]!r}): give each a label, or leave its line out (with --common).")
        rows, order = match_rows(stored, paths, common, str(labels))
        texts = [texts[index] for index in order]
        names = _sorted_labels(set(texts))
        classes = np.array([names.index(text) for text in texts], dtype=np.int64)
        source = str(labels)
    if len(names) < 2:
        raise UsageProblem(f"A probe needs two classes at least; the {len(rows)} images' labels ({source}) are all "
                           f"{names[0]!r}." if names else f"No labelled image in {source}.")
    values = -np.ones((len(rows), len(names)))
    values[np.arange(len(rows)), classes] = 1.0
    return Targets(np.asarray(rows), values, names, classes, source)


def numeric_targets(stored: Stored, targets: str | Path, common: bool, repeats: bool = False) -> Targets:
    """An encoding model's targets from TARGETS (CSV/TSV, .npy, or FILE.h5[:DATASET]) for STORED's rows; REPEATS:
    rows naming the same image are its trials (a CSV's column `trial`, `repeat` or `rep` is no target), each
    image's target their mean, with each target's noise ceiling (`ceilings`)."""
    text = str(targets)
    location, _, inner = text.partition(":") if _is_hdf5(text.partition(":")[0]) else (text, "", "")
    path = Path(location)
    if not path.exists():
        raise UsageProblem(f"No targets file {text!r}: give a CSV/TSV with a path column, an .npy in the output's "
                           "row order, or FILE.h5:DATASET with a paths dataset.")
    if repeats and path.suffix == ".npy":
        raise UsageProblem(f"--repeats: {text!r} is an .npy, whose rows name no image: give a CSV or HDF5 file with "
                           "paths, an image's trials on rows of the same path.")
    if path.suffix == ".npy":
        values = _as_matrix(np.load(path, allow_pickle=False), text)
        if len(values) != stored.rows:
            raise UsageProblem(f"{text!r} has {len(values)} rows but {str(stored.path)!r} has {stored.rows}: an .npy "
                               "must follow the output's rows; give a CSV or HDF5 file with paths to match by path.")
        rows, columns = np.arange(stored.rows), [f"target_{index}" for index in range(values.shape[1])]
    elif _is_hdf5(location):
        paths, values, columns = _read_hdf5(path, inner, text)
        if repeats:
            return _trial_means(stored, paths, values, columns, common, text)
        rows, order = match_rows(stored, paths, common, text)
        values = values[order]
    else:
        paths, table = _read_table(path, want_header=True)
        header, table = table[0], table[1:]
        columns = [name.strip() for name in header]
        values = _numbers(table, columns, text)
        _refuse_nonfinite(values, columns, text, "line", first=2)  # named by the CSV's own lines
        if repeats:
            kept = [place for place, name in enumerate(columns) if name.lower() not in TRIAL_COLUMNS]
            return _trial_means(stored, paths[1:], values[:, kept], [columns[place] for place in kept], common, text)
        onsets = None
        for key in ONSET_COLUMNS:  # a video job's rows, named by (path, onset): a movie's TR onsets
            if key in columns:
                place = columns.index(key)
                onsets, values = (key, values[:, place]), np.delete(values, place, axis=1)
                columns = [name for name in columns if name != key]
                break
        rows, order = match_rows(stored, paths[1:], common, text, onsets)
        values = values[order]
    _refuse_nonfinite(values, columns, text)
    return Targets(np.asarray(rows), values, list(columns), None, text)


TRIAL_COLUMNS = ("trial", "repeat", "rep")  # with --repeats, a table's column numbering the trials: no target


def _trial_means(stored: Stored, paths: list[str], values: np.ndarray, columns: list[str], common: bool,
                 where: str) -> Targets:
    """Targets of each image's mean over its trials (the rows of PATHS naming it), with the targets' Ceilings over
    the images matched. UsageProblem where no image has two trials."""
    keys, group = trial_groups([_normal(_within_root(path, stored.root)) for path in paths])
    rows, order = match_rows(stored, keys, common, where)
    means, ceilings = averaged_trials(values, group, order)
    if not (ceilings.trials > 1).any():
        raise UsageProblem(f"--repeats: {where!r} names each of its {len(keys)} images once: no trials to tell the "
                           "noise by (give each trial its own row, under the image's path), or leave --repeats out.")
    _refuse_nonfinite(means, columns, where)
    return Targets(np.asarray(rows), means, list(columns), None, where, ceilings)


def match_rows(stored: Stored, paths: list[str], common: bool, where: str,
               onsets: tuple[str, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(output rows, PATHS' rows) of the images both name, in the output's order. UsageProblem with both counts
    when they differ and not COMMON, or when PATHS names an image twice. Paths that carry the output's image_root
    (absolute, or its URL) are matched without it. A video job's rows are named by (path, onset) when the table
    gives ONSETS (its column, clip_start or clip_end, and its seconds), matched within half a frame; else by path
    alone: every clip of a video takes its video's value."""
    paths = [_normal(_within_root(path, stored.root)) for path in paths]
    stored = dataclasses.replace(stored, paths=[_normal(path) for path in stored.paths])
    if onsets is not None and stored.clip_starts is not None:
        return _match_onsets(stored, paths, onsets, common, where)
    keys, stored_keys = list(paths), stored.paths
    place: dict = {}
    for index, key in enumerate(keys):
        if key in place:
            hint = (" Its rows are clips of videos: name each by its onset too, in a column clip_start or clip_end "
                    "(a BIDS events file's `onset` is one of them: rename it)") if stored.clip_starts is not None \
                else ""
            raise UsageProblem(f"{where!r} names {key!r} twice (rows {place[key] + 1} and {index + 1}): one value "
                               f"per image.{hint}")
        place[key] = index
    rows = [row for row, key in enumerate(stored_keys) if key in place]
    matched = {stored_keys[row] for row in rows}
    missing, extra = stored.rows - len(rows), len(keys) - len(matched)
    if not rows:
        shown = ", ".join(repr(path) for path in stored.paths[:2])
        raise UsageProblem(f"None of {where!r}'s {len(paths)} paths is an image of {str(stored.path)!r}: it names "
                           f"{paths[0]!r}, the output {shown}, ... (relative to its image_root {stored.root!r}); "
                           "give the paths as the output stores them.")
    if (missing or extra) and not common:
        raise UsageProblem(f"{missing} of {str(stored.path)!r}'s {stored.rows} images have no row in {where!r}, and "
                           f"{extra} of its {len(paths)} rows name no image of the output; pass --common "
                           f"(common=True) to use the {len(rows)} images both have.")
    if missing or extra:  # --common: what it left out, counted and one of each named (a 1-based index slip)
        unmatched = next((key for key in keys if key not in matched), None)
        unnamed = next((key for key in stored_keys if key not in place), None)
        log.warning("--common: %d of %r's %d rows name no image of the output%s and %d of its %d images have no row "
                    "there%s: using the %d both have.", extra, where, len(paths),
                    f" ({unmatched!r}, ...)" if unmatched is not None else "", missing, stored.rows,
                    f" ({unnamed!r}, ...)" if unnamed is not None else "", len(rows))
    return np.array(rows, dtype=np.int64), np.array([place[stored_keys[row]] for row in rows], dtype=np.int64)


def _normal(path: str) -> str:
    """PATH in Unicode's composed form (NFC): "café" typed on one system and listed on another is one name."""
    return unicodedata.normalize("NFC", path)


ONSET_COLUMNS = ("clip_start", "clip_end")  # a targets table's column naming a video job's rows with `path`
_EXACT = 1e-6  # seconds: the tolerance where a file does not record its videos' rates


def _match_onsets(stored: Stored, paths: list[str], onsets: tuple[str, np.ndarray], common: bool,
                  where: str) -> tuple[np.ndarray, np.ndarray]:
    """(output rows, table rows) of the clips both name: each table row (path, onset) takes the row of that video
    whose onset (the column the table names) is nearest, when within half of the video's frame. UsageProblem
    naming the onsets that find no row (and the rows no onset finds), unless COMMON."""
    column, times = onsets
    stored_times = stored.clip_ends if column == "clip_end" else stored.clip_starts
    if stored_times is None:
        raise UsageProblem(f"{where!r} names its rows by {column}, which {str(stored.path)!r} does not record "
                           "(made by an earlier featdump): name them by clip_start.")
    by_video: dict[str, list[int]] = {}
    for row, path in enumerate(stored.paths):
        by_video.setdefault(path, []).append(row)
    chosen: dict[int, int] = {}  # output row: table row
    missed, tolerances = [], _half_frames(stored)
    for index, (path, time) in enumerate(zip(paths, times)):
        row = _nearest(by_video.get(path, []), stored_times, float(time), tolerances)
        if row is None:
            missed.append(f"{path} @ {float(time):.6g} s")
        elif row in chosen:
            raise UsageProblem(f"{where!r} names the clip {path} @ {float(time):.6g} s twice (rows "
                               f"{chosen[row] + 1} and {index + 1}, within half a frame): one value per clip.")
        else:
            chosen[row] = index
    unmatched = [f"{stored.paths[row]} @ {float(stored_times[row]):.6g} s" for row in range(stored.rows)
                 if row not in chosen]
    if not chosen or ((missed or unmatched) and not common):
        raise UsageProblem(
            f"{len(missed)} of {where!r}'s {len(paths)} onsets ({column}) find no clip of {str(stored.path)!r} within "
            f"half a frame ({_shown(missed)}), and {len(unmatched)} of its {stored.rows} clips have no onset there "
            f"({_shown(unmatched)}); pass --common (common=True) to use the {len(chosen)} clips both have.")
    rows = np.array(sorted(chosen), dtype=np.int64)
    return rows, np.array([chosen[row] for row in rows], dtype=np.int64)


def _half_frames(stored: Stored) -> np.ndarray:
    """Each row's tolerance in seconds: half its video's frame (1 µs where the file does not record rates)."""
    if stored.video_rates is None:
        return np.full(stored.rows, _EXACT)
    rates = np.asarray(stored.video_rates, dtype=np.float64)
    return np.where(rates > 0, 0.5 / np.where(rates > 0, rates, 1.0), _EXACT) + _EXACT


def _nearest(rows: list[int], times: np.ndarray, time: float, tolerances: np.ndarray) -> int | None:
    """Of ROWS, the one whose time is nearest TIME, when within its tolerance; else None."""
    if not rows:
        return None
    distances = np.abs(times[rows] - time)
    best = int(np.argmin(distances))
    return rows[best] if distances[best] <= tolerances[rows[best]] else None


def _shown(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "") if keys else "none"


def _within_root(path: str, root: str) -> str:
    """PATH relative to ROOT when it lies under it (ROOT a folder or a URL; PATH as typed, or as its Location
    reads it: `file:///r/x.png` is `/r/x.png`); else as it is."""
    base = root.rstrip("/") + "/"
    for text in (path, str(Location.of(path).native)) if root else ():
        if text.startswith(base):
            return text[len(base):]
    return path


def _read_table(path: Path, want_header: bool) -> tuple[list[str], list[list[str]]]:
    """(the path column, the other columns of every line) of a CSV or TSV (tab if the name ends in .tsv or the
    first line holds a tab). With WANT_HEADER the first line is the header (it must name a `path` column);
    otherwise a first line whose path cell reads `path` is a header and is dropped."""
    if not path.exists():
        raise UsageProblem(f"No file {str(path)!r}.")
    with open(path, newline="", encoding="utf-8-sig", errors="surrogateescape") as handle:  # a BOM (Excel's) dropped
        first = handle.readline()
        handle.seek(0)
        delimiter = "\t" if path.suffix.lower() == ".tsv" or "\t" in first else ","
        lines = [line for line in csv.reader(handle, delimiter=delimiter) if any(cell.strip() for cell in line)]
    if not lines:
        raise UsageProblem(f"{str(path)!r} is empty.")
    header = [cell.strip() for cell in lines[0]]
    column = header.index("path") if "path" in header else None
    if want_header and column is None:
        raise UsageProblem(f"{str(path)!r} has no `path` column in its first line ({','.join(header)}): name the "
                           "image column `path` and each target column by its name.")
    if column is None:
        column = 0
    width = len(lines[0])
    for number, line in enumerate(lines, 1):
        if len(line) != width:
            raise UsageProblem(f"{str(path)!r} line {number} has {len(line)} cells, the first line {width}.")
    if not want_header and header[column] == "path":
        lines = lines[1:]
    paths = [line[column].strip() for line in lines]
    return paths, [line[:column] + line[column + 1:] for line in lines]


def _numbers(table: list[list[str]], columns: list[str], where: str) -> np.ndarray:
    values = np.empty((len(table), len(columns)))
    for number, line in enumerate(table, 2):
        for column, cell in enumerate(line):
            try:
                values[number - 2, column] = float(cell) if cell.strip() else math.nan
            except ValueError:
                raise UsageProblem(f"{where!r} line {number}, column {columns[column]!r}: {cell!r} is not a number; "
                                   "targets must be numeric (a probe takes class labels: featdump probe).") from None
    if not len(columns):
        raise UsageProblem(f"{where!r} has a path column but no target column.")
    return values


def _read_hdf5(path: Path, name: str, where: str) -> tuple[list[str], np.ndarray, list[str]]:
    """(paths, values, column names) of FILE.h5's dataset NAME (or its one numeric dataset besides `paths`)."""
    try:
        with open_to_read(path) as h5file:
            if not name:
                found = [key for key, item in h5file.items() if isinstance(item, h5py.Dataset) and key != "paths"
                         and item.dtype.kind in "fiub"]
                if len(found) != 1:
                    raise UsageProblem(f"{str(path)!r} holds {len(found)} numeric datasets besides paths "
                                       f"({', '.join(found)}): name one, as {path}:DATASET.")
                name = found[0]
            if name not in h5file or not isinstance(h5file[name], h5py.Dataset):
                raise UsageProblem(f"{str(path)!r} holds no dataset {name!r}.")
            dataset = h5file[name]
            if dataset.dtype.kind not in "fiub":
                raise UsageProblem(f"{where!r} is of type {dataset.dtype}, not numbers: targets must be numeric.")
            parent = dataset.parent
            paths_item = parent["paths"] if "paths" in parent else h5file.get("paths")
            if paths_item is None:
                raise UsageProblem(f"{where!r} has no `paths` dataset beside it to match its rows by; add one, or give "
                                   "an .npy in the output's row order.")
            paths = [item.decode("utf-8", "surrogateescape") if isinstance(item, bytes) else str(item)
                     for item in paths_item[:]]
            values = _as_matrix(dataset[:], where)
            names = dataset.attrs.get("names", dataset.attrs.get("columns"))
    except OSError as error:
        raise UsageProblem(f"{str(path)!r} is not a readable HDF5 file ({error}).") from error
    if len(paths) != len(values):
        raise UsageProblem(f"{where!r} has {len(values)} rows but {len(paths)} paths.")
    columns = [item.decode() if isinstance(item, bytes) else str(item) for item in names] if names is not None \
        else [f"{name.strip('/')}_{index}" for index in range(values.shape[1])]
    return paths, values, columns


def _as_matrix(values: np.ndarray, where: str) -> np.ndarray:
    if values.dtype.kind not in "fiub":
        raise UsageProblem(f"{where!r} holds {values.dtype} values, not numbers: targets must be numeric.")
    if values.ndim not in (1, 2):
        raise UsageProblem(f"{where!r} has shape {values.shape}: give one row per image, (images,) or "
                           "(images, targets).")
    values = values.astype(np.float64)
    return values[:, None] if values.ndim == 1 else values


def _refuse_nonfinite(values: np.ndarray, columns: list[str], where: str, unit: str = "row", first: int = 1) -> None:
    """UsageProblem naming the first missing, NaN or infinite value: its UNIT (row, or a CSV's line) counted from
    FIRST, and its column."""
    bad = np.argwhere(~np.isfinite(values))
    if len(bad):
        row, column = bad[0]
        raise UsageProblem(f"{where!r} has {len(bad)} missing, NaN or infinite target value{'s' * (len(bad) != 1)} "
                           f"(the first: {unit} {row + first}, {columns[column]!r}): fill or drop them before "
                           "fitting.")


def _sorted_labels(labels: set[str]) -> list[str]:
    """Labels in ascending order: as numbers when they all are (equal numbers, '1', '01', '1.0', by their text),
    else as text; never in the set's order, which depends on Python's hash seed."""
    try:
        return sorted(labels, key=lambda label: (float(label), label))
    except ValueError:
        return sorted(labels)


def _is_hdf5(name: str) -> bool:
    return name.lower().endswith((".h5", ".hdf5", ".he5", ".nc"))
