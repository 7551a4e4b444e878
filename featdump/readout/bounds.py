"""How sure an encoding model's scores are, by region (`featdump encode --rois`, `--samples`): for each layer and
region (a set of targets: voxels of V4, say; without regions, all targets are one region, `all`):

    score      the median over the region's targets of their held-out Pearson r (the layer's own score, per region)
    low, high  its 95% interval: the 2.5 and 97.5 percentiles of a seeded bootstrap over the images, each resample
               recomputing every target's r from the stored held-out predictions
    ceiling    with --repeats: the median of the region's targets' r ceilings (sqrt of `ceilings`' ceiling)
    share      with --repeats: the median over the region's targets of r / its r ceiling (noise-normalised)

and, in each region, every pair of layers: the share of its targets the first predicts better, the difference of
their scores and its two-sided p (`analysis.inference.pair_tests` on the same resamples, images - 1 degrees of
freedom), corrected over the region's pairs (Bonferroni, or --fdr). Written as a tidy table (`write_bounds`)."""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from featdump.analysis.inference import pair_tests
from featdump.errors import UsageProblem
from featdump.readout.ceilings import Ceilings

log = logging.getLogger("featdump")
ALL = "all"
LOW_CEILING = 0.1  # an r ceiling below which a share of it says nothing (a region of no signal)
_CHUNK = 64  # resamples weighed at once


@dataclass(frozen=True)
class Bounds:
    """Each (layer, region) row's score, interval, ceiling, share and counts, and each region's pairs of layers."""

    rows: list[dict]
    pairs: list[dict]
    targets: list[dict] = field(default_factory=list)  # a row per layer and target (TARGETS' columns)


def report(readouts: dict, targets, rois: str | Path | None, samples: int, seed: int, fdr: bool,
           table: str | Path | None) -> Bounds:
    """The Bounds of READOUTS (encode's, {layer: Readout}) against TARGETS (their `Targets`), by the regions of
    ROIS; logged a line per layer and region and per significant pair, and written to TABLE when given."""
    found = bounded({name: readout.predicted for name, readout in readouts.items()}, targets.values,
                    targets.columns, region_of_targets(rois, targets.columns), targets.ceilings, samples, seed, fdr)
    log.info("By region, each interval over %d bootstrap resamples of the %d images:", samples, len(targets.values))
    for row in found.rows:
        log.info("%s.", said_of_row(row))
    for pair in found.pairs:
        log.info("%s.", said_of_pair(pair))
    if table is not None:
        write_bounds(Path(table), found)
    return found


def said_of_row(row: dict) -> str:
    """A layer in a region in words: its median r, interval, and the share of its ceiling (where one means it)."""
    ceiling = "" if np.isnan(row["ceiling"]) else \
        f"; its noise ceiling r {row['ceiling']:.3f}, too low to normalise by" if row["ceiling"] < LOW_CEILING \
        else f"; {row['share']:.0%} of its noise ceiling (r {row['ceiling']:.3f})"
    return (f"{row['layer']} in {row['region']}: median r {row['score']:.3f} (95% interval {row['low']:.3f} to "
            f"{row['high']:.3f}){ceiling}")


def said_of_pair(pair: dict) -> str:
    """A region's pair of layers in words: which is above, on what share of the targets, and how sure."""
    above, below = (pair["first"], pair["second"]) if pair["difference"] >= 0 else (pair["second"], pair["first"])
    better = pair["better"] if above == pair["first"] else 1 - pair["better"]
    p = "p < 0.001" if pair["p_corrected"] < 0.001 else f"p {pair['p_corrected']:.3f}"
    return (f"{above} above {below} in {pair['region']}: {100 * better:.0f}% of its targets, {p} "
            f"({pair['correction']}){'' if pair['significant'] else ', not significant'}")


GROUP = "regions"  # in ENC.h5: the rows of TABLE as columns, the pairs' as pair_*


