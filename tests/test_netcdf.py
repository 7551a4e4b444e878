"""Every kind of output is NetCDF-4 as it is: xarray's open_datatree (h5netcdf) and the netCDF-C library (netCDF4)
open it lazily with named dimensions and the rows' path and label as coordinates, equal to what h5py reads; a file
of the previous format still loads, and is named when resumed or grown; featdump.load(..., xarray=True)."""

from __future__ import annotations

import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

import featdump
from featdump.errors import UsageProblem
from featdump.job.runner import extract

from .helpers import (
    SMALL_RESNET,
    SMALL_RESNET_SETTINGS,
    CrashAfterFirstBatch,
    featdump_env,
    images_fixture,
    run_featdump,
    settings_for,
    start_featdump,
    user_project,
    write_images,
)
from .makers import small_resnet
from .test_grow import TINY_VIT  # a 4-block torchvision ViT on 32-pixel images

xr = pytest.importorskip("xarray")
netCDF4 = pytest.importorskip("netCDF4")

BASE = ["extract", *SMALL_RESNET]
RESNET18 = ["extract", "-m", "resnet18", "-w", "none"]  # the model of tests/data/format2.h5
DATA = Path(__file__).parent / "data"
FORMAT2_COMMAND = ["-l", "layer4,avgpool,fc", "--reduce", "layer4=avgpool", "--reduce", "fc=srp:8",
                   "--compression", "gzip", "-j", "0"]  # how tests/data/format2.h5 was made (featdump 4353915)


def open_tree(path: Path):
    """OUT in xarray, failing on any warning (a dataset without named dimensions warns of phony dimensions)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return xr.open_datatree(path, engine="h5netcdf")


def check_netcdf(path: Path, coordinates=("path", "label")) -> dict[str, tuple[str, ...]]:
    """OUT's layers in xarray and netCDF-C equal h5py's, with named dimensions and the COORDINATES path and label
    along `image`, and no phony dimension anywhere in the file; returns each layer's dimensions."""
    dims, values = {}, {}
    with open_tree(path) as tree, h5py.File(path, "r") as h5file:
        rows = int(h5file.attrs["committed"][0])
        paths, labels = list(h5file["paths"].asstr()[:rows]), h5file["labels"][:rows]
        for node in tree.subtree:
            assert not [dim for dim in node.dims if dim.startswith("phony_dim")], node.path
        for name in h5file.attrs["layers"]:
            array = tree["features"][name]
            assert array.dims[0] == "image" and array.sizes["image"] == rows
            assert set(array.coords) == set(coordinates)
            assert list(array["path"].values) == paths
            if "label" in coordinates:
                np.testing.assert_array_equal(array["label"].values, labels)
                assert list(array["label"].attrs["classes"]) == list(h5file["labels"].attrs["classes"].astype(str))
            values[name] = h5file["features"][name][:rows]
            np.testing.assert_array_equal(array.values, values[name])
            dims[name] = array.dims
    with netCDF4.Dataset(path) as dataset:  # the C library MATLAB and most tools read NetCDF-4 with
        features = dataset["features"]
        for name, named in dims.items():
            assert features[name].dimensions == named
            np.testing.assert_array_equal(features[name][:], values[name])
        assert list(features["path"][:]) == paths
    return dims


images = images_fixture({"cats": 5, "dogs": 4})


def test_a_run_names_each_layer_s_dimensions_after_what_they_are(images, tmp_path):
    output = tmp_path / "out.h5"
    result = run_featdump(*BASE, "-l", "layer1,layer2,layer3,avgpool,@", "--reduce", "layer2=srp:16",
                          "--reduce", "layer3=avgpool", images, output)
    assert result.returncode == 0, result.stderr
    assert check_netcdf(output) == {
        "layer1": ("image", "channel_12", "y_16", "x_16"), "layer2": ("image", "projection_16"),
        "layer3": ("image", "channel_24"), "avgpool": ("image", "channel_24", "y_1", "x_1"),
        "@": ("image", "feature_10")}
    with xr.open_dataset(output, engine="h5netcdf", group="features") as features:  # one group, as often opened
        assert set(features.coords) == {"path", "label"}
        assert features["layer1"].sel(image=features["label"] == 1).sizes["image"] == 4
    with h5py.File(output, "r") as h5file:  # plain h5py reads it as before
        assert h5file["paths"].asstr()[0] == "cats/img_000.jpg" and h5file.attrs["format"] == "featdump/3"
        assert set(h5file["features"]) == {"layer1", "layer2", "layer3", "avgpool", "@", "path", "label"}


