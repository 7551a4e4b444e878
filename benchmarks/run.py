"""featdump benchmarks: prints one table of measurements taken side by side in one run.

    python -m benchmarks.run [--images 256] [--workers 2] [--gpu-images 20480] [--write-results]   (make bench)
    python -m benchmarks.run --gpu [--gpu-images N] [--dry-run]      (the GPU rows alone; --dry-run: on the CPU)

CPU (always): featdump vs the bare limit (the model truncated at the layer, same DataLoader and
preprocessing, no hooks, no writes), vs the seeds' hook recipe and vs create_feature_extractor kept in
RAM (time and peak RSS), and truncation (resnet50 layer1 vs the full model).
GPU (when CUDA is present; `--gpu`: these alone): resnet50 avgpool from JPEG at batch 256, --decode cpu/gpu x
fp32/bf16, --compile bf16 (loading its package), layer3 --reduce srp:4096, resnet50 layer3 stored as float16,
avgpool from tar shards, a probe of layer2 on the GPU, and the machine's limits measured by this script (the
forward alone, contiguous and channels_last; decode alone; disk writes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from benchmarks.common import HERE, REPO, benchmark, machine, make_images, timed_featdump, write_section

GPU = "cuda"  # the GPU rows' device
GPU_MODEL = "resnet50"  # the GPU rows' model (a dry run: resnet18, its code path at a fraction of the time)


def measure(method: str, model: str, layer: str, images: Path, workers: int, keep: Path | None = None,
            **options) -> dict:
    """One method in its own process; its output is deleted, or moved to KEEP."""
    out = HERE / "data" / f"{method}-{model}-{layer}.out"
    command = [*benchmark("methods"), method, "--model", model, "--layer", layer,
               "--images", str(images), "--out", str(out), "--workers", str(workers)]
    for key, value in options.items():
        if value is True:
            command.append(f"--{key.replace('_', '-')}")
        else:
            command += [f"--{key.replace('_', '-')}", str(value)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{method} failed:\n{result.stderr[-3000:]}")
    if keep is not None:
        out.replace(keep)
    for path in HERE.glob("data/*.out*"):
        path.unlink()
    return json.loads(result.stdout.strip().splitlines()[-1])


def interleaved(repeats: int, runs: dict[str, tuple]) -> dict[str, list[dict]]:
    """Every run REPEATS times in rounds (each round runs all of them back to back); all results kept."""
    results: dict[str, list[dict]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, (args, options) in runs.items():
            results[name].append(measure(*args, **options))
    return results


def paired_ratio(results: dict[str, list[dict]], name: str, reference: str) -> tuple[float, float, float]:
    """Median, min and max over rounds of NAME's time / REFERENCE's time in the same round.

    A shared machine drifts over minutes; two runs taken back to back see nearly the same machine, so
    the ratio within a round is far steadier than a ratio of times taken apart.
    """
    ratios = [mine["seconds"] / theirs["seconds"] for mine, theirs in zip(results[name], results[reference])]
    return statistics.median(ratios), min(ratios), max(ratios)


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def cpu_rows(images: Path, count: int, workers: int, repeats: int) -> list[str]:
    rows = [f"Each row: median of {repeats} rounds; 'vs bare' is the median (min-max) of the per-round ratios.", "",
            "| model, layer | method | time (s) | img/s | vs bare | peak RSS (MiB) | vs featdump RSS |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for model, layer in [("resnet18", "layer3.0.downsample.1"), ("resnet50", "avgpool"), ("resnet18", "layer1")]:
        results = interleaved(repeats, {method: ((method, model, layer, images, workers), {"batch_size": 64})
                                        for method in ("bare", "featdump", "recipe", "fx_ram")})
        featdump_rss = _median(results["featdump"], "peak_rss_mib")
        for method, runs in results.items():
            seconds, rss = _median(runs, "seconds"), _median(runs, "peak_rss_mib")
            ratio, low, high = paired_ratio(results, method, "bare")
            note = f" (whole run {_median(runs, 'total_seconds'):.1f} s)" if method == "featdump" else ""
            rows.append(f"| {model} {layer} | {method}{note} | {seconds:.2f} | {count / seconds:.1f} | "
                        f"{ratio:.3f}x ({low:.2f}-{high:.2f}) | {rss:.0f} | {rss / featdump_rss:.2f}x |")
    truncation = interleaved(repeats, {layer: (("featdump", "resnet50", layer, images, workers), {"batch_size": 64})
                                       for layer in ("layer1", "fc")})
    ratio, low, high = paired_ratio(truncation, "layer1", "fc")
    layer1, full = _median(truncation["layer1"], "seconds"), _median(truncation["fc"], "seconds")
    rows += ["", "| truncation (featdump, resnet50) | time (s) | img/s | vs full |", "| --- | ---: | ---: | ---: |",
             f"| layer1 | {layer1:.2f} | {count / layer1:.1f} | {ratio:.2f}x ({low:.2f}-{high:.2f}) |",
             f"| fc (full model) | {full:.2f} | {count / full:.1f} | 1.00x |"]
    return rows


def photo_rows(count: int, workers: int, repeats: int) -> list[str]:
    """Camera photos (12 MP JPEGs): decoding, not the forward, is the limit; --fast-decode vs the exact path."""
    from tests.makers.photos import write_camera_photos

    folder = HERE / "data" / f"photos-{count}"
    write_camera_photos(folder, count)
    common = {"batch_size": 16}
    runs = {
        "bare (PIL loader, resnet18 up to avgpool)": (("bare", "resnet18", "avgpool", folder, workers),
                                                      {**common, "loader": "pil"}),
        "featdump": (("featdump", "resnet18", "avgpool", folder, workers), common),
        "featdump --fast-decode": (("featdump", "resnet18", "avgpool", folder, workers),
                                   {**common, "fast_decode": True}),
        "recipe (PIL loader)": (("recipe", "resnet18", "avgpool", folder, workers), {**common, "loader": "pil"}),
    }
    results = interleaved(repeats, runs)
    rows = [f"{count} JPEGs of 4032x3024 (~1.7 MB, every 4th EXIF-rotated), resnet18 avgpool, batch 16, "
            f"{workers} workers; median of {repeats} rounds, ratios per round (min-max).", "",
            "| method | time (s) | img/s | speed-up over featdump exact |", "| --- | ---: | ---: | ---: |"]
    for name, runs_of_name in results.items():
        seconds = _median(runs_of_name, "seconds")
        ratio, low, high = paired_ratio(results, "featdump", name)
        rows.append(f"| {name} | {seconds:.2f} | {count / seconds:.1f} | {ratio:.2f}x ({low:.2f}-{high:.2f}) |")
    exact, fast = HERE / "data" / "photos-exact.h5", HERE / "data" / "photos-fast.h5"
    measure(*runs["featdump"][0], keep=exact, **common)
    measure(*runs["featdump --fast-decode"][0], keep=fast, **common, fast_decode=True)
    with h5py.File(exact, "r") as a, h5py.File(fast, "r") as b:
        x = a["features/avgpool"][:].reshape(count, -1)
        y = b["features/avgpool"][:].reshape(count, -1)
    relative = np.linalg.norm(y - x, axis=1) / np.linalg.norm(x, axis=1)
    cosine = (x * y).sum(axis=1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)
    exact.unlink()
    fast.unlink()
    rows += ["", f"--fast-decode vs exact features over the {count} photos: relative L2 difference median "
                 f"{np.median(relative):.4%}, max {relative.max():.4%}; cosine min {cosine.min():.6f}."]
    return rows


def gpu_rows(images: Path, count: int, workers: int) -> list[str]:
    rows = ["img/s: images over the whole batch loop (worker start-up included); steady: after the first batch.",
            "", f"| {GPU_MODEL} on CUDA, batch 256 | time (s) | img/s | steady img/s |", "| --- | ---: | ---: | ---: |"]
    runs = {f"avgpool --decode {decode} --precision {precision}": ("avgpool", decode, precision, "float32", {})
            for decode in ("cpu", "gpu") for precision in ("fp32", "bf16")}
    runs["layer3 float16 --decode gpu bf16"] = ("layer3", "gpu", "bf16", "float16", {})
    runs["avgpool --compile bf16 (the package built, then loaded)"] = ("avgpool", "cpu", "bf16", "float32",
                                                                        {"compile": True})
    runs["layer3 --reduce srp:4096 bf16"] = ("layer3", "cpu", "bf16", "float32", {"reduce": "srp:4096"})
    if GPU == "cpu":  # a dry run (gpu_check.py --dry-run): the rows that need CUDA, or hours of a CPU, left out
        runs = {label: run for label, run in runs.items() if run[1] != "gpu" and not run[4].get("compile")}
        rows[2] = rows[2].replace("on CUDA", "on the CPU (a dry run: --decode gpu and --compile left out)")
    for label, (layer, decode, precision, dtype, more) in runs.items():
        if more.get("compile"):  # the first run builds the package; the row is the run that loads it
            measure("featdump", GPU_MODEL, layer, images, workers, batch_size=256, device=GPU, decode=decode,
                    precision=precision, dtype=dtype, **more)
        result = measure("featdump", GPU_MODEL, layer, images, workers, batch_size=256, device=GPU,
                         decode=decode, precision=precision, dtype=dtype, **more)
        steady = result["steady_img_s"] or 0.0
        written = f" ({steady * 1024 * 14 * 14 * 2 / 1e6:.0f} MB/s written)" if layer == "layer3" else ""
        rows.append(f"| {label} | {result['seconds']:.2f} | {count / result['seconds']:.0f} | {steady:.0f}{written} |")
    rows.append(tar_row(images, count))
    rows += ["", readout_row(images, count, workers)]
    rows += ["", "| limits measured here | value |", "| --- | ---: |"] + gpu_limits(images, count, workers)
    return rows


def tar_row(images: Path, count: int) -> str:
    """The same JPEGs packed into 16 webdataset tars, read by a whole `featdump extract --device cuda`."""
    from benchmarks.tars import pack

    shards = pack(images, HERE / "data" / f"{images.name}-tars", 16)
    out = HERE / "data" / "gpu-tars.h5"
    seconds, _ = timed_featdump("extract", "-m", GPU_MODEL, "-w", "none", "-l", "avgpool", "--device", GPU,
                                "--precision", "bf16", "--batch-size", "256", "--overwrite", shards, out,
                                what="extract from tar shards")
    out.unlink()
    return f"| avgpool from 16 tar shards --precision bf16 (whole command) | {seconds:.2f} | {count / seconds:.0f} | |"


def readout_row(images: Path, count: int, workers: int) -> str:
    """`featdump probe --device cuda` of resnet50 layer2 (401,408 features, float16) over the 10 classes."""
    layer_file = HERE / "data" / "gpu-layer2.h5"
    measure("featdump", GPU_MODEL, "layer2", images, workers, keep=layer_file, batch_size=256, device=GPU,
            precision="bf16", dtype="float16")
    results = HERE / "data" / "gpu-probe.h5"
    seconds, _ = timed_featdump("probe", layer_file, "-l", "layer2", "--device", GPU, "--memory", "8GB",
                                "-o", results, "--overwrite", what="probe on the GPU")
    layer_file.unlink()
    results.unlink()
    return (f"| read-out on {GPU} | time (s) |\n| --- | ---: |\n"
            f"| probe of {GPU_MODEL} layer2 ({count} rows, float16), 5 folds, --memory 8GB | {seconds:.1f} |")


def gpu_limits(images: Path, count: int, workers: int) -> list[str]:
    """Forward alone on random tensors, decode alone (CPU workers, nvjpeg), disk write bandwidth."""
    import torchvision.models

    from featdump.inputs import find_images
    from featdump.inputs.gpu_decode import to_device_inputs
    from featdump.inputs.loader import ImageDataset, make_loader
    from featdump.inputs.preprocess import Preprocess
    from featdump.sources.models import default_preprocessing

    batch, warmups, rounds = (256, 3, 10) if GPU == "cuda" else (2, 1, 2)  # a dry run: bf16 may be ~1 img/s
    model = getattr(torchvision.models, GPU_MODEL)().eval().to(GPU)
    forward = {layout: forward_rate(model, layout, batch, warmups, rounds)
               for layout in (torch.contiguous_format, torch.channels_last)}
    found, preprocess = find_images(images), Preprocess(default_preprocessing(GPU_MODEL))
    rates = {}
    for gpu in (False, True) if GPU == "cuda" else (False,):
        loader = make_loader(ImageDataset(found, preprocess, gpu_jpegs=gpu), 0, 256, workers, pin_memory=GPU == "cuda")
        started = time.perf_counter()
        for batch_read in loader:
            to_device_inputs(batch_read, preprocess, found, torch.device(GPU))
        _synchronize()
        rates[gpu] = count / (time.perf_counter() - started)
    path = HERE / "data" / "write-test.bin"
    block = np.random.default_rng(0).integers(0, 255, size=64 * 1024 * 1024, dtype=np.uint8).tobytes()
    blocks = 32 if GPU == "cuda" else 2  # 2 GiB; 128 MiB in a dry run
    started = time.perf_counter()
    with open(path, "wb") as handle:
        for _ in range(blocks):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
    write_rate = blocks * len(block) / (time.perf_counter() - started) / 1e6
    path.unlink()
    nvjpeg = f"{rates[True]:.0f} img/s" if True in rates else "not run: needs CUDA"
    contiguous = forward[torch.contiguous_format]
    return [f"| {GPU_MODEL} bf16 forward alone, batch {batch}, contiguous | {contiguous:.0f} img/s |",
            f"| {GPU_MODEL} bf16 forward alone, batch {batch}, channels_last (featdump's choice) | "
            f"{forward[torch.channels_last]:.0f} img/s |",
            f"| decode + resize alone, PIL in {workers} workers | {rates[False]:.0f} img/s |",
            f"| decode + resize alone, nvjpeg (--decode gpu) | {nvjpeg} |",
            f"| disk write bandwidth ({blocks * 64} MiB, fsync) | {write_rate:.0f} MB/s |"]


def forward_rate(model: torch.nn.Module, layout: torch.memory_format, batch: int = 256, warmups: int = 3,
                 rounds: int = 10) -> float:
    """Images a second through MODEL in bf16 on random inputs in LAYOUT over ROUNDS batches, after WARMUPS."""
    model = model.to(memory_format=layout)
    x = torch.randn(batch, 3, 224, 224, device=GPU).contiguous(memory_format=layout)
    with torch.inference_mode(), torch.autocast(GPU, dtype=torch.bfloat16):
        for _ in range(warmups):
            model(x)
        _synchronize()
        started = time.perf_counter()
        for _ in range(rounds):
            model(x)
        _synchronize()
    return rounds * batch / (time.perf_counter() - started)


def _synchronize() -> None:
    if GPU == "cuda":
        torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256, help="number of JPEGs to generate and extract")
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 2))
    parser.add_argument("--repeats", type=int, default=5, help="CPU rows: rounds of all methods run back to back")
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument("--photos", type=int, default=192, help="camera photos (12 MP) for the photo rows; 0 skips")
    parser.add_argument("--photo-workers", type=int, default=2)
    parser.add_argument("--gpu-images", type=int, default=20480,
                        help="JPEGs for the GPU rows (>= 20,000: a steady rate over many batches of 256)")
    parser.add_argument("--write-results", action="store_true", help="also write its section of benchmarks/RESULTS.md")
    parser.add_argument("--gpu", action="store_true", help="the GPU rows alone (eager, bf16, channels_last, "
                        "--compile, GPU decode, SRP, tar shards, a read-out), in one command; fails without CUDA")
    parser.add_argument("--dry-run", action="store_true", help="with --gpu: its rows on the CPU at a tiny size, those "
                        "that need CUDA left out (gpu_check.py's dry run: the script runs before a GPU sees it)")
    args = parser.parse_args()
    global GPU, GPU_MODEL
    if args.gpu:
        if args.dry_run:
            GPU, GPU_MODEL = "cpu", "resnet18"
        elif not torch.cuda.is_available():
            raise SystemExit("--gpu: CUDA is not available on this machine (--dry-run runs its rows on the CPU).")
        args.skip_cpu, args.photos = True, 0
    lines = [f"Machine: {machine()}", f"DataLoader workers: {args.workers}", ""]
    if not args.skip_cpu:
        images = make_images(HERE / "data" / f"images-{args.images}", args.images)
        lines += ["## CPU", "", f"{args.images} JPEGs of 500x375.", ""]
        lines += cpu_rows(images, args.images, args.workers, args.repeats) + [""]
    if args.photos:
        lines += ["## Camera photos", ""] + photo_rows(args.photos, args.photo_workers, args.repeats) + [""]
    if torch.cuda.is_available() or GPU == "cpu":
        gpu_images = make_images(HERE / "data" / f"images-{args.gpu_images}", args.gpu_images)
        lines += ["## GPU" if GPU == "cuda" else "## GPU rows, a dry run on the CPU", "",
                  f"{args.gpu_images} JPEGs of 500x375.", ""]
        lines += gpu_rows(gpu_images, args.gpu_images, args.workers) + [""]
    else:
        lines += ["GPU rows: skipped, CUDA is not available on this machine.", ""]
    table = "\n".join(lines)
    print(table)
    if args.write_results:
        write_section("run", f"Command: `python -m benchmarks.run {' '.join(sys.argv[1:])}`\n\n{table}")


if __name__ == "__main__":
    main()
