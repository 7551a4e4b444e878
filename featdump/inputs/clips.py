"""Clips: a job's videos as rows, one per clip (`inputs.video` says which clips a video gives and decodes them).

Each video of an image list (a folder, a list, tars, a store: read as images are) is opened once while the job is
listed, for its frame times; its clips become rows in order, each row naming its video's path and its clip's
start in seconds. A video that gives no clip (shorter than one clip, or undecodable) keeps one row without a start,
which the loader records as a skipped input with that reason, as it does a bad image.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from featdump.inputs.decode import describe_failure
from featdump.inputs.imagelist import ClipTable, ImageList
from featdump.inputs.loader import ImageDataset, Item
from featdump.inputs.preprocess import Preprocess
from featdump.inputs.video import ClipPlan, VideoInfo, decode_clip, video_info

log = logging.getLogger("featdump")


def clip_rows(videos: ImageList, plan: ClipPlan) -> ImageList:
    """VIDEOS' clips under PLAN as rows (the same path once per clip, `clips` saying which), in the videos' order;
    each video opened once for its frame times."""
    started = time.perf_counter()
    positions: list[int] = []
    starts: list[float] = []
    reasons: list[str] = []
    for position in range(len(videos)):
        try:
            info = video_info(_readable(videos.open(position).source))
        except Exception as error:  # any failure to read it is this video's skip, as a bad image's
            positions.append(position)
            starts.append(math.nan)
            reasons.append(f"cannot be read as a video ({describe_failure(error)})")
            continue
        found = plan.starts(info.last)
        if not found:
            positions.append(position)
            starts.append(math.nan)
            reasons.append(f"shorter than one clip: {info.last:.3f} s from its first frame to its last, where a "
                           f"clip of {plan.frames} frames at {plan.fps:g} fps spans {plan.span:.3f} s")
            continue
        positions += [position] * len(found)
        starts += found
        reasons += [""] * len(found)
    without = sum(1 for reason in reasons if reason)
    log.info("Listed %d clips of %d videos (%d give none) in %.1f s.", len(starts) - without, len(videos), without,
             time.perf_counter() - started)
    rows = videos.select(positions)
    return dataclasses.replace(rows, clips=ClipTable(plan.frames, plan.fps, plan.every, tuple(starts),
                                                     tuple(reasons)))


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
    1 (each sampled frame a row). A video with no clip is its row's recorded skip. Each worker reads a video's
    frame times once, when it first decodes one of its clips."""

    def __init__(self, images: ImageList, preprocess: Preprocess):
        super().__init__(images, preprocess)
        clips = images.clips
        self.plan = ClipPlan(clips.frames, clips.fps, clips.every)
        self._infos: dict[str, VideoInfo] = {}

    def _decoded(self, position: int, encoded) -> Item:
        item = Item(position)
        try:
            if isinstance(encoded, Exception):
                raise encoded
            item.file_stat = encoded.file_stat
            clips = self.images.clips
            if clips.reasons[position]:
                item.failure = clips.reasons[position]
                return item
            path = self.images.paths[position]
            if path not in self._infos:
                self._infos = {path: video_info(_readable(encoded.source))}  # the last video's alone
            frames = decode_clip(_readable(encoded.source), self._infos[path], self.plan.times(clips.starts[position]))
            item.pixels = self.preprocess.clip_pixels(frames) if isinstance(self.preprocess, ClipPreprocess) \
                else self.preprocess.pixels(Image.fromarray(frames[0]))
        except Exception as error:  # any decoding failure is recorded, not raised
            item.failure = describe_failure(error)
        return item


def dataset_for(images: ImageList, preprocess: Preprocess, gpu_jpegs: bool = False) -> ImageDataset:
    """The loader's dataset of IMAGES: their clips' (a video job's), or their images'."""
    if images.clips is not None:
        return ClipDataset(images, preprocess)
    return ImageDataset(images, preprocess, gpu_jpegs)
