"""torchvision's models by name, every task of them: classifiers, video classifiers (`video_models`), optical flow
(`flow_models`), semantic segmentation (`segmentation_models`), object detection (`detection_models`) and quantized
classifiers (`quantized_models`). This module alone knows a name's task (`task_of`); the task decides how the model
is built (weights none: no download, its backbone's weights none too), its preprocessing and what wraps it."""

from __future__ import annotations

import difflib
import urllib.error
from typing import TYPE_CHECKING

from featdump.errors import InvalidWeights, UnknownModel, WeightsUnavailable, first_sentence
from featdump.sources import quantized_models
from featdump.sources.registry import Built, ModelClip, ModelRequest, Source, default_weights, random_weights
from featdump.sources.tokens import TokenRule
from featdump.sources.torchvision_names import names_by_task

if TYPE_CHECKING:  # torchvision is imported when a model is built or its preprocessing read, not to check a name
    from torch import nn

_BUILT_WITH = {"quantization": {"quantize": True}}  # get_model's arguments beyond the weights, by task
_BACKBONE_WEIGHTS = ("segmentation", "detection")  # tasks whose models would fetch their backbone's weights


def token_rule(module: nn.Module) -> TokenRule | None:
    """torchvision's ViTs: one class token before the patches, `patch_size` pixels a patch."""
    if getattr(module, "class_token", None) is None:
        return None
    return TokenRule.stated(1, getattr(module, "patch_size", None))


def every_model() -> list[str]:
    """Every name in torchvision.models.list_models(), each of one task."""
    return [name for names in names_by_task().values() for name in names]


def task_of(name: str) -> str:
    """The task of torchvision model NAME (classification, video, optical_flow, segmentation, detection,
    quantization); UnknownModel, with the names it is close to, for a name torchvision does not have."""
    for task, names in names_by_task().items():
        if name in names:
            return task
    names = every_model()
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise UnknownModel(
        f"Unknown model {name!r}.{hint} Any torchvision model works ({len(names)} of them, e.g. resnet50, vit_b_16, "
        "r3d_18, deeplabv3_resnet50), as do timm:NAME, package.module:callable and saved model files."
    )


def check_name(name: str) -> None:
    task_of(name)


def preprocessing(name: str, module: nn.Module | None = None) -> nn.Module:
    """The preprocessing of NAME (built as MODULE), whatever weights are loaded: its DEFAULT weights' transforms,
    as its task takes them (a segmentation model's cropped to a square, a flow model's on pairs of frames, a
    detection model's images resized to its own square)."""
    from torchvision.models import get_model_weights

    from featdump.sources import detection_models, flow_models, segmentation_models

    task, transforms = task_of(name), get_model_weights(name).DEFAULT.transforms()
    if task == "detection":
        return detection_models.square_transform(name, module if module is not None else build(name, "none", 0)[0])
    if task == "optical_flow":
        return flow_models.FlowTransform(transforms, name)
    if task == "segmentation":
        return segmentation_models.square_transform(name, transforms)
    return transforms


def rows_within(name: str) -> tuple[str, ...]:
    """The modules of NAME whose outputs are rows of an image (a detection model's backbone); () for all."""
    if task_of(name) != "detection":
        return ()
    from featdump.sources import detection_models

    return detection_models.ROWS_WITHIN


def build(name: str, weights: str, seed: int) -> tuple[nn.Module, str]:
    """(module, what was loaded) for 'none' (seeded random, nothing downloaded: not its backbone's weights
    either), DEFAULT or a weights enum name; as its task builds it (quantized: quantize=True)."""
    import torch
    from torchvision.models import get_model

    from featdump.sources import flow_models

    task = task_of(name)
    options = dict(_BUILT_WITH.get(task, {}))
    wrap = flow_models.FlowPairs if task == "optical_flow" else (lambda module: module)
    if random_weights(weights):
        torch.manual_seed(seed)
        backbone = {"weights_backbone": None} if task in _BACKBONE_WEIGHTS else {}
        return wrap(get_model(name, weights=None, **options, **backbone)), "none"
    enum = weights_enum(name, weights)
    return wrap(_pretrained(name, enum, options)), f"{type(enum).__name__}.{enum.name}"


def weights_enum(name: str, weights: str):
    from torchvision.models import get_model_weights

    enum_class = get_model_weights(name)
    if default_weights(weights):
        return enum_class.DEFAULT
    choices = [member.name for member in enum_class]
    if weights in choices:
        return enum_class[weights]
    raise InvalidWeights(
        f"Unknown weights {weights!r} for {name}: use DEFAULT, none, a checkpoint file, "
        f"or one of {', '.join(choices)}."
    )


def _pretrained(name: str, enum, options: dict) -> nn.Module:
    """The model with ENUM's weights, from torch's cache or downloaded; a clear error offline."""
    from torchvision.models import get_model

    try:
        return get_model(name, weights=enum, **options)
    except (urllib.error.URLError, OSError) as error:
        raise WeightsUnavailable(
            f"Could not download the pretrained weights {type(enum).__name__}.{enum.name} "
            f"({first_sentence(error)}). Pass --weights none for a randomly initialised network, "
            "or --weights PATH for a local checkpoint."
        ) from error


class TorchvisionSource(Source):
    """A torchvision model name, of any task: its weights enum, its task's preprocessing and rows."""

    name = "torchvision"
    order = 3
    kind = 'a torchvision model name (resnet50): classifiers, video, optical flow, segmentation, detection, quantized'
    example = '-m resnet50 -l avgpool'

    def claims(self, spec: str) -> bool:
        return True

    def check(self, spec: str) -> None:
        check_name(spec)

    def clip(self, spec: str) -> ModelClip | None:
        task = task_of(spec)
        if task == "video":
            from featdump.sources import video_models

            return ModelClip(*video_models.clip_defaults(spec), takes_clips=True)
        if task == "optical_flow":
            from featdump.sources import flow_models

            return ModelClip(flow_models.PAIR, None, takes_clips=True)
        return None

    def cpu_only(self, spec: str) -> str | None:
        return quantized_models.CPU_ONLY if task_of(spec) == "quantization" else None

    def build(self, request: ModelRequest) -> Built:
        spec = request.spec
        check_name(spec)
        module, label = build(spec, request.weights, request.seed)
        task = task_of(spec)  # recorded beside the source, a classifier's as before
        source = {"source": "torchvision", **({"task": task} if task != "classification" else {})}
        return Built(module, label, source, preprocessing(spec, module), token_rule(module), rows_within(spec))
