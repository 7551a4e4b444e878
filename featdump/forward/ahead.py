"""Ahead: the compiled forward packaged ahead of time (torch.export + AOTInductor), built once per key and loaded
by later runs in about a second, instead of tracing and compiling again in every process.

    CACHE/aoti/KEY.pt2    the package: the pruned graph's kernels and its weights (frozen on the CPU)
    CACHE/aoti/graphs/GRAPH  the name of the package made for the traced graph GRAPH (see below)
    CACHE/aoti/KEY.lock   held by the process building it; the others (a SLURM array) wait, then load it
    CACHE/aoti/KEY.rejected  why the package failed the first-batch check against eager: later runs with the same
                          key run eager at once (the package is kept: another task may be loading it)

KEY is a digest of what the package computes: the exported program (its graph, where every module's settings such
as a BatchNorm's eps are constants, and every parameter, buffer and constant it reads), plus what the export cannot
see: the run's model, weights, layers and reductions, the input batch's shape, dtype and memory layout, the device
(and the CPU's instruction set), the precision, and the versions of torch, featdump and the model libraries loaded
(torchvision, timm, transformers, open_clip). A factory whose code or settings change gets a new package. The
build runs once. The export (1-2 s for resnet50 here) runs only where the traced graph is new: GRAPH, a digest of
featdump's traced graph (its code, each module's class, the source of that class and its plain settings, every
tensor it holds) and the same run facts, names the package an earlier export found for that graph; a later run
with the same GRAPH loads that package without exporting. Should a package so found ever fail the first-batch
check, the run forgets that name and exports after all. A package is written under a temporary name and renamed,
so no reader sees a torn file.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from featdump.forward.device import cudnn_flags_readable
from featdump.version import __version__

log = logging.getLogger("featdump")
Lock = Callable[[Path, str], AbstractContextManager]  # a waiting lock: (path, what it guards)


def export(graph: torch.nn.Module, inputs: torch.Tensor):
    """GRAPH exported (torch.export) for batches like INPUTS: what a package is built from, and keyed by."""
    with torch.inference_mode(False), torch.no_grad(), cudnn_flags_readable():
        return torch.export.export(graph, (inputs.clone(),), strict=False)


def package_key(exported, inputs: torch.Tensor, described: dict) -> str:
    """The digest naming the package of the EXPORTED program for batches like INPUTS; DESCRIBED: the run's model,
    layers, ..."""
    program = hashlib.sha256(exported.graph_module.code.encode())
    _add_values(program, {**exported.state_dict, **exported.constants})
    return _run_key(program, inputs, described)


def graph_key(graph: torch.nn.Module, inputs: torch.Tensor, described: dict) -> str:
    """The digest of featdump's traced GRAPH (its code; each module's name, class, the class's source and plain
    settings; every tensor it holds) with the run's facts: it names the package an export of this graph made."""
    program = hashlib.sha256(getattr(graph, "code", "").encode())
    tensors = {}
    for name, module in graph.named_modules():
        kind = type(module)
        program.update(f"{name}:{kind.__module__}.{kind.__qualname__}:{_source_digest(kind)}".encode())
        for key, value in sorted(vars(module).items()):
            if isinstance(value, (bool, int, float, str, tuple, type(None))):
                program.update(f"{key}={value!r};".encode())
            elif isinstance(value, torch.Tensor):
                tensors[f"{name}.{key}"] = value
    _add_values(program, {**tensors, **dict(graph.named_parameters()), **dict(graph.named_buffers())})
    return _run_key(program, inputs, described)


@functools.cache
def _source_digest(kind: type) -> str:
    """A digest of the source of class KIND and of its bases outside torch and the model libraries (whose
    versions the key holds): a factory's code can change a module's output. Empty for their own classes."""
    digest = hashlib.sha256()
    for base in kind.__mro__:
        if base.__module__.split(".")[0] in ("builtins", "torch", *_MODEL_LIBRARIES):
            continue
        try:
            digest.update(inspect.getsource(base).encode())
        except (OSError, TypeError):  # no source (a class made at run time, as fx's): its name
            digest.update(f"{base.__module__}.{base.__qualname__}".encode())
    return digest.hexdigest()[:16]


