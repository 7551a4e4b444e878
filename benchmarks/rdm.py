"""The RDM of a wide layer from disk: `featdump rdm` against reading the layer once and against one X @ X.T in
torch of the same data in memory, and rsatoolbox's calc_rdm where it fits in memory.

    python -m benchmarks.rdm [--images 2048] [--rounds 1] [--rsatoolbox-images 512]

resnet50 (random weights) layer1 (256 x 56 x 56 = 802,816 features, float32) over ImageNet-size JPEGs
(benchmarks/data), extracted once with featdump and kept in benchmarks/data. Each timed step runs in its own
process (its peak RSS reported); the page cache is dropped before each when this user may (else the reads are
warm, and the table says so). Target: `featdump rdm` within 1.3x of the larger of the read and the product.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common import drop_caches, make_images, timed_featdump

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


STEP = r"""
import resource, sys, time
import h5py, numpy as np, torch
step, path, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
started = time.perf_counter()
with h5py.File(path, "r") as f:
    data = f["features/layer1"]
    if step == "read":  # every byte once, a chunk at a time, kept nowhere
        for start in range(0, rows, 16):
            data[start:start + 16]
    else:
        x = np.empty((rows, int(np.prod(data.shape[1:]))), dtype=np.float32)
        for start in range(0, rows, 64):
            x[start:start + 64] = data[start:start + 64].reshape(min(64, rows - start), -1)
        read = time.perf_counter() - started
        started = time.perf_counter()
        if step == "matmul":
            torch.from_numpy(x) @ torch.from_numpy(x).T
        else:
            from rsatoolbox.data import Dataset
            from rsatoolbox.rdm import calc_rdm
            calc_rdm(Dataset(x), method="correlation")
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""

MEASURE_FEATDUMP = r"""
import resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run([sys.executable, "-m", "featdump", *sys.argv[1:]], capture_output=True, text=True)
assert done.returncode == 0, done.stderr
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
"""


def run_step(*arguments) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, *map(str, arguments)], capture_output=True, text=True, env=env)
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    seconds, peak = result.stdout.split()[-2:]
    return float(seconds), float(peak)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rsatoolbox-images", type=int, default=512, help="rows given to rsatoolbox (0: none)")
    arguments = parser.parse_args()
    images = make_images(HERE / "data" / "images", arguments.images)
    output = HERE / "data" / f"rdm-resnet50-layer1-{arguments.images}.h5"
    if not output.exists():
        seconds, _ = timed_featdump("-q", "extract", "-m", "resnet50", "-w", "none", "-l", "layer1", images, output,
                                    what="the extraction")
        print(f"extracted resnet50 layer1 of {arguments.images} images in {seconds:.0f} s "
              f"({output.stat().st_size / 1e9:.2f} GB)")
    rows = arguments.images
    cold = True
    table: dict[str, list[tuple[float, float]]] = {}
    for _ in range(arguments.rounds):
        for name in ("read the layer once", "X @ X.T in memory (torch, float32)", "featdump rdm (1GB)",
                     "featdump rdm (4GB)"):
            cold = drop_caches() and cold
            if name.startswith("read"):
                result = run_step("-c", STEP, "read", output, rows)
            elif name.startswith("X @"):
                result = run_step("-c", STEP, "matmul", output, rows)
            else:
                memory = name.split("(")[1].rstrip(")")
                result = run_step("-c", MEASURE_FEATDUMP, "-q", "rdm", output, "-l", "layer1", "--memory", memory,
                                  "--device", "cpu", "-o", HERE / "data" / "rdm.h5", "--overwrite")
            table.setdefault(name, []).append(result)
        if arguments.rsatoolbox_images:
            cold = drop_caches() and cold
            table.setdefault(f"rsatoolbox calc_rdm, {arguments.rsatoolbox_images} rows in memory", []).append(
                run_step("-c", STEP, "rsatoolbox", output, arguments.rsatoolbox_images))
    (HERE / "data" / "rdm.h5").unlink(missing_ok=True)
    print(f"\nresnet50 layer1 (802,816 features) x {rows} images, float32, {output.stat().st_size / 1e9:.2f} GB; "
          f"page cache {'dropped before each step' if cold else 'warm (could not drop it)'}; "
          f"{arguments.rounds} round(s), best:\n")
    print("| step | seconds | peak RSS (MiB) |")
    print("| --- | ---: | ---: |")
    for name, results in table.items():
        seconds, peak = min(results)
        print(f"| {name} | {seconds:.1f} | {peak:.0f} |")
    limit = max(min(table["read the layer once"])[0], min(table["X @ X.T in memory (torch, float32)"])[0])
    for name in ("featdump rdm (1GB)", "featdump rdm (4GB)"):
        print(f"\n{name}: {min(table[name])[0] / limit:.2f}x the larger of the read and the product (target <= 1.3x)")


if __name__ == "__main__":
    main()
