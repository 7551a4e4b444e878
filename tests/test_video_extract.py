"""Videos through `featdump extract`: rows are clips, equal to a recomputation by hand (every frame decoded from
the start, the frame on screen at each sampling time, the weights' transform, the model with hooks); a short
video is a recorded skip; clip starts are a coordinate; a crash, then the same command, equals a fresh run."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models import get_model, get_model_weights

import featdump
from featdump.forward import hardware
from featdump.job.runner import extract
from tests.makers.videos import one_thread, write_video

from .helpers import SMALL_RESNET, CrashAfterFirstBatch, read_output, run_featdump, settings_for
from .test_video import all_frames, on_screen

pytest.importorskip("av")


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("videos")
    write_video(root / "a" / "one.mkv", 50, size=(96, 128))
    write_video(root / "b" / "two.mkv", 40, size=(96, 128), seed=1)
    write_video(root / "b" / "tiny.mkv", 3, size=(96, 128), seed=2)
    return root


def by_hand(model, layers: list[str], inputs: torch.Tensor) -> dict[str, np.ndarray]:
    """LAYERS of MODEL on INPUTS, taken by forward hooks (a copy of each output)."""
    taken, handles = {}, []
    for name in layers:
        module = model.get_submodule(name)
        handles.append(module.register_forward_hook(
            lambda module, args, output, name=name: taken.__setitem__(name, output.detach().clone())))
    with torch.inference_mode():
        model(inputs)
    for handle in handles:
        handle.remove()
    return {name: value.numpy() for name, value in taken.items()}


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_video_model_s_rows_are_its_clips_as_computed_by_hand(videos, tmp_path):
    output = tmp_path / "out.h5"
    result = run_featdump("extract", "-m", "r3d_18", "-w", "none", "-l", "layer2,avgpool", "--clip", "8", "--fps",
                          "15", videos, output)
    assert result.returncode == 0 and "Wrote 6 clips (1 skipped)" in result.stderr, result.stderr
    content = read_output(output)
    with h5py.File(output, "r") as h5file:
        starts = h5file["clip_start"][:]
        assert "clip_start" in h5file["features"]["layer2"].attrs["coordinates"]
        skipped = dict(zip(h5file["skipped/paths"].asstr()[:], h5file["skipped/reasons"].asstr()[:]))
    assert content["paths"] == ["a/one.mkv"] * 3 + ["b/two.mkv"] * 3
    np.testing.assert_allclose(starts, [0, 8 / 15, 16 / 15] * 2)
    assert skipped["b/tiny.mkv"].startswith("shorter than one clip")
    described = run_featdump("info", output).stdout
    assert "clip_frames: 8" in described and "clip_fps:   15.0" in described, described
    assert "  layer2: (128, 4, 28, 28) float32" in described
    torch.manual_seed(0)
    model = get_model("r3d_18", weights=None).eval()
    transform = get_model_weights("r3d_18").DEFAULT.transforms()
    for row, (path, start) in enumerate(zip(content["paths"], starts)):
        times, frames = all_frames(videos / path)
        chosen = np.stack([frames[on_screen(times, start + k / 15)] for k in range(8)])
        clip = one_thread(transform, torch.from_numpy(chosen).permute(0, 3, 1, 2))[None]  # as a worker does
        expected = by_hand(model, ["layer2", "avgpool"], clip)
        assert content["layer2"][row].shape == (128, 4, 28, 28)  # the time axis kept
        for layer in ("layer2", "avgpool"):
            np.testing.assert_allclose(content[layer][row], expected[layer][0], rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_an_image_model_on_frames_and_a_crash_resumed(videos, tmp_path):
    """resnet18 on 2 frames a second (clips of 1): each sampled frame a row; crashed after its first batch, then
    run again, it equals a fresh run."""
    frames_dir = tmp_path / "frames"
    (frames_dir / "a").mkdir(parents=True)
    (frames_dir / "a" / "one.mkv").symlink_to(videos / "a" / "one.mkv")
    output = tmp_path / "out.h5"
    settings = settings_for(frames_dir, output, fps=2.0, batch_size=2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        extract(settings, CrashAfterFirstBatch())
    extract(settings)
    fresh = tmp_path / "fresh.h5"
    extract(settings_for(frames_dir, fresh, fps=2.0, batch_size=2))
    content, expected = read_output(output), read_output(fresh)
    assert content["paths"] == ["a/one.mkv"] * 4
    np.testing.assert_array_equal(content["avgpool"], expected["avgpool"])
    with h5py.File(output, "r") as h5file:
        np.testing.assert_array_equal(h5file["clip_start"][:], [0.0, 0.5, 1.0, 1.5])
        assert (h5file.attrs["clip_frames"], h5file.attrs["clip_fps"]) == (1, 2.0)
    torch.manual_seed(0)
    model = get_model("resnet18", weights=None).eval()
    transform = get_model_weights("resnet18").DEFAULT.transforms()
    times, frames = all_frames(videos / "a" / "one.mkv")
    for row, start in enumerate([0.0, 0.5, 1.0, 1.5]):
        image = transform(Image.fromarray(frames[on_screen(times, start)]))[None]
        np.testing.assert_allclose(content["avgpool"][row], by_hand(model, ["avgpool"], image)["avgpool"][0],
                                   rtol=1e-4, atol=1e-5)


def test_clip_options_on_images_and_a_video_model_on_images_are_one_line(tmp_path):
    from .helpers import write_images

    write_images(tmp_path / "images", {"a": 2})
    for arguments, message in ((["-m", "resnet18", "--clip", "4"], "--clip apply to videos"),
                               (["-m", "resnet18", "--clip-anchor", "end"], "--clip-anchor apply to videos"),
                               (["-m", "r3d_18"], "the model takes clips of 16 frames of a video")):
        result = run_featdump("extract", *arguments, "-w", "none", "-l", "avgpool", tmp_path / "images",
                              tmp_path / "out.h5")
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def rows_by_clip(path) -> dict:
    with h5py.File(path, "r") as h5file:
        keys = zip(h5file["paths"].asstr()[:], h5file["clip_start"][:])
        return {(name, round(float(start), 6)): row for row, (name, start) in
                zip(h5file["features/avgpool"][:], keys)}


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_update_adds_a_new_video_s_clips_and_shards_merge_to_one_run(videos, tmp_path):
    folder = tmp_path / "films"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "one.mkv").symlink_to(videos / "a" / "one.mkv")
    common = ["extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "2"]
    output = tmp_path / "out.h5"
    assert run_featdump(*common, "--update", folder, output).returncode == 0
    (folder / "b").mkdir()
    (folder / "b" / "two.mkv").symlink_to(videos / "b" / "two.mkv")
    updated = run_featdump(*common, "--update", folder, output)
    assert updated.returncode == 0 and "Wrote 4 clips" in updated.stderr, updated.stderr
    fresh = tmp_path / "fresh.h5"
    assert run_featdump(*common, folder, fresh).returncode == 0
    mine, expected = rows_by_clip(output), rows_by_clip(fresh)
    assert set(mine) == set(expected) and len(mine) == 8  # 4 clips of each
    for key, row in expected.items():
        np.testing.assert_array_equal(mine[key], row)
    for index in range(2):
        part = run_featdump(*common, "--shard", f"{index}/2", folder, tmp_path / "sharded.h5")
        assert part.returncode == 0, part.stderr
    assert run_featdump("merge", tmp_path / "sharded.h5", "--copy").returncode == 0
    merged = rows_by_clip(tmp_path / "sharded.h5")
    assert list(merged) == list(expected)  # the same rows, in the same order, with their clip starts
    for key, row in expected.items():
        np.testing.assert_array_equal(merged[key], row)


@pytest.mark.slow  # three extractions (about 10 s): keeps `make test` under 5 minutes
def test_update_adds_a_layer_to_clip_rows_as_a_fresh_run_computes_it(videos, tmp_path):
    common = ["extract", *SMALL_RESNET, "--fps", "4"]  # a frame every 0.25 s: 8 + 7 + 1 rows
    output, fresh = tmp_path / "out.h5", tmp_path / "fresh.h5"
    assert run_featdump(*common, "-l", "avgpool", videos, output).returncode == 0
    grown = run_featdump(*common, "-l", "avgpool,layer1", "--update", videos, output)
    assert grown.returncode == 0 and "Added layer1 to the 16 rows" in grown.stderr, grown.stderr
    assert run_featdump(*common, "-l", "avgpool,layer1", videos, fresh).returncode == 0
    mine, expected = read_output(output), read_output(fresh)
    assert mine["paths"] == expected["paths"]
    with h5py.File(output, "r") as first, h5py.File(fresh, "r") as second:
        np.testing.assert_array_equal(first["clip_start"][:], second["clip_start"][:])
    for layer in ("avgpool", "layer1"):
        np.testing.assert_array_equal(mine[layer], expected[layer])


def test_encode_takes_targets_keyed_by_path_and_clip_start(videos, tmp_path):
    """A movie-fMRI-like table (video, onset, voxels), in its own order: the same fit as an .npy in row order."""
    import csv

    import featdump

    folder = tmp_path / "films"
    for name in ("a/one.mkv", "b/two.mkv"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(videos / name)
    output = tmp_path / "out.h5"
    assert run_featdump("extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "2", folder,
                        output).returncode == 0
    with h5py.File(output, "r") as h5file:
        paths, starts = list(h5file["paths"].asstr()[:]), h5file["clip_start"][:]
    voxels = np.random.default_rng(0).standard_normal((len(paths), 3))
    np.save(tmp_path / "ordered.npy", voxels)
    with open(tmp_path / "bold.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "clip_start", "v1", "v2", "v3"])
        for row in reversed(range(len(paths))):  # another order than the file's
            writer.writerow([paths[row], f"{starts[row]:.2f}", *(repr(float(value)) for value in voxels[row])])
    keyed = featdump.encode(output, tmp_path / "bold.csv", folds=2, device="cpu")["avgpool"]
    ordered = featdump.encode(output, tmp_path / "ordered.npy", folds=2, device="cpu")["avgpool"]
    assert keyed.columns == ["v1", "v2", "v3"] and len(keyed.fold) == 8
    np.testing.assert_allclose(keyed.predicted, ordered.predicted, rtol=1e-12)


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
@pytest.mark.skipif(not hardware.cpu().native("bf16"), reason="r3d_18's Conv3d in bf16 without native kernels takes "
                    "over 10 minutes on this CPU; the proof of clip rows in bf16 is tested with a small 3-D model "
                    "(test_video_models.py)")
def test_a_bf16_run_on_clips_records_its_proof(videos, tmp_path):
    """CPU autocast bf16 on clip rows: the proof recomputes its sample of clips on the reference path."""
    import json

    output = tmp_path / "out.h5"
    result = run_featdump("extract", "-m", "r3d_18", "-w", "none", "-l", "avgpool", "--clip", "8", "--fps", "15",
                          "--precision", "bf16", videos / "a" / "one.mkv", output)
    assert result.returncode == 0, result.stderr
    with h5py.File(output, "r") as h5file:
        proof = json.loads(h5file.attrs["proof"])[-1]
    with h5py.File(output, "r") as h5file:
        starts = h5file["clip_start"][:]
    assert proof["proved"] and proof["images"] == [f"one.mkv @ {start:.6g} s" for start in starts]  # each its clip
    layer = proof["layers"]["avgpool"]
    assert layer["largest"] <= layer["bound"] and proof["rows"] == "clip"


@pytest.mark.slow  # real processes: a SIGKILL mid-run, then the same command
def test_a_sigkill_then_the_same_command_equals_a_fresh_run(videos, tmp_path):
    import signal
    import time

    from .helpers import committed_rows, featdump_env, start_featdump
    from .makers import small_resnet

    arguments = ["extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "25", "-b", "4", videos]
    process = start_featdump(*arguments, tmp_path / "out.h5", env=featdump_env(**{small_resnet.HOLD_AFTER: "1"}))
    while committed_rows(tmp_path / "out.h5.partial") <= 0 and process.poll() is None:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert committed_rows(tmp_path / "out.h5.partial") == 4  # held after its first batch of 93 frames
    resumed = run_featdump(*arguments, tmp_path / "out.h5")
    assert resumed.returncode == 0 and "Resuming at clip" in resumed.stderr, resumed.stderr
    assert run_featdump(*arguments, tmp_path / "fresh.h5").returncode == 0
    content, expected = read_output(tmp_path / "out.h5"), read_output(tmp_path / "fresh.h5")
    assert content["paths"] == expected["paths"] and len(content["paths"]) == 50 + 40 + 3  # every frame a row
    np.testing.assert_array_equal(content["avgpool"], expected["avgpool"])


def test_clip_rows_feed_the_reader_and_an_rdm(videos, tmp_path):
    import featdump

    output = tmp_path / "out.h5"
    assert run_featdump("extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "2", videos,
                        output).returncode == 0
    content = read_output(output)
    rows = sorted(int(row) for batch in featdump.FeatureDataset(output, batch_size=3) for row in batch["row"])
    assert rows == list(range(len(content["paths"]))) == list(range(9))  # every clip row once (tiny.mkv: one)
    rdm = featdump.rdm(output, device="cpu")["avgpool"]
    assert rdm.shape == (9, 9) and np.allclose(np.diag(rdm), 0.0, atol=1e-6)
    again = run_featdump("extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "2", videos, output)
    assert again.returncode == 0 and f"Nothing new: {output} already holds 9 clips (0 skipped)" in again.stderr, \
        again.stderr  # a clip job's rows are clips, said as such


def test_folds_of_clips_keep_each_video_together_or_cut_it_in_stretches_of_time():
    from featdump.readout.folds import assign_folds

    videos = np.repeat([0, 1, 2, 3], [5, 3, 4, 2])  # each video's clips in time order
    classes = np.repeat([0, 1, 0, 1], [5, 3, 4, 2])
    folds = assign_folds(len(videos), 2, 0, classes, videos)
    for video in range(4):
        assert len(set(folds[videos == video])) == 1  # a whole video in one fold
    assert {folds[videos == 0][0], folds[videos == 2][0]} == {0, 1}  # each class's videos spread over the folds
    one = assign_folds(10, 3, 0, None, np.zeros(10, dtype=int))  # one film: three stretches of its time
    assert one.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_probe_by_video_and_cka_on_clip_rows(videos, tmp_path):
    """A probe of labels given per video (a table by path): every clip of a video takes its label, and a video's
    clips stay in one fold; cka between two layers of clip rows is a similarity in [0, 1], 1 on the diagonal."""
    import featdump

    output = tmp_path / "out.h5"
    folder = tmp_path / "films"
    for index, name in enumerate(("one.mkv", "two.mkv", "three.mkv", "four.mkv")):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(videos / ("a/one.mkv" if index % 2 == 0 else "b/two.mkv"))
    assert run_featdump("extract", *SMALL_RESNET, "-l", "layer4,avgpool", "--fps", "4", folder,
                        output).returncode == 0
    (tmp_path / "kinds.csv").write_text("path,label\none.mkv,walk\nthree.mkv,walk\ntwo.mkv,run\nfour.mkv,run\n")
    probed = featdump.probe(output, "avgpool", folds=2, labels=tmp_path / "kinds.csv", device="cpu",
                            to=tmp_path / "probes.h5")["avgpool"]
    with h5py.File(tmp_path / "probes.h5", "r") as h5file:
        paths = h5file["paths"].asstr()[:]
        kinds = [h5file["labels"].attrs["classes"][label] for label in h5file["labels"][:]]
    assert len(paths) == 8 + 7 + 8 + 7  # 4 fps: 50 frames at 25 fps give 8 clips, 40 give 7
    for name, kind in (("one.mkv", "walk"), ("two.mkv", "run"), ("three.mkv", "walk"), ("four.mkv", "run")):
        assert {kinds[row] for row in np.flatnonzero(paths == name)} == {kind}  # its video's label, every clip
        assert len(set(probed.fold[paths == name])) == 1  # and one fold
    assert {probed.fold[paths == "one.mkv"][0], probed.fold[paths == "three.mkv"][0]} == {0, 1}  # stratified
    matrix = featdump.cka(output, layers=["layer4", "avgpool"], device="cpu").values
    assert matrix.shape == (2, 2) and np.allclose(np.diag(matrix), 1.0) and 0 < matrix[0, 1] < 1
    (folder / "reversed.txt").write_text("four.mkv\nthree.mkv\ntwo.mkv\none.mkv\n")  # the clips in another order
    other = tmp_path / "other.h5"
    assert run_featdump("extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "4",
                        folder / "reversed.txt", other).returncode == 0
    across = featdump.cka(output, other, layers="avgpool", device="cpu")
    assert across.images == 30 and np.isclose(across.values[0, 0], 1.0)  # each clip matched to itself


def test_a_folder_of_images_and_videos_takes_the_images_and_says_so(videos, tmp_path):
    from .helpers import write_images

    write_images(tmp_path / "mixed", {"a": 2})
    (tmp_path / "mixed" / "a" / "one.mkv").symlink_to(videos / "a" / "one.mkv")
    result = run_featdump("extract", *SMALL_RESNET, "-l", "avgpool", tmp_path / "mixed",
                          tmp_path / "out.h5")
    assert result.returncode == 0 and "Wrote 2 images" in result.stderr, result.stderr
    assert "images and 1 videos (a/one.mkv, ...): the images are the rows" in result.stderr


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_spacepool_keeps_a_video_layer_s_time_axis(videos, tmp_path):
    """--reduce spacepool on r3d_18's layer2: (128, T) equal to the whole map's mean over y and x, named channel
    and time; on an image layer it is refused in one line."""
    common = ["extract", "-m", "r3d_18", "-w", "none", "-l", "layer2", "--clip", "8", "--fps", "15",
              videos / "a" / "one.mkv"]
    assert run_featdump(*common, tmp_path / "whole.h5").returncode == 0
    assert run_featdump(*common, "--reduce", "spacepool", tmp_path / "pooled.h5").returncode == 0
    whole, pooled = read_output(tmp_path / "whole.h5"), read_output(tmp_path / "pooled.h5")
    assert pooled["layer2"].shape == (3, 128, 4)
    np.testing.assert_allclose(pooled["layer2"], whole["layer2"].mean(axis=(3, 4)), rtol=1e-5, atol=1e-6)
    import xarray as xr

    with xr.open_dataset(tmp_path / "pooled.h5", engine="h5netcdf", group="features") as opened:
        assert opened["layer2"].dims == ("image", "channel_128", "time_4")
    timed = featdump.load(tmp_path / "pooled.h5", "layer2", xarray=True)  # each step's first frame in its clip
    np.testing.assert_array_equal(timed["time"].values, [0, 2, 4, 6])
    assert timed["time"].attrs["units"] == "frames of the clip"
    from featdump.faces import show

    assert show._keeps_time(tmp_path / "pooled.h5", "layer2")  # drawn as channels over time, not as a map
    drawn = run_featdump("show", tmp_path / "pooled.h5", "--index", "1", "-o", tmp_path / "pooled.png")
    assert drawn.returncode == 0 and (tmp_path / "pooled.png").exists(), drawn.stderr
    refused = run_featdump("extract", *SMALL_RESNET, "-l", "layer2", "--reduce", "spacepool",
                           "--fps", "2", videos / "a" / "one.mkv", tmp_path / "image.h5")
    assert refused.returncode == 2 and "not a video model's (channel, time, y, x) map" in refused.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_job_whose_only_video_is_damaged_leaves_nothing_and_its_rerun_tries_again(videos, tmp_path):
    folder = tmp_path / "films"
    folder.mkdir()
    good = videos / "a" / "one.mkv"
    (folder / "film.mkv").write_bytes(good.read_bytes()[:600])  # cut short: nothing decodes
    output = tmp_path / "out.h5"
    command = ["extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "2", folder, output]
    for _ in range(2):
        failed = run_featdump(*command)
        assert failed.returncode == 1 and "No clip could be read: 1 tried" in failed.stderr, failed.stderr
        assert "film.mkv: " in failed.stderr and not output.exists()
        assert not (tmp_path / "out.h5.partial").exists()
    (folder / "film.mkv").write_bytes(good.read_bytes())  # replaced by a good copy
    fixed = run_featdump(*command)
    assert fixed.returncode == 0 and "(0 skipped)" in fixed.stderr and output.exists(), fixed.stderr


def test_load_and_xarray_keep_the_clip_start_and_select_by_path_and_onset(videos, tmp_path):
    output = tmp_path / "out.h5"
    assert run_featdump("extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "2", videos,
                        output).returncode == 0
    with h5py.File(output, "r") as h5file:
        starts = h5file["clip_start"][:]
        assert h5file["clip_start"].attrs["units"] == "s"
    plain = featdump.load(output, "avgpool")
    np.testing.assert_array_equal(plain.clip_start, starts)
    labelled = featdump.load(output, "avgpool", xarray=True)
    row = int(np.flatnonzero((np.asarray(plain.paths) == "a/one.mkv") & (starts == 1.0))[0])
    chosen = labelled.sel(path="a/one.mkv", clip_start=1.0)
    np.testing.assert_array_equal(chosen.values, plain.features[row])
    assert labelled["clip_start"].attrs["units"] == "s"
    info = run_featdump("info", output).stdout
    assert f"rows:       {len(starts)} (clips of videos)" in info


ALPHAS = np.logspace(-2, 6, 9)


def by_hand_sources(paths: list[str], starts: np.ndarray, delays: list[int], step: float) -> np.ndarray:
    """Each delay's source row per row, found by a plain search: same video, onset less delay x step."""
    found = np.full((len(delays), len(paths)), -1)
    for index, delay in enumerate(delays):
        for row in range(len(paths)):
            for other in range(len(paths)):
                if paths[other] == paths[row] and abs(starts[other] - (starts[row] - delay * step)) < 1e-4:
                    found[index, row] = other
    return found


