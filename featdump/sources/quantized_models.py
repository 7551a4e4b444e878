"""torchvision's quantized classifiers (`quantized_resnet18`, ...): built with `quantize=True`, from the FBGEMM
weights, or (weights none) random weights quantized by torchvision's own calibration on a random batch (seeded).
They run on the CPU only (FBGEMM): a CUDA device, a reduced precision or `--compile` is refused in one line, and
`--device auto` is the CPU. Hooks see quantized tensors; the rows are their dequantized values (float32, or
`--dtype float16`)."""

from __future__ import annotations

CPU_ONLY = "a quantized model runs on the CPU only (FBGEMM kernels)"
