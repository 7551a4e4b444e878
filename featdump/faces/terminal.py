"""The terminal: a tqdm bar when stderr is one, timestamped log lines otherwise (cron, SLURM, CI), and the logging
set-up they share (a log line never breaks a bar)."""

from __future__ import annotations

import logging
import math
import sys
import time

log = logging.getLogger("featdump")



def progress_for(unit: str = "img"):
    """A tqdm bar on a terminal, log lines otherwise; counting UNIT (img, MB)."""
    return BarProgress(unit) if sys.stderr.isatty() else LogProgress(unit)


class BarProgress:
    """A tqdm bar on a terminal."""

    def __init__(self, unit: str = "img"):
        self._bar, self._unit = None, unit
        self._scale = 1e6 if unit == "MB" else 1  # megabytes read are shown as bytes: 1.42 GB/3.54 GB, 210 MB/s

    def start(self, total: int, done: int, noun: str = "image") -> None:
        if total <= done:  # nothing to do (an update that only adds layers has no new image): no empty bar
            return
        from tqdm import tqdm

        unit = self._unit if noun == "image" else noun
        units = dict(unit="B", unit_scale=True, unit_divisor=1000) if self._scale != 1 else dict(unit=unit)
        self._bar = tqdm(total=total * self._scale, initial=done * self._scale, dynamic_ncols=True, smoothing=0.1,
                         **units)

    def advance(self, images: int) -> None:
        if self._bar is not None:
            self._bar.update(images * self._scale)

    def found(self, rows: int) -> None:
        """ROWS done before: on the bar, out of its rate."""
        if self._bar is not None and rows:
            self._bar.n += rows * self._scale
            self._bar.last_print_n += rows * self._scale
            self._bar.initial += rows * self._scale
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class LogProgress:
    """Plain log lines when stderr is not a terminal: every 30 s, and at 10% steps (the first at once, the others
    at most every 5 s: a quick job says ten lines in ten seconds at most, not ten at once)."""

    def __init__(self, unit: str = "img", every_seconds: float = 30.0, least_seconds: float = 5.0):
        self._every, self._least, self._unit = every_seconds, least_seconds, unit

    def start(self, total: int, done: int, noun: str = "image") -> None:
        self._total, self._done, self._first = total, done, done
        self._noun = noun
        self._started = self._last = time.monotonic()
        self._said = -math.inf  # when a step was last said
        self._next_step = done + max(1, total // 10)

    def advance(self, images: int) -> None:
        self._done += images
        now = time.monotonic()
        step = self._done >= self._next_step and now - self._said >= self._least
        if now - self._last >= self._every or step:
            rate = (self._done - self._first) / max(now - self._started, 1e-9)
            names, unit = ("images", "img") if self._noun == "image" else (f"{self._noun}s", self._noun)
            names, unit = (names, unit) if self._unit == "img" else (self._unit, self._unit)
            log.info("%d/%d %s (%.0f%%), %.1f %s/s", self._done, self._total, names,
                     100.0 * self._done / max(self._total, 1), rate, unit)
            self._last = self._said = now
            while self._next_step <= self._done:
                self._next_step += max(1, self._total // 10)

    def found(self, rows: int) -> None:
        """ROWS done before: counted, out of the rate."""
        self._done += rows
        self._first += rows

    def close(self) -> None:
        pass


class _TqdmHandler(logging.Handler):
    """Log lines that do not tear a tqdm bar."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        tqdm.write(self.format(record), file=sys.stderr)


def setup_logging(level: int) -> None:
    logger = logging.getLogger("featdump")
    logger.handlers.clear()
    if sys.stderr.isatty():
        handler = _TqdmHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s featdump %(levelname)s: %(message)s",
                                               "%Y-%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
