"""Every task of torchvision's named models: semantic segmentation, object detection and quantized classifiers, each
against a recomputation by hand (the weights none model rebuilt from the seed, the rule for its preprocessing, the
model with hooks); list-layers for each; weights none with the network unreachable; a detector's detections
refused; a detector's rows independent of the other images of their batch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models import get_model, get_model_weights
from torchvision.transforms import functional as F

from .helpers import featdump_env, read_output, run_featdump, write_images


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Three images of three shapes (landscape, portrait, square)."""
    root = tmp_path_factory.mktemp("photos")
    for index, size in enumerate(((96, 64), (50, 90), (70, 70))):
        write_images(root / f"{index}", {"": 1}, seed=index, size=size)
    return root


def hooked(model, paths: list[str], *inputs) -> dict[str, object]:
    """The outputs of the modules at PATHS ("" for the model's own) in one forward of INPUTS."""
    taken, handles = {}, []
    for path in paths:
        handles.append(model.get_submodule(path).register_forward_hook(
            lambda module, args, output, path=path: taken.setdefault(path, output)))
    with torch.inference_mode():
        taken.setdefault("", model(*inputs))
    for handle in handles:
        handle.remove()
    return taken


def images_in_row_order(root, content) -> list[Image.Image]:
    return [Image.open(root / path).convert("RGB") for path in content["paths"]]


