"""Features equal a manual recomputation (submodules called in order, no hooks), row by row."""

from __future__ import annotations

import h5py
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.models import get_model, get_model_weights

from featdump.job.runner import extract

from .helpers import images_fixture, settings_for


def seeded_model(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return get_model(name, weights=None).eval()


def reference_inputs(model_name: str, root, paths) -> torch.Tensor:
    """The inputs as torchvision's own transforms make them, in the file's row order."""
    transforms = get_model_weights(model_name).DEFAULT.transforms()
    return torch.stack([transforms(Image.open(root / path).convert("RGB")) for path in paths])


def extract_and_read(tmp_path, images, model_name, layers, batch_size=3):
    output = tmp_path / f"{model_name}.h5"
    extract(settings_for(images, output, model=model_name, layers=tuple(layers), batch_size=batch_size))
    with h5py.File(output, "r") as h5file:
        paths = list(h5file["paths"].asstr()[:])
        features = {name: torch.from_numpy(h5file["features"][name][:]) for name in layers}
        assert h5file.attrs["complete"]
    return paths, features


def assert_features_equal(features, expected):
    for name, values in expected.items():
        torch.testing.assert_close(features[name], values, rtol=1e-4, atol=1e-4, msg=f"layer {name}")


images = images_fixture({"a": 3, "b": 2})


def test_resnet18_layers_match_manual_forward(tmp_path, images):
    layers = ["maxpool", "layer1.0.bn1", "layer1.0.bn2", "layer1.0.relu:1", "layer1.0.relu:2",
              "layer3.0.downsample.1", "avgpool", "fc"]
    paths, features = extract_and_read(tmp_path, images, "resnet18", layers)
    assert paths == sorted(paths) and len(paths) == 5
    model = seeded_model("resnet18")
    x = reference_inputs("resnet18", images, paths)
    with torch.no_grad():
        stem = model.maxpool(F.relu(model.bn1(model.conv1(x))))
        block = model.layer1[0]
        bn1 = block.bn1(block.conv1(stem))
        relu1 = F.relu(bn1)
        bn2 = block.bn2(block.conv2(relu1))
        relu2 = F.relu(bn2 + stem)
        layer1 = model.layer1[1](relu2.clone())
        layer2 = model.layer2(layer1)
        downsample = model.layer3[0].downsample[1](model.layer3[0].downsample[0](layer2))
        pooled = model.avgpool(model.layer4(model.layer3(layer2)))
        logits = model.fc(torch.flatten(pooled, 1))
    expected = {"maxpool": stem, "layer1.0.bn1": bn1, "layer1.0.bn2": bn2, "layer1.0.relu:1": relu1,
                "layer1.0.relu:2": relu2, "layer3.0.downsample.1": downsample, "avgpool": pooled, "fc": logits}
    assert (bn1 < 0).any(), "the in-place ReLU victim must have negative values to be a real test"
    assert_features_equal(features, expected)


@pytest.mark.slow  # VGG11 (133M parameters); mobilenet_v3's in-place victim and test_hooks stay quick
def test_vgg11_inplace_relu_victim(tmp_path, images):
    paths, features = extract_and_read(tmp_path, images, "vgg11", ["features.0", "features.5"])
    model = seeded_model("vgg11")
    x = reference_inputs("vgg11", images, paths)
    f = model.features
    with torch.no_grad():
        conv0 = f[0](x)
        pool5 = f[5](F.relu(f[3](f[2](F.relu(conv0)))))
    assert (conv0 < 0).any()
    assert_features_equal(features, {"features.0": conv0, "features.5": pool5})


def test_mobilenet_v3_inplace_hardswish_victim(tmp_path, images):
    paths, features = extract_and_read(tmp_path, images, "mobilenet_v3_small", ["features.0.1"])
    model = seeded_model("mobilenet_v3_small")
    assert model.features[0][2].inplace, "features.0.2 must be an in-place Hardswish for this test"
    x = reference_inputs("mobilenet_v3_small", images, paths)
    with torch.no_grad():
        bn = model.features[0][1](model.features[0][0](x))
    assert not torch.equal(F.hardswish(bn), bn), "Hardswish must change these values to be a real test"
    assert_features_equal(features, {"features.0.1": bn})


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_vit_b_16_encoder_layers(tmp_path, images):
    layers = ["encoder.layers.encoder_layer_11", "encoder.ln"]
    paths, features = extract_and_read(tmp_path, images, "vit_b_16", layers, batch_size=2)
    model = seeded_model("vit_b_16")
    x = reference_inputs("vit_b_16", images, paths)
    with torch.no_grad():
        tokens = model._process_input(x)
        tokens = torch.cat([model.class_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        encoder = model.encoder
        hidden = encoder.dropout(tokens + encoder.pos_embedding)
        for layer in encoder.layers:
            hidden = layer(hidden)
        normed = encoder.ln(hidden)
    assert features["encoder.ln"].shape == (5, 197, 768)
    assert_features_equal(features, {"encoder.layers.encoder_layer_11": hidden, "encoder.ln": normed})


def test_labels_and_classes_follow_class_folders(tmp_path, images):
    output = tmp_path / "out.h5"
    extract(settings_for(images, output))
    with h5py.File(output, "r") as h5file:
        paths = list(h5file["paths"].asstr()[:])
        labels = list(h5file["labels"][:])
        classes = list(h5file["labels"].attrs["classes"])
    assert classes == ["a", "b"]
    assert labels == [["a", "b"].index(path.split("/")[0]) for path in paths]


def test_checkpoint_weights_give_the_checkpoints_features(tmp_path, images):
    torch.manual_seed(123)
    model = get_model("resnet18", weights=None).eval()
    checkpoint = tmp_path / "model.pth"
    torch.save({"state_dict": model.state_dict(), "epoch": 3}, checkpoint)
    output = tmp_path / "ckpt.h5"
    extract(settings_for(images, output, weights=str(checkpoint), layers=("fc",)))
    with h5py.File(output, "r") as h5file:
        paths = list(h5file["paths"].asstr()[:])
        stored = torch.from_numpy(h5file["features/fc"][:])
        assert h5file.attrs["weights"] == str(checkpoint.resolve())
    with torch.no_grad():
        expected = model(reference_inputs("resnet18", images, paths))
    torch.testing.assert_close(stored, expected, rtol=1e-4, atol=1e-4)