def test_encode_with_delays_equals_ridge_cv_on_the_delayed_design_and_its_folds(videos, tmp_path):
    from sklearn.linear_model import RidgeCV

    from featdump.readout.delays import delayed_rows

    output = tmp_path / "out.h5"
    assert run_featdump("extract", *SMALL_RESNET, "-l", "layer3", "--reduce", "avgpool", "--fps",
                        "10", videos, output).returncode == 0
    loaded = featdump.load(output, "layer3")
    features, paths, starts = loaded.features.astype(np.float64), loaded.paths, loaded.clip_start
    shifts = by_hand_sources(paths, starts, [1, 2, 3], 0.1)
    assert (shifts[:, [paths.index(video) for video in dict.fromkeys(paths)]] == -1).all()  # zeros at each start
    design = delayed_rows(features, shifts)
    voxels = design @ np.random.default_rng(0).standard_normal((design.shape[1], 3)) * 0.1
    voxels += np.random.default_rng(1).standard_normal(voxels.shape)
    np.save(tmp_path / "bold.npy", voxels)
    readout = featdump.encode(output, tmp_path / "bold.npy", folds=3, alphas=ALPHAS, delays="1,2,3",
                              device="cpu")["layer3"]
    for fold in range(3):
        train, test = readout.fold != fold, readout.fold == fold
        model = RidgeCV(alphas=ALPHAS).fit(design[train], voxels[train])
        assert readout.alpha[fold] == model.alpha_
        np.testing.assert_allclose(readout.predicted[test], model.predict(design[test]), rtol=1e-6, atol=1e-9)
    seconds = featdump.encode(output, tmp_path / "bold.npy", folds=3, alphas=ALPHAS, delays="0.1s,0.2s,0.3s",
                              device="cpu")["layer3"]
    np.testing.assert_array_equal(seconds.predicted, readout.predicted)
    refused = run_featdump("encode", output, tmp_path / "bold.npy", "--delays", "0.15s", "-o", tmp_path / "e.h5")
    assert refused.returncode == 2 and "not a whole number of the rows' steps (0.1 s)" in refused.stderr


