"""Growing an output by layers: what `--update` costs to add layers to a stored output, against a fresh run of
those layers alone, and how deep its forward goes.

    python -m benchmarks.grow [--images 1024] [--rounds 1]

resnet50 (random weights) over ImageNet-size JPEGs (benchmarks/data), the default workers and batch size, each a
whole `featdump extract` command in its own process:
  1. a stored output holding layer4;
  2. adding layer1,layer2 to it with --update, against a fresh run of -l layer1,layer2 alone (target: <= 1.1x);
  3. adding layer4.0 to an output holding layer1, against a fresh run of -l layer4.0 and one of -l fc (the whole
     forward): the growth's forward stops at layer4.0 when its time is near the layer4.0 run's, not fc's.
Prints a Markdown table; rounds are interleaved.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.common import make_images, timed_featdump

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


BASE = ["-q", "extract", "-m", "resnet50", "-w", "none"]


def run(images: Path, folder: Path, rounds: int) -> list[tuple[str, float]]:
    rows: dict[str, list[float]] = {}

    def timed(name: str, *arguments) -> None:
        seconds, _ = timed_featdump(*BASE, *arguments, what=name)
        rows.setdefault(name, []).append(seconds)

    for round_ in range(rounds):
        for name in ("stored-layer4.h5", "stored-layer1.h5", "fresh.h5", "fresh4.h5", "whole.h5"):
            (folder / name).unlink(missing_ok=True)
        timed_featdump(*BASE, "-l", "layer4", images, folder / "stored-layer4.h5", what="the stored output")
        timed("add layer1,layer2 (--update onto layer4)", "-l", "layer1,layer2", "--update", images,
              folder / "stored-layer4.h5")
        timed("fresh -l layer1,layer2", "-l", "layer1,layer2", images, folder / "fresh.h5")
        (folder / "fresh.h5").unlink()
        timed_featdump(*BASE, "-l", "layer1", images, folder / "stored-layer1.h5", what="the layer1 output")
        timed("add layer4.0 (--update onto layer1)", "-l", "layer4.0", "--update", images,
              folder / "stored-layer1.h5")
        timed("fresh -l layer4.0", "-l", "layer4.0", images, folder / "fresh4.h5")
        timed("fresh -l fc (the whole forward)", "-l", "fc", images, folder / "whole.h5")
        print(f"round {round_ + 1} of {rounds} done", file=sys.stderr)
    return [(name, sorted(times)[len(times) // 2]) for name, times in rows.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    images = make_images(HERE / "data" / "imagenet-size", args.images)
    if len(list(images.rglob("*.jpg"))) != args.images:  # a folder of exactly --images images
        subset = HERE / "data" / f"grow-{args.images}"
        if not subset.exists():
            for path in sorted(images.rglob("*.jpg"))[:args.images]:
                (subset / path.parent.name).mkdir(parents=True, exist_ok=True)
                shutil.copy(path, subset / path.parent.name / path.name)
        images = subset
    with tempfile.TemporaryDirectory(dir=HERE / "data") as folder:
        results = dict(run(images, Path(folder), args.rounds))
    print(f"\n{args.images} images, resnet50, median of {args.rounds} round(s)\n")
    print("| command | seconds | ratio |")
    print("| --- | --- | --- |")
    pairs = {"add layer1,layer2 (--update onto layer4)": "fresh -l layer1,layer2",
             "add layer4.0 (--update onto layer1)": "fresh -l layer4.0"}
    for name, seconds in results.items():
        ratio = f"{seconds / results[pairs[name]]:.2f}x of `{pairs[name]}`" if name in pairs else ""
        print(f"| `{name}` | {seconds:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
