"""Clips: a job's videos as rows, one per clip (`inputs.video` says which clips a video gives and decodes them).

Each video of an image list (a video file, a folder of them, a list file naming them, tar shards or a store prefix
holding them) is opened once while the job is listed, for its frame times; its clips become rows in order, each
row naming its video's path and its clip's start in seconds. A video that gives no clip (shorter than one clip, or
undecodable) keeps one row without a start, which the loader records as a skipped input with that reason, as it
does a bad image. What the model takes of a video (`sources.models.ModelClip`) sets the defaults and whether a
row's frames are one input (a video model: `ClipPreprocess`) or one image (an image model, a clip of 1 frame).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path, PurePosixPath

import numpy as np
import torch
from PIL import Image

from featdump.errors import FeatdumpError, MixedSizes, UsageProblem
from featdump.inputs.decode import describe_failure
from featdump.inputs.imagelist import ClipTable, ImageList, stat_as_read
from featdump.inputs.loader import ImageDataset, Item
from featdump.inputs.preprocess import Preprocess
from featdump.inputs.video import VIDEO_SUFFIXES, ClipPlan, VideoInfo, decode_clip, is_video_file, video_info
from featdump.locations import Location
from featdump.sources.models import LoadedModel, ModelClip

log = logging.getLogger("featdump")


def as_rows(images: ImageList, frames: int | None, fps: float | None, every: float | None,
            model: ModelClip, anchor: str = "start", pad: str = "skip", origin: float | None = None) -> ImageList:
    """IMAGES as a job's rows: a list of videos (every path a video's) as clips of FRAMES at FPS, one every EVERY
    seconds (defaults: what the MODEL takes: a video model's clip, an image model's one frame at each video's own
    rate; clips back to back); images as they are. The job's clip (`ImageList.clips`) is its one record from here
    on. UsageProblem for clip options on images, a video model on images, or clips of frames for an image model."""
    if not is_video_list(images):
        asked = [name for name, value in (("--clip", frames), ("--fps", fps), ("--clip-every", every),
                                          ("--clip-anchor", anchor != "start"), ("--clip-pad", pad != "skip"),
                                          ("--clip-origin", origin is not None)) if value]
        if asked or model.takes_clips:
            what = f"{', '.join(asked)} apply to videos" if asked else \
                f"the model takes clips of {model.frames} frames of a video"
            raise UsageProblem(f"IMAGES holds images, and {what}: give a video ({', '.join(VIDEO_SUFFIXES)}), or "
                               "a folder, list or tars of them.")
        return images
    if frames and frames > 1 and not model.takes_clips:
        raise UsageProblem(f"--clip {frames}: the model takes images, one frame a row (--clip 1); name a video model "
                           "for clips of frames, or a factory that declares featdump_clip.")
    plan = ClipPlan.asked(frames or model.frames, fps or model.fps, every, anchor, pad, origin or 0.0)
    return clip_rows(images, plan)


def is_video_list(images: ImageList) -> bool:
    """Whether every path of IMAGES names a video: by its suffix, or a local file's first bytes (a video named
    otherwise); its content is checked again as it is read."""
    def video(path: str) -> bool:
        if PurePosixPath(path).suffix.lower() in VIDEO_SUFFIXES:
            return True
        local = Location.of(images.root).join(path).file_here
        return local is not None and is_video_file(local)

    return len(images) > 0 and all(video(path) for path in images.paths)


def preprocess_for(loaded: LoadedModel, images: ImageList | None = None, fast_decode: bool = False) -> Preprocess:
    """The split of LOADED's preprocessing: a video model's, of clips of the job's frames (IMAGES' clips; without
    them, the model's own clip), else an image model's."""
    if not loaded.clip.takes_clips:
        return Preprocess(loaded.preprocessing, fast_decode)
    if images is None or images.clips is None:
        return ClipPreprocess(loaded.preprocessing, loaded.clip.frames)
    sizes = [info.size for info in images.clips.infos if info is not None]
    return ClipPreprocess(loaded.preprocessing, images.clips.frames, *sizes[:1])


def clip_rows(videos: ImageList, asked: ClipPlan) -> ImageList:
    """VIDEOS' clips under the plan ASKED (made concrete for each video's rate) as rows (the same path once per
    clip, `clips` saying which), in the videos' order; each video opened once for its frame times."""
    started = time.perf_counter()
    positions: list[int] = []
    starts: list[float] = []
    reasons: list[str] = []
    infos: list[VideoInfo | None] = []
    for position in range(len(videos)):
        try:
            info = video_info(_readable(videos.open(position).source))
            plan = asked.for_video(info.rate)
        except FeatdumpError:
            raise  # a store that stays away or refuses stops the job, as it does for images
        except Exception as error:  # any failure to read it is this video's skip, as a bad image's
            positions.append(position)
            starts.append(math.nan)
            reasons.append(f"cannot be read as a video ({describe_failure(error)})")
            infos.append(None)
            continue
        found = plan.starts(info.last)
        if not found:
            positions.append(position)
            starts.append(math.nan)
            reasons.append(f"shorter than one clip: {info.last:.3f} s from its first frame to its last, where a "
                           f"clip of {plan.frames} frames at {plan.fps:g} fps spans {plan.span:.3f} s")
            infos.append(None)
            continue
        positions += [position] * len(found)
        starts += found
        reasons += [""] * len(found)
        infos += [info] * len(found)  # the workers decode with them: no video is read again for its times
    without = sum(1 for reason in reasons if reason)
    log.info("Listed %d clips of %d videos (%d give none) in %.1f s.", len(starts) - without, len(videos), without,
             time.perf_counter() - started)
    rows = videos.select(positions)
    return dataclasses.replace(rows, clips=ClipTable(asked.frames, asked.fps, asked.every, tuple(starts),
                                                     tuple(reasons), tuple(infos), asked.anchor, asked.pad,
                                                     asked.origin))


