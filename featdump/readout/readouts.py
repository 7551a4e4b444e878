"""Read-outs: a cross-validated ridge read-out of every layer of an output, out of core (`featdump probe`,
`featdump encode`, `featdump.probe`, `featdump.encode`).

    probe    "which layer knows this?": a ridge classifier per layer, one-vs-rest on +-1 targets (as scikit-learn's
             RidgeClassifierCV); each fold's accuracy, every row's held-out decision values (columns in ascending
             label order)
    encode   "which layer predicts this brain area?": ridge regression per layer on numeric targets (as RidgeCV);
             every row's held-out prediction, each target's Pearson r and R^2 over all rows, the median r

Both use K folds (`folds.py`: seeded, stratified by class for a probe); in each, the alpha is chosen among the grid
by leave-one-out error on the fold's training rows (`ridge.py`), one alpha for all targets or one per target. A layer
is read within --memory (`passes.py`); its matrix (N x N or D x D, float64) comes on top and is said before starting;
one too large for this machine is refused with the way out. PROBES.h5 / ENC.h5 (`analysis.results`), resumable
layer by layer:

    attributes          made_from, complete, kind (probe or encode), layers (in the model's order)
    /paths, /labels     the rows used; /fold (N,) each row's fold; /alphas the grid; /columns the classes or targets
    /readouts/LAYER/    predicted (N, C or T), alpha (K,) or (K, T) per target, fold_score (K,) each fold's accuracy
                        or median r; a probe's accuracy (K,); an encoding's r (T,) and r2 (T,); attribute score
    /ncsnr, /ceiling, /trials   encode --repeats: each target's noise ceiling (`ceilings`), each image's trials
    /regions/           encode --repeats, --rois or --table: the scores by region, a column each (`bounds`),
                        written beside the finished file
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from featdump.analysis.choices import DEFAULT_MEMORY
from featdump.analysis.results import Results, annex, computed_into, finished
from featdump.analysis.stored import Stored, listed
from featdump.errors import UsageProblem
from featdump.forward.device import resolve_device
from featdump.output.layout import open_to_read, text_of
from featdump.output.space import parse_bytes
from featdump.progress import NoProgress, Progress
from featdump.readout import bounds, passes
from featdump.readout.choices import DEFAULT_ALPHAS, DEFAULT_FOLDS
from featdump.readout.delays import grid_step, parse_delays, sources
from featdump.readout.folds import assign_folds, sparse_classes, training_rows
from featdump.readout.ridge import parse_alphas
from featdump.readout.scores import MEASURES, layer_score
from featdump.readout.targets import Targets, class_targets, numeric_targets

log = logging.getLogger("featdump")
GROUP = "readouts"
KINDS = ("probe", "encode")


@dataclass(frozen=True)
class Readout:
    """A layer's cross-validated read-out over N images."""

    layer: str
    kind: str  # probe or encode
    fold: np.ndarray  # (N,) each row's fold
    alphas: np.ndarray  # (A,) the grid
    alpha: np.ndarray  # (K,) the alpha chosen in each fold, or (K, T) one per target
    predicted: np.ndarray  # (N, C) held-out decision values (classes ascending), or (N, T) held-out predictions
    columns: list[str]  # the classes or the targets
    paths: list[str]  # the N images
    fold_score: np.ndarray  # (K,) each fold's accuracy (probe) or median r over the targets (encode)
    accuracy: np.ndarray | None = None  # (K,) probe
    r: np.ndarray | None = None  # (T,) encode: Pearson r of each target over all rows
    r2: np.ndarray | None = None  # (T,) encode

    @property
    def score(self) -> float:
        """The layer's one number (`scores.layer_score`): accuracy, or median r."""
        return layer_score(self.kind, self.accuracy, self.r)


