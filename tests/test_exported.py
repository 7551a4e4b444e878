"""Programs saved with torch.export.save (`--model export:PATH.pt2`, `featdump.sources.exported`, registered as a
plugin is): their module paths restored by torch.export.unflatten, rows equal the eager model's, their layers
listed; what cannot apply (--weights, a checkpoint, a missing file, a program of a fixed batch size) said in one
line."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

import featdump

from .helpers import run_featdump, write_images

TRANSFORM = ["--transform", "featdump.testing.models:small_transform"]


def nested() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(
        stem=nn.Sequential(OrderedDict(conv=nn.Conv2d(3, 8, 3, stride=2), relu=nn.ReLU())),
        block=nn.Sequential(OrderedDict(conv=nn.Conv2d(8, 8, 3, padding=1), relu=nn.ReLU())),
        pool=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten())).eval()


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exported")
    batch = torch.export.Dim("batch", min=1, max=4096)
    exported = torch.export.export(nested(), (torch.randn(2, 3, 32, 32),), dynamic_shapes={"input": {0: batch}})
    torch.export.save(exported, folder / "nested.pt2")
    fixed = torch.export.export(nested(), (torch.randn(2, 3, 32, 32),))
    torch.export.save(fixed, folder / "fixed.pt2")
    write_images(folder / "images", {"a": 3, "b": 2})
    return folder


def test_an_exported_program_s_rows_equal_the_eager_model_s_at_its_module_paths(program, tmp_path):
    made = run_featdump("extract", "-m", f"export:{program / 'nested.pt2'}", *TRANSFORM, "-l",
                        "stem.relu,block.conv,flat", program / "images", tmp_path / "out.h5")
    assert made.returncode == 0, made.stderr
    from PIL import Image

    from featdump.testing.models import small_transform

    model = nested()
    rows = {name: featdump.load(tmp_path / "out.h5", name) for name in ("stem.relu", "block.conv", "flat")}
    with torch.no_grad():
        for index, path in enumerate(rows["flat"].paths):
            x = small_transform()(Image.open(program / "images" / path).convert("RGB"))[None]
            stem = model.stem(x)
            close(rows["stem.relu"].features[index], stem[0])
            close(rows["block.conv"].features[index], model.block.conv(stem)[0])
            close(rows["flat"].features[index], model(x)[0])
    listed = run_featdump("list-layers", f"export:{program / 'nested.pt2'}", *TRANSFORM)
    assert listed.returncode == 0 and "stem.conv" in listed.stdout and "block.relu" in listed.stdout, listed.stdout


def close(row: np.ndarray, expected: torch.Tensor) -> None:
    """Equal to a rounding: the run's batch of five goes through other kernels than one image by hand."""
    np.testing.assert_allclose(row, expected.numpy(), rtol=1e-5, atol=1e-6)


def test_what_cannot_apply_to_a_program_is_said_in_one_line(program, tmp_path):
    spec = f"export:{program / 'nested.pt2'}"
    checkpoint = tmp_path / "weights.pt"
    torch.save(nested().state_dict(), checkpoint)
    for arguments, said in ((["-w", "none"], "--weights none: "), (["-w", str(checkpoint)], "a checkpoint: "),
                            (["-m", f"export:{tmp_path / 'nowhere.pt2'}"], "no file")):
        model = arguments[1] if arguments[0] == "-m" else spec
        weights = [] if arguments[0] == "-m" else arguments
        result = run_featdump("extract", "-m", model, *weights, *TRANSFORM, "-l", "flat", program / "images",
                              tmp_path / "out.h5")
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
        assert result.returncode == 2 and len(errors) == 1 and said in errors[0], result.stderr
    plain = run_featdump("extract", "-m", program / "nested.pt2", *TRANSFORM, "-l", "flat", program / "images",
                         tmp_path / "plain.h5")
    assert plain.returncode == 2 and f"pass --model export:{program / 'nested.pt2'}" in plain.stderr, plain.stderr
    fixed = run_featdump("extract", "-m", f"export:{program / 'fixed.pt2'}", *TRANSFORM, "-l", "flat",
                         program / "images", tmp_path / "fixed.h5")
    assert fixed.returncode != 0 and "Expected input at *args[0].shape[0] to be equal to 2" in fixed.stderr
    assert "Traceback" not in fixed.stderr
