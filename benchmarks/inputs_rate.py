"""Images a second from an HDF5 brick and from Parquet shards against the same images as JPEG files in a folder.

    python -m benchmarks.inputs_rate [--images 512] [--repeats 3]

NSD-sized images (425 x 425 x 3): the folder holds them as JPEG files; the brick (nsd_stimuli.hdf5:imgBrick) their
decoded pixels, so no JPEG is decoded; the Parquet dataset (Hugging Face's layout, 4 shards) the same JPEG bytes.
Each source goes through a whole `featdump extract` (resnet18 conv1 --reduce avgpool: a forward far cheaper than
the reading, so the reader is what is measured), default workers and batch size, in rounds (each round runs all
three back to back); the median of the rounds.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]


def make_sources(work: Path, count: int) -> dict[str, Path]:
    """The same COUNT images as a JPEG folder, an HDF5 brick of their decoded pixels, and 4 Parquet shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    folder, blobs = work / "jpegs", []
    folder.mkdir(parents=True)
    with h5py.File(work / "nsd_stimuli.hdf5", "w") as h5file:
        brick = h5file.create_dataset("imgBrick", (count, 425, 425, 3), np.uint8, chunks=(1, 425, 425, 3))
        for index in range(count):
            small = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).resize((425, 425))
            noisy = np.clip(np.asarray(small, dtype=np.int16) + rng.integers(-10, 10, (425, 425, 3)), 0, 255)
            image = Image.fromarray(noisy.astype(np.uint8))
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=90)
            blobs.append(buffer.getvalue())
            (folder / f"{index:05d}.jpg").write_bytes(blobs[-1])
            brick[index] = np.asarray(Image.open(io.BytesIO(blobs[-1])).convert("RGB"))  # the JPEG's own pixels
    (work / "parquet").mkdir()
    per = -(-count // 4)
    for shard in range(4):
        rows = range(shard * per, min(count, (shard + 1) * per))
        table = pa.table({"image": [{"bytes": blobs[row], "path": f"{row:05d}.jpg"} for row in rows],
                          "label": [0] * len(rows)})
        pq.write_table(table, work / "parquet" / f"train-{shard:05d}-of-00004.parquet", row_group_size=100)
    return {"JPEG folder": folder, "HDF5 brick (pixels)": work / "nsd_stimuli.hdf5", "Parquet (JPEG bytes)":
            work / "parquet"}


def seconds_of(source: Path, output: Path) -> float:
    command = [sys.executable, "-m", "featdump", "extract", "-m", "resnet18", "-w", "none", "-l", "conv1",
               "--reduce", "avgpool", "--overwrite", str(source), str(output)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="featdump-inputs-"))
    sources = make_sources(work, args.images)
    times: dict[str, list[float]] = {name: [] for name in sources}
    for _ in range(args.repeats):
        for name, source in sources.items():
            times[name].append(seconds_of(source, work / "out.h5"))
    print(f"{args.images} images of 425 x 425, resnet18 conv1 --reduce avgpool, default workers and batch, "
          f"median of {args.repeats} rounds (whole command)\n")
    print("| source | s | img/s | against the folder |")
    print("| --- | ---: | ---: | ---: |")
    folder = statistics.median(times["JPEG folder"])
    for name, measured in times.items():
        median = statistics.median(measured)
        print(f"| {name} | {median:.1f} | {args.images / median:.0f} | {folder / median:.2f}x |")
    print(json.dumps({name: statistics.median(measured) for name, measured in times.items()}))


if __name__ == "__main__":
    main()
