"""Videos: which files are videos, each video's frame times, the clips it gives and their frames, decoded by seeking,
against every frame decoded from the start and the sampling rule applied by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from featdump.inputs.video import ClipPlan, decode_clip, looks_like_video, video_info
from tests.makers.videos import frame_pixels, one_thread, write_video

av = pytest.importorskip("av")


def all_frames(path) -> tuple[list[float], list[np.ndarray]]:
    """Every frame of PATH decoded from the start: (times from the first frame, RGB)."""
    with av.open(str(path)) as container:
        frames = list(container.decode(video=0))
    first = frames[0].time
    return [frame.time - first for frame in frames], [frame.to_ndarray(format="rgb24") for frame in frames]


def on_screen(times: list[float], at: float) -> int:
    """The index of the last frame whose time is <= AT (the rule, by hand)."""
    return max(index for index, time in enumerate(times) if time <= at + 1e-9)


@pytest.mark.parametrize("suffix", [".mkv", ".mp4"])
def test_a_clip_s_frames_are_those_on_screen_at_its_sampling_times(tmp_path, suffix):
    """50 lossless frames at 25 fps (the last at 1.96 s), keyframes every 12 frames; clips of 4 frames at 10 fps
    every 0.45 s: each frame the one on screen at s + k/10, as decoding every frame from the start says."""
    path = write_video(tmp_path / f"v{suffix}", 50)
    times, frames = all_frames(path)
    assert np.array_equal(frames[17], frame_pixels(17))  # lossless: the frames are the ones written
    info = video_info(str(path))
    assert info.last == pytest.approx(1.96) and info.rate == 25 and info.size == (48, 64)
    plan = ClipPlan.of(4, 10, 0.45)
    starts = plan.starts(info.last)
    assert starts == [0.0, 0.45, 0.9, 1.35]  # the next, 1.8, would end at 2.1 > 1.96
    for start in starts:
        clip = decode_clip(str(path), info, plan.times(start))
        expected = [on_screen(times, at) for at in plan.times(start)]
        assert clip.shape == (4, 48, 64, 3) and clip.dtype == np.uint8
        for frame, index in zip(clip, expected):
            np.testing.assert_array_equal(frame, frames[index])


def test_clip_starts_follow_the_rule_to_the_last_frame():
    plan = ClipPlan.of(16, 15)  # back to back: a clip every 16/15 s
    assert plan.every == pytest.approx(16 / 15) and plan.span == pytest.approx(1.0)
    assert plan.starts(0.99) == []  # shorter than one clip
    assert plan.starts(1.0) == [0.0]  # exactly one: its last frame on the video's last
    assert len(plan.starts(60.0)) == 56 and plan.starts(60.0)[-1] == pytest.approx(55 * 16 / 15)
    assert ClipPlan.of(1, 2.0).starts(1.0) == [0.0, 0.5, 1.0]  # single frames of an image model, 2 a second
    tr = ClipPlan.of(1, 25, 1.49)
    assert tr.starts(10.0) == pytest.approx([1.49 * index for index in range(7)])  # on an fMRI TR grid


def test_a_frame_past_the_last_stays_on_screen_and_a_lossy_video_counts_alike(tmp_path):
    path = write_video(tmp_path / "lossy.mp4", 30, fps=30, lossless=False)
    info = video_info(str(path))
    assert info.last == pytest.approx(29 / 30)
    assert ClipPlan.of(8, 6).starts(info.last) == []  # 7/6 s of frames: longer than the video
    assert ClipPlan.of(4, 6).starts(info.last) == [0.0]  # the next would end at 1.17 s
    assert decode_clip(str(path), info, np.array([0.5, 0.9667, 5.0])).shape == (3, 48, 64, 3)


def test_videos_are_known_by_their_first_bytes(tmp_path):
    for name in ("a.mkv", "b.mp4"):
        write_video(tmp_path / name, 3)
        assert looks_like_video((tmp_path / name).read_bytes()[:12])
    renamed = tmp_path / "clip.bin"
    renamed.write_bytes((tmp_path / "b.mp4").read_bytes())
    assert looks_like_video(renamed.read_bytes()[:12])  # by content, not by suffix
    assert not looks_like_video(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01")  # a JPEG
    damaged = tmp_path / "damaged.mp4"
    damaged.write_bytes((tmp_path / "b.mp4").read_bytes()[:200])
    with pytest.raises((av.error.FFmpegError, ValueError, StopIteration)):
        video_info(str(damaged))


def test_a_list_of_videos_becomes_rows_one_per_clip(tmp_path):
    from featdump.inputs.clips import clip_rows
    from featdump.inputs.imagelist import ImageList

    write_video(tmp_path / "a" / "long.mkv", 50)
    write_video(tmp_path / "a" / "short.mkv", 5)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "bad.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(100))  # a header, then nothing
    videos = ImageList(tmp_path, ("a/long.mkv", "a/short.mkv", "b/bad.mp4"), (0, 0, 1), ("a", "b"))
    rows = clip_rows(videos, ClipPlan.of(4, 10, 0.5))
    assert rows.paths == ("a/long.mkv",) * 4 + ("a/short.mkv", "b/bad.mp4")
    assert rows.labels == (0, 0, 0, 0, 0, 1)
    clips = rows.clips
    assert clips.starts[:4] == (0.0, 0.5, 1.0, 1.5) and all(np.isnan(clips.starts[4:]))
    assert clips.reasons[:4] == ("",) * 4
    assert clips.reasons[4].startswith("shorter than one clip: 0.160 s from its first frame to its last")
    assert clips.reasons[5].startswith("cannot be read as a video (")
    part = rows.select([1, 3])  # a shard, a selection: the clips go with their rows
    assert part.clips.starts == (0.5, 1.5) and part.row_coordinates([0, 1])["clip_start"].tolist() == [0.5, 1.5]
    assert rows.digest() != clip_rows(videos, ClipPlan.of(4, 10, 0.25)).digest()  # the clips are in the digest


def test_a_clip_row_is_its_frames_through_the_model_s_preprocessing(tmp_path):
    """r3d_18's weights' transform on each clip, and resnet18's on each sampled frame (clips of 1), against the
    frames chosen by hand from a decode of every frame."""
    from PIL import Image
    from torchvision.models import get_model_weights

    from featdump.inputs.clips import ClipDataset, ClipPreprocess, clip_rows
    from featdump.inputs.imagelist import ImageList
    from featdump.inputs.preprocess import Preprocess

    path = write_video(tmp_path / "v" / "a.mkv", 50, size=(96, 128))
    times, frames = all_frames(path)
    videos = ImageList(tmp_path / "v", ("a.mkv",), (-1,), ())
    video_transform = get_model_weights("r3d_18").DEFAULT.transforms()
    plan = ClipPlan.of(8, 15, 0.5)
    rows = clip_rows(videos, plan)
    dataset = ClipDataset(rows, ClipPreprocess(video_transform, 8))
    assert dataset.preprocess.size == (8, 112, 112) and len(dataset) == len(rows.clips.starts) == 3
    for position, start in enumerate(rows.clips.starts):
        chosen = np.stack([frames[on_screen(times, at)] for at in plan.times(start)])
        expected = one_thread(video_transform, torch.from_numpy(chosen).permute(0, 3, 1, 2)).numpy()
        np.testing.assert_array_equal(dataset[position].pixels, expected)
    image_plan = ClipPlan.of(1, 2.0)  # an image model on 2 frames a second
    image_transform = get_model_weights("resnet18").DEFAULT.transforms()
    rows = clip_rows(videos, image_plan)
    assert rows.clips.starts == (0.0, 0.5, 1.0, 1.5)
    preprocess = Preprocess(image_transform)
    dataset = ClipDataset(rows, preprocess)
    for position, start in enumerate(rows.clips.starts):
        expected = preprocess.pixels(Image.fromarray(frames[on_screen(times, start)]))
        np.testing.assert_array_equal(dataset[position].pixels, expected)


def test_torchvision_s_video_models_state_their_clip_and_keep_the_time_axis():
    from featdump.sources.video_models import build, clip_defaults, video_model_names

    assert set(video_model_names()) == {"r3d_18", "mc3_18", "r2plus1d_18", "s3d", "mvit_v1_b", "mvit_v2_s",
                                        "swin3d_t", "swin3d_s", "swin3d_b"}
    assert clip_defaults("r3d_18") == (16, 15.0) and clip_defaults("mvit_v1_b") == (16, 7.5)
    assert clip_defaults("swin3d_t") == (32, 15.0)
    model = build("r3d_18", seed=0)
    seen = {}
    model.layer2.register_forward_hook(lambda module, inputs, output: seen.update(layer2=output.shape))
    with torch.inference_mode():
        model(torch.randn(1, 3, 16, 112, 112))
    assert tuple(seen["layer2"]) == (1, 128, 8, 28, 28)  # (channel, time, y, x): the time axis kept
    again = build("r3d_18", seed=0)
    assert torch.equal(model.layer2[0].conv1[0].weight, again.layer2[0].conv1[0].weight)  # seeded
