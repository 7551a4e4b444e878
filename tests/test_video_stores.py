"""Videos where images may lie: in tar shards (on disk and in a store), under a store prefix, named by URL in a list.
Each run's rows equal the folder run's, row by row (paths, clip starts, labels, features); the videos are read
where they lie, by byte ranges, never fetched whole."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from featdump.inputs import find_images
from featdump.inputs.clips import as_rows
from featdump.inputs.imagelist import Window
from featdump.sources.models import ModelClip
from tests.makers.videos import write_video

from .helpers import read_output, run_featdump
from .test_tars import member_path, pack

pytest.importorskip("av")

EXTRACT = ("extract", "-m", "r3d_18", "-w", "none", "-l", "layer1,avgpool", "--clip", "4", "--fps", "10")


@pytest.fixture(scope="module")
def stored_videos(tmp_path_factory, seaweed):
    """3 videos in two class folders (one too short for a clip), the same as 2 tars on disk, uploaded as a prefix
    and as tars; and the folder's run."""
    root = tmp_path_factory.mktemp("stored_videos")
    write_video(root / "videos" / "a" / "one.mkv", 30, size=(64, 80), gop=6)
    write_video(root / "videos" / "b" / "two.mp4", 24, size=(64, 80), seed=1, gop=6)
    write_video(root / "videos" / "b" / "tiny.mkv", 2, size=(64, 80), seed=2)
    pack(root / "videos", root / "shards", 2)
    seaweed.upload(root / "videos", "s3://movies/set")
    seaweed.upload(root / "shards", "s3://movies/shards")
    output = root / "folder.h5"
    result = run_featdump(*EXTRACT, root / "videos", output)
    assert result.returncode == 0, result.stderr
    return root, rows_of(output)


def rows_of(output) -> dict:
    """The output's rows keyed by (path, clip start), with its skips."""
    content = read_output(output)
    with h5py.File(output, "r") as h5file:
        starts = h5file["clip_start"][:]
        skipped = sorted(h5file["skipped/paths"].asstr()[:])
    rows = {(path, float(start)): {"label": int(content["labels"][row]), "layer1": content["layer1"][row],
                                   "avgpool": content["avgpool"][row]}
            for row, (path, start) in enumerate(zip(content["paths"], starts))}
    return {"rows": rows, "skipped": skipped, "order": list(zip(content["paths"], starts.tolist()))}


def assert_same_clips(found: dict, expected: dict, name=lambda path: path) -> None:
    assert [(name(path), start) for path, start in found["order"]] == expected["order"]
    assert [name(path) for path in found["skipped"]] == expected["skipped"]
    for (path, start), row in found["rows"].items():
        wanted = expected["rows"][(name(path), start)]
        assert row["label"] == wanted["label"]
        for layer in ("layer1", "avgpool"):
            np.testing.assert_array_equal(row[layer], wanted[layer])


@pytest.mark.slow  # the module's fixture uploads videos to a store (6 s): make test-all (CI)
def test_videos_in_tars_on_disk_equal_the_folder_run(stored_videos, tmp_path):
    root, folder = stored_videos
    assert folder["skipped"] == ["b/tiny.mkv"] and len(folder["order"]) == 5  # 3 clips of one, 2 of two
    output = tmp_path / "tars.h5"
    result = run_featdump(*EXTRACT, str(root / "shards" / "*.tar"), output)
    assert result.returncode == 0, result.stderr
    assert_same_clips(rows_of(output), folder, member_path)


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_videos_at_a_store_prefix_and_in_tars_in_a_store_equal_the_folder_run(stored_videos, store_env, tmp_path):
    _, folder = stored_videos
    for source, name in (("s3://movies/set/", lambda path: path),
                         ("s3://movies/shards/{00000..00001}.tar", member_path)):
        output = tmp_path / "out.h5"
        result = run_featdump(*EXTRACT, source, output, "--overwrite")
        assert result.returncode == 0, result.stderr
        assert_same_clips(rows_of(output), folder, name)


@pytest.mark.slow  # a store or many processes beyond a few seconds: make test-all (CI)
def test_a_listed_video_url_equals_its_file(stored_videos, store_env, tmp_path):
    _, folder = stored_videos
    listing = tmp_path / "videos.txt"
    listing.write_text("s3://movies/set/a/one.mkv\n")
    output = tmp_path / "listed.h5"
    result = run_featdump(*EXTRACT, listing, output)
    assert result.returncode == 0, result.stderr
    found = rows_of(output)
    assert [start for _, start in found["order"]] == [start for path, start in folder["order"] if path == "a/one.mkv"]
    for (_, start), row in found["rows"].items():
        np.testing.assert_array_equal(row["avgpool"], folder["rows"][("a/one.mkv", start)]["avgpool"])


@pytest.mark.slow  # the module's fixture uploads videos to a store (6 s): make test-all (CI)
def test_a_stored_video_is_read_by_ranges_not_whole(stored_videos, store_env):
    """Listing the prefix's clips reads each video's head and tail, not its bytes end to end: a video's Window
    reads ranges of it."""
    images = find_images("s3://movies/set/")
    encoded = images.open(images.paths.index("a/one.mkv"))
    assert encoded.data is None
    with encoded.source as handle:
        assert isinstance(handle, Window)
        head = handle.read(12)
        handle.seek(-4, 2)
        tail = handle.read()
    whole = (stored_videos[0] / "videos" / "a" / "one.mkv").read_bytes()
    assert head == whole[:12] and tail == whole[-4:]
    clips = as_rows(images, 4, 10.0, None, ModelClip(16, 15.0, True)).clips
    assert clips.starts[:3] == (0.0, 0.4, 0.8)


def test_tars_of_images_and_videos_take_the_images_and_say_so(tmp_path, caplog):
    from .helpers import write_images

    write_images(tmp_path / "mixed", {"cats": 2}, size=(32, 32))
    write_video(tmp_path / "mixed" / "cats" / "zz.mkv", 4)
    pack(tmp_path / "mixed", tmp_path / "shards", 1)
    import tarfile

    with tarfile.open(tmp_path / "shards" / "00000.tar", "a") as archive:
        archive.add(tmp_path / "mixed" / "cats" / "zz.mkv", "zz.mkv")
    found = find_images(tmp_path / "shards" / "00000.tar")
    assert [member_path(path) for path in found.paths] == ["cats/img_000.jpg", "cats/img_001.jpg"]
    assert "the videos are left out" in caplog.text


@pytest.mark.slow  # the store's patience spent (about 9 s)
def test_a_store_that_goes_away_mid_clip_fails_the_batch_not_a_skip(stored_videos, store_env, monkeypatch):
    """The clips are listed while the store answers; then it is away (its endpoint a closed port): decoding a clip
    fails the batch with StoreUnavailable (the job stops with exit 75 and resumes), as an image's fetch does,
    instead of recording the video as undecodable."""
    from torchvision.models import get_model_weights

    from featdump.errors import StoreUnavailable
    from featdump.inputs.clips import ClipPreprocess, dataset_for
    from featdump.inputs.stores import Patience
    from tests.makers.seaweed import free_port_base

    images = as_rows(find_images("s3://movies/set/", patience=Patience(seconds=1)), 4, 10.0, None,
                     ModelClip(16, 15.0, True))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port_base(1)}")  # nothing listens there
    preprocess = ClipPreprocess(get_model_weights("r3d_18").DEFAULT.transforms(), 4)
    items = dataset_for(images, preprocess).__getitems__([0, 1])
    assert all(isinstance(item.fatal, StoreUnavailable) for item in items)
    assert all(item.failure is None for item in items)

