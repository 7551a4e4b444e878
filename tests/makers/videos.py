"""Real videos for the tests, made with PyAV's own encoder: lossless (x264 in RGB, crf 0) where values are compared,
each frame's pixels telling its index."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np


def frame_pixels(index: int, size=(48, 64), seed: int = 0) -> np.ndarray:
    """Frame INDEX of a test video: smooth noise of its own (seeded by SEED and INDEX), (H, W, 3) uint8."""
    rng = np.random.default_rng([seed, index])
    coarse = rng.integers(0, 256, size=(size[0] // 8, size[1] // 8, 3)).astype(np.uint8)
    return np.repeat(np.repeat(coarse, 8, axis=0), 8, axis=1)


def write_video(path: Path, frames: int, fps: int = 25, size=(48, 64), seed: int = 0, lossless: bool = True,
                gop: int = 12) -> Path:
    """FRAMES frames at FPS into PATH (.mkv or .mp4): lossless x264 RGB (crf 0), or lossy mpeg4; a keyframe every
    GOP frames, so that a clip's seek lands on an earlier keyframe and decodes forward."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        codec = "libx264rgb" if lossless else "mpeg4"
        stream = container.add_stream(codec, rate=Fraction(fps))
        stream.width, stream.height = size[1], size[0]
        stream.pix_fmt = "rgb24" if lossless else "yuv420p"
        stream.options = {"crf": "0", "preset": "ultrafast", "g": str(gop), "bf": "0"} if lossless else \
            {"g": str(gop)}
        for index in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_pixels(index, size, seed), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def one_thread(function, *args):
    """FUNCTION(*ARGS) on one torch thread, as a loader worker runs (torch's uint8 resize rounds by thread count)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return function(*args)
    finally:
        torch.set_num_threads(threads)
