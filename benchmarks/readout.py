"""Linear read-outs out of core: `featdump probe` and `featdump encode` against reading the layer once, and against
scikit-learn's RidgeClassifierCV / RidgeCV fitted on the same folds where the layer fits in memory.

    python -m benchmarks.readout [--images 2048] [--sklearn-images 512] [--narrow-rows 200000]
                                 [--narrow-features 1024] [--targets 100] [--only wide,small,narrow] [--no-sklearn]

    wide     resnet50 (random weights) `layer1` (802,816 features) of 2,048 JPEGs: 6.6 GB, under --memory 1GB
    small    the same layer of the first 512 images (1.6 GB): featdump against scikit-learn in memory
    narrow   a synthetic layer of 200,000 rows x 1,024 features (0.8 GB, 10 classes), written by featdump's writer:
             featdump's two passes against scikit-learn in memory

The layers are made once and kept in benchmarks/data. Each timed step runs in its own process (its wall time
includes Python's and torch's start, and its peak RSS is reported); the page cache is dropped before each when
this user may. Probes use the file's 10 classes, encodings TARGETS random targets (an .npy in row order); 5 folds,
the default alphas (11, 1e-2 to 1e8). Targets: a wide layer within 1.5x of its read, a narrow one within 2.5x.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.common import make_images, timed_featdump
from benchmarks.rdm import MEASURE_FEATDUMP, drop_caches, run_step

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


READ = r"""
import resource, sys, time
import h5py
path, layer = sys.argv[1], sys.argv[2]
started = time.perf_counter()
with h5py.File(path, "r") as f:
    data = f["features/" + layer]
    rows = int(f.attrs["committed"][0])
    step = max(1, (64 << 20) // (data.dtype.itemsize * max(1, data[0].size)))
    for start in range(0, rows, step):  # every byte once, kept nowhere
        data[start:start + step]
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""

SKLEARN = r"""
import resource, sys, time
started = time.perf_counter()
import h5py, numpy as np
from sklearn.linear_model import RidgeClassifierCV, RidgeCV
from featdump.readout.folds import assign_folds
path, layer, kind = sys.argv[1:4]
alphas = [10.0 ** power for power in range(-2, 9)]
with h5py.File(path, "r") as f:
    rows = int(f.attrs["committed"][0])
    x = f["features/" + layer][:rows].reshape(rows, -1)
    labels = f["labels"][:rows]
fold = assign_folds(rows, 5, 0, labels if kind == "probe" else None)  # featdump's folds (seed 0)
targets = labels if kind == "probe" else np.load(sys.argv[4])
for number in range(int(fold.max()) + 1):
    train, test = fold != number, fold == number
    model = (RidgeClassifierCV if kind == "probe" else RidgeCV)(alphas=alphas).fit(x[train], targets[train])
    (model.decision_function if kind == "probe" else model.predict)(x[test])
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def wide_layer(images: int) -> Path:
    output = HERE / "data" / f"readout-resnet50-layer1-{images}.h5"
    if not output.exists():
        folder = make_images(HERE / "data" / f"readout-images-{images}", images)
        seconds, _ = timed_featdump("-q", "extract", "-m", "resnet50", "-w", "none", "-l", "layer1", folder, output,
                                    what="the extraction")
        print(f"extracted resnet50 layer1 of {images} images in {seconds:.0f} s ({output.stat().st_size / 1e9:.2f} GB)")
    return output


def narrow_layer(rows: int, features: int) -> Path:
    """ROWS synthetic rows of FEATURES (10 classes, a class signal in a few directions), written by featdump."""
    from tests.makers.outputs import write_output

    output = HERE / "data" / f"readout-narrow-{rows}x{features}.h5"
    if not output.exists():
        rng = np.random.default_rng(0)
        labels = rng.integers(0, 10, rows)
        centres = rng.standard_normal((10, features)).astype(np.float32) * 0.3
        values = rng.standard_normal((rows, features), dtype=np.float32) + centres[labels] + 2.0
        write_output(output, {"pooled": values}, batch=4096, labels=labels,
                     classes=[f"class_{index}" for index in range(10)])
        print(f"wrote a narrow layer of {rows} x {features} ({output.stat().st_size / 1e9:.2f} GB)")
    return output


def random_targets(path: Path, count: int) -> Path:
    import h5py

    with h5py.File(path, "r") as h5file:
        rows = int(h5file.attrs["committed"][0])
    targets = path.with_name(path.stem + f"-targets-{count}.npy")
    if not targets.exists():
        np.save(targets, np.random.default_rng(1).standard_normal((rows, count)))
    return targets


def featdump_step(*arguments) -> tuple[float, float]:
    return run_step("-c", MEASURE_FEATDUMP, "-q", *arguments, "--device", "cpu", "--overwrite")


def bench(name: str, path: Path, layer: str, targets: Path, memory: str, sklearn: bool, table: list) -> None:
    results = HERE / "data" / "readout-result.h5"
    steps = [("read the layer once", lambda: run_step("-c", READ, path, layer)),
             (f"featdump probe (--memory {memory})",
              lambda: featdump_step("probe", path, "-l", layer, "--memory", memory, "-o", results)),
             (f"featdump encode, {targets.stem.rsplit('-', 1)[-1]} targets (--memory {memory})",
              lambda: featdump_step("encode", path, targets, "-l", layer, "--memory", memory, "-o", results))]
    if sklearn:
        steps += [("scikit-learn RidgeClassifierCV per fold (in memory)",
                   lambda: run_step("-c", SKLEARN, path, layer, "probe")),
                  ("scikit-learn RidgeCV per fold (in memory)",
                   lambda: run_step("-c", SKLEARN, path, layer, "encode", targets))]
    for step, run in steps:
        cold = drop_caches()
        seconds, peak = run()
        table.append((name, step, seconds, peak, cold))
        print(f"{name}: {step}: {seconds:.1f} s, peak RSS {peak:.0f} MiB{'' if cold else ' (page cache warm)'}",
              flush=True)
    results.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--sklearn-images", type=int, default=512)
    parser.add_argument("--narrow-rows", type=int, default=200_000)
    parser.add_argument("--narrow-features", type=int, default=1024)
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--only", default="wide,small,narrow")
    parser.add_argument("--no-sklearn", action="store_true", help="featdump's steps only")
    arguments = parser.parse_args()
    chosen = arguments.only.split(",")
    table: list = []
    if "narrow" in chosen:
        path = narrow_layer(arguments.narrow_rows, arguments.narrow_features)
        bench(f"narrow {arguments.narrow_rows} x {arguments.narrow_features}", path, "pooled",
              random_targets(path, arguments.targets), "1GB", not arguments.no_sklearn, table)
    if "small" in chosen:
        path = wide_layer(arguments.sklearn_images)
        bench(f"resnet50 layer1 x {arguments.sklearn_images}", path, "layer1",
              random_targets(path, arguments.targets), "1GB", not arguments.no_sklearn, table)
    if "wide" in chosen:
        path = wide_layer(arguments.images)
        bench(f"resnet50 layer1 x {arguments.images}", path, "layer1", random_targets(path, arguments.targets),
              "1GB", False, table)
    print("\n| layer | step | seconds | x the read | peak RSS (MiB) |")
    print("| --- | --- | ---: | ---: | ---: |")
    reads = {name: seconds for name, step, seconds, _, _ in table if step.startswith("read")}
    for name, step, seconds, peak, cold in table:
        print(f"| {name} | {step}{'' if cold else ' (warm)'} | {seconds:.1f} | {seconds / reads[name]:.1f} | "
              f"{peak:.0f} |")


if __name__ == "__main__":
    main()
