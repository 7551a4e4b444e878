"""Every row is one image: outputs with the batch in another dimension, and outputs with no batch at all."""

from __future__ import annotations

import json
import textwrap

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from .helpers import featdump_env, run_featdump, user_project, write_images

SEQUENCE_FIRST = textwrap.dedent('''
    import torch
    from torch import nn
    from torchvision import transforms as T


    class Table(nn.Module):
        """A relative-position table: the same (1, 4, 4) whatever the batch."""

        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(1, 4, 4))

        def forward(self, x):
            return self.weight * 1.0


    class SequenceFirst(nn.Module):
        """OpenAI-CLIP style: tokens as (L, N, E) through LayerNorm and nn.MultiheadAttention(batch_first=False)."""

        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, 16, 8, stride=8)
            self.norm = nn.LayerNorm(16)
            self.attn = nn.MultiheadAttention(16, 2)
            self.table = Table()

        def forward(self, x):
            tokens = self.norm(self.patch(x).flatten(2).permute(2, 0, 1))
            mixed, _ = self.attn(tokens, tokens, tokens)
            return (mixed + tokens).mean(0) + self.table(x).sum()


    def build():
        return SequenceFirst()


    def build_stating_tokens():
        """The same network saying what its tokens are, as timm's ViTs do: no class token, 8-pixel patches."""
        net = SequenceFirst()
        net.num_prefix_tokens, net.patch_size = 0, 8
        return net


    def small():
        return T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()])
''')


@pytest.fixture
def project(tmp_path):
    with user_project(tmp_path, "seqnet", SEQUENCE_FIRST, {"": 5}) as folder:
        yield folder


def extract(project, *args):
    return run_featdump("extract", "-m", "seqnet:build", "--transform", "seqnet:small", "-w", "none", *args,
                        "images", "out.h5", cwd=project, env=featdump_env())


def per_image_tokens(project):
    """Each image's tokens after the LayerNorm and after the attention, computed alone (a batch of one)."""
    import seqnet

    torch.manual_seed(0)
    net = seqnet.build().eval()
    transform = seqnet.small()
    norms, attended = [], []
    for path in sorted((project / "images").iterdir()):
        x = transform(Image.open(path).convert("RGB"))[None]
        with torch.inference_mode():
            tokens = net.norm(net.patch(x).flatten(2).permute(2, 0, 1))  # (16, 1, 16)
            mixed, _ = net.attn(tokens, tokens, tokens)
        norms.append(tokens[:, 0].numpy())
        attended.append(mixed[:, 0].numpy())
    return np.stack(norms), np.stack(attended)


def test_sequence_first_outputs_are_stored_one_row_per_image(project):
    result = extract(project, "-l", "norm,attn")
    assert result.returncode == 0, result.stderr
    assert "Layer norm holds the batch in dimension 1: stored batch-first, (16, N, 16) -> (N, 16, 16)." \
        in result.stderr
    norms, attended = per_image_tokens(project)
    with h5py.File(project / "out.h5", "r") as h5file:
        assert h5file["features/norm"].shape == (5, 16, 16)
        np.testing.assert_allclose(h5file["features/norm"][:], norms, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(h5file["features/attn"][:], attended, rtol=1e-4, atol=1e-5)
        assert h5file["features/attn"].attrs["layout"] == "(16, N, 16) -> (N, 16, 16)"
        assert json.loads(h5file.attrs["fingerprint"])["layouts"]["norm"] == "(16, N, 16) -> (N, 16, 16)"


def test_token_reductions_need_the_model_to_state_its_tokens_and_apply_per_image(project):
    silent = extract(project, "-l", "norm", "--reduce", "cls")
    assert silent.returncode == 2 and not (project / "out.h5").exists()
    assert silent.stderr.strip().splitlines()[-1] == (
        "Error: --reduce cls on layer 'norm': featdump does not know which of its tokens are class and patch tokens "
        "(the model does not state its class/register tokens and patch size (timm, hf:, open_clip: and torchvision "
        "ViTs do; your own model can, as num_prefix_tokens and patch_size)); use avgpool (all tokens), flatten or "
        "none.")
    stating = ["extract", "-m", "seqnet:build_stating_tokens", "--transform", "seqnet:small", "-w", "none", "-l",
               "norm", "images", "out.h5"]
    no_class = run_featdump(*stating, "--reduce", "cls", cwd=project, env=featdump_env())
    assert no_class.returncode == 2 and "the model has no class token" in no_class.stderr
    result = run_featdump(*stating, "--reduce", "patchmean", cwd=project, env=featdump_env())
    assert result.returncode == 0, result.stderr
    norms, _ = per_image_tokens(project)
    with h5py.File(project / "out.h5", "r") as h5file:  # sequence-first (16, N, 16): each image's 16 patches
        np.testing.assert_allclose(h5file["features/norm"][:], norms.mean(axis=1), rtol=1e-5, atol=1e-6)
        assert h5file["features/norm"].attrs["prefix_tokens"] == 0


def test_an_output_without_a_batch_is_refused_before_anything_is_written(project):
    result = extract(project, "-l", "norm,table")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "Error: Layer 'table' outputs (1, 4, 4) whatever the batch size: its output does not depend on the batch "
        "(a table or parameter, not one row per image), so it cannot be stored per image. "
        "Run `featdump list-layers seqnet:build` to see every layer.")
    assert not list(project.glob("out.h5*"))


