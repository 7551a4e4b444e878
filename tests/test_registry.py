"""Model sources as a registry: each source claims its names, checks and builds them; a new source is one module
that registers itself, and every entry point (load_model, the model's clip, CPU-only models) goes through it."""

from __future__ import annotations

import pytest
import torch

from featdump.sources import registry
from featdump.sources.models import check_model_name, clip_of, cpu_only, load_model, model_kind


@pytest.mark.parametrize("spec, kind", [
    ("resnet18", "torchvision"), ("timm:resnet18", "timm"), ("hf:facebook/dinov2-small", "hf"),
    ("open_clip:ViT-B-32", "open_clip"), ("mypkg.nets:build", "factory"), ("saved/model.pt", "file"),
    ("quantized_resnet18", "torchvision"),
])
def test_each_name_is_claimed_by_one_source(spec, kind):
    assert model_kind(spec) == kind
    assert sum(source.claims(spec) for source in registry.sources() if source.order == 0) <= 1  # prefixes: one each


def test_the_torchvision_source_says_clips_and_cpu_only_models():
    assert clip_of("r3d_18").takes_clips and clip_of("r3d_18").frames == 16
    assert clip_of("resnet18") == registry.ModelClip()
    assert cpu_only("quantized_resnet18") and cpu_only("resnet18") is None


def test_a_new_source_is_one_class_that_registers_itself(monkeypatch):
    monkeypatch.setattr(registry, "_SOURCES", list(registry.sources()))

    @registry.register
    class ToySource(registry.Source):
        name, order = "toy", 0

        def claims(self, spec):
            return spec.startswith("toy:")

        def check(self, spec):
            if spec != "toy:conv":
                raise ValueError(f"no toy {spec}")

        def build(self, request):
            torch.manual_seed(request.seed)
            return registry.Built(torch.nn.Conv2d(3, 4, 3), request.weights, {"source": "toy"})

    check_model_name("toy:conv")
    with pytest.raises(ValueError, match="no toy toy:other"):
        check_model_name("toy:other")
    loaded = load_model("toy:conv", weights="none", seed=2)
    assert model_kind("toy:conv") == "toy" and not loaded.module.training
    assert loaded.source == {"source": "toy", "transform": "ResNet18_Weights.DEFAULT.transforms()"}
    torch.manual_seed(2)
    assert torch.equal(loaded.module.weight, torch.nn.Conv2d(3, 4, 3).weight)
