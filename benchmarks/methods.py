"""One benchmark method per process (so its peak RSS is its own); prints one JSON line.

    python -m benchmarks.methods METHOD --model resnet18 --layer avgpool --images DIR --out FILE [...]

Methods, all fed by featdump's own DataLoader and preprocessing so that only what happens after
decoding differs (with --loader pil, bare and recipe read images as a torchvision ImageFolder-style
loader does: PIL open, EXIF transpose, convert, the weights' transforms):
  bare      the ResNet's own modules called by hand up to the layer (eager, in-place ops as the model
            has them, nothing after the layer, nor a block's main branch for its downsample): no hooks,
            no copies, no writes
  featdump  featdump.extract(): hooks, copies, early stop, HDF5 writes on a background thread
  recipe    the seeds' recipe: forward hook into a dict, whole model, list of batches, torch.cat, np.save
  fx_ram    create_feature_extractor, outputs kept in a list, torch.cat, np.save
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torchvision.models import get_model
from torchvision.models.feature_extraction import create_feature_extractor

from featdump.forward.device import resolve_device
from featdump.inputs import find_images
from featdump.inputs.gpu_decode import to_device_inputs
from featdump.inputs.loader import ImageDataset, make_loader
from featdump.inputs.preprocess import Preprocess
from featdump.job.runner import extract
from featdump.job.settings import Settings
from featdump.sources.models import default_preprocessing


class PilImages(torch.utils.data.Dataset):
    """The plain loader people write: each image decoded whole by PIL, then the weights' transforms."""

    def __init__(self, folder: Path, transforms):
        self.paths = sorted(path for path in folder.rglob("*") if path.suffix.lower() in (".jpg", ".png"))
        self.transforms = transforms

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        with Image.open(self.paths[index]) as image:
            return self.transforms(ImageOps.exif_transpose(image).convert("RGB"))


def batches(args, device):
    """Normalised input batches on DEVICE, exactly as featdump makes them (or as the plain PIL loader does)."""
    if args.loader == "pil":
        dataset = PilImages(Path(args.images), default_preprocessing(args.model))
        for inputs in torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers):
            yield inputs.to(device)
        return
    images = find_images(Path(args.images))
    preprocess = Preprocess(default_preprocessing(args.model))
    gpu_jpegs = args.decode == "gpu"
    loader = make_loader(ImageDataset(images, preprocess, gpu_jpegs=gpu_jpegs), 0, args.batch_size,
                         args.workers, pin_memory=device.type == "cuda")
    for batch in loader:
        inputs = to_device_inputs(batch, preprocess, images, device)
        if inputs is not None:
            yield inputs.contiguous(memory_format=torch.channels_last) if device.type == "cuda" else inputs


def seeded_model(args, device):
    torch.manual_seed(0)
    model = get_model(args.model, weights=None).eval().to(device)
    return model.to(memory_format=torch.channels_last) if device.type == "cuda" else model


def autocast(args, device):
    if args.precision == "fp32":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch.bfloat16 if args.precision == "bf16" else torch.float16)


def truncated_resnet(model, layer: str):
    """A function computing only LAYER's output of a torchvision ResNet (stage, its first downsample, avgpool)."""
    stages = ["layer1", "layer2", "layer3", "layer4"]
    if layer not in [*stages, "avgpool"] and not any(layer == f"{stage}.0.downsample.1" for stage in stages):
        raise SystemExit(f"bare: no hand truncation for {layer!r}")

    def forward(x):
        x = model.maxpool(model.relu(model.bn1(model.conv1(x))))
        for stage in stages:
            if layer == f"{stage}.0.downsample.1":
                return getattr(model, stage)[0].downsample(x)
            x = getattr(model, stage)(x)
            if layer == stage:
                return x
        return model.avgpool(x)

    return forward


def run_bare(args, device):
    forward = truncated_resnet(seeded_model(args, device), args.layer)
    started = time.perf_counter()
    with torch.inference_mode(), autocast(args, device):
        for inputs in batches(args, device):
            forward(inputs)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


class LoopTimer:
    """A featdump Progress that times the batch loop (set-up excluded, like the other methods), and the
    steady rate after the first batch (which also waits for the DataLoader workers to start)."""

    def start(self, total, done, noun="image"):
        self.started = time.perf_counter()
        self.images = 0
        self.first_batch = None  # (time, images) when the first batch was done

    def advance(self, images):
        self.images += images
        if self.first_batch is None:
            self.first_batch = (time.perf_counter(), self.images)

    def close(self):
        self.stopped = getattr(self, "stopped", None) or time.perf_counter()

    def steady_rate(self) -> float | None:
        if self.first_batch is None or self.images == self.first_batch[1]:
            return None
        at, images = self.first_batch
        return (self.images - images) / (self.stopped - at)


def run_featdump(args, device):
    timer = LoopTimer()
    settings = Settings(model=args.model, layers=(args.layer,), images=Path(args.images), output=Path(args.out),
                        weights="none", batch_size=args.batch_size, num_workers=args.workers, device=str(device),
                        overwrite=True, dtype=args.dtype, precision=args.precision, decode=args.decode,
                        fast_decode=args.fast_decode, compile=args.compile, reduce=tuple(args.reduce),
                        compile_cache=str(Path(args.out).parent / "compile-cache"))
    summary = extract(settings, timer)
    return timer.stopped - timer.started, {"total_seconds": summary.seconds, "steady_img_s": timer.steady_rate()}


def run_recipe(args, device):
    model = seeded_model(args, device)
    activation = {}

    def get_activation(name):
        def hook(module, inputs, output):
            activation[name] = output.detach()

        return hook

    model.get_submodule(args.layer).register_forward_hook(get_activation(args.layer))
    started = time.perf_counter()
    features = []
    with torch.no_grad(), autocast(args, device):
        for inputs in batches(args, device):
            model(inputs)
            features.append(activation[args.layer].cpu())
    np.save(args.out, torch.cat(features).numpy())
    return time.perf_counter() - started


def run_fx_ram(args, device):
    extractor = create_feature_extractor(seeded_model(args, device), return_nodes={args.layer: "out"})
    started = time.perf_counter()
    features = []
    with torch.inference_mode(), autocast(args, device):
        for inputs in batches(args, device):
            features.append(extractor(inputs)["out"].cpu())
    np.save(args.out, torch.cat(features).numpy())
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("method", choices=["bare", "featdump", "recipe", "fx_ram"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--layer", required=True)
    parser.add_argument("--images", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--decode", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--fast-decode", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--reduce", action="append", default=[])
    parser.add_argument("--loader", choices=["featdump", "pil"], default="featdump")
    args = parser.parse_args()
    device = resolve_device(args.device)
    extra = {"total_seconds": None, "steady_img_s": None}
    if args.method == "featdump":
        seconds, extra = run_featdump(args, device)
    else:
        seconds = {"bare": run_bare, "recipe": run_recipe, "fx_ram": run_fx_ram}[args.method](args, device)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"method": args.method, "seconds": seconds, **extra, "peak_rss_mib": peak_mib}))


if __name__ == "__main__":
    main()
