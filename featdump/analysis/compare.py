"""Compare: which layer's RDM explains data RDMs best, and how sure: each layer's RDM (a `featdump rdm` file, or
computed from an output on the way) compared with data RDMs (a subject each) over the images both name, as
rsatoolbox compares them (`analysis.comparisons`): the mean over subjects, the noise ceiling (lower and upper
bound), a confidence interval by bootstrap over subjects, images or both, a test of each layer against zero and
tests between every pair of layers, corrected for their number (Bonferroni, or Benjamini-Hochberg's FDR).

DATA is an HDF5 or .npz file holding `rdms` ((subjects, N, N), or (subjects, N(N-1)/2) condensed as scipy's
`squareform` writes them) and `paths` (the N images, as the output names them). A resample draws subjects and
images with replacement (seeded; its indices can be written out); an image drawn twice makes no pair with itself
(NaN, left out), as rsatoolbox's `subsample_pattern` has it. The interval is the bootstrap distribution's 2.5 and
97.5 percentiles; the tests are rsatoolbox's t-tests on the bootstrap's mean and covariance (degrees of freedom:
subjects - 1, images - 1, or the smaller of the two)."""

from __future__ import annotations

import csv
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featdump.analysis.choices import DEFAULT_MEMORY, RESAMPLES
from featdump.analysis.comparisons import METHODS, WHITENED, compared, cosines_in_blocks, noise_ceiling
from featdump.analysis.data_rdms import DataRdms, Resample, resampled_places, square_vector
from featdump.analysis.evaluations import CompareAsk, evaluated_layers
from featdump.analysis.inference import pair_tests, zero_tests
from featdump.analysis.stored import listed
from featdump.errors import BadOption, UsageProblem
from featdump.output.layout import open_to_read, text_of
from featdump.output.space import parse_bytes

log = logging.getLogger("featdump")
RESAMPLED = RESAMPLES
TABLE = ("layer", "score", "low", "high", "ceiling_low", "ceiling_high", "p_zero", "n_images", "n_subjects")
PAIRS = ("first", "second", "difference", "p", "p_corrected", "correction", "significant")


@dataclass(frozen=True)
class Comparison:
    """Each layer's score (the mean over subjects), its interval, its test against zero, the noise ceiling, the
    bootstrap's evaluations (samples, layers) and the tests between the layers."""

    layers: list[str]
    scores: np.ndarray
    low: np.ndarray
    high: np.ndarray
    p_zero: np.ndarray
    ceiling: tuple[float, float]
    evaluations: np.ndarray
    pairs: list[dict]
    images: int
    subjects: int


def compare(rdms: str | Path | list, data: str | Path, layers: list[str] | str | None = None, *,
            method: str = "corr", resample: str = "subjects", samples: int = 1000, seed: int = 0, fdr: bool = False,
            common: bool = False, to: str | Path | None = None, indices: str | Path | None = None,
            memory: str | int = DEFAULT_MEMORY) -> Comparison:
    """RDMS' layers (a `featdump rdm` file; an output's RDMs are computed beside it first; several: each model's,
    its layers named FILE:LAYER and tested against each other's) compared with the data RDMs in DATA by METHOD;
    resampled (RESAMPLE) SAMPLES times from SEED; written to TO (.csv: a row per layer, and TO's pairs beside it;
    or .nc) and the resamples' INDICES (.npz) when given. The data RDMs are held in memory where they fit MEMORY,
    else read a subject at a time; one layer's RDM is in memory at a time."""
    if method not in METHODS:
        raise BadOption(f"--method {method!r}: use one of {', '.join(METHODS)}.")
    if resample not in RESAMPLED:
        raise BadOption(f"--bootstrap {resample!r}: use one of {', '.join(RESAMPLED)}.")
    files = [Path(path) for path in (rdms if isinstance(rdms, (list, tuple)) else [rdms])]
    models = _models(files, listed(layers), common)
    subjects = DataRdms.open(Path(data))
    mine, theirs = _matched(models.paths, subjects.paths, common, files[0], Path(data))
    subjects = subjects.choose(theirs, parse_bytes(memory))
    asked = CompareAsk(method, resample, samples, seed, [*files, Path(data)], common)
    result = _compared(models, mine, subjects, asked, fdr, indices, to)
    if to is not None:
        write_table(Path(to), result)
    return result


