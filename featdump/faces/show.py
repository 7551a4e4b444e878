"""Show: one image's features as a picture (input image, channel-mean map, strongest channels or units)."""

from __future__ import annotations

import io
import json
import logging
import math
import os
from pathlib import Path

import numpy as np

from featdump.errors import UnknownLayer, UsageProblem
from featdump.inputs import stored_image
from featdump.output.layout import Output
from featdump.output.netcdf import axis_kinds

log = logging.getLogger("featdump")


def draw(output: Path, layer: str | None, index: int, picture: Path | None, channels: int = 16) -> Path:
    """Write a PNG of row INDEX of LAYER of OUTPUT (default PICTURE: OUTPUT-LAYER-INDEX.png); returns it."""
    plt = pyplot()
    values, name, image, title = _read(Path(output), layer, index)
    picture = Path(picture) if picture else Path(output).with_name(f"{Path(output).stem}-{name}-{index}.png")
    over_time = _keeps_time(Path(output), name)
    grid = None if over_time else _as_maps(values)
    if over_time:
        figure = _draw_over_time(plt, values, image, name, title, channels)
    elif grid is None:
        figure = _draw_units(plt, values.reshape(-1), image, name, title, channels)
    else:
        figure = _draw_maps(plt, grid, image, name, title, channels)
    figure.savefig(picture, dpi=100)
    plt.close(figure)
    return picture


def pyplot():
    try:
        import matplotlib
    except ImportError as error:
        raise UsageProblem("featdump show draws with matplotlib: pip install 'featdump[plot]'.") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _read(output: Path, layer: str | None, index: int):
    """(row INDEX of LAYER as float32, the layer's name (default: the first requested), the image as the model saw
    it (resized and centre-cropped as its preprocessing does; None if not found), and its path)."""
    with Output.open(output) as opened:
        names = opened.layers
        requested = [str(item) for item in opened.attrs.get("layers", [])]
        name = layer or next((item for item in requested if item in names), names[0])
        if name not in names:
            raise UnknownLayer(f"{str(output)!r} has no layer {name!r}; it has {', '.join(names)}.")
        rows = opened.committed.rows
        if index >= rows:
            raise UsageProblem(f"--index {index} is past the last row ({rows - 1}) of {str(output)!r}.")
        values = np.asarray(opened.features(name)[index], dtype=np.float32)
        root = str(opened.attrs.get("image_root", ""))
        relative = opened.raw_paths()[index]
        path = Path(os.fsdecode(os.path.join(os.fsencode(root), relative)))
        geometry = json.loads(opened.attrs.get("image_geometry", "{}"))
        start = float(opened.file["clip_start"][index]) if "clip_start" in opened.file else None
    source, title = _stored_image(path, root, os.fsdecode(relative)), os.fsdecode(relative)
    if start is None:
        return values, name, _open_image(source, geometry), title
    return values, name, _clip_frame(source, start, geometry), f"{title} @ {start:g} s"


def image_as_seen(root: str, relative: str, geometry: dict, start: float | None = None) -> np.ndarray | None:
    """The image of row path RELATIVE of a job that read ROOT as the model saw it (resized and centre-cropped by
    GEOMETRY; a clip row's frame at START), from its file or read back from where the job read it; None if gone."""
    path = Path(os.fsdecode(os.path.join(os.fsencode(root), os.fsencode(relative))))
    source = _stored_image(path, root, relative)
    return _open_image(source, geometry) if start is None else _clip_frame(source, start, geometry)


def _stored_image(path: Path, root: str, relative: str):
    """What Pillow opens for a row: its file, else its image's bytes read back from where the job read it."""
    if path.exists():
        return path
    data = stored_image(root, relative)
    return io.BytesIO(data) if data is not None else path


def _open_image(path, geometry: dict):
    """The image as the model saw it (`_as_seen`), or None when it cannot be opened."""
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as image:
            image = ImageOps.exif_transpose(image).convert("RGB")
    except OSError:
        return None  # moved or gone: the features are drawn alone
    return _as_seen(image, geometry)