def test_delays_take_rows_without_a_target_as_the_whole_films_design_cut_to_the_targets_does(videos, tmp_path):
    """Targets for some TRs only (each film's first 3 dropped as dummy scans, one censored volume): each kept row
    holds the features 1-3 steps earlier wherever the file has them, targets or not (the design built over each
    whole film, then cut to the rows with targets), and the fit equals RidgeCV on exactly that."""
    import csv

    from sklearn.linear_model import RidgeCV

    from featdump.readout.delays import delayed_rows
    from featdump.readout.folds import training_rows

    output = tmp_path / "out.h5"
    assert run_featdump("extract", *SMALL_RESNET, "-l", "layer3", "--reduce", "avgpool", "--fps",
                        "10", videos, output).returncode == 0
    loaded = featdump.load(output, "layer3")
    features, paths, starts = loaded.features.astype(np.float64), loaded.paths, loaded.clip_start
    whole = delayed_rows(features, by_hand_sources(paths, starts, [1, 2, 3], 0.1))  # over every row of each film
    firsts = {video: np.sort(starts[np.asarray(paths) == video])[:3] for video in dict.fromkeys(paths)}
    kept = np.array([start not in firsts[path] for path, start in zip(paths, starts)])
    kept[np.flatnonzero(kept)[7]] = False  # a censored volume in the middle of a film
    voxels = whole @ np.random.default_rng(0).standard_normal((whole.shape[1], 2)) * 0.1
    voxels += np.random.default_rng(1).standard_normal(voxels.shape)
    with open(tmp_path / "bold.csv", "w", newline="") as handle:
        table = csv.writer(handle)
        table.writerow(["path", "clip_start", "v0", "v1"])
        table.writerows([paths[row], f"{starts[row]:.6f}", *voxels[row]] for row in np.flatnonzero(kept))
    readout = featdump.encode(output, tmp_path / "bold.csv", folds=3, alphas=ALPHAS, delays="1,2,3",
                              device="cpu", common=True)["layer3"]
    design, wanted = whole[kept], voxels[kept]
    assert (np.abs(design[:, :features.shape[1]]).sum(1) > 0).all()  # no kept row lost its first delay to a gap
    films = np.unique(np.asarray(paths)[kept], return_inverse=True)[1]
    training = training_rows(readout.fold, films, starts[kept], 0.4)  # the default gap: 3 delays + 1 step
    for fold in range(3):
        train, test = training[:, fold], readout.fold == fold
        model = RidgeCV(alphas=ALPHAS).fit(design[train], wanted[train])
        assert readout.alpha[fold] == model.alpha_
        np.testing.assert_allclose(readout.predicted[test], model.predict(design[test]), rtol=1e-6, atol=1e-9)


