"""Ahead: the compiled forward packaged ahead of time (torch.export + AOTInductor), built once per key and loaded
by later runs in about a second, instead of tracing and compiling again in every process.

    CACHE/aoti/KEY.pt2    the package: the pruned graph's kernels and its weights (frozen on the CPU)
    CACHE/aoti/KEY.lock   held by the process building it; the others (a SLURM array) wait, then load it

KEY is a digest of everything that makes the package: the run's model, weights (a digest of every parameter and
buffer), layers and reductions, the input batch's shape, dtype and memory layout, the device (and the CPU's
instruction set), the precision, torch's and featdump's versions. A package is written under a temporary name and
renamed, so no reader sees a torn file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from featdump.version import __version__

log = logging.getLogger("featdump")
Lock = Callable[[Path, str], AbstractContextManager]  # a waiting lock: (path, what it guards)


def package_key(graph: torch.nn.Module, inputs: torch.Tensor, described: dict) -> str:
    """The digest naming the package of GRAPH for batches like INPUTS; DESCRIBED: the run's model, layers, ..."""
    weights = hashlib.sha256()
    for name, tensor in sorted(graph.state_dict().items()):
        weights.update(name.encode())
        weights.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    channels_last = inputs.dim() == 4 and inputs.is_contiguous(memory_format=torch.channels_last) \
        and not inputs.is_contiguous()
    device = inputs.device.type
    if device == "cuda":
        device += ":" + torch.cuda.get_device_name(inputs.device)
    parts = {**described, "weights": weights.hexdigest(), "shape": list(inputs.shape), "dtype": str(inputs.dtype),
             "channels_last": channels_last, "device": device, "machine": platform.machine(),
             "cpu": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__, "featdump": __version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def package_path(cache: Path, key: str) -> Path:
    return Path(cache) / "aoti" / f"{key}.pt2"


def load_or_build(graph: torch.nn.Module, inputs: torch.Tensor, path: Path, lock: Lock) -> tuple[Callable, str]:
    """The package at PATH loaded, built first (under LOCK, once for all the processes asking) when it is not
    there; returns (its forward, 'loaded' or 'built'). Raises what export, compiling or loading raise."""
    built = "loaded"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with lock(path.with_suffix(".lock"), "compiling the forward ahead of time"):
            if not path.exists():  # another process may have built it while this one waited
                _build(graph, inputs, path)
                built = "built"
    try:
        return torch._inductor.aoti_load_package(str(path)), built
    except Exception:
        path.unlink(missing_ok=True)  # unreadable (a different torch, a damaged file): built anew next time
        raise


def _build(graph: torch.nn.Module, inputs: torch.Tensor, path: Path) -> None:
    from torch._inductor import config

    started = time.perf_counter()
    with torch.inference_mode(False), torch.no_grad():
        exported = torch.export.export(graph, (inputs.clone(),), strict=False)
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.partial.pt2")  # the packager wants .pt2
    try:
        with config.patch(freezing=inputs.device.type == "cpu"):
            torch._inductor.aoti_compile_and_package(exported, package_path=str(temporary))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    log.info("Compiled the forward ahead of time in %.1f s (AOTInductor): %s, %.0f MB.", time.perf_counter() - started,
             path, path.stat().st_size / 1e6)
