"""The proof's per-channel statistics over the proved rows: each channel's mean shift (`ChannelMeans`) and its
least-squares scale (`ChannelScales`) between the run's rows and the emulation's, and the emulation's and fp32's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from featdump.output.netcdf import axis_kinds

MIN_ROWS = 4  # proved rows before channel means are judged (their noise is estimated from the rows' spread)


@dataclass
class ChannelMeans:
    """Per channel, the mean over each proved row's positions of (rows - other rows) / the row's largest fp32
    value, and over the rows the mean of those and their spread: a systematic error of one channel, which the row
    errors are too coarse to see where the precision's own noise is large, shows as a mean far beyond the spread."""

    sums: np.ndarray | None = None  # per channel: the sum over rows of each row's channel mean
    squares: np.ndarray | None = None  # per channel: the sum over rows of its square
    rows: int = 0

    def add(self, differences: np.ndarray) -> None:
        """DIFFERENCES: (channels, entries) of one proved row."""
        means = differences.mean(axis=1)
        self.sums = means if self.sums is None else self.sums + means
        self.squares = means**2 if self.squares is None else self.squares + means**2
        self.rows += 1

    def means(self) -> np.ndarray:
        """Per channel, the mean over the rows (zeros before any row)."""
        return np.zeros(1) if self.sums is None else self.sums / self.rows

    def errors(self) -> np.ndarray | None:
        """Per channel, the standard error of its mean (its rows' spread over the square root of their count),
        floored at the median channel's (a channel whose few rows happen to agree is not trusted to be that
        exact); None under MIN_ROWS rows."""
        if self.sums is None or self.rows < MIN_ROWS:
            return None
        spread = np.maximum(self.squares / self.rows - (self.sums / self.rows) ** 2, 0.0) * self.rows / (self.rows - 1)
        errors = np.sqrt(spread / self.rows)
        return np.maximum(errors, np.median(errors))


@dataclass
class ChannelScales:
    """Per channel, the sums that give the least-squares factor between one set of rows and another (the run's and
    the emulation's; the emulation's and fp32's) over the proved rows and positions, and how far apart the two are
    in all: a fault that scales a channel shows a factor farther from 1 than the precision's own error of that
    channel could make it."""

    products: np.ndarray | None = None  # per channel: the sum of got x base
    squares: np.ndarray | None = None  # per channel: the sum of base^2
    got_squares: np.ndarray | None = None  # per channel: the sum of got^2
    entries: int = 0  # per channel: the values summed (rows x positions)

    def add(self, got: np.ndarray, base: np.ndarray) -> None:
        """GOT and BASE: (channels, entries) of one proved row, in units of its largest fp32 value."""
        sums = ((got * base).sum(axis=1), (base * base).sum(axis=1), (got * got).sum(axis=1))
        if self.products is None:
            self.products, self.squares, self.got_squares = sums
        else:
            self.products, self.squares, self.got_squares = (self.products + sums[0], self.squares + sums[1],
                                                             self.got_squares + sums[2])
        self.entries += got.shape[1]

    def deviations(self) -> np.ndarray:
        """Per channel, |factor - 1| (0 where the base is all zeros, and before any row)."""
        if self.products is None:
            return np.zeros(1)
        held = self.squares > 0
        factors = np.divide(self.products, self.squares, out=np.ones_like(self.products), where=held)
        return np.where(held, np.abs(factors - 1.0), 0.0)

    def effects(self) -> np.ndarray:
        """Per channel, how far its factor moves its values: |factor - 1| x the base's root mean square (in the
        rows' units: a row's largest value). Small where the channel is, however far its factor is from 1."""
        if self.products is None:
            return np.zeros(1)
        return self.deviations() * self.spread(self.squares)

    def spread(self, sums: np.ndarray) -> np.ndarray:
        """SUMS of squares per channel as a root mean square over the entries summed."""
        return np.sqrt(sums / max(self.entries, 1))

    def apart(self) -> np.ndarray:
        """Per channel, the sum of (got - base)^2: how far the two sets are in all."""
        return np.maximum(self.got_squares - 2 * self.products + self.squares, 0.0)


def channel_axis(shape: tuple[int, ...], attributes: dict) -> int | None:
    """The axis of a stored row whose entries are channels (or features), as the file names them; None when no
    axis is (then every entry is its own channel)."""
    kinds = axis_kinds(shape, attributes)
    if len(shape) == 1:
        return 0
    for kind in ("channel", "feature"):
        if kind in kinds:
            return kinds.index(kind)
    return None
