"""Tar shards against a folder: img/s of the same JPEGs read loose and from tars, and the start-up cost of listing.

    python -m benchmarks.tars [--images 4096] [--tars 16] [--members 100000] [--repeats 2]

1. --images ImageNet-size JPEGs (500x375, benchmarks/data) as a folder and packed in sorted order into --tars
   webdataset-style tars (KEY.jpg + KEY.cls); resnet18 `avgpool`, random weights, the default workers and batch
   size, each run a whole `featdump extract` command in its own process, folder and tars alternating. img/s is
   the images over the command's wall time; the rows of the two outputs are compared (they must be equal).
2. Listing (what a job does before its first batch): --members tiny members in 100 tars against as many tiny
   files in 100 folders, `featdump.inputs.find_images` timed on each (page cache warm: the second of two calls).
Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from benchmarks.common import make_images, timed_featdump
from featdump.inputs import find_images

HERE = Path(__file__).resolve().parent
REPO = HERE.parent



def add_member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def pack(folder: Path, shards: Path, count: int) -> Path:
    """FOLDER's images in sorted order into COUNT tars (made once); returns the brace pattern naming them."""
    images = find_images(folder)
    shards.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        path = shards / f"{index:05d}.tar"
        if path.exists():
            continue
        with tarfile.open(str(path) + ".tmp", "w") as archive:
            for position in range(index * len(images) // count, (index + 1) * len(images) // count):
                relative = images.paths[position]
                add_member(archive, relative, (folder / relative).read_bytes())
                add_member(archive, relative.rsplit(".", 1)[0] + ".cls", f"{images.labels[position]}".encode())
        os.replace(str(path) + ".tmp", path)
    return shards / f"{{00000..{count - 1:05d}}}.tar"


def extract(images: Path | str, output: Path) -> dict:
    seconds, log = timed_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "--overwrite", images,
                                  output, what=str(images))
    count = int(re.search(r"Wrote (\d+) images", log)[1])
    return {"seconds": seconds, "rate": count / seconds, "count": count}


def throughput(count: int, tars: int, repeats: int) -> list[str]:
    folder = make_images(HERE / "data" / f"images-{count}", count)
    pattern = pack(folder, HERE / "data" / f"tars-{count}-{tars}", tars)
    runs = {"folder": [], "tars": []}
    with tempfile.TemporaryDirectory(dir=HERE / "data") as scratch:
        for _ in range(repeats):
            for name, images in (("folder", folder), ("tars", pattern)):
                runs[name].append(extract(images, Path(scratch) / f"{name}.h5"))
        with h5py.File(Path(scratch) / "folder.h5") as loose, h5py.File(Path(scratch) / "tars.h5") as packed:
            same = np.array_equal(loose["features/avgpool"][:], packed["features/avgpool"][:])
            paths = [p.split("/", 1)[1] for p in packed["paths"].asstr()[:]] == list(loose["paths"].asstr()[:])
    lines = [f"{count} JPEGs 500x375, resnet18 avgpool, default workers and batch size, {repeats} runs each "
             f"(rows equal: {same and paths})", "",
             "| input | img/s (median) | seconds (median) | runs (img/s) |", "|---|---|---|---|"]
    for name, results in runs.items():
        rates = [result["rate"] for result in results]
        lines.append(f"| {name if name == 'folder' else f'{tars} tars'} | {statistics.median(rates):.1f} | "
                     f"{statistics.median(r['seconds'] for r in results):.1f} | "
                     f"{', '.join(f'{rate:.1f}' for rate in rates)} |")
    return lines


def listing(members: int) -> list[str]:
    root = HERE / "data" / f"listing-{members}"
    files, tars = root / "files", root / "tars"
    per_group = members // 100
    if not (root / "done").exists():
        for group in range(100):
            (files / f"{group:03d}").mkdir(parents=True, exist_ok=True)
            tars.mkdir(parents=True, exist_ok=True)
            with tarfile.open(tars / f"{group:05d}.tar", "w") as archive:
                for index in range(per_group):
                    data = b"x" * 100
                    (files / f"{group:03d}" / f"{index:06d}.jpg").write_bytes(data)
                    add_member(archive, f"{index:06d}.jpg", data)
                    add_member(archive, f"{index:06d}.cls", b"3")
        (root / "done").touch()
    seconds = {}
    for name, source in (("folder", files), ("tars", tars / "*.tar")):
        find_images(source)  # warm the page cache
        started = time.perf_counter()
        found = find_images(source)
        seconds[name] = time.perf_counter() - started
        assert len(found) == 100 * per_group
    return [f"Listing {100 * per_group} images (warm page cache)", "", "| input | seconds | images/s listed |",
            "|---|---|---|",
            f"| {100 * per_group} files in 100 folders | {seconds['folder']:.2f} | "
            f"{100 * per_group / seconds['folder']:,.0f} |",
            f"| {100 * per_group} members (+ as many .cls) in 100 tars | {seconds['tars']:.2f} | "
            f"{100 * per_group / seconds['tars']:,.0f} |"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--tars", type=int, default=16)
    parser.add_argument("--members", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    print("\n".join(listing(args.members)), flush=True)
    if not args.skip_throughput:
        print()
        print("\n".join(throughput(args.images, args.tars, args.repeats)))


if __name__ == "__main__":
    main()
