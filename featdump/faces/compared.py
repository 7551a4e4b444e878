"""The figure of `featdump compare`: the layers against their score and interval, the noise ceiling as a band, the
pairs that differ marked."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from featdump.analysis.compare import Comparison
from featdump.faces.show import pyplot


def draw(result: Comparison, picture: Path, method: str) -> Path:
    """PICTURE (.png): the layers (x) against their score with its interval, the noise ceiling as a band, and the
    pairs whose corrected p is below 0.05 marked by a bar above them."""
    plt = pyplot()
    places = np.arange(len(result.layers))
    figure, axis = plt.subplots(figsize=(max(4.5, 0.6 * len(places) + 2.5), 4))
    axis.axhspan(*result.ceiling, color="0.85", label=f"noise ceiling ({result.ceiling[0]:.2f} to "
                                                      f"{result.ceiling[1]:.2f})")
    below, above = result.scores - result.low, result.high - result.scores
    axis.errorbar(places, result.scores, yerr=np.nan_to_num([below, above]), color="C0", marker="o", capsize=3,
                  label=f"mean {method} over {result.subjects} subjects (95% bootstrap interval)")
    top = np.nanmax(np.r_[result.high, result.scores, result.ceiling[1]])
    step = 0.04 * max(top - min(0.0, np.nanmin(result.scores)), 1e-6)
    significant = [pair for pair in result.pairs if pair["significant"]]
    for level, pair in enumerate(significant, start=1):
        first, second = result.layers.index(pair["first"]), result.layers.index(pair["second"])
        axis.plot([first, second], [top + level * step] * 2, color="0.3", linewidth=1)
    axis.set_xticks(places, result.layers, rotation=60, ha="right", fontsize=8)
    axis.set_ylabel(f"{method} with the data RDMs")
    axis.set_title(f"{result.images} images; bars: pairs that differ (corrected p < 0.05)", fontsize=10)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(picture, dpi=120)
    plt.close(figure)
    return picture
