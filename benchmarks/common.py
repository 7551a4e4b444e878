"""What the benchmarks share: the folders (this package's `data/` cache), ImageNet-sized JPEGs made once, a
featdump command timed in its own process, the machine in one line, and the writing of one benchmark's own section
of `RESULTS.md` (between its markers: the rest of the file, written by hand, is never touched)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = HERE / "data"
RESULTS = HERE / "RESULTS.md"


def make_images(folder: Path, count: int, contrast: float = 0.0, seed: int = 0) -> Path:
    """COUNT ImageNet-sized (500x375) JPEGs in 10 class folders, made once and reused. CONTRAST > 0: each image at
    its own contrast, a gain of e^N(0, CONTRAST) about mid-grey (as photos differ)."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        path = folder / f"class_{index % 10}" / f"{index:06d}.jpg"
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        small = Image.fromarray(rng.integers(0, 256, size=(12, 16, 3), dtype=np.uint8)).resize((500, 375))
        gain = np.exp(contrast * rng.standard_normal()) if contrast else 1.0
        noise = rng.integers(-12, 12, size=(375, 500, 3))
        pixels = 128 + gain * (np.asarray(small, dtype=np.float64) - 128 + noise)
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, quality=90)
    return folder


def timed_featdump(*arguments: str, what: str) -> tuple[float, str]:
    """`python -m featdump ARGUMENTS` in its own process: (wall seconds, its stderr); exits naming WHAT if it fails."""
    command = [sys.executable, "-m", "featdump", *map(str, arguments)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if result.returncode:
        raise SystemExit(f"{what} failed:\n{result.stderr[-3000:]}")
    return seconds, result.stderr


# One child measured from a fresh parent, so that no other child's usage is counted.
_MEASURE = """
import resource, subprocess, sys
done = subprocess.run([sys.executable, "-m", "featdump", *sys.argv[1:]], capture_output=True, text=True)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(done.returncode, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)
sys.stderr.write(done.stderr)
"""


def measured(args: list[str], env: dict | None = None, checkout: Path = REPO, check: bool = True
             ) -> tuple[float, float, str]:
    """(CPU seconds: user + system, peak RSS in MiB, its stderr) of one `python -m featdump ARGS` in its own
    process, CHECKOUT's featdump (run from its root), as the kernel counts them (`getrusage` of the child). CHECK:
    exit naming the command when it fails."""
    env = env or {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", _MEASURE, *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=checkout, check=True)
    code, seconds, kib = done.stdout.split()
    if check and int(code):
        raise SystemExit(f"featdump {' '.join(map(str, args))} failed:\n{done.stderr[-3000:]}")
    return float(seconds), int(kib) / 1024, done.stderr


def drop_caches() -> bool:
    """Drop the kernel's page, dentry and inode caches (root only): whether it could."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def benchmark(name: str) -> list[str]:
    """`python -m benchmarks.NAME`: the command that runs benchmark NAME (from the repository's root)."""
    return [sys.executable, "-m", f"benchmarks.{name}"]


def machine() -> str:
    """The machine in one line: its CPU (name, the instruction set PyTorch's kernels use, its native precisions,
    any lower set oneDNN is held to), cores, GPU and the versions. Every figure is read beside it: a CPU without
    native bf16 runs bf16 4-12x slower, and inductor's code differs by instruction set."""
    import torch
    import torchvision

    from featdump.forward.hardware import cpu

    here = cpu()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.machine()} {here.name} ({here.instruction_set}), {os.cpu_count()} cores, {gpu}; Python "
            f"{platform.python_version()}, torch {torch.__version__}, torchvision {torchvision.__version__}")


def write_section(name: str, text: str, results: Path = RESULTS) -> None:
    """TEXT as benchmark NAME's own section of RESULTS, between its markers (placed after the title the first
    time); every other line of the file stays as it is."""
    begin, end = f"<!-- {name}: begin (written by `python -m benchmarks.{name}`) -->", f"<!-- {name}: end -->"
    current = results.read_text() if results.exists() else "# Benchmark results\n"
    section = f"{begin}\n{text.rstrip()}\n{end}"
    if begin in current and end in current:
        before, rest = current.split(begin, 1)
        updated = before + section + rest.split(end, 1)[1]
    else:
        title, _, rest = current.partition("\n")
        updated = f"{title}\n\n{section}\n{rest}"
    results.write_text(updated)
