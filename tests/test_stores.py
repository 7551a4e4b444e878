"""Images where they live: an S3 store (a real SeaweedFS server on loopback) and URLs (a real http.server), read
as the same images on disk are read."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import h5py
import numpy as np
import pytest
from PIL import Image

from featdump.errors import StoreNeverAnswered, StoreUnavailable
from featdump.faces.show import _read
from featdump.inputs import find_images
from featdump.inputs.stores import Patience, fetch_all, is_missing, is_refused, is_transient

from .helpers import SMALL_RESNET, committed_rows, featdump_env, read_output, run_featdump, start_featdump, write_images
from .makers import small_resnet
from .stores import http_server, silent_server
from .test_tars import member_path, pack

EXTRACT = ["extract", *SMALL_RESNET, "-l", "layer4.1.relu:2,avgpool"]
LAYERS = ("layer4.1.relu:2", "avgpool")


@pytest.fixture(scope="module")
def images(tmp_path_factory, seaweed):
    """16 images in two class folders on disk, the same under s3://photos/set/, as 4 tars under
    s3://photos/shards/, and the folder's rows extracted from disk (default workers and batch size)."""
    root = tmp_path_factory.mktemp("stored")
    write_images(root / "images", {"cats": 8, "dogs": 8}, size=(40, 32))
    pack(root / "images", root / "shards", 4)
    seaweed.upload(root / "images", "s3://photos/set")
    seaweed.upload(root / "shards", "s3://photos/shards")
    output = root / "folder.h5"
    assert run_featdump(*EXTRACT, root / "images", output).returncode == 0
    return root, read_output(output)


def assert_rows_equal(content: dict, expected: dict, name=lambda path: path, labelled: bool = True) -> None:
    index = {path: row for row, path in enumerate(expected["paths"])}
    rows = [index[name(path)] for path in content["paths"]]
    for layer in LAYERS:
        np.testing.assert_array_equal(content[layer], expected[layer][rows])
    labels = expected["labels"][rows] if labelled else np.full(len(rows), -1)  # a list without labels has none
    np.testing.assert_array_equal(content["labels"], labels)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_prefix_is_read_as_the_folder_it_was_uploaded_from(images, store_env, tmp_path):
    root, folder = images
    output = tmp_path / "out.h5"
    result = run_featdump(*EXTRACT, "s3://photos/set/", output)  # default workers and batch size
    assert result.returncode == 0, result.stderr
    assert "Listed 16 objects under s3://photos/set/" in result.stderr
    content = read_output(output)
    assert content["paths"] == folder["paths"] and content["classes"] == ["cats", "dogs"]
    assert_rows_equal(content, folder)
    with h5py.File(output, "r") as h5file:
        assert h5file.attrs["image_root"] == "s3://photos/set"  # rows are keys relative to it
        listing = json.loads(h5file.attrs["image_listing"])
        assert (listing["url"], listing["objects"], listing["images"]) == ("s3://photos/set/", 16, 16)
        stats = h5file["file_stats"][:]
    sizes = {path.removeprefix("photos/set/"): size
             for path, size in store_env.client().du("photos/set", total=False).items()}
    assert stats[:, 0].tolist() == [sizes[path] for path in content["paths"]]  # identities as listed
    assert (stats[:, 1] > 1_700_000_000 * 10**9).all()  # modification times in ns

    info = run_featdump("info", output)
    assert info.returncode == 0 and "image_root: s3://photos/set" in info.stdout, info.stdout
    assert '"objects": 16' in info.stdout  # the listing, as recorded
    _, _, image, path = _read(output, "avgpool", 9)  # show reads the image back from the store
    assert path == "dogs/img_001.jpg" and image is not None  # as the model saw it: its transform keeps no geometry
    np.testing.assert_array_equal(image, np.asarray(Image.open(root / "images" / path).convert("RGB")))
    again = run_featdump(*EXTRACT, "s3://photos/set", output)  # the same prefix, without its slash
    assert again.returncode == 0 and "Nothing new:" in again.stderr, again.stderr  # same listing, same identities


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_tar_urls_by_brace_patterns_joined_with_colons(images, store_env, tmp_path):
    root, folder = images
    output = tmp_path / "out.h5"
    pattern = "s3://photos/shards/{00000..00001}.tar::s3://photos/shards/0000{2,3}.tar"
    result = run_featdump(*EXTRACT, pattern, output)
    assert result.returncode == 0, result.stderr
    content = read_output(output)
    assert content["paths"][0] == "00000.tar/cats/img_000.jpg"
    assert [member_path(path) for path in content["paths"]] == folder["paths"]
    assert_rows_equal(content, folder, member_path)
    with h5py.File(output, "r") as h5file:
        assert h5file.attrs["image_root"] == "s3://photos/shards"
    _, _, image, path = _read(output, "avgpool", 5)  # read back from its tar in the store
    assert path == "00001.tar/cats/img_005.png" and image is not None
    kept = sorted((tmp_path / "cache" / "featdump" / "tar-index").iterdir())
    assert len(kept) == 4  # each tar's headers, read once and kept
    index = json.loads(kept[0].read_text())
    kept[0].write_text(json.dumps({**index, "images": index["images"][:-1]}))  # a kept index one image short
    again = run_featdump(*EXTRACT, "--overwrite", pattern, output)
    assert again.returncode == 0 and "Wrote 15 images" in again.stderr, again.stderr  # it was read, not the tar

    for index in range(2):  # shards split by whole tars
        part = run_featdump(*EXTRACT, "--shard", f"{index}/2", pattern, tmp_path / "sharded.h5")
        assert part.returncode == 0, part.stderr
    first = read_output(tmp_path / "sharded.shard-0-of-2.h5")
    assert {path.split("/")[0] for path in first["paths"]} == {"00000.tar", "00001.tar"}


