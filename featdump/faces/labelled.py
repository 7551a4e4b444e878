"""A layer as a labelled xarray.DataArray (`featdump.load(OUT, LAYER, xarray=True)`): dimensions `image` and
what each axis is (`channel, y, x`, `token, feature`, ...), coordinates `path` and `label` along `image`.

A layer that fits is read once, into the numpy array the DataArray wraps (about 1x the layer's bytes; a merged
view span by span, `output.views`); a lazy one is opened through xarray's h5netcdf backend. Files of the previous
format, whose dimensions have no names, are named here the same way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from featdump.errors import UnknownLayer, UsageProblem
from featdump.output import netcdf
from featdump.output.layout import Output
from featdump.output.views import read_rows

LAZY_ABOVE = 2 * 1024**3  # bytes: a larger layer is read lazily unless told otherwise (as `featdump.load`)


def data_array(path: str | Path, layer: str, lazy: bool | None = None):
    """LAYER of the output PATH as an xarray.DataArray over its committed rows (lazy: read when used; close it
    with `.close()`), with the rows' paths and labels as coordinates and the file's classes among its attrs."""
    xr = _xarray()
    with Output.open(Path(path)) as output:
        if layer not in output.layers:
            raise UnknownLayer(f"{str(path)!r} holds no layer {layer!r}; it has {', '.join(output.layers)}.")
        dataset = output.features(layer)
        rows = output.committed.rows
        dims = [netcdf.IMAGE, *netcdf.axis_kinds(dataset.shape[1:], dataset.attrs)]
        coords = {"path": (netcdf.IMAGE, output.paths()), "label": (netcdf.IMAGE, output.labels())}
        for name, (units, meaning) in netcdf.ROW_COORDINATES.items():  # a video job's: (path, clip_start) its key
            if name in output.file:
                coords[name] = (netcdf.IMAGE, output.file[name][:rows], {"units": units, "long_name": meaning})
        if "time" in dims and "time_offset_frames" in dataset.attrs:  # where each step starts within its clip
            coords["time"] = ("time", np.asarray(dataset.attrs["time_offset_frames"]),
                              {"units": "frames of the clip", "long_name": "the step's first frame within its clip"})
        anchor = str(output.attrs.get("clip_anchor", "start"))
        attrs = {**netcdf.without_netcdf(dataset.attrs), "reduction": output.reduction(layer),
                 "classes": output.classes, "model": str(output.attrs.get("model", ""))}
        size = dataset.size * dataset.dtype.itemsize
        if not (size > LAZY_ABOVE if lazy is None else lazy):  # read once, into the array xarray wraps
            return _keyed(xr.DataArray(read_rows(dataset, rows), dims=dims, coords=coords, attrs=attrs, name=layer),
                          anchor)
    opened = xr.open_dataset(path, engine="h5netcdf", group="features", phony_dims="sort", decode_cf=False,
                             cache=False)
    try:
        array = opened[layer]
        array = array.drop_vars(list(array.coords)).rename(dict(zip(array.dims, dims)))
        array = array.isel({netcdf.IMAGE: slice(0, rows)}).assign_coords(coords)
        array.attrs = attrs
        array = _keyed(array, anchor)
        array.set_close(opened.close)
    except BaseException:
        opened.close()
        raise
    return array


def _keyed(array, anchor: str = "start"):
    """ARRAY with a (path, onset) index on `image` when its rows are clips: the grid's times, `sel(path=...,
    clip_start=...)`, or for windows ending on the grid (ANCHOR end: a TR's onset) `sel(path=..., clip_end=...)`."""
    onset = "clip_end" if anchor == "end" else "clip_start"
    return array.set_xindex(["path", onset]) if onset in array.coords else array


def _xarray():
    try:
        import h5netcdf  # noqa: F401  (xarray's engine)
        import xarray
    except ImportError as error:
        raise UsageProblem("featdump.load(..., xarray=True) needs xarray and h5netcdf: "
                           "pip install 'featdump[xarray]'.") from error
    return xarray
