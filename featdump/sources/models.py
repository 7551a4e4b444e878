"""Models: build the nn.Module --model names, from any source, with its weights and preprocessing.

    resnet50                   torchvision classification model   (sources/torchvision_models.py)
    timm:convnext_tiny         timm model                         (sources/timm_models.py)
    hf:facebook/dinov2-small   transformers model (vision tower)  (sources/hf.py)
    open_clip:ViT-B-32         open_clip image tower              (sources/open_clip_models.py)
    mypkg.nets:build           your factory returning an nn.Module (sources/factory.py)
    model.pt                   a whole saved model, --trust-pickle (sources/files.py)
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from featdump.errors import InvalidWeights, first_sentence
from featdump.sources import (
    factory,
    files,
    flow_models,
    hf,
    open_clip_models,
    quantized_models,
    timm_models,
    torchvision_models,
    video_models,
)
from featdump.sources.tokens import TokenRule

log = logging.getLogger("featdump")
DEFAULT_TRANSFORM = "ResNet18_Weights.DEFAULT.transforms()"


@dataclass(frozen=True)
class ModelClip:
    """What a model takes of a video: clips of FRAMES frames sampled at FPS a second (None: each video's own rate),
    each one input (TAKES_CLIPS: a video model, whose preprocessing takes a clip's (T, C, H, W) uint8 frames); an
    image model takes one frame a row, with its image preprocessing."""

    frames: int = 1
    fps: float | None = None
    takes_clips: bool = False


@dataclass
class LoadedModel:
    """A model in eval mode, its preprocessing, what weights were loaded, and where it all came from."""

    module: nn.Module
    preprocessing: nn.Module  # a callable from a PIL image to a (C, H, W) tensor
    weights: str  # what was loaded: a weights enum, "none", a checkpoint path, ...
    source: dict = field(default_factory=dict)  # recorded and part of the resume fingerprint
    tokens: TokenRule | None = None  # prefix tokens and patch size of its (N, L, D) outputs, where it states them
    clip: ModelClip = ModelClip()  # what it takes of a video
    rows_within: tuple[str, ...] = ()  # the modules whose outputs are rows of an image (a detector's backbone); ()
    stated_axes: dict = field(default_factory=dict)  # module path: its 3-d maps' axes as the model states them


def model_kind(name: str) -> str:
    """torchvision, timm, hf, open_clip, factory or file, from the form of --model."""
    for prefix in ("timm", "hf", "open_clip"):
        if name.startswith(prefix + ":"):
            return prefix
    if files.looks_like_model_file(name):
        return "file"
    if ":" in name:
        return "factory"
    return "torchvision"


def check_model_name(name: str) -> None:
    """Fail fast (before any image is read) on a --model that names nothing loadable."""
    kind = model_kind(name)
    if kind == "torchvision":
        torchvision_models.check_name(name)
    elif kind == "timm":
        timm_models.check_name(name.removeprefix("timm:"))
    elif kind == "hf":
        hf.check_name(name.removeprefix("hf:"))
    elif kind == "open_clip":
        open_clip_models.check_name(name.removeprefix("open_clip:"))
    elif kind == "factory":
        factory.import_object(name, "--model")


def clip_of(name: str) -> ModelClip:
    """What --model NAME takes of a video, known before it is built: a torchvision video model's clip as its
    weights state it, a Hugging Face video model's frames (its config's), a factory's as it declares it
    (`featdump_clip`); an image model's one frame a row."""
    kind = model_kind(name)
    task = torchvision_models.task_of(name) if kind == "torchvision" else None
    if task == "video":
        return ModelClip(*video_models.clip_defaults(name), takes_clips=True)
    if task == "optical_flow":
        return ModelClip(flow_models.PAIR, None, takes_clips=True)
    if kind == "hf" and (frames := hf.clip_frames(name.removeprefix("hf:"))):
        return ModelClip(frames, None, takes_clips=True)
    if kind == "factory" and (declared := factory.declared_clip(name)):
        return ModelClip(*declared, takes_clips=True)
    return ModelClip()


def cpu_only(name: str) -> str | None:
    """Why --model NAME runs on the CPU only (a quantized model's FBGEMM kernels), or None."""
    if model_kind(name) == "torchvision" and torchvision_models.task_of(name) == "quantization":
        return quantized_models.CPU_ONLY
    return None


def default_preprocessing(name: str) -> nn.Module:
    """The transforms of a torchvision model's DEFAULT weights, as its task takes them."""
    return torchvision_models.preprocessing(name)


def load_model(model: str, weights: str = "DEFAULT", seed: int = 0, transform: str | None = None,
               trust_pickle: bool = False) -> LoadedModel:
    """Build --model MODEL with WEIGHTS (DEFAULT, an enum name, 'none' or a checkpoint path), in eval mode.

    With weights 'none' the network is built right after `torch.manual_seed(seed)`, so the same random
    network can be rebuilt anywhere. TRANSFORM ('package.module:callable') replaces the preprocessing.
    """
    name = model
    kind = model_kind(name)
    checkpoint = Path(weights) if _looks_like_path(weights) else None
    build_weights = "none" if checkpoint else weights
    preprocessing, tokens = None, None
    if kind == "torchvision":
        torchvision_models.check_name(name)
        module, label = torchvision_models.build(name, build_weights, seed)
        preprocessing = torchvision_models.preprocessing(name, module)
        task = torchvision_models.task_of(name)  # recorded beside the source, a classifier's as before
        source = {"source": "torchvision", **({"task": task} if task != "classification" else {})}
        tokens = torchvision_models.token_rule(module)
    elif kind == "timm":
        module, preprocessing, label, source = timm_models.build(name.removeprefix("timm:"), build_weights, seed)
        tokens = timm_models.token_rule(module)
    elif kind == "hf":
        module, preprocessing, label, source, tokens = hf.build(name.removeprefix("hf:"), build_weights, seed)
    elif kind == "open_clip":
        module, preprocessing, label, source, tokens = open_clip_models.build(
            name.removeprefix("open_clip:"), build_weights, seed)
    elif kind == "factory":
        module, source = factory.build(name, seed)
        label = "none" if weights.lower() == "none" else "as the factory builds it"
        preprocessing = factory.default_clip_transform(name) if not transform else None
    else:
        module = files.build(name, trust_pickle)
        label, source = "the saved model", {"source": "file", "sha256": file_digest(Path(name))}
    if checkpoint is not None:
        load_checkpoint(module, checkpoint)
        label, source = str(checkpoint.resolve()), {**source, "checkpoint_sha256": file_digest(checkpoint)}
    if transform:
        preprocessing, source = factory.transform(transform), {**source, "transform": transform}
    elif preprocessing is None:
        log.info("No --transform for %s: using the ImageNet default %s (resize 256, crop 224, ImageNet mean/std).",
                 name, DEFAULT_TRANSFORM)
        preprocessing = default_preprocessing("resnet18")
        source = {**source, "transform": DEFAULT_TRANSFORM}
    if tokens is None and kind in ("factory", "file"):  # your own model may state them as timm's do
        tokens = timm_models.token_rule(module)
    within = torchvision_models.rows_within(name) if kind == "torchvision" else ()
    axes = timm_models.stated_axes(module) if kind == "timm" else {}
    return LoadedModel(module.eval(), preprocessing, label, source, tokens, clip_of(name), within, axes)


def _looks_like_path(weights: str) -> bool:
    suffixes = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")
    return "/" in weights or weights.endswith(suffixes) or Path(weights).exists()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def load_checkpoint(module: nn.Module, path: Path) -> None:
    """Load a state dict saved as-is or under a 'state_dict' or 'model' key (a 'module.' prefix dropped)."""
    if not path.is_file():
        raise InvalidWeights(f"Checkpoint {str(path)!r} does not exist.")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises many types for a bad file
        raise InvalidWeights(f"Could not read checkpoint {str(path)!r}: {first_sentence(error)}.") from error
    state = checkpoint
    if isinstance(checkpoint, dict):
        for key in ("state_dict", "model"):
            if isinstance(checkpoint.get(key), dict):
                state = checkpoint[key]
                break
    if not isinstance(state, dict):
        raise InvalidWeights(f"Checkpoint {str(path)!r} holds no state dict.")
    state = {key.removeprefix("module."): value for key, value in state.items()}
    try:
        module.load_state_dict(state)
    except RuntimeError as error:
        first_line = str(error).splitlines()[0]
        raise InvalidWeights(
            f"Checkpoint {str(path)!r} does not fit {type(module).__name__}: {first_line}"
        ) from error