def test_list_layers_shows_batch_dimensions(project):
    result = run_featdump("list-layers", "seqnet:build", "--transform", "seqnet:small", "--json", cwd=project,
                          env=featdump_env())
    rows = {row["path"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows["norm"]["batch_dims"] == [1] and rows["norm"]["per_image"]
    assert rows["patch"]["batch_dims"] == [0]
    assert rows["table"]["batch_dims"] == [None] and not rows["table"]["per_image"]
    tree = run_featdump("list-layers", "seqnet:build", "--transform", "seqnet:small", cwd=project,
                        env=featdump_env()).stdout
    assert "(batch in dimension 1: stored batch-first)" in tree
    assert "(not per image: the output does not follow the batch)" in tree


def test_swin_v2_relative_position_table_is_refused(image_folder, tmp_path):
    result = run_featdump("extract", "-m", "swin_v2_t", "-w", "none", "-l", "features.1.0.attn.cpb_mlp",
                          image_folder, tmp_path / "out.h5")
    assert result.returncode == 2
    assert "Error: Layer 'features.1.0.attn.cpb_mlp' outputs (1, 15, 15, 3) whatever the batch size" in result.stderr
    assert not list(tmp_path.glob("out.h5*"))


def test_levit_rows_of_several_tokens_per_image_are_stored_per_image(tmp_path):
    timm = pytest.importorskip("timm", reason="timm is not installed (pip install 'featdump[timm]')")
    torch.manual_seed(0)
    model = timm.create_model("levit_128s", pretrained=False).eval()
    for module in model.modules():  # LeViT starts its residual norms at zero: give them weights that show
        if isinstance(module, nn.BatchNorm1d):
            nn.init.normal_(module.weight)
    torch.save(model.state_dict(), tmp_path / "levit.pth")
    write_images(tmp_path / "images", {"": 3})
    layer = "stages.1.blocks.0.attn.proj.ln.bn"
    result = run_featdump("extract", "-m", "timm:levit_128s", "-w", tmp_path / "levit.pth", "-l", layer, "-b", "2",
                          tmp_path / "images", tmp_path / "out.h5")
    assert result.returncode == 0, result.stderr
    config = timm.data.resolve_data_config({}, model=model)
    transform = timm.data.create_transform(**config, is_training=False)
    paths = sorted((tmp_path / "images").iterdir())
    seen = []
    model.get_submodule(layer).register_forward_hook(lambda module, args, output: seen.append(output.clone()))
    with torch.inference_mode():
        model(torch.stack([transform(Image.open(path).convert("RGB")) for path in paths]))
    expected = seen[0].reshape(3, -1, seen[0].shape[-1])  # (3 x 49, 256) -> (3, 49, 256)
    with h5py.File(tmp_path / "out.h5", "r") as h5file:
        dataset = h5file["features"][layer]
        assert dataset.shape == (3, 49, 256) and dataset.attrs["layout"] == "(N*49, 256) -> (N, 49, 256)"
        np.testing.assert_allclose(dataset[:], expected.numpy(), rtol=1e-4, atol=1e-5)


INTERLEAVED = '''
from torch import nn


class Interleave(nn.Module):
    def forward(self, x):
        return x.flatten(2).permute(2, 0, 1).reshape(-1, x.shape[1])  # (H*W*N, C): the images' rows interleave


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=16)
        self.rows = Interleave()

    def forward(self, x):
        return self.rows(self.conv(x))


def build():
    return Net()
'''


def test_interleaved_rows_are_refused_saying_what_they_are(tmp_path):
    with user_project(tmp_path, "interleaved", INTERLEAVED, {"": 2}) as folder:
        result = run_featdump("extract", "-m", "interleaved:build", "-l", "rows", folder / "images",
                              tmp_path / "out.h5", cwd=folder)
    assert result.returncode == 2
    assert "Error: Layer 'rows' folds the batch into dimension 0 (196 rows per image), but an image's rows are not " \
           "one block" in result.stderr