def _readable(source):
    """What PyAV opens: a path as text, or the bytes' stream as it is."""
    return str(source) if isinstance(source, Path) else source


class ClipPreprocess(Preprocess):
    """A video model's preprocessing of a clip's frames, run whole in the loader workers: it takes (T, C, H, W)
    uint8 and gives the model's input for that clip (torchvision's VideoClassification: (C, T, H, W) float; a
    Hugging Face video processor: (T, C, H, W))."""

    def __init__(self, transforms, frames: int, frame_size: tuple[int, int] = (240, 320)):
        """TRANSFORMS of clips of FRAMES frames of FRAME_SIZE (the job's first video's: a transform that keeps the
        frames' size, as an optical flow model's, makes that video's size the job's)."""
        self.transforms, self.split, self.draft = transforms, False, None
        made = self.clip_pixels(np.zeros((frames, *frame_size, 3), dtype=np.uint8))
        self._shape = tuple(made.shape)
        self.size = self._shape[1:]
        self._portrait_size = self.size

    @property
    def input_shape(self) -> tuple[int, ...]:
        """A clip's input past the batch axis."""
        return self._shape

    def check_sizes(self, shapes, named: str) -> None:
        """MixedSizes when a clip (path: its input as preprocessed) does not come out at the model's input size: a
        batch needs one."""
        odd = {path: tuple(shape) for path, shape in shapes.items() if tuple(shape) != self.input_shape}
        if odd:
            path, shape = next(iter(odd.items()))
            raise MixedSizes(f"{named} makes clips of different sizes ({path!r} comes out {shape}, where "
                             f"{self.input_shape} was expected): a batch needs one size; give a --transform that "
                             "crops.")

    def check_one_size(self, named: str) -> None:
        pass  # one clip size, whatever a video's aspect: VideoClassification crops

    def clip_pixels(self, frames: np.ndarray) -> np.ndarray:
        """FRAMES ((T, H, W, 3) uint8 RGB) as the model takes them, computed on one thread: torch's antialiased
        uint8 resize rounds differently on one thread and on two (by a level of 255 here), and a loader worker
        has one; so every process makes the same pixels."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return np.asarray(self.transforms(torch.from_numpy(frames).permute(0, 3, 1, 2)))
        finally:
            torch.set_num_threads(threads)


class ClipDataset(ImageDataset):
    """Row i of a job's clips: its frames decoded by seeking (`inputs.video`), then the model's preprocessing: a
    video model's of the (T, H, W, 3) frames (`ClipPreprocess`), or an image model's of the one frame of a clip of
    1 (each sampled frame a row). A video with no clip is its row's recorded skip. A video's frame times are
    those read while the job was listed (`ClipTable.infos`)."""

    def __init__(self, images: ImageList, preprocess: Preprocess):
        super().__init__(images, preprocess)
        clips = images.clips
        self.asked = ClipPlan(clips.frames, clips.fps, clips.every, clips.anchor, clips.pad, clips.origin)

    def _decoded(self, position: int, encoded) -> Item:
        item = Item(position, file_stat=stat_as_read(encoded))
        try:
            if isinstance(encoded, Exception):
                raise encoded
            clips = self.images.clips
            if clips.reasons[position]:
                item.failure = clips.reasons[position]
                return item
            info = clips.infos[position]
            frames = decode_clip(_readable(encoded.source), info,
                                 self.asked.for_video(info.rate).times(clips.starts[position]))
            item.pixels = self.preprocess.clip_pixels(frames) if isinstance(self.preprocess, ClipPreprocess) \
                else self.preprocess.pixels(Image.fromarray(frames[0]))
        except FeatdumpError:
            raise  # the store stayed away mid-clip: the batch fails and the job stops (exit 75), as for images
        except Exception as error:  # any decoding failure is recorded, not raised
            item.failure = describe_failure(error)
        return item


def dataset_for(images: ImageList, preprocess: Preprocess, gpu_jpegs: bool = False) -> ImageDataset:
    """The loader's dataset of IMAGES: their clips' (a video job's), or their images'."""
    if images.clips is not None:
        return ClipDataset(images, preprocess)
    return ImageDataset(images, preprocess, gpu_jpegs)
