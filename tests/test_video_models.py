"""Models that take clips beyond torchvision's: a small Hugging Face VideoMAE saved to a folder (its own processor on
the clip's frames), and your own factory declaring the clip it takes. Rows equal a recomputation by hand: every
frame decoded from the start, the frames on screen at the sampling times, the model's preprocessing, the model with
hooks."""

from __future__ import annotations

import textwrap

import h5py
import numpy as np
import pytest
import torch

from tests.makers.videos import one_thread, write_video

from .helpers import read_output, run_featdump
from .test_video import all_frames, on_screen
from .test_video_extract import by_hand

pytest.importorskip("av")


@pytest.fixture(scope="module")
def film(tmp_path_factory):
    root = tmp_path_factory.mktemp("film")
    return write_video(root / "film.mkv", 40, size=(60, 80), gop=8)


def clip_frames(path, start: float, frames: int, fps: float) -> np.ndarray:
    """The (T, H, W, 3) frames of the clip at START, chosen by the rule from every frame decoded."""
    times, decoded = all_frames(path)
    return np.stack([decoded[on_screen(times, start + k / fps)] for k in range(frames)])


@pytest.fixture(scope="module")
def videomae(tmp_path_factory):
    """A 2-layer VideoMAE taking clips of 4 frames of 32x32, saved with its image processor."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("videomae")
    torch.manual_seed(3)
    config = transformers.VideoMAEConfig(image_size=32, patch_size=8, num_frames=4, tubelet_size=2, hidden_size=32,
                                         num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
    transformers.VideoMAEModel(config).save_pretrained(folder)
    transformers.VideoMAEImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
                                        ).save_pretrained(folder)
    return folder


def test_a_hugging_face_video_model_takes_clips_of_its_num_frames_through_its_processor(film, videomae, tmp_path):
    transformers = pytest.importorskip("transformers")
    output = tmp_path / "vmae.h5"
    result = run_featdump("extract", "-m", f"hf:{videomae}", "-l", "encoder.layer.0,@last_hidden_state",
                          "--fps", "10", film, output)
    assert result.returncode == 0, result.stderr
    content = read_output(output)
    with h5py.File(output, "r") as h5file:
        starts = h5file["clip_start"][:]
        assert h5file.attrs["clip_frames"] == 4  # the config's num_frames
    np.testing.assert_allclose(starts, [0.0, 0.4, 0.8, 1.2])  # 40 frames at 25 fps: the last at 1.56 s
    model = transformers.VideoMAEModel.from_pretrained(videomae).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(videomae)
    for row, start in enumerate(starts):
        frames = list(clip_frames(film, start, 4, 10.0))
        inputs = processor(frames, return_tensors="pt")["pixel_values"]  # (1, T, C, H, W)
        expected = by_hand(model, ["encoder.layer.0"], inputs)
        with torch.inference_mode():
            last = model(inputs).last_hidden_state.numpy()
        assert content["encoder.layer.0"][row].shape == (32, 32)  # (T/2) x (32/8)^2 tubelet tokens
        np.testing.assert_allclose(content["encoder.layer.0"][row], expected["encoder.layer.0"][0], rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(content["@last_hidden_state"][row], last[0], rtol=1e-4, atol=1e-5)


def test_list_layers_shows_a_video_model_s_clip(videomae):
    result = run_featdump("list-layers", f"hf:{videomae}", "--depth", "1")
    assert result.returncode == 0, result.stderr
    assert "output shape of one (4, 3, 32, 32) clip" in result.stdout, result.stdout


FACTORY = '''
import torch
from torch import nn


class Tiny3d(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv3d(3, 8, kernel_size=3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.AdaptiveAvgPool3d((None, 1, 1))

    def forward(self, clip):  # (N, C, T, H, W)
        return self.pool(self.relu(self.stem(clip)))


def build():
    return Tiny3d()


build.featdump_clip = (3, 5.0)


def image_model():
    return nn.Sequential(nn.Conv2d(3, 4, 3))
'''


def test_a_factory_declaring_clips_gets_them_and_the_kinetics_transform(film, tmp_path):
    (tmp_path / "clipnet.py").write_text(textwrap.dedent(FACTORY))
    output = tmp_path / "factory.h5"
    result = run_featdump("extract", "-m", "clipnet:build", "-l", "relu,pool", film, output, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Kinetics clip transform" in result.stderr
    content = read_output(output)
    with h5py.File(output, "r") as h5file:
        starts = h5file["clip_start"][:]
    np.testing.assert_allclose(starts, [0.0, 0.6])  # 3 frames at 5 fps span 0.4 s; the last frame at 1.56 s
    import sys

    from torchvision.transforms._presets import VideoClassification

    sys.path.insert(0, str(tmp_path))
    try:
        import clipnet
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("clipnet", None)
    torch.manual_seed(0)
    model = clipnet.build().eval()
    transform = VideoClassification(crop_size=(112, 112), resize_size=(128, 171))
    for row, start in enumerate(starts):
        frames = torch.from_numpy(clip_frames(film, start, 3, 5.0)).permute(0, 3, 1, 2)
        clip = one_thread(transform, frames)[None]
        expected = by_hand(model, ["relu", "pool"], clip)
        assert content["relu"][row].shape == (8, 3, 112, 112)
        for layer in ("relu", "pool"):
            np.testing.assert_allclose(content[layer][row], expected[layer][0], rtol=1e-4, atol=1e-5)


def test_clips_of_frames_for_an_image_model_are_refused_in_one_line(film, tmp_path):
    (tmp_path / "clipnet.py").write_text(textwrap.dedent(FACTORY))
    result = run_featdump("extract", "-m", "clipnet:image_model", "-l", "0", "--clip", "4", film,
                          tmp_path / "out.h5", cwd=tmp_path)
    assert result.returncode != 0
    assert "--clip 4: the model takes images, one frame a row (--clip 1)" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_optical_flow_rows_are_raft_s_last_estimate_for_each_pair_of_frames(tmp_path):
    """raft_small on a video: clips of 2 frames (its own), back to back at the video's rate; a row is the last
    flow estimate between them, at the video's size cropped to multiples of 8."""
    from torchvision.models import get_model, get_model_weights
    from torchvision.transforms.functional import center_crop

    video = write_video(tmp_path / "flow" / "walk.mkv", 6, size=(132, 164), gop=4)
    output = tmp_path / "flow.h5"
    result = run_featdump("extract", "-m", "raft_small", "-w", "none", "-l", "@,context_encoder", video.parent,
                          output)
    assert result.returncode == 0, result.stderr
    content = read_output(output)
    with h5py.File(output, "r") as h5file:
        starts = h5file["clip_start"][:]
    np.testing.assert_allclose(starts, [0.0, 0.08, 0.16])  # pairs of frames at 25 fps, back to back
    assert "Wrote 3 clips (0 skipped)" in result.stderr
    assert "clip_fps:   each video's own rate" in run_featdump("info", output).stdout
    torch.manual_seed(0)
    raft = get_model("raft_small", weights=None).eval()
    transforms = get_model_weights("raft_small").DEFAULT.transforms()
    for row, start in enumerate(starts):
        pair = center_crop(torch.from_numpy(clip_frames(video, start, 2, 25.0)).permute(0, 3, 1, 2), [128, 160])
        first, second = transforms(pair[0], pair[1])
        taken = []
        handle = raft.context_encoder.register_forward_hook(
            lambda module, args, out, taken=taken: taken.append(out.clone()))
        with torch.inference_mode():
            flow = raft(first[None], second[None])[-1]
        handle.remove()
        assert content["@"][row].shape == (2, 128, 160)
        np.testing.assert_allclose(content["@"][row], flow[0].numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(content["context_encoder"][row], taken[0][0].numpy(), rtol=1e-4, atol=1e-5)


def test_optical_flow_on_still_images_or_clips_of_3_is_refused_in_one_line(tmp_path):
    from .helpers import write_images

    write_images(tmp_path / "stills", {"": 2})
    result = run_featdump("extract", "-m", "raft_small", "-w", "none", "-l", "@", tmp_path / "stills",
                          tmp_path / "out.h5")
    assert result.returncode != 0 and "the model takes clips of 2 frames of a video" in result.stderr
    video = write_video(tmp_path / "walk.mkv", 6, size=(128, 128))
    result = run_featdump("extract", "-m", "raft_small", "-w", "none", "-l", "@", "--clip", "3", video,
                          tmp_path / "out.h5")
    assert result.returncode != 0
    assert "raft_small estimates the flow between a pair of frames: give --clip 2, not --clip 3" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_proof_of_clip_rows_names_their_clip_starts(film, tmp_path):
    (tmp_path / "clipnet.py").write_text(textwrap.dedent(FACTORY))
    output = tmp_path / "bf16.h5"
    result = run_featdump("extract", "-m", "clipnet:build", "-l", "relu,pool", "--precision", "bf16", film, output,
                          cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "; proof: 2 clips recomputed on the reference path" in result.stderr
    with h5py.File(output, "r") as h5file:
        (proof,) = __import__("json").loads(h5file.attrs["proof"])
    assert proof["rows"] == "clip" and proof["images"] == [f"{film.name} @ 0 s", f"{film.name} @ 0.6 s"]
    info = run_featdump("info", output).stdout
    assert "proof:      cpu, bf16: 2 clips recomputed on the reference path" in info


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_the_default_batch_of_large_clips_fits_a_laptop_and_says_so(film, tmp_path, monkeypatch):
    """r3d_18's 64 clips took 4.5-5.3 GB on a CPU: with 8 GB free (a laptop), the default batch is what a quarter of
    it holds (2 GB at most), said at INFO; -b is taken as given."""
    from featdump.job import plan
    from featdump.job.settings import Settings

    monkeypatch.setattr(plan, "free_memory", lambda device: 8 * 10**9)
    output = tmp_path / "clips.h5"
    chosen = run_featdump("extract", "-m", "r3d_18", "-w", "none", "-l", "layer1", "--reduce", "avgpool", film, output)
    assert chosen.returncode == 0, chosen.stderr
    (said,) = [line for line in chosen.stderr.splitlines() if "INFO: Batch size" in line]
    size = int(said.split("Batch size ")[1].split()[0])
    assert 16 <= size <= 32 and "(not 64): a clip takes about 79 MB in the forward" in said, said
    with h5py.File(output, "r") as h5file:
        assert __import__("json").loads(h5file.attrs["settings"])["batch_size"] == size
    given = plan.sized(Settings(model="r3d_18", layers=("layer1",), images=film, output=output, batch_size=64), None,
                       "clip")
    assert given.batch_size == 64  # -b as given: no estimate made