@pytest.mark.slow  # a store or many processes beyond a few seconds: make test-all (CI)
def test_a_list_of_urls_mixed_with_paths_and_a_list_at_a_url(images, store_env, tmp_path):
    root, folder = images
    paths = folder["paths"]
    with http_server(root / "images") as base:
        listed = tmp_path / "list.txt"
        lines = [f"{base}/{path}" if row % 3 == 0 else f"s3://photos/set/{path}" if row % 3 == 1
                 else str(root / "images" / path) for row, path in enumerate(paths)]
        listed.write_text("\n".join([*lines, f"{base}/cats/gone.jpg"]) + "\n")
        output = tmp_path / "mixed.h5"
        result = run_featdump(*EXTRACT, listed, output)
        assert result.returncode == 0, result.stderr
        content = read_output(output)
        assert content["paths"] == lines  # each row named by its URL or path
        assert content["skipped"] == [f"{base}/cats/gone.jpg"] and "not found" in content["reasons"][0].lower()
        assert_rows_equal(content, folder, lambda line: paths[lines.index(line)], labelled=False)

        (root / "images" / "list.txt").write_text("".join(f"{path}\n" for path in paths))  # relative to its URL
        remote = tmp_path / "remote.h5"
        result = run_featdump(*EXTRACT, f"{base}/list.txt", remote)
        assert result.returncode == 0, result.stderr
        content = read_output(remote)
        assert content["paths"] == paths
        np.testing.assert_array_equal(content["avgpool"], folder["avgpool"])
        _, _, image, _ = _read(remote, "avgpool", 3)
        assert image is not None


def test_a_single_object_url_is_one_image(images, store_env, tmp_path):
    root, folder = images
    result = run_featdump(*EXTRACT, "s3://photos/set/dogs/img_001.jpg", tmp_path / "one.h5")
    assert result.returncode == 0 and "Wrote 1 images (0 skipped)" in result.stderr, result.stderr
    content = read_output(tmp_path / "one.h5")
    assert content["paths"] == ["img_001.jpg"]
    assert_rows_equal(content, folder, lambda path: "dogs/" + path, labelled=False)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_list_in_a_bucket_resolves_dot_dot_as_a_local_list_does(images, store_env, tmp_path):
    root, folder = images
    lines = "".join(f"../set/{path}\n" for path in folder["paths"])
    store_env.client().pipe("photos/lists/list.txt", lines.encode())
    result = run_featdump(*EXTRACT, "s3://photos/lists/list.txt", tmp_path / "out.h5")
    assert result.returncode == 0 and "(0 skipped)" in result.stderr, result.stderr
    content = read_output(tmp_path / "out.h5")
    assert content["paths"] == [f"../set/{path}" for path in folder["paths"]]
    assert_rows_equal(content, folder, lambda path: path.removeprefix("../set/"), labelled=False)


