"""The commands that should answer at once: CPU seconds and peak memory of each, in its own process.

    python -m benchmarks.startup [--repeats 5] [--write-results] [--checkout PATH]

`featdump --help`, `featdump extract --help`, `featdump info OUT` and `info --json OUT` of a small finished
output, and three usage errors: a missing IMAGES path, an unknown option, and an unknown torchvision name (after
a first run has kept torchvision's names; that first run is shown apart). Each is `python -m featdump ARGS` as a
user runs it; its CPU time (user + system, the process's own) and peak RSS are read from the kernel
(`getrusage` of the child), the median of REPEATS runs. The aim: 0.5 s of CPU or less on a 2-core Zen 3.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import REPO, machine, measured, write_section
from tests.makers.outputs import write_output


def cases(folder: Path) -> dict[str, list[str]]:
    output = folder / "feats.h5"
    write_output(output, {"layer1": np.ones((64, 16, 8, 8), np.float32), "avgpool": np.ones((64, 16), np.float32)})
    (folder / "images").mkdir()
    return {
        "featdump --help": ["--help"],
        "featdump extract --help": ["extract", "--help"],
        "featdump info OUT": ["info", str(output)],
        "featdump info OUT --json": ["info", "--json", str(output)],
        "extract: IMAGES missing": ["extract", "-m", "resnet18", "-l", "avgpool", str(folder / "none"), "o.h5"],
        "extract: unknown option": ["extract", "--nosuch", str(folder / "images"), "o.h5"],
        "extract: unknown model": ["extract", "-m", "resnet5O", "-l", "avgpool", str(folder / "images"), "o.h5"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--checkout", type=Path, default=REPO,
                        help="Measure the featdump of this checkout (another commit's, for a before and after).")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        env = {**os.environ, "PYTHONPATH": str(options.checkout), "XDG_CACHE_HOME": str(folder / "cache")}
        commands = cases(folder)
        # the first run lists and keeps the names
        first = measured(commands["extract: unknown model"], env, options.checkout, check=False)
        rows = [("extract: unknown model, names not yet kept", first[0], first[0], first[1])]
        for name, args in commands.items():
            runs = [measured(args, env, options.checkout, check=False)[:2] for _ in range(options.repeats)]
            cpu = [seconds for seconds, _ in runs]
            rows.append((name, statistics.median(cpu), max(cpu), max(memory for _, memory in runs)))
    lines = [f"Machine: {machine()}", f"Each the median of {options.repeats} runs (CPU: user + system).", "",
             "| command | CPU s (median) | CPU s (max) | peak RSS MiB |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {name} | {median:.2f} | {worst:.2f} | {memory:.0f} |" for name, median, worst, memory in rows]
    print("\n".join(lines))
    if options.write_results:
        write_section("startup", "\n".join(lines))


if __name__ == "__main__":
    main()
