"""Hugging Face and open_clip models, and outputs that are not one tensor (tuples, dicts, ModelOutputs): every
stored row against the model's own outputs or a manual recomputation. No download: tiny models from configs."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from torchvision.models import ResNet18_Weights

import featdump
from featdump.errors import UnknownLayer
from featdump.faces.cli import main

from .helpers import featdump_env, run_featdump, user_project, write_images

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install 'featdump[hf]')")


def images_in(folder) -> list[Image.Image]:
    with h5py.File(folder, "r") as h5file:
        root = h5file.attrs["image_root"]
        return [Image.open(f"{root}/{path}").convert("RGB") for path in h5file["paths"].asstr()[:]]


def rows(path, layer) -> np.ndarray:
    with h5py.File(path, "r") as h5file:
        return h5file["features"][layer][:]


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(got - expected).max() / np.abs(expected).max())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny ViT and a tiny CLIP (text and vision), each saved with save_pretrained with its processor."""
    folder = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    vit = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 image_size=32, patch_size=8)
    transformers.ViTModel(vit).save_pretrained(folder / "vit")
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder / "vit")
    clip = transformers.CLIPConfig(
        text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         vocab_size=100, max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           image_size=32, patch_size=8), projection_dim=16)
    transformers.CLIPModel(clip).save_pretrained(folder / "clip")
    transformers.CLIPImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32}) \
        .save_pretrained(folder / "clip")
    write_images(folder / "images", {"a": 3, "b": 2}, size=(64, 48))
    return folder


@pytest.mark.parametrize("name, layer, block", [("vit", "layers.1", 2), ("clip", "encoder.layers.0", 1)])
def test_a_block_equals_the_models_own_hidden_state(saved, name, layer, block):
    output = saved / f"{name}.h5"
    result = run_featdump("extract", "-m", f"hf:{saved / name}", "-l", layer, "--overwrite",
                          saved / "images", output)
    assert result.returncode == 0, result.stderr
    model = transformers.AutoModel.from_pretrained(saved / name).eval()
    model = model.vision_model if name == "clip" else model  # the vision tower of a multimodal checkpoint
    processor = transformers.AutoImageProcessor.from_pretrained(saved / name)
    pixels = processor(images=images_in(output), return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        hidden = model(pixels, output_hidden_states=True).hidden_states[block].numpy()
    assert relative_error(rows(output, layer), hidden) <= 1e-4
    with h5py.File(output, "r") as h5file:
        dataset = h5file["features"][layer]
        assert dataset.attrs["prefix_tokens"] == 1 and list(dataset.attrs["patch_grid"]) == [4, 4]
        source = json.loads(h5file.attrs["model_source"])
        assert source["source"] == "hf" and source["transformers_version"] == transformers.__version__
        assert json.loads(h5file.attrs["fingerprint"])["model_source"] == source


def test_weights_none_builds_the_config_after_the_seed_and_patchmean_leaves_the_class_token_out(saved):
    outputs = []
    for index in range(2):
        outputs.append(featdump.extract(saved / "images", saved / f"seeded{index}.h5", model=f"hf:{saved / 'vit'}",
                                        layers="layers.1", weights="none", seed=3, num_workers=0, overwrite=True))
    np.testing.assert_array_equal(rows(outputs[0], "layers.1"), rows(outputs[1], "layers.1"))
    torch.manual_seed(3)
    model = transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(saved / "vit")).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(saved / "vit")
    pixels = processor(images=images_in(outputs[0]), return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        hidden = model(pixels, output_hidden_states=True).hidden_states[2].numpy()
    assert relative_error(rows(outputs[0], "layers.1"), hidden) <= 1e-4
    pooled = featdump.extract(saved / "images", saved / "pooled.h5", model=f"hf:{saved / 'vit'}",
                              layers="layers.1", weights="none", seed=3, num_workers=0, reduce="patchmean",
                              overwrite=True)
    np.testing.assert_allclose(rows(pooled, "layers.1"), hidden[:, 1:].mean(axis=1), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def patch_models(saved):
    """Models without a class token (Swin, I-JEPA) and with tokens after the patches (YOLOS' detection tokens)."""
    folder = saved / "patch_models"
    processor = transformers.ViTImageProcessor(size={"height": 32, "width": 32})
    configs = {
        "swin": transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                        window_size=4),
        "ijepa": transformers.IJepaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=64, image_size=32, patch_size=8),
        "yolos": transformers.YolosConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=64, image_size=[32, 32], patch_size=8,
                                          num_detection_tokens=5),
    }
    for name, config in configs.items():
        torch.manual_seed(0)
        transformers.AutoModel.from_config(config).save_pretrained(folder / name)
        processor.save_pretrained(folder / name)
    return folder