@pytest.mark.slow  # three films through resnet18's layer2 and layer4
def test_with_delays_the_layer_planted_behind_a_haemodynamic_lag_wins(tmp_path):
    """BOLD made of layer4's features 2 and 3 steps earlier, through a random mixing, plus noise: with delays, layer4
    explains it better than layer2 does, and better than layer4 without delays."""
    from featdump.readout.delays import delayed_rows

    for index in range(3):
        write_video(tmp_path / "films" / f"run{index}.mkv", 250, fps=25, size=(64, 80), seed=10 + index)
    output = tmp_path / "out.h5"
    assert run_featdump("extract", *SMALL_RESNET, "-l", "layer2,layer4", "--reduce", "avgpool",
                        "--fps", "5", tmp_path / "films", output).returncode == 0
    planted = featdump.load(output, "layer4")
    shifts = by_hand_sources(planted.paths, planted.clip_start, [2, 3], 0.2)
    lagged = delayed_rows(planted.features.astype(np.float64), shifts)
    lagged = (lagged - lagged.mean(0)) / (lagged.std(0) + 1e-9)
    bold = lagged @ np.random.default_rng(0).standard_normal((lagged.shape[1], 4)) / np.sqrt(lagged.shape[1])
    bold += 0.5 * np.random.default_rng(1).standard_normal(bold.shape)
    np.save(tmp_path / "bold.npy", bold)
    delayed = featdump.encode(output, tmp_path / "bold.npy", folds=3, delays="1,2,3,4", device="cpu")
    plain = featdump.encode(output, tmp_path / "bold.npy", folds=3, device="cpu")
    assert delayed["layer4"].score > delayed["layer2"].score
    assert delayed["layer4"].score > plain["layer4"].score


