"""Show: one image's features as a picture (input image, channel-mean map, strongest channels or units)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from featdump.errors import UnknownLayer, UsageProblem
from featdump.layout import Output


def draw(output: Path, layer: str | None, index: int, picture: Path | None, channels: int = 16) -> Path:
    """Write a PNG of row INDEX of LAYER of OUTPUT (default PICTURE: OUTPUT-LAYER-INDEX.png); returns it."""
    plt = _pyplot()
    values, name, image = _read(Path(output), layer, index)
    picture = Path(picture) if picture else Path(output).with_name(f"{Path(output).stem}-{name}-{index}.png")
    grid = _as_maps(values)
    if grid is None:
        figure = _draw_units(plt, values.reshape(-1), image, name, index, channels)
    else:
        figure = _draw_maps(plt, grid, image, name, index, channels)
    figure.savefig(picture, dpi=100)
    plt.close(figure)
    return picture


def _pyplot():
    try:
        import matplotlib
    except ImportError as error:
        raise UsageProblem("featdump show draws with matplotlib: pip install 'featdump[plot]'.") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _read(output: Path, layer: str | None, index: int):
    """(row INDEX of LAYER as float32, the layer's name, the input image as RGB or None if not found)."""
    with Output.open(output) as opened:
        names = opened.layers
        name = layer or names[0]
        if name not in names:
            raise UnknownLayer(f"{str(output)!r} has no layer {name!r}; it has {', '.join(names)}.")
        rows = opened.committed.rows
        if index >= rows:
            raise UsageProblem(f"--index {index} is past the last row ({rows - 1}) of {str(output)!r}.")
        values = np.asarray(opened.features(name)[index], dtype=np.float32)
        root = str(opened.attrs.get("image_root", ""))
        path = Path(os.fsdecode(os.path.join(os.fsencode(root), opened.raw_paths()[index])))
    return values, name, _open_image(path)


def _open_image(path: Path):
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as image:
            return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))
    except OSError:
        return None  # moved or gone: the features are drawn alone


def _as_maps(values: np.ndarray) -> np.ndarray | None:
    """(channels, H, W) maps: a conv layer's output, or a ViT's patch tokens laid on their grid; None for vectors."""
    if values.ndim == 3 and values.shape[1] * values.shape[2] > 1:
        return values
    if values.ndim == 2:  # (tokens, dim): drop a class token if the rest is square
        tokens = values.shape[0]
        for skip in (0, 1):
            side = math.isqrt(tokens - skip)
            if side > 1 and side * side == tokens - skip:
                return values[skip:].T.reshape(values.shape[1], side, side)
    return None


def _draw_maps(plt, maps: np.ndarray, image, name: str, index: int, channels: int):
    strongest = np.argsort(maps.mean(axis=(1, 2)))[::-1][:channels]
    columns = math.ceil(math.sqrt(len(strongest)))
    rows_of_grid = math.ceil(len(strongest) / columns)
    figure = plt.figure(figsize=(12, 4))
    panels = figure.subfigures(1, 3, width_ratios=[1, 1, 1])
    _image_panel(panels[0], image, index)
    axis = panels[1].subplots()
    shown = axis.imshow(maps.mean(axis=0), cmap="viridis")
    panels[1].colorbar(shown, ax=axis, shrink=0.8)
    axis.set_title(f"{name}: mean of {maps.shape[0]} channels")
    axis.axis("off")
    axes = np.atleast_1d(panels[2].subplots(rows_of_grid, columns)).reshape(-1)
    for axis, channel in zip(axes, strongest):
        axis.imshow(maps[channel], cmap="viridis")
        axis.set_title(str(channel), fontsize=7)
    for axis in axes:
        axis.axis("off")
    panels[2].suptitle(f"strongest {len(strongest)} channels (by mean)", fontsize=10)
    return figure


def _draw_units(plt, vector: np.ndarray, image, name: str, index: int, units: int):
    strongest = np.argsort(vector)[::-1][: max(units, 16)]
    figure = plt.figure(figsize=(12, 4))
    panels = figure.subfigures(1, 2, width_ratios=[1, 2])
    _image_panel(panels[0], image, index)
    axis = panels[1].subplots()
    axis.bar(range(len(strongest)), vector[strongest])
    axis.set_xticks(range(len(strongest)), [str(unit) for unit in strongest], rotation=90, fontsize=7)
    axis.set_title(f"{name}: strongest {len(strongest)} of {vector.size} units")
    return figure


def _image_panel(panel, image, index: int) -> None:
    axis = panel.subplots()
    if image is not None:
        axis.imshow(image)
        axis.set_title(f"image {index}")
    else:
        axis.text(0.5, 0.5, "image not found", ha="center", va="center")
    axis.axis("off")
