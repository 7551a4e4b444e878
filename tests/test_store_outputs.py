"""Outputs in a store (a real SeaweedFS server on loopback): a run to a URL writes on scratch and uploads the finished
file; shards land in the bucket one by one and are merged from there; `info` reads the bucket's state."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from featdump.inputs.stores import Patience
from featdump.output import remote
from featdump.output.layout import partial_path

from .helpers import (
    SMALL_RESNET,
    assert_same_rows,
    committed_rows,
    featdump_env,
    read_output,
    run_featdump,
    start_featdump,
    write_images,
)
from .makers import small_resnet

EXTRACT = ["extract", *SMALL_RESNET, "-l", "layer3,avgpool"]
LAYERS = ("layer3", "avgpool")
TRIALS = int(os.environ.get("FEATDUMP_FAULT_TRIALS", "3"))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """20 images in two class folders, and their rows from one local run (default workers and batch size)."""
    root = tmp_path_factory.mktemp("to-store")
    write_images(root / "images", {"cats": 10, "dogs": 10}, size=(40, 32))
    assert run_featdump(*EXTRACT, root / "images", root / "local.h5").returncode == 0
    return root / "images", read_output(root / "local.h5")


def fetched(seaweed, url: str, folder) -> dict:
    """The object at URL, downloaded with the test's own client, read as an output."""
    local = folder / url.rsplit("/", 1)[1]
    seaweed.client().get(url.removeprefix("s3://"), str(local))
    return read_output(local)


def bucket(seaweed, name: str) -> str:
    fs = seaweed.client()
    if not fs.exists(name):
        fs.mkdir(name)
    return f"s3://{name}"


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_run_to_a_url_is_made_on_scratch_uploaded_once_finished_and_not_made_again(images, store_env, tmp_path):
    folder, expected = images
    url = f"{bucket(store_env, 'results')}/nightly/features.h5"
    scratch = tmp_path / "scratch"
    made = run_featdump(*EXTRACT, "--scratch", scratch, folder, url)
    assert made.returncode == 0, made.stderr
    assert f"Wrote 20 images (0 skipped) to {url}" in made.stderr
    assert_same_rows(fetched(store_env, url, tmp_path), expected)
    assert not [path for path in scratch.rglob("*") if path.is_file()]  # the scratch copy is gone once uploaded
    again = run_featdump(*EXTRACT, "--scratch", scratch, folder, url)
    assert again.returncode == 0 and "is finished already, made by this same command: nothing to do" in again.stderr
    assert f"Nothing new: {url} already holds 20 images" in again.stderr
    info = run_featdump("info", url)
    assert info.returncode == 0 and "finished, in the store: 20 rows (0 skipped)" in info.stdout, info.stdout


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_another_command_into_a_finished_url_is_refused_as_into_a_local_file(images, store_env, tmp_path):
    """A finished object in the store is judged by the same fingerprint as a local file: other layers (or another
    model) are refused with exit 2 naming the difference, --update adds them, and the same command is done at once
    (nothing downloaded, nothing uploaded); a shard's object likewise."""
    folder, expected = images
    url = f"{bucket(store_env, 'results')}/judged/features.h5"
    scratch = tmp_path / "scratch"
    assert run_featdump(*EXTRACT, "--scratch", scratch, folder, url).returncode == 0
    other_layers = ["extract", *SMALL_RESNET, "-l", "layer4,avgpool", "--scratch", scratch]
    refused = run_featdump(*other_layers, folder, url)
    assert refused.returncode == 2, refused.stderr
    assert "made by another command (layers:" in refused.stderr and "--update" in refused.stderr, refused.stderr
    other_model = run_featdump("extract", "-m", "resnet34", "-w", "none", "-l", "layer3,avgpool", "--scratch",
                               scratch, folder, url)
    assert other_model.returncode == 2, other_model.stderr
    assert "model: \"tests.makers.small_resnet:build\" when started" in other_model.stderr
    stored = fetched(store_env, url, tmp_path)
    assert "layer4" not in stored
    assert_same_rows(stored, expected)
    grown = run_featdump(*other_layers, "--update", folder, url)
    assert grown.returncode == 0, grown.stderr
    assert {"layer3", "layer4", "avgpool"} <= set(fetched(store_env, url, tmp_path / "grown"))
    modified = store_env.client().info(url.removeprefix("s3://"))["LastModified"]
    again = run_featdump(*other_layers, "--update", folder, url)
    assert again.returncode == 0 and "nothing to add" in again.stderr, again.stderr
    assert store_env.client().info(url.removeprefix("s3://"))["LastModified"] == modified  # not uploaded again
    assert not [path for path in scratch.rglob("*") if path.is_file()]
    shard = [*EXTRACT, "--shard", "1/2", "--scratch", scratch, folder, f"{bucket(store_env, 'results')}/sh/f.h5"]
    assert run_featdump(*shard).returncode == 0
    assert run_featdump(*shard).returncode == 0
    other_shard = [arg if arg != "layer3,avgpool" else "layer2,avgpool" for arg in shard]
    refused_shard = run_featdump(*other_shard)
    assert refused_shard.returncode == 2 and "made by another command" in refused_shard.stderr, refused_shard.stderr


