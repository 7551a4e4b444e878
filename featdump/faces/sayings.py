"""What the commands say when they are done (one line each, on stderr), and the word more a usage error gets when
`-l layer1 layer2` took a layer for IMAGES. Plain text: the CLI prints it."""

from __future__ import annotations

import time
from pathlib import Path

from featdump.forward.patterns import LAYER_LIKE


def spaced_layers(args: list[str]) -> str:
    """A word more when `-l layer1 layer2 IMAGES OUT` took layer2 for IMAGES: the word after --layers's value
    reads like a layer name and is no file."""
    for index, arg in enumerate(args[:-2]):
        following = args[index + 2]
        if arg in ("-l", "--layers") and LAYER_LIKE.fullmatch(following) and not Path(following).exists():
            return f" Layers are comma-separated: -l {args[index + 1]},{following}."
    return ""


def done_or_wrote(done_before: bool) -> str:
    """How an analysis' summary line starts: it wrote its result, or found it written by the same command."""
    return "Nothing to do: already wrote" if done_before else "Wrote"


def drawn(to: Path, plot: Path | None) -> str:
    """Draw the result file TO into PLOT when asked; the summary line's note."""
    if plot is None:
        return ""
    from featdump.faces.matrices import draw_results

    draw_results(to, plot)
    return f" (drawn in {plot})"


def rdms_line(metric: str, matrices: dict, to: Path, plot: Path | None, started: float, done_before: bool) -> str:
    """`featdump rdm`'s summary (drawing PLOT when asked)."""
    note = drawn(to, plot)
    rows = next(iter(matrices.values())).shape[0] if matrices else 0
    return (f"{done_or_wrote(done_before)} the {metric} RDMs of {len(matrices)} layer{'s' * (len(matrices) != 1)} "
            f"over {rows} images to {to} in {time.perf_counter() - started:.1f} s{note}.")


def cka_line(result, unbiased: bool, to: Path, plot: Path | None, started: float, done_before: bool) -> str:
    """`featdump cka`'s summary (drawing PLOT when asked)."""
    note = drawn(to, plot)
    return (f"{done_or_wrote(done_before)} {'unbiased ' if unbiased else ''}CKA of {len(result.rows)} x "
            f"{len(result.columns)} layers over {result.images} images to {to} in "
            f"{time.perf_counter() - started:.1f} s{note}.")


def readouts_line(kind: str, readouts: dict, to: Path, plot: Path | None, started: float, done_before: bool) -> str:
    """The summary of a probe or an encoding (drawing PLOT when asked)."""
    note = drawn(to, plot)
    best = max(readouts.values(), key=lambda readout: readout.score, default=None)
    measure = "accuracy" if kind == "probe" else "median r"
    peak = f"; the best, {best.layer}: {measure} {best.score:.3f}" if best is not None else ""
    images = len(best.fold) if best is not None else 0
    what = "probes" if kind == "probe" else "encoding models"
    return (f"{done_or_wrote(done_before)} the {what} of {len(readouts)} layer{'s' * (len(readouts) != 1)} over "
            f"{images} images to {to} in {time.perf_counter() - started:.1f} s{peak}{note}.")
