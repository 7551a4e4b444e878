"""Selectors, the dry-forward probe, and resolution with helpful errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchvision.models import get_model

from featdump.errors import AmbiguousLayer, UnknownLayer
from featdump.forward import probe as probe_module
from featdump.forward.layers import resolve
from featdump.forward.probe import probe


class TupleAndReuse(nn.Module):
    """A tiny model with a reused activation and a module returning a tuple."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.ReLU()
        self.split = SplitHalves()
        self.unused = nn.Linear(2, 2)

    def forward(self, x):
        x = self.act(self.conv(x))
        first, _ = self.split(x)
        return self.act(first)


class SplitHalves(nn.Module):
    def forward(self, x):
        return x[:, :2], x[:, 2:]


def test_probe_counts_calls_shapes_and_tuples():
    infos = {info.path: info for info in probe(TupleAndReuse(), (3, 8, 8))}
    assert infos["act"].calls == 2 and infos["act"].shapes == ((4, 8, 8), (2, 8, 8))
    assert infos["split"].tuple_output and infos["split"].shapes == ((2, 8, 8),)
    assert infos["unused"].calls == 0
    assert infos["conv"].depth == 1


def test_resolve_selectors():
    infos = probe(TupleAndReuse(), (3, 8, 8))
    layers = resolve(["conv", "act:2", "split", "conv"], infos, "tiny")
    assert [(layer.name, layer.path, layer.call, layer.shape) for layer in layers] == [
        ("conv", "conv", 1, (4, 8, 8)), ("act:2", "act", 2, (2, 8, 8)), ("split", "split", 1, (2, 8, 8))]


def test_reused_module_without_call_is_rejected_with_the_options():
    with pytest.raises(AmbiguousLayer, match=r"runs 2 times per forward pass; select one call: act:1 act:2\."):
        resolve(["act"], probe(TupleAndReuse(), (3, 8, 8)), "tiny")


@pytest.mark.parametrize("selector, message", [
    ("convv", r"Unknown layer 'convv' in tiny\. Close matches: conv\. Run `featdump list-layers tiny`"),
    ("act:3", r"runs 2 time\(s\) per forward pass, so 'act:3' does not exist"),
    ("unused", r"never runs in a forward pass"),
    ("conv:x", r"Bad layer selector 'conv:x'"),
])
def test_bad_selectors(selector, message):
    with pytest.raises(UnknownLayer, match=message):
        resolve([selector], probe(TupleAndReuse(), (3, 8, 8)), "tiny")


def test_resnet18_probe_facts():
    torch.manual_seed(0)
    infos = {info.path: info for info in probe(get_model("resnet18", weights=None).eval(), (3, 224, 224))}
    assert infos["layer3.0.downsample.1"].shapes == ((256, 14, 14),)
    assert infos["layer1.0.relu"].calls == 2
    assert infos["layer4.1.relu"].calls == 2
    assert infos["fc"].shapes == ((1000,),)


def small_vit() -> nn.Module:
    from torchvision.models import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64)


@pytest.mark.parametrize("name, shape", [
    ("resnet18", (3, 64, 64)), ("mobilenet_v3_small", (3, 64, 64)), ("vit", (3, 32, 32)),
    pytest.param("swin_v2_t", (3, 256, 256), marks=pytest.mark.slow),  # relative positions: 4 s of real probes
])
def test_the_probe_on_the_meta_device_finds_what_real_zeros_find(name, shape):
    torch.manual_seed(0)
    model = (small_vit() if name == "vit" else get_model(name, weights=None)).eval()
    for batch in (2, 3):
        on_meta = probe_module._recorded(model, shape, batch, (), on_meta=True)
        for_real = probe_module._recorded(model, shape, batch, (), on_meta=False)
        assert on_meta == for_real and on_meta[0][""] == [{None: (batch, 1000)}]


def test_a_model_that_does_not_run_on_the_meta_device_is_probed_for_real():
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    detector = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None).eval()
    with pytest.raises(NotImplementedError):  # data-dependent shapes (torch.nonzero): no shape without values
        probe_module._recorded(detector, (3, 64, 64), 2, (), on_meta=True)
    records, _ = probe_module._record_calls(detector, (3, 64, 64), 2, ("backbone",))
    assert records["backbone"] == [{None: None, "0": (2, 256, 10, 10), "1": (2, 256, 10, 10), "pool": (2, 256, 5, 5)}]


def test_the_models_own_output_is_the_layer_at_and_patterns_never_select_it(tmp_path):
    import h5py
    import numpy as np
    from PIL import Image

    import featdump
    from featdump.forward.patterns import match_pattern
    from featdump.sources.models import default_preprocessing

    from .helpers import write_images

    infos = probe(TupleAndReuse(), (3, 8, 8))
    assert infos[0].path == "" and infos[0].selector == "@" and infos[0].depth == 0
    assert [layer.name for layer in resolve(["@"], infos, "net")] == ["@"]
    assert "" not in match_pattern("**", infos, "net") and "@" not in match_pattern("*", infos, "net")
    write_images(tmp_path / "images", {"": 3})
    output = featdump.extract(tmp_path / "images", tmp_path / "out.h5", model="resnet18", weights="none",
                              layers=["@", "layer4"], num_workers=0)
    torch.manual_seed(0)
    model = get_model("resnet18", weights=None).eval()
    transform = default_preprocessing("resnet18")
    with h5py.File(output, "r") as h5file:
        paths = h5file["paths"].asstr()[:]
        stored = h5file["features/@"][:]
    pixels = torch.stack([transform(Image.open(tmp_path / "images" / path).convert("RGB")) for path in paths])
    with torch.inference_mode():
        logits = model(pixels).numpy()
    np.testing.assert_allclose(stored, logits, rtol=1e-4, atol=1e-5)