def test_a_missing_output_bucket_is_refused_before_the_first_image(images, store_env, tmp_path, monkeypatch):
    """A user who may write objects but not make buckets names a bucket that does not exist: exit 2 at once (not
    at the upload after the whole run), nothing computed, nothing left on scratch."""
    folder, _ = images
    for key, value in store_env.writer_env.items():
        monkeypatch.setenv(key, value)
    result = run_featdump(*EXTRACT, "--scratch", tmp_path / "scratch", folder, "s3://no-such-bucket/run/out.h5")
    assert result.returncode == 2, result.stderr
    assert "access refused" in result.stderr and "nothing was computed" in result.stderr, result.stderr
    assert "create the bucket" in result.stderr and "images (100%)" not in result.stderr  # no image was read
    assert not [path for path in (tmp_path / "scratch").rglob("*") if path.is_file()]
    made = run_featdump(*EXTRACT, "--scratch", tmp_path / "scratch", folder, f"{bucket(store_env, 'results')}/w.h5")
    assert made.returncode == 0, made.stderr  # the same user writes into a bucket that exists


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_listing_that_changed_between_shards_is_named_with_its_counts_and_the_remedy(store_env, tmp_path):
    """Shard 0 lists 6 images, then the folder gains 2 and shard 1 lists 8: the merge is refused before any
    download, naming the listing's change and the frozen listing; info says the same instead of "run merge"; shard
    0 run again is refused for the same reason, not "Nothing new"."""
    folder = tmp_path / "images"
    write_images(folder, {"cats": 3, "dogs": 3}, size=(40, 32))
    url = f"{bucket(store_env, 'results')}/listing/features.h5"
    shard = [*EXTRACT, "--scratch", tmp_path / "scratch", folder, url]
    assert run_featdump(*shard[:-2], "--shard", "0/2", *shard[-2:]).returncode == 0
    write_images(folder / "late", {"": 2}, size=(40, 32))
    assert run_featdump(*shard[:-2], "--shard", "1/2", *shard[-2:]).returncode == 0
    merged = run_featdump("merge", url, "--scratch", tmp_path / "merge")
    assert merged.returncode != 0 and "listing of its images changed: 6 images in one listing, 8 in the other" in \
        merged.stderr, merged.stderr
    assert "freeze the listing: write it once to a list file" in merged.stderr
    assert not (tmp_path / "merge").exists() or not any((tmp_path / "merge").rglob("*.h5"))  # nothing downloaded
    info = run_featdump("info", url).stdout
    assert "cannot be merged" in info and "listing of its images changed" in info and "run `featdump merge" not in info
    again = run_featdump(*shard[:-2], "--shard", "0/2", *shard[-2:])
    assert again.returncode == 2 and "listing of its images changed: 6 images" in again.stderr, again.stderr


