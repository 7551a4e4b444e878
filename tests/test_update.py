"""Cron: --update over a growing folder appends only the new images; rows already there never change."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

import featdump
from featdump.errors import UsageProblem
from featdump.output.merge import merge, merged_view

from .helpers import committed_rows, featdump_env, run_featdump, start_featdump, write_images

LAYERS = "layer1.0.relu:2,avgpool"


def update_args(images, output, *extra):
    return ["extract", "-m", "resnet18", "-w", "none", "-l", LAYERS, "-b", "4", "--update", *extra, images, output]


def rows_by_path(path) -> dict:
    with h5py.File(path, "r", locking=False) as h5file:
        rows = int(h5file.attrs["committed"][0])
        names = h5file["paths"].asstr()[:rows]
        features = {name: h5file["features"][name][:rows] for name in h5file.attrs["layers"]}
        labels = h5file["labels"][:rows]
        classes = [str(c) for c in h5file["labels"].attrs["classes"]]
    return {name: ({layer: values[i] for layer, values in features.items()}, classes[labels[i]])
            for i, name in enumerate(names)}


def assert_rows_kept(before: dict, after: dict):
    for name, (features, label) in before.items():
        assert after[name][1] == label, name
        for layer, values in features.items():
            np.testing.assert_array_equal(after[name][0][layer], values, err_msg=f"{name} {layer}")  # bit for bit


@pytest.mark.slow
def test_update_12_20_120_with_a_kill_equals_a_fresh_run(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out.h5"
    write_images(images, {"cats": 6, "dogs": 6}, size=(40, 32))
    first = run_featdump(*update_args(images, output))  # OUT does not exist: a normal run
    assert first.returncode == 0, first.stderr
    before = rows_by_path(output)
    assert len(before) == 12

    nothing = run_featdump(*update_args(images, output))
    assert nothing.returncode == 0 and "Nothing new:" in nothing.stderr
    assert rows_by_path(output).keys() == before.keys()

    write_images(images / "dogs", {"more": 4}, seed=1, size=(40, 32))  # dogs/more/...
    write_images(images, {"ants": 4}, seed=2, size=(40, 32))  # a new class sorting before the others
    second = run_featdump(*update_args(images, output))
    assert second.returncode == 0, second.stderr
    after = rows_by_path(output)
    assert len(after) == 20
    assert_rows_kept(before, after)
    assert after["ants/img_000.jpg"][1] == "ants" and after["cats/img_000.jpg"][1] == "cats"

    write_images(images, {"zebras": 100}, seed=3, size=(40, 32))
    killed = start_featdump(*update_args(images, output), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staging = tmp_path / "out.h5.update.partial"  # new rows are staged beside the output, then appended
    while committed_rows(staging) <= 20 and killed.poll() is None:
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert 20 < committed_rows(staging) < 100
    midway = rows_by_path(output)  # readable, with every row it had
    assert len(midway) == 20
    assert_rows_kept(after, midway)
    info = run_featdump("info", output)
    assert "update:     not finished (killed, or running): new images: " in info.stdout, info.stdout
    assert "of 100 new images done in out.h5.update.partial" in info.stdout

    third = run_featdump(*update_args(images, output))
    assert third.returncode == 0, third.stderr
    final = rows_by_path(output)
    assert len(final) == 120
    assert_rows_kept(midway, final)

    fresh_out = tmp_path / "fresh.h5"
    fresh = run_featdump(*update_args(images, fresh_out))
    assert fresh.returncode == 0, fresh.stderr
    fresh_rows = rows_by_path(fresh_out)
    assert fresh_rows.keys() == final.keys()
    for name, (features, _) in fresh_rows.items():
        for layer, values in features.items():  # other batches, same images: equal up to float summation order
            np.testing.assert_allclose(final[name][0][layer], values, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_update_reports_stale_rows_and_refuses_another_configuration(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out.h5"
    written = write_images(images, {"a": 5}, size=(40, 32))
    assert run_featdump(*update_args(images, output)).returncode == 0
    os.unlink(images / written[0])
    changed = images / written[1]
    changed.write_bytes(changed.read_bytes() + b"\0")  # same image, new size and time
    write_images(images, {"b": 1}, size=(40, 32))
    result = run_featdump(*update_args(images, output))
    assert result.returncode == 0, result.stderr
    assert "2 rows are stale" in result.stderr
    info = run_featdump("info", output)
    gone, changed = (written[index].rsplit("/", 1) for index in (0, 1))  # counted by folder, a few names each
    assert f"  {gone[0]}: 1 disappeared ({gone[1]})" in info.stdout, info.stdout
    assert f"  {changed[0]}: 1 changed ({changed[1]})" in info.stdout, info.stdout
    assert len(rows_by_path(output)) == 6  # their rows stay

    other = run_featdump(*update_args(images, output, "--seed", "3"))
    assert other.returncode == 2 and "seed: 0 when started, 3 now" in other.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_an_update_with_no_new_image_records_the_stale_rows_it_reports(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out.h5"
    written = write_images(images, {"a": 4}, size=(40, 32))
    assert run_featdump(*update_args(images, output)).returncode == 0
    os.utime(images / written[2], ns=(1_000_000_000, 1_000_000_000))  # the same bytes, another time: changed
    for _ in range(2):  # the second run finds them recorded already
        result = run_featdump(*update_args(images, output))
        assert result.returncode == 0 and "1 rows are stale" in result.stderr, result.stderr
        with h5py.File(output, "r", locking=False) as h5file:
            assert [name.decode() for name in h5file["stale/paths"][:]] == [written[2]]
        folder, name = written[2].rsplit("/", 1)
        assert f"  {folder}: 1 changed ({name})" in run_featdump("info", output).stdout
    np.save(tmp_path / "y.npy", np.arange(4.0)[:, None])
    encoded = run_featdump("encode", output, tmp_path / "y.npy", "--folds", "2", "-o", tmp_path / "enc.h5")
    assert encoded.returncode == 0 and "1 rows of" in encoded.stderr and "are stale" in encoded.stderr, \
        encoded.stderr  # a read-out says it uses rows info marks stale


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_tar_member_named_twice_is_no_stale_row(tmp_path):
    import tarfile

    write_images(tmp_path / "images", {"a": 2}, size=(40, 32))
    with tarfile.open(tmp_path / "shard.tar", "w") as archive:
        for name, source in (("x/0.jpg", "a/img_000.jpg"), ("x/0.jpg", "a/img_001.jpg")):
            archive.add(tmp_path / "images" / source, arcname=name)
    output = tmp_path / "out.h5"
    assert run_featdump(*update_args(tmp_path / "shard.tar", output)).returncode == 0
    again = run_featdump(*update_args(tmp_path / "shard.tar", output))
    assert again.returncode == 0 and "stale" not in again.stderr, again.stderr


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_update_over_a_list_file_keeps_its_labels_and_refuses_shards(tmp_path):
    names = write_images(tmp_path / "pool", {"": 5}, size=(40, 32))
    listing, output = tmp_path / "list.csv", tmp_path / "out.h5"
    listing.write_text("path,label\n" + "".join(f"pool/{name},{i}\n" for i, name in enumerate(names[:3])))
    assert run_featdump(*update_args(listing, output)).returncode == 0
    with open(listing, "a") as handle:
        handle.write(f"pool/{names[3]},7\npool/{names[4]},9\n")
    result = run_featdump(*update_args(listing, output))
    assert result.returncode == 0, result.stderr
    with h5py.File(output, "r") as h5file:
        assert list(h5file["labels"][:]) == [0, 1, 2, 7, 9]
    assert run_featdump(*update_args(listing, output, "--shard", "0/2")).returncode == 0  # the shard's first run
    with open(listing, "a") as handle:
        handle.write(f"pool/{names[0]},3\n")  # one image more: every shard's part would move
    sharded = run_featdump(*update_args(listing, output, "--shard", "0/2"))
    assert sharded.returncode == 2 and "new images would move every shard's boundaries" in sharded.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_update_with_a_class_folder_that_is_not_utf8(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out.h5"
    folder = os.path.join(os.fsencode(images), b"caf\xe9")
    os.makedirs(folder)
    made = [os.fsencode(tmp_path / "tmp" / name) for name in write_images(tmp_path / "tmp", {"": 3}, size=(40, 32))]
    for path in made[:2]:
        os.rename(path, os.path.join(folder, os.path.basename(path)))
    assert run_featdump(*update_args(images, output)).returncode == 0
    os.rename(made[2], os.path.join(folder, b"new.jpg"))
    result = run_featdump(*update_args(images, output))
    assert result.returncode == 0, result.stderr
    with h5py.File(output, "r") as h5file:
        assert [str(c) for c in h5file["labels"].attrs["classes"]] == ["caf\\xe9"]  # not added a second time
        assert list(h5file["labels"][:]) == [0, 0, 0]


READER = """
import json, sys, time
import h5py
import featdump