def probe(output: str | Path, layers: list[str] | str | None = None, *, folds: int = DEFAULT_FOLDS,
          alphas=DEFAULT_ALPHAS, labels: str | Path | None = None, common: bool = False, seed: int = 0,
          memory: str | int = DEFAULT_MEMORY, device: str = "auto", to: str | Path | None = None,
          overwrite: bool = False, progress: Progress | None = None) -> dict[str, Readout]:
    """A ridge classifier on each of LAYERS of the featdump output OUTPUT (names or patterns; all by default),
    cross-validated over FOLDS stratified folds (SEED), alpha chosen among ALPHAS by leave-one-out in each fold;
    labels from the file or from LABELS (a CSV/TSV of path,label; COMMON: the images both have). TO: also written
    there (PROBES.h5), resumable layer by layer. MEMORY and DEVICE as for `featdump.rdm`. {layer: Readout}."""
    stored = Stored.read(output)
    table = class_targets(stored, labels, common)
    return _read_out("probe", stored, table, _Asked(layers, folds, alphas, False, seed, memory, device, to, overwrite,
                                                    progress))


def encode(output: str | Path, targets: str | Path, layers: list[str] | str | None = None, *,
           folds: int = DEFAULT_FOLDS,
           alphas=DEFAULT_ALPHAS, per_target: bool = False, common: bool = False, seed: int = 0,
           memory: str | int = DEFAULT_MEMORY, device: str = "auto", to: str | Path | None = None,
           overwrite: bool = False, progress: Progress | None = None, delays=None,
           gap: float | None = None, repeats: bool = False, rois: str | Path | None = None, samples: int = 1000,
           fdr: bool = False, table: str | Path | None = None) -> dict[str, Readout]:
    """A ridge encoding model from each of LAYERS of OUTPUT to TARGETS (a CSV/TSV with a path column and a column
    per target, an .npy in the output's row order, or FILE.h5:DATASET with its paths), rows matched by path (COMMON:
    the images both have); FOLDS seeded folds, alpha chosen by leave-one-out in each (one for all targets, or
    PER_TARGET). DELAYS ('1,2,3,4' steps of the clips' grid, or '1.5s,3s'): each layer's features at those
    earlier onsets of the same video, stacked (FIR; zeros before a video's first row). GAP: seconds of a video left
    out of a fold's training on both sides of its held-out stretch (default: the longest delay plus one step of the
    grid). TO: also written there (ENC.h5), resumable layer by layer. REPEATS: rows of TARGETS naming the same image
    are its trials (their mean fitted; each target's noise ceiling). With REPEATS, ROIS (a CSV of target,region) or
    TABLE: each layer's score per region with its interval over SAMPLES resamples of the images, the ceiling, and
    paired tests between layers (`bounds`; FDR, else Bonferroni), logged and written to TABLE (.csv or .nc).
    {layer: Readout}."""
    stored = Stored.read(output)
    values = numeric_targets(stored, targets, common, repeats)
    readouts = _read_out("encode", stored, values, _Asked(layers, folds, alphas, per_target, seed, memory, device,
                                                          to, overwrite, progress, delays, gap))
    if repeats or rois is not None or table is not None:
        found = bounds.report(readouts, values, rois, samples, seed, fdr, table)
        if to is not None:
            annex(Path(to), bounds.GROUP, bounds.stored_arrays(found))
    return readouts


def _videos(stored: Stored, table: Targets, folds: int) -> np.ndarray | None:
    """Each used row's video (an index) where the rows are clips, so that FOLDS keep a video's clips together."""
    if stored.clip_starts is None:
        return None
    videos = np.unique(np.asarray([stored.paths[row] for row in table.rows]), return_inverse=True)[1]
    count = len(np.unique(videos))
    log.info("The rows are clips of %d videos: each of the %d folds holds %s.", count, folds,
             "whole videos" if count >= folds else "a stretch of time of each video")
    return videos


def _images(stored: Stored, table: Targets) -> np.ndarray | None:
    """Each used row's image (an index) where an image has several rows (a list naming it twice), so that its rows
    share a fold: none trains on its own held-out copy; None where every image has one row."""
    paths = [stored.paths[row] for row in table.rows]
    images, counts = np.unique(np.asarray(paths, dtype=object), return_inverse=True, return_counts=True)[1:]
    repeated = int((counts > 1).sum())
    if not repeated:
        return None
    log.info("%d images have more than one row: each one's rows are kept in one fold.", repeated)
    return images


