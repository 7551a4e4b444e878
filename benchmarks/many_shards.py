"""Many shards: the merge of 100, 1,000 and 10,000 finished shards, and reads through the merged view.

    python -m benchmarks.many_shards [--counts 100,1000,10000] [--per-shard 2] [--store]

The shards are made in-process by featdump's own extract (`--shard K/N`) with a tiny model (a factory: a strided
convolution, 16 outputs) over a labelled CSV list naming PER-SHARD x N small PNGs (four files over and over), once,
kept under benchmarks/data/many-shards/N. Then, each step in its own process under `ulimit -n 1024` (the default
soft limit): `featdump merge --view` (virtual datasets) and `merge --copy` (what `merge` makes of such small
shards by itself), their time, peak RSS and the most files open
at once (sampled from /proc/PID/fd); then reads of the merged view and of the copy: `featdump.load`, a
FeatureDataset epoch, `probe`, `rdm`, the view's rate as a fraction of the copy's. --store: the shards uploaded
to a SeaweedFS server on loopback and merged from there (`featdump merge s3://...`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = HERE / "data" / "many-shards"
TINY = '''import torch
from torch import nn
from torchvision import transforms


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                         nn.Linear(32, 16))


def preprocess():
    return transforms.Compose([transforms.Resize((16, 16)), transforms.ToTensor()])
'''
OPEN_FILES = 1024


def make_shards(count: int, per_shard: int) -> Path:
    """COUNT finished shards of one job (kept: made once), each of PER_SHARD images; returns the output's path."""
    import numpy as np
    from PIL import Image

    folder = DATA / str(count)
    output = folder / "out.h5"
    done = folder / "made"
    if done.exists():
        return output
    pictures = DATA / "pictures"
    pictures.mkdir(parents=True, exist_ok=True)
    os.chdir(DATA)  # featdump imports a factory from the current folder
    (DATA / "tinynet.py").write_text(TINY)
    for index in range(4):
        pixels = np.random.default_rng(index).integers(0, 255, (16, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(pictures / f"{index}.png")
    folder.mkdir(parents=True, exist_ok=True)
    listing = folder / "images.csv"  # labels for the probe: the picture's parity
    listing.write_text("path,label\n" + "\n".join(f"../pictures/{index % 4}.png,{index % 2}"
                                                    for index in range(per_shard * count)))
    from featdump.job.settings import Settings
    from featdump.job.staging import extract

    started = time.perf_counter()
    for index in range(count):
        extract(Settings(model="tinynet:build", transform="tinynet:preprocess", layers=("1", "4"), images=listing,
                         output=output, shard=f"{index}/{count}", num_workers=0, proof=0))
        if index % 500 == 499:
            print(f"  {index + 1} of {count} shards made, {time.perf_counter() - started:.0f} s", flush=True)
    done.write_text(f"{time.perf_counter() - started:.1f}")
    return output


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def measured(command: list[str], cwd: Path | None = None, env: dict | None = None) -> dict:
    """COMMAND in its own process under ulimit -n 1024: seconds, peak RSS (MiB), the most files it held open."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=limited, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    most, peak = [0], [0]

    def sample() -> None:
        while process.poll() is None:
            try:
                most[0] = max(most[0], len(os.listdir(f"/proc/{process.pid}/fd")))
                status = Path(f"/proc/{process.pid}/status").read_text()
                peak[0] = max(peak[0], int(status.split("VmHWM:")[1].split()[0]))  # its peak RSS so far, KiB
            except (OSError, IndexError):
                pass
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    seconds = time.perf_counter() - started
    sampler.join()
    if process.returncode:
        return {"failed": err.strip().splitlines()[-1] if err.strip() else f"exit {process.returncode}",
                "seconds": seconds}
    return {"seconds": seconds, "peak_mib": peak[0] / 1024, "open_files": most[0], "out": out.strip()}


READ = '''
import sys, time, json
import numpy as np
import featdump
path = sys.argv[1]
timings = {}
started = time.perf_counter()
data = featdump.load(path, "4")
timings["load"] = time.perf_counter() - started
rows = len(data.features)
started = time.perf_counter()
seen = 0
for batch in featdump.FeatureDataset(path, "4", batch_size=256, seed=0):
    seen += len(batch["row"])
timings["dataset epoch"] = time.perf_counter() - started
assert seen == rows, (seen, rows)
started = time.perf_counter()
featdump.rdm(path, layers=["4"])
timings["rdm"] = time.perf_counter() - started
started = time.perf_counter()
featdump.probe(path, layers=["4"])
timings["probe"] = time.perf_counter() - started
print(json.dumps({"rows": rows, **timings}))
'''


def featdump_command(*arguments) -> list[str]:
    return [sys.executable, "-m", "featdump", *map(str, arguments)]


def reads(path: Path) -> dict:
    found = measured([sys.executable, "-c", READ, str(path)])
    if "failed" in found:
        return found
    return {**json.loads(found.pop("out")), **found}


def store_merge(output: Path, count: int) -> dict:
    """The shards uploaded to a SeaweedFS server on loopback, then `featdump merge s3://...` timed."""
    from tests.makers.seaweed import SeaweedFS

    server = SeaweedFS(DATA / f"seaweed-{count}")
    server.start()
    try:
        fs = server.client()
        if not fs.exists("many"):
            fs.mkdir("many")
        shards = sorted(output.parent.glob("out.shard-*-of-*.h5"))
        fs.put([str(path) for path in shards], [f"many/{count}/{path.name}" for path in shards])
        result = measured(featdump_command("merge", "--scratch", DATA / "scratch", f"s3://many/{count}/out.h5"),
                          env=server.env)
    finally:
        server.stop()
        shutil.rmtree(DATA / f"seaweed-{count}", ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="100,1000,10000")
    parser.add_argument("--per-shard", type=int, default=2)
    parser.add_argument("--store", action="store_true")
    args = parser.parse_args()
    rows = []
    for count in (int(text) for text in args.counts.split(",")):
        output = make_shards(count, args.per_shard)
        made = float((output.parent / "made").read_text())
        view = measured(featdump_command("merge", "--view", "--overwrite", output))  # the default copies these
        copy_path = output.with_name("copy.h5")
        for shard in output.parent.glob("out.shard-*"):  # the copy needs its own shard names: link them
            target = output.parent / shard.name.replace("out.", "copy.", 1)
            if not target.exists():
                os.link(shard, target)
        copy = measured(featdump_command("merge", "--copy", "--overwrite", copy_path))
        view_reads, copy_reads = reads(output), reads(copy_path)
        result = {"shards": count, "made_s": made, "merge": view, "merge --copy": copy, "view reads": view_reads,
                  "copy reads": copy_reads}
        if args.store:
            result["merge from the store"] = store_merge(output, count)
        rows.append(result)
        print(json.dumps(result), flush=True)
    (DATA / "results.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
