"""A dry forward on the meta device: a model's forward with its parameters and buffers as meta tensors, no copy of
the model and no arithmetic, so that hooks see the shapes a real forward gives. Normalisations (batch, layer, group
and instance norms) answer there with a tensor of their input's shape, laid out as computing them lays it:
PyTorch's own meta answer runs their decomposition in Python, three quarters of a resnet's dry forward (resnet18's
probe 0.041 s with it, 0.012 s without)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode


def forward_on_meta(model: nn.Module, shape: tuple[int, ...]) -> None:
    """MODEL's forward of zeros of SHAPE on the meta device. Raises where the model cannot run so."""
    held = {name: torch.empty_like(tensor, device="meta")
            for name, tensor in (*model.named_parameters(), *model.named_buffers())}
    with _ShapeKeepingNorms():
        torch.func.functional_call(model, held, (torch.zeros(shape, device="meta"),), strict=True)


def _channels_fit(input, *per_channel) -> bool:
    """Every per-channel tensor of a norm (None: not given) has the input's channels (dimension 1)."""
    return input.dim() >= 2 and all(tensor is None or tuple(tensor.shape) == (input.shape[1],)
                                    for tensor in per_channel)


def _batch_norm_fits(input, running_mean=None, running_var=None, weight=None, bias=None, training=False, *_, **__):
    """An evaluation's batch norm (training's needs more than one value per channel: left to PyTorch's check)."""
    return not training and _channels_fit(input, weight, bias, running_mean, running_var)


def _instance_norm_fits(input, running_mean=None, running_var=None, weight=None, bias=None, *_, **__) -> bool:
    return input.dim() >= 3 and _channels_fit(input, weight, bias, running_mean, running_var)


def _layer_norm_fits(input, normalized_shape, weight=None, bias=None, *_, **__) -> bool:
    """The normalised shape is the input's last dimensions, and the weight and bias have it."""
    normalized = tuple(normalized_shape)
    return (0 < len(normalized) <= input.dim() and tuple(input.shape[-len(normalized):]) == normalized
            and all(tensor is None or tuple(tensor.shape) == normalized for tensor in (weight, bias)))


def _group_norm_fits(input, num_groups, weight=None, bias=None, *_, **__) -> bool:
    return input.dim() >= 2 and num_groups > 0 and input.shape[1] % num_groups == 0 and _channels_fit(
        input, weight, bias)


# each norm: whether it fits its input, and the layout of its output (as computed on the CPU: batch and group norms
# keep a channels-last input's, layer and instance norms give a contiguous tensor)
_NORMS = {F.batch_norm: (_batch_norm_fits, torch.preserve_format),
          F.group_norm: (_group_norm_fits, torch.preserve_format),
          F.instance_norm: (_instance_norm_fits, torch.contiguous_format),
          F.layer_norm: (_layer_norm_fits, torch.contiguous_format)}


class _ShapeKeepingNorms(TorchFunctionMode):
    """On meta tensors, a normalisation that fits its input is answered by an empty tensor of the input's shape; any
    other call (a norm whose weights do not fit: PyTorch says why) runs as it would."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fits, layout = _NORMS.get(func, (None, None))
        if fits is not None and args and isinstance(args[0], torch.Tensor) and args[0].is_meta \
                and fits(*args, **kwargs):
            return torch.empty_like(args[0], memory_format=layout)
        return func(*args, **kwargs)
