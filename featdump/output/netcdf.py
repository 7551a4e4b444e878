"""NetCDF-4: the output's dimensions named and its rows' coordinates attached, so that xarray (h5netcdf),
netCDF4 and MATLAB open a featdump file as labelled arrays with no export step (h5py reads it as before).

It uses the HDF5 conventions NetCDF-4 is built on: a dimension is a dimension scale (a dataset whose NAME says
it is "a netCDF dimension but not a netCDF variable"), attached to each axis of the datasets along it.

    /image                        the rows' dimension, unlimited (its length is the longest dataset along it)
    /channel_64, /y_56, /x_56 ... a layer's other dimensions: what the axis is, and its size (the layers share
                                  the group /features, where one name has one size)
    /file_stat                    /file_stats' second axis: size, modification time
    /features/path, label         hard links to /paths and /labels (no copy), named in each layer's
                                  `coordinates`: xarray shows them as the coordinates along `image`
    /clip_start, /features/clip_start   a video job's: each row's clip start (seconds), a coordinate too
    /skipped/skipped, /stale/stale, .../raw_paths/raw_path, /pca/<layer>/component, input, skipped

`label` makes a file so, idempotently; `forget` drops what a copy from another file brought (its references
point into that file); `remove` deletes a dataset without leaving its dimensions a dangling reference.
"""

from __future__ import annotations

import h5py
import numpy as np

IMAGE = "image"
ROW_COORDINATES = {  # a video job's row coordinates: units, meaning (`output.layout` writes them)
    "clip_start": ("s", "the clip's first sampled time in its video (below 0: a window padded before its start)"),
    "clip_end": ("s", "the clip's offset: its start plus its frames over their rate"),
    "video_rate": ("Hz", "the video's frame rate as its stream states it"),
    "video_duration": ("s", "from the video's first frame to its last frame's end, as decoded"),
    "video_frames": ("1", "the video's frames, counted by their packets (NaN: a video in a tar or a store)"),
}
COORDINATES = {"path": "paths", "label": "labels", **{name: name for name in ROW_COORDINATES}}  # along `image` in
# /features: their datasets
ATTRIBUTES = ("DIMENSION_LIST", "REFERENCE_LIST", "CLASS", "NAME", "coordinates", "_Netcdf4Dimid")
_NOT_A_VARIABLE = "This is a netCDF dimension but not a netCDF variable.%10d"
_REDUCED_AXIS = {"pca": "component", "srp": "projection", "countsketch": "projection"}
_PCA_AXES = {"mean": ("input",), "components": ("component", "input"), "explained_variance": ("component",),
             "skipped_paths": ("skipped",), "skipped_reasons": ("skipped",)}


def axis_kinds(shape: tuple[int, ...], attrs) -> list[str]:
    """What each axis of a layer's row is, from its shape and recorded layout: `feature` (`channel` when pooled
    over space, `component` of a PCA, `projection` of a random projection), `token, feature`, `channel, y, x`
    (or `y, x, channel`, as Swin keeps its maps: the `axes` the file records; files without it, a guess from the
    shape), `channel, time, y, x` (`channel, time` pooled over space); else `axisN`."""
    reduction = _text(attrs.get("reduction", "none")).split(":")[0]
    if len(shape) == 1:
        pooled_space = _text(attrs.get("pooled_over")) == "space"  # a conv map's channels
        return [_REDUCED_AXIS.get(reduction, "channel" if pooled_space else "feature")]
    if len(shape) == 2:
        return ["channel", "time"] if _text(attrs.get("kept")) == "time" else ["token", "feature"]
    if len(shape) == 3:
        known = _text(attrs.get("axes")) if "axes" in attrs else None
        if known in ("channel,y,x", "y,x,channel"):  # the model's own, as the probe found it
            return known.split(",")
        channels_last = shape[0] == shape[1] != shape[2]  # a guess, for files that do not record it
        return ["y", "x", "channel"] if channels_last else ["channel", "y", "x"]
    if len(shape) == 4:
        return ["channel", "time", "y", "x"]
    return [f"axis{axis}" for axis in range(1, len(shape) + 1)]


def dimension_names(dataset: h5py.Dataset) -> list[str]:
    """The names of a layer dataset's dimensions in the file: `image`, then each axis' kind and size."""
    shape = dataset.shape[1:]
    return [IMAGE, *(f"{kind}_{size}" for kind, size in zip(axis_kinds(shape, dataset.attrs), shape))]


def layer_names(h5file: h5py.File) -> list[str]:
    """The layers /features holds (its coordinate links are not layers)."""
    features = h5file["features"]
    return [name for name in features if not _is_coordinate(h5file, name)]


