"""`featdump compare` against rsatoolbox in memory on the same RDMs: LAYERS model RDMs and SUBJECTS data RDMs over
IMAGES images, SAMPLES bootstrap resamples over subjects (rsatoolbox's `eval_bootstrap_rdm`, its noise ceiling
per sample too, and `boot_noise_ceiling`) or over images (`eval_bootstrap_pattern`), each one's wall time and
featdump's share of rsatoolbox's. rsatoolbox takes seconds a sample at 2,000 images: it is timed over
THEIR_SAMPLES samples and its time for SAMPLES extrapolated from them (said in the table); featdump likewise over
OUR_SAMPLES where given (a bootstrap over images recomputes every sample in both).

    python -m benchmarks.compare [--images 2000] [--layers 5] [--subjects 8] [--samples 1000] [--their-samples 20]
                                 [--bootstrap subjects] [--our-samples N] [--write-results]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import h5py
import numpy as np

from benchmarks.common import machine, write_section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--subjects", type=int, default=8)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--their-samples", type=int, default=20)
    parser.add_argument("--our-samples", type=int)
    parser.add_argument("--bootstrap", choices=("subjects", "images"), default="subjects")
    parser.add_argument("--method", default="corr")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rdms, data, models, subjects = _inputs(Path(folder), args.images, args.layers, args.subjects)
        ours_measured = min(args.samples, args.our_samples or args.samples)
        ours = _timed(lambda: _featdump(rdms, data, args.method, args.bootstrap, ours_measured)) * \
            args.samples / ours_measured
        measured = min(args.samples, args.their_samples)
        theirs = _timed(lambda: _rsatoolbox(models, subjects, args.method, args.bootstrap, measured)) * \
            args.samples / measured
    table = "\n".join([f"Machine: {machine()}", "",
                       "| images | layers | subjects | bootstrap | samples | method | featdump (s) | rsatoolbox (s) | "
                       "featdump / rsatoolbox |", "| ---: | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: |",
                       f"| {args.images} | {args.layers} | {args.subjects} | {args.bootstrap} | {args.samples} | "
                       f"{args.method} | {ours:.1f}{_timed_over(ours_measured, args.samples)} | "
                       f"{theirs:.1f}{_timed_over(measured, args.samples)} | {ours / theirs:.3f}x |"])
    print(table)
    if args.write_results:
        write_section("compare", f"Command: `python -m benchmarks.compare --images {args.images} --layers "
                                 f"{args.layers} --subjects {args.subjects} --samples {args.samples} "
                                 f"--their-samples {args.their_samples} --bootstrap {args.bootstrap}"
                                 f"{f' --our-samples {args.our_samples}' if args.our_samples else ''}`\n\n{table}")


def _timed_over(measured: int, samples: int) -> str:
    return "" if measured == samples else f" ({measured} timed)"


def _inputs(folder: Path, images: int, layers: int, subjects: int):
    """A `featdump rdm`-style file of LAYERS RDMs and a data file of SUBJECTS RDMs over IMAGES images (correlation
    distances of a shared pattern plus noise), and the same RDMs as arrays."""
    rng = np.random.default_rng(0)
    pattern = rng.standard_normal((images, 32))
    models = np.stack([1 - np.corrcoef(pattern + (0.3 + layer) * rng.standard_normal((images, 32)))
                       for layer in range(layers)])
    data = np.stack([1 - np.corrcoef(pattern + rng.standard_normal((images, 32))) for _ in range(subjects)])
    paths = np.array([f"img/{index:06d}.jpg" for index in range(images)])
    with h5py.File(folder / "rdms.h5", "w") as h5file:
        for layer, matrix in enumerate(models):
            h5file[f"rdms/layer{layer}"] = matrix
        h5file["paths"] = paths.astype(h5py.string_dtype())
    np.savez(folder / "data.npz", rdms=data, paths=paths)
    return folder / "rdms.h5", folder / "data.npz", models, data


def _featdump(rdms: Path, data: Path, method: str, bootstrap: str, samples: int) -> None:
    from featdump.analysis.compare import compare

    compare(rdms, data, method=method, resample=bootstrap, samples=samples, seed=0)


def _rsatoolbox(models: np.ndarray, subjects: np.ndarray, method: str, bootstrap: str, samples: int) -> None:
    import rsatoolbox

    data = rsatoolbox.rdm.RDMs(np.stack([_vector(matrix) for matrix in subjects]),
                               pattern_descriptors={"index": np.arange(len(subjects[0]))})
    fixed = [rsatoolbox.model.ModelFixed(f"layer{index}", _vector(matrix)) for index, matrix in enumerate(models)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if bootstrap == "images":
            rsatoolbox.inference.eval_bootstrap_pattern(fixed, data, method=method, N=samples,
                                                        pattern_descriptor="index")
        else:
            rsatoolbox.inference.eval_bootstrap_rdm(fixed, data, method=method, N=samples)


def _vector(matrix: np.ndarray) -> np.ndarray:
    return matrix[np.triu_indices(len(matrix), k=1)]


def _timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