def stored_arrays(bounds: Bounds) -> dict[str, np.ndarray]:
    """BOUNDS as ENC.h5's /regions group holds them (`analysis.results.annex`): a column per field."""
    import h5py

    def column(rows: list[dict], key: str) -> np.ndarray:
        values = [row[key] for row in rows]
        if values and isinstance(values[0], str):
            return np.array(values, dtype=h5py.string_dtype())
        return np.array(values, dtype=np.float64 if not values or isinstance(values[0], float) else np.int64)

    return {**{key: column(bounds.rows, key) for key in TABLE},
            **{f"pair_{key}": column(bounds.pairs, key) for key in PAIRS}}


def read_stored(group) -> Bounds:
    """The Bounds an ENC.h5's /regions GROUP holds."""
    def text(value):
        return value.decode() if isinstance(value, bytes) else value.item() if hasattr(value, "item") else value

    rows = [dict(zip(TABLE, values)) for values in zip(*([text(v) for v in group[key][:]] for key in TABLE))]
    pairs = [dict(zip(PAIRS, values)) for values in zip(*([text(v) for v in group[f"pair_{key}"][:]]
                                                         for key in PAIRS))]
    return Bounds(rows, pairs)


def region_of_targets(rois: str | Path | None, columns: list[str]) -> np.ndarray:
    """(T,) each target's region, from the CSV/TSV ROIS (target,region per line; a header line `target,...` is
    skipped); without ROIS every target is in `all`. UsageProblem naming a target it leaves out or one it names
    that is none."""
    if rois is None:
        return np.full(len(columns), ALL, dtype=object)
    path = Path(rois)
    if not path.exists():
        raise UsageProblem(f"No regions file {str(rois)!r}: give a CSV of target,region lines.")
    with open(path, newline="", encoding="utf-8-sig") as handle:
        delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
        lines = [[cell.strip() for cell in line] for line in csv.reader(handle, delimiter=delimiter) if line]
    if lines and lines[0][0].lower() == "target":
        lines = lines[1:]
    given = {line[0]: line[1] for line in lines if len(line) >= 2}
    unknown = [name for name in given if name not in set(columns)]
    missing = [name for name in columns if name not in given]
    if unknown or missing:
        raise UsageProblem(f"{str(rois)!r} names {len(unknown)} targets the targets file lacks "
                           f"({', '.join(unknown[:3]) or 'none'}) and leaves {len(missing)} of its {len(columns)} "
                           f"out ({', '.join(missing[:3]) or 'none'}): give each target's region on a line.")
    return np.array([given[name] for name in columns], dtype=object)


def bounded(predicted: dict[str, np.ndarray], actual: np.ndarray, columns: list[str], regions: np.ndarray,
            ceilings: Ceilings | None, samples: int, seed: int, fdr: bool) -> Bounds:
    """The Bounds of the layers' held-out PREDICTED (N, T) against ACTUAL (N, T) of the targets COLUMNS, by
    REGIONS (T,), over SAMPLES resamples of the images from SEED."""
    names, count = list(predicted), len(actual)
    weights = np.random.default_rng(seed).multinomial(count, np.full(count, 1.0 / count), size=samples) \
        if samples else np.zeros((0, count))
    each = {name: _pearson(values, actual) for name, values in predicted.items()}
    resampled = {name: _resampled_r(values, actual, weights) for name, values in predicted.items()}  # (B, T)
    rows, pairs = [], []
    for region in sorted(set(regions.tolist())):
        members = regions == region
        evaluations = np.stack([_median(resampled[name][:, members]) for name in names], axis=1)  # (B, L)
        for place, name in enumerate(names):
            rows.append(_row(name, region, each[name][members], evaluations[:, place],
                             None if ceilings is None else ceilings.r_ceiling[members], count))
        for pair in pair_tests(names, evaluations, count - 1, fdr):
            first, second = each[pair["first"]][members], each[pair["second"]][members]
            pairs.append({"region": region, **pair, "better": float(np.mean(first > second))})
    return Bounds(rows, pairs, _target_rows(each, resampled, columns, regions, ceilings))