@dataclass(frozen=True)
class ModelRdms:
    """The layers' RDMs of one model's file or of several models' (each layer named FILE:LAYER), over PATHS, read
    one layer at a time (`matrix`): never all in memory."""

    names: list[str]
    paths: list[str]
    sources: list[tuple[Path, str, np.ndarray]]  # each layer's file, name in it, and its rows in PATHS' order

    def vector(self, index: int, rows: np.ndarray) -> np.ndarray:
        """Layer INDEX's RDM over ROWS (positions in PATHS) as a float64 vector (its upper triangle, row by row)."""
        file, name, order = self.sources[index]
        with open_to_read(file) as h5file:
            return square_vector(h5file["rdms"][name].__getitem__, order[rows])


def _models(files: list[Path], layers: list[str] | None, common: bool) -> ModelRdms:
    """The ModelRdms of one model's RDM file, or of several models' (each layer named FILE:LAYER; their RDMs over
    the images the first names, every file naming them, or with COMMON the images all name)."""
    read = [_model_rdms(path, layers) for path in files]
    if len(read) == 1:
        file, names, paths = read[0]
        order = np.arange(len(paths))
        return ModelRdms(names, paths, [(file, name, order) for name in names])
    paths = [path for path in read[0][2] if all(path in set(other[2]) for other in read[1:])]
    for file, (_, _, its_paths) in zip(files[1:], read[1:]):
        if not common and set(its_paths) != set(read[0][2]):
            raise UsageProblem(f"{str(file)!r} and {str(files[0])!r} name other images; pass --common to compare "
                               "the models over the images all of them name.")
    names, sources = [], []
    for given, (file, its_names, its_paths) in zip(files, read):
        where = {path: position for position, path in enumerate(its_paths)}
        order = np.asarray([where[path] for path in paths])
        names += [f"{given.name.removesuffix('.h5')}:{name}" for name in its_names]
        sources += [(file, name, order) for name in its_names]
    return ModelRdms(names, paths, sources)


def _model_rdms(path: Path, layers: list[str] | None) -> tuple[Path, list[str], list[str]]:
    """(the RDM file, the layer names of LAYERS (all: None) in it, the images' paths) of a `featdump rdm` file, or
    of the RDMs of every layer of the output PATH (correlation distance), computed into PATH.rdms.h5 beside it
    (resumable, read again by the next command)."""
    with open_to_read(path) as h5file:
        held = "rdms" in h5file
    if not held:
        from featdump.analysis.rdm import rdm

        beside = path.with_name(path.name.removesuffix(".h5") + ".rdms.h5")
        log.info("%s holds features: the RDMs of its layers (correlation distance) are computed into %s first "
                 "(all of them, once: the next compare reads them).", path, beside)
        rdm(path, None, to=beside)
        path = beside
    with open_to_read(path) as h5file:
        names = [name for name in h5file["rdms"] if layers is None or _chosen(name, layers)]
        order = [text_of(name) for name in h5file.attrs.get("layers", [])]
        names = sorted(names, key=lambda name: order.index(name) if name in order else len(order))
        if not names:
            raise UsageProblem(f"{str(path)!r} holds no RDM of {', '.join(layers or [])}; it holds "
                               f"{', '.join(h5file['rdms'])}.")
        return path, names, list(h5file["paths"].asstr()[:])


def _chosen(name: str, layers: list[str]) -> bool:
    from fnmatch import fnmatchcase

    return any(fnmatchcase(name, layer.strip()) for layer in layers)