def _delay_shifts(stored: Stored, table: Targets, delays) -> tuple[list[int], float | None, np.ndarray | None]:
    """(the delays in steps, the step in seconds, each delay's source file row per used row: among all the file's
    rows, whether they have a target or not) of DELAYS; ([], None, None) without delays."""
    if delays is None or (isinstance(delays, str) and not delays.strip()):
        return [], None, None
    if stored.clip_starts is None:
        raise UsageProblem("--delays: the rows are images, not clips of videos on a time grid; extract the videos "
                           "with --fps (or a clip model) first.")
    paths, starts = list(stored.paths), np.asarray(stored.clip_starts)  # every row the file holds, target or not
    step = grid_step(paths, starts)
    steps = parse_delays(delays, step)
    log.info("Delays %s (steps of %g s): each row's features at those earlier onsets of its video, zeros before "
             "its first row.", ",".join(map(str, steps)), step)
    return steps, step, sources(paths, starts, steps, step)[:, table.rows]


def _gapped(stored: Stored, table: Targets, fold: np.ndarray, videos: np.ndarray | None, steps: list[int],
            step: float | None, gap: float | None) -> tuple[float, np.ndarray | None]:
    """(the gap in seconds, the rows each fold trains on) for clip rows; (0, None) for images. The default gap is
    the longest delay plus one step of the grid (one step without delays)."""
    if videos is None:
        if gap:
            raise UsageProblem("--gap: the rows are images, not clips of videos on a time grid.")
        return 0.0, None
    starts = np.asarray(stored.clip_starts)[table.rows]
    if gap is None:
        try:
            step = step or grid_step([stored.paths[row] for row in table.rows], starts)
        except UsageProblem:  # one row a video: no stretch of time to leave a gap in
            return 0.0, None
        gap = (max(steps, default=0) + 1) * step
    training = training_rows(fold, videos, starts, gap)
    left_out = int((fold[:, None] != np.arange(training.shape[1])[None, :]).sum() - training.sum())
    if left_out:
        log.info("A gap of %g s on both sides of each held-out stretch: %d training rows left out over the folds.",
                 gap, left_out)
    return float(gap), training


@dataclass(frozen=True)
class _Asked:
    """What `probe` or `encode` was asked, beyond the rows and targets (their keywords, as given)."""

    layers: list[str] | str | None
    folds: int
    alphas: object
    per_target: bool
    seed: int
    memory: str | int
    device: str
    to: str | Path | None
    overwrite: bool
    progress: Progress | None
    delays: object = None
    gap: float | None = None


