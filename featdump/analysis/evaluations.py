"""A compare's evaluations, layer by layer: each layer's comparison with every subject and its mean comparison in
each bootstrap resample. With a table to write (RESULT), they are kept beside it in RESULT's name with
.evaluations.h5 (`analysis.results`: OUT.partial until every layer is in, a layer an entry), so that a killed
compare resumes at the first layer not done and the same command again reads them back instead of computing; a
compare asked otherwise (another method, seed, data) replaces them. One layer's RDM is in memory at a time."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from featdump.analysis.results import Results, computed_into, made_from_of
from featdump.errors import OutputExists, ResumeMismatch
from featdump.output.layout import open_to_read
from featdump.progress import NoProgress

log = logging.getLogger("featdump")
GROUP = "layers"

Scores = tuple[np.ndarray, np.ndarray]  # (a layer's comparison with each subject (S,), its resamples' means (B,))


@dataclass(frozen=True)
class CompareAsk:
    """What a compare computes from, beyond its layers: the comparison, the bootstrap, the files read."""

    method: str
    resample: str
    samples: int
    seed: int
    files: list[Path] = field(default_factory=list)  # the model RDM files and DATA
    common: bool = False

    def made_from(self, names: list[str], images: int) -> dict:
        return {"kind": "compare", "method": self.method, "resample": self.resample, "samples": self.samples,
                "seed": self.seed, "common": self.common, "layers": names, "images": images,
                "files": [_identity(path) for path in self.files]}


def _identity(path: Path) -> dict:
    """A file as a result records it: where, its size and its modification time (another file there is another)."""
    found = path.stat()
    return {"file": str(path.resolve()), "size": found.st_size, "mtime_ns": found.st_mtime_ns}


def evaluations_path(to: str | Path) -> Path:
    to = Path(to)
    return to.with_name(to.stem + ".evaluations.h5")


def evaluated_layers(names: list[str], paths: list[str], asked: CompareAsk, scored: Callable[[int], Scores],
                     to: str | Path | None) -> tuple[np.ndarray, np.ndarray]:
    """((layers, S) each layer's comparison with each subject, (B, layers) each resample's): SCORED(index) for
    each of NAMES, over PATHS; kept beside TO and resumed, or read back (`evaluations_path`)."""
    if to is None:
        return _stacked([scored(index) for index in range(len(names))])
    place, made_from = evaluations_path(to), asked.made_from(names, len(paths))
    try:
        before = made_from_of(place)
    except OutputExists:
        before = {}  # some other file under that name: replaced
    if before == made_from:
        log.info("%s holds this same command's evaluations: read back, nothing computed.", place)
        with open_to_read(place) as h5file:
            return _stacked([_read(h5file[GROUP][_key(index)]) for index in range(len(names))])
    if before is not None:
        log.info("%s holds another compare's evaluations (%s differ): replaced.", place,
                 ", ".join(sorted(key for key in made_from if before.get(key) != made_from[key])) or "the file")
    results = _opened(place, made_from, paths, replace=before is not None)
    return computed_into(results, NoProgress(), lambda: _stacked([_layer(results, index, name, scored, len(names))
                                                                  for index, name in enumerate(names)]),
                         {"layers": names})


def _opened(place: Path, made_from: dict, paths: list[str], replace: bool) -> Results:
    """PLACE's partial, reopened where a killed run of the same compare left one, else made anew."""
    labels = np.zeros(len(paths), dtype=np.int64)
    try:
        return Results.open(place, made_from, paths, labels, [], overwrite=replace)
    except ResumeMismatch:  # a partial of another compare: started over
        return Results.open(place, made_from, paths, labels, [], overwrite=True)


def _layer(results: Results, index: int, name: str, scored: Callable[[int], Scores], count: int) -> Scores:
    """Layer INDEX's Scores: read from RESULTS where a killed run wrote them, else computed and committed."""
    key = _key(index)
    if results.has(GROUP, key):
        return _read(results.file[GROUP][key])
    found = scored(index)
    results.commit(GROUP, key, {"each": found[0], "evaluations": found[1]}, {"layer": name})
    log.info("Compared %s (%d of %d) into %s.", name, index + 1, count, results.output)
    return found


def _key(index: int) -> str:
    return f"{index:05d}"


def _read(entry) -> Scores:
    return entry["each"][:], entry["evaluations"][:]


def _stacked(found: list[Scores]) -> tuple[np.ndarray, np.ndarray]:
    each = np.stack([scores for scores, _ in found])
    evaluations = np.stack([resamples for _, resamples in found], axis=1) if found else np.empty((0, 0))
    return each, evaluations
