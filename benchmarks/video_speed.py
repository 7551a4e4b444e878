"""Clips a second for a video model on the CPU: the whole pipeline (`featdump extract`, clips decoded in the loader's
workers while the model runs) against decoding alone (the same loader, workers and batches, no model) and the
forward alone (the same clips, decoded beforehand, through the model), on the same clips.

    python -m benchmarks.video_speed [--model r3d_18] [--seconds 120] [--layer avgpool] [--batch-size 64]

The video is made once in benchmarks/data by PyAV's encoder (mpeg4, 240x320 at 25 fps, a keyframe every 2 s, noise
frames). Default workers and batch size, weights none (seeded), the model's own clip (r3d_18: 16 frames at 15 fps,
back to back). Each of the three is timed from its first batch asked to its last done; the pipeline's figure is
featdump's batch loop (model loading and the listing excluded, as for the other two). Prints a Markdown table and
the pipeline's rate over the slower of the two parts (1.0: the parts fully overlapped).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.methods import LoopTimer
from benchmarks.video import make_video
from featdump.inputs import find_images
from featdump.inputs.clips import as_rows, dataset_for, preprocess_for
from featdump.inputs.loader import batches_of, make_loader
from featdump.inputs.workers import choose_workers
from featdump.job.runner import extract
from featdump.job.settings import Settings
from featdump.sources.models import clip_of, load_model

HERE = Path(__file__).resolve().parent




def pipeline(settings: Settings) -> tuple[int, float]:
    timer = LoopTimer()
    extract(settings, timer)
    return timer.images, timer.stopped - timer.started


def decode_only(settings: Settings, loaded, images) -> tuple[int, float, list[torch.Tensor]]:
    """The clips through featdump's loader (its workers, its batches), no model; the batches kept for the forward."""
    preprocess = preprocess_for(loaded, images)
    loader = make_loader(dataset_for(images, preprocess), 0, settings.batch_size, choose_workers(settings.num_workers))
    kept, count = [], 0
    started = time.perf_counter()
    with batches_of(loader) as batches:
        for batch in batches:
            count += len(batch.positions)
            kept.append(preprocess.normalize(batch.pixels))
    return count, time.perf_counter() - started, kept


def forward_only(loaded, inputs: list[torch.Tensor]) -> tuple[int, float]:
    model = loaded.module.eval()
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in inputs:
            model(batch)
    return sum(len(batch) for batch in inputs), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="r3d_18")
    parser.add_argument("--layer", default="avgpool")
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--batch-size", type=int, default=None, help="default: featdump's")
    args = parser.parse_args()
    video = make_video(HERE / "data" / f"video-{args.seconds}s-240x320-25.mp4", args.seconds, 25, (240, 320))
    with tempfile.TemporaryDirectory() as folder:
        options = {"batch_size": args.batch_size} if args.batch_size else {}
        settings = Settings(model=args.model, layers=(args.layer,), images=video, output=Path(folder) / "out.h5",
                            weights="none", overwrite=True, **options)
        images = as_rows(find_images(video), None, None, None, clip_of(args.model))
        loaded = load_model(args.model, "none")
        decoded, decode_seconds, inputs = decode_only(settings, loaded, images)
        forwarded, forward_seconds = forward_only(loaded, inputs)
        del inputs
        clips, pipeline_seconds = pipeline(settings)
    rows = ["| what | clips | seconds | clips/s |", "| --- | ---: | ---: | ---: |"]
    for what, count, seconds in (("decode only (loader)", decoded, decode_seconds),
                                 ("forward only", forwarded, forward_seconds),
                                 ("featdump extract (pipeline)", clips, pipeline_seconds)):
        rows.append(f"| {what} | {count} | {seconds:.1f} | {count / seconds:.2f} |")
    slower = min(decoded / decode_seconds, forwarded / forward_seconds)
    print(f"{args.model}, layer {args.layer}, {args.seconds} s video, batch {settings.batch_size}, "
          f"{choose_workers(settings.num_workers)} loader workers, {torch.get_num_threads()} torch threads\n")
    print("\n".join(rows))
    print(f"\npipeline / slower part: {clips / pipeline_seconds / slower:.2f}x")


if __name__ == "__main__":
    main()