def _read_out(kind: str, stored: Stored, table: Targets, asked: _Asked) -> dict[str, Readout]:
    folds, per_target, seed, to, overwrite = asked.folds, asked.per_target, asked.seed, asked.to, asked.overwrite
    names = stored.select(listed(asked.layers))
    if stored.stale:
        log.warning("%d rows of %s are stale (their image was gone or changed at its last --update; `featdump info` "
                    "names them): they are used as stored.", stored.stale, stored.path)
    steps, step, shifts = _delay_shifts(stored, table, asked.delays)
    grid, budget, place = parse_alphas(asked.alphas), parse_bytes(asked.memory), resolve_device(asked.device)
    videos = _videos(stored, table, folds)
    groups = videos if videos is not None else _images(stored, table)
    fold = assign_folds(table.count, folds, seed, table.classes, groups,
                        None if videos is None else np.asarray(stored.clip_starts)[table.rows])
    gap, training = _gapped(stored, table, fold, videos, steps, step, asked.gap)
    sparse = sparse_classes(table.classes, table.columns, folds) if table.classes is not None else []
    if sparse:
        log.warning("%d class%s have fewer images than the %d folds (%s): some folds hold none of them.",
                    len(sparse), "es" * (len(sparse) != 1), folds, ", ".join(sparse[:5]) + ", ..." * (len(sparse) > 5))
    paths = [stored.paths[row] for row in table.rows]
    made_from = {"source": stored.identity(), "kind": kind, "targets": _digest(table), "layers": names,
                 **({"repeats": True} if table.ceilings is not None else {}),
                 "folds": folds, "seed": seed, "alphas": grid.tolist(), "per_target": per_target,
                 **({"folds_by": "video"} if stored.clip_starts is not None else {}),
                 **({"delays": steps, "delay_step": step, "delays_from": "every row"} if steps else {}),
                 **({"gap": gap} if gap else {})}
    if to is not None and not overwrite and finished(Path(to), made_from):
        log.info("%s is finished already, made by this same command: nothing to do.", to)
        return read_readouts(Path(to), names)
    sizes = passes.refuse_too_large(stored, names, table.count, len(table.columns), folds, len(grid), budget, place)
    results = None
    if to is not None:
        labels, classes = (table.classes, table.columns) if table.classes is not None else \
            (stored.labels[table.rows], stored.classes)  # a probe's: the labels probed (a CSV's, or the output's)
        results = Results.open(Path(to), made_from, paths, labels, classes, overwrite)
        columns = np.array(table.columns, dtype=h5py.string_dtype())
        kept = {"fold": fold, "alphas": grid, "columns": columns}
        if table.ceilings is not None:  # encode --repeats
            kept.update(ncsnr=table.ceilings.ncsnr, ceiling=table.ceilings.ceiling, trials=table.ceilings.trials)
        for name, values in kept.items():
            if not results.has("", name):
                results.commit("", name, values)
    progress = asked.progress or NoProgress()
    plan = _Plan(kind, stored, table, names, fold, grid, per_target, budget, place, paths, shifts, training)
    return computed_into(results, progress, lambda: _fit_layers(plan, results, progress, sizes),
                         {"kind": kind, "layers": names})


@dataclass(frozen=True)
class _Plan:
    """What the layers of one read-out share."""

    kind: str
    stored: Stored
    table: Targets
    names: list[str]
    fold: np.ndarray
    grid: np.ndarray
    per_target: bool
    budget: int
    device: torch.device
    paths: list[str]  # of the rows used
    shifts: np.ndarray | None = None  # the delays' source rows (`delays.sources`), or None
    training: np.ndarray | None = None  # (N, K): the rows each fold trains on (`folds.training_rows`)


def _fit_layers(plan: _Plan, results: Results | None, progress: Progress, sizes) -> dict[str, Readout]:
    kind, table, names, grid, place = plan.kind, plan.table, plan.names, plan.grid, plan.device
    todo = [name for name in names if results is None or not results.has(GROUP, name)]
    if results is not None and len(todo) < len(names):
        log.info("Resuming: %d of %d layers' read-outs are in %s already.", len(names) - len(todo), len(names),
                 results.output)
    folds = int(plan.fold.max()) + 1
    log.info("%s: %d layer%s over %d %s, %d %s, %d folds, %d alphas (%g to %g), on %s.",
             "Probes" if kind == "probe" else "Encoding models", len(todo), "s" * (len(todo) != 1), table.count,
             "clips" if plan.stored.clip_starts is not None else "images",
             len(table.columns), "classes" if kind == "probe" else "targets", folds, len(grid), grid.min(),
             grid.max(), place)
    progress.start(sum(sizes[name][1] for name in todo) / 1e6, 0)
    targets = torch.as_tensor(table.values, device=place)
    alphas = torch.as_tensor(grid, device=place)
    readouts = {}
    for name in names:
        if name not in todo:
            readouts[name] = _read_layer(results.file, name, kind, plan.paths)
            continue
        readouts[name] = _fit_layer(plan, name, targets, alphas, progress)
        if results is not None:
            results.commit(GROUP, name, _entry(readouts[name]), {"layer": name, "score": readouts[name].score})
            log.info("The %s of %s is in %s (%d of %d): %s.", kind, name, results.output, names.index(name) + 1,
                     len(names), _summary(readouts[name]))
        else:
            log.info("The %s of %s: %s.", kind, name, _summary(readouts[name]))
    return readouts


