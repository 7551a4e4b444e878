"""Clips: a job's videos as rows, one per clip (`inputs.video` says which clips a video gives and decodes them).

Each video of an image list (a folder, a list, tars, a store: read as images are) is opened once while the job is
listed, for its frame times; its clips become rows in order, each row naming its video's path and its clip's
start in seconds. A video that gives no clip (shorter than one clip, or undecodable) keeps one row without a start,
which the loader records as a skipped input with that reason, as it does a bad image.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from featdump.inputs.decode import describe_failure
from featdump.inputs.imagelist import ImageList
from featdump.inputs.loader import ImageDataset, Item
from featdump.inputs.preprocess import Preprocess
from featdump.inputs.video import ClipPlan, VideoInfo, decode_clip, video_info

log = logging.getLogger("featdump")


@dataclass(frozen=True)
class ClipRows:
    """The rows of a job's videos: the image list of their videos, one entry per row, each row's clip start
    (NaN for a video that gives no clip), why such a video gives none, and each video's frame times."""

    videos: ImageList  # row-aligned: a video's path once per clip
    starts: tuple[float, ...]
    without_clip: dict[int, str]  # row: why its video gives no clip
    infos: dict[str, VideoInfo]  # path: its frame times, read once while listing


def clip_rows(videos: ImageList, plan: ClipPlan) -> ClipRows:
    """VIDEOS' clips under PLAN as rows, in the videos' order; each video opened once for its frame times."""
    started = time.perf_counter()
    positions: list[int] = []
    starts: list[float] = []
    without: dict[int, str] = {}
    infos: dict[str, VideoInfo] = {}
    for position, path in enumerate(videos.paths):
        try:
            info = video_info(_readable(videos.open(position).source))
        except Exception as error:  # any failure to read it is this video's skip, as a bad image's
            without[len(positions)] = f"cannot be read as a video ({describe_failure(error)})"
            positions.append(position)
            starts.append(math.nan)
            continue
        infos[path] = info
        found = plan.starts(info.last)
        if not found:
            without[len(positions)] = (f"shorter than one clip: {info.last:.3f} s from its first frame to its last, "
                                       f"where a clip of {plan.frames} frames at {plan.fps:g} fps spans "
                                       f"{plan.span:.3f} s")
            found = [math.nan]
        positions += [position] * len(found)
        starts += found
    log.info("Listed %d clips of %d videos (%d give none) in %.1f s.", len(starts) - len(without), len(videos),
             len(without), time.perf_counter() - started)
    return ClipRows(videos.select(positions), tuple(starts), without, infos)


def _readable(source):
    """What PyAV opens: a path as text, or the bytes' stream as it is."""
    return str(source) if isinstance(source, Path) else source


class ClipPreprocess(Preprocess):
    """A video model's preprocessing of a clip's frames, run whole in the loader workers: torchvision's
    VideoClassification (and any transform like it) takes (T, C, H, W) uint8 and gives (C, T, H, W) float."""

    def __init__(self, transforms, frames: int):
        self.transforms, self.split, self.draft = transforms, False, None
        made = transforms(torch.zeros(frames, 3, 240, 320, dtype=torch.uint8))
        self.size = tuple(made.shape[1:])  # (T, H, W): the model's input past its batch and channel axes
        self._portrait_size = self.size

    def clip_pixels(self, frames: np.ndarray) -> np.ndarray:
        """FRAMES ((T, H, W, 3) uint8 RGB) as the model takes them."""
        return self.transforms(torch.from_numpy(frames).permute(0, 3, 1, 2)).numpy()


class ClipDataset(ImageDataset):
    """Row i of a job's clips: its frames decoded by seeking (`inputs.video`), then the model's preprocessing: a
    video model's of the (T, H, W, 3) frames (`ClipPreprocess`), or an image model's of the one frame of a clip of
    1 (each sampled frame a row). A video with no clip is its row's recorded skip."""

    def __init__(self, rows: ClipRows, plan: ClipPlan, preprocess: Preprocess):
        super().__init__(rows.videos, preprocess)
        self.rows, self.plan = rows, plan

    def _decoded(self, position: int, encoded) -> Item:
        item = Item(position)
        try:
            if isinstance(encoded, Exception):
                raise encoded
            item.file_stat = encoded.file_stat
            if position in self.rows.without_clip:
                item.failure = self.rows.without_clip[position]
                return item
            info = self.rows.infos[self.rows.videos.paths[position]]
            frames = decode_clip(_readable(encoded.source), info, self.plan.times(self.rows.starts[position]))
            item.pixels = self.preprocess.clip_pixels(frames) if isinstance(self.preprocess, ClipPreprocess) \
                else self.preprocess.pixels(Image.fromarray(frames[0]))
        except Exception as error:  # any decoding failure is recorded, not raised
            item.failure = describe_failure(error)
        return item
