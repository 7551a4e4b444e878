"""The probe's dry forwards, which every extract and list-layers runs before its first batch: seconds per model.

    python -m benchmarks.probe [--repeats 5] [--write-results]

For each model (random weights, eval, on the CPU, at 224 pixels): the whole probe (forwards of 2 and 3 inputs and
one larger, on the meta device), and one forward of 2 inputs on the meta device two ways: featdump's
(`forward/meta.py`: a normalisation answered with its input's shape) and PyTorch's own (every normalisation's
decomposition run in Python). The median of REPEATS, after one run that warms each up.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torchvision.models import get_model

from benchmarks.common import machine, write_section
from featdump.forward.meta import forward_on_meta
from featdump.forward.probe import probe

MODELS = ("resnet18", "resnet50", "efficientnet_b0", "convnext_tiny", "vit_b_16", "swin_t")
SHAPE = (3, 224, 224)


def pytorch_meta_forward(model: torch.nn.Module, shape: tuple[int, ...]) -> None:
    """The meta forward without featdump's answer for normalisations."""
    held = {name: torch.empty_like(tensor, device="meta")
            for name, tensor in (*model.named_parameters(), *model.named_buffers())}
    torch.func.functional_call(model, held, (torch.zeros(shape, device="meta"),), strict=True)


def median_seconds(call, model: torch.nn.Module, shape: tuple[int, ...], repeats: int) -> float:
    """The median seconds of CALL(MODEL, SHAPE) over REPEATS, after one call that warms it up."""
    call(model, shape)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call(model, shape)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write-results", action="store_true")
    options = parser.parse_args()
    lines = [f"Machine: {machine()}. Seconds, the "
             f"median of {options.repeats}.", "",
             "| model | probe | meta forward, featdump | meta forward, PyTorch's own |", "| --- | ---: | ---: | ---: |"]
    torch.manual_seed(0)
    with torch.inference_mode():
        for name in MODELS:
            model = get_model(name, weights=None).eval()
            whole = median_seconds(probe, model, SHAPE, options.repeats)
            ours = median_seconds(forward_on_meta, model, (2, *SHAPE), options.repeats)
            theirs = median_seconds(pytorch_meta_forward, model, (2, *SHAPE), options.repeats)
            lines.append(f"| {name} | {whole:.3f} | {ours:.3f} | {theirs:.3f} |")
            print(lines[-1], flush=True)
    print("\n".join(lines))
    if options.write_results:
        write_section("probe", "\n".join(lines))


if __name__ == "__main__":
    main()