def _add_values(program, values: dict) -> None:
    for name, value in sorted(values.items()):
        program.update(name.encode())
        if isinstance(value, torch.Tensor):
            program.update(str((value.dtype, tuple(value.shape))).encode())
            program.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            program.update(repr(value).encode())


def _run_key(program, inputs: torch.Tensor, described: dict) -> str:
    """PROGRAM's digest with what the program cannot see: INPUTS' shape, dtype and layout, the device, the
    machine, the versions, and DESCRIBED (the run's model, layers, ...)."""
    channels_last = inputs.dim() == 4 and inputs.is_contiguous(memory_format=torch.channels_last) \
        and not inputs.is_contiguous()
    device = inputs.device.type
    if device == "cuda":
        device += ":" + torch.cuda.get_device_name(inputs.device)
    parts = {**described, "program": program.hexdigest(), "shape": list(inputs.shape), "dtype": str(inputs.dtype),
             "channels_last": channels_last, "device": device, "machine": platform.machine(),
             "cpu": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__, "featdump": __version__,
             "libraries": _library_versions()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _library_versions() -> dict[str, str]:
    """The versions of the model libraries this process has loaded (a model's code lives in them)."""
    return {name: str(getattr(sys.modules[name], "__version__", "?")) for name in _MODEL_LIBRARIES
            if name in sys.modules}


_MODEL_LIBRARIES = ("torchvision", "timm", "transformers", "open_clip")


def package_path(cache: Path, key: str) -> Path:
    return Path(cache) / "aoti" / f"{key}.pt2"


def found_for_graph(cache: Path, graph: str) -> Path | None:
    """The package an earlier export of the graph digested as GRAPH made, when it is still there."""
    try:
        name = (Path(cache) / "aoti" / "graphs" / graph).read_text().strip()
    except FileNotFoundError:
        return None
    path = Path(cache) / "aoti" / name
    return path if name.endswith(".pt2") and "/" not in name and path.exists() else None


def remember_for_graph(cache: Path, graph: str, path: Path) -> None:
    """Note that the graph digested as GRAPH exports to the package at PATH (written whole, then renamed)."""
    folder = Path(cache) / "aoti" / "graphs"
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{graph}.{os.getpid()}"
    temporary.write_text(path.name + "\n")
    os.replace(temporary, folder / graph)


def forget_for_graph(cache: Path, graph: str) -> None:
    (Path(cache) / "aoti" / "graphs" / graph).unlink(missing_ok=True)


def reject(path: Path, why: str) -> None:
    """Mark the package at PATH as failing the check against eager (WHY), for every later run with its key."""
    marker = path.with_suffix(".rejected")
    temporary = marker.with_name(f".{marker.name}.{os.getpid()}")
    temporary.write_text(why + "\n")
    os.replace(temporary, marker)


def rejected(path: Path) -> str | None:
    """Why the package at PATH was rejected by an earlier run, or None."""
    try:
        return path.with_suffix(".rejected").read_text().strip()
    except FileNotFoundError:
        return None


def load(path: Path) -> Callable:
    """The package at PATH loaded; a package that cannot be loaded is removed (built anew next time) and the
    error raised."""
    try:
        return torch._inductor.aoti_load_package(str(path))
    except Exception:
        path.unlink(missing_ok=True)  # unreadable (a different torch, a damaged file): built anew next time
        raise


def load_or_build(exported, device: torch.device, path: Path, lock: Lock) -> tuple[Callable, str]:
    """The package at PATH loaded, built first from the EXPORTED program for DEVICE (under LOCK, once for all the
    processes asking) when it is not there; returns (its forward, 'loaded' or 'built'). Raises what compiling or
    loading raise."""
    built = "loaded"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with lock(path.with_suffix(".lock"), "compiling the forward ahead of time"):
            if not path.exists():  # another process may have built it while this one waited
                _build(exported, device, path)
                built = "built"
    return load(path), built


def _build(exported, device: torch.device, path: Path) -> None:
    from torch._inductor import config

    started = time.perf_counter()
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.partial.pt2")  # the packager wants .pt2
    try:
        with config.patch(freezing=device.type == "cpu"):
            torch._inductor.aoti_compile_and_package(exported, package_path=str(temporary))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    log.info("Compiled the forward ahead of time in %.1f s (AOTInductor): %s, %.0f MB.", time.perf_counter() - started,
             path, path.stat().st_size / 1e6)
