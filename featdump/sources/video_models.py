"""torchvision's video models by name (r3d_18, mc3_18, r2plus1d_18, s3d, mvit_v1_b/v2_s, swin3d_t/s/b): the clip
their DEFAULT weights were measured on (`clip_len` frames at `frame_rate` a second, as the weights' documentation
states them), and the model built as for classifiers (`weights=None`: random, seeded). Their transforms
(VideoClassification) take (T, C, H, W) uint8 frames and give (C, T, H, W); their layers keep the time axis.
`torchvision_models` builds them by name, as classifiers."""

from __future__ import annotations

import re

import torch
import torchvision
from torch import nn
from torchvision.models import get_model, get_model_weights, list_models

_STATED = re.compile(r"`?(frame_rate|clip_len)=([0-9.]+)`?")


def video_model_names() -> list[str]:
    return list_models(module=torchvision.models.video)


def is_video_model(name: str) -> bool:
    return name in video_model_names()


def clip_defaults(name: str) -> tuple[int, float]:
    """(frames per clip, frames a second) the DEFAULT weights of NAME were measured with."""
    weights = get_model_weights(name).DEFAULT
    stated = dict(_STATED.findall(weights.meta.get("_docs", "")))
    frames = int(stated.get("clip_len") or weights.meta.get("min_temporal_size") or 16)
    return frames, float(stated.get("frame_rate", 15))


def build(name: str, seed: int = 0) -> nn.Module:
    """NAME with random weights drawn from SEED (no download), in eval mode."""
    torch.manual_seed(seed)
    return get_model(name, weights=None).eval()
