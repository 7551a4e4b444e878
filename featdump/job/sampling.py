"""The proof's sample: which rows of a job are recomputed on the reference path, and the chance that such a sample
meets a fault (docs/proof.md)."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np


@dataclass
class Sample:
    """Which source positions are proved: COUNT_FIRST of the first batch's, and LATER ones spread over the rest of
    the job, drawn by SEED (a new one each run, recorded with the proof)."""

    count_first: int
    later: set[int]
    seed: int


def plan_sample(count: int, start: int, first_end: int, end: int, seed: int | None = None) -> Sample:
    """COUNT rows of positions START..END: a quarter (at least one) from the first batch (START..FIRST_END), so that
    a configuration that does not fit stops within seconds; the rest one in each of as many equal stretches of the
    positions after it, at a place drawn by SEED (drawn anew when None), so that a rerun, a shard or an update proves
    other rows and a fault that starts late meets the sample (docs/proof.md: the chance of seeing a fault)."""
    seed = secrets.randbits(32) if seed is None else seed
    later_count = min(count - math.ceil(count / 4), end - first_end)
    count_first = min(count - later_count, first_end - start)
    rng = np.random.default_rng(seed)
    stretches = np.linspace(first_end, end, later_count + 1).astype(int)
    later = {int(rng.integers(low, high)) for low, high in zip(stretches[:-1], stretches[1:]) if high > low}
    return Sample(count_first, later, seed)


def chance_of_seeing(count: int, first_batch: int, rows: int, faulty_after_first: float) -> tuple[float, float]:
    """The chance that a sample of COUNT rows (`plan_sample`) of a job of ROWS rows whose first batch holds
    FIRST_BATCH proves a row of a fault that touches a fraction FAULTY_AFTER_FIRST of the rows after the first batch:
    (spread evenly over them, all in one place). Each later sample is drawn in its own stretch, so an even fault is met
    with 1 - (1 - f)^M and a fault in one place, which only the stretch (or two) it falls in can meet, with M x f."""
    later = min(count - math.ceil(count / 4), rows - first_batch)
    return 1.0 - (1.0 - faulty_after_first) ** later, min(1.0, later * faulty_after_first)