@pytest.mark.slow  # a store or many processes beyond a few seconds: make test-all (CI)
def test_shards_land_in_the_bucket_and_merge_from_there_as_from_disk(images, store_env, tmp_path):
    folder, expected = images
    url = f"{bucket(store_env, 'results')}/sharded/features.h5"
    for index in (0, 2):
        assert run_featdump(*EXTRACT, "--shard", f"{index}/3", "--scratch", tmp_path / "s", folder, url).returncode == 0
    info = run_featdump("info", url)
    assert "2 of 3 shards finished in the store" in info.stdout and "shard 1" in info.stdout, info.stdout
    refused = run_featdump("merge", url)
    assert refused.returncode != 0 and "1 of 3 shards are not in the store (shard 1;" in refused.stderr
    assert run_featdump(*EXTRACT, "--shard", "1/3", "--scratch", tmp_path / "s", folder, url).returncode == 0
    assert "all 3 shards are finished in the store" in run_featdump("info", url).stdout
    merged = run_featdump("merge", "--scratch", tmp_path / "m", url)
    assert merged.returncode == 0 and "self-contained copy" in merged.stderr, merged.stderr
    from_store = fetched(store_env, url, tmp_path)
    assert_same_rows(from_store, expected)
    on_disk = tmp_path / "disk"  # the same shards, merged where they lie on a file system
    on_disk.mkdir()
    for index in range(3):
        store_env.client().get(f"results/sharded/features.shard-{index}-of-3.h5", str(on_disk))
    assert run_featdump("merge", "--copy", on_disk / "features.h5").returncode == 0
    assert_same_rows(from_store, read_output(on_disk / "features.h5"))


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_an_upload_repeated_after_a_late_success_leaves_one_whole_object(images, store_env, tmp_path):
    folder, _ = images
    local = tmp_path / "features.h5"
    assert run_featdump(*EXTRACT, folder, local).returncode == 0
    url = f"{bucket(store_env, 'results')}/twice/features.h5"
    remote.upload(local, url, Patience(10))
    remote.upload(local, url, Patience(10))  # the retry of a task whose first upload succeeded late
    fs = store_env.client()
    assert fs.ls("results/twice/", detail=False) == ["results/twice/features.h5"]
    assert fs.cat("results/twice/features.h5") == local.read_bytes()


@pytest.mark.slow  # real processes, killed at random moments
def test_a_shard_killed_at_random_moments_and_run_again_equals_a_clean_run(images, seaweed, tmp_path):
    """Each trial kills the shard's process after a random delay (before its first commit, mid-shard, during or
    after its upload), then runs the same command until it exits 0; the merged result equals the single run."""
    folder, expected = images
    env = featdump_env(**seaweed.env)
    rng = random.Random(0)
    for trial in range(TRIALS):
        url = f"{bucket(seaweed, 'results')}/killed-{trial}/features.h5"
        scratch = tmp_path / f"scratch-{trial}"
        arguments = [*EXTRACT, "-b", "2", "--shard", "0/2", "--scratch", scratch, folder, url]
        process = start_featdump(*arguments, env=env)
        try:  # a whole run of this shard takes about 8-10 s here: one that ends first is not waited for
            process.wait(timeout=rng.uniform(0.5, 12.0))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
        resumed = run_featdump(*arguments, env=env, process=True)
        assert resumed.returncode == 0, resumed.stderr
        assert seaweed.client().exists(f"results/killed-{trial}/features.shard-0-of-2.h5")
        assert run_featdump(*EXTRACT, "--shard", "1/2", "--scratch", scratch, folder, url, env=env,
                            process=True).returncode == 0
        assert run_featdump("merge", "--scratch", tmp_path / "m", url, env=env, process=True).returncode == 0
        assert_same_rows(fetched(seaweed, url, tmp_path), expected)


@pytest.mark.slow  # a store or many processes beyond a few seconds: make test-all (CI)
def test_a_shard_killed_mid_shard_resumes_the_partial_file_on_its_scratch(images, seaweed, tmp_path, monkeypatch):
    folder, _ = images
    url = f"{bucket(seaweed, 'results')}/resumed/features.h5"
    scratch = tmp_path / "scratch"
    arguments = [*EXTRACT, "-b", "2", "--shard", "0/2", "--scratch", scratch, folder, url]
    env = featdump_env(**seaweed.env)
    for key, value in seaweed.env.items():  # the twin is named after the endpoint the process writes to
        monkeypatch.setenv(key, value)
    partial = partial_path(remote.scratch_twin(url, scratch).with_name("features.shard-0-of-2.h5"))
    process = start_featdump(*arguments, env={**env, small_resnet.HOLD_AFTER: "2"})  # held before its 5th image
    while committed_rows(partial) < 4 and process.poll() is None:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert committed_rows(partial) == 4
    assert not seaweed.client().exists("results/resumed/features.shard-0-of-2.h5")  # not finished: not uploaded
    resumed = run_featdump(*arguments, env=env)
    assert resumed.returncode == 0 and "resuming the partial file found there" in resumed.stderr, resumed.stderr
    assert "Resuming at image" in resumed.stderr
