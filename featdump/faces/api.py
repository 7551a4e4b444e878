"""The Python API: extract() as the CLI does, capture() inside your own loop, load() a file's features.

    import featdump
    featdump.extract("images/", "out.h5", model="resnet18", layers=["avgpool"], weights="none")
    with featdump.capture(model, ["layer1.0.relu:2", "avgpool"]) as features:
        for x in batches:
            model(x)
            use(features["avgpool"])          # this batch's copy, made at hook time
    data = featdump.load("out.h5", "avgpool")  # data.features, data.paths, data.labels
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import nn

from featdump.errors import AmbiguousLayer, NotAnOutput, UnknownLayer
from featdump.forward.hooks import Capture
from featdump.forward.layers import Layer, parse_selector
from featdump.job.settings import OPTIONS, Settings
from featdump.output import netcdf
from featdump.output.layout import Output
from featdump.output.views import read_rows

_KEYWORDS = set(OPTIONS) - {"model", "layers"}


def extract(images: str | Path, output: str | Path, *, model: str, layers: str | Sequence[str], **options) -> Path:
    """Extract LAYERS of MODEL for every image of IMAGES (a folder, a list file, tar shards, or any of these at a
    URL: `s3://bucket/prefix/`) into OUTPUT; returns OUTPUT.

    Keyword options are the CLI's, underscored (batch_size=256, weights="none", reduce="avgpool", ...);
    the behaviour is the CLI's, with errors raised as featdump.errors exceptions.

    >>> featdump.extract("images/", "out.h5", model="resnet18", layers="layer3,avgpool", weights="none")
    PosixPath('out.h5')
    """
    from featdump.job.staging import extract as run

    unknown = sorted(set(options) - _KEYWORDS)
    if unknown:
        raise TypeError(f"extract() got unknown option(s) {', '.join(unknown)}; "
                        f"allowed: {', '.join(sorted(_KEYWORDS))}")
    return run(Settings(model=model, layers=layers, images=images, output=output, **options)).output


def extract_on_ray(images: str | Path, output: str | Path, *, model: str, layers: str | Sequence[str],
                   shards: int | None = None, address: str | None = None, merge: bool = True, **options):
    """extract() split into SHARDS Ray tasks on the cluster at ADDRESS (None: RAY_ADDRESS, or the cluster this
    process joined with ray.init, else a local one), merged into OUTPUT at the end (unless not MERGE: the shards
    stay where they lie, for `featdump merge` later); returns the job's summary.

    >>> featdump.extract_on_ray("s3://bucket/images/", "s3://bucket/run/out.h5", model="resnet50",
    ...                         layers="avgpool", shards=64, device="cuda")
    """
    from featdump.engines.ray import extract_on_ray as run

    unknown = sorted(set(options) - _KEYWORDS)
    if unknown:
        raise TypeError(f"extract_on_ray() got unknown option(s) {', '.join(unknown)}; "
                        f"allowed: {', '.join(sorted(_KEYWORDS))}")
    return run(Settings(model=model, layers=layers, images=images, output=output, **options), shards, address,
               merge_shards=merge)


@contextmanager
def capture(model: nn.Module, layers: str | Sequence[str]) -> Iterator[Mapping[str, torch.Tensor]]:
    """Capture LAYERS ('PATH', 'PATH:K', 'PATH@PART') during every forward of MODEL that you run yourself.

    Yields a mapping from layer name to the last forward's output, copied (detached) at hook time, so
    later in-place operations cannot change it; 'PATH:K' is the K-th call of a module that runs several
    times per forward; 'PATH@0' or 'PATH@KEY' a part of a tuple, dict or ModelOutput output (a bare PATH on a
    dict of several tensors is refused, naming them). The model is in eval mode inside the block and gets its
    mode back after it.
    """
    names = [part.strip() for part in (layers.split(",") if isinstance(layers, str) else layers) if part.strip()]
    selected = []
    for text in names:
        path, call, part = parse_selector(text)
        try:
            model.get_submodule(path)
        except AttributeError as error:
            raise UnknownLayer(f"{type(model).__name__} has no module {path!r}.") from error
        selected.append((Layer(text, path, call or 1, (), part=part), call is None))
    hooks = Capture(model, [layer for layer, _ in selected], {layer.name: _detached_copy for layer, _ in selected},
                    stop_early=False)
    latest: dict[str, torch.Tensor] = {}

    def before_forward(module, args):
        hooks.start_forward()

    def after_forward(module, args, output):
        latest.clear()
        latest.update(hooks.take())
        for layer, implicit in selected:
            if implicit and hooks.calls(layer.path) > 1:
                raise AmbiguousLayer(f"{layer.path!r} runs {hooks.calls(layer.path)} times per forward; select one "
                                     f"call as {layer.path}:1 ... {layer.path}:{hooks.calls(layer.path)}.")

    with hooks:
        handles = [model.register_forward_pre_hook(before_forward), model.register_forward_hook(after_forward)]
        try:
            yield latest
        finally:
            for handle in handles:
                handle.remove()


def _detached_copy(output: torch.Tensor) -> torch.Tensor:
    return output.detach().clone()


@dataclass
class Features:
    """One layer of an output file, row-aligned with its images."""

    features: np.ndarray | h5py.Dataset  # (rows, ...); an h5py dataset (read lazily) when LAZY
    paths: list[str]  # relative to `image_root` (names that are not UTF-8 as in `raw_paths`)
    labels: np.ndarray
    classes: list[str]
    raw_paths: list[bytes]  # the exact bytes of every path
    attributes: dict  # model, weights, preprocessing, ...
    reduction: str = "none"  # what the layer's dataset keeps: avgpool, srp:4096, pca:256, ...
    layer_attributes: dict | None = None  # what the reduction records (srp_seed, pca_fitted_on, ...)
    pca_fit: dict | None = None  # a pca:K layer's fit: mean, components, explained_variance
    file: h5py.File | None = None  # open while `features` is lazy: close it when done
    clip_start: np.ndarray | None = None  # a video job's: each row's clip start in its video, seconds (None: images)
    clip_end: np.ndarray | None = None  # a video job's: each row's clip offset (its start + frames / rate), seconds
    video_rate: np.ndarray | None = None  # a video job's: each row's video's stated frame rate, frames a second
    video_duration: np.ndarray | None = None  # ... its video's duration, seconds (its first frame to its last's end)
    video_frames: np.ndarray | None = None  # ... its video's frame count (NaN where not counted: tars, stores)


def _row_coordinate(output: Output, name: str) -> np.ndarray | None:
    """The committed rows' coordinate NAME (a video job's clip_start, clip_end), or None where there is none."""
    return output.file[name][:output.committed.rows] if name in output.file else None


def load(path: str | Path, layer: str, lazy: bool | None = None, xarray: bool = False):
    """Read LAYER of the output file PATH with its paths and labels.

    Whole into memory (a numpy array) unless LAZY, which by default is chosen for layers over 2 GB:
    then `features` is an h5py dataset to slice, and `file` stays open.
    With XARRAY, an xarray.DataArray instead (`featdump[xarray]`): dimensions `image`, `channel`, `y`, `x` (or
    `token`, `feature`, ...), coordinates `path` and `label` along `image`, the file's classes in its attrs.
    """
    if xarray:
        from featdump.faces.labelled import data_array

        return data_array(path, layer, lazy)
    output = Output.open(Path(path))
    try:
        if layer not in output.layers:
            raise UnknownLayer(f"{str(path)!r} holds no layer {layer!r}; it has {', '.join(output.layers)}.")
        dataset = output.features(layer)
        lazy = dataset.size * dataset.dtype.itemsize > 2 * 1024**3 if lazy is None else lazy
        loaded = Features(
            features=dataset if lazy else read_rows(dataset, output.committed.rows),
            paths=output.paths(),
            labels=output.labels(),
            classes=output.classes,
            raw_paths=output.raw_paths(),
            attributes=dict(output.attrs),
            reduction=output.reduction(layer),
            layer_attributes=netcdf.without_netcdf(dataset.attrs),
            pca_fit=_fit_of(output, layer),
            file=output.file if lazy else None,
            clip_start=_row_coordinate(output, "clip_start"),
            clip_end=_row_coordinate(output, "clip_end"),
            video_rate=_row_coordinate(output, "video_rate"),
            video_duration=_row_coordinate(output, "video_duration"),
            video_frames=_row_coordinate(output, "video_frames"),
        )
    except OSError as error:  # a file that breaks while read: one featdump error, never a traceback
        output.close()
        raise NotAnOutput(f"Could not read {str(path)!r}: {error}.") from error
    except BaseException:
        output.close()
        raise
    if not lazy:
        output.close()
    return loaded


def _fit_of(output: Output, layer: str) -> dict | None:
    group = output.pca_fit(layer)
    if group is None:
        return None
    return {"mean": group["mean"][:], "components": group["components"][:],
            "explained_variance": group["explained_variance"][:], **dict(group.attrs)}
