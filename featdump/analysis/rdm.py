"""RDM: representational dissimilarity matrices of an output's layers, out of core (`featdump rdm`, `featdump.rdm`).

    correlation   1 - Pearson's r between two rows' features (rsatoolbox's `correlation`)
    euclidean     the mean squared difference of two rows' features (rsatoolbox's `euclidean`)
    cosine        1 - the cosine of the angle between two rows

Each is a function of the layer's Gram statistics (`gram.py`: float32 products of centred slabs summed in
float64; for correlation and cosine, of rows brought to one level and size first), so memory is the N x N result
plus one slab (`--memory`), whatever the layer's width. As in rsatoolbox, a row on which the metric is undefined
(NaN or inf among its values; for correlation, all its values equal; for cosine, all zero) has NaN in its row and
column, every other entry as it would be without it; a log line names the first such image.
RDMS.h5: /rdms/LAYER (N, N) float64 with the attribute `metric`, /paths and /labels of the rows.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch

from featdump.analysis.choices import DEFAULT_MEMORY, METRICS
from featdump.analysis.gram import Gram, check_room, gram
from featdump.analysis.results import Results, computed_into, finished
from featdump.analysis.stored import Stored, listed
from featdump.errors import BadOption, UsageProblem
from featdump.forward.device import resolve_device
from featdump.output.layout import open_to_read
from featdump.output.space import human_bytes, parse_bytes
from featdump.progress import NoProgress, Progress

log = logging.getLogger("featdump")
GROUP = "rdms"


FORMS = {"correlation": "standardised", "cosine": "scaled", "euclidean": "raw"}  # the rows' form in `gram`


def undefined_rows(stats: Gram, metric: str) -> torch.Tensor:
    """(N,) bool: the rows METRIC gives no distance for (NaN in their row and column, as rsatoolbox)."""
    extra = {"correlation": stats.constant, "cosine": stats.zero}.get(metric)
    return stats.nonfinite | extra if extra is not None else stats.nonfinite


def dissimilarities(stats: Gram, metric: str) -> np.ndarray:
    """The N x N RDM of METRIC from a layer's Gram statistics (float64; zero on the diagonal, NaN in the rows and
    columns of `undefined_rows`), made in place of its N x N matrix (the statistics are spent)."""
    if metric == "euclidean":
        norms = torch.diagonal(stats.centred).clone()
        result = stats.centred.mul_(-2.0)
        result += norms[:, None]
        result += norms[None, :]
        result /= stats.features
        result.clamp_(min=0.0)
    elif metric in ("correlation", "cosine"):
        result = stats.row_centred() if metric == "correlation" else stats.uncentred()
        scale = torch.diagonal(result).clone().sqrt_()
        result /= scale[:, None]
        result /= scale[None, :]
        result.neg_().add_(1.0)
    else:
        raise BadOption(f"--metric {metric!r}: use one of {', '.join(METRICS)}.")
    undefined = undefined_rows(stats, metric)
    result[undefined, :] = math.nan
    result[:, undefined] = math.nan
    result.fill_diagonal_(0.0)
    return result.cpu().numpy()


def rdm(output: str | Path, layers: list[str] | str | None = None, *, metric: str = "correlation",
        memory: str | int = DEFAULT_MEMORY, device: str = "auto", to: str | Path | None = None,
        overwrite: bool = False, as_rsatoolbox: bool = False, progress: Progress | None = None):
    """The RDM of each layer of the featdump output OUTPUT (LAYERS: names or patterns as in extract; all by
    default) over its committed rows, as {layer: (N, N) float64 array}; an rsatoolbox.rdm.RDMs with
    AS_RSATOOLBOX. TO: also written there (RDMS.h5), resumable layer by layer. MEMORY bounds the slabs read
    ('128MB', '4GB'); DEVICE: auto (CUDA when there is one), cpu, cuda:N."""
    if metric not in METRICS:
        raise BadOption(f"--metric {metric!r}: use one of {', '.join(METRICS)}.")
    stored = Stored.read(output)
    names = stored.select(listed(layers))
    budget, place = parse_bytes(memory), resolve_device(device)
    check_room(stored.rows, budget, place, "An RDM" if len(names) == 1 else f"{len(names)} RDMs", len(names))
    results = None
    if to is not None:
        made_from = {"source": stored.identity(), "metric": metric, "layers": names}
        if not overwrite and finished(Path(to), made_from):
            log.info("%s is finished already, made by this same command: nothing to do.", to)
            return _read_finished(Path(to), names, metric, stored, as_rsatoolbox)
        results = Results.open(Path(to), made_from, stored.paths, stored.labels, stored.classes, overwrite)
    progress = progress or NoProgress()
    matrices = computed_into(results, progress, lambda: _compute(stored, names, metric, budget, place, results,
                                                                 progress), {"metric": metric, "layers": names})
    return to_rsatoolbox(matrices, metric, stored) if as_rsatoolbox else matrices


def _read_finished(path: Path, names: list[str], metric: str, stored: Stored, as_rsatoolbox: bool):
    with open_to_read(path) as h5file:
        matrices = {name: h5file[GROUP][name][:] for name in names}
    return to_rsatoolbox(matrices, metric, stored) if as_rsatoolbox else matrices


def _compute(stored: Stored, names: list[str], metric: str, budget: int, device: torch.device,
             results: Results | None, progress: Progress) -> dict[str, np.ndarray]:
    todo = [name for name in names if results is None or not results.has(GROUP, name)]
    if results is not None and len(todo) < len(names):
        log.info("Resuming: %d of %d layers' RDMs are in %s already.", len(names) - len(todo), len(names),
                 results.output)
    sizes = {name: stored.size(name) for name in todo}
    log.info("RDMs (%s) of %d layer%s over %d rows: %s to read, slabs of at most %s on %s.", metric, len(todo),
             "s" * (len(todo) != 1), stored.rows, human_bytes(sum(sizes.values())), human_bytes(budget), device)
    progress.start(megabytes(sum(sizes.values())), 0)
    matrices = {}
    for name in names:
        if name not in todo:
            matrices[name] = results.read(GROUP, name)
            continue
        with stored.dataset(name) as dataset:
            stats = gram(dataset, stored.rows, budget, device, lambda read: progress.advance(megabytes(read)),
                         FORMS[metric])
        matrices[name] = dissimilarities(stats, metric)
        _say_undefined(stats, metric, name, stored)
        del stats
        if results is not None:
            results.commit(GROUP, name, matrices[name], {"metric": metric, "layer": name})
            log.info("The RDM of %s is in %s (%d of %d).", name, results.output, names.index(name) + 1, len(names))
    return matrices


def _say_undefined(stats: Gram, metric: str, name: str, stored: Stored) -> None:
    """A log line naming the first image whose row and column of NAME's RDM are NaN, and why, if any is."""
    undefined = undefined_rows(stats, metric).nonzero().flatten().tolist()
    if not undefined:
        return
    first = undefined[0]
    why = "NaN or inf among its values" if stats.nonfinite[first] else \
        "all its values equal" if metric == "correlation" else "all its values zero"
    log.warning("The %s RDM of %s has NaN in the rows and columns of %d image%s, as rsatoolbox's would: %r (%s)%s.",
                metric, name, len(undefined), "s" * (len(undefined) != 1), stored.paths[first], why,
                ", ..." if len(undefined) > 1 else "")


def to_rsatoolbox(matrices: dict[str, np.ndarray], metric: str, stored: Stored):
    """MATRICES as one rsatoolbox.rdm.RDMs: an RDM per layer (`layer` descriptor), the rows' path and label."""
    try:
        from rsatoolbox.rdm import RDMs
    except ImportError as error:
        raise UsageProblem("as_rsatoolbox=True needs rsatoolbox: pip install 'featdump[rsa]'.") from error
    names = list(matrices)
    return RDMs(np.stack([matrices[name] for name in names]), dissimilarity_measure=metric,
                rdm_descriptors={"layer": names},
                pattern_descriptors={"path": list(stored.paths), "label": list(stored.labels)})


def megabytes(count: int) -> float:
    return count / 1e6
