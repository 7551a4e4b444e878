"""Delays: a time series' features at earlier onsets (FIR delays of the haemodynamic response, as the Gallant lab's
voxelwise models and himalaya's Delayer make them). Row t of the delayed design is [x(t - d1), x(t - d2), ...] for
the delays D (in steps of the rows' grid, a TR), each taken from the same video at that onset; a video's first rows
get zeros for the onsets before it, never another video's rows.

The read-outs fit the delayed design through its Gram: with S_d the shift of delay d (a row's source row, or none),
the delayed rows' Gram is the sum over d of S_d K S_d^T, computed from the layer's Gram K without ever making the
D-times wider rows.

The delays are taken among every row the file holds, not only the rows with a target: a volume left out of the fit
(censored, a dropped dummy scan, a TR without a response) still gives its features to the rows after it, as a
delayed design built over each film's whole stimulus and then cut to the rows with targets does."""

from __future__ import annotations

import numpy as np
import torch

from featdump.errors import BadOption, UsageProblem

_SAME_ONSET = 1e-3  # seconds: onsets closer than this are one (a grid's clip starts are rounded to 1 ms and less)


def parse_delays(text: str | list | tuple | None, step: float | None) -> list[int]:
    """Delays in steps of the grid from '1,2,3,4' (steps) or '1.49s,2.98s' (seconds, multiples of STEP); []
    for None. BadOption otherwise."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return []
    items = [item.strip() for item in (text.split(",") if isinstance(text, str) else map(str, text)) if item.strip()]
    delays = []
    for item in items:
        try:
            if item.endswith("s"):
                if not step:
                    raise BadOption(f"--delays {item}: in seconds needs rows on a grid (clips of videos).")
                steps = float(item[:-1]) / step
                if abs(steps - round(steps)) > 0.01:
                    raise BadOption(f"--delays {item}: not a whole number of the rows' steps ({step:g} s).")
                delays.append(round(steps))
            else:
                delays.append(int(item))
        except ValueError as error:
            raise BadOption(f"--delays {text!r}: give whole steps of the grid (1,2,3,4) or seconds (1.5s,3s).") \
                from error
    if any(delay < 0 for delay in delays) or len(set(delays)) != len(delays):
        raise BadOption(f"--delays {text!r}: give distinct delays of 0 steps or more.")
    return sorted(delays)


def grid_step(paths: list[str], starts: np.ndarray) -> float:
    """The rows' grid step (a TR, or 1 / --fps) in seconds: the most common gap between a video's neighbouring
    onsets."""
    gaps = []
    for video in dict.fromkeys(paths):
        onsets = np.sort(starts[np.asarray(paths) == video])
        gaps.extend(np.round(np.diff(onsets), 6))
    if not gaps:
        raise UsageProblem("--delays: no video has two rows, so the rows have no time step to delay by.")
    values, counts = np.unique(gaps, return_counts=True)
    return float(values[np.argmax(counts)])


def sources(paths: list[str], starts: np.ndarray, delays: list[int], step: float) -> np.ndarray:
    """(len(DELAYS), N) int: for each delay and row, the row of the same video at its onset less delay x STEP, or
    -1 where there is none (before the video's first row, or a skipped clip)."""
    found = np.full((len(delays), len(paths)), -1, dtype=np.int64)
    by_video: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for video in dict.fromkeys(paths):
        rows = np.flatnonzero(np.asarray(paths) == video)
        order = np.argsort(starts[rows])
        by_video[video] = (starts[rows][order], rows[order])
    for row, (video, onset) in enumerate(zip(paths, starts)):
        onsets, rows = by_video[video]
        for index, delay in enumerate(delays):
            wanted = onset - delay * step
            place = int(np.searchsorted(onsets, wanted - _SAME_ONSET))
            if place < len(onsets) and abs(onsets[place] - wanted) <= _SAME_ONSET:
                found[index, row] = rows[place]
    return found


def gram_rows(used: np.ndarray, shifts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the file rows the delayed design of the rows USED reads: those rows and every row a delay takes from,
    sorted; SHIFTS (file rows, -1: none) as places among them; USED's places among them)."""
    read = np.union1d(np.asarray(used, dtype=np.int64), shifts[shifts >= 0])
    places = np.where(shifts >= 0, np.searchsorted(read, np.maximum(shifts, 0)), -1)
    return read, places, np.searchsorted(read, used)


def delayed_nonfinite(nonfinite: torch.Tensor, shifts: np.ndarray, used: np.ndarray) -> torch.Tensor:
    """Which rows of the delayed design (USED: places of its rows, SHIFTS: of their sources) take a non-finite row,
    their own or a delay's, from NONFINITE (of the rows read)."""
    bad = nonfinite[torch.as_tensor(used, device=nonfinite.device)].clone()
    for source in shifts:
        present = torch.as_tensor(np.flatnonzero(source >= 0), device=nonfinite.device)
        bad[present] |= nonfinite[torch.as_tensor(source[source >= 0], device=nonfinite.device)]
    return bad


def delayed_gram(gram: torch.Tensor, shifts: np.ndarray) -> torch.Tensor:
    """The Gram of the delayed rows from the (uncentred) GRAM of the rows read: the sum over delays of
    S_d GRAM S_d^T, SHIFTS (delays x design rows) as places among the rows read (-1: a zero row)."""
    delayed = gram.new_zeros((shifts.shape[1], shifts.shape[1]))
    for source in shifts:
        present = torch.as_tensor(np.flatnonzero(source >= 0), device=gram.device)
        picked = torch.as_tensor(source[source >= 0], device=gram.device)
        delayed[present[:, None], present[None, :]] += gram[picked[:, None], picked[None, :]]
    return delayed


def delayed_rows(rows: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """The delayed design itself (N, len(delays) x features): for tests and small layers."""
    padded = np.concatenate([rows, np.zeros((1, rows.shape[1]), dtype=rows.dtype)])
    return np.concatenate([padded[source] for source in shifts], axis=1)  # -1 picks the zero row