def test_folds_cut_in_stretches_leave_a_gap_and_equal_ridge_cv_without_those_rows(videos, tmp_path):
    """One film, 3 folds: three stretches of its time; each fold trains without the rows within the gap (the longest
    delay plus a step: 0.2 s) of its held-out stretch, on both sides, as RidgeCV fitted on exactly those rows."""
    from sklearn.linear_model import RidgeCV

    from featdump.readout.delays import delayed_rows
    from featdump.readout.folds import training_rows

    output = tmp_path / "out.h5"
    assert run_featdump("extract", *SMALL_RESNET, "-l", "layer3", "--reduce", "avgpool", "--fps",
                        "10", videos / "a", output).returncode == 0
    loaded = featdump.load(output, "layer3")
    starts = loaded.clip_start
    voxels = np.random.default_rng(2).standard_normal((len(starts), 2))
    np.save(tmp_path / "bold.npy", voxels)
    readout = featdump.encode(output, tmp_path / "bold.npy", folds=3, alphas=ALPHAS, delays="1",
                              device="cpu")["layer3"]
    design = delayed_rows(loaded.features.astype(np.float64),
                          by_hand_sources(loaded.paths, starts, [1], 0.1))
    for fold in range(3):
        held = readout.fold == fold
        near = np.array([np.abs(starts[held] - start).min() <= 0.2 + 1e-6 for start in starts])
        train = ~held & ~near
        assert train.sum() < (~held).sum()  # rows were left out: no neighbouring TRs across train and test
        assert (np.abs(starts[train][:, None] - starts[held][None, :]) > 0.2 + 1e-6).all()
        np.testing.assert_array_equal(train, training_rows(readout.fold, np.zeros(len(starts)), starts, 0.2)[:, fold])
        model = RidgeCV(alphas=ALPHAS).fit(design[train], voxels[train])
        assert readout.alpha[fold] == model.alpha_
        np.testing.assert_allclose(readout.predicted[held], model.predict(design[held]), rtol=1e-6, atol=1e-9)
    made = run_featdump("encode", output, tmp_path / "bold.npy", "--delays", "1", "--folds", "3", "-o",
                        tmp_path / "enc.h5")
    assert made.returncode == 0 and "A gap of 0.2 s on both sides of each held-out stretch" in made.stderr
    info = run_featdump("info", tmp_path / "enc.h5").stdout
    assert "delays:     1 steps of 0.1 s" in info and "gap:        0.2 s left out of training" in info, info
    assert "folds:      stretches of time of each video, one a fold" in info  # the scheme used, not both


