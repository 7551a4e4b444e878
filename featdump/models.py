"""Models: build a torchvision classification model by name, weights and seed, with its preprocessing."""

from __future__ import annotations

import difflib
import urllib.error
from dataclasses import dataclass
from pathlib import Path

import torch
import torchvision
from torch import nn
from torchvision.models import get_model, get_model_weights, list_models

from featdump.errors import InvalidWeights, UnknownModel, WeightsUnavailable


@dataclass
class LoadedModel:
    """A model in eval mode, the preprocessing its DEFAULT weights define, and what was loaded."""

    module: nn.Module
    preprocessing: nn.Module  # weights.transforms() of the model's DEFAULT weights
    weights: str  # what was loaded: a weights enum, "none", or a checkpoint path


def classification_models() -> list[str]:
    """Names of every torchvision classification model."""
    return list_models(module=torchvision.models)


def check_model_name(name: str) -> None:
    """Raise UnknownModel, naming the closest models, unless NAME is a classification model."""
    names = classification_models()
    if name in names:
        return
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise UnknownModel(
        f"Unknown model {name!r}.{hint} Any torchvision classification model works "
        f"({len(names)} of them, e.g. resnet50, vit_b_16, convnext_tiny)."
    )


def default_preprocessing(name: str) -> nn.Module:
    """The transforms of the model's DEFAULT weights (used whatever weights are loaded)."""
    return get_model_weights(name).DEFAULT.transforms()


def load_model(name: str, weights: str = "DEFAULT", seed: int = 0) -> LoadedModel:
    """Build model NAME with WEIGHTS (DEFAULT, an enum name, 'none' or a checkpoint path), in eval mode.

    With weights 'none' the network is `torch.manual_seed(seed); get_model(name, weights=None)`,
    so the same random network can be rebuilt anywhere.
    """
    check_model_name(name)
    preprocessing = default_preprocessing(name)
    if weights.lower() == "none":
        torch.manual_seed(seed)
        module, label = get_model(name, weights=None), "none"
    elif _looks_like_path(weights):
        torch.manual_seed(seed)
        module = get_model(name, weights=None)
        _load_checkpoint(module, Path(weights))
        label = str(Path(weights).resolve())
    else:
        enum = _weights_enum(name, weights)
        module, label = _pretrained(name, enum), f"{type(enum).__name__}.{enum.name}"
    return LoadedModel(module.eval(), preprocessing, label)


def _looks_like_path(weights: str) -> bool:
    return "/" in weights or weights.endswith((".pt", ".pth", ".bin", ".ckpt")) or Path(weights).exists()


def _weights_enum(name: str, weights: str):
    enum_class = get_model_weights(name)
    if weights.upper() == "DEFAULT":
        return enum_class.DEFAULT
    choices = [member.name for member in enum_class]
    if weights in choices:
        return enum_class[weights]
    raise InvalidWeights(
        f"Unknown weights {weights!r} for {name}: use DEFAULT, none, a checkpoint file, "
        f"or one of {', '.join(choices)}."
    )


def _pretrained(name: str, enum) -> nn.Module:
    """The model with ENUM's weights, from torch's cache or downloaded; a clear error offline."""
    try:
        return get_model(name, weights=enum)
    except (urllib.error.URLError, OSError) as error:
        raise WeightsUnavailable(
            f"Could not download the pretrained weights {type(enum).__name__}.{enum.name} "
            f"({_reason(error)}). Pass --weights none for a randomly initialised network, "
            "or --weights PATH for a local checkpoint."
        ) from error


def _reason(error: Exception) -> str:
    """The first sentence of an error's message (torch's can run to many lines)."""
    text = str(getattr(error, "reason", None) or error).strip() or type(error).__name__
    first = text.splitlines()[0]
    return first.split(". ")[0].rstrip(".")


def _load_checkpoint(module: nn.Module, path: Path) -> None:
    """Load a state dict saved as-is or under a 'state_dict' or 'model' key."""
    if not path.is_file():
        raise InvalidWeights(f"Checkpoint {str(path)!r} does not exist.")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises many types for a bad file
        raise InvalidWeights(f"Could not read checkpoint {str(path)!r}: {_reason(error)}.") from error
    state = checkpoint
    if isinstance(checkpoint, dict):
        for key in ("state_dict", "model"):
            if isinstance(checkpoint.get(key), dict):
                state = checkpoint[key]
                break
    if not isinstance(state, dict):
        raise InvalidWeights(f"Checkpoint {str(path)!r} holds no state dict.")
    state = {_strip_prefix(key): value for key, value in state.items()}
    try:
        module.load_state_dict(state)
    except RuntimeError as error:
        first_line = str(error).splitlines()[0]
        raise InvalidWeights(
            f"Checkpoint {str(path)!r} does not fit {type(module).__name__}: {first_line}"
        ) from error


def _strip_prefix(key: str) -> str:
    """Drop the 'module.' prefix DataParallel/DDP checkpoints carry."""
    return key[len("module."):] if key.startswith("module.") else key
