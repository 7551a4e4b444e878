"""Images kept as arrays (`featdump.inputs.arrays`): an HDF5 file's array (NSD's imgBrick), a .npy, a .npz, channels
last or first or greyscale: a row per index, named FILE/ARRAY/INDEX, equal to the rows of the same images saved as
PNG files; a file of several arrays is read by the one --array names; what holds no images is refused in one line;
resume, --update of a grown array, shards and show work as for a folder; memory is bounded by the batch."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from PIL import Image

import featdump
from featdump.job.runner import extract

from .helpers import SMALL_RESNET, SMALL_RESNET_SETTINGS, CrashAfterFirstBatch, peak_rss_mib, run_featdump, settings_for

EXTRACT = ["extract", *SMALL_RESNET, "-l", "layer1,avgpool"]


def images(count: int, seed: int = 0, size=(48, 64), channels: int = 3) -> np.ndarray:
    """COUNT smooth random uint8 images, (N, H, W, C)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (count, 6, 8, channels), dtype=np.uint8)
    return np.stack([np.asarray(Image.fromarray(image.squeeze(-1) if channels == 1 else image).resize(size[::-1]))
                     .reshape(*size, channels) for image in small])


def as_pngs(pixels: np.ndarray, folder) -> None:
    """Each image of PIXELS ((N, H, W, C)) saved as folder/NNNN.png, in index order."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, image in enumerate(pixels):
        Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).save(folder / f"{index:04d}.png")


def rows_of(source, output, *options) -> featdump.api.Features:
    result = run_featdump(*EXTRACT, *options, source, output)
    assert result.returncode == 0, result.stderr
    return featdump.load(output, "layer1")


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
@pytest.mark.parametrize("form", ["hdf5 channels last", "hdf5 channels first", "hdf5 greyscale", "npy", "npz"])
def test_an_array_s_rows_equal_the_same_images_saved_as_png_files(tmp_path, form):
    pixels = images(6, channels=1 if "greyscale" in form else 3)
    as_pngs(pixels, tmp_path / "pngs")
    if form.startswith("hdf5"):
        source = tmp_path / "stimuli.hdf5"
        stored = {"hdf5 channels last": pixels, "hdf5 channels first": np.moveaxis(pixels, -1, 1),
                  "hdf5 greyscale": pixels[..., 0]}[form]
        with h5py.File(source, "w") as h5file:
            h5file["stimuli/imgBrick"] = stored
            h5file["onsets"] = np.arange(6, dtype=np.float64)  # not images: the reader passes it by
        names = [f"stimuli.hdf5/stimuli/imgBrick/{index}" for index in range(6)]
    elif form == "npy":
        source = tmp_path / "stimuli.npy"
        np.save(source, pixels)
        names = [f"stimuli.npy/{index}" for index in range(6)]
    else:
        source = tmp_path / "stimuli.npz"
        np.savez(source, shown=pixels, onsets=np.arange(6.0))
        names = [f"stimuli.npz/shown/{index}" for index in range(6)]
    from_array = rows_of(source, tmp_path / "array.h5")
    from_files = rows_of(tmp_path / "pngs", tmp_path / "files.h5")
    assert from_array.paths == names
    np.testing.assert_array_equal(from_array.features, from_files.features)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_file_of_several_arrays_is_read_by_the_one_named_and_what_holds_no_images_is_refused(tmp_path):
    source = tmp_path / "study.h5"
    pixels = images(4)
    with h5py.File(source, "w") as h5file:
        h5file["train"] = pixels
        h5file["test"] = pixels[:2]
        h5file["betas"] = np.zeros((4, 5, 5, 3), dtype=np.float32)
        h5file["deep"] = np.zeros((4, 5, 5, 3, 2), dtype=np.uint16)
    several = run_featdump(*EXTRACT, source, tmp_path / "out.h5")
    assert several.returncode == 2 and "study.h5 holds several image arrays (test, train): choose one with " \
        "--array NAME." in several.stderr, several.stderr
    chosen = run_featdump(*EXTRACT, "--array", "test", source, tmp_path / "out.h5")
    assert chosen.returncode == 0 and featdump.load(tmp_path / "out.h5", "avgpool").paths == [
        "study.h5/test/0", "study.h5/test/1"]
    for name, said in (("betas", "betas: float32 of shape (4, 5, 5, 3), not images: an image array is uint8"),
                       ("deep", "deep: uint16 of shape (4, 5, 5, 3, 2), uint16 without a stated range"),
                       ("missing", "--array missing: study.h5 holds no array of that name; it holds")):
        refused = run_featdump(*EXTRACT, "--array", name, source, tmp_path / f"{name}.h5")
        lines = [line for line in refused.stderr.strip().splitlines() if " INFO: " not in line]
        assert refused.returncode == 2 and len(lines) == 1 and said in lines[0], refused.stderr
    config = tmp_path / "run.toml"  # the option from a config file too, as from the command line
    config.write_text('model = "resnet18"\nweights = "none"\nlayers = ["avgpool"]\narray = "train"\n')
    assert run_featdump("extract", "--config", config, source, tmp_path / "conf.h5").returncode == 0
    assert len(featdump.load(tmp_path / "conf.h5", "avgpool").paths) == 4
    featdump.extract(source, tmp_path / "api.h5", model="resnet18", weights="none", layers="avgpool", array="train")
    assert len(featdump.load(tmp_path / "api.h5", "avgpool").paths) == 4


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_uint16_array_with_a_stated_range_is_scaled_to_8_bits(tmp_path):
    pixels = images(3)
    with h5py.File(tmp_path / "deep.h5", "w") as h5file:
        h5file["frames"] = pixels.astype(np.uint16) * 257  # 0..65535
        h5file["frames"].attrs["valid_range"] = [0, 65535]
    as_pngs(pixels, tmp_path / "pngs")
    np.testing.assert_array_equal(rows_of(tmp_path / "deep.h5", tmp_path / "a.h5").features,
                                  rows_of(tmp_path / "pngs", tmp_path / "f.h5").features)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_killed_run_resumes_a_grown_array_updates_and_shards_merge_into_the_single_run(tmp_path):
    source = tmp_path / "nsd.hdf5"
    pixels = images(12)
    with h5py.File(source, "w") as h5file:
        h5file.create_dataset("imgBrick", data=pixels[:8], maxshape=(None, *pixels.shape[1:]))
    single = rows_of(source, tmp_path / "single.h5", "-b", "4")
    crashed = tmp_path / "crashed.h5"
    with pytest.raises(RuntimeError):
        extract(settings_for(source, crashed, layers=("layer1", "avgpool"), **SMALL_RESNET_SETTINGS),
                CrashAfterFirstBatch())
    assert rows_of(source, crashed, "-b", "4").paths == single.paths  # resumed
    np.testing.assert_array_equal(featdump.load(crashed, "layer1").features, single.features)
    for index in range(2):
        assert run_featdump(*EXTRACT, "--shard", f"{index}/2", source, tmp_path / "sharded.h5").returncode == 0
    assert run_featdump("merge", tmp_path / "sharded.h5").returncode == 0
    np.testing.assert_array_equal(featdump.load(tmp_path / "sharded.h5", "layer1").features, single.features)
    with h5py.File(source, "a") as h5file:  # the study adds four images
        h5file["imgBrick"].resize(12, axis=0)
        h5file["imgBrick"][8:] = pixels[8:]
    grown = run_featdump(*EXTRACT, "--update", source, tmp_path / "single.h5")
    assert grown.returncode == 0 and "4 new images" in grown.stderr, grown.stderr
    updated = featdump.load(tmp_path / "single.h5", "layer1")
    assert updated.paths == [f"nsd.hdf5/imgBrick/{index}" for index in range(12)]
    np.testing.assert_array_equal(updated.features[:8], single.features)
    as_pngs(pixels, tmp_path / "pngs")
    np.testing.assert_array_equal(updated.features, rows_of(tmp_path / "pngs", tmp_path / "files.h5").features)
    drawn = run_featdump("show", tmp_path / "single.h5", "--layer", "layer1", "--index", "9", "-o", tmp_path / "s.png")
    assert drawn.returncode == 0 and (tmp_path / "s.png").exists(), drawn.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_brick_killed_mid_run_resumes_to_the_uninterrupted_rows(tmp_path):
    """SIGKILL once a batch of a 40-image brick is committed (batches of 4): the same command resumes, and the file
    equals an uninterrupted run's."""
    import signal
    import subprocess
    import time

    from .helpers import featdump_env, read_output, start_featdump
    from .makers import small_resnet

    source = tmp_path / "brick.hdf5"
    with h5py.File(source, "w") as h5file:
        h5file["imgBrick"] = images(40, seed=3)
    command = [*EXTRACT, "-b", "4", source, tmp_path / "out.h5"]
    process = start_featdump(*command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=featdump_env(**{small_resnet.HOLD_AFTER: "1"}))  # held before its second batch
    deadline = time.monotonic() + 120
    while committed(tmp_path / "out.h5.partial") < 4 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert committed(tmp_path / "out.h5.partial") == 4
    resumed = run_featdump(*command)
    assert resumed.returncode == 0 and "Resuming at image" in resumed.stderr, resumed.stderr
    straight = rows_of(source, tmp_path / "straight.h5", "-b", "4")
    assert read_output(tmp_path / "out.h5")["paths"] == straight.paths
    np.testing.assert_array_equal(featdump.load(tmp_path / "out.h5", "layer1").features, straight.features)