def _target_rows(each: dict, resampled: dict, columns: list[str], regions: np.ndarray,
                 ceilings: Ceilings | None) -> list[dict]:
    """A row per layer and target: its r over all images and the 95% interval of its resamples' r."""
    rows = []
    for name, r in each.items():
        low, high = np.nanpercentile(resampled[name], [2.5, 97.5], axis=0) if len(resampled[name]) else \
            (np.full(len(r), np.nan), np.full(len(r), np.nan))
        ceiling = ceilings.r_ceiling if ceilings is not None else np.full(len(r), np.nan)
        rows += [{"layer": name, "target": target, "region": region, "r": float(value), "low": float(lower),
                  "high": float(upper), "ceiling": float(bound)}
                 for target, region, value, lower, upper, bound in zip(columns, regions, r, low, high, ceiling)]
    return rows


def _row(layer: str, region: str, r: np.ndarray, evaluations: np.ndarray, r_ceiling: np.ndarray | None,
         images: int) -> dict:
    low, high = np.percentile(evaluations, [2.5, 97.5]) if len(evaluations) else (np.nan, np.nan)
    row = {"layer": layer, "region": region, "score": _median(r[None])[0], "low": float(low), "high": float(high),
           "ceiling": np.nan, "share": np.nan, "n_targets": len(r), "n_images": images}
    if r_ceiling is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            row.update(ceiling=float(np.median(r_ceiling)), share=_median((r / r_ceiling)[None])[0])
    return row


def _pearson(predicted: np.ndarray, actual: np.ndarray) -> np.ndarray:
    first, second = predicted - predicted.mean(0), actual - actual.mean(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (first * second).sum(0) / np.sqrt((first ** 2).sum(0) * (second ** 2).sum(0))


def _resampled_r(predicted: np.ndarray, actual: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(B, T): every target's Pearson r in each resample, its images counted as WEIGHTS (B, N) has them drawn."""
    first, second = predicted - predicted.mean(0), actual - actual.mean(0)  # centred once: the sums stay exact
    moments = np.concatenate([first, second, first * second, first ** 2, second ** 2], axis=1)
    width, out = first.shape[1], np.empty((len(weights), first.shape[1]))
    for start in range(0, len(weights), _CHUNK):
        chunk = weights[start:start + _CHUNK]
        sums = (chunk @ moments) / chunk.sum(axis=1, keepdims=True)
        mean_p, mean_a, cross, square_p, square_a = (sums[:, part * width:(part + 1) * width] for part in range(5))
        with np.errstate(divide="ignore", invalid="ignore"):
            out[start:start + _CHUNK] = (cross - mean_p * mean_a) / np.sqrt(
                np.maximum(square_p - mean_p ** 2, 0) * np.maximum(square_a - mean_a ** 2, 0))
    return out


def _median(values: np.ndarray) -> np.ndarray:
    """Each row's median over its finite values (NaN where none is)."""
    finite = np.where(np.isfinite(values), values, np.nan)
    out = np.full(len(values), np.nan)
    some = np.isfinite(finite).any(axis=1)
    out[some] = np.nanmedian(finite[some], axis=1)
    return out


TABLE = ("layer", "region", "score", "low", "high", "ceiling", "share", "n_targets", "n_images")
TARGETS = ("layer", "target", "region", "r", "low", "high", "ceiling")
PAIRS = ("region", "first", "second", "better", "difference", "p", "p_corrected", "correction", "significant")


def write_bounds(to: Path, bounds: Bounds) -> None:
    """TO (.csv): a row per layer and region (TABLE), the pairs in TO's name with .pairs.csv (PAIRS), a row per
    layer and target with .targets.csv (TARGETS); or .nc, all in one NetCDF file (over the dimensions `row`, `pair`
    and `target_row`), for xarray."""
    to = Path(to)
    if to.suffix == ".nc":
        import xarray as xr

        table = xr.Dataset({key: ("row", [row[key] for row in bounds.rows]) for key in TABLE})
        for key in PAIRS:
            table[f"pair_{key}"] = ("pair", [pair[key] for pair in bounds.pairs])
        for key in TARGETS:
            table[f"target_{key}"] = ("target_row", [row[key] for row in bounds.targets])
        table.to_netcdf(to)
        return
    for path, columns, rows in ((to, TABLE, bounds.rows),
                                (to.with_name(to.stem + ".pairs.csv"), PAIRS, bounds.pairs),
                                (to.with_name(to.stem + ".targets.csv"), TARGETS, bounds.targets)):
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
