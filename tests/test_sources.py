"""Any model: your own factory, checkpoints, whole saved models, timm; all with the same exact capture."""

from __future__ import annotations

import json
import textwrap

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

from .helpers import featdump_env, read_features, run_featdump, user_project, write_images

NETWORK = textwrap.dedent('''
    import torch
    from torch import nn
    from torchvision import transforms as T


    class Net(nn.Module):
        """A ReLU module used twice, in place: the capture must copy each call's output."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
            self.pool = nn.AdaptiveAvgPool2d(2)

        def forward(self, x):
            x = self.relu(self.bn(self.conv1(x)))
            x = self.conv2(x)
            x += 1.0
            return self.pool(self.relu(x))


    def build():
        return Net()


    def small():
        return T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()])
''')


@pytest.fixture
def project(tmp_path):
    """A folder holding a user's own model code (mynet.py) and some images; commands run from it."""
    with user_project(tmp_path, "mynet", NETWORK, {"a": 3, "b": 2}) as folder:
        yield folder


def inputs_of(folder, transform) -> torch.Tensor:
    paths = sorted(p for p in folder.rglob("*") if p.suffix in (".jpg", ".png"))
    return torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])


def manual_net(net, x) -> dict:
    """Each requested output computed by explicit submodule calls."""
    with torch.inference_mode():
        bn = net.bn(net.conv1(x))
        relu1 = torch.relu(bn)
        conv2 = net.conv2(relu1)  # the module's output, before the model's in-place += 1 changes it
        relu2 = torch.relu(conv2 + 1.0)
        return {"bn": bn, "relu:1": relu1, "relu:2": relu2, "conv2": conv2, "pool": net.pool(relu2)}


def run_in(project, *args):
    return run_featdump(*args, cwd=project, env=featdump_env())


