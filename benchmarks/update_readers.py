"""Readers during --update: how many reads of the output are refused while new images are added, and how long
the final commit (the only time the output is open for writing) lasts.

    python -m benchmarks.update_readers [--base 128] [--new 128] [--layers avgpool]

A finished output of BASE ImageNet-size JPEGs (resnet18, random weights, the default workers and batch size);
then NEW more are added with --update while another process reads the output in a loop with plain h5py and
featdump.load (one read every 20 ms). Prints the reads that succeeded and failed, and the final commit's length.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import make_images

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


READER = """
import json, os, sys, time
import h5py
import featdump

path, stop, layer = sys.argv[1], sys.argv[2], sys.argv[3]
reads = []
while not os.path.exists(stop):
    started = time.time()
    try:
        with h5py.File(path, "r") as f:
            rows = int(f.attrs["committed"][0])
        featdump.load(path, layer)
        reads.append([started, rows, None])
    except Exception as error:
        reads.append([started, None, type(error).__name__])
    time.sleep(0.02)
print(json.dumps(reads))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--layers", default="avgpool")
    args = parser.parse_args()
    work = HERE / "data" / "update_readers"
    shutil.rmtree(work, ignore_errors=True)
    pool = make_images(HERE / "data" / "images", args.base + args.new)
    images = work / "images"
    files = sorted(pool.rglob("*.jpg"))
    for path in files[:args.base]:
        (images / path.parent.name).mkdir(parents=True, exist_ok=True)
        os.link(path, images / path.parent.name / path.name)
    output, stop = work / "out.h5", work / "stop"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "featdump", "extract", "-m", "resnet18", "-w", "none", "-l", args.layers,
               "--update", str(images), str(output)]
    subprocess.run(command, check=True, env=env, capture_output=True)
    for path in files[args.base:args.base + args.new]:
        (images / path.parent.name).mkdir(parents=True, exist_ok=True)
        os.link(path, images / path.parent.name / path.name)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(output), str(stop), args.layers.split(",")[0]],
                              stdout=subprocess.PIPE, text=True, env=env)
    time.sleep(2.0)  # the reader has imported featdump and reads
    started = time.time()
    update = subprocess.run(command, env=env, capture_output=True, text=True)
    ended = time.time()
    stop.touch()
    reads = [read for read in json.loads(reader.communicate()[0]) if started <= read[0] <= ended]
    if update.returncode != 0:
        sys.exit(update.stderr)
    commit = float(re.search(r"Final commit: \d+ rows appended to .* in ([0-9.]+) s", update.stderr)[1])
    refused = [read for read in reads if read[2] is not None]
    print(f"--update of {args.new} new images onto {args.base} ({args.layers}): {ended - started:.1f} s in all")
    print(f"reads during the update: {len(reads)}, refused: {len(refused)} "
          f"({', '.join(sorted({read[2] for read in refused})) or 'none'})")
    print(f"final commit: {commit:.3f} s for {args.new} rows ({args.new / commit:.0f} rows per second of lock)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