def tokens_of(model_folder, images_h5, layer_output):
    """What LAYER_OUTPUT(model) returns, for the images of IMAGES_H5 through the model's own processor."""
    model = transformers.AutoModel.from_pretrained(model_folder).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(model_folder)
    pixels = processor(images=images_in(images_h5), return_tensors="pt")["pixel_values"]
    seen = {}
    layer_output(model).register_forward_hook(lambda module, args, out: seen.update(
        out=(out[0] if isinstance(out, tuple) else out).clone()))
    with torch.inference_mode():
        model(pixels)
    return seen["out"].numpy()


def test_patchmean_keeps_every_patch_of_models_without_a_class_token(saved, patch_models):
    for name, layer, module in (("ijepa", "layers.1", lambda model: model.layers[1]),
                                ("swin", "embeddings", lambda model: model.embeddings)):
        output = featdump.extract(saved / "images", saved / f"{name}-mean.h5", model=f"hf:{patch_models / name}",
                                  layers=layer, reduce="patchmean", weights="DEFAULT", num_workers=0,
                                  overwrite=True)
        tokens = tokens_of(patch_models / name, output, module)
        np.testing.assert_allclose(rows(output, layer), tokens.mean(axis=1), rtol=1e-5, atol=1e-6)
        whole = featdump.extract(saved / "images", saved / f"{name}-whole.h5", model=f"hf:{patch_models / name}",
                                 layers=layer, weights="DEFAULT", num_workers=0, overwrite=True)
        with h5py.File(whole, "r") as h5file:
            grid = [4, 4] if name == "ijepa" else [8, 8]  # 32 / patch 8, 32 / patch 4
            assert h5file["features"][layer].attrs["prefix_tokens"] == 0
            assert list(h5file["features"][layer].attrs["patch_grid"]) == grid


def test_cls_and_patchmean_are_refused_where_the_tokens_are_not_known(saved, patch_models):
    def refusal(name, layer, reduce):
        result = CliRunner().invoke(main, ["extract", "-m", f"hf:{patch_models / name}", "-l", layer, "--reduce",
                                           reduce, "-j", "0", str(saved / "images"), str(saved / "refused.h5")])
        assert result.exit_code == 2 and not (saved / "refused.h5").exists()
        return result.output.strip().splitlines()[-1]

    assert refusal("ijepa", "layers.1", "cls") == (
        "Error: --reduce cls on layer 'layers.1': the model has no class token (its tokens are the patches alone); "
        "use avgpool or patchmean.")
    assert refusal("swin", "encoder.layers.0@0", "patchmean") == (  # after patch merging: 4x4 patches of 8 pixels
        "Error: --reduce patchmean on layer 'encoder.layers.0@0': featdump does not know which of its tokens are "
        "class and patch tokens (its 16 tokens are not the model's 0 prefix tokens and the 8x8 patches of a 32x32 "
        "input); use avgpool (all tokens), flatten or none.")
    assert "the model does not state its class/register tokens" in refusal("yolos", "encoder.layer.1", "patchmean")
    whole = featdump.extract(saved / "images", saved / "yolos.h5", model=f"hf:{patch_models / 'yolos'}",
                             layers="encoder.layer.1", weights="DEFAULT", num_workers=0, overwrite=True)
    with h5py.File(whole, "r") as h5file:  # 1 class token, 16 patches, 5 detection tokens: no layout recorded
        assert "prefix_tokens" not in h5file["features/encoder.layer.1"].attrs
        assert "patch_grid" not in h5file["features/encoder.layer.1"].attrs


