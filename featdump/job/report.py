"""Report: what a run tells its user: the size estimate before it starts, the Summary after it ends (the Progress it
advances is `featdump.progress`'s)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from featdump.errors import NothingRead
from featdump.output.layout import Committed, Output
from featdump.output.space import human_bytes

log = logging.getLogger("featdump")


@dataclass
class Summary:
    """What a finished run wrote."""

    output: Path
    rows: int  # images written (all runs of this output)
    skipped: int  # images skipped (all runs of this output)
    processed: int  # images this run went through
    resumed_from: int  # source position this run started at
    seconds: float
    size_bytes: int
    stale: int = 0  # rows whose image disappeared or changed (--update)
    rows_before: int = 0  # rows the output held when this run started (a resume's or an update's)
    skipped_before: int = 0
    left_out: dict = field(default_factory=dict)  # suffix: count of tar members that are no image
    layers_added: list = field(default_factory=list)  # layers an --update added to the rows already stored
    proof: dict | None = None  # this run's proof (`featdump.job.proof`), as the output records it
    noun: str = "image"  # what a row is: an image, or a clip of a video

    @property
    def new_rows(self) -> int:
        return self.rows - self.rows_before

    @property
    def new_skipped(self) -> int:
        return self.skipped - self.skipped_before

    @classmethod
    def of_finished(cls, output: Path, seconds: float) -> Summary:
        """A finished output this run found done (a shard of a re-submitted array)."""
        with Output.open(output) as finished:
            committed, noun = finished.committed, finished.noun
        return cls(output, committed.rows, committed.skipped, 0, 0, seconds, output.stat().st_size, noun=noun)

    def line(self) -> str:
        if self.layers_added:
            added = (f"Added {', '.join(self.layers_added)} to the {self.rows_before} rows of {self.output} "
                     f"in {self.seconds:.1f} s")
            notes = f"{self._stale_note()}{self._left_out_note()}{self._proof_note()}"
            return f"{added}; {self.new_rows} new {self.noun}s ({self.new_skipped} skipped), {self.rows} rows in " \
                   f"all, {human_bytes(self.size_bytes)}{notes}."
        if self.processed == 0:
            return (f"Nothing new: {self.output} already holds {self.rows} {self.noun}s ({self.skipped} skipped)"
                    f"{self._stale_note()}.")
        rate = self.processed / self.seconds if self.seconds > 0 else 0.0
        unit = "img" if self.noun == "image" else self.noun
        resumed = f", resumed at {self.noun} {self.resumed_from}" if self.resumed_from else ""
        in_all = f", {self.rows} in all ({self.skipped} skipped)," if self.rows_before or self.skipped_before else ""
        return (
            f"Wrote {self.new_rows} {self.noun}s ({self.new_skipped} skipped) to {self.output}{in_all} in "
            f"{self.seconds:.1f} s ({rate:.1f} {unit}/s{resumed}), {human_bytes(self.size_bytes)}"
            f"{self._stale_note()}{self._left_out_note()}{self._proof_note()}."
        )

    def _proof_note(self) -> str:
        """The proof in a few words: how many rows, and the layer nearest its bound."""
        if not self.proof or not self.proof.get("proved"):
            return ""
        proof = self.proof
        name, layer = max(proof["layers"].items(), key=lambda item: float(item[1]["used"]))
        return (f"; proof: {len(proof['images'])} {self.noun}s recomputed on the reference path, each layer within "
                f"its bounds (nearest: {name}, {float(layer['used']):.2f} of a bound used, {proof['configuration']})")

    def _left_out_note(self) -> str:
        if not self.left_out:
            return ""
        count = sum(self.left_out.values())
        kinds = ", ".join(f"{number} {suffix}" for suffix, number in sorted(self.left_out.items()))
        return f"; {count} tar member{'s' * (count != 1)} not used, not images ({kinds})"

    def _stale_note(self) -> str:
        if not self.stale:
            return ""
        return f"; {self.stale} rows are stale (image gone or changed since; listed by featdump info)"


def nothing_read(images, output: Path, skipped: list[tuple[str, str]], noun: str = "image") -> NothingRead:
    """The error of a new output whose run read no row: nothing is left behind, and the reasons are said here."""
    shown = "; ".join(f"{path}: {reason}" for path, reason in skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
    return NothingRead(f"No {noun} could be read: {len(skipped)} tried from {images}, all skipped ({shown}). "
                       f"Nothing was written to {output}: fix or replace them and run the same command again.")


def summarize(images: Path, output: Path, after: Committed, before: Committed, rows, start: int, started: float,
              stale: int = 0, proof: dict | None = None) -> Summary:
    """The summary of a finished run over IMAGES that went through ROWS (an ImageList: images or clips) from
    position START on; NothingRead when it tried rows and could read none."""
    noun = rows.noun
    summary = Summary(output, after.rows, after.skipped, len(rows) - start, start, time.perf_counter() - started,
                      output.stat().st_size, stale, before.rows, before.skipped, rows.left_out() or {}, proof=proof,
                      noun=noun)
    if summary.processed and not summary.new_rows:
        raise NothingRead(
            f"No {noun} could be read: {summary.new_skipped} tried from {images}, all skipped; "
            f"`featdump info {output}` lists why."
        )
    return summary