def _matched(paths: list[str], data_paths: list[str], common: bool, rdms: Path, data: Path):
    """The positions in PATHS and in DATA_PATHS of the images both name, in DATA_PATHS' order; UsageProblem when
    they differ and not COMMON (naming an example of each side), or when fewer than 3 are shared."""
    where = {path: position for position, path in enumerate(paths)}
    theirs = [position for position, path in enumerate(data_paths) if path in where]
    mine = [where[data_paths[position]] for position in theirs]
    only_mine = len(paths) - len(mine)
    only_theirs = len(data_paths) - len(theirs)
    if (only_mine or only_theirs) and not common:
        example_mine = next((path for path in paths if path not in set(data_paths)), None)
        example_theirs = next((path for path in data_paths if path not in where), None)
        raise UsageProblem(f"{str(rdms)!r} and DATA {str(data)!r} name other images: {only_mine} only in the first "
                           f"({example_mine!r}, ...), {only_theirs} only in DATA ({example_theirs!r}, ...); pass "
                           "--common to compare over the images both name.")
    if len(mine) < 3:
        raise UsageProblem(f"{str(rdms)!r} and DATA {str(data)!r} share {len(mine)} images: an RDM needs 3.")
    if only_mine or only_theirs:
        log.info("--common: %d images both name; %d only in %s, %d only in %s are left out.", len(mine), only_mine,
                 rdms, only_theirs, data)
    return np.asarray(mine), np.asarray(theirs)


def _compared(models: ModelRdms, mine: np.ndarray, data: DataRdms, asked: CompareAsk, fdr: bool,
              indices: str | Path | None, to: str | Path | None) -> Comparison:
    """The Comparison of each of MODELS' layers (over its rows MINE) with DATA, layer by layer (`evaluations`:
    resumable beside TO, read back by the same command again)."""
    ceiling = noise_ceiling(data.vector, data.subjects, asked.method)
    subjects, images = draws(asked.resample, asked.samples, data.subjects, data.images, asked.seed)
    if indices is not None:
        np.savez(indices, subjects=subjects, images=images)

    def scored(index: int) -> tuple[np.ndarray, np.ndarray]:
        return layer_scores(models.vector(index, mine), data, asked, subjects, images)

    each, evaluations = evaluated_layers(models.names, [models.paths[row] for row in mine], asked, scored, to)
    low, high = (np.percentile(evaluations, [2.5, 97.5], axis=0) if len(evaluations) else
                 (np.full(len(models.names), np.nan), np.full(len(models.names), np.nan)))
    dof = _dof(asked.resample, data.subjects, data.images)
    return Comparison(models.names, each.mean(axis=1), low, high, zero_tests(evaluations, dof), ceiling,
                      evaluations, pair_tests(models.names, evaluations, dof, fdr), data.images, data.subjects)


