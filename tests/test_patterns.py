"""Layer patterns: one expression for a family of layers, expanded against the probe, in model order."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from torchvision.models import get_model

from featdump.errors import UnknownLayer
from featdump.forward.patterns import expand
from featdump.forward.probe import probe
from featdump.job.config import read_config

from .helpers import REPO, run_featdump


@pytest.fixture(scope="module")
def resnet18_layers():
    return probe(get_model("resnet18", weights=None).eval(), (3, 64, 64))


@pytest.fixture(scope="module")
def vit_layers():
    return probe(get_model("vit_b_16", weights=None).eval(), (3, 224, 224))


@pytest.mark.parametrize("selectors, expected", [
    (["layer2.*"], ["layer2.0", "layer2.1"]),  # one component, not layer2.0.conv1
    (["layer2.**.conv1"], ["layer2.0.conv1", "layer2.1.conv1"]),  # across components
    (["layer2.**"], ["layer2.0", "layer2.0.conv1", "layer2.0.bn1", "layer2.0.relu:1", "layer2.0.relu:2",
                     "layer2.0.conv2", "layer2.0.bn2", "layer2.0.downsample", "layer2.0.downsample.0",
                     "layer2.0.downsample.1", "layer2.1", "layer2.1.conv1", "layer2.1.bn1", "layer2.1.relu:1",
                     "layer2.1.relu:2", "layer2.1.conv2", "layer2.1.bn2"]),
    (["layer1.0.relu:*"], ["layer1.0.relu:1", "layer1.0.relu:2"]),  # every call of a reused module
    (["layer1.*.relu:2"], ["layer1.0.relu:2", "layer1.1.relu:2"]),
    (["layer[34].0.downsample.?"], ["layer3.0.downsample.0", "layer3.0.downsample.1", "layer4.0.downsample.0",
                                    "layer4.0.downsample.1"]),
    (["avgpool", "layer4.*", "layer4.1", "avgpool"], ["avgpool", "layer4.0", "layer4.1"]),  # mixed, duplicates
])
def test_resnet18_expansions(resnet18_layers, selectors, expected):
    assert expand(selectors, resnet18_layers, "resnet18") == expected


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_vit_expansions(vit_layers):
    blocks = [f"encoder.layers.encoder_layer_{i}" for i in range(12)]
    assert expand(["encoder.layers.*"], vit_layers, "vit_b_16") == blocks
    assert expand(["encoder.layers.*.ln_1"], vit_layers, "vit_b_16") == [f"{block}.ln_1" for block in blocks]
    assert expand(["**.mlp.3"], vit_layers, "vit_b_16") == [f"{block}.mlp.3" for block in blocks]
    assert expand(["encoder.layers.encoder_layer_1[01]", "encoder.ln"], vit_layers, "vit_b_16") == \
        ["encoder.layers.encoder_layer_10", "encoder.layers.encoder_layer_11", "encoder.ln"]
    config = read_config(REPO / "configs" / "vit_cls_tokens.toml")  # the shipped config uses a pattern
    assert expand(config["layers"], vit_layers, "vit_b_16") == blocks


@pytest.mark.parametrize("pattern, message", [
    ("layer9.*", "Layer pattern 'layer9.*' matches no layer of resnet18."),
    ("layer1.*.relu:7", "Layer pattern 'layer1.*.relu:7' matches no layer of resnet18."),
    ("layer1.[0", "Bad layer pattern 'layer1.[0'"),
    ("layer1..*", "Bad layer pattern 'layer1..*'"),
    ("layer1.x**", "Bad layer pattern 'layer1.x**'"),
])
def test_empty_and_malformed_patterns_are_refused(resnet18_layers, pattern, message):
    with pytest.raises(UnknownLayer, match=message.replace(".", r"\.").replace("*", r"\*").replace("[", r"\[")):
        expand([pattern], resnet18_layers, "resnet18")


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_pattern_writes_the_file_the_typed_names_write(image_folder, tmp_path):
    pattern = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer1.*.relu:*,avgpool",
                           image_folder, tmp_path / "pattern.h5")
    assert pattern.returncode == 0, pattern.stderr
    assert "Pattern 'layer1.*.relu:*' selects 4 layers: layer1.0.relu:1, layer1.0.relu:2, layer1.1.relu:1, " \
           "layer1.1.relu:2." in pattern.stderr
    names = "layer1.0.relu:1,layer1.0.relu:2,layer1.1.relu:1,layer1.1.relu:2,avgpool"
    typed = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", names, image_folder, tmp_path / "typed.h5")
    assert typed.returncode == 0, typed.stderr
    with h5py.File(tmp_path / "pattern.h5", "r") as a, h5py.File(tmp_path / "typed.h5", "r") as b:
        assert list(a["features"]) == list(b["features"]) and list(a.attrs["layers"]) == names.split(",")
        for name in names.split(","):
            np.testing.assert_array_equal(a["features"][name][:], b["features"][name][:])
        assert json.loads(a.attrs["fingerprint"])["layers"] == names.split(",")
    bad = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer9.*", image_folder, tmp_path / "x.h5")
    assert bad.returncode == 2 and "matches no layer of resnet18" in bad.stderr and "Traceback" not in bad.stderr


def test_list_layers_previews_a_pattern():
    text = run_featdump("list-layers", "resnet18", "--match", "layer1.*.relu")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("'layer1.*.relu' selects 4 layers of resnet18: layer1.0.relu:1, layer1.0.relu:2, "
                                  "layer1.1.relu:1, layer1.1.relu:2")
    rows = [json.loads(line) for line in run_featdump("list-layers", "resnet18", "--match", "layer4.*",
                                                      "--json").stdout.splitlines()]
    assert [row["path"] for row in rows] == ["layer4.0", "layer4.1"]
    assert rows[0]["selected"] == ["layer4.0"]
