"""hf:NAME_OR_PATH — a Hugging Face transformers model (AutoModel; a multimodal checkpoint's vision tower), with
the checkpoint's own AutoImageProcessor as its preprocessing."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from featdump.errors import UnknownModel, UnsupportedModel, UsageProblem, WeightsUnavailable, first_sentence
from featdump.sources.registry import Built, ModelClip, ModelRequest, Source, random_weights
from featdump.sources.tokens import TokenRule

if TYPE_CHECKING:  # torch is imported when a model is built, not for the help that lists this source
    import torch
    from torch import nn


def _transformers():
    try:
        import transformers
    except ImportError as error:
        raise UsageProblem("hf: models need transformers: pip install 'featdump[hf]' (or pip install "
                           "transformers).") from error
    return transformers


class ImageProcessorTransform:
    """A checkpoint's AutoImageProcessor as a transform: PIL image -> (C, H, W) float tensor, exactly the
    `pixel_values` the processor makes of that image."""

    def __init__(self, processor):
        self.processor = processor

    def __call__(self, image) -> torch.Tensor:
        return self.processor(images=image, return_tensors="pt")["pixel_values"][0]

    def __repr__(self) -> str:
        return f"{type(self.processor).__name__}({self.processor.to_json_string()})"


class VideoProcessorTransform:
    """A video checkpoint's AutoVideoProcessor as a clip transform: a clip's (T, C, H, W) uint8 frames -> the one
    video's model input, exactly what the processor makes of those frames (featdump has sampled them: the
    processor's own frame sampling is off)."""

    takes_clips = True

    def __init__(self, processor, input_name: str):
        self.processor, self.input_name = processor, input_name

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        made = self.processor(videos=[frames], return_tensors="pt", do_sample_frames=False)
        return (made[self.input_name] if self.input_name in made else next(iter(made.values())))[0]

    def __repr__(self) -> str:
        return f"{type(self.processor).__name__}({self.processor.to_json_string()})"


def check_name(name: str) -> None:
    _config(name)


def clip_frames(name: str) -> int | None:
    """The frames a clip of a video model NAME holds (its config's `num_frames`, or V-JEPA 2's `frames_per_clip`);
    None for an image model."""
    config = _config(name)
    frames = getattr(config, "num_frames", None) or getattr(config, "frames_per_clip", None)
    return int(frames) if isinstance(frames, int) and frames > 0 else None


def build(name: str, weights: str, seed: int) -> tuple[nn.Module, ImageProcessorTransform, str, dict,
                                                      TokenRule | None]:
    """(vision module, preprocessing, what was loaded, source, token rule) for weights 'none' (built from the
    checkpoint's config after torch.manual_seed(SEED)) or DEFAULT (from_pretrained: the hub or its cache)."""
    transformers = _transformers()
    config = _config(name)
    try:
        with _quiet(transformers):
            if random_weights(weights):
                import torch

                torch.manual_seed(seed)
                model, label = transformers.AutoModel.from_config(config), "none"
            else:
                model, label = transformers.AutoModel.from_pretrained(name), "pretrained"
            video = clip_frames(name) is not None
            processor = (transformers.AutoVideoProcessor if video else transformers.AutoImageProcessor
                         ).from_pretrained(name)
    except OSError as error:
        raise WeightsUnavailable(_unavailable(name, error)) from error
    from featdump.sources.hf_towers import vision_tower

    module = vision_tower(model)
    takes = getattr(module, "main_input_name", "pixel_values")
    if takes not in _IMAGE_INPUTS:
        raise UnsupportedModel(f"hf:{name} has no vision part: its {type(module).__name__} takes {takes}, not images. "
                               "Name an image model, or a multimodal one with a vision tower (CLIP, SigLIP, ...).")
    local = Path(name).is_dir()
    source = {"source": "hf", "hf_model": str(Path(name).resolve()) if local else name,
              "revision": getattr(config, "_commit_hash", None),
              "model_type": config.model_type, "transformers_version": transformers.__version__}
    transform = VideoProcessorTransform(processor, takes) if video else ImageProcessorTransform(processor)
    return module.eval(), transform, label, source, token_rule(module.config)


_IMAGE_INPUTS = ("pixel_values", "pixel_values_videos")  # what an image or video model's forward takes first


# Tokens before the patches, by model type, for the architectures whose layout is known: a class token, DeiT's
# distillation token, none (SigLIP, I-JEPA, Swin's first stage); DINOv2's register tokens are added from the config.
# A model type not listed states nothing: cls and patchmean are refused on it (`featdump.sources.tokens`).
_PREFIX_TOKENS = {"vit": 1, "deit": 2, "dinov2": 1, "dinov2_with_registers": 1, "clip_vision_model": 1, "clip": 1,
                  "beit": 1, "data2vec-vision": 1, "vit_msn": 1, "vit_hybrid": 1, "siglip_vision_model": 0,
                  "siglip": 0, "ijepa": 0, "swin": 0}


def token_rule(config) -> TokenRule | None:
    """The prefix tokens and patch size of a known architecture's (N, L, D) outputs; None for any other."""
    model_type = str(getattr(config, "model_type", ""))
    if model_type not in _PREFIX_TOKENS:
        return None
    registers = int(getattr(config, "num_register_tokens", 0) or 0)
    return TokenRule.stated(_PREFIX_TOKENS[model_type] + registers, getattr(config, "patch_size", None))


@contextlib.contextmanager
def _quiet(transformers):
    """No progress bars or advice from transformers while featdump loads (its own log says what it loads)."""
    logging, verbosity = transformers.utils.logging, transformers.utils.logging.get_verbosity()
    bars = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _config(name: str):
    transformers = _transformers()
    try:
        with _quiet(transformers):
            return transformers.AutoConfig.from_pretrained(name)
    except ValueError as error:  # a config transformers does not know
        raise UnknownModel(f"hf:{name}: {first_sentence(error)}.") from error
    except OSError as error:
        raise WeightsUnavailable(_unavailable(name, error)) from error


def _unavailable(name: str, error: BaseException) -> str:
    return (f"Could not load hf:{name} ({first_sentence(error)}). Name a folder written by save_pretrained, or a "
            "hub model already in the Hugging Face cache (HF_HOME; HF_HUB_OFFLINE=1 reads only the cache).")


class HuggingFaceSource(Source):
    """hf:ORG/NAME or hf:FOLDER: a transformers model's vision tower and its image processor."""

    name = prefix = "hf"
    kind = "hf:ORG/NAME or hf:FOLDER, a transformers model's vision tower (pip install 'featdump[hf]')"
    example = "-m hf:facebook/dinov2-small -l 'encoder.layer.*'"

    def check(self, spec: str) -> None:
        check_name(self.bare(spec))

    def clip(self, spec: str) -> ModelClip | None:
        frames = clip_frames(self.bare(spec))
        return ModelClip(frames, None, takes_clips=True) if frames else None

    def build(self, request: ModelRequest) -> Built:
        module, preprocessing, label, source, tokens = build(self.bare(request.spec), request.weights, request.seed)
        return Built(module, label, source, preprocessing, tokens)
