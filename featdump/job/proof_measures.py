"""How the proof measures a run's rows against their reference and against the emulation's: each row's error (its
largest element's, or the whole row's), the row nearest its own bound, and a layer's tests judged together."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from featdump.job import tolerances


@dataclass(frozen=True)
class Judged:
    """One layer's tests: (error, bound) of the row nearest its bound for the largest element's and the whole row's
    errors; (value, bound, channel) of the channel nearest its bound for the mean shift and the scale (with its factor);
    and the
    emulation's farthest row (either error), which the precision's ceiling caps."""

    largest: tuple[float, float]
    whole: tuple[float, float]
    shift: tuple[float, float, int]
    scale: tuple[float, float, int, float]
    emulated: float

    @property
    def used(self) -> float:
        """The largest fraction of a bound any test used."""
        return max(fraction(*self.largest), fraction(*self.whole), fraction(*self.shift[:2]),
                   fraction(*self.scale[:2]))


def fraction(value: float, limit: float) -> float:
    return 0.0 if limit == np.inf else value / limit if limit > 0 else np.inf if value > 0 else 0.0


def nearest_row(errors: list[float], emulated: list[float], parts: list[str], storage: str,
                 fixed: list[bool] | None = None) -> tuple[float, float]:
    """(error, bound) of the row nearest its own bound (or farthest past it): each row's bound from its own
    emulation's error (a watched row, unemulated, from the farthest emulated row's), so that more rows proved never
    loosen the test of one. The precision's ceiling caps the bounds of the FIXED rows (every run proves them: the
    fit is judged there); a drawn row is held to its own emulation alone, so that no draw decides the fit."""
    fallback = finite_max(emulated)
    fixed = [True] * len(emulated) if fixed is None else fixed
    bounds = [tolerances.bound(parts, own if np.isfinite(own) else fallback, storage, capped=is_fixed)
              for own, is_fixed in zip(emulated, fixed)]
    fractions = [fraction(error, limit) for error, limit in zip(errors, bounds)]
    row = int(np.argmax(fractions))
    return errors[row], bounds[row]


def by_channel(difference: np.ndarray, shape: tuple[int, ...], axis: int | None) -> np.ndarray:
    """One row's DIFFERENCE (flat) as (channels, entries): AXIS of SHAPE first; every entry its own channel when
    AXIS is None."""
    if axis is None or len(shape) <= 1:
        return difference.reshape(-1, 1)
    return np.moveaxis(difference.reshape(shape), axis, 0).reshape(shape[axis], -1)


def row_errors(got: np.ndarray, reference: np.ndarray, whole: bool = False) -> list[float]:
    """Per row: max |GOT - REFERENCE| / max |REFERENCE| (WHOLE: ||GOT - REFERENCE|| / ||REFERENCE||, the L2 norms);
    inf where GOT is non-finite and the reference is finite (values non-finite in both, alike, count as equal)."""
    errors = []
    for got_row, reference_row in zip(got, reference):
        finite = np.isfinite(reference_row)
        if not np.isfinite(got_row[finite]).all():
            errors.append(float("inf"))
            continue
        alike = ~finite & ((got_row == reference_row) | (np.isnan(got_row) & np.isnan(reference_row)))
        if not (finite | alike).all():
            errors.append(float("inf"))
            continue
        difference, kept = got_row[finite] - reference_row[finite], reference_row[finite]
        if whole:
            errors.append(float(np.linalg.norm(difference)) / max(float(np.linalg.norm(kept)), 1e-30))
        else:
            errors.append(float(np.abs(difference).max(initial=0.0)) / max(float(np.abs(kept).max(initial=0.0)),
                                                                             1e-30))
    return errors


def chosen_of(values: list[float], chosen: list[bool]) -> list[float]:
    return [value for value, keep in zip(values, chosen) if keep]


def finite_max(values: list[float]) -> float:
    finite = [value for value in values if np.isfinite(value)]
    return max(finite, default=0.0)


def plain(value: float) -> float | str:
    return value if np.isfinite(value) else "inf"
