"""Matrices: an RDMS.h5 or CKA.h5 drawn as a picture with its labels (`--plot`, `featdump show RESULTS`); a read-out's
result is drawn by `curves`."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np

from featdump.errors import NotAnOutput
from featdump.faces.curves import draw_readouts, is_readouts
from featdump.faces.regions import draw_regions, has_regions
from featdump.faces.show import pyplot
from featdump.output.layout import open_to_read, text_of

_MOST_RDMS = 16  # drawn side by side; a file with more draws its first 16 (and says so in the title)
_MOST_PIXELS = 256  # rows of an RDM drawn one per pixel; more are drawn as block means


def is_results(path: Path) -> bool:
    """Whether PATH is a file `featdump rdm`, `cka`, `probe` or `encode` wrote."""
    try:
        with open_to_read(path) as h5file:
            return "made_from" in h5file.attrs
    except OSError:
        return False


def draw_results(path: Path, picture: Path) -> Path:
    """Draw the RDMs (one panel per layer, the classes marked along both axes), the CKA matrix (layer names
    along both axes, the values written in when there is room) or the read-outs' scores by layer of PATH into
    PICTURE."""
    plt = pyplot()
    try:
        with open_to_read(path) as h5file:
            if "cka" in h5file:
                figure = _draw_cka(plt, h5file["cka"])
            elif "rdms" in h5file:
                figure = _draw_rdms(plt, h5file)
            elif has_regions(h5file):  # an encoding by region (--rois, --repeats, --table): a panel each
                figure = draw_regions(plt, h5file)
            elif is_readouts(h5file):
                figure = draw_readouts(plt, h5file)
            else:
                raise NotAnOutput(f"{str(path)!r} holds neither RDMs, a CKA matrix nor read-outs.")
    except OSError as error:
        raise NotAnOutput(f"{str(path)!r} is not a readable HDF5 file ({error}).") from error
    figure.savefig(picture, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return Path(picture)


def _draw_rdms(plt, h5file: h5py.File):
    names = list(h5file["rdms"])
    recorded = [text_of(name) for name in h5file.attrs.get("layers", [])]
    names = [name for name in recorded if name in names] or names
    shown = names[:_MOST_RDMS]
    columns = panel_columns(len(shown))
    rows = math.ceil(len(shown) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 4 * rows), squeeze=False)
    labels, classes = h5file["labels"][:], [text_of(name) for name in h5file["labels"].attrs.get("classes", [])]
    labelled = len(labels) > 0 and labels.min() >= 0
    order = np.argsort(labels, kind="stable") if labelled else np.arange(len(labels))  # rows grouped by class
    for axis, name in zip(axes.flat, shown):
        dataset = h5file["rdms"][name]
        values, scale = shown_matrix(dataset, order)
        image = axis.imshow(values, cmap="viridis", interpolation="nearest")
        means = f", means of {len(order) / len(values):.0f}-row blocks" if scale < 1 else ""
        axis.set_title(f"{name} ({text_of(dataset.attrs.get('metric'))}{means})", fontsize=9)
        figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04)
        _mark_classes(axis, labels[order] if labelled else labels, classes, scale)
    for axis in list(axes.flat)[len(shown):]:
        figure.delaxes(axis)
    if len(names) > len(shown):
        figure.suptitle(f"the first {len(shown)} of {len(names)} layers")
    figure.tight_layout()
    return figure


def panel_columns(count: int) -> int:
    """Columns for COUNT panels: all in one row up to 5, else 3 to 6 with the fewest empty slots (more columns on
    a tie)."""
    if count <= 5:
        return max(count, 1)
    return min(range(3, 7), key=lambda columns: (-count % columns, -columns))


def shown_matrix(dataset: h5py.Dataset, order: np.ndarray, most: int = _MOST_PIXELS) -> tuple[np.ndarray, float]:
    """The N x N matrix DATASET with its rows and columns in ORDER, as drawn: whole when N <= MOST, else the means
    of MOST x MOST blocks (a nearest-pixel squeeze of 5,000 rows into 260 pixels aliases into moire), read a
    block of rows at a time; and the scale from rows to what is drawn."""
    count = len(order)
    if count <= most:
        return dataset[:][np.ix_(order, order)], 1.0
    edges = np.linspace(0, count, most + 1).astype(np.int64)
    widths = np.diff(edges)
    means = np.empty((most, most))
    for block in range(most):
        rows = order[edges[block]:edges[block + 1]]
        part = dataset[np.sort(rows), :][:, order]
        means[block] = np.add.reduceat(part.sum(0), edges[:-1]) / (len(rows) * widths)
    return means, most / count


def _mark_classes(axis, labels: np.ndarray, classes: list[str], scale: float = 1.0) -> None:
    """Class names at the middle of each run of rows of one class, lines between runs; SCALE: rows to pixels."""
    if not len(labels) or labels.min() < 0 or not classes:
        axis.set_xticks([])
        axis.set_yticks([])
        return
    starts = [0] + [row for row in range(1, len(labels)) if labels[row] != labels[row - 1]]
    ends = starts[1:] + [len(labels)]
    middles = [(start + end) / 2 * scale - 0.5 for start, end in zip(starts, ends)]
    names = [classes[labels[start]] if labels[start] < len(classes) else str(labels[start]) for start in starts]
    if len(starts) > 40:  # too many to read: the boundaries alone
        middles, names = [], []
    axis.set_xticks(middles, names, rotation=90, fontsize=7)
    axis.set_yticks(middles, names, fontsize=7)
    for start in starts[1:]:
        axis.axhline(start * scale - 0.5, color="white", linewidth=0.5)
        axis.axvline(start * scale - 0.5, color="white", linewidth=0.5)


def _draw_cka(plt, dataset: h5py.Dataset):
    values = dataset[:]
    rows = [text_of(name) for name in dataset.attrs["rows"]]
    columns = [text_of(name) for name in dataset.attrs["columns"]]
    size = (max(4.0, 0.45 * len(columns) + 2.5), max(3.5, 0.4 * len(rows) + 1.5))
    figure, axis = plt.subplots(figsize=size)
    image = axis.imshow(values, cmap="magma", vmin=0.0, vmax=1.0, interpolation="nearest")
    axis.set_xticks(range(len(columns)), columns, rotation=90, fontsize=8)
    axis.set_yticks(range(len(rows)), rows, fontsize=8)
    if len(rows) * len(columns) <= 144:
        for (row, column), value in np.ndenumerate(values):
            axis.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=7,
                      color="black" if value > 0.6 else "white")
    unbiased = bool(dataset.attrs.get("unbiased", False))
    axis.set_title(f"linear CKA{' (unbiased)' if unbiased else ''}, {int(dataset.attrs.get('images', 0))} images",
                   fontsize=10)
    figure.colorbar(image, ax=axis)
    figure.tight_layout()
    return figure
