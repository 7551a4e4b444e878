"""The data RDMs a compare reads (`featdump compare RDMS DATA`), one subject at a time: a subject's RDM as a vector
over the images compared (its upper triangle, row by row), read from DATA when asked, or taken from memory where
every subject's vector fits --memory. An RDM's vector over chosen images, or over a resample's (an image drawn
twice makes no pair with itself: NaN), is cut from the matrix (a block of rows read at a time) or from the condensed
vector in blocks of pairs; a bootstrap's resample finds its pairs' places once (`Resample`: an index of a vector's
size) for the model and every subject.

DATA: HDF5 holding `rdms` ((subjects, N, N), or condensed (subjects, N(N-1)/2) as scipy's `squareform` writes
them) and `paths` (the N images); a file rsatoolbox's `RDMs.save` wrote (its dissimilarities, the images named by a
pattern descriptor); or .npz (numpy reads an .npz member only whole: held in memory)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from featdump.errors import UsageProblem
from featdump.output.layout import open_to_read

PATH_DESCRIPTORS = ("path", "paths", "image", "stimulus", "filename")  # what rsatoolbox's files name images by
ROWS_AT_ONCE = 256  # a square RDM's rows read at once, at most
PAIRS_AT_ONCE = 1 << 20  # an RDM's pairs cut from it at once, about
CEILING_VECTORS = 3  # vectors of pairs the noise ceiling holds beside the data (the pool's sum and mean, one subject's)


@dataclass(frozen=True)
class DataRdms:
    """The data RDMs of a file: the N images it names, its subjects, how it stores them; those compared
    (`choose`) and, where they fit the memory given, every subject's vector held."""

    path: Path
    paths: list[str]
    subjects: int
    key: str  # the dataset in an HDF5 file: `rdms`, or rsatoolbox's `dissimilarities`
    square: bool  # stored (subjects, N, N), not condensed
    whole: np.ndarray | None = None  # an .npz's RDMs, as stored (read whole)
    chosen: np.ndarray | None = None  # positions in PATHS compared, in their order (None: all)
    held: np.ndarray | None = None  # (subjects, pairs) vectors over CHOSEN, where they fit

    @classmethod
    def open(cls, path: Path) -> DataRdms:
        """The data RDMs in PATH, their shape checked against the images named; UsageProblem where they cannot be
        compared (no RDMs, another size, one subject)."""
        try:
            found = _npz(path) if path.suffix == ".npz" else _hdf5(path)
        except (OSError, KeyError, ValueError) as error:
            raise UsageProblem(f"DATA {str(path)!r}: no data RDMs read ({error}); give an HDF5 or .npz file holding "
                               "`rdms` (subjects x N x N, or condensed) and `paths` (the N images).") from error
        shape, rdms = found.pop("shape"), found
        count = len(rdms["paths"])
        square = len(shape) == 3
        if not (square and shape[1] == shape[2] == count) and tuple(shape[1:]) != (count * (count - 1) // 2,):
            raise UsageProblem(f"DATA {str(path)!r}: its rdms are {tuple(shape)} for {count} paths; give (subjects, "
                               "N, N) for N paths.")
        if shape[0] < 2:
            raise UsageProblem(f"DATA {str(path)!r} holds one subject's RDM: a noise ceiling needs two at least.")
        return cls(path, rdms["paths"], int(shape[0]), rdms["key"], square, rdms.get("whole"))

    @property
    def images(self) -> int:
        """The images compared."""
        return len(self.paths) if self.chosen is None else len(self.chosen)

    def choose(self, positions: np.ndarray, budget: int) -> DataRdms:
        """These RDMs over the images at POSITIONS (in PATHS, in that order); every subject's vector held in
        memory where they fit BUDGET bytes beside the noise ceiling's own vectors, else each read from the file
        when asked."""
        chosen = replace(self, chosen=np.asarray(positions, dtype=np.int64))
        pairs = chosen.images * (chosen.images - 1) // 2
        if self.whole is None and (self.subjects + CEILING_VECTORS) * pairs * 8 > budget:
            return chosen
        return replace(chosen, held=np.stack([chosen.vector(subject) for subject in range(self.subjects)]),
                       whole=None)

    def vector(self, subject: int) -> np.ndarray:
        """SUBJECT's RDM over the images chosen, as a float64 vector (its upper triangle, row by row)."""
        if self.held is not None:
            return self.held[subject]
        chosen = np.arange(len(self.paths)) if self.chosen is None else self.chosen
        if self.whole is not None:
            stored = self.whole[subject]
            return square_vector(stored.__getitem__, chosen) if self.square else \
                condensed_vector(stored, len(self.paths), chosen)
        with open_to_read(self.path) as h5file:
            if self.square:
                return square_vector(lambda rows: h5file[self.key][subject, rows], chosen)
            return condensed_vector(h5file[self.key][subject], len(self.paths), chosen)


def square_vector(rows: Callable[[np.ndarray], np.ndarray], chosen: np.ndarray) -> np.ndarray:
    """The upper triangle, row by row, of a square matrix over the rows and columns CHOSEN (in that order), as
    float64; NaN for a pair of an image with itself (CHOSEN naming it twice). ROWS(indices): the matrix's rows at
    those increasing indices (a NumPy array's or an h5py dataset's `__getitem__`), read ROWS_AT_ONCE at most."""
    vector = np.empty(len(chosen) * (len(chosen) - 1) // 2)
    for start, first, end, row, column in _pair_blocks(len(chosen)):
        wanted = np.unique(chosen[first:end])
        read = np.asarray(rows(wanted))
        vector[start:start + len(row)] = read[np.searchsorted(wanted, chosen[row]), chosen[column]]
        vector[start:start + len(row)][chosen[row] == chosen[column]] = np.nan
    return vector


def condensed_vector(condensed: np.ndarray, size: int, chosen: np.ndarray) -> np.ndarray:
    """The vector over the images CHOSEN (positions among SIZE, in that order) of the condensed vector CONDENSED
    (scipy's squareform order), as float64; NaN for a pair of an image with itself (CHOSEN naming it twice)."""
    if len(chosen) == size and np.array_equal(chosen, np.arange(size)):
        return np.asarray(condensed, dtype=np.float64)
    return Resample(size, chosen).of(condensed)


class Resample:
    """Where each pair over the images CHOSEN (positions among SIZE, in that order) lies in a condensed vector of
    SIZE images, worked out once for the many vectors cut alike (a bootstrap's model and subjects). WHOLE: every
    pair kept, an image meeting itself (CHOSEN naming it twice) NaN; else those pairs left out (as every comparison
    but the whitened ones leaves a pair NaN in either RDM out). Places as int32 where they fit (below 65,536
    images): half an int64's memory, as long as a condensed RDM."""

    def __init__(self, size: int, chosen: np.ndarray, whole: bool = True):
        self.whole = whole
        kind = np.int32 if size * (size - 1) // 2 < 2**31 else np.int64
        places = np.empty(len(chosen) * (len(chosen) - 1) // 2, dtype=kind)
        itself = np.empty(len(places), dtype=bool)
        for start, _, _, row, column in _pair_blocks(len(chosen)):
            low, high = np.minimum(chosen[row], chosen[column]), np.maximum(chosen[row], chosen[column])
            itself[start:start + len(row)] = low == high
            places[start:start + len(row)] = np.where(low == high, 0, _condensed_place(low, high, size))
        self.places, self.itself = (places, itself) if whole else (places[~itself], None)

    def of(self, condensed: np.ndarray) -> np.ndarray:
        """CONDENSED's vector over the images chosen, float64 (NaN where an image meets itself, if WHOLE)."""
        vector = np.take(np.asarray(condensed, dtype=np.float64), self.places)
        if self.whole:
            vector[self.itself] = np.nan
        return vector


def resampled_places(size: int, chosen: np.ndarray):
    """Where the pairs over the images CHOSEN lie in a condensed vector of SIZE images, a block of about
    PAIRS_AT_ONCE pairs at a time, the pairs of an image with itself left out: a resample's pairs, never all held."""
    for _, _, _, row, column in _pair_blocks(len(chosen)):
        low, high = np.minimum(chosen[row], chosen[column]), np.maximum(chosen[row], chosen[column])
        apart = low != high
        yield _condensed_place(low[apart], high[apart], size)


def _condensed_place(low: np.ndarray, high: np.ndarray, size: int) -> np.ndarray:
    """Where the pair of images LOW < HIGH (positions among SIZE) lies in a condensed vector (scipy's order)."""
    return low * size - low * (low + 1) // 2 + high - low - 1


def _pair_blocks(count: int):
    """The upper triangle of COUNT images in blocks of whole rows, about PAIRS_AT_ONCE pairs and at most
    ROWS_AT_ONCE rows each: (where its pairs start in the vector, its first row, its end row, each pair's row and
    column)."""
    lengths = np.arange(count - 1, 0, -1)  # each row's pairs
    starts = np.concatenate([[0], np.cumsum(lengths)])
    cuts = np.unique(np.concatenate([np.searchsorted(starts, np.arange(0, starts[-1], PAIRS_AT_ONCE), "right") - 1,
                                     np.arange(0, count - 1, ROWS_AT_ONCE), [count - 1]]))
    for first, end in zip(cuts[:-1], cuts[1:]):
        pairs = lengths[first:end]
        row = np.repeat(np.arange(first, end), pairs)
        column = np.arange(starts[first], starts[end]) - np.repeat(starts[first:end], pairs) + row + 1
        yield int(starts[first]), int(first), int(end), row, column


def _npz(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as held:
        rdms, paths = held["rdms"], [str(name) for name in held["paths"]]
    return {"paths": paths, "key": "rdms", "shape": rdms.shape, "whole": rdms}


def _hdf5(path: Path) -> dict:
    with open_to_read(path) as h5file:
        if "dissimilarities" in h5file:  # a file rsatoolbox's RDMs.save wrote
            return {"paths": _described_paths(path, h5file), "key": "dissimilarities",
                    "shape": h5file["dissimilarities"].shape}
        paths = [name.decode() if isinstance(name, bytes) else str(name) for name in h5file["paths"][:]]
        return {"paths": paths, "key": "rdms", "shape": h5file["rdms"].shape}


def _described_paths(path: Path, h5file) -> list[str]:
    """The images' paths in a file rsatoolbox's `RDMs.save` wrote: the pattern descriptor that names them (one of
    PATH_DESCRIPTORS)."""
    held = h5file.get("pattern_descriptors", {})
    named = next((name for name in PATH_DESCRIPTORS if name in held), None)
    if named is None:
        raise UsageProblem(f"DATA {str(path)!r} is rsatoolbox's, and none of its pattern descriptors "
                           f"({', '.join(held) or 'none'}) names the images: give one of "
                           f"{', '.join(PATH_DESCRIPTORS)} holding their paths.")
    return [name.decode() if isinstance(name, bytes) else str(name) for name in held[named][:]]
