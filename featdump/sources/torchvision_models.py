"""torchvision's classification models by name, with the transforms of their DEFAULT weights."""

from __future__ import annotations

import difflib
import urllib.error

import torch
import torchvision
from torch import nn
from torchvision.models import get_model, get_model_weights, list_models

from featdump.errors import InvalidWeights, UnknownModel, UnsupportedModel, WeightsUnavailable, first_sentence
from featdump.sources import flow_models
from featdump.sources.tokens import TokenRule

_OTHER_TASKS = {"detection": "an object detection", "segmentation": "a semantic segmentation",
                "quantization": "a quantized"}  # video models: sources.video_models; optical flow: flow_models


def token_rule(module: nn.Module) -> TokenRule | None:
    """torchvision's ViTs: one class token before the patches, `patch_size` pixels a patch."""
    if getattr(module, "class_token", None) is None:
        return None
    return TokenRule.stated(1, getattr(module, "patch_size", None))


def classification_models() -> list[str]:
    """Names of every torchvision model that takes a batch and returns tensors: its classifiers, its video
    classifiers (`sources.video_models`) and its optical flow models on pairs of frames (`sources.flow_models`)."""
    return list_models(module=torchvision.models) + list_models(module=torchvision.models.video) + \
        flow_models.flow_model_names()


def is_classification_model(name: str) -> bool:
    return name in classification_models()


def check_name(name: str) -> None:
    """Raise unless NAME is a torchvision classification model: another task's model gets its own message."""
    names = classification_models()
    if name in names:
        return
    for task, kind in _OTHER_TASKS.items():
        if name in list_models(module=getattr(torchvision.models, task)):
            part = ", quantize=True)` (it runs on the CPU)" if task == "quantization" else ").backbone`"
            raise UnsupportedModel(
                f"{name!r} is {kind} model of torchvision; featdump reads classification-style backbones, which "
                "take a batch of images and return tensors. Wrap the part you want in a factory, e.g. "
                f"`def build(): return torchvision.models.get_model({name!r}, weights=None{part}, and pass "
                "--model yourmodule:build."
            )
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise UnknownModel(
        f"Unknown model {name!r}.{hint} Any torchvision classification model works ({len(names)} of them, e.g. "
        "resnet50, vit_b_16), as do timm:NAME, package.module:callable and saved model files."
    )


def default_preprocessing(name: str) -> nn.Module:
    """The transforms of the model's DEFAULT weights (used whatever weights are loaded)."""
    transforms = get_model_weights(name).DEFAULT.transforms()
    return flow_models.FlowTransform(transforms, name) if flow_models.is_flow_model(name) else transforms


def build(name: str, weights: str, seed: int) -> tuple[nn.Module, str]:
    """(module, what was loaded) for 'none' (seeded random), DEFAULT or a weights enum name."""
    wrap = flow_models.FlowPairs if flow_models.is_flow_model(name) else (lambda module: module)
    if weights.lower() == "none":
        torch.manual_seed(seed)
        return wrap(get_model(name, weights=None)), "none"
    enum = weights_enum(name, weights)
    return wrap(_pretrained(name, enum)), f"{type(enum).__name__}.{enum.name}"


def weights_enum(name: str, weights: str):
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
            f"({first_sentence(error)}). Pass --weights none for a randomly initialised network, "
            "or --weights PATH for a local checkpoint."
        ) from error