def test_a_file_system_without_async_reads_is_fetched_by_threads(images, tmp_path):
    """hf:// (huggingface_hub) is such a file system; fsspec's memory:// stands in for it here (no network)."""
    import fsspec

    root, folder = images
    memory = fsspec.filesystem("memory")
    for path in folder["paths"][:6]:
        memory.pipe_file(f"/photos/{path}", (root / "images" / path).read_bytes())
    memory.pipe_file("/photos/list.txt", "".join(f"{path}\n" for path in folder["paths"][:6]).encode())
    output = tmp_path / "out.h5"
    result = run_featdump(*EXTRACT, "memory://photos/list.txt", output)  # the default workers: forked, as ever
    assert result.returncode == 0, result.stderr
    content = read_output(output)
    assert content["paths"] == folder["paths"][:6]
    np.testing.assert_array_equal(content["avgpool"], folder["avgpool"][:6])


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_missing_and_undecodable_objects_are_recorded_skips(images, store_env, tmp_path):
    root, folder = images
    fs = store_env.client()
    fs.pipe({"photos/broken/a/fine.jpg": (root / "images" / "cats" / "img_000.jpg").read_bytes(),
             "photos/broken/a/garbage.jpg": b"not a jpeg at all"})
    listed = tmp_path / "list.txt"
    listed.write_text("s3://photos/set/cats/img_000.jpg\ns3://photos/set/cats/gone.jpg\n")
    for source, skipped, reason in [("s3://photos/broken/", "a/garbage.jpg", "cannot identify image file"),
                                    (listed, "s3://photos/set/cats/gone.jpg", "file not found")]:
        output = tmp_path / "out.h5"
        result = run_featdump(*EXTRACT, "--overwrite", source, output)
        assert result.returncode == 0, result.stderr
        content = read_output(output)
        assert content["skipped"] == [skipped] and reason in content["reasons"][0], content["reasons"]
        assert len(content["paths"]) == 1
        np.testing.assert_array_equal(content["avgpool"][0], folder["avgpool"][0])


def test_bad_credentials_and_a_missing_bucket_stop_before_any_work(images, store_env, tmp_path, monkeypatch):
    output = tmp_path / "out.h5"
    listed = tmp_path / "list.txt"
    listed.write_text("s3://photos/set/cats/img_000.jpg\n")
    missing = run_featdump(*EXTRACT, "s3://no-such-bucket/images/", output)
    assert missing.returncode == 2 and "the bucket does not exist" in missing.stderr, missing.stderr
    assert "access refused" not in missing.stderr
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    for source in ["s3://photos/set/", listed, "s3://photos/shards/00000.tar"]:
        result = run_featdump(*EXTRACT, source, output)
        assert result.returncode == 2, result.stderr
        lines = [line for line in result.stderr.strip().splitlines() if " INFO: " not in line]  # the log's lines
        assert len(lines) == 1 and "access refused" in lines[0] and "Traceback" not in result.stderr, lines
        assert not output.exists() and not (tmp_path / "out.h5.partial").exists()


