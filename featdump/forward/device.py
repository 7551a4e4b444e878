"""Device: where the forward runs (cpu, cuda:N) and how: the one CUDA set-up (index, current device, cudnn, TF32),
autocast, the memory left on a device, and what a failure of the device itself tells its user.

Nothing else in featdump touches torch.cuda's flags: every command (extract, probe, encode, rdm, cka) gets its device
from `resolve_device`, and TF32 is set and read here alone (torch >= 2.9 raises when the legacy `allow_tf32` flags
are read after the new `fp32_precision` ones were set, so only one of the two APIs is ever used).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from featdump.errors import DeviceFailure, UsageProblem

if TYPE_CHECKING:  # torchvision's import is a second that `featdump rdm` need not pay
    from featdump.inputs.preprocess import Preprocess


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """The device NAME means, set up: auto → this process's GPU when CUDA is available, else cpu; cuda → the current
    GPU; cuda:N → GPU N; under torchrun (LOCAL_RANK) auto and cuda mean this rank's GPU. A CUDA device always has
    its index, is made the current device and has cudnn.benchmark on; UsageProblem for one that is not there."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise UsageProblem(f"Unknown device {name!r}: use auto, cpu, cuda or cuda:N.") from error
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise UsageProblem(f"Unsupported device {name!r}: use auto, cpu, cuda or cuda:N.")
    if not torch.cuda.is_available():
        raise UsageProblem(f"Device {name!r} asked for, but CUDA is not available here; use --device cpu.")
    return _set_up_cuda(_cuda_index(device, local_rank), name)


def _cuda_index(device: torch.device, local_rank: int | None) -> int:
    """The GPU a CUDA device means: its own index, else torchrun's LOCAL_RANK, else the current device."""
    if device.index is not None:
        return device.index
    return local_rank if local_rank is not None else torch.cuda.current_device()


def _set_up_cuda(index: int, name: str) -> torch.device:
    count = torch.cuda.device_count()
    if index >= count:
        raise UsageProblem(f"Device {name!r} is GPU {index}, which does not exist: this machine has {count} GPU(s).")
    device = torch.device("cuda", index)
    # The current device: events, streams, the loader's pinning thread and nvJPEG all use it.
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True  # one input shape per run (the last batch is padded)
    return device


def set_tf32(enabled: bool) -> None:
    """TF32 for CUDA's float32 matmuls and convolutions on or off, through the API this torch has."""
    if _NEW_TF32_API:
        value = "tf32" if enabled else "ieee"
        torch.backends.cuda.matmul.fp32_precision = value
        torch.backends.cudnn.conv.fp32_precision = value
        torch.backends.cudnn.rnn.fp32_precision = value
    else:  # torch < 2.9
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """float32 products computed as float32 (no TF32 on CUDA, no reduced-precision kernels on the CPU) while it
    lasts; the settings before are put back."""
    if _NEW_TF32_API:
        with _fp32_precision((torch.backends.cuda.matmul, torch.backends.mkldnn.matmul), "ieee"):
            yield
        return
    tf32, precision = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.set_float32_matmul_precision(precision)


@contextlib.contextmanager
def cudnn_flags_readable() -> Iterator[None]:
    """While it lasts, torch's own code that reads cuDNN's legacy flags (torch.export does, on any device) can: torch
    raises there once `set_tf32` has set cuDNN's convolutions to "ieee" through the new API (an fp32 CUDA run
    earlier in this process: doctor's trials, a warm worker, a script), so the flags are "tf32" while it lasts and
    what they were after. It changes no arithmetic of a run: nothing computes on cuDNN meanwhile."""
    if not _NEW_TF32_API:
        yield
        return
    with _fp32_precision((torch.backends.cudnn.conv, torch.backends.cudnn.rnn), "tf32"):
        yield


@contextlib.contextmanager
def _fp32_precision(backends: tuple, value: str) -> Iterator[None]:
    """BACKENDS' `fp32_precision` (the new API) set to VALUE while it lasts, and put back after."""
    before = [backend.fp32_precision for backend in backends]
    for backend in backends:
        backend.fp32_precision = value
    try:
        yield
    finally:
        for backend, kept in zip(backends, before):
            backend.fp32_precision = kept


_NEW_TF32_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")


def free_memory(device: torch.device) -> int:
    """Bytes free on DEVICE: the GPU's free memory, or the machine's available memory (cgroup limits aside)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ERROR is a device running out of memory: torch's OutOfMemoryError, the same said by cuDNN, cuBLAS
    or an AOTInductor package (which raise RuntimeError with the allocator's words), the CPU allocator's ("can't
    allocate memory", "not enough memory") or Python's MemoryError."""
    text = str(error)
    return isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)) or (isinstance(error, RuntimeError) and any(
        words in text for words in ("out of memory", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED",
                                    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE", "can't allocate memory",
                                    "not enough memory")))


@contextlib.contextmanager
def out_of_memory_as_failure(device: torch.device, batch_size: int, output: str) -> Iterator[None]:
    """An out-of-memory error inside turned into a DeviceFailure whose one line names the batch size and the way
    out (OUTPUT: where the committed rows are kept)."""
    try:
        yield
    except DeviceFailure:
        raise
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        smaller = max(1, batch_size // 2)
        what = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DeviceFailure(
            f"Out of memory on {device} at --batch-size {batch_size} ({what[:200]}); the rows committed so far are "
            f"kept in {output}: run the same command with a smaller --batch-size (e.g. {smaller}) to resume."
        ) from error


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
    """The forward's autocast for PRECISION (fp32: none)."""
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
        set_tf32(precision != "fp32")  # fp32 means fp32: TF32 would drift from the CPU reference
    return module