def test_opening_reads_no_feature_data(images, tmp_path):
    output = tmp_path / "out.h5"
    result = run_featdump(*BASE, "-l", "layer1", "--compression", "gzip", images, output)
    assert result.returncode == 0, result.stderr
    with h5py.File(output, "r") as h5file:  # where layer1's compressed chunks lie in the file
        dataset = h5file["features/layer1"]
        chunks = [dataset.id.get_chunk_info(index) for index in range(dataset.id.get_num_chunks())]
    with open(output, "r+b") as raw:
        for chunk in chunks:
            raw.seek(chunk.byte_offset)
            raw.write(bytes(chunk.size))  # zeros: no gzip stream
    with open_tree(output) as tree:  # opened, shown and sliced lazily: nothing of layer1's data is read
        layer = tree["features"]["layer1"]
        assert "layer1" in repr(tree) and layer.isel(image=slice(0, 2)).shape == (2, 12, 16, 16)
        with pytest.raises(OSError):
            layer.values  # noqa: B018 - reading it is what fails
        assert list(layer["path"].values)[:1] == ["cats/img_000.jpg"]


@pytest.mark.slow  # make test-all: a crash and a resume
def test_a_resumed_output_and_its_partial_file(images, tmp_path):
    output = tmp_path / "out.h5"
    with pytest.raises(RuntimeError, match="simulated crash"):
        extract(settings_for(images, output, layers=("layer2", "fc"), **SMALL_RESNET_SETTINGS), CrashAfterFirstBatch())
    assert check_netcdf(tmp_path / "out.h5.partial") == {"layer2": ("image", "channel_12", "y_8", "x_8"),
                                                         "fc": ("image", "feature_10")}
    result = run_featdump(*BASE, "-l", "layer2,fc", "-b", "4", images, output)
    assert result.returncode == 0 and "Resuming at image 4 of 9" in result.stderr, result.stderr
    assert check_netcdf(output)["fc"] == ("image", "feature_10")


@pytest.mark.slow  # an update and a growth; netCDF naming has quicker tests
def test_updated_and_grown_outputs_keep_their_dimensions(images, tmp_path):
    half = tmp_path / "half"
    shutil.copytree(images, half)
    for path in sorted(half.rglob("*"))[-4:]:
        path.unlink()
    output = tmp_path / "out.h5"
    assert run_featdump(*BASE, "-l", "layer1", half, output).returncode == 0
    result = run_featdump(*BASE, "-l", "layer1", "--update", images, output)  # new images
    assert result.returncode == 0, result.stderr
    assert check_netcdf(output) == {"layer1": ("image", "channel_12", "y_16", "x_16")}
    result = run_featdump(*BASE, "-l", "layer1,layer4", "--update", images, output)  # a new layer
    assert result.returncode == 0, result.stderr
    assert check_netcdf(output)["layer4"] == ("image", "channel_24", "y_2", "x_2")


@pytest.mark.slow  # a real process grown while read
def test_a_file_being_grown_opens_in_xarray_meanwhile(tmp_path):
    write_images(tmp_path / "images", {"a": 24, "b": 24})
    output = tmp_path / "out.h5"
    assert run_featdump(*BASE, "-l", "layer1", tmp_path / "images", output).returncode == 0
    release = tmp_path / "release"  # held before its first batch until opened three times, then let go on
    held = {small_resnet.HOLD_AFTER: "0", small_resnet.HOLD_RELEASE: str(release)}
    process = start_featdump(*BASE, "-l", "layer1,layer2,layer3", "--update", tmp_path / "images", output,
                             env=featdump_env(**held))
    opened_while_running = 0
    while process.poll() is None:
        if opened_while_running >= 3:
            release.touch()
        try:
            dims = check_netcdf(output)
        except (BlockingIOError, OSError) as error:  # the final commit holds the file for its fraction of a second
            if not isinstance(error, BlockingIOError) and "HDF error" not in str(error):  # (netCDF-C says so)
                raise
            time.sleep(0.05)
            continue
        assert dims["layer1"] == ("image", "channel_12", "y_16", "x_16")
        opened_while_running += process.poll() is None
        time.sleep(0.2)
    assert process.returncode == 0, process.stderr.read()
    assert opened_while_running >= 3
    assert set(check_netcdf(output)) == {"layer1", "layer2", "layer3"}