@pytest.mark.slow  # a real process (without s3fs)
def test_a_missing_package_and_missing_credentials_are_refused_with_the_way_out(tmp_path, monkeypatch):
    without_s3fs = "import sys; sys.modules['s3fs'] = None; from featdump.faces.cli import main; main()"
    missing = subprocess.run([sys.executable, "-c", without_s3fs, *EXTRACT, "s3://photos/set/", tmp_path / "o.h5"],
                             capture_output=True, text=True, env=featdump_env())  # as if the extra were missing
    assert missing.returncode == 2, missing.stderr
    assert "needs the package s3fs" in missing.stderr and "pip install 'featdump[s3]'" in missing.stderr
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    no_credentials = run_featdump(*EXTRACT, "--store-patience", "60", "s3://photos/set/", tmp_path / "out.h5")
    assert no_credentials.returncode == 2 and "NoCredentialsError" in no_credentials.stderr  # not retried


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_update_appends_the_objects_added_under_the_prefix(images, store_env, tmp_path):
    root, _ = images
    write_images(tmp_path / "grown", {"cats": 3, "dogs": 3}, size=(40, 32))
    store_env.upload(tmp_path / "grown", "s3://grown/set")
    output = tmp_path / "out.h5"
    arguments = [*EXTRACT, "--update", "s3://grown/set/", output]
    assert run_featdump(*arguments).returncode == 0
    write_images(tmp_path / "more", {"birds": 2, "cats": 1}, seed=5, size=(40, 32))
    (tmp_path / "more" / "cats" / "img_000.jpg").rename(tmp_path / "more" / "cats" / "new_000.jpg")
    store_env.upload(tmp_path / "more", "s3://grown/set")
    updated = run_featdump(*arguments)
    assert updated.returncode == 0, updated.stderr
    assert f"Wrote 3 images (0 skipped) to {output}, 9 in all (0 skipped)," in updated.stderr
    store_env.client().get("grown/set", str(tmp_path / "everything"), recursive=True)
    fresh = tmp_path / "fresh.h5"
    assert run_featdump(*EXTRACT, tmp_path / "everything", fresh).returncode == 0
    content, expected = read_output(output), read_output(fresh)
    assert sorted(content["paths"]) == expected["paths"] and content["paths"][-3:] == [
        "birds/img_000.jpg", "birds/img_001.jpg", "cats/new_000.jpg"]
    order = [expected["paths"].index(path) for path in content["paths"]]
    for layer in LAYERS:
        np.testing.assert_allclose(content[layer], expected[layer][order], rtol=1e-5, atol=1e-6)
    assert content["classes"] == ["cats", "dogs", "birds"]  # a new class appended
    with h5py.File(output, "r", locking=False) as h5file:
        assert json.loads(h5file.attrs["image_listing"])["objects"] == 9  # the listing this update read
    again = run_featdump(*arguments)
    assert again.returncode == 0 and "Nothing new:" in again.stderr, again.stderr


@pytest.mark.slow  # two more extractions; the prefix's --update stays in the quick suite
def test_update_appends_a_new_tar_of_a_list_of_tar_urls(images, store_env, tmp_path):
    root, _ = images
    store_env.upload(root / "shards", "s3://grown-tars/shards")
    listed = tmp_path / "tars.txt"
    listed.write_text("".join(f"s3://grown-tars/shards/{index:05d}.tar\n" for index in range(4)))
    output = tmp_path / "out.h5"
    arguments = [*EXTRACT, "--update", listed, output]
    assert run_featdump(*arguments).returncode == 0
    write_images(tmp_path / "more", {"birds": 3}, seed=7, size=(40, 32))
    pack(tmp_path / "more", tmp_path / "new", 1, first=4)
    store_env.upload(tmp_path / "new", "s3://grown-tars/shards")
    with listed.open("a") as handle:
        handle.write("s3://grown-tars/shards/00004.tar\n")
    updated = run_featdump(*arguments)
    assert updated.returncode == 0, updated.stderr
    assert f"Wrote 3 images (0 skipped) to {output}, 19 in all (0 skipped)," in updated.stderr
    content = read_output(output)
    assert content["paths"][-1] == "00004.tar/birds/img_002.png" and content["labels"][-1] == 0


def test_each_fault_is_judged_missing_refused_or_transient():
    import aiohttp
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError

    def answer(status: int) -> Exception:
        return aiohttp.ClientResponseError(None, (), status=status)

    missing = [FileNotFoundError("photos/bucket_shots/x.jpg"), answer(404)]
    refused = [FileNotFoundError("The specified bucket does not exist"), PermissionError("Access Denied"),
               answer(403), NoCredentialsError()]
    transient = [ConnectionResetError("reset by peer"), TimeoutError(), answer(503), answer(429),
                 EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), OSError(5, "SlowDown")]
    assert [is_missing(error) for error in missing + refused + transient] == [True] * 2 + [False] * 10
    assert [is_refused(error) for error in missing + refused + transient] == [False] * 2 + [True] * 4 + [False] * 6
    assert [is_transient(error) for error in missing + refused + transient] == [False] * 6 + [True] * 6
    assert not is_transient(answer(400))  # a client error: not retried, not a refusal either
    looked_up = FileNotFoundError("http://127.0.0.1:9/x.tar")  # fsspec's http lookup, whatever went wrong
    looked_up.__cause__ = TimeoutError()
    assert is_transient(looked_up) and not is_missing(looked_up)
    looked_up.__cause__ = answer(404)
    assert is_missing(looked_up) and not is_transient(looked_up)
    from botocore.exceptions import ClientError

    bad_request = ClientError({"Error": {"Code": "InvalidRequest", "Message": "bad"},
                               "ResponseMetadata": {"HTTPStatusCode": 400}}, "GetObject")
    wrapped = OSError(5, "bad")  # as s3fs raises it
    wrapped.__cause__ = bad_request
    assert not is_transient(bad_request) and not is_transient(wrapped)  # S3's 400: no retry helps


