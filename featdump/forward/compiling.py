"""Compiling (--compile): the forward a capture runs (its pruned graph) compiled and checked against eager at the
first batch: from an ahead-of-time package (`ahead`: built once, loaded by later runs in a second), else with
torch.compile in this process, else eager with one log line; and the compile cache a cluster can share
(--compile-cache: the packages, torch inductor's and triton's caches in one folder).

Shapes are static: the runner pads a short batch to the batch size, so a run compiles once.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from featdump.forward.ahead import (
    Lock,
    export,
    forget_for_graph,
    found_for_graph,
    graph_key,
    load,
    load_or_build,
    package_key,
    package_path,
    reject,
    rejected,
    remember_for_graph,
)
from featdump.forward.hooks import Capture

log = logging.getLogger("featdump")
# Of a layer's largest value: compiled kernels fuse and reorder float operations. In float32 the packages differ
# from eager by 2.7e-6 at most on the models tried (benchmarks/precision.py: resnet18, the tests' small CNN and
# ViT); a model whose BatchNorm eps changed from 1e-5 to 1e-4 differs by 5e-5, which the check must catch. Under
# autocast each rounding is coarser (bf16 keeps 8 bits of mantissa, fp16 11), and a fused kernel rounds at other
# places than eager's: compiled and eager bf16 differed by 8.6e-3 on resnet18 layer2, so the check allows what the
# proof allows a bf16 or fp16 run against fp32 (featdump.job.tolerances), about 4x the largest error seen.
TOLERANCES = {"fp32": 1e-5, "bf16": 5e-2, "fp16": 1e-2}


def tolerance(precision: str | None) -> float:
    """How far compiled outputs may be from eager's at the first batch, of a layer's largest value."""
    return TOLERANCES[precision or "fp32"]


NOT_TRACED = "the model does not trace to a graph (featdump compiles the traced, pruned graph; hooks are not compiled)"


@dataclass(frozen=True)
class Compiled:
    """What --compile did: whether the forward runs compiled, how long compiling took, and a line to record."""

    compiled: bool
    seconds: float
    note: str  # recorded in the output's `compiled` attribute


def use_cache(folder: Path | None) -> Path:
    """Point inductor's caches (compiled kernels, FX graphs; triton's on a GPU) at FOLDER, or leave torch's own
    (TORCHINDUCTOR_CACHE_DIR, else /tmp/torchinductor_USER); returns the folder in use."""
    if folder is not None:
        folder = Path(folder).expanduser().resolve()
        folder.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
        os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def compile_capture(capture: Capture, cache: Path | None, described: dict | None = None,
                    lock: Lock | None = None) -> CompiledForward | None:
    """Make CAPTURE run its graph through a CompiledForward (compiled at the first batch); None, with a log line,
    when there is no graph to compile. DESCRIBED (the run's model, layers, reductions, ...) and LOCK (a waiting
    lock) let it build or load an ahead-of-time package (`ahead`) first."""
    if capture.strategy != "graph":
        _eager(NOT_TRACED)
        return None
    forward = CompiledForward(capture.graph, use_cache(cache), described, lock)
    capture.use_compiled(forward)
    return forward


class CompiledForward:
    """The graph, compiled at its first call (the first batch of real inputs, padded to the batch size) and
    checked there against eager on its first two rows; eager from then on if it does not compile or differs.

    On the CPU with inductor's freezing: the weights become constants, prepacked for oneDNN (1.2x on resnet50
    here). The caller runs it under inference mode and the run's autocast.
    """

    def __init__(self, graph, cache: Path, described: dict | None = None, lock: Lock | None = None):
        self.graph, self.cache, self.described, self.lock = graph, cache, described, lock
        self._forward = None
        self.result = Compiled(False, 0.0, "no: the run ended before its first batch")
        self.tolerance = tolerance((described or {}).get("precision"))

    def __call__(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        if self._forward is None:
            return self._first(inputs)
        return self._forward(inputs)

    def _first(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        from torch._inductor import config

        if inputs.device.type == "cpu":  # "No CUDA runtime is found": true, and no concern of a CPU compile
            logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        if self.described is not None and self.lock is not None:
            got = self._ahead_of_time(inputs)
            if got is not None:
                return got
        entries = _entries(self.cache)
        started = time.perf_counter()
        try:
            compiled = torch.compile(self.graph, dynamic=False, fullgraph=True)  # all of it, or eager
            with config.patch(freezing=inputs.device.type == "cpu"):
                got = compiled(inputs)
        except Exception as error:  # compilers fail in many model-specific ways
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            return self._eager(f"it does not compile ({type(error).__name__}: {first_line[:300]})", inputs)
        seconds = time.perf_counter() - started
        difference = self._difference(got, inputs)
        if not difference <= self.tolerance:
            return self._eager(f"its outputs differ from eager's by {difference:.1e} of a layer's largest value "
                               f"(more than {self.tolerance:.0e})", inputs)
        cached = _cache_use(_entries(self.cache) - entries)
        log.info("Compiled the forward in %.1f s, its first batch included (inductor; cache %s: %s); it differs "
                 "from eager by %.1e at most.", seconds, self.cache, cached, difference)
        self._forward = compiled
        self.result = Compiled(True, seconds, f"yes: inductor, {seconds:.1f} s to compile (the first batch "
                                              f"included), cache {cached}")
        return got

    def _ahead_of_time(self, inputs: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """The forward from its AOTInductor package (loaded, or built once and cached), checked against eager; None,
        with a log line, where export, the compiler or the check fails (then torch.compile is tried)."""
        started = time.perf_counter()
        graph = graph_key(self.graph, inputs, self.described)
        try:
            found = self._found_for_graph(graph, inputs)  # an earlier export of this graph: no export now
            if found is not None:
                (forward, path, got, difference), how = found, "loaded"
            else:
                exported = export(self.graph, inputs)
                path = package_path(self.cache, package_key(exported, inputs, self.described))
                earlier = rejected(path)
                if earlier is not None:  # neither built again nor compiled again by every run: eager at once
                    return self._eager(f"its package {path.name} failed the check against eager before ({earlier})",
                                       inputs)
                forward, how = load_or_build(exported, inputs.device, path, self.lock)
                got = forward(inputs)
                difference = self._difference(got, inputs)
                remember_for_graph(self.cache, graph, path)
        except Exception as error:  # export and the compilers fail in many model-specific ways
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            log.info("--compile: no ahead-of-time package (%s: %s); compiling with torch.compile in this run.",
                     type(error).__name__, first_line[:300])
            return None
        seconds = time.perf_counter() - started
        if not difference <= self.tolerance:  # kept (another task may be loading it), marked for every later run
            why = (f"it differs from eager by {difference:.1e} of a layer's largest value, more than "
                   f"{self.tolerance:.0e}")
            reject(path, why)
            return self._eager(f"its package {path.name} failed the check against eager: {why}", inputs)
        log.info("%s the compiled forward in %.1f s (AOTInductor package %s, %.0f MB); it differs from eager by %.1e "
                 "at most.", how.capitalize(), seconds, path, path.stat().st_size / 1e6, difference)
        self._forward = forward
        self.result = Compiled(True, seconds, f"yes: AOTInductor package {path.name}, {how} in {seconds:.1f} s (the "
                                              "first batch included)")
        return got

    def _found_for_graph(self, graph: str, inputs: torch.Tensor) -> tuple | None:
        """(forward, its package, the batch's outputs, their difference from eager) from the package an earlier
        export of this graph made, when it is there, was not rejected, and passes the check; else None (a failing
        one's name is forgotten, and the graph is exported again)."""
        path = found_for_graph(self.cache, graph)
        if path is None or rejected(path) is not None:
            return None
        forward = load(path)
        got = forward(inputs)
        difference = self._difference(got, inputs)
        if not difference <= self.tolerance:
            log.info("--compile: the package %s found for this graph differs from eager by %.1e; exporting the graph "
                     "again.", path.name, difference)
            forget_for_graph(self.cache, graph)
            return None
        log.debug("--compile: package %s found for this traced graph: no export.", path.name)
        return forward, path, got, difference

    def _difference(self, got: dict[str, torch.Tensor], inputs: torch.Tensor) -> float:
        """How far GOT's first two rows are from eager's, relative to each layer's largest value."""
        return relative_difference({name: values[:2] for name, values in got.items()}, self.graph(inputs[:2]))

    def _eager(self, why: str, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        self._forward = self.graph
        self.result = _eager(why)
        return self.graph(inputs)


def compiled_note(forward: CompiledForward | None, asked: bool) -> str:
    """What the output's `compiled` attribute says of this run."""
    if forward is not None:
        return forward.result.note
    return f"no: {NOT_TRACED}" if asked else "no"


def relative_difference(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """The largest |GOT - EXPECTED| over the layer's largest |EXPECTED|, across layers (inf if they disagree in
    layers or shapes)."""
    if got.keys() != expected.keys() or any(got[name].shape != expected[name].shape for name in got):
        return float("inf")
    differences = [float((got[name].float() - expected[name].float()).abs().max()) /
                   max(float(expected[name].float().abs().max()), 1e-12) for name in got if expected[name].numel()]
    return max(differences, default=0.0)


def _eager(why: str) -> Compiled:
    log.info("--compile: running eager, %s.", why)
    return Compiled(False, 0.0, f"no: {why}")


_COMPILED = (".so", ".cubin", ".hsaco")  # a C++ compiler's or triton's output (the wrapper .py is rewritten per run)


def _entries(folder: Path) -> int:
    """How many compiled kernels the cache folder holds."""
    return sum(name.endswith(_COMPILED) for _, _, files in os.walk(folder) for name in files)


def _cache_use(new_kernels: int) -> str:
    """A cache that gained no kernel served every one (warm); else how many the compile built."""
    return "warm, no kernel compiled anew" if new_kernels <= 0 else f"{new_kernels} kernels compiled into it"
