"""CKA: linear centred kernel alignment between the layers of one output, or of two outputs over the same images
(`featdump cka`, `featdump.cka`), out of core.

    CKA(K, L) = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)),  K = X X^T, L = Y Y^T over the same N images
    biased:    HSIC = <HKH, HLH>_F (H centres)
    unbiased:  the debiased estimator of Song et al. (2012), as Nguyen et al. (2021) use it

Each layer's centred Gram (`gram.py`) is computed once over the images both files have, kept in CKA.h5.partial
(resumable layer by layer), and the pairs are then read two at a time: memory is N x N matrices plus a slab.
Rows of two files are matched by path; different image sets are refused unless `common` (the images both have).
"""

from __future__ import annotations

import logging
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from featdump.analysis.choices import DEFAULT_MEMORY
from featdump.analysis.gram import CKA_MATRICES, check_room, gram
from featdump.analysis.rdm import megabytes
from featdump.analysis.results import Results, finished
from featdump.analysis.stored import Stored, listed
from featdump.errors import UsageProblem
from featdump.forward.device import resolve_device
from featdump.output.layout import open_to_read
from featdump.output.space import human_bytes, parse_bytes
from featdump.progress import NoProgress, Progress

log = logging.getLogger("featdump")
_GRAMS = "grams"


@dataclass(frozen=True)
class Cka:
    """CKA between the layers `rows` (of the first output) and `columns` (of the second, or the first again)."""

    values: np.ndarray  # (len(rows), len(columns)) float64
    rows: list[str]
    columns: list[str]
    images: int  # how many images the Gram matrices are over
    unbiased: bool


def cka(output: str | Path, other: str | Path | None = None, *, layers: list[str] | str | None = None,
        other_layers: list[str] | str | None = None, unbiased: bool = False, common: bool = False,
        memory: str | int = DEFAULT_MEMORY, device: str = "auto", to: str | Path | None = None,
        overwrite: bool = False, progress: Progress | None = None) -> Cka:
    """Linear CKA between every pair of LAYERS of OUTPUT, or between LAYERS of OUTPUT and OTHER_LAYERS of OTHER
    (two models on the same images, matched by path; COMMON: over the images both have). TO: written there
    (CKA.h5: /cka, with the attributes `rows`, `columns`); the Gram matrices are kept in TO.partial meanwhile, so
    a killed run resumes. MEMORY and DEVICE as for `featdump.rdm`."""
    first = Stored.read(output)
    second = Stored.read(other) if other is not None else None
    rows_first, rows_second = _matched_rows(first, second, common)
    names = first.select(listed(layers))
    other_names = second.select(listed(other_layers)) if second is not None else names
    budget, place = parse_bytes(memory), resolve_device(device)
    kept = first.paths if second is None else [first.paths[index] for index in rows_first]
    needed = 4 if unbiased else 2  # the unbiased estimator divides by n (n - 3)
    if len(kept) < needed:
        raise UsageProblem(f"{'Unbiased ' if unbiased else ''}CKA needs at least {needed} images"
                           f"{' both outputs hold' if second is not None else ''}; there are {len(kept)}.")
    check_room(len(kept), budget, place, "CKA", CKA_MATRICES)
    labels = first.labels[rows_first]
    made_from = {"source": first.identity(), "other": second.identity() if second else None, "layers": names,
                 "other_layers": other_names, "rows": len(kept)}
    progress = progress or NoProgress()
    if to is not None and not overwrite and finished(Path(to), {**made_from, "unbiased": unbiased}):
        log.info("%s is finished already, made by this same command: nothing to do.", to)
        return _read_finished(Path(to))
    sources = [(first, "a", names, rows_first if second is not None else None)]
    if second is not None:
        sources.append((second, "b", other_names, rows_second))
    with tempfile.TemporaryDirectory(prefix="featdump-cka-") as scratch:  # TO.grams.partial beside TO otherwise
        grams_path = Path(to).with_name(Path(to).name + ".grams") if to is not None else Path(scratch) / "grams.h5"
        grams = Results.open(grams_path, made_from, kept, labels, first.classes, overwrite=overwrite or to is None)
        try:
            _centred_grams(grams, sources, budget, place, progress)
            result = _alignment(grams, names, "a", other_names, "b" if second is not None else "a", unbiased,
                                len(kept))
            if to is not None:
                _write(Path(to), result, {**made_from, "unbiased": unbiased}, kept, labels, first.classes, overwrite)
        except BaseException:
            grams.close()
            raise
        finally:
            progress.close()
        grams.discard()
    return result


