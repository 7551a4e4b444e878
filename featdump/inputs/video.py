"""Video: clips of video files, decoded with PyAV (`featdump[video]`: its wheels carry FFmpeg, so pip alone installs
it on a fresh machine, where torchcodec loads the system's FFmpeg). Which files are videos (by their first bytes,
not their suffix), each video's frame times, the clips it gives, and a clip's frames decoded by seeking to it:
never the whole video in memory.

A clip of N frames sampled at F frames a second that starts at time s holds, for k = 0..N-1, the frame on screen at
s + k/F: the last frame whose presentation time is <= s + k/F, times measured from the stream's first frame; it
covers [s, s + N/F), its offset. Anchored at their start (the default), clips start at 0, S, 2S, ... while the
clip's last frame time s + (N-1)/F is <= the video's last frame time. Anchored at their end (causal windows, each
the N frames before an onset t = 0, S, 2S, ...: s = t - N/F), a window that reaches before the first frame is left
out, or padded by repeating the first frame (a time before it shows the first frame: s < 0 records it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from featdump.errors import UsageProblem

VIDEO_SUFFIXES = (".mp4", ".mkv", ".webm", ".avi", ".mov")
GRID_DECIMALS = 9  # a grid time is a multiple of its step rounded to this many decimals: 5 x 1.49 s is 7.45 itself
ANCHORS = ("start", "end")  # --clip-anchor: the grid gives clips' starts, or their ends (causal windows)
PADS = ("skip", "repeat")  # --clip-pad: an end-anchored window reaching before the first frame
_TOLERANCE = 1e-6  # seconds: a frame time and a sampling time this close are the same instant
_END_SEEK = 3.0  # seconds before the stream's stated end where its last frame is looked for


def looks_like_video(head: bytes) -> bool:
    """Whether the first bytes HEAD (12 or more) are those of a video container: ISO BMFF (mp4, mov: `ftyp` at
    byte 4), Matroska or WebM (the EBML magic) or AVI (RIFF....AVI )."""
    return head[4:8] == b"ftyp" or head[:4] == b"\x1a\x45\xdf\xa3" or (head[:4] == b"RIFF" and head[8:12] == b"AVI ")


def is_video_name(name: str) -> bool:
    """Whether NAME (a path, a tar member's, a key) is named as a video: by its suffix (where its bytes lie in a
    tar or a store, it is not opened to be told)."""
    return name.lower().endswith(VIDEO_SUFFIXES)


def is_video_file(path) -> bool:
    """Whether the file at PATH is a video: by its suffix, or by its first bytes."""
    if is_video_name(str(path)):
        return True
    with open(path, "rb") as handle:
        return looks_like_video(handle.read(12))


def pyav():
    """The av module (PyAV); UsageProblem naming the extra that installs it when it is missing."""
    try:
        import av
    except ImportError as error:
        raise UsageProblem("Reading videos needs PyAV, which is not installed: pip install 'featdump[video]'.") \
            from error
    return av


@dataclass(frozen=True)
class ClipPlan:
    """Rows of a video: clips of FRAMES frames sampled at FPS frames a second, one starting every EVERY seconds."""

    frames: int
    fps: float
    every: float
    anchor: str = "start"  # the grid times are the clips' starts, or their ends (ANCHORS)
    pad: str = "skip"  # an end-anchored window reaching before the first frame: left out, or padded (PADS)
    origin: float = 0.0  # seconds: one time of the grid (a film that starts between a scanner's pulses)

    @classmethod
    def of(cls, frames: int, fps: float, every: float | None = None, anchor: str = "start",
           pad: str = "skip", origin: float = 0.0) -> ClipPlan:
        """The plan for FRAMES at FPS, a clip every EVERY seconds (default N/F: back to back)."""
        return cls.asked(frames, fps, every, anchor, pad, origin).for_video(0.0)

    @classmethod
    def asked(cls, frames: int, fps: float | None = None, every: float | None = None, anchor: str = "start",
              pad: str = "skip", origin: float = 0.0) -> ClipPlan:
        """The plan as asked, before a video is seen: FPS None (0) for each video's own rate, EVERY None (0) for
        back to back."""
        if frames < 1 or (fps is not None and not fps > 0) or (every is not None and not every > 0):
            raise UsageProblem(f"--clip {frames}, --fps {fps}, --clip-every {every}: give a clip of 1 frame or more, "
                               "and a positive rate and step.")
        if anchor not in ANCHORS or pad not in PADS:
            raise UsageProblem(f"--clip-anchor {anchor}, --clip-pad {pad}: choose from {', '.join(ANCHORS)} and "
                               f"{', '.join(PADS)}.")
        if pad != "skip" and anchor != "end":
            raise UsageProblem(f"--clip-pad {pad} pads windows that end on the grid: add --clip-anchor end (a clip "
                               "that starts on the grid never reaches before the first frame).")
        return cls(int(frames), float(fps or 0.0), float(every or 0.0), anchor, pad, float(origin or 0.0))

    def for_video(self, rate: float) -> ClipPlan:
        """This plan for a video of RATE frames a second: its own rate where none was asked, clips back to back
        where no step was."""
        fps = self.fps or rate
        if not fps > 0:
            raise ValueError("it states no frame rate: give --fps")
        return ClipPlan(self.frames, fps, self.every or self.frames / fps, self.anchor, self.pad, self.origin)

    @property
    def span(self) -> float:
        """Seconds from a clip's first frame time to its last."""
        return (self.frames - 1) / self.fps

    @property
    def duration(self) -> float:
        """Seconds a clip covers: from its start to its offset (N/F)."""
        return self.frames / self.fps

    def grid(self, until: float) -> list[float]:
        """The grid's times from the video's first frame (0) up to UNTIL: O + kS for every whole k, O the origin."""
        first = math.ceil(-self.origin / self.every - _TOLERANCE)
        last = math.floor((until - self.origin) / self.every + _TOLERANCE)
        return [round(self.origin + index * self.every, GRID_DECIMALS) for index in range(first, last + 1)]

    def starts(self, last: float) -> list[float]:
        """The clip starts of a video whose last frame is at LAST seconds from its first: on the grid O, O + S, ...
        (O the origin, 0 unless given; or ending on it) while the clip's last frame time is <= LAST. None when the
        video is shorter than one."""
        if self.anchor == "end":
            return self._window_starts(last)
        if last + _TOLERANCE < self.span:
            return []
        return self.grid(last - self.span)

    def _window_starts(self, last: float) -> list[float]:
        """The starts of the windows ending on the grid (onsets t on it from 0 up to the last frame's time plus a
        frame): t - N/F, those before the first frame left out unless padded."""
        starts = [round(onset - self.duration, GRID_DECIMALS) for onset in self.grid(last + 1 / self.fps)]
        return starts if self.pad == "repeat" else [start for start in starts if start >= -_TOLERANCE]

    def times(self, start: float) -> np.ndarray:
        """The sampling times (seconds from the first frame) of the clip that starts at START: a time before the
        first frame (a padded window's) takes the first frame."""
        return np.maximum(start + np.arange(self.frames) / self.fps, 0.0)


