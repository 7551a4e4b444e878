"""A merged view's read rate against one file of the same rows, by the size of a shard.

    python -m benchmarks.view_rate [--images 256] [--layer layer1] [--counts 256,64,16,12,4]

The same job (resnet18 with random weights over ImageNet-size JPEGs, one layer: `layer1` stores 784 KiB a row) is
cut into N shards for each N (made in-process, in a warm worker as a Ray worker makes them), merged twice: `merge
--view` and `merge --copy`. Each is then read whole by `featdump.load` and by a shuffled `FeatureDataset` epoch
(0 workers), warm (the files just written are in the page cache), best of three; the view's rate is the copy's time
over the view's. `merge` copies shards under VIEW_FROM_BYTES by itself: this is where that figure comes from.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from benchmarks.common import make_images

HERE = Path(__file__).resolve().parent
REPO = HERE.parent



def make_shards(images: Path, folder: Path, layer: str, count: int) -> Path:
    from featdump.job import staging, warm
    from featdump.job.settings import Settings

    output = folder / "out.h5"
    if not (folder / "made").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        with warm.kept_warm():
            for index in range(count):
                staging.extract(Settings(model="resnet18", weights="none", layers=(layer,), images=images,
                                         output=output, shard=f"{index}/{count}", proof=0))
        (folder / "made").write_text("")
    return output


def best_of(read, times: int = 3) -> float:
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        read()
        seconds.append(time.perf_counter() - started)
    return min(seconds)


def epoch(path: Path, layer: str) -> None:
    import featdump

    for _ in featdump.FeatureDataset(path, layer, batch_size=64, shuffle=True):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--layer", default="layer1")
    parser.add_argument("--counts", default="256,64,16,12,4")
    args = parser.parse_args()
    import featdump
    from featdump.output.merge import merge

    images = make_images(HERE / "data" / f"photos-{args.images}", args.images)
    print("| shards | a shard's file | `load`: view | one file | view's rate | epoch: view | one file | view's rate |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for count in (int(text) for text in args.counts.split(",")):
        folder = HERE / "data" / "view-rate" / str(count)
        output = make_shards(images, folder, args.layer, count)
        copy = output.with_name("copy.h5")
        for shard in folder.glob("out.shard-*"):
            target = folder / shard.name.replace("out.", "copy.", 1)
            if not target.exists():
                target.hardlink_to(shard)
        merge(output, copy=False, overwrite=True)
        merge(copy, copy=True, overwrite=True)
        load = [best_of(lambda path=path: featdump.load(path, args.layer)) for path in (output, copy)]
        epochs = [best_of(lambda path=path: epoch(path, args.layer)) for path in (output, copy)]
        size = sum(path.stat().st_size for path in folder.glob("out.shard-*")) / count / 2**20
        print(f"| {count} | {size:.1f} MiB | {load[0]:.2f} s | {load[1]:.2f} s | {load[1] / load[0]:.2f}x | "
              f"{epochs[0]:.2f} s | {epochs[1]:.2f} s | {epochs[1] / epochs[0]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
