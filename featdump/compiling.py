"""Compiling (--compile): torch.compile of the forward a capture runs (its pruned graph), checked once against
eager on a full batch, falling back to eager with one log line when it cannot compile; and the compile cache a
cluster can share (--compile-cache: torch inductor's and triton's caches in one folder).

Shapes are static: the runner pads a short batch to the batch size, so a run compiles once.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from featdump.device import autocast
from featdump.graph import same_outputs
from featdump.hooks import Capture

log = logging.getLogger("featdump")


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


def compile_capture(capture: Capture, example: torch.Tensor, precision: str, cache: Path | None) -> Compiled:
    """Make CAPTURE run its graph compiled, if it compiles and gives eager's outputs on EXAMPLE (a full batch, made
    like the real inputs: outside inference mode, in the model's memory format); else leave it eager."""
    if capture.strategy != "graph":
        return _eager("the model does not trace to a graph (featdump compiles the traced, pruned graph; "
                      "hooks are not compiled)")
    folder = use_cache(cache)
    if example.device.type == "cpu":  # "No CUDA runtime is found": true, and no concern of a CPU compile
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from torch._dynamo.utils import counters

    hits, misses = counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
    started = time.perf_counter()
    try:
        compiled = torch.compile(capture.graph, dynamic=False, fullgraph=True)  # all of it, or eager
        with torch.inference_mode(), autocast(precision, example.device):
            got, expected = compiled(example), capture.graph(example)
    except Exception as error:  # compilers fail in many model-specific ways
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return _eager(f"it does not compile ({type(error).__name__}: {first_line[:300]})")
    seconds = time.perf_counter() - started
    if not same_outputs(got, expected):
        return _eager("its compiled outputs differ from eager's beyond 1e-4")
    capture.use_compiled(compiled)
    hits, misses = counters["inductor"]["fxgraph_cache_hit"] - hits, counters["inductor"]["fxgraph_cache_miss"] - misses
    log.info("Compiled the forward in %.1f s (inductor; cache %s: %d hits, %d misses).", seconds, folder, hits, misses)
    return Compiled(True, seconds, f"yes: inductor, {seconds:.1f} s to compile, cache {hits} hits {misses} misses")


def _eager(why: str) -> Compiled:
    log.info("--compile: running eager, %s.", why)
    return Compiled(False, 0.0, f"no: {why}")