def test_at_is_the_embedding_the_model_exists_for(saved):
    """hf CLIP: @ equals get_image_features; SigLIP and OWL-ViT likewise; a vision model's @pooler_output its pooled
    output."""
    torch.manual_seed(0)
    siglip = transformers.SiglipConfig(
        text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         vocab_size=100, max_position_embeddings=16),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           image_size=32, patch_size=8))
    transformers.SiglipModel(siglip).save_pretrained(saved / "siglip")
    transformers.SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(saved / "siglip")
    owl = transformers.OwlViTConfig(  # its vision tower inherits main_input_name input_ids: refused before
        text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         vocab_size=100, max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           image_size=32, patch_size=8), projection_dim=16)
    transformers.OwlViTModel(owl).save_pretrained(saved / "owlvit")
    transformers.OwlViTImageProcessor(size={"height": 32, "width": 32}, crop_size={"height": 32, "width": 32}) \
        .save_pretrained(saved / "owlvit")
    kosmos = transformers.Kosmos2Config(  # its image features run image_to_text_projection, beside the tower
        text_config=dict(embed_dim=32, layers=1, attention_heads=2, ffn_dim=64, vocab_size=100,
                         max_position_embeddings=32),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                           image_size=32, patch_size=8), latent_query_num=4)
    transformers.Kosmos2Model(kosmos).save_pretrained(saved / "kosmos2")
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}) \
        .save_pretrained(saved / "kosmos2")
    from featdump.sources.models import load_model

    image_side = load_model(f"hf:{saved / 'kosmos2'}", weights="none").module
    assert "image_to_text_projection" in dict(image_side.named_children())  # hooked, and moved with the tower
    listed = CliRunner().invoke(main, ["list-layers", f"hf:{saved / 'clip'}"])
    assert listed.output.splitlines()[1].split()[:2] == ["@", "ImageFeatures"]  # listed first
    for name in ("clip", "siglip", "owlvit", "kosmos2"):
        output = featdump.extract(saved / "images", saved / f"{name}-at.h5", model=f"hf:{saved / name}",
                                  layers=["@", "model.post_layernorm:1" if name == "kosmos2" else "post_layernorm"],
                                  num_workers=0, overwrite=True)
        model = transformers.AutoModel.from_pretrained(saved / name).eval()
        processor = transformers.AutoImageProcessor.from_pretrained(saved / name)
        pixels = processor(images=images_in(output), return_tensors="pt")["pixel_values"]
        with torch.inference_mode():
            features = model.get_image_features(pixel_values=pixels)
        embedding = (features if isinstance(features, torch.Tensor) else features.pooler_output).numpy()
        assert relative_error(rows(output, "@"), embedding) <= 1e-5
    vit = featdump.extract(saved / "images", saved / "vit-at.h5", model=f"hf:{saved / 'vit'}",
                           layers=["@pooler_output", "@last_hidden_state"], num_workers=0, overwrite=True)
    model = transformers.AutoModel.from_pretrained(saved / "vit").eval()
    processor = transformers.AutoImageProcessor.from_pretrained(saved / "vit")
    with torch.inference_mode():
        expected = model(processor(images=images_in(vit), return_tensors="pt")["pixel_values"])
    assert relative_error(rows(vit, "@pooler_output"), expected.pooler_output.numpy()) <= 1e-5
    assert relative_error(rows(vit, "@last_hidden_state"), expected.last_hidden_state.numpy()) <= 1e-5
    several = CliRunner().invoke(main, ["extract", "-m", f"hf:{saved / 'vit'}", "-l", "@", "-j", "0",
                                        str(saved / "images"), str(saved / "refused.h5")])
    assert several.exit_code == 2 and "select one: @last_hidden_state, @pooler_output" in several.output


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_open_clip_block_equals_a_manual_hook_and_at_equals_encode_image(tmp_path):
    open_clip = pytest.importorskip("open_clip", reason="open_clip is not installed (pip install "
                                                        "'featdump[open_clip]')")
    write_images(tmp_path / "images", {"": 2}, size=(80, 60))
    output = featdump.extract(tmp_path / "images", tmp_path / "oc.h5", model="open_clip:ViT-B-32", weights="none",
                              seed=1, layers=["transformer.resblocks.3", "@"], num_workers=0)
    torch.manual_seed(1)
    model, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None)
    visual, seen = model.eval().visual, {}
    visual.transformer.resblocks[3].register_forward_hook(lambda module, args, out: seen.update(out=out.clone()))
    with torch.inference_mode():
        embedding = model.encode_image(torch.stack([preprocess(image) for image in images_in(output)]))
    with h5py.File(output, "r") as h5file:
        assert h5file["features/transformer.resblocks.3"].attrs["prefix_tokens"] == 1
    assert relative_error(rows(output, "transformer.resblocks.3"), seen["out"].numpy()) <= 1e-4
    assert relative_error(rows(output, "@"), embedding.numpy()) <= 1e-5


