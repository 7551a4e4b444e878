"""Signals: SIGINT and SIGTERM ask the loop to stop after committing the batch in flight."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

log = logging.getLogger("featdump")


class StopSignals:
    """SIGINT/SIGTERM ask the loop to stop after the batch in flight; a second SIGINT exits at once."""

    def __init__(self):
        self.signal_number: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _handle(self, number, frame) -> None:
        if self.signal_number is not None:
            if number == signal.SIGINT:
                sys.stderr.write("featdump: second interrupt, exiting now; committed rows are kept.\n")
                os._exit(130)
            return
        self.signal_number = number
        log.warning("%s received: committing the batch in flight, then stopping (Ctrl-C again to stop now).",
                    signal.Signals(number).name)