path, stop = sys.argv[1], sys.argv[2]
reads = []
while True:
    finished = __import__("os").path.exists(stop)
    try:
        with h5py.File(path, "r") as f:
            rows = int(f.attrs["committed"][0])
            paths = len(f["paths"].asstr()[:rows])
        loaded = featdump.load(path, "avgpool")  # a second open: a commit may land between the two
        reads.append([time.time(), rows, paths, len(loaded.features), None, len(loaded.paths)])
        if sum(read[4] is None for read in reads) == 1:
            print("ready", flush=True)  # the test starts the update only now: a loaded machine starts us late
    except Exception as error:
        reads.append([time.time(), None, None, None, type(error).__name__ + ": " + str(error)[-300:]])
    if finished:
        break
    time.sleep(0.02)
print(json.dumps(reads))
"""


@pytest.mark.slow  # a reader process beside a real update
def test_the_output_stays_readable_while_an_update_runs(tmp_path):
    images, output, stop = tmp_path / "images", tmp_path / "out.h5", tmp_path / "stop"
    write_images(images, {"a": 16}, size=(40, 32))
    args = ["extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "--update", images, output]
    assert run_featdump(*args).returncode == 0
    write_images(images, {"b": 48}, seed=4, size=(40, 32))
    reader = subprocess.Popen([sys.executable, "-c", READER, str(output), str(stop)], stdout=subprocess.PIPE,
                              text=True, env=featdump_env())
    assert reader.stdout.readline() == "ready\n"
    started = time.time()
    update = run_featdump(*args)  # the default workers and batch size, as cron runs it
    stop.touch()
    reads = json.loads(reader.communicate(timeout=60)[0])
    assert update.returncode == 0, update.stderr
    assert f"Wrote 48 images (0 skipped) to {output}, 64 in all (0 skipped)," in update.stderr
    commit = re.search(r"Final commit: 0 layers and 48 rows added to .* in ([0-9.]+) s", update.stderr)
    assert commit, update.stderr
    good = [read for read in reads if read[4] is None]
    refused = [read for read in reads if read[4] is not None]
    # old rows or all rows, each open consistent in itself (a commit may land between the reader's two opens)
    assert all(read[1] in (16, 64) and read[1] == read[2] and read[3] in (16, 64) and read[3] == read[5]
               for read in good), good
    # read on while the new rows were being extracted
    assert sum(read[1] == 16 and read[0] >= started for read in good) >= 3, good
    assert good[-1][1] == 64
    # Only the final commit keeps readers out: at most the reads that fit in it (one every 20 ms or more).
    assert len(refused) <= 2 + float(commit[1]) / 0.02, refused
    assert all("lock" in read[4] or "Unable" in read[4] for read in refused), refused


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_update_of_a_self_contained_merged_copy(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out.h5"
    write_images(images, {"a": 6}, size=(40, 32))
    options = dict(model="resnet18", weights="none", layers="avgpool", num_workers=0)
    for index in range(2):  # in this process: the shards and the merge are only the setting
        featdump.extract(images, output, shard=f"{index}/2", **options)
    merge(output, copy=False)
    with pytest.raises(UsageProblem, match="is a merged view over shards"):
        featdump.extract(images, output, update=True, **options)
    merge(output)  # small shards: the merge copies them (it replaces its own view without --overwrite)
    assert not merged_view(output)
    write_images(images, {"b": 3}, seed=5, size=(40, 32))
    updated = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "-j", "0", "--update", images,
                           output)
    assert updated.returncode == 0, updated.stderr
    assert f"Wrote 3 images (0 skipped) to {output}, 9 in all (0 skipped)," in updated.stderr
    assert len(rows_by_path(output)) == 9
    again = run_featdump("merge", output)  # the copy holds the update's rows now: not replaced by the shards'
    assert again.returncode != 0 and "--overwrite" in again.stderr, again.stderr
    assert len(rows_by_path(output)) == 9


HOLDER = """
import sys, time
import h5py
with h5py.File(sys.argv[1], "r") as held:  # a notebook or a dashboard keeps the file open
    print("open", flush=True)
    time.sleep(120)
