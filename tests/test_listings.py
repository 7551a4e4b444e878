"""Folder listings kept between commands (`featdump.inputs.listings`): a resume and a rerun over a folder none of
whose folders changed take the listing an earlier command kept, stat'ing no image; a file added is seen at once;
a file rewritten in place is found by --update, which always walks; a folder changed just before the walk is not
trusted."""

from __future__ import annotations

import collections
import os
import time

import numpy as np

from featdump.inputs import listings
from featdump.inputs.folder import read_folder

from .helpers import read_output, run_featdump, write_images

# batches of 4: a bad image in the second stops the run with a partial
SMALL = ["-v", "extract", "-m", "featdump.testing.models:small", "--transform",
         "featdump.testing.models:small_transform", "-l", "1,4", "-b", "4"]
KEPT = "kept from an earlier command"  # said at -v (a debug line)


def aged(root, seconds: float = 3600.0) -> None:
    """ROOT's folders as a collection's are: last changed long before the command."""
    then = time.time() - seconds
    for folder in [root, *(path for path in root.rglob("*") if path.is_dir())]:
        os.utime(folder, (then, then))


def counting_image_stats(monkeypatch, root) -> collections.Counter:
    """os.stat as it is, each of its calls on an image under ROOT counted."""
    counts, real_stat = collections.Counter(), os.stat

    def counted(path, *args, **kwargs):
        name = os.fsdecode(path)
        if name.startswith(str(root) + os.sep) and name.endswith((".jpg", ".png")):
            counts[name] += 1
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counted)
    return counts


def test_a_resume_and_a_rerun_take_the_kept_listing_and_a_file_added_or_rewritten_is_seen(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(listings, "RACY_SECONDS", 600.0)  # "just before the walk", whatever this machine's speed
    images, output = tmp_path / "images", tmp_path / "out.h5"
    written = write_images(images, {"a": 5, "b": 5}, size=(32, 32))
    (images / "a" / "img_009.jpg").write_bytes(b"not a jpeg")  # stops the first run: a partial to resume
    aged(images)
    stopped = run_featdump(*SMALL, "--on-error", "fail", images, output)
    assert stopped.returncode != 0 and KEPT not in stopped.stderr, stopped.stderr
    assert list((tmp_path / "cache" / "featdump" / "listings").glob("*.npz"))  # the walk kept

    counts = counting_image_stats(monkeypatch, images)
    resumed = run_featdump(*SMALL, images, output)
    assert resumed.returncode == 0 and KEPT in resumed.stderr and "Resuming at image" in resumed.stderr, \
        resumed.stderr
    rows = read_output(output)
    assert sorted(rows["paths"]) == written and "a/img_009.jpg" in read_output_skips(output)
    first = str(images / "a" / "img_000.jpg")  # opened once to learn the input's shape; no other image stat'ed
    assert set(counts) == {first} and counts[first] == 1, counts
    counts.clear()
    again = run_featdump(*SMALL, images, output)  # a rerun of the finished command
    assert again.returncode == 0 and KEPT in again.stderr, again.stderr
    assert set(counts) <= {first} and counts[first] <= 1, counts

    write_images(tmp_path / "more", {"": 1}, seed=5, size=(32, 32))
    (tmp_path / "more" / "img_000.jpg").rename(images / "b" / "new.jpg")  # b's time changes: walked anew
    grown = run_featdump(*SMALL, "--update", images, output)
    assert grown.returncode == 0 and KEPT not in grown.stderr and "b/new.jpg" in read_output(output)["paths"], \
        grown.stderr
    racy = run_featdump(*SMALL, images, output)  # b changed just before that walk: not trusted, not kept
    assert racy.returncode == 0 and KEPT not in racy.stderr, racy.stderr

    aged(images)
    assert run_featdump(*SMALL, images, output).returncode == 0  # walked and kept again
    rewritten = images / "a" / "img_000.jpg"
    rewritten.write_bytes(rewritten.read_bytes() + b"\0")  # in place: no folder's time changes
    assert KEPT in run_featdump(*SMALL, images, output).stderr
    update = run_featdump(*SMALL, "--update", images, output)
    assert update.returncode == 0 and KEPT not in update.stderr and "1 rows are stale" in update.stderr, \
        update.stderr


def read_output_skips(output) -> list[str]:
    import h5py

    with h5py.File(output, "r") as h5file:
        return [name.decode() for name in h5file["skipped/paths"][:]]


def test_a_kept_listing_equals_a_walk_and_is_dropped_when_any_folder_changes(tmp_path, monkeypatch):
    """Names not in UTF-8, videos beside images, nested folders: the kept listing is the walk's, exactly; a folder
    deep down that gains a file, or one removed, makes the next listing a walk."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "set"
    write_images(root, {"cats/deep": 3, "dogs": 2}, size=(16, 16))
    odd = os.fsencode(str(root / "dogs")) + b"/caf\xe9.jpg"  # a Latin-1 name, as old archives hold
    with open(odd, "wb") as handle:
        handle.write((root / "dogs" / "img_000.jpg").read_bytes())
    (root / "clip.mp4").write_bytes(b"\0" * 10)
    aged(root)
    walked = read_folder(root)
    kept = listings.kept_walk(root)
    assert kept is not None and kept.images == {path: tuple(stat) for path, stat in zip(
        walked.paths, walked.storage.listed.tolist())} and list(kept.videos) == ["clip.mp4"]
    assert read_folder(root).paths == walked.paths
    assert read_folder(root, fresh=True).paths == walked.paths  # (--update's walk, the same rows)

    (root / "cats" / "deep" / "img_000.jpg").rename(root / "cats" / "deep" / "moved.jpg")
    assert listings.kept_walk(root) is None  # deep down, a rename
    aged(root)
    read_folder(root)
    (root / "dogs" / "img_001.jpg").unlink()
    assert listings.kept_walk(root) is None  # a file removed
    later = read_folder(root)
    assert "dogs/img_001.jpg" not in later.paths and "cats/deep/moved.jpg" in later.paths
    assert np.all(later.storage.listed[:, 0] > 0)


def test_a_folder_that_could_not_be_read_keeps_no_listing_from_serving(tmp_path, monkeypatch):
    """A folder left out of a walk (no permission: faked, the suite runs as root, who reads any) may be readable
    next time: the walk is done again, never a listing that lacks its images taken."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "set"
    write_images(root, {"open": 2, "shut": 2}, size=(16, 16))
    aged(root)
    real_scandir = os.scandir

    def refusing(path="."):
        if os.fspath(path) == str(root / "shut"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    assert len(read_folder(root).paths) == 2
    monkeypatch.setattr(os, "scandir", real_scandir)
    assert listings.kept_walk(root) is None and len(read_folder(root).paths) == 4


def test_only_the_last_listings_written_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(listings, "KEEP_AT_MOST", 2)
    roots = [tmp_path / f"set{index}" for index in range(3)]
    for root in roots:
        write_images(root, {"a": 1}, size=(16, 16))
        aged(root)
        read_folder(root)
        time.sleep(0.01)  # (each listing's own modification time)
    assert len(list((tmp_path / "cache" / "featdump" / "listings").glob("*.npz"))) == 2
    assert listings.kept_walk(roots[0]) is None and listings.kept_walk(roots[2]) is not None