def test_factory_model_with_a_reused_in_place_module_and_its_transform(project):
    result = run_in(project, "extract", "-m", "mynet:build", "-w", "none", "--seed", "3", "--transform", "mynet:small",
                    "-l", "bn,relu:1,relu:2,conv2", "images", "out.h5")
    assert result.returncode == 0, result.stderr
    import mynet

    torch.manual_seed(3)
    expected = manual_net(mynet.build().eval(), inputs_of(project / "images", mynet.small()))
    got = read_features(project / "out.h5")
    for name in ("bn", "relu:1", "relu:2", "conv2"):
        np.testing.assert_allclose(got[name], expected[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    with h5py.File(project / "out.h5", "r") as h5file:
        source = json.loads(h5file.attrs["model_source"])
    assert source["factory"] == "mynet:build" and source["transform"] == "mynet:small"


def test_factory_without_transform_uses_the_imagenet_default_and_says_so(project):
    result = run_in(project, "extract", "-m", "mynet:build", "-w", "none", "-l", "pool", "images", "out.h5")
    assert result.returncode == 0, result.stderr
    assert "No --transform for mynet:build: using the ImageNet default ResNet18_Weights.DEFAULT.transforms()" \
        in result.stderr
    with h5py.File(project / "out.h5", "r") as h5file:
        assert h5file["features/pool"].shape == (5, 8, 2, 2)


def test_checkpoint_on_a_factory_model(project):
    import mynet

    torch.manual_seed(11)
    trained = mynet.build()
    torch.save({"state_dict": {"module." + k: v for k, v in trained.state_dict().items()}}, project / "net.pt")
    result = run_in(project, "extract", "-m", "mynet:build", "-w", "net.pt", "--transform", "mynet:small",
                    "-l", "pool", "images", "out.h5")
    assert result.returncode == 0, result.stderr
    expected = manual_net(trained.eval(), inputs_of(project / "images", mynet.small()))["pool"]
    np.testing.assert_allclose(read_features(project / "out.h5")["pool"], expected.numpy(), rtol=1e-5, atol=1e-6)
    with h5py.File(project / "out.h5", "r") as h5file:
        assert "checkpoint_sha256" in json.loads(h5file.attrs["fingerprint"])["model_source"]


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_whole_model_files_need_trust_pickle_and_torchscript_is_refused(project):
    import mynet

    torch.manual_seed(5)
    whole = mynet.build().eval()
    torch.save(whole, project / "whole.pt")
    refused = run_in(project, "extract", "-m", "whole.pt", "-l", "pool", "images", "out.h5")
    assert refused.returncode == 2
    assert "loading it runs whatever code the file contains. If you trust its origin pass --trust-pickle" \
        in refused.stderr
    accepted = run_in(project, "extract", "-m", "whole.pt", "--trust-pickle", "--transform", "mynet:small",
                      "-l", "pool", "images", "out.h5")
    assert accepted.returncode == 0, accepted.stderr
    expected = manual_net(whole, inputs_of(project / "images", mynet.small()))["pool"]
    np.testing.assert_allclose(read_features(project / "out.h5")["pool"], expected.numpy(), rtol=1e-5, atol=1e-6)

    torch.jit.script(whole).save(str(project / "scripted.pt"))
    scripted = run_in(project, "extract", "-m", "scripted.pt", "--trust-pickle", "-l", "pool", "images", "o2.h5")
    assert scripted.returncode == 2
    assert "is a TorchScript archive: hooks cannot see inside it" in scripted.stderr
    assert "--model package.module:build" in scripted.stderr


@pytest.mark.parametrize("model, message", [
    ("raft_small", "IMAGES holds images, and the model takes clips of 2 frames of a video"),
    ("resnet5O", "Unknown model 'resnet5O'. Did you mean: resnet50"),
    ("nosuchpkg.nets:build", "Cannot import 'nosuchpkg.nets' for --model"),
    ("mynet:missing", "'mynet' has no 'missing'"),
])
def test_models_that_cannot_be_used_get_one_clear_line(project, model, message):
    result = run_in(project, "extract", "-m", model, "-w", "none", "-l", "x", "images", "out.h5")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_list_layers_for_a_factory_model(project):
    result = run_in(project, "list-layers", "mynet:build", "--transform", "mynet:small", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["path"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows["relu"]["calls"] == 2 and rows["pool"]["shapes"] == [[8, 2, 2]]
    assert rows["conv1"]["shapes"] == [[8, 32, 32]]


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_timm_cnn_and_vit_against_explicit_calls(tmp_path):
    timm = pytest.importorskip("timm", reason="timm is not installed (pip install 'featdump[timm]')")
    write_images(tmp_path / "images", {"": 3})
    for name, layer in (("resnet10t", "layer2.0.act1"), ("vit_tiny_patch16_224", "blocks.1")):
        output = tmp_path / f"{name}.h5"
        result = run_featdump("extract", "-m", f"timm:{name}", "-w", "none", "--seed", "2", "-l", layer,
                              tmp_path / "images", output)
        assert result.returncode == 0, result.stderr
        torch.manual_seed(2)
        model = timm.create_model(name, pretrained=False).eval()
        config = timm.data.resolve_data_config({}, model=model)
        x = inputs_of(tmp_path / "images", timm.data.create_transform(**config, is_training=False))
        with torch.inference_mode():
            if name == "resnet10t":
                y = model.maxpool(model.act1(model.bn1(model.conv1(x))))
                y = model.layer1(y)
                block = model.layer2[0]
                expected = block.act1(block.bn1(block.conv1(y)))
            else:
                y = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
                expected = model.blocks[1](model.blocks[0](y))
        got = read_features(output)[layer]
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
        with h5py.File(output, "r") as h5file:
            assert json.loads(h5file.attrs["model_source"])["timm_model"] == name


@pytest.mark.slow  # timm's Swin built and run twice; the axes' own tests (test_netcdf) stay quick
def test_timm_swin_stages_are_channels_last_as_timm_states_and_pool_to_their_channels(tmp_path):
    """timm's Swin takes only its own input size, so the probe cannot find its maps' axes by another size: its
    feature_info stages (NHWC, as `output_fmt` says) are pooled over y and x, 768 values a row equal to hooks' mean
    over space; a map inside a stage, whose axes the model does not state, refuses a pooling in one line."""
    timm = pytest.importorskip("timm", reason="timm is not installed (pip install 'featdump[timm]')")
    name = "swin_tiny_patch4_window7_224"
    write_images(tmp_path / "images", {"": 2})
    output = tmp_path / "swin.h5"
    result = run_featdump("extract", "-m", f"timm:{name}", "-w", "none", "--seed", "2", "-l", "layers.3",
                          "--reduce", "avgpool", tmp_path / "images", output)
    assert result.returncode == 0, result.stderr
    torch.manual_seed(2)
    model = timm.create_model(name, pretrained=False).eval()
    config = timm.data.resolve_data_config({}, model=model)
    x = inputs_of(tmp_path / "images", timm.data.create_transform(**config, is_training=False))
    captured = {}
    handle = model.layers[3].register_forward_hook(lambda module, args, out: captured.setdefault("out", out))
    with torch.inference_mode():
        model(x)
    handle.remove()
    assert captured["out"].shape == (2, 7, 7, 768)
    got = read_features(output)["layers.3"]
    assert got.shape == (2, 768)
    np.testing.assert_allclose(got, captured["out"].mean(dim=(1, 2)).numpy(), rtol=1e-4, atol=1e-5)
    refused = run_featdump("extract", "-m", f"timm:{name}", "-w", "none", "-l", "layers.3.blocks.1", "--reduce",
                           "avgpool", tmp_path / "images", tmp_path / "inner.h5")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith("Error: --reduce avgpool on layer 'layers.3.blocks.1': featdump cannot tell which "
                                     "axis of its (7, 7, 768) map holds the channels"), refused.stderr
