"""Video decoding's memory: the peak RSS of reading a long film's clips against a short video's, each in its own
process (`featdump.inputs.video`: the frame times, then clips decoded by seeking; never the whole video).

    python -m benchmarks.video [--short-seconds 60] [--long-seconds 7200] [--fps 25] [--size 240x320]

Two videos made once in benchmarks/data by PyAV's encoder (mpeg4, a keyframe every 2 s, noise frames), then for
each: `video_info` and 16-frame clips at 15 fps decoded at the start, the middle and the end, and every clip of
the first minute; the process's peak RSS (ru_maxrss) and the seconds taken. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

MEASURE = r"""
import resource, sys, time
import numpy as np
from featdump.inputs.video import ClipPlan, decode_clip, video_info
path = sys.argv[1]
started = time.perf_counter()
info = video_info(path)
plan = ClipPlan.of(16, 15)
starts = plan.starts(info.last)
chosen = [starts[0], starts[len(starts) // 2], starts[-1]] + [s for s in starts if s < 60]
total = 0
for start in chosen:
    total += int(decode_clip(path, info, plan.times(start)).sum() > 0)
seconds = time.perf_counter() - started
print(len(starts), len(chosen), seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def make_video(path: Path, seconds: int, fps: int, size: tuple[int, int]) -> Path:
    """SECONDS of noise frames at FPS into PATH (made once), a keyframe every 2 s."""
    if path.exists():
        return path
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    pool = [rng.integers(0, 256, size=(*size, 3), dtype=np.uint8) for _ in range(32)]
    temporary = path.with_suffix(".part" + path.suffix)
    with av.open(str(temporary), "w") as container:
        stream = container.add_stream("mpeg4", rate=Fraction(fps))
        stream.height, stream.width = size
        stream.pix_fmt = "yuv420p"
        stream.options = {"g": str(2 * fps)}
        for index in range(seconds * fps):
            frame = av.VideoFrame.from_ndarray(pool[index % len(pool)], format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    temporary.rename(path)
    return path


def measure(path: Path) -> tuple[int, int, float, float]:
    result = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True,
                            env={"PYTHONPATH": str(REPO)}, check=True)
    clips, decoded, seconds, rss = result.stdout.split()
    return int(clips), int(decoded), float(seconds), float(rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short-seconds", type=int, default=60)
    parser.add_argument("--long-seconds", type=int, default=7200)
    parser.add_argument("--fps", type=int, default=25)
    parser.add_argument("--size", default="240x320", help="HEIGHTxWIDTH")
    args = parser.parse_args()
    size = tuple(int(part) for part in args.size.split("x"))
    rows = ["| video | size on disk | clips it gives | clips decoded | seconds | peak RSS (MiB) |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    peaks = []
    for seconds in (args.short_seconds, args.long_seconds):
        path = make_video(HERE / "data" / f"video-{seconds}s-{args.size}-{args.fps}.mp4", seconds, args.fps, size)
        clips, decoded, taken, rss = measure(path)
        peaks.append(rss)
        rows.append(f"| {seconds} s at {args.fps} fps, {args.size} | {path.stat().st_size / 1e6:.0f} MB | {clips} | "
                    f"{decoded} | {taken:.1f} | {rss:.0f} |")
    rows.append(f"\nlong / short peak RSS: {peaks[1] / peaks[0]:.2f}x")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
