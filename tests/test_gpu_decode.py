"""The --decode gpu data path: routing in the workers and nvjpeg fallback, run on the CPU here and on CUDA
when a GPU is present."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models import get_model_weights

from featdump.inputs import find_images
from featdump.inputs.gpu_decode import to_device_inputs
from featdump.inputs.loader import ImageDataset, collate
from featdump.inputs.preprocess import Preprocess
from featdump.job.proof import row_errors

from .helpers import run_featdump, write_images


def needs_cuda(test):
    """A CUDA test: run by `pytest -m cuda` on a GPU node, skipped elsewhere."""
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run "
                                               "`pytest -m cuda` on a GPU node)")(test))


def make_folder(root):
    write_images(root, {"a": 5})  # img_002.png is a PNG, the rest JPEGs
    exif = Image.Exif()
    exif[0x0112] = 3
    Image.new("RGB", (50, 40), (200, 10, 10)).save(root / "a" / "rotated.jpg", exif=exif)
    (root / "a" / "fake.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return find_images(root)


def test_workers_leave_plain_jpegs_encoded_and_decode_the_rest(tmp_path):
    images = make_folder(tmp_path)
    preprocess = Preprocess(get_model_weights("resnet18").DEFAULT.transforms())
    dataset = ImageDataset(images, preprocess, gpu_jpegs=True)
    kinds = {images.paths[i]: dataset[i].kind for i in range(len(images))}
    assert kinds == {"a/fake.jpg": "failed", "a/img_000.jpg": "jpeg", "a/img_001.jpg": "jpeg",
                     "a/img_002.png": "pixels", "a/img_003.jpg": "jpeg", "a/img_004.jpg": "jpeg",
                     "a/rotated.jpg": "pixels"}


def test_decoded_batch_matches_the_cpu_path_in_source_order(tmp_path):
    images = make_folder(tmp_path)
    preprocess = Preprocess(get_model_weights("resnet18").DEFAULT.transforms())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    everything = list(range(len(images)))
    gpu_batch = collate([ImageDataset(images, preprocess, gpu_jpegs=True)[i] for i in everything])
    cpu_batch = collate([ImageDataset(images, preprocess)[i] for i in everything])
    gpu_inputs = to_device_inputs(gpu_batch, preprocess, images, device).cpu()
    cpu_inputs = to_device_inputs(cpu_batch, preprocess, images, torch.device("cpu"))
    assert gpu_batch.positions == cpu_batch.positions and not gpu_batch.encoded
    assert [images.paths[p] for p, _ in gpu_batch.failures] == ["a/fake.jpg"]
    # Tensor resize vs PIL resize differ by rounding only; nvJPEG's chroma upsampling differs from libjpeg's (about
    # one level of 255): bounded per image, as torchvision's own nvJPEG tests do.
    assert (gpu_inputs - cpu_inputs).abs().flatten(1).mean(dim=1).max() < 0.02


@needs_cuda
def test_cuda_extract_with_gpu_decode_bf16_is_close_to_cpu(tmp_path):
    images = tmp_path / "images"
    write_images(images, {"a": 6, "b": 5}, size=(300, 260))
    outputs = {}
    for name, args in {"cpu": ["--device", "cpu"],
                       "cuda": ["--device", "cuda", "--decode", "gpu", "--precision", "bf16"]}.items():
        outputs[name] = tmp_path / f"{name}.h5"
        result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", *args, images, outputs[name])
        assert result.returncode == 0, result.stderr
    with h5py.File(outputs["cpu"]) as cpu, h5py.File(outputs["cuda"]) as cuda:
        assert list(cpu["paths"].asstr()[:]) == list(cuda["paths"].asstr()[:])
        reference, candidate = cpu["features/avgpool"][:], cuda["features/avgpool"][:]
        (proof,) = json.loads(cuda.attrs["proof"])
    allowed = proof["layers"]["avgpool"]["bound"]  # 3x CPU bf16's own error + its floor + CUDA's and nvJPEG's bounds
    assert allowed > 1e-3 + 5e-2 and proof["emulated"] == ["bf16"]
    errors = row_errors(candidate.astype(np.float64), reference.astype(np.float64))  # each image on its own
    assert max(errors) <= allowed, errors
    assert proof["proved"] and proof["configuration"].startswith("cuda:0 (") and proof["tolerance"] == allowed
    assert proof["layers"]["avgpool"]["largest"] <= allowed


@needs_cuda
def test_cuda_fp32_matches_cpu_features(tmp_path):
    images = tmp_path / "images"
    write_images(images, {"a": 4})
    outputs = {}
    for device in ("cpu", "cuda"):
        outputs[device] = tmp_path / f"{device}.h5"
        result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer2.0.bn1,fc", "--device", device,
                              "--decode", "cpu", images, outputs[device])
        assert result.returncode == 0, result.stderr
    with h5py.File(outputs["cpu"]) as cpu, h5py.File(outputs["cuda"]) as cuda:
        for name in ("layer2.0.bn1", "fc"):  # fp32 with TF32 off: kernel order alone, per row
            got, expected = (file["features"][name][:] for file in (cuda, cpu))
            errors = row_errors(got.reshape(len(got), -1).astype(np.float64),
                                expected.reshape(len(expected), -1).astype(np.float64))
            assert max(errors) <= 1e-4, (name, errors)


def test_auto_decodes_on_the_cpu_until_the_gpu_path_is_measured():
    from featdump.errors import UsageProblem
    from featdump.forward.device import resolve_decode

    preprocess = Preprocess(get_model_weights("resnet18").DEFAULT.transforms())
    assert resolve_decode("auto", torch.device("cuda"), preprocess) == "cpu"
    assert resolve_decode("gpu", torch.device("cuda"), preprocess) == "gpu"
    with pytest.raises(UsageProblem, match="--decode gpu needs a CUDA device"):
        resolve_decode("gpu", torch.device("cpu"), preprocess)


def test_normalize_keeps_its_constants_on_the_device_and_equals_torchvision():
    from torchvision.transforms import functional as F

    transforms = get_model_weights("resnet18").DEFAULT.transforms()
    preprocess = Preprocess(transforms)
    batch = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8)
    expected = F.normalize(F.convert_image_dtype(batch, torch.float), mean=transforms.mean, std=transforms.std)
    assert torch.equal(preprocess.normalize(batch), expected)  # bit for bit
    first = preprocess._constants(batch.device)
    assert preprocess._constants(batch.device)[0] is first[0]  # made once per device, not per batch


def test_device_errors_stop_the_run_and_decode_errors_do_not():
    from featdump.errors import DeviceFailure
    from featdump.inputs.gpu_decode import raise_if_device_failure

    raise_if_device_failure(RuntimeError("nvjpegDecodeJpeg failed: not a JPEG"))  # the image's fault: passes
    for error in (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                  RuntimeError("CUDA error: an illegal memory access was encountered")):
        with pytest.raises(DeviceFailure, match="The GPU failed while decoding images"):
            raise_if_device_failure(error)


def test_pooled_half_precision_outputs_accumulate_in_float32_and_snapshots_are_contiguous():
    from featdump.reductions.methods import bind, snapshot

    output = (torch.rand(2, 8, 64, 64) * 4 + 100).to(torch.bfloat16)  # large sums lose digits in bf16
    pooled = snapshot(0, 1, bind("avgpool", "x", (8, 64, 64)))(output)
    assert torch.equal(pooled, output.float().mean(dim=(2, 3)))
    assert not torch.equal(pooled, output.mean(dim=(2, 3)).float())  # what a bf16 mean gives
    channels_last = torch.rand(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    assert snapshot(0, 1, bind("none", "x", (8, 4, 4)))(channels_last).is_contiguous()


@needs_cuda
def test_cuda_gpu_decode_rows_do_not_depend_on_the_batch_size(tmp_path):
    """Many batches through nvJPEG: memory the previous forward still used must never be decoded into."""
    images = tmp_path / "images"
    write_images(images, {f"c{folder:02d}": 50 for folder in range(16)}, size=(300, 260))  # 800, each under 700 px
    # (the helper grows each folder's images by 8 px a step: 400 in one folder reached 3,500 px and took minutes)
    rows = {}
    for batch_size in (2, 64):
        output = tmp_path / f"b{batch_size}.h5"
        result = run_featdump("extract", "-m", "resnet50", "-w", "none", "-l", "avgpool", "--device", "cuda",
                              "--decode", "gpu", "-b", str(batch_size), images, output)
        assert result.returncode == 0, result.stderr
        with h5py.File(output) as h5file:
            rows[batch_size] = h5file["features/avgpool"][:]
    np.testing.assert_allclose(rows[2], rows[64], rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_one_bad_jpeg_does_not_serialise_the_batch(tmp_path):
    from torchvision.io import ImageReadMode, decode_jpeg

    from featdump.inputs.gpu_decode import _decode_halving

    write_images(tmp_path, {"a": 16}, size=(64, 48))
    paths = sorted((tmp_path / "a").glob("*.jpg"))
    data = [torch.from_numpy(np.fromfile(path, dtype=np.uint8)) for path in paths]
    data[5] = data[5][: len(data[5]) // 3]  # truncated: its header still reads, its data does not decode
    calls = []

    def decode(part):
        calls.append(len(part))
        return decode_jpeg(part, mode=ImageReadMode.RGB, device="cpu")

    decoded = _decode_halving(data, decode)
    assert decoded[5] is None and all(image is not None for i, image in enumerate(decoded) if i != 5)
    assert torch.equal(decoded[0], decode_jpeg(data[0], mode=ImageReadMode.RGB))
    assert len(calls) <= 1 + 2 * 4  # halving: log2(16) levels of two calls, not one call per image
    # Through the batch path: the truncated JPEG falls back to PIL, fails there too, and is recorded.
    (tmp_path / "a" / paths[5].name).write_bytes(paths[5].read_bytes()[: paths[5].stat().st_size // 3])
    images = find_images(tmp_path)
    preprocess = Preprocess(get_model_weights("resnet18").DEFAULT.transforms())
    batch = collate([ImageDataset(images, preprocess, gpu_jpegs=True)[i] for i in range(len(images))])
    assert batch.jpeg_bytes is not None and len(batch.jpeg_index) == 11  # one tensor for all the JPEGs
    inputs = to_device_inputs(batch, preprocess, images, torch.device("cpu"))
    assert [images.paths[p] for p, _ in batch.failures] == [f"a/{paths[5].name}"]
    assert inputs.shape[0] == 15 and batch.jpeg_index == []


def test_short_batches_are_padded_to_one_shape_and_rows_cut_back():
    from torchvision.models import resnet18

    from featdump.forward.device import padded

    torch.manual_seed(0)
    model = resnet18().eval()
    x = torch.randn(3, 3, 64, 64)
    full = padded(x, 8)
    assert full.shape == (8, 3, 64, 64) and torch.equal(full[:3], x) and not full[3:].any()
    with torch.inference_mode():
        np.testing.assert_allclose(model(full)[:3], model(x), rtol=1e-5, atol=1e-5)  # eval: images independent
    assert padded(x, 2) is x
