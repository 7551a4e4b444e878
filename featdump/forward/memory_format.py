"""Memory format: the layout a model's convolutions run fastest in, chosen per model (not by the decoder's strides),
and applied to its weights and to every batch of inputs."""

from __future__ import annotations

import torch
from torch import nn


def choose_memory_format(module: nn.Module, input_shape: tuple[int, ...]) -> tuple[torch.memory_format, str]:
    """channels_last for a convolutional network of images (its convolutions run 1.25-1.55x faster so on a CPU,
    and use the tensor cores' layout on a GPU); contiguous for a transformer, whose one convolution (the patch
    embedding) is a sliver of its work and whose token matmuls want contiguous inputs, and for a model whose
    input is not an image (INPUT_SHAPE past the batch: a clip). Returns (format, why)."""
    if len(input_shape) != 3:
        return torch.contiguous_format, f"its input {tuple(input_shape)} is no (C, H, W) image"
    convolutions = sum(isinstance(child, nn.Conv2d) for child in module.modules())
    if convolutions >= 2:
        return torch.channels_last, f"convolutional: {convolutions} Conv2d layers"
    return torch.contiguous_format, f"{convolutions} Conv2d layer(s): not a convolutional network"


def format_name(memory_format: torch.memory_format) -> str:
    return "channels_last" if memory_format == torch.channels_last else "contiguous"