def committed(partial) -> int:
    """Rows committed in PARTIAL so far (0 while it is being made)."""
    from featdump.output.layout import Output

    try:
        with Output.open(partial, locking=False) as held:
            return held.committed.rows
    except Exception:  # not there yet, or being created
        return 0


def brick(path, count: int) -> None:
    """COUNT images of NSD's size (425 x 425 x 3) into PATH:imgBrick, written a block at a time."""
    block = np.random.default_rng(0).integers(0, 256, (64, 425, 425, 3), dtype=np.uint8)
    with h5py.File(path, "w") as h5file:
        dataset = h5file.create_dataset("imgBrick", shape=(count, 425, 425, 3), dtype=np.uint8,
                                        chunks=(1, 425, 425, 3))
        for start in range(0, count, 64):
            dataset[start:start + 64] = block[:count - start]


@pytest.mark.slow  # a 555 MB brick written and read through conv1, and a 64-image one
def test_memory_stays_bounded_by_the_batch_not_the_brick(tmp_path):
    """A 1,024-image brick of NSD's size (555 MB) peaks within a fixed margin of the same run over a 64-image brick:
    what a process holds grows with the batch, not with the array."""
    peaks = {}
    for count in (64, 1024):
        brick(tmp_path / f"brick{count}.hdf5", count)
        peaks[count] = peak_rss_mib("extract", *SMALL_RESNET, "-l", "conv1", "--reduce", "avgpool",
                                    tmp_path / f"brick{count}.hdf5", tmp_path / f"out{count}.h5")
        assert len(featdump.load(tmp_path / f"out{count}.h5", "conv1").paths) == count
    assert peaks[1024] < peaks[64] + 100, peaks  # MiB; the array alone is 555 MB