def _matched_rows(first: Stored, second: Stored | None, common: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Row indices of FIRST and SECOND for the same images (the same clips of videos), in FIRST's order."""
    if second is None:
        return np.arange(first.rows), None
    place = {key: index for index, key in enumerate(second.row_keys())}
    keys = first.row_keys()
    shared = [index for index, key in enumerate(keys) if key in place]
    only_first, only_second = first.rows - len(shared), second.rows - len(shared)
    if (only_first or only_second) and not common:
        raise UsageProblem(
            f"The two outputs hold different images: {only_first} of {str(first.path)!r}'s {first.rows} are not in "
            f"{str(second.path)!r}, and {only_second} of its {second.rows} are not in the first. Compare them over "
            f"the {len(shared)} images both have with --common (common=True), or extract both from the same images.")
    return np.array(shared), np.array([place[keys[index]] for index in shared])


def _centred_grams(grams: Results, sources, budget: int, device: torch.device, progress: Progress) -> None:
    """Each source layer's Gram over the matched rows, centred, written to GRAMS (those there already kept)."""
    todo = [(stored, key, name, rows) for stored, key, names, rows in sources for name in names
            if not grams.has(f"{_GRAMS}/{key}", name)]
    total = sum(stored.size(name) for stored, _, name, _ in todo)
    log.info("CKA: %d Gram matri%s to compute (%s to read, slabs of at most %s on %s).", len(todo),
             "x" if len(todo) == 1 else "ces", human_bytes(total), human_bytes(budget), device)
    progress.start(megabytes(total), 0)
    for stored, key, name, rows in todo:
        with stored.dataset(name) as dataset:
            stats = gram(dataset, stored.rows, budget, device, lambda read: progress.advance(megabytes(read)))
        _refuse_nonfinite(stats.nonfinite if rows is None else stats.nonfinite[torch.as_tensor(rows)], name, stored,
                          rows)
        centred = stats.centred
        if rows is not None:  # the images both outputs have, in the first one's order
            index = torch.as_tensor(rows, device=centred.device)
            centred = centred[index][:, index]
            if len(rows) != stored.rows:  # centred again over them
                centred = _centre(centred)
        grams.commit(f"{_GRAMS}/{key}", name, centred.cpu().numpy())
        del stats, centred


def _refuse_nonfinite(nonfinite: torch.Tensor, name: str, stored: Stored, rows) -> None:
    """UsageProblem naming the first image whose row of NAME holds NaN or inf: CKA over the rows is undefined."""
    bad = nonfinite.nonzero().flatten().tolist()
    if bad:
        first = bad[0] if rows is None else int(rows[bad[0]])
        raise UsageProblem(f"Layer {name} of {str(stored.path)!r} holds NaN or inf in {len(bad)} row"
                           f"{'s' * (len(bad) != 1)} ({stored.paths[first]!r}, ...): CKA over them is undefined. "
                           "Extract that layer again (a model in float16 may overflow: --dtype float32, "
                           "--precision float32).")


def _centre(matrix: torch.Tensor) -> torch.Tensor:
    """H M H: rows and columns less their means."""
    matrix = matrix - matrix.mean(0, keepdim=True)
    return matrix - matrix.mean(1, keepdim=True)


def _alignment(grams: Results, rows: list[str], row_key: str, columns: list[str], column_key: str, unbiased: bool,
               images: int) -> Cka:
    """CKA of every (row layer, column layer) pair, reading two Gram matrices at a time (one when symmetric)."""
    hsic = _unbiased_hsic if unbiased else _hsic
    own = {}  # HSIC(K, K) of each matrix read
    values = np.empty((len(rows), len(columns)))
    symmetric = row_key == column_key and rows == columns
    for i, row in enumerate(rows):
        left = grams.read(f"{_GRAMS}/{row_key}", row)
        own[(row_key, row)] = own.get((row_key, row)) or hsic(left, left)
        for j, column in enumerate(columns):
            if symmetric and j < i:
                values[i, j] = values[j, i]
                continue
            right = left if (symmetric and j == i) else grams.read(f"{_GRAMS}/{column_key}", column)
            if (column_key, column) not in own:
                own[(column_key, column)] = hsic(right, right)
            values[i, j] = _ratio(hsic(left, right), own[(row_key, row)] * own[(column_key, column)])
    for key, name in [key for key, value in own.items() if not value > 0]:
        log.warning("Layer %s has no variance over the images (its HSIC with itself is %s, not positive): its CKA "
                    "with any layer is undefined, NaN.", name, f"{own[(key, name)]:.3g}")
    return Cka(values, rows, columns, images, unbiased)


def _ratio(cross: float, own_product: float) -> float:
    """CROSS / sqrt(OWN_PRODUCT); NaN where a layer has no variance (a product of 0, or below it unbiased)."""
    return cross / math.sqrt(own_product) if own_product > 0 else math.nan


def _hsic(left: np.ndarray, right: np.ndarray) -> float:
    """<HKH, HLH>_F of two centred Gram matrices (the 1/(n-1)^2 cancels in CKA)."""
    return float(np.vdot(left, right))


def _unbiased_hsic(left: np.ndarray, right: np.ndarray) -> float:
    """The debiased HSIC (Song et al. 2012) of two Gram matrices; centring them first changes nothing (a shift
    of the features), so the centred ones serve."""
    n = left.shape[0]
    first, second = left.copy(), right.copy()
    np.fill_diagonal(first, 0.0)
    np.fill_diagonal(second, 0.0)
    first_sums, second_sums = first.sum(1), second.sum(1)
    value = (np.vdot(first, second) + first_sums.sum() * second_sums.sum() / ((n - 1) * (n - 2))
             - 2.0 / (n - 2) * float(first_sums @ second_sums))
    return float(value / (n * (n - 3)))


def _read_finished(path: Path) -> Cka:
    with open_to_read(path) as h5file:
        dataset = h5file["cka"]
        return Cka(dataset[:], list(dataset.attrs["rows"].astype(str)), list(dataset.attrs["columns"].astype(str)),
                   int(dataset.attrs["images"]), bool(dataset.attrs["unbiased"]))


def _write(output: Path, result: Cka, made_from: dict, paths: list[str], labels: np.ndarray, classes: list[str],
           overwrite: bool) -> None:
    """CKA.h5: /cka with its row and column layers, the images it is over."""
    written = Results.open(output, made_from, paths, labels, classes, overwrite)
    try:
        written.commit("", "cka", result.values, {"rows": result.rows, "columns": result.columns,
                                                  "unbiased": result.unbiased, "images": result.images})
        written.finish({"rows": result.rows, "columns": result.columns, "unbiased": result.unbiased})
    except BaseException:
        written.close()
        raise
