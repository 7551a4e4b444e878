"""Hardware: what this machine offers a run. The CPU (its name, the instruction set PyTorch's kernels use, whether
bf16 and fp16 have native kernels, any lower set oneDNN and ATen are held to) and the CUDA devices (name, compute
capability, memory). One owner of these facts: the precision check before a run's first batch, `featdump doctor`
and the benchmarks' records read them here.

A CPU has native bf16 kernels where it has AVX512-BF16 or AMX-BF16 (x86) or BF16 (Arm), and native fp16 kernels
where it has AVX512-FP16 or AMX-FP16 (x86) or FP16 arithmetic (Arm); elsewhere autocast converts every value and
computes in float32, 4-12x slower than fp32 (resnet50 on an AMD Zen 3 with AVX2: benchmarks/RESULTS.md).
`ONEDNN_MAX_CPU_ISA` (oneDNN) and `ATEN_CPU_CAPABILITY` (ATen) hold the kernels to a lower set; a set below the
one with the instructions takes the native kernels away.
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

# The CPU flags (as /proc/cpuinfo names them) that give a precision native kernels, x86 and Arm.
NATIVE_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16", "bf16"), "fp16": ("avx512_fp16", "amx_fp16", "fphp")}
# oneDNN's instruction sets (ONEDNN_MAX_CPU_ISA), lowest first, and the lowest that has each precision's kernels.
ONEDNN_SETS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
               "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
               "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "ALL")
ONEDNN_NATIVE = {"bf16": "AVX512_CORE_BF16", "fp16": "AVX512_CORE_FP16"}
# What a precision without native kernels costs against fp32 on the CPU, as measured (benchmarks/RESULTS.md).
EMULATED_COST = "4-12x the time of fp32 (resnet50 on an AMD Zen 3 with AVX2: a whole job 4.6x, its bare forward 12x)"


@dataclass(frozen=True)
class Cpu:
    """The CPU as PyTorch's kernels see it."""

    name: str  # as /proc/cpuinfo names it (or the platform's processor)
    capability: str  # ATen's kernels: DEFAULT, AVX2, AVX512, ... (ATEN_CPU_CAPABILITY holds it lower)
    flags: frozenset[str] = field(default_factory=frozenset)
    onednn_limit: str | None = None  # ONEDNN_MAX_CPU_ISA, where set
    cores: int = 1

    def native(self, precision: str) -> bool:
        """Whether PRECISION (bf16, fp16; fp32 always) has native kernels here, within oneDNN's limit."""
        if precision == "fp32":
            return True
        if not any(flag in self.flags for flag in NATIVE_FLAGS[precision]):
            return False
        if platform.machine() not in ("x86_64", "AMD64") or self.onednn_limit in (None, "ALL"):
            return True
        limit = self.onednn_limit if self.onednn_limit in ONEDNN_SETS else "ALL"
        return ONEDNN_SETS.index(limit) >= ONEDNN_SETS.index(ONEDNN_NATIVE[precision])

    @property
    def instruction_set(self) -> str:
        """The CPU in one phrase: its capability, oneDNN's limit where set, its native reduced precisions."""
        native = [precision for precision in ("bf16", "fp16") if self.native(precision)]
        limit = f", oneDNN held to {self.onednn_limit}" if self.onednn_limit else ""
        return f"{self.capability}{limit}, native {' and '.join(native) if native else 'fp32 only'}"


@dataclass(frozen=True)
class Gpu:
    """One CUDA device."""

    index: int
    name: str
    compute_capability: str  # "9.0"
    memory_bytes: int

    @property
    def native_bf16(self) -> bool:
        return float(self.compute_capability) >= 8.0  # Ampere and later


def cpu() -> Cpu:
    """This machine's CPU."""
    name, flags = _cpuinfo()
    return Cpu(name=name, capability=torch.backends.cpu.get_cpu_capability(), flags=flags,
               onednn_limit=os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA")) or None,
               cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _cpuinfo() -> tuple[str, frozenset[str]]:
    """The CPU's model name and flags from /proc/cpuinfo (x86's `flags`, Arm's `Features`)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return name, frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and name in (platform.processor(), platform.machine()):
            name = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return name, frozenset(flags)


def gpus() -> list[Gpu]:
    """The CUDA devices PyTorch sees (none without CUDA)."""
    if not torch.cuda.is_available():
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        found.append(Gpu(index, properties.name, f"{properties.major}.{properties.minor}",
                         int(properties.total_memory)))
    return found


def precision_misfit(precision: str, device: torch.device, here: Cpu | None = None) -> str | None:
    """Why PRECISION on DEVICE is far slower than fp32 on this hardware, in one line with the way out; None where
    it fits (fp32, a CPU with native kernels for it, a GPU that has them)."""
    if precision == "fp32":
        return None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        gpu = next((gpu for gpu in gpus() if gpu.index == index), None)
        if gpu is None or precision != "bf16" or gpu.native_bf16:
            return None
        return (f"--precision bf16 on {gpu.name} (compute capability {gpu.compute_capability}): it has no native bf16 "
                "kernels (those start at 8.0) and may run slower than fp32; --precision fp16 is native there.")
    here = here or cpu()
    if here.native(precision):
        return None
    return (f"--precision {precision} on this CPU ({here.name}: {here.instruction_set}) has no native {precision} "
            f"kernels: autocast converts every value and computes in fp32, about {EMULATED_COST}. --precision fp32 "
            f"is faster here (and exact); `featdump doctor` measures the choices on this machine.")


def cxx_compiler() -> str | None:
    """The C++ compiler AOTInductor would build with here (CXX, g++, c++ or clang++), or None."""
    candidates = [os.environ.get("CXX"), "g++", "c++", "clang++"]
    return next((found for found in (shutil.which(name) for name in candidates if name) if found), None)


def describe(folder: Path = Path(".")) -> dict:
    """The machine as JSON values: CPU, GPUs, versions, the compiler --compile needs, the free disk at FOLDER."""
    import torchvision

    here = cpu()
    return {"cpu": {**{key: value for key, value in asdict(here).items() if key != "flags"},
                    "native": {precision: here.native(precision) for precision in ("bf16", "fp16")},
                    "instruction_set": here.instruction_set},
            "gpus": [asdict(gpu) for gpu in gpus()],
            "torch": torch.__version__, "torchvision": torchvision.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "compiler": cxx_compiler(),
            "free_disk_bytes": shutil.disk_usage(folder).free, "disk_folder": str(folder.resolve())}