def test_a_list_of_an_array_s_row_names_extracts_that_subset_alone_in_the_list_s_order(tmp_path):
    """NSD's shared images, one subject's: a list file of featdump's own row names (FILE/ARRAY/INDEX) reads only
    those indices, in the list's order with its labels, equal to the same rows of the whole array."""
    pixels = images(8, seed=6)
    with h5py.File(tmp_path / "nsd_stimuli.hdf5", "w") as h5file:
        h5file["imgBrick"] = pixels
    whole = rows_of(tmp_path / "nsd_stimuli.hdf5", tmp_path / "whole.h5")
    chosen = [6, 1, 3]
    (tmp_path / "shared.csv").write_text("path,label\n" + "".join(f"nsd_stimuli.hdf5/imgBrick/{index},{index % 2}\n"
                                                                    for index in chosen))
    subset = rows_of(tmp_path / "shared.csv", tmp_path / "subset.h5")
    assert subset.paths == [f"nsd_stimuli.hdf5/imgBrick/{index}" for index in chosen]
    assert subset.labels.tolist() == [0, 1, 1]
    np.testing.assert_array_equal(subset.features, whole.features[chosen])
    (tmp_path / "beyond.txt").write_text("nsd_stimuli.hdf5/imgBrick/1\nnsd_stimuli.hdf5/imgBrick/8\n")
    refused = run_featdump(*EXTRACT, tmp_path / "beyond.txt", tmp_path / "beyond.h5")
    assert refused.returncode == 2 and "names row 8 of nsd_stimuli.hdf5/imgBrick, which holds 8" in refused.stderr
    (tmp_path / "twice.txt").write_text("".join(f"nsd_stimuli.hdf5/imgBrick/{row}\n" for row in (3, 5, 3, 5, 3)))
    twice = run_featdump(*EXTRACT, tmp_path / "twice.txt", tmp_path / "twice.h5")
    assert twice.returncode == 2 and "names row 3 of nsd_stimuli.hdf5/imgBrick twice (3 repeats in all): name " \
        "each row once" in twice.stderr and not (tmp_path / "twice.h5").exists(), twice.stderr


SMALL = ["extract", "-m", "featdump.testing.models:small", "--transform", "featdump.testing.models:small_transform",
         "-l", "1,4"]


def write_brick(path, pixels) -> None:
    """PIXELS as PATH:imgBrick (made growable, or resized and rewritten)."""
    with h5py.File(path, "a") as h5file:
        if "imgBrick" not in h5file:
            h5file.create_dataset("imgBrick", data=pixels, maxshape=(None, *pixels.shape[1:]), chunks=True)
            return
        held = h5file["imgBrick"]
        held.resize(len(pixels), axis=0)
        held[:] = pixels