PARTS = '''
import torch
from torch import nn
from transformers.modeling_outputs import BackboneOutput, BaseModelOutput, BaseModelOutputWithPooling


class DictOut(nn.Module):
    def forward(self, x):
        return {"mean": x.mean(dim=(2, 3)), "none": None, "max": x.amax(dim=(2, 3))}


class TupleWithNone(nn.Module):
    def forward(self, x):
        return None, x * 2, x.flatten(1)


class Encoder(nn.Module):
    def forward(self, x):
        return BaseModelOutputWithPooling(last_hidden_state=x.flatten(2).transpose(1, 2), pooler_output=x.sum((2, 3)))


class Backbone(nn.Module):  # a ModelOutput holding a tuple only: its maps are @feature_maps.0, @feature_maps.1
    def forward(self, x):
        return BackboneOutput(feature_maps=(x + 1, x * 3))


class Windows(nn.Module):  # a ModelOutput whose tensor lays each image's rows one after another (N x HW, C)
    def forward(self, x):
        return BaseModelOutput(last_hidden_state=x.flatten(2).transpose(1, 2).reshape(-1, x.shape[1]) - 1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=8)
        self.tup = TupleWithNone()
        self.dictmod = DictOut()
        self.encoder = Encoder()
        self.backbone = Backbone()
        self.windows = Windows()

    def forward(self, x):
        y = torch.relu_(self.conv(x))
        _, doubled, flat = self.tup(y)
        parts = self.dictmod(doubled)
        out = self.encoder(doubled)
        maps = self.backbone(y).feature_maps
        rows = self.windows(y).last_hidden_state
        return parts["mean"] + out.pooler_output + flat[:, :4] + maps[1].mean((2, 3)) + rows.sum() * 0


def build():
    return Net()
'''


def test_parts_of_tuple_dict_and_model_outputs_equal_a_manual_recomputation(tmp_path):
    with user_project(tmp_path, "partsnet", PARTS, {"": 3}) as folder:
        import partsnet

        output = tmp_path / "parts.h5"
        layers = ("tup,tup@2,dictmod@*,encoder@last_hidden_state,encoder@pooler_output,backbone@feature_maps.1,"
                  "windows@last_hidden_state")
        result = run_featdump("extract", "-m", "partsnet:build", "-l", layers, folder / "images", output,
                              cwd=folder)
        assert result.returncode == 0, result.stderr
        assert "Layer tup outputs a tuple: its first tensor (tup@1) is stored" in result.stderr
        torch.manual_seed(0)  # the factory's seed (--seed 0)
        net = partsnet.build().eval()
        x = torch.stack([ResNet18_Weights.DEFAULT.transforms()(image) for image in images_in(output)])
        with torch.inference_mode():
            y = torch.relu(net.conv(x))
        expected = {"tup": y * 2, "tup@2": y.flatten(1), "dictmod@mean": (y * 2).mean(dim=(2, 3)),
                    "dictmod@max": (y * 2).amax(dim=(2, 3)),
                    "encoder@last_hidden_state": (y * 2).flatten(2).transpose(1, 2),
                    "encoder@pooler_output": (y * 2).sum((2, 3)), "backbone@feature_maps.1": y * 3,
                    "windows@last_hidden_state": y.flatten(2).transpose(1, 2) - 1}  # (N, HW, C): unfolded
        with h5py.File(output, "r") as h5file:
            assert sorted(h5file.attrs["layers"]) == sorted(expected)
            assert h5file["features/tup"].attrs["part"] == "1"
            for name, values in expected.items():
                np.testing.assert_allclose(h5file["features"][name][:], values.numpy(), rtol=1e-5, atol=1e-6,
                                           err_msg=name)
        bare = run_featdump("extract", "-m", "partsnet:build", "-l", "dictmod", folder / "images", tmp_path / "b.h5",
                            cwd=folder)
        assert bare.returncode == 2
        assert bare.stderr.strip().endswith("Error: Layer 'dictmod' outputs a dict (or ModelOutput) of several "
                                            "tensors; select one: dictmod@mean, dictmod@max.")
        listing = run_featdump("list-layers", "partsnet:build", "--json", cwd=folder)
        by_path = {row["path"]: row for row in map(json.loads, listing.stdout.splitlines())}
        assert [part["name"] for part in by_path["dictmod"]["parts"][0]] == ["mean", "max"]  # no None part
        assert [part["name"] for part in by_path["tup"]["parts"][0]] == ["1", "2"]

        with featdump.capture(net, ["dictmod@max", "encoder@last_hidden_state", "tup@2"]) as features:
            net(x)
        np.testing.assert_allclose(features["dictmod@max"].numpy(), expected["dictmod@max"].numpy(), rtol=1e-6)
        np.testing.assert_allclose(features["tup@2"].numpy(), expected["tup@2"].numpy(), rtol=1e-6)
        with featdump.capture(net, ["dictmod"]), pytest.raises(UnknownLayer, match="dictmod@mean, dictmod@max"):
            net(x)


