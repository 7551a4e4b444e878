"""An encoding's regions as people read them (`readout.bounds`, kept in ENC.h5's /regions): the figure of the paper,
a panel per region with the layers (x) against their median r and its interval, the noise ceiling as a band and
the pairs that differ marked; and `featdump info`'s lines."""

from __future__ import annotations

import h5py
import numpy as np

from featdump.readout.bounds import GROUP, Bounds, read_stored, said_of_pair, said_of_row


def has_regions(h5file: h5py.File) -> bool:
    return GROUP in h5file


def regions_of(h5file: h5py.File) -> Bounds:
    return read_stored(h5file[GROUP])


def draw_regions(plt, h5file: h5py.File):
    """A panel per region: each layer's median r with its 95% interval, the median r ceiling as a band (with
    --repeats), and a bar above each pair of layers whose corrected p is below 0.05."""
    found = regions_of(h5file)
    regions = sorted({row["region"] for row in found.rows})
    layers = list(dict.fromkeys(row["layer"] for row in found.rows))
    figure, axes = plt.subplots(1, len(regions), figsize=(max(4.5, 0.5 * len(layers) + 2.5) * len(regions), 4),
                                squeeze=False, sharey=True)
    for axis, region in zip(axes[0], regions):
        rows = {row["layer"]: row for row in found.rows if row["region"] == region}
        scores = np.array([rows[layer]["score"] for layer in layers])
        low, high = (np.array([rows[layer][key] for layer in layers]) for key in ("low", "high"))
        ceiling = rows[layers[0]]["ceiling"]
        if np.isfinite(ceiling):
            axis.axhspan(0, ceiling, color="0.9", label=f"noise ceiling (r {ceiling:.2f})")
        axis.errorbar(np.arange(len(layers)), scores, yerr=np.nan_to_num([scores - low, high - scores]), color="C0",
                      marker="o", capsize=3, label="median r (95% bootstrap interval over images)")
        top = np.nanmax(np.r_[high, scores, ceiling if np.isfinite(ceiling) else np.nan])
        step = 0.04 * max(top - min(0.0, np.nanmin(low)), 1e-6)
        differing = [pair for pair in found.pairs if pair["region"] == region and pair["significant"]]
        for level, pair in enumerate(differing, start=1):
            places = [layers.index(pair["first"]), layers.index(pair["second"])]
            axis.plot(places, [top + level * step] * 2, color="0.3", linewidth=1)
        axis.set_xticks(np.arange(len(layers)), layers, rotation=60, ha="right", fontsize=8)
        axis.set_title(f"{region}: {rows[layers[0]]['n_targets']} targets, {rows[layers[0]]['n_images']} images",
                       fontsize=10)
    axes[0][0].set_ylabel("median r (bars: pairs that differ, corrected p < 0.05)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    return figure


def region_lines(h5file: h5py.File) -> list[str]:
    """`featdump info`'s lines of an ENC.h5's regions."""
    found = regions_of(h5file)
    lines = ["regions:"]
    lines += [f"  {said_of_row(row)}" for row in found.rows]
    lines += [f"  {said_of_pair(pair)}" for pair in found.pairs]
    return lines
