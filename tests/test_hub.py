"""Models from torch.hub (`featdump.sources.hub`, registered through the entry point `featdump.sources`): a local
checkout's entry point and a GitHub repository from torch.hub's cache, offline; -w none through `pretrained=False`;
the ImageNet default preprocessing named; rows equal the entry point's model run by hand."""

from __future__ import annotations

import numpy as np
import torch
from torchvision import transforms

import featdump

from .helpers import run_featdump, write_images

HUBCONF = '''
dependencies = ["torch"]
import torch
from torch import nn


def tiny(pretrained=False, width=8):
    """A small CNN; its weights would be downloaded when pretrained (offline here: a failure)."""
    if pretrained:
        raise RuntimeError("<urlopen error [Errno -3] Temporary failure in name resolution>")
    return nn.Sequential(nn.Conv2d(3, width, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten())


def fixed():
    """An entry point that takes no pretrained argument."""
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
'''


def test_a_local_checkout_s_entry_point_runs_with_random_weights_and_equals_it_by_hand(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "hubconf.py").write_text(HUBCONF)
    write_images(tmp_path / "images", {"": 3})
    result = run_featdump("-v", "extract", "-m", f"hub:{tmp_path / 'repo'}:tiny", "-w", "none", "-l", "1",
                          tmp_path / "images", tmp_path / "out.h5")
    assert result.returncode == 0, result.stderr
    assert "a torch.hub model states no preprocessing: the ImageNet default" in result.stderr
    rows = featdump.load(tmp_path / "out.h5", "1")
    torch.manual_seed(0)  # the run's seed for -w none
    model = torch.hub.load(str(tmp_path / "repo"), "tiny", source="local", trust_repo=True, pretrained=False).eval()
    preprocess = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
                                     transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    from PIL import Image

    with torch.no_grad():
        for path, row in zip(rows.paths, rows.features):
            expected = model[:2](preprocess(Image.open(tmp_path / "images" / path).convert("RGB"))[None])[0]
            np.testing.assert_allclose(row, expected.numpy(), rtol=1e-4, atol=1e-5)


def test_a_cached_github_repository_is_read_offline_and_its_weights_fail_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    cached = tmp_path / "torch" / "hub" / "facebookresearch_tinyhub_main"
    cached.mkdir(parents=True)
    (cached / "hubconf.py").write_text(HUBCONF)
    write_images(tmp_path / "images", {"": 2})
    made = run_featdump("extract", "-m", "hub:facebookresearch/tinyhub:tiny", "-w", "none", "-l", "3",
                        tmp_path / "images", tmp_path / "out.h5")
    assert made.returncode == 0, made.stderr
    assert featdump.load(tmp_path / "out.h5", "3").features.shape == (2, 32)
    offline = run_featdump("extract", "-m", "hub:facebookresearch/tinyhub:tiny", "-l", "3", tmp_path / "images",
                           tmp_path / "weights.h5")
    assert offline.returncode != 0 and "could not load its weights" in offline.stderr, offline.stderr
    assert len(offline.stderr.strip().splitlines()) == 1
    fixed = run_featdump("extract", "-m", "hub:facebookresearch/tinyhub:fixed", "-w", "none", "-l", "0",
                         tmp_path / "images", tmp_path / "fixed.h5")
    assert fixed.returncode == 2 and "takes no `pretrained` argument" in fixed.stderr, fixed.stderr
    missing = run_featdump("extract", "-m", "hub:someone/elsewhere:tiny", "-w", "none", "-l", "0",
                           tmp_path / "images", tmp_path / "missing.h5")
    assert missing.returncode == 2 and "holds no copy of someone/elsewhere" in missing.stderr, missing.stderr
    unknown = run_featdump("list-layers", "hub:facebookresearch/tinyhub:nosuch")
    assert unknown.returncode != 0 and "has no entry point 'nosuch'" in unknown.stderr, unknown.stderr


def test_an_entry_point_without_pretrained_takes_a_checkpoint_and_lists_its_layers(tmp_path):
    """The request is typed: a checkpoint to follow, or only the layers (list-layers), is no `--weights none` to an
    entry point that takes no `pretrained` argument: it is built as it builds itself, then the checkpoint loaded;
    its layers listed."""
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "hubconf.py").write_text(HUBCONF)
    write_images(tmp_path / "images", {"": 2})
    trained = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    torch.nn.init.constant_(trained[0].weight, 0.01)
    torch.save(trained.state_dict(), tmp_path / "trained.pt")
    spec = f"hub:{tmp_path / 'repo'}:fixed"
    made = run_featdump("extract", "-m", spec, "-w", tmp_path / "trained.pt", "-l", "0", "--transform",
                        "featdump.testing.models:small_transform", tmp_path / "images", tmp_path / "out.h5")
    assert made.returncode == 0, made.stderr
    rows = featdump.load(tmp_path / "out.h5", "0")
    from PIL import Image

    from featdump.testing.models import small_transform

    with torch.no_grad():
        for path, row in zip(rows.paths, rows.features):
            expected = trained[0](small_transform()(Image.open(tmp_path / "images" / path).convert("RGB"))[None])[0]
            np.testing.assert_allclose(row, expected.numpy(), rtol=1e-5, atol=1e-6)
    listed = run_featdump("list-layers", spec)
    assert listed.returncode == 0 and "Conv2d" in listed.stdout, listed.stderr + listed.stdout
