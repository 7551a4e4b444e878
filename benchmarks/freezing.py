"""The forward alone, eager and compiled with and without inductor's freezing (resnet50, batch 32, channels_last).

    python -m benchmarks.freezing

Each variant in its own process with its own empty cache folder: img/s over 3 forwards after a first one, and
the compiled output's largest difference over eager's largest value. What --compile's choice of freezing on the
CPU rests on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

VARIANT = """
import sys, time, torch, torchvision
import torch._inductor.config as config
variant = sys.argv[1]
torch.manual_seed(0)
model = torchvision.models.resnet50().eval().to(memory_format=torch.channels_last)
x = torch.randn(32, 3, 224, 224).contiguous(memory_format=torch.channels_last)
forward = model if variant == "eager" else torch.compile(model, dynamic=False, fullgraph=True)
with torch.inference_mode(), config.patch(freezing=variant == "compiled, freezing"):
    started = time.perf_counter()
    first = forward(x)
    first_seconds = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(3):
        forward(x)
    rate = 96 / (time.perf_counter() - started)
    difference = float((first - model(x)).abs().max() / model(x).abs().max())
print(f"| {variant} | {rate:.2f} | {first_seconds:.1f} s | {difference:.1e} |")
"""


def main():
    print("| forward | img/s | first call | max rel. diff |\n|---|---|---|---|")
    for variant in ("eager", "compiled", "compiled, freezing"):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            result = subprocess.run([sys.executable, "-c", VARIANT, variant], capture_output=True, text=True, env=env)
            print(result.stdout.strip() or result.stderr[-2000:], flush=True)


if __name__ == "__main__":
    main()