def _fit_layer(plan: _Plan, name: str, targets: torch.Tensor, alphas: torch.Tensor, progress: Progress) -> Readout:
    stored, table, fold, budget, place = plan.stored, plan.table, plan.fold, plan.budget, plan.device

    def advance(count: int) -> None:
        progress.advance(count / 1e6)

    with stored.dataset(name) as dataset:
        features = int(np.prod(dataset.shape[1:]))
        wide = passes.is_wide(table.count, features) or plan.shifts is not None  # delays: through the Gram
        log.info("%s: %d %s x %d features, %s.", name, table.count,
                 "clips" if stored.clip_starts is not None else "images", features,
                 f"wide: its {table.count} x {table.count} Gram in one pass" if wide
                 else f"narrow: its {features} x {features} covariance per fold in two passes")
        folds = int(fold.max()) + 1
        _say_fit_cost(name, table.count * (folds - 1) // folds if wide else features, folds, place)
        say = lambda line: log.info("%s: %s.", name, line)  # noqa: E731 - the layer's notes
        fitting = passes.Fitting(alphas, plan.per_target, budget, place, advance, say, passes.FitClock(folds, say))
        if wide:
            fits, nonfinite = passes.fit_wide(dataset, stored.rows, table.rows, targets, fold, fitting, plan.shifts,
                                              plan.training)
        else:
            fits, nonfinite = passes.fit_narrow(dataset, table.rows, targets, fold, fitting, plan.training)
    if bool(nonfinite.any()):
        bad = nonfinite.nonzero().flatten().tolist()
        raise UsageProblem(f"Layer {name} of {str(stored.path)!r} holds NaN or inf in {len(bad)} row"
                           f"{'s' * (len(bad) != 1)} ({plan.paths[bad[0]]!r}, ...): no fit over them. Extract that "
                           "layer again (a model in float16 may overflow: --dtype float32, --precision float32).")
    return _readout(plan, name, fit_results(fits, fold, table.count))


_SAY_COST_ABOVE = 30.0  # seconds of fits in a layer worth saying before they start
_SAY_COST_FROM = 1024  # rows (wide) or features (narrow): smaller fits take no time worth saying


def _say_fit_cost(name: str, size: int, folds: int, device: torch.device) -> None:
    """Before a layer whose FOLDS eigendecompositions of SIZE x SIZE will take long: what they cost here, and how
    to make them cheaper (the progress bar counts bytes read, and stands still while they run)."""
    if size < _SAY_COST_FROM:
        return
    each = passes.eigh_seconds(size, device)
    if each * folds >= _SAY_COST_ABOVE:
        log.warning("%s: its fit is %d eigendecompositions of %d x %d (one per fold), about %.0f s each here "
                    "(%.0f s in all), after the layer is read; fewer --folds, or the layer reduced at extract "
                    "(--reduce %s=srp:4096, or pca:1024), make it cheaper.", name, folds, size, size, each,
                    each * folds, name)


def fit_results(fits, fold: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(predicted (N, T) in row order, chosen alpha indices (K, T)) from the folds' FITS."""
    width = fits[0].predicted.shape[1]
    predicted = np.empty((count, width))
    for number, fit in enumerate(fits):
        predicted[fold == number] = fit.predicted.cpu().numpy()
    return predicted, np.stack([fit.alpha_index.cpu().numpy() for fit in fits])


def _readout(plan: _Plan, name: str, fitted: tuple[np.ndarray, np.ndarray]) -> Readout:
    """The layer NAME's Readout from its held-out predictions and chosen alphas (FITTED), with its scores."""
    kind, fold, grid, table, paths = plan.kind, plan.fold, plan.grid, plan.table, plan.paths
    predicted, chosen = fitted
    alpha = grid[chosen] if plan.per_target else grid[chosen[:, 0]]
    _warn_at_edge(name, chosen, len(grid))
    folds = int(fold.max()) + 1
    if kind == "probe":
        right = predicted.argmax(1) == table.classes
        accuracy = np.array([right[fold == number].mean() for number in range(folds)])
        return Readout(name, kind, fold, grid, alpha, predicted, table.columns, paths, accuracy, accuracy=accuracy)
    r = _pearson(predicted, table.values)
    residual = ((table.values - predicted) ** 2).sum(0)
    spread = ((table.values - table.values.mean(0)) ** 2).sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = 1.0 - residual / spread
    fold_score = np.array([_nanmedian(_pearson(predicted[fold == number], table.values[fold == number]))
                           for number in range(folds)])
    constant = [table.columns[index] for index in np.flatnonzero(~np.isfinite(r))]
    if constant:
        log.warning("%s: %d target%s have no Pearson r (constant over the images, or predicted constant): %s.", name,
                    len(constant), "s" * (len(constant) != 1), ", ".join(constant[:5]) + ", ..." * (len(constant) > 5))
    return Readout(name, kind, fold, grid, alpha, predicted, table.columns, paths, fold_score, r=r, r2=r2)


def _pearson(predicted: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Each column's Pearson r between PREDICTED and ACTUAL (NaN where either is constant)."""
    first, second = predicted - predicted.mean(0), actual - actual.mean(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (first * second).sum(0) / np.sqrt((first ** 2).sum(0) * (second ** 2).sum(0))


def _nanmedian(values: np.ndarray) -> float:
    return float(np.nanmedian(values)) if np.isfinite(values).any() else float("nan")


def _warn_at_edge(name: str, chosen: np.ndarray, count: int) -> None:
    """A log line when the alpha chosen is the grid's smallest or largest in most folds: the grid is too narrow."""
    if count < 3:
        return
    for edge, side, way in ((0, "smallest", "lower"), (count - 1, "largest", "higher")):
        share = float((chosen == edge).mean())
        if share > 0.5:
            log.warning("%s: the alpha chosen is the grid's %s in %.0f%% of the folds (and targets): extend --alphas "
                        "%s.", name, side, 100 * share, way)


def _entry(readout: Readout) -> dict[str, np.ndarray]:
    entry = {"predicted": readout.predicted, "alpha": readout.alpha, "fold_score": readout.fold_score}
    if readout.kind == "probe":
        entry["accuracy"] = readout.accuracy
    else:
        entry["r"], entry["r2"] = readout.r, readout.r2
    return entry


def read_readouts(path: Path, names: list[str] | None = None) -> dict[str, Readout]:
    """The read-outs of a PROBES.h5 or ENC.h5 (NAMES, or all in their recorded order)."""
    with open_to_read(path) as h5file:
        kind = text_of(h5file.attrs.get("kind")) or "probe"
        paths = [text_of(item) for item in h5file["paths"][:]]
        recorded = [text_of(name) for name in h5file.attrs.get("layers", [])] or list(h5file[GROUP])
        return {name: _read_layer(h5file, name, kind, paths) for name in (names or recorded)}


def _read_layer(h5file: h5py.File, name: str, kind: str, paths: list[str]) -> Readout:
    entry = h5file[GROUP][name]
    read = {key: entry[key][:] for key in entry}
    columns = [text_of(item) for item in h5file["columns"][:]]
    return Readout(name, kind, h5file["fold"][:], h5file["alphas"][:], read["alpha"], read["predicted"], columns,
                   paths, read["fold_score"], read.get("accuracy"), read.get("r"), read.get("r2"))


def _summary(readout: Readout) -> str:
    if readout.kind == "probe":
        return f"accuracy {readout.score:.3f} (folds {readout.fold_score.min():.3f} to {readout.fold_score.max():.3f})"
    return f"{MEASURES['encode']} {readout.score:.3f} over {len(readout.columns)} targets"


def _digest(table: Targets) -> str:
    import hashlib

    digest = hashlib.sha256(np.ascontiguousarray(table.rows).tobytes())
    digest.update(np.ascontiguousarray(table.values).tobytes())
    digest.update("\n".join(table.columns).encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:16]