def test_transient_faults_are_retried_within_the_patience_then_name_the_object(seaweed):
    calls = []

    def flaky():
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ConnectionResetError("connection reset by peer")
        return "read"

    assert Patience(10).call(flaky, "Reading s3://x/y.jpg") == "read" and len(calls) == 3
    calls.clear()

    def slow_first_try():  # the first try outlasts the whole patience (a client's start on a loaded machine)
        if not calls:
            time.sleep(0.3)
        return flaky()

    with pytest.raises(StoreNeverAnswered, match="2 tries in"):  # a fault is still tried twice, then said
        Patience(0.2).call(slow_first_try, "Reading s3://x/y.jpg")
    assert len(calls) == 2
    missing = FileNotFoundError("s3://x/y.jpg")
    with pytest.raises(FileNotFoundError):  # a missing object is not retried
        Patience(10).call(lambda: (_ for _ in ()).throw(missing), "Reading s3://x/y.jpg")
    started = time.monotonic()
    never = r"^Reading http://127\.0\.0\.1:9/away\.jpg: the store did not answer"
    with pytest.raises(StoreNeverAnswered, match=never):  # nothing listens on port 9: its address, most likely
        fetch_all(["http://127.0.0.1:9/away.jpg"], Patience(0.5))
    assert time.monotonic() - started < 15
    answered = Patience(0.5)
    answered.call(lambda: "listed", "Listing")  # the store answered this job before: now it is away (exit 75 too)
    with pytest.raises(StoreUnavailable, match="run the same command again to resume once the store is back"):
        fetch_all(["http://127.0.0.1:9/away.jpg"], answered)
    assert not issubclass(StoreNeverAnswered, StoreUnavailable)  # what Ray retries is the second, not the first