@pytest.mark.slow  # make test-all: two shards, two merges
def test_shards_their_merged_view_and_a_merged_copy(images, tmp_path):
    output = tmp_path / "out.h5"
    for shard in ("0/2", "1/2"):
        result = run_featdump(*BASE, "-l", "layer3,fc", "--reduce", "fc=pca:3", "--pca-fit", "9", "--shard", shard,
                              images, output)
        assert result.returncode == 0, result.stderr
    for shard in ("out.shard-0-of-2.h5", "out.shard-1-of-2.h5"):
        check_netcdf(tmp_path / shard)
    assert run_featdump("merge", "--view", output).returncode == 0
    dims = check_netcdf(output)
    assert dims == {"layer3": ("image", "channel_24", "y_4", "x_4"), "fc": ("image", "component_3")}
    with open_tree(output) as tree:
        assert tree["pca/fc/components"].dims == ("component", "input")
    assert run_featdump("merge", "--copy", "--overwrite", output).returncode == 0
    assert check_netcdf(output) == dims
    with h5py.File(output, "r") as h5file:
        assert not h5file.attrs["virtual"]


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_file_of_the_previous_format_loads_and_is_named_when_resumed_or_grown(tmp_path):
    old = DATA / "format2.h5"
    with h5py.File(old, "r") as h5file:
        assert h5file.attrs["format"] == "featdump/2" and "image" not in h5file
        expected = {name: h5file["features"][name][:] for name in h5file["features"]}
        paths = list(h5file["paths"].asstr()[:])
    loaded = featdump.load(old, "layer4")
    np.testing.assert_array_equal(loaded.features, expected["layer4"])
    assert loaded.paths == paths == ["a/0.png", "a/1.png", "b/0.png", "b/1.png"]
    array = featdump.load(old, "fc", xarray=True)
    assert array.dims == ("image", "projection") and list(array["path"].values) == paths
    np.testing.assert_array_equal(array.values, expected["fc"])

    shutil.copytree(DATA / "format2_images", tmp_path / "images")
    with h5py.File(old, "r") as h5file:  # the images as they were when read (a checkout gives them new times)
        for path, (_, mtime) in zip(paths, h5file["file_stats"][:]):
            os.utime(tmp_path / "images" / path, ns=(int(mtime), int(mtime)))
    partial = tmp_path / "out.h5.partial"  # as a kill after two images leaves it: rows past the counters are not data
    shutil.copy(old, partial)
    with h5py.File(partial, "r+") as h5file:
        h5file.attrs["complete"] = False
        h5file.attrs["committed"] = np.array([2, 2, 0])
    result = run_featdump(*RESNET18, *FORMAT2_COMMAND, tmp_path / "images", tmp_path / "out.h5")
    assert result.returncode == 0, result.stderr
    assert "Resuming at image 2 of 5" in result.stderr
    dims = check_netcdf(tmp_path / "out.h5")
    assert dims == {"layer4": ("image", "feature_512"), "avgpool": ("image", "channel_512", "y_1", "x_1"),
                    "fc": ("image", "projection_8")}
    for name, values in expected.items():  # the old rows kept, the new ones equal the old file's (up to batching)
        np.testing.assert_allclose(featdump.load(tmp_path / "out.h5", name).features, values, rtol=1e-5, atol=1e-5)

    grown = tmp_path / "grown.h5"
    shutil.copy(old, grown)
    command = [*FORMAT2_COMMAND]
    command[1] = "layer4,avgpool,fc,layer3"
    result = run_featdump(*RESNET18, *command, "--update", tmp_path / "images", grown)
    assert result.returncode == 0, result.stderr
    assert check_netcdf(grown)["layer3"] == ("image", "channel_256", "y_14", "x_14")
    with h5py.File(grown, "r") as h5file:
        assert h5file.attrs["format"] == "featdump/3"
        np.testing.assert_array_equal(h5file["features/fc"][:], expected["fc"])  # kept bit for bit