@dataclass(frozen=True)
class VideoInfo:
    """A video's first video stream as it is read: its first frame's time, its last frame's (from the first), the
    stream's stated average rate (frames a second; 0 when it states none), its frame size, and its frames counted
    by their packets (a local file's; -1 where not counted)."""

    first: Fraction  # seconds, the first frame's presentation time
    last: float  # seconds from the first frame to the last
    rate: float
    size: tuple[int, int]  # (height, width)
    frames: int = -1


def video_info(source) -> VideoInfo:
    """SOURCE's (a path or a binary file) frame times: its first frame, and its last, found by seeking near the
    stream's stated end and decoding from there (exact, and cheap: a few seconds are decoded, not the video). A
    local file's frames are counted too, by their packets, read without decoding (as `ffprobe -count_packets`);
    a stream's (a tar member, an object in a store) are not: that would read it whole."""
    av = pyav()
    with av.open(source) as container:
        stream = _video_stream(container)
        first_frame = next(container.decode(stream))
        first = _seconds(first_frame, stream)
        size = (first_frame.height, first_frame.width)
        last = _last_time(container, stream, first)
        rate = float(stream.average_rate) if stream.average_rate else 0.0
        frames = _packets(container, stream) if isinstance(source, str) else -1
    return VideoInfo(first, float(last - first), rate, size, frames)