@pytest.mark.slow  # a segmentation network's forward; each task's listing stays quick
def test_a_segmentation_model_s_rows_are_its_square_crops_through_the_model(photos, tmp_path):
    output = tmp_path / "seg.h5"
    result = run_featdump("extract", "-m", "lraspp_mobilenet_v3_large", "-w", "none", "-l", "@out,backbone@high",
                          photos, output)
    assert result.returncode == 0, result.stderr
    assert "centre-cropped to 520x520" in result.stderr
    content = read_output(output)
    torch.manual_seed(0)
    model = get_model("lraspp_mobilenet_v3_large", weights=None, weights_backbone=None).eval()
    weights = get_model_weights("lraspp_mobilenet_v3_large").DEFAULT.transforms()
    for row, image in enumerate(images_in_row_order(photos, content)):
        square = F.center_crop(F.resize(image, [520], antialias=True), [520, 520])
        pixels = F.normalize(F.convert_image_dtype(F.pil_to_tensor(square), torch.float), weights.mean, weights.std)
        taken = hooked(model, ["backbone"], pixels[None])
        assert content["@out"][row].shape == (21, 520, 520)
        np.testing.assert_allclose(content["@out"][row], taken[""]["out"][0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(content["backbone@high"][row], taken["backbone"]["high"][0], rtol=1e-4, atol=1e-5)


def detector_rows_by_hand(image: Image.Image, model) -> dict[str, np.ndarray]:
    """The backbone's maps of IMAGE: PIL-resized to the 320 square, to [0, 1], the model's own transform (which
    normalises), the backbone."""
    square = F.pil_to_tensor(image.resize((320, 320), Image.BILINEAR)).float() / 255
    taken = {}
    with torch.inference_mode():
        batch, _ = model.transform([square])
        assert batch.tensors.shape[-2:] == (320, 320)  # neither resized nor padded
        body = model.backbone.body(batch.tensors)
        fpn = model.backbone.fpn(body)
    taken["backbone.body@1"] = body["1"][0].numpy()
    taken["backbone@0"], taken["backbone@pool"] = fpn["0"][0].numpy(), fpn["pool"][0].numpy()
    return taken


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_detector_s_rows_are_its_backbone_maps_and_do_not_depend_on_the_batch(photos, tmp_path):
    name = "fasterrcnn_mobilenet_v3_large_320_fpn"
    layers = "backbone.body@1,backbone@0,backbone@pool"
    output = tmp_path / "det.h5"
    result = run_featdump("extract", "-m", name, "-w", "none", "-l", layers, photos, output)
    assert result.returncode == 0, result.stderr
    assert "No pruned graph: the model does not trace" in result.stderr  # said; the hooks stop the forward
    content = read_output(output)
    torch.manual_seed(0)
    model = get_model(name, weights=None, weights_backbone=None).eval()
    for row, image in enumerate(images_in_row_order(photos, content)):
        expected = detector_rows_by_hand(image, model)
        for layer, values in expected.items():
            np.testing.assert_allclose(content[layer][row], values, rtol=1e-4, atol=1e-5)
    alone = tmp_path / "alone.h5"  # the square image alone: the same rows as in the batch of three shapes
    assert run_featdump("extract", "-m", name, "-w", "none", "-l", layers, photos / "2", alone).returncode == 0
    single = read_output(alone)
    row = content["paths"].index("2/" + single["paths"][0])
    for layer in layers.split(","):
        np.testing.assert_allclose(single[layer][0], content[layer][row], rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_detector_s_detections_and_heads_are_refused_in_one_line(photos, tmp_path):
    for layer in ("@", "roi_heads.box_head", "rpn"):
        result = run_featdump("extract", "-m", "fasterrcnn_mobilenet_v3_large_320_fpn", "-w", "none", "-l", layer,
                              photos, tmp_path / "out.h5")
        assert result.returncode != 0 and "Traceback" not in result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "not rows of an image; use backbone@0, backbone@1, backbone@pool" in errors[0]


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_quantized_model_s_rows_are_its_dequantized_outputs_on_the_cpu(photos, tmp_path):
    output = tmp_path / "quantized.h5"
    result = run_featdump("extract", "-m", "quantized_resnet18", "-w", "none", "-l", "layer3,fc", photos, output)
    assert result.returncode == 0, result.stderr
    content = read_output(output)
    torch.manual_seed(0)
    model = get_model("quantized_resnet18", weights=None, quantize=True).eval()
    transform = get_model_weights("quantized_resnet18").DEFAULT.transforms()
    batch = torch.stack([transform(image) for image in images_in_row_order(photos, content)])
    taken = hooked(model, ["layer3", "fc"], batch)
    assert taken["layer3"].is_quantized  # what the hooks see; the rows are the values
    assert content["layer3"].dtype == np.float32
    np.testing.assert_allclose(content["layer3"], taken["layer3"].dequantize().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(content["fc"], taken["fc"].dequantize().numpy(), rtol=1e-5, atol=1e-5)
    refused = run_featdump("extract", "-m", "quantized_resnet18", "-w", "none", "-l", "fc", "--precision", "bf16",
                           photos, tmp_path / "bf16.h5")
    assert refused.returncode == 2
    assert "a quantized model runs on the CPU only (FBGEMM kernels), so --precision bf16 cannot apply" in \
        refused.stderr
    on_cuda = run_featdump("extract", "-m", "quantized_resnet18", "-w", "none", "-l", "fc", "--device", "cuda",
                           "--compile", photos, tmp_path / "cuda.h5")
    assert on_cuda.returncode == 2 and "so --device cuda, --compile cannot apply; drop them, or name the float " \
        "model (resnet18)." in on_cuda.stderr


@pytest.mark.parametrize("name, path, expected", [
    ("lraspp_mobilenet_v3_large", "classifier", {"shapes": [[21, 65, 65]], "per_image": True}),
    ("fasterrcnn_mobilenet_v3_large_320_fpn", "roi_heads", {"per_image": False}),
    ("quantized_resnet18", "layer4", {"shapes": [[512, 7, 7]], "per_image": True}),
    pytest.param("raft_small", "context_encoder", {"shapes": [[160, 30, 40]], "per_image": True},
                 marks=pytest.mark.slow),  # RAFT's dry forwards: the quick suite's heaviest listing
    ("r3d_18", "layer2", {"shapes": [[128, 8, 28, 28]], "per_image": True}),
])
@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_list_layers_for_a_model_of_each_task(name, path, expected):
    result = run_featdump("list-layers", name, "--depth", "1", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["path"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert {key: rows[path][key] for key in expected} == expected


@pytest.mark.slow  # three models built and run in fresh environments
def test_weights_none_builds_every_task_with_the_network_unreachable(photos, tmp_path):
    """An unreachable proxy and an empty TORCH_HOME: a backbone's weights would fail to download; none is asked."""
    env = featdump_env(TORCH_HOME=str(tmp_path / "torch"), https_proxy="http://127.0.0.1:9",
                       HTTPS_PROXY="http://127.0.0.1:9")
    for name, layer in (("deeplabv3_mobilenet_v3_large", "backbone@out"), ("ssdlite320_mobilenet_v3_large",
                                                                          "backbone@0"),
                        ("quantized_mobilenet_v2", "features.1")):
        result = run_featdump("extract", "-m", name, "-w", "none", "-l", layer, photos / "2", tmp_path / f"{name}.h5",
                              env=env)
        assert result.returncode == 0, (name, result.stderr)
