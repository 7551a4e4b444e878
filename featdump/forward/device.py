"""Device: where the forward runs (cpu, cuda:N), in what precision, and where JPEGs are decoded."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from torch import nn

from featdump.errors import UsageProblem

if TYPE_CHECKING:  # torchvision's import is a second that `featdump rdm` need not pay
    from featdump.inputs.preprocess import Preprocess


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """auto → cuda when available, else cpu; a clear error for a CUDA device that is not there. Under torchrun
    (LOCAL_RANK), auto and cuda mean this rank's GPU."""
    if local_rank is not None and name in ("auto", "cuda") and torch.cuda.is_available():
        name = f"cuda:{local_rank}"
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise UsageProblem(f"Unknown device {name!r}: use auto, cpu, cuda or cuda:N.") from error
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageProblem(f"Device {name!r} asked for, but CUDA is not available here; use --device cpu.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageProblem(f"Device {name!r} does not exist: this machine has {torch.cuda.device_count()} GPU(s).")
        # cuda:N is the current device: events, streams and the loader's pinning thread all use it.
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    elif device.type != "cpu":
        raise UsageProblem(f"Unsupported device {name!r}: use auto, cpu, cuda or cuda:N.")
    return device


def resolve_decode(decode: str, device: torch.device, preprocess: Preprocess) -> str:
    """cpu or gpu: auto means cpu for now (gpu decoding is asked for by name)."""
    if decode == "gpu" and device.type != "cuda":
        raise UsageProblem("--decode gpu needs a CUDA device; use --decode cpu (or auto).")
    if decode == "gpu" and not preprocess.split:
        raise UsageProblem("--decode gpu needs torchvision's ImageClassification preprocessing; use --decode cpu.")
    if decode == "auto":  # the CPU decoder until the GPU path (nvJPEG behind its barrier) is measured on a GPU
        return "cpu"
    return decode


def autocast(precision: str, device: torch.device):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def padded(inputs: torch.Tensor, size: int) -> torch.Tensor:
    """INPUTS with zero images appended up to SIZE rows (eval-mode layers compute each image on its own)."""
    missing = size - inputs.shape[0]
    if missing <= 0:
        return inputs
    return torch.cat([inputs, inputs.new_zeros((missing, *inputs.shape[1:]))])


def place_model(module: nn.Module, device: torch.device, precision: str,
                memory_format: torch.memory_format = torch.contiguous_format) -> nn.Module:
    """MODULE on DEVICE in MEMORY_FORMAT; on CUDA with TF32 only when the precision is not fp32."""
    module = module.to(device).to(memory_format=memory_format)
    if device.type == "cuda":
        # fp32 means fp32: TF32 convolutions/matmuls would drift from the CPU reference.
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = precision != "fp32"
    return module
