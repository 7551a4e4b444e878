"""A folder's listing walked against the listing an earlier command kept (`featdump.inputs.listings`): FILES empty
image files in folders of 1,000, last changed an hour ago; each listing in its own process, its wall and CPU
seconds, after the kernel's caches are dropped where this user may (root: `/proc/sys/vm/drop_caches`), else warm.

    python -m benchmarks.listing [--files 100000] [--repeats 3] [--write-results]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, drop_caches, machine, write_section

_LIST = """
import sys, time
from pathlib import Path
from featdump.inputs.folder import read_folder
wall, cpu = time.perf_counter(), time.process_time()
found = read_folder(Path(sys.argv[1]), fresh=sys.argv[2] == "walked")
print(len(found.paths), time.perf_counter() - wall, time.process_time() - cpu)
"""


def folder_of(root: Path, files: int) -> Path:
    """FILES empty .png files under ROOT/set, 1,000 a folder, every folder's time an hour back."""
    for index in range(files):
        folder = root / "set" / f"{index // 1000:04d}"
        if index % 1000 == 0:
            folder.mkdir(parents=True)
        (folder / f"{index:07d}.png").touch()
    then = time.time() - 3600
    for folder in [root / "set", *(root / "set").iterdir()]:
        os.utime(folder, (then, then))
    return root / "set"


def listed(folder: Path, how: str, env: dict) -> tuple[int, float, float, bool]:
    cold = drop_caches()
    done = subprocess.run([sys.executable, "-c", _LIST, str(folder), how], capture_output=True, text=True, env=env,
                          check=True)
    count, wall, cpu = done.stdout.split()
    return int(count), float(wall), float(cpu), cold


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write-results", action="store_true")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = folder_of(Path(scratch), options.files)
        env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(Path(scratch) / "cache")}
        listed(folder, "walked", env)  # keeps the listing the next ones take
        rows = []
        for how in ("walked", "kept"):
            runs = [listed(folder, how, env) for _ in range(options.repeats)]
            cold = "cold" if all(run[3] for run in runs) else "warm"
            walls, cpus = sorted(run[1] for run in runs), sorted(run[2] for run in runs)
            rows.append(f"| {how} ({cold} caches) | {runs[0][0]:,} | {walls[len(walls) // 2]:.2f} | "
                        f"{cpus[len(cpus) // 2]:.2f} |")
    lines = [f"Machine: {machine()}", f"`python -m benchmarks.listing --files {options.files}`: a folder of "
             f"{options.files:,} files in folders of 1,000, each listing in its own process, the median of "
             f"{options.repeats}.", "", "| listing | images | wall s | CPU s |", "| --- | ---: | ---: | ---: |", *rows]
    print("\n".join(lines))
    if options.write_results:
        write_section("listing", "\n".join(lines))


if __name__ == "__main__":
    main()