"""


@pytest.mark.slow  # a reader process and a real run
def test_an_update_with_nothing_new_leaves_the_file_alone_while_a_reader_holds_it(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out.h5"
    write_images(images, {"a": 6}, size=(40, 32))
    args = ["extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "--update", images, output]
    assert run_featdump(*args).returncode == 0
    os.utime(output, ns=(1_000_000_000, 1_000_000_000))
    before = output.stat()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(output)], stdout=subprocess.PIPE, text=True,
                              env=featdump_env())
    try:
        assert holder.stdout.readline().strip() == "open"
        started = time.monotonic()
        again = run_featdump(*args, timeout=120)
        seconds = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert again.returncode == 0, again.stderr
    assert "Nothing new:" in again.stderr and seconds < 60, (seconds, again.stderr)
    after = output.stat()
    assert (after.st_mtime_ns, after.st_size, after.st_ino) == (before.st_mtime_ns, before.st_size, before.st_ino)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["images", "out.h5"]


def skipped_entries(path) -> list[tuple[str, str]]:
    with h5py.File(path, "r", locking=False) as h5file:
        count = int(h5file.attrs["committed"][2])
        return list(zip(h5file["skipped/paths"].asstr()[:count], h5file["skipped/reasons"].asstr()[:count]))


def skipped_stats(path) -> list[tuple[int, int]]:
    with h5py.File(path, "r", locking=False) as h5file:
        return [tuple(int(value) for value in stat) for stat in h5file["skipped/file_stats"][:]]


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_update_reads_again_a_skipped_image_whose_file_changed_and_retry_skipped_reads_them_all(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out.h5"
    written = write_images(images, {"a": 4}, size=(40, 32))
    broken, unchanged = images / "a" / "broken.jpg", images / "a" / "empty.png"
    broken.write_bytes(b"not a jpeg")
    unchanged.write_bytes(b"")
    args = ["extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "--update", images, output]
    assert run_featdump(*args).returncode == 0
    assert [path for path, _ in skipped_entries(output)] == ["a/broken.jpg", "a/empty.png"]
    with h5py.File(output, "r") as h5file:
        recorded = h5file["skipped/file_stats"][:]
    assert [tuple(stat) for stat in recorded] == [(10, broken.stat().st_mtime_ns), (0, unchanged.stat().st_mtime_ns)]
    before = rows_by_path(output)

    shutil.copyfile(images / written[0], broken)  # fixed: a good image under the broken name
    told = run_featdump("info", output)
    assert "1 skipped file(s) changed since (--update reads them again): a/broken.jpg" in told.stdout
    fixed = run_featdump(*args)
    assert fixed.returncode == 0, fixed.stderr
    assert "Reading again 1 skipped input(s) (changed since they were skipped): a/broken.jpg" in fixed.stderr
    after = rows_by_path(output)
    assert list(after) == [*before, "a/broken.jpg"]  # the 4 rows kept, the fixed one appended
    assert_rows_kept(before, after)
    np.testing.assert_array_equal(after["a/broken.jpg"][0]["avgpool"], before[written[0]][0]["avgpool"])  # its twin
    assert [path for path, _ in skipped_entries(output)] == ["a/empty.png"]
    with h5py.File(output, "r") as h5file:
        assert list(h5file.attrs["committed"]) == [5, 6, 1]  # images: 5 rows and the one skip, each once

    again = run_featdump(*args)
    assert again.returncode == 0 and "Nothing new:" in again.stderr  # an unchanged skip is not read again
    before_stats = skipped_stats(output)
    unchanged.write_bytes(b"x")  # changed, still bad: read again; an update that reads nothing records nothing
    for _ in range(2):  # and says so (exit 1) each time, as for new images that cannot be read
        rebad = run_featdump(*args)
        assert rebad.returncode == 1 and "Reading again 1 skipped input(s) (changed since" in rebad.stderr
        assert "No image could be read: 1 tried" in rebad.stderr
        assert skipped_stats(output) == before_stats
    unchanged.write_bytes(b"")
    os.utime(unchanged, ns=(before_stats[0][1], before_stats[0][1]))  # as it was when skipped
    retried = run_featdump(*args[:-2], "--retry-skipped", images, output)
    assert retried.returncode == 1  # it read nothing: said so, the output as it was, with the new reason
    assert "Reading again 1 skipped input(s) (--retry-skipped): a/empty.png" in retried.stderr
    assert "No image could be read: 1 tried" in retried.stderr
    assert [path for path, _ in skipped_entries(output)] == ["a/empty.png"]  # still bad: recorded once, anew
    with h5py.File(output, "r") as h5file:
        assert list(h5file.attrs["committed"]) == [5, 6, 1]
    assert json.loads(run_featdump("info", "--json", output).stdout)["skipped"] == 1
    unchanged.unlink()  # gone: its entry stays (nothing would replace it), and nothing is read
    gone = run_featdump(*args[:-2], "--retry-skipped", images, output)
    assert gone.returncode == 0 and "Nothing new:" in gone.stderr, gone.stderr
    assert [path for path, _ in skipped_entries(output)] == ["a/empty.png"]


def test_a_nothing_new_update_over_a_folder_stats_each_image_once(tmp_path, monkeypatch):
    """The folder's walk stats each file once, and the command's fingerprint and the update's staleness read those
    stats: no second stat a file (a million files on a cold disk cost minutes a stat)."""
    from .helpers import write_images

    write_images(tmp_path / "images", {"a": 6, "b": 6})
    small = ["extract", "-m", "featdump.testing.models:small", "--transform",
             "featdump.testing.models:small_transform", "-l", "1,4"]
    assert run_featdump(*small, tmp_path / "images", tmp_path / "out.h5").returncode == 0
    stated, real_stat = [], os.stat

    def counted(path, *args, **kwargs):
        name = os.fsdecode(path)
        if name.startswith(str(tmp_path / "images") + os.sep) and name.endswith((".jpg", ".png")):
            stated.append(name)  # an image's (the readers' looks at other names, state.json, are no image's)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counted)
    again = run_featdump(*small, "--update", tmp_path / "images", tmp_path / "out.h5")
    assert again.returncode == 0 and "nothing to add" in again.stderr, again.stderr
    import collections

    counts = collections.Counter(stated)
    assert sorted(counts) == sorted(str(path) for path in (tmp_path / "images").rglob("img_*"))
    first = str(tmp_path / "images" / "a" / "img_000.jpg")  # opened once more: the run's first image, its shape
    assert all(count == 1 for path, count in counts.items() if path != first) and counts[first] <= 2, counts