def layer_scores(model: np.ndarray, data: DataRdms, asked: CompareAsk, subjects: np.ndarray,
                 images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(its comparison with each subject (S,), its mean comparison in each resample (B,)) of one layer's MODEL RDM
    (its vector) with the DATA RDMs, the resamples drawing SUBJECTS and IMAGES."""
    each = np.array([compared(model[None], data.vector(subject)[None], asked.method)[0, 0]
                     for subject in range(data.subjects)])
    if asked.resample == "subjects":  # a subject's comparison is its own whatever the others: resampled
        return each, each[subjects].mean(axis=1) if len(subjects) else np.empty(0)
    return each, np.array([_evaluated(model, data, asked.method, chosen, shown)
                           for chosen, shown in zip(subjects, images)])


def draws(resample: str, samples: int, subjects: int, images: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(samples, SUBJECTS) and (samples, IMAGES) indices of each resample (drawn with replacement where RESAMPLE
    says, else all in order; the images sorted, as rsatoolbox's subsample_pattern orders them)."""
    rng = np.random.default_rng(seed)
    count = 0 if resample == "none" else samples
    chosen = rng.integers(0, subjects, (count, subjects)) if resample in ("subjects", "both") else \
        np.broadcast_to(np.arange(subjects), (count, subjects))
    shown = np.sort(rng.integers(0, images, (count, images)), axis=1) if resample in ("images", "both") else \
        np.broadcast_to(np.arange(images), (count, images))
    return np.asarray(chosen), np.asarray(shown)


def _evaluated(model: np.ndarray, data: DataRdms, method: str, chosen: np.ndarray, shown: np.ndarray) -> float:
    """A layer's mean comparison with the data of one resample: subjects CHOSEN (each drawn once compared once),
    images SHOWN (an image drawn twice makes no pair with itself)."""
    drawn, times = np.unique(chosen, return_counts=True)
    if method in ("corr", "cosine"):  # the resample's pairs a block at a time: none of its vectors held
        scores = _resampled_cosines(model, data, drawn, shown, centred=method == "corr")
    else:  # ranks and the whitened fit need the resampled vectors whole
        resample = Resample(data.images, shown, whole=method in WHITENED)
        resampled = resample.of(model)[None]
        scores = [compared(resampled, resample.of(data.vector(subject))[None], method)[0, 0] for subject in drawn]
    return float(np.dot(scores, times) / len(chosen))


def _resampled_cosines(model: np.ndarray, data: DataRdms, drawn: np.ndarray, shown: np.ndarray,
                       centred: bool) -> list[float]:
    """MODEL's r (CENTRED) or cosine with each subject DRAWN over the images SHOWN: every subject at each block
    of pairs where the data are held, else a subject at a time (each read once)."""
    def places():
        return resampled_places(data.images, shown)

    if data.held is not None:
        return cosines_in_blocks(places, model, [data.vector(subject) for subject in drawn], centred)
    return [cosines_in_blocks(places, model, [data.vector(subject)], centred)[0] for subject in drawn]


def _dof(resample: str, subjects: int, images: int) -> int:
    return {"subjects": subjects - 1, "images": images - 1}.get(resample, min(subjects, images) - 1)


def write_table(to: Path, result: Comparison) -> None:
    """TO: .csv, a row per layer (TABLE's columns), its pairs in TO's name with .pairs.csv (PAIRS' columns); or
    .nc, one NetCDF file (xarray): TABLE's columns over the dimension `layer`, PAIRS' over `pair`. Each written
    whole, then moved into place."""
    if to.suffix == ".nc":
        _write_netcdf(to, result)
        return
    rows = [{"layer": name, "score": score, "low": low, "high": high, "ceiling_low": result.ceiling[0],
             "ceiling_high": result.ceiling[1], "p_zero": p, "n_images": result.images,
             "n_subjects": result.subjects}
            for name, score, low, high, p in zip(result.layers, result.scores, result.low, result.high, result.p_zero)]
    _write_csv(to, TABLE, rows)
    _write_csv(to.with_name(to.name.removesuffix(".csv") + ".pairs.csv"), PAIRS, result.pairs)


def _write_netcdf(to: Path, result: Comparison) -> None:
    try:
        import xarray as xr
    except ImportError as error:
        raise UsageProblem("-o RESULT.nc needs xarray (and h5netcdf): pip install 'featdump[netcdf]', or write "
                           "a .csv.") from error
    table = xr.Dataset(
        {"score": ("layer", result.scores), "low": ("layer", result.low), "high": ("layer", result.high),
         "p_zero": ("layer", result.p_zero), "ceiling_low": ((), result.ceiling[0]),
         "ceiling_high": ((), result.ceiling[1]),
         **{column: ("pair", np.array([pair[column] for pair in result.pairs], dtype=kind))
            for column, kind in (("first", str), ("second", str), ("difference", float), ("p", float),
                                 ("p_corrected", float), ("significant", np.int8))}},
        coords={"layer": result.layers}, attrs={"n_images": result.images, "n_subjects": result.subjects,
                                                 "correction": result.pairs[0]["correction"] if result.pairs else ""})
    partial = to.with_name(to.name + ".partial")
    table.to_netcdf(partial, engine="h5netcdf")
    os.replace(partial, to)


def _write_csv(path: Path, columns: tuple[str, ...], rows: list[dict]) -> None:
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(partial, path)