def _clip_frame(source, start: float, geometry: dict):
    """The frame on screen at a clip row's START (seconds from its video's first frame) as the model saw it, or None
    when the video cannot be read."""
    from PIL import Image

    from featdump.inputs.video import decode_clip, pyav, video_info

    try:
        unreadable = (OSError, ValueError, pyav().FFmpegError)  # moved, gone or damaged: the features alone
        info = video_info(source)
        if hasattr(source, "seek"):
            source.seek(0)
        frame = decode_clip(source, info, np.array([max(start, 0.0)]))[0]  # a padded window's: the first frame
    except UsageProblem as error:  # no PyAV
        log.debug("No frame of %s: %s", source, error)
        return None
    except unreadable as error:
        log.debug("No frame of %s at %g s: %s", source, start, error)
        return None
    return _as_seen(Image.fromarray(frame), geometry)


def _as_seen(image, geometry: dict):
    """IMAGE resized and centre-cropped by GEOMETRY ({"resize": ..., "crop": ...}, what the file records of
    torchvision-style preprocessing), so that the maps line up with it."""
    from torchvision.transforms import functional as F

    if geometry.get("resize"):
        image = F.resize(image, geometry["resize"])
    if geometry.get("crop"):
        image = F.center_crop(image, geometry["crop"])
    return np.asarray(image)


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


def _draw_maps(plt, maps: np.ndarray, image, name: str, title: str, channels: int):
    strongest = np.argsort(maps.mean(axis=(1, 2)))[::-1][:channels]
    columns = math.ceil(math.sqrt(len(strongest)))
    rows_of_grid = math.ceil(len(strongest) / columns)
    figure = plt.figure(figsize=(12, 4))
    panels = figure.subfigures(1, 3, width_ratios=[1, 1, 1])
    _image_panel(panels[0], image, title)
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


def _keeps_time(output: Path, name: str) -> bool:
    """Whether LAYER's rows are (channel, time): a video layer pooled over space, each step of its clip kept."""
    with Output.open(output) as opened:
        dataset = opened.features(name)
        return axis_kinds(dataset.shape[1:], dataset.attrs) == ["channel", "time"]


def _draw_over_time(plt, values: np.ndarray, image, name: str, title: str, channels: int):
    """A (channel, time) row: its strongest CHANNELS over the clip's steps, and every channel's mean over time."""
    strongest = np.argsort(values.mean(axis=1))[::-1][:channels]
    figure = plt.figure(figsize=(12, 4))
    panels = figure.subfigures(1, 3, width_ratios=[1, 1, 1])
    _image_panel(panels[0], image, title)
    axis = panels[1].subplots()
    shown = axis.imshow(values[strongest], aspect="auto", cmap="viridis", interpolation="nearest")
    panels[1].colorbar(shown, ax=axis, shrink=0.8)
    axis.set_yticks(range(len(strongest)), [str(channel) for channel in strongest], fontsize=6)
    axis.set_xlabel("time step of the clip")
    axis.set_title(f"{name}: strongest {len(strongest)} channels over time", fontsize=10)
    axis = panels[2].subplots()
    axis.plot(values.mean(axis=0), marker="o")
    axis.set_xlabel("time step of the clip")
    axis.set_title(f"mean of {values.shape[0]} channels", fontsize=10)
    return figure


def _draw_units(plt, vector: np.ndarray, image, name: str, title: str, units: int):
    strongest = np.argsort(vector)[::-1][: max(units, 16)]
    figure = plt.figure(figsize=(12, 4))
    panels = figure.subfigures(1, 2, width_ratios=[1, 2])
    _image_panel(panels[0], image, title)
    axis = panels[1].subplots()
    axis.bar(range(len(strongest)), vector[strongest])
    axis.set_xticks(range(len(strongest)), [str(unit) for unit in strongest], rotation=90, fontsize=7)
    axis.set_title(f"{name}: strongest {len(strongest)} of {vector.size} units")
    return figure


def _image_panel(panel, image, title: str) -> None:
    axis = panel.subplots()
    if image is not None:
        axis.imshow(image)
        axis.set_title(title if len(title) <= 40 else "..." + title[-37:], fontsize=9)
    else:
        axis.text(0.5, 0.5, "image not found", ha="center", va="center")
    axis.axis("off")