def stale_of(output) -> list[tuple[str, str]]:
    with h5py.File(output, "r") as h5file:
        if "stale" not in h5file:
            return []
        return list(zip(h5file["stale/paths"].asstr()[:], h5file["stale/reasons"].asstr()[:]))


def test_a_grown_array_s_old_rows_stay_fresh_and_a_rewritten_row_is_stale_until_extracted_again(tmp_path):
    pixels = images(10, size=(32, 32))
    source, output = tmp_path / "nsd.hdf5", tmp_path / "out.h5"
    write_brick(source, pixels[:6])
    assert run_featdump(*SMALL, source, output).returncode == 0
    first = featdump.load(output, "4").features
    write_brick(source, pixels[:8])  # the study adds two images
    grown = run_featdump(*SMALL, "--update", source, output)
    assert grown.returncode == 0 and "2 new images" in grown.stderr, grown.stderr
    assert stale_of(output) == [] and "stale" not in run_featdump("info", output).stdout
    np.testing.assert_array_equal(featdump.load(output, "4").features[:6], first)
    rewritten = pixels[:8].copy()
    rewritten[3] = 255 - rewritten[3]  # an old row rewritten in place, the array as long as it was
    write_brick(source, rewritten)
    found = run_featdump(*SMALL, "--update", source, output)
    assert found.returncode == 0, found.stderr
    assert stale_of(output) == [("nsd.hdf5/imgBrick/3", "changed")]
    again = run_featdump(*SMALL, "--update", source, output)  # the file unchanged since: row 3 is still stale
    assert again.returncode == 0 and stale_of(output) == [("nsd.hdf5/imgBrick/3", "changed")], again.stderr
    refused = run_featdump(*SMALL[:-1], "1,2,4", "--update", source, output)
    assert refused.returncode == 2 and "1 of the rows" in refused.stderr and "imgBrick/3" in refused.stderr
    write_brick(source, rewritten[:7])  # shrunk: row 7 is gone
    assert run_featdump(*SMALL, "--update", source, output).returncode == 0
    assert stale_of(output) == [("nsd.hdf5/imgBrick/3", "changed"), ("nsd.hdf5/imgBrick/7", "disappeared")]
    described = run_featdump("info", output).stdout  # counted by array and reason, a few names each
    assert "  nsd.hdf5/imgBrick: 1 changed (3)\n  nsd.hdf5/imgBrick: 1 disappeared (7)\n" in described, described
    write_brick(source, pixels[:8])  # row 3 as it was, row 7 back: nothing stale
    assert run_featdump(*SMALL, "--update", source, output).returncode == 0 and stale_of(output) == []


@pytest.mark.slow  # 20,000 rows extracted first
def test_a_nothing_new_update_over_20000_array_rows_reads_no_row_and_stats_none(tmp_path, monkeypatch):
    from featdump.inputs import arrays

    rng = np.random.default_rng(0)
    source, output = tmp_path / "nsd.hdf5", tmp_path / "out.h5"
    write_brick(source, rng.integers(0, 256, (20_000, 8, 8, 3), dtype=np.uint8))
    assert run_featdump(*SMALL, "-b", "512", source, output).returncode == 0

    def refused(*args, **kwargs):
        raise AssertionError("a per-row stat or read of the array during a nothing-new --update")

    monkeypatch.setattr(arrays.ArrayImages, "stat", refused)
    monkeypatch.setattr(arrays, "row_digests", refused)
    monkeypatch.setattr(arrays.ArrayImages, "open_as_ready", refused)
    nothing = run_featdump(*SMALL, "-b", "512", "--update", source, output)
    assert nothing.returncode == 0 and "nothing new" in nothing.stderr.lower(), nothing.stderr
    assert stale_of(output) == []


def test_a_row_s_stat_is_its_bytes_and_their_digest_read_again_and_none_past_the_end(tmp_path):
    from featdump.inputs.arrays import read_array, row_digest

    pixels = images(4, size=(8, 8))
    write_brick(tmp_path / "nsd.hdf5", pixels)
    listed = read_array(tmp_path / "nsd.hdf5")
    assert listed.stat(2) == (8 * 8 * 3, row_digest(pixels[2]))
    assert [encoded.file_stat for _, encoded in listed.open_as_ready([2])] == [listed.stat(2)]  # as a run records
    write_brick(tmp_path / "nsd.hdf5", pixels[:2])
    assert listed.stat(2) is None and listed.stat(1) == (8 * 8 * 3, row_digest(pixels[1]))