def test_show_draws_a_clip_row_beside_the_frame_at_its_onset(videos, tmp_path):
    from featdump.faces import show
    from featdump.inputs.video import decode_clip, video_info

    output = tmp_path / "out.h5"
    assert run_featdump("extract", *SMALL_RESNET, "-l", "layer1", "--fps", "2", videos / "a",
                        output).returncode == 0
    _, _, frame, title = show._read(output, None, 3)  # the fourth clip of one.mkv: its onset 1.5 s
    assert title == "one.mkv @ 1.5 s"
    source = videos / "a" / "one.mkv"
    shown = decode_clip(source, video_info(source), np.array([1.5]))[0]
    first = decode_clip(source, video_info(source), np.array([0.0]))[0]
    with h5py.File(output, "r") as h5file:
        geometry = json.loads(h5file.attrs["image_geometry"])
    expected = show._as_seen(Image.fromarray(shown), geometry)
    np.testing.assert_array_equal(frame, expected)
    assert not np.array_equal(frame, show._as_seen(Image.fromarray(first), geometry))  # not the film's first frame
    drawn = run_featdump("show", output, "--index", "3")
    assert drawn.returncode == 0, drawn.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_windows_ending_on_the_grid_hold_the_frames_before_each_onset_padded_or_left_out(videos, tmp_path):
    film = videos / "a" / "one.mkv"  # 50 frames at 25 fps: the last at 1.96 s
    common = ["extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "2", film]
    assert run_featdump(*common, tmp_path / "starts.h5").returncode == 0
    left_out = run_featdump(*common, "--clip-anchor", "end", tmp_path / "ends.h5")
    padded = run_featdump(*common, "--clip-anchor", "end", "--clip-pad", "repeat", tmp_path / "padded.h5")
    assert left_out.returncode == 0 and padded.returncode == 0, left_out.stderr + padded.stderr
    starts, ends, pads = (featdump.load(tmp_path / name, "avgpool") for name in ("starts.h5", "ends.h5", "padded.h5"))
    np.testing.assert_allclose(ends.clip_end, [0.5, 1.0, 1.5, 2.0])  # onsets 0.5 ... 2.0: the frame before each
    np.testing.assert_allclose(ends.clip_start, [0.0, 0.5, 1.0, 1.5])
    np.testing.assert_array_equal(ends.features, starts.features)  # the same frames as clips starting there
    np.testing.assert_allclose(pads.clip_start, [-0.5, 0.0, 0.5, 1.0, 1.5])  # onset 0: the first frame, repeated
    np.testing.assert_array_equal(pads.features[0], starts.features[0])
    np.testing.assert_array_equal(pads.features[1:], starts.features)
    with h5py.File(tmp_path / "padded.h5", "r") as h5file:
        assert h5file.attrs["clip_anchor"] == "end" and h5file.attrs["clip_pad"] == "repeat"
        np.testing.assert_allclose(h5file["video_rate"][:], 25.0)
        np.testing.assert_allclose(h5file["video_duration"][:], 2.0)
        np.testing.assert_array_equal(h5file["video_frames"][:], 50)  # the film's 50 frames, counted
        assert h5file["clip_end"].attrs["units"] == "s" and h5file["video_rate"].attrs["units"] == "Hz"
    labelled = featdump.load(tmp_path / "padded.h5", "avgpool", xarray=True)
    np.testing.assert_allclose(labelled["clip_end"].values, [0.0, 0.5, 1.0, 1.5, 2.0])
    assert not np.signbit(labelled["clip_end"].values[0])  # TR 0 is 0.0, not -0.0
    assert "clip_anchor: end" in run_featdump("info", tmp_path / "padded.h5").stdout
    from featdump.faces import show

    _, _, padded_frame, title = show._read(tmp_path / "padded.h5", None, 0)  # before the film: its first frame
    _, _, first_frame, _ = show._read(tmp_path / "starts.h5", None, 0)
    assert title == "one.mkv @ -0.5 s" and padded_frame is not None
    np.testing.assert_array_equal(padded_frame, first_frame)
    refused = run_featdump(*common, "--clip-pad", "repeat", tmp_path / "start-padded.h5")
    assert refused.returncode == 2 and "add --clip-anchor end" in refused.stderr, refused.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_tr_onsets_are_stored_exactly_and_select_rows_through_load_xarray_and_merge(tmp_path):
    """Windows ending on a 1.49 s TR grid: each row's clip_end is the grid's onset itself (5 x 1.49 is 7.45, not
    7.45 +- 3e-10), so an exact join and `sel(path=..., clip_end=7.45)` find it, in one file and in a merge of
    shards; `load` gives each row's video's rate, duration and frames."""
    write_video(tmp_path / "films" / "run1.mkv", 250, fps=25, size=(48, 64), seed=4)  # 10 s
    common = ["extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "15", "--clip-every", "1.49",
              "--clip-anchor", "end", tmp_path / "films"]
    assert run_featdump(*common, tmp_path / "out.h5").returncode == 0
    for index in range(2):
        assert run_featdump(*common[:-1], "--shard", f"{index}/2", common[-1], tmp_path / "sharded.h5").returncode == 0
    assert run_featdump("merge", tmp_path / "sharded.h5").returncode == 0
    onsets = [round(index * 1.49, 9) for index in range(1, 7)]  # 1.49 ... 8.94: the first frame is at 0
    for name in ("out.h5", "sharded.h5"):
        loaded = featdump.load(tmp_path / name, "avgpool")
        assert loaded.clip_end.tolist()[:6] == onsets, loaded.clip_end  # equal, not close
        np.testing.assert_array_equal(loaded.video_rate, 25.0)
        np.testing.assert_allclose(loaded.video_duration, 10.0)
        np.testing.assert_array_equal(loaded.video_frames, 250)
        labelled = featdump.load(tmp_path / name, "avgpool", xarray=True)
        row = onsets.index(7.45)
        np.testing.assert_array_equal(labelled.sel(path="run1.mkv", clip_end=7.45).values, loaded.features[row])


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_grid_s_origin_puts_the_onsets_where_the_scanner_s_pulses_fall(videos, tmp_path):
    """A film that starts 0.3 s before a pulse: --clip-origin 0.3 on a 0.5 s grid gives onsets 0.3, 0.8, 1.3, 1.8
    (windows ending there, the one that would reach before the film left out), recorded with the file; a start
    anchor on the same grid starts clips at those times."""
    film = videos / "a" / "one.mkv"  # 50 frames at 25 fps: the last at 1.96 s
    common = ["extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "5", "--clip-every", "0.5",
              "--clip-origin", "0.3", film]
    assert run_featdump(*common, "--clip-anchor", "end", tmp_path / "ends.h5").returncode == 0
    assert run_featdump(*common, tmp_path / "starts.h5").returncode == 0
    ends, starts = featdump.load(tmp_path / "ends.h5", "avgpool"), featdump.load(tmp_path / "starts.h5", "avgpool")
    assert ends.clip_end.tolist() == [0.3, 0.8, 1.3, 1.8]
    assert starts.clip_start.tolist() == [0.3, 0.8, 1.3, 1.8]
    with h5py.File(tmp_path / "ends.h5", "r") as h5file:
        assert h5file.attrs["clip_origin"] == 0.3
    (tmp_path / "photos").mkdir()
    Image.fromarray(np.zeros((32, 40, 3), dtype=np.uint8)).save(tmp_path / "photos" / "a.png")
    refused = run_featdump("extract", *SMALL_RESNET, "-l", "avgpool", "--clip-origin", "0.3",
                           tmp_path / "photos", tmp_path / "x.h5")
    assert refused.returncode == 2 and "--clip-origin apply to videos" in refused.stderr, refused.stderr


def test_targets_match_onsets_within_half_a_frame_and_a_miss_names_its_onsets(videos, tmp_path):
    output = tmp_path / "out.h5"
    assert run_featdump("extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "2", "--clip-anchor",
                        "end", videos / "a" / "one.mkv", output).returncode == 0  # onsets 0.5 ... 2 (a frame: 0.04 s)
    near = tmp_path / "near.csv"
    near.write_text("path,clip_end,y\n" + "".join(f"one.mkv,{t + 0.0149},{t}\n" for t in (0.5, 1.0, 1.5, 2.0)))
    fitted = run_featdump("encode", output, near, "--folds", "2", "-o", tmp_path / "near.h5")
    assert fitted.returncode == 0, fitted.stderr
    far = tmp_path / "far.csv"
    far.write_text("path,clip_end,y\n" + "".join(f"one.mkv,{t},{t}\n" for t in (0.5, 1.0, 1.53, 2.0)))
    missed = run_featdump("encode", output, far, "--folds", "2", "-o", tmp_path / "far.h5")
    assert missed.returncode == 2
    assert "1 of " in missed.stderr and "one.mkv @ 1.53 s" in missed.stderr and "one.mkv @ 1.5 s" in missed.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_damaged_film_replaced_by_a_good_one_is_read_again_by_update(videos, tmp_path):
    folder, output = tmp_path / "films", tmp_path / "out.h5"
    folder.mkdir()
    good = videos / "a" / "one.mkv"
    shutil.copyfile(good, folder / "good.mkv")
    (folder / "film.mkv").write_bytes(good.read_bytes()[:600])  # cut short: nothing decodes
    command = ["extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "2", "--update", folder, output]
    assert run_featdump(*command).returncode == 0
    assert featdump.load(output, "avgpool").paths == ["good.mkv"] * 4
    shutil.copyfile(good, folder / "film.mkv")  # replaced by a good copy
    assert "changed since (--update reads them again): film.mkv" in run_featdump("info", output).stdout
    again = run_featdump(*command)
    assert again.returncode == 0 and "Reading again 1 skipped input(s)" in again.stderr, again.stderr
    loaded = featdump.load(output, "avgpool")
    assert loaded.paths == ["good.mkv"] * 4 + ["film.mkv"] * 4
    np.testing.assert_array_equal(loaded.features[4:], loaded.features[:4])  # the same bytes, the same rows
    assert json.loads(run_featdump("info", "--json", output).stdout)["skipped"] == 0


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
@pytest.mark.parametrize("kind", ["film", "image"])
def test_a_listed_input_missing_at_extraction_and_present_later_is_read_by_update(videos, tmp_path, kind):
    """A list names a film (or an image) that is not there yet: recorded as a skip; once it exists, it counts as
    changed: `info` says so and --update reads it."""
    folder, output = tmp_path / "inputs", tmp_path / "out.h5"
    folder.mkdir()
    name = "late.mkv" if kind == "film" else "late.jpg"
    if kind == "film":
        shutil.copyfile(videos / "a" / "one.mkv", folder / "first.mkv")
        options = ["--fps", "2"]
    else:
        Image.fromarray(np.full((32, 40, 3), 90, dtype=np.uint8)).save(folder / "first.jpg")
        options = []
    listing = tmp_path / "list.txt"
    listing.write_text(f"inputs/{'first.mkv' if kind == 'film' else 'first.jpg'}\ninputs/{name}\n")
    command = ["extract", *SMALL_RESNET, "-l", "avgpool", *options, "--on-error", "skip",
               "--update", listing, output]
    made = run_featdump(*command)
    assert made.returncode == 0, made.stderr
    assert json.loads(run_featdump("info", "--json", output).stdout)["skipped"] == 1
    if kind == "film":
        shutil.copyfile(videos / "a" / "one.mkv", folder / name)
    else:
        Image.fromarray(np.full((32, 40, 3), 160, dtype=np.uint8)).save(folder / name)
    assert f"changed since (--update reads them again): inputs/{name}" in run_featdump("info", output).stdout
    again = run_featdump(*command)
    assert again.returncode == 0 and "Reading again 1 skipped input(s)" in again.stderr, again.stderr
    assert json.loads(run_featdump("info", "--json", output).stdout)["skipped"] == 0
    assert f"inputs/{name}" in featdump.load(output, "avgpool").paths


def test_a_bids_onset_column_is_told_to_name_clip_start_or_clip_end(videos, tmp_path):
    output = tmp_path / "out.h5"
    assert run_featdump("extract", *SMALL_RESNET, "-l", "avgpool", "--fps", "2",
                        videos / "a" / "one.mkv", output).returncode == 0
    (tmp_path / "events.csv").write_text("path,onset,y\n" + "".join(
        f"one.mkv,{t},{t}\n" for t in (0.0, 0.5, 1.0, 1.5)))
    refused = run_featdump("encode", output, tmp_path / "events.csv", "--folds", "2", "-o", tmp_path / "e.h5")
    assert refused.returncode == 2 and "names 'one.mkv' twice" in refused.stderr
    assert "a column clip_start or clip_end (a BIDS events file's `onset` is one of them: rename it)" in \
        refused.stderr