def test_swin_window_attention_s_tuple_is_stored_with_its_folded_batch(tmp_path):
    """Swin's window attention returns a tuple whose first tensor holds N x windows rows: each image's windows are
    its rows, as plain hooks on the processor's output give them (the bare path and @0 alike)."""
    torch.manual_seed(0)
    config = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2],
                                     window_size=4)
    transformers.SwinModel(config).save_pretrained(tmp_path / "swin")
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path / "swin")
    write_images(tmp_path / "images", {"": 3}, size=(40, 30))
    attention = "encoder.layers.0.blocks.0.attention"
    output = featdump.extract(tmp_path / "images", tmp_path / "swin.h5", model=f"hf:{tmp_path / 'swin'}",
                              layers=[attention, f"{attention}@0"], num_workers=0)
    model = transformers.AutoModel.from_pretrained(tmp_path / "swin").eval()
    pixels = transformers.AutoImageProcessor.from_pretrained(tmp_path / "swin")(
        images=images_in(output), return_tensors="pt")["pixel_values"]
    taken = []
    model.get_submodule(attention).register_forward_hook(lambda module, args, out: taken.append(out[0].clone()))
    with torch.inference_mode():
        model(pixels)
    windows = taken[0].unflatten(0, (3, -1)).numpy()  # (3 x 4 windows, 16, 16) -> (3, 4, 16, 16)
    for layer in (attention, f"{attention}@0"):
        assert relative_error(rows(output, layer), windows) <= 1e-5
    listing = CliRunner().invoke(main, ["list-layers", f"hf:{tmp_path / 'swin'}", "--json"])
    by_path = {row["path"]: row for row in map(json.loads, listing.output.splitlines())}
    assert by_path[attention]["parts"][0][0]["folded_rows"] == 4


def test_clear_refusals_for_hf_and_open_clip(tmp_path):
    write_images(tmp_path / "images", {"": 1})
    bert = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    transformers.BertModel(bert).save_pretrained(tmp_path / "bert")
    transformers.ViTImageProcessor().save_pretrained(tmp_path / "bert")
    text_only = CliRunner().invoke(main, ["list-layers", f"hf:{tmp_path / 'bert'}"])
    assert text_only.exit_code == 2 and text_only.stderr.strip() == (
        f"Error: hf:{tmp_path / 'bert'} has no vision part: its BertModel takes input_ids, not images. Name an image "
        "model, or a multimodal one with a vision tower (CLIP, SigLIP, ...).")
    siglip2 = transformers.Siglip2Config(  # its processor makes (patches, values) per image, not (3, H, W)
        text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         vocab_size=100, max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                           patch_size=8, num_patches=16))
    transformers.Siglip2Model(siglip2).save_pretrained(tmp_path / "siglip2")
    transformers.Siglip2ImageProcessor(max_num_patches=16, patch_size=8).save_pretrained(tmp_path / "siglip2")
    patches = CliRunner().invoke(main, ["list-layers", f"hf:{tmp_path / 'siglip2'}"])
    assert patches.exit_code != 0 and "The model fails on a batch of 2 inputs of shape (16, 192)" in patches.stderr
    missing = run_featdump("list-layers", f"hf:{tmp_path / 'nothing-here'}", env=featdump_env(HF_HUB_OFFLINE="1"))
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert "Could not load hf:" in missing.stderr and "save_pretrained" in missing.stderr
    unknown = CliRunner().invoke(main, ["list-layers", "open_clip:ViT-B-33"])
    assert unknown.exit_code == 2 and "Did you mean: open_clip:ViT-B-32" in unknown.stderr