@pytest.mark.slow  # real processes: a SIGKILL, then an outage of the store
def test_a_kill_and_a_store_outage_both_resume_with_the_same_command(seaweed, tmp_path):
    write_images(tmp_path / "images", {"cats": 20, "dogs": 20}, size=(40, 32))
    seaweed.upload(tmp_path / "images", "s3://outage/set")
    fresh = tmp_path / "fresh.h5"
    assert run_featdump(*EXTRACT, tmp_path / "images", fresh).returncode == 0
    output, partial = tmp_path / "out.h5", tmp_path / "out.h5.partial"
    arguments = [*EXTRACT, "-b", "2", "--store-patience", "3", "s3://outage/set/", output]
    env = featdump_env(**seaweed.env)

    process = start_featdump(*arguments, env={**env, small_resnet.HOLD_AFTER: "1"})  # the default loader workers
    while committed_rows(partial) <= 0 and process.poll() is None:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = committed_rows(partial)
    assert killed_at == 2  # held before its second batch

    release = tmp_path / "release"  # held after its first batch until the store is down
    held = {small_resnet.HOLD_AFTER: "1", small_resnet.HOLD_RELEASE: str(release)}
    process = start_featdump(*arguments, env={**env, **held})
    while committed_rows(partial) <= killed_at and process.poll() is None:
        time.sleep(0.01)
    seaweed.stop()
    release.touch()
    try:
        _, stderr = process.communicate(timeout=120)
        lines = [line for line in stderr.splitlines() if " INFO: " not in line and " WARNING: " not in line]
        assert process.returncode == 75, stderr
        assert " WARNING: Reading s3://outage/set/" in stderr and "trying again in" in stderr  # the waits, said
        assert len(lines) == 1 and "the store did not answer" in lines[0] and "s3://outage/set/" in lines[0], lines
        stopped_at = committed_rows(partial)
        assert killed_at < stopped_at < 40 and not output.exists()
    finally:
        seaweed.start()
    resumed = run_featdump(*arguments, env=env, process=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"Resuming at image {stopped_at} of 40" in resumed.stderr
    content, expected = read_output(output), read_output(fresh)
    assert content["paths"] == expected["paths"]
    for layer in LAYERS:
        np.testing.assert_array_equal(content[layer], expected[layer])


@pytest.mark.slow  # a store or many processes beyond a few seconds: make test-all (CI)
def test_find_images_lists_a_prefix_in_pages(seaweed, store_env, tmp_path):
    fs = store_env.client()
    fs.mkdir("many")
    fs.pipe({f"many/set/{index:05d}.jpg": b"x" for index in range(1200)})  # past 1,000 keys per page
    found = find_images("s3://many/set")
    assert len(found) == 1200 and found.paths[0] == "00000.jpg" and found.paths[-1] == "01199.jpg"
    assert found.classes == ()


def _noise_tar(path, seed: int, flip: bool) -> None:
    """16 uncompressed 40x32 PNGs of noise (so every rebuild is the same size) in classes a/ and b/, with .cls."""
    rng = np.random.default_rng(seed)
    with tarfile.open(path, "w") as archive:
        for index in range(16):
            image = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (32, 40, 3), dtype=np.uint8)).save(image, "png", compress_level=0)
            label = b"%d" % ((index + flip) % 2)
            for name, data in ((f"{index:03d}.png", image.getvalue()), (f"{index:03d}.cls", label)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_a_tar_rebuilt_at_a_web_server_to_the_same_size_and_time_is_read_anew(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    served, tar = tmp_path / "served", tmp_path / "served" / "shard.tar"
    served.mkdir()
    _noise_tar(tar, seed=0, flip=False)
    size, when = tar.stat().st_size, tar.stat().st_mtime
    with http_server(served, ranges=True) as base:
        assert run_featdump(*EXTRACT, f"{base}/shard.tar", tmp_path / "old.h5").returncode == 0
        _noise_tar(tar, seed=1, flip=True)  # other images, other labels: the same size, the same Last-Modified
        os.utime(tar, (when, when))
        assert tar.stat().st_size == size
        again = run_featdump(*EXTRACT, "--overwrite", f"{base}/shard.tar", tmp_path / "new.h5")
        assert again.returncode == 0 and "Wrote 16 images (0 skipped)" in again.stderr, again.stderr
    assert run_featdump(*EXTRACT, tar, tmp_path / "local.h5").returncode == 0
    content, expected = read_output(tmp_path / "new.h5"), read_output(tmp_path / "local.h5")
    assert content["labels"].tolist() == expected["labels"].tolist() == [1, 0] * 8
    for layer in LAYERS:
        np.testing.assert_array_equal(content[layer], expected[layer])


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_web_server_that_ignores_range_still_gives_every_tar_member(images, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root, folder = images
    with http_server(root / "shards") as base:  # Python's http.server sends whole files
        result = run_featdump(*EXTRACT, f"{base}/{{00000..00003}}.tar", tmp_path / "out.h5")
    assert result.returncode == 0 and "Wrote 16 images (0 skipped)" in result.stderr, result.stderr
    assert_rows_equal(read_output(tmp_path / "out.h5"), folder, member_path)


@pytest.mark.slow  # a store that hangs: seconds of waiting
def test_a_store_that_hangs_ends_the_job_within_a_small_multiple_of_the_patience(tmp_path, monkeypatch):
    with silent_server() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
        (tmp_path / "empty").mkdir()
        started = time.monotonic()  # the same command's start and first refusal, on a loaded machine too
        assert run_featdump(*EXTRACT, tmp_path / "empty", tmp_path / "out.h5").returncode != 0
        start_cost = time.monotonic() - started
        for source in ("s3://hung/set/", f"{url}/shard.tar"):
            started = time.monotonic()
            result = run_featdump(*EXTRACT, "--store-patience", "4", source, tmp_path / "out.h5")
            seconds = time.monotonic() - started - start_cost
            assert result.returncode == 75 and "did not answer" in result.stderr, result.stderr
            assert seconds < 3 * 4, (source, seconds, start_cost)
            where = f"endpoint {url} from AWS_ENDPOINT_URL" if source.startswith("s3") else f"server {url[7:]}"
            waits = [line for line in result.stderr.splitlines() if "WARNING" in line and "trying again in" in line]
            if source.startswith("s3"):  # (the web server's one try, HEAD then GET, takes the whole patience)
                assert waits and where in waits[0], result.stderr  # each wait said, naming where it waits
            last = result.stderr.strip().splitlines()[-1]
            assert where in last and "Nothing was ever read from it by this process: check its address" in last, last