def _packets(container, stream) -> int:
    """The stream's packets that hold data, read from its start without decoding: its frame count."""
    container.seek(0, stream=stream, backward=True, any_frame=False)
    return sum(1 for packet in container.demux(stream) if packet.size)


def _video_stream(container):
    if not container.streams.video:
        raise ValueError("it holds no video stream")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    return stream


def _seconds(frame, stream) -> Fraction:
    """FRAME's presentation time in seconds (exact)."""
    pts = frame.pts if frame.pts is not None else frame.dts
    if pts is None:
        raise ValueError("a frame has no presentation time")
    return Fraction(pts) * Fraction(frame.time_base or stream.time_base)


def _last_time(container, stream, first: Fraction) -> Fraction:
    """The last frame's time: decoded from a seek _END_SEEK seconds before the stated end (from the start when the
    stream states no duration, or the seek finds nothing)."""
    end = _stated_end(container, stream)
    for back in (_END_SEEK, 4 * _END_SEEK, None):
        if back is not None and end is None:
            continue
        target = first if back is None else max(first, end - Fraction(back))
        container.seek(int(target / Fraction(stream.time_base)), stream=stream, backward=True, any_frame=False)
        last = None
        for frame in container.decode(stream):
            last = _seconds(frame, stream)
        if last is not None:
            return max(last, first)
    return first


def _stated_end(container, stream) -> Fraction | None:
    if stream.duration is not None:
        return Fraction(stream.start_time or 0) * Fraction(stream.time_base) \
            + Fraction(stream.duration) * Fraction(stream.time_base)
    if container.duration is not None:
        return Fraction(container.duration, 1_000_000)
    return None


def decode_clip(source, info: VideoInfo, times: np.ndarray) -> np.ndarray:
    """The frames on screen at each of TIMES (ascending seconds from the first frame) of SOURCE, as (N, H, W, 3)
    uint8 RGB: for each time, the last frame whose time is <= it. Decoding starts at the keyframe before the first
    time (an earlier one when that seek lands past it) and stops after the last time."""
    av = pyav()
    with av.open(source) as container:
        stream = _video_stream(container)
        for back in (0.0, 1.0, 4.0, None):
            frames = _frames_at(container, stream, info, times, back)
            if frames is not None:
                return np.stack(frames)
    raise ValueError(f"no frame is on screen at {times[0]:.3f} s")


def _frames_at(container, stream, info: VideoInfo, times: np.ndarray, back: float | None) -> list | None:
    """The frames at TIMES decoded from a seek BACK seconds before the first of them (None: from the start); None
    when the seek landed past the first time."""
    target = info.first + (Fraction(max(0.0, float(times[0]) - back)) if back is not None else 0)
    container.seek(int(target / Fraction(stream.time_base)), stream=stream, backward=True, any_frame=False)
    chosen: list = [None] * len(times)
    index, previous, pixels = 0, None, None  # the last frame decoded, and its RGB once a time has taken it
    for frame in container.decode(stream):
        at = float(_seconds(frame, stream) - info.first)
        while index < len(times) and at > times[index] + _TOLERANCE:
            if previous is None:
                return None  # the seek went past the first time
            pixels = previous.to_ndarray(format="rgb24") if pixels is None else pixels
            chosen[index] = pixels
            index += 1
        if index == len(times):
            break
        previous, pixels = frame, None
    if previous is None:
        return None
    while index < len(times):  # past the last frame: it stays on screen
        pixels = previous.to_ndarray(format="rgb24") if pixels is None else pixels
        chosen[index] = pixels
        index += 1
    return chosen
