"""Models: build the nn.Module --model names, from any source, with its weights and preprocessing.

Each source is one module registered as an entry point of `featdump.sources` (pyproject.toml; `registry.sources`
lists them, `python -m featdump.faces.kinds models` as a table); this module asks the one that claims a name, then
applies what is common to all: a checkpoint file's weights, --transform, the default preprocessing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from featdump.errors import InvalidWeights, first_sentence
from featdump.sources import factory, torchvision_models
from featdump.sources.files import file_digest
from featdump.sources.registry import ModelClip, ModelRequest, source_for
from featdump.sources.tokens import TokenRule

__all__ = ["LoadedModel", "ModelClip", "check_model_name", "clip_of", "cpu_only", "default_preprocessing",
           "load_model", "model_kind"]
log = logging.getLogger("featdump")
DEFAULT_TRANSFORM = "ResNet18_Weights.DEFAULT.transforms()"


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
    """torchvision, timm, hf, open_clip, factory or file: the source that claims --model NAME."""
    return source_for(name).name


def check_model_name(name: str) -> None:
    """Fail fast (before any image is read) on a --model that names nothing loadable."""
    source_for(name).check(name)


def clip_of(name: str) -> ModelClip:
    """What --model NAME takes of a video, known before it is built: a torchvision video model's clip as its
    weights state it, a Hugging Face video model's frames (its config's), a factory's as it declares it
    (`featdump_clip`); an image model's one frame a row."""
    return source_for(name).clip(name) or ModelClip()


def cpu_only(name: str) -> str | None:
    """Why --model NAME runs on the CPU only (a quantized model's FBGEMM kernels), or None."""
    return source_for(name).cpu_only(name)


def default_preprocessing(name: str) -> nn.Module:
    """The transforms of a torchvision model's DEFAULT weights, as its task takes them."""
    return torchvision_models.preprocessing(name)


def load_model(model: str, weights: str = "DEFAULT", seed: int = 0, transform: str | None = None,
               trust_pickle: bool = False, structure_only: bool = False) -> LoadedModel:
    """Build --model MODEL with WEIGHTS (DEFAULT, an enum name, 'none' or a checkpoint path), in eval mode, by the
    source that claims it (`registry`); STRUCTURE_ONLY: any weights serve, none downloaded (list-layers).

    With weights 'none' the network is built right after `torch.manual_seed(seed)`, so the same random
    network can be rebuilt anywhere. TRANSFORM ('package.module:callable') replaces the preprocessing.
    """
    checkpoint = Path(weights) if _looks_like_path(weights) and not structure_only else None
    wanted = "structure" if structure_only else "checkpoint" if checkpoint else ""
    built = source_for(model).build(ModelRequest(spec=model, weights="none" if checkpoint or structure_only else
                                                 weights, seed=seed, transform=transform, trust_pickle=trust_pickle,
                                                 wanted=wanted))
    label, source, preprocessing = built.weights, built.source, built.preprocessing
    if checkpoint is not None:
        load_checkpoint(built.module, checkpoint)
        label, source = str(checkpoint.resolve()), {**source, "checkpoint_sha256": file_digest(checkpoint)}
    if transform:
        preprocessing, source = factory.transform(transform), {**source, "transform": transform}
    elif preprocessing is None:
        log.info("No --transform for %s: using the ImageNet default %s (resize 256, crop 224, ImageNet mean/std).",
                 model, DEFAULT_TRANSFORM)
        preprocessing = default_preprocessing("resnet18")
        source = {**source, "transform": DEFAULT_TRANSFORM}
    return LoadedModel(built.module.eval(), preprocessing, label, source, built.tokens, clip_of(model),
                       built.rows_within, built.stated_axes)


def _looks_like_path(weights: str) -> bool:
    suffixes = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")
    return "/" in weights or weights.endswith(suffixes) or Path(weights).exists()


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
