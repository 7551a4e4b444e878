"""What the machine offers (`featdump.forward.hardware`): native bf16/fp16 from the CPU's flags and oneDNN's limit,
a GPU's bf16 from its compute capability, and the one line a run says before its first batch when its precision
has no native kernels here."""

from __future__ import annotations

import os

import pytest
import torch

from featdump.forward import hardware
from featdump.forward.hardware import Cpu, Gpu, precision_misfit

from .helpers import run_featdump, write_images

ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})  # Zen 4: AVX-512 with bf16, no AVX512-FP16
SAPPHIRE_RAPIDS = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16"})


@pytest.mark.parametrize("flags, limit, bf16, fp16", [
    (frozenset({"avx2", "fma"}), None, False, False),  # Zen 3, older Intel: AVX2 only
    (ZEN4, None, True, False),
    (ZEN4, "AVX2", False, False),  # held to AVX2, as the tests hold the suite
    (ZEN4, "AVX512_CORE", False, False),
    (SAPPHIRE_RAPIDS, "AVX512_CORE_BF16", True, False),
    (SAPPHIRE_RAPIDS, "ALL", True, True),
])
def test_native_precisions_come_from_the_flags_within_onednn_s_limit(flags, limit, bf16, fp16):
    here = Cpu("a CPU", "AVX512", flags, limit)
    assert (here.native("bf16"), here.native("fp16"), here.native("fp32")) == (bf16, fp16, True)
    assert (precision_misfit("bf16", torch.device("cpu"), here) is None) == bf16


def test_this_cpu_is_read_as_torch_reads_it(monkeypatch):
    here = hardware.cpu()
    assert here.capability == torch.backends.cpu.get_cpu_capability() and here.cores >= 1 and here.name
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    held = hardware.cpu()
    assert held.onednn_limit == "AVX2" and not held.native("bf16") and "oneDNN held to AVX2" in held.instruction_set


def test_a_gpu_without_native_bf16_is_named_and_one_with_it_is_not(monkeypatch):
    monkeypatch.setattr(hardware, "gpus", lambda: [Gpu(0, "Tesla T4", "7.5", 16 << 30),
                                                   Gpu(1, "NVIDIA H100", "9.0", 80 << 30)])
    line = precision_misfit("bf16", torch.device("cuda:0"))
    assert line.startswith("--precision bf16 on Tesla T4 (compute capability 7.5)") and "fp16 is native" in line
    assert precision_misfit("bf16", torch.device("cuda:1")) is None
    assert precision_misfit("fp16", torch.device("cuda:0")) is None


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_precision_without_native_kernels_is_said_in_one_line_before_any_batch(tmp_path, precision):
    """A CPU reported without bf16 or fp16 kernels (oneDNN held to AVX2, whatever this CPU has): the line comes
    before the first batch's, says what the CPU offers and what it costs, and names the way out; fp32 says nothing."""
    write_images(tmp_path / "images", {"": 4})
    env = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "--precision", precision,
                          "--proof", "0", tmp_path / "images", tmp_path / "out.h5", env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    (said,) = [index for index, line in enumerate(lines) if f"--precision {precision} on this CPU" in line]
    assert "oneDNN held to AVX2" in lines[said] and "4-12x the time of fp32" in lines[said]
    assert "--precision fp32 is faster here" in lines[said] and "featdump doctor" in lines[said]
    first_batch = next(index for index, line in enumerate(lines) if "/4 images (" in line)
    assert said < first_batch
    fp32 = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", tmp_path / "images",
                        tmp_path / "fp32.h5", env={**os.environ, **env})
    assert fp32.returncode == 0 and "on this CPU" not in fp32.stderr