def test_load_as_a_labelled_array_selects_by_path_and_label_and_stacks_to_neuroids(images, tmp_path):
    output = tmp_path / "out.h5"
    assert run_featdump(*BASE, "-l", "layer4", images, output).returncode == 0
    stored = featdump.load(output, "layer4")
    array = featdump.load(output, "layer4", xarray=True)
    assert array.dims == ("image", "channel", "y", "x") and array.attrs["classes"] == ["cats", "dogs"]
    np.testing.assert_array_equal(array.values, stored.features)
    by_path = array.set_xindex("path").sel(path="dogs/img_001.jpg")
    np.testing.assert_array_equal(by_path.values, stored.features[stored.paths.index("dogs/img_001.jpg")])
    dogs = array.where(array["label"] == array.attrs["classes"].index("dogs"), drop=True)
    assert list(dogs["path"].values) == [path for path in stored.paths if path.startswith("dogs/")]
    neuroids = array.stack(neuroid=("channel", "y", "x"))
    assert neuroids.dims == ("image", "neuroid") and neuroids.shape == (9, 24 * 2 * 2)
    np.testing.assert_array_equal(neuroids.values, stored.features.reshape(9, -1))
    lazy = featdump.load(output, "layer4", xarray=True, lazy=True)
    assert not isinstance(lazy.variable._data, np.ndarray)  # read when used
    np.testing.assert_array_equal(lazy.isel(image=[0, 8]).values, stored.features[[0, 8]])
    lazy.close()


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_without_xarray_loading_as_a_labelled_array_says_what_to_install(images, tmp_path, monkeypatch):
    output = tmp_path / "out.h5"
    assert run_featdump(*BASE, "-l", "avgpool", images, output).returncode == 0
    monkeypatch.setitem(sys.modules, "xarray", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(UsageProblem, match=r"pip install 'featdump\[xarray\]'"):
        featdump.load(output, "avgpool", xarray=True)


NAMED_LABEL = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Conv2d(3, 4, 3, stride=4)
        self.label = nn.Linear(4, 2)

    def forward(self, x):
        return self.label(self.body(x).mean((2, 3)))


def build():
    torch.manual_seed(0)
    return Model()
'''


def test_a_layer_named_label_keeps_its_name_and_the_rows_keep_their_path(tmp_path):
    with user_project(tmp_path, "labelled", NAMED_LABEL, {"x": 3}) as project:
        result = run_featdump("extract", "-m", "labelled:build", "-w", "none", "-l", "body,label", "images",
                              "out.h5", cwd=project)
        assert result.returncode == 0, result.stderr
    output = project / "out.h5"
    assert check_netcdf(output, coordinates=("path",)) == {"body": ("image", "channel_4", "y_56", "x_56"),
                                                           "label": ("image", "feature_2")}
    assert featdump.load(output, "label").features.shape == (3, 2)
    assert list(featdump.load(output, "label", xarray=True)["label"].values) == [0, 0, 0]


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_token_sequences_and_channels_last_maps_are_named_so(tmp_path):
    with user_project(tmp_path, "tinyvit", TINY_VIT, {"": 2}) as project:
        result = run_featdump("extract", "-m", "tinyvit:build", "--transform", "tinyvit:small", "-w", "none", "-l",
                              "encoder.layers.encoder_layer_1", "images", "vit.h5", cwd=project)
        assert result.returncode == 0, result.stderr
    assert check_netcdf(project / "vit.h5") == {"encoder.layers.encoder_layer_1": ("image", "token_17", "feature_32")}
    result = run_featdump(*BASE[:2], "swin_t", "-w", "none", "-l", "features.1,features.2", project / "images",
                          tmp_path / "swin.h5")  # torchvision's Swin keeps its maps (H, W, C)
    assert result.returncode == 0, result.stderr
    assert check_netcdf(tmp_path / "swin.h5") == {"features.1": ("image", "y_56", "x_56", "channel_96"),
                                                  "features.2": ("image", "y_28", "x_28", "channel_192")}


WIDE_MAPS = '''
import torch
from torch import nn
from torchvision import transforms as T


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=4, padding=1), nn.ReLU())


def wide():
    return T.Compose([T.Resize((32, 64)), T.ToTensor()])
'''


@pytest.mark.slow  # three Swin extractions
def test_a_map_s_axes_are_the_model_s_own_when_its_shape_could_be_either(tmp_path):
    """(C, H, W) = (8, 8, 16): channel_8, y_8, x_16 (the shape alone would say y, x, channel); Swin's (H, W, C)
    maps are pooled and sliced along their own channel axis."""
    with user_project(tmp_path, "widemaps", WIDE_MAPS, {"": 2}) as project:
        result = run_featdump("extract", "-m", "widemaps:build", "--transform", "widemaps:wide", "-w", "none", "-l",
                              "0,1", "--reduce", "1=channels:2-5", "images", "maps.h5", cwd=project)
        assert result.returncode == 0, result.stderr
        assert check_netcdf(project / "maps.h5") == {"0": ("image", "channel_8", "y_8", "x_16"),
                                                     "1": ("image", "channel_4", "y_8", "x_16")}
        whole = featdump.load(project / "maps.h5", "0").features
        np.testing.assert_array_equal(featdump.load(project / "maps.h5", "1").features,
                                      np.maximum(whole[:, 2:6], 0))
    swin = ["extract", "-m", "swin_t", "-w", "none", "-l", "features.1,features.2", "--reduce"]
    for reduce, name in (("features.2=none", "whole.h5"), ("features.2=avgpool", "pooled.h5"),
                         ("features.2=channels:0-9", "sliced.h5")):
        result = run_featdump(*swin, reduce, project / "images", tmp_path / name)
        assert result.returncode == 0, result.stderr
    whole = featdump.load(tmp_path / "whole.h5", "features.2").features  # (N, 28, 28, 192)
    assert whole.shape[1:] == (28, 28, 192)
    np.testing.assert_allclose(featdump.load(tmp_path / "pooled.h5", "features.2").features,
                               whole.mean(axis=(1, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(featdump.load(tmp_path / "sliced.h5", "features.2").features, whole[..., :10])
    assert check_netcdf(tmp_path / "pooled.h5")["features.2"] == ("image", "channel_192")
    assert check_netcdf(tmp_path / "sliced.h5")["features.2"] == ("image", "y_28", "x_28", "channel_10")