def label(h5file: h5py.File) -> None:
    """Give every dataset of the featdump output H5FILE named dimensions, and its layers their coordinates."""
    image = _scale(h5file, IMAGE, None)
    for name in ("paths", "labels", *ROW_COORDINATES):
        if name in h5file:
            _attach(h5file[name], [image])
    for name, (units, meaning) in ROW_COORDINATES.items():
        if name in h5file and _text(h5file[name].attrs.get("units")) != units:
            h5file[name].attrs["units"] = units  # CF units: xarray and netCDF readers show them
            h5file[name].attrs["long_name"] = meaning
    _attach(h5file["file_stats"], [image, _scale(h5file, "file_stat", 2)])
    label_named_rows(h5file)
    for group in ("skipped", "stale"):
        if group in h5file:
            label_named_rows(h5file[group], group)
    features = h5file["features"]
    layers = layer_names(h5file)
    for coordinate, target in COORDINATES.items():
        if coordinate not in features and target in h5file:
            features[coordinate] = h5file[target]
    coordinates = " ".join(name for name in COORDINATES if _is_coordinate(h5file, name))
    for name in layers:
        dataset = features[name]
        names = dimension_names(dataset)
        _time_offsets(dataset, h5file.attrs.get("clip_frames"))
        _attach(dataset, [image, *(_scale(h5file, dim, size) for dim, size in zip(names[1:], dataset.shape[1:]))])
        if _text(dataset.attrs.get("coordinates")) != coordinates:
            dataset.attrs["coordinates"] = coordinates
    for fit in h5file.get("pca", {}).values():
        for name, axes in _PCA_AXES.items():
            if name in fit:
                dataset = fit[name]
                _attach(dataset, [_scale(fit, axis, size) for axis, size in zip(axes, dataset.shape)])


def _time_offsets(dataset: h5py.Dataset, clip_frames) -> None:
    """A layer that keeps a clip's time axis records where each of its steps starts within the clip, in frames of
    the clip (`time_offset_frames`: k N / T for T steps of a clip of N frames; times in seconds divide by the
    rate the clip was sampled at)."""
    kinds = axis_kinds(dataset.shape[1:], dataset.attrs)
    if clip_frames is None or "time" not in kinds or "time_offset_frames" in dataset.attrs:
        return
    steps = dataset.shape[1 + kinds.index("time")]
    dataset.attrs["time_offset_frames"] = np.arange(steps) * float(clip_frames) / steps


def forget(node: h5py.Group | h5py.Dataset) -> None:
    """Drop the dimension references NODE (and what it holds) brought from the file it was copied from."""
    def drop(obj) -> None:
        for key in ("DIMENSION_LIST", "REFERENCE_LIST"):
            if key in obj.attrs:
                del obj.attrs[key]

    drop(node)
    if isinstance(node, h5py.Group):
        node.visititems(lambda _, obj: drop(obj))


def remove(group: h5py.Group, name: str) -> None:
    """Delete GROUP/NAME after detaching it from its dimensions (which would otherwise point at nothing)."""
    dataset = group[name]
    if isinstance(dataset, h5py.Dataset) and "DIMENSION_LIST" in dataset.attrs:
        for dim in dataset.dims:
            for scale in list(dim.values()):
                dim.detach_scale(scale)
    del group[name]


def without_netcdf(attrs) -> dict:
    """A dataset's attributes, less NetCDF's bookkeeping (object references that only mean something in its file)."""
    return {key: value for key, value in attrs.items() if key not in ATTRIBUTES}


def label_named_rows(group: h5py.Group, dimension: str | None = None) -> None:
    """GROUP's paths, reasons (and a skipped input's clip_start, file_stats) along DIMENSION; its raw_paths along
    `raw_path`."""
    if dimension is not None:
        scale = _scale(group, dimension, None)
        for name in ("paths", "reasons", "clip_start"):
            if name in group:
                _attach(group[name], [scale])
        if "file_stats" in group:
            _attach(group["file_stats"], [scale, _scale(group, "file_stat", 2)])
    raw = group.get("raw_paths")
    if raw is not None:
        scale = _scale(raw, "raw_path", None)
        for name in ("rows", "bytes"):
            _attach(raw[name], [scale])


def _scale(group: h5py.Group, name: str, size: int | None) -> h5py.Dataset:
    """GROUP's dimension NAME of SIZE (None: unlimited), made once; a scale holds no data."""
    if name in group:
        return group[name]
    if size is None:
        scale = group.create_dataset(name, shape=(0,), maxshape=(None,), dtype=np.float32, chunks=(1024,))
    else:
        scale = group.create_dataset(name, shape=(size,), dtype=np.float32)
    scale.make_scale(_NOT_A_VARIABLE % (size or 0))
    return scale


def _attach(dataset: h5py.Dataset, scales: list[h5py.Dataset]) -> None:
    for axis, scale in enumerate(scales):
        if not h5py.h5ds.is_attached(dataset.id, scale.id, axis):
            dataset.dims[axis].attach_scale(scale)


def _is_coordinate(h5file: h5py.File, name: str) -> bool:
    """Whether /features/NAME is the link to /paths or /labels (a layer may have the name)."""
    target = COORDINATES.get(name)
    return target is not None and target in h5file and h5file["features"][name] == h5file[target]


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
