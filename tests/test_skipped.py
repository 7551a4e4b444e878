"""The skipped list: entries with their file's stat and a clip's onset, and its rebuild by an update, safe at any
kill (real HDF5 files)."""

from __future__ import annotations

import h5py

from featdump.output import skipped as skips
from featdump.output.layout import Committed, create_layout

OLD = [skips.Skip("a.jpg", "truncated", (10, 111)), skips.Skip("film.mkv", "cannot be decoded", (99, 222), 1.5)]
NEW = [skips.Skip("film.mkv", "cannot be decoded", (99, 222), 1.5)]
AFTER = Committed(7, 8, 1)


def layout(path) -> h5py.File:
    h5file = h5py.File(path, "w")
    create_layout(h5file, {}, [])
    skips.write(h5file, 0, OLD)
    return h5file


def test_entries_keep_their_stat_and_onset_and_a_whole_input_has_none(tmp_path):
    with layout(tmp_path / "out.h5") as h5file:
        assert skips.read(h5file) == OLD
        assert h5file["skipped/clip_start"].attrs["units"] == "s"
        assert [skip.key for skip in skips.read(h5file)] == ["a.jpg", "film.mkv @ 1.5 s"]


def test_a_changed_file_is_retried_an_unknown_or_gone_one_is_not():
    entries = [*OLD, skips.Skip("old.jpg", "truncated")]  # written before stats were recorded
    now = {"a.jpg": (10, 111), "film.mkv": (99, 333), "old.jpg": (1, 1)}
    assert skips.to_retry(entries, now.get, every=False) == [1]
    assert skips.to_retry(entries, {}.get, every=False) == []
    assert skips.to_retry(entries, {}.get, every=True) == [0, 1, 2]


def test_a_rebuild_killed_before_its_swap_keeps_the_old_list(tmp_path):
    with layout(tmp_path / "out.h5") as h5file:
        h5file.create_group("skipped_next")  # a kill while the new list was being written
        skips.finish_swap(h5file)
        assert "skipped_next" not in h5file and skips.read(h5file) == OLD
        assert not skips.swapped_for(h5file, AFTER, "update-1")


def test_a_rebuild_killed_inside_its_swap_is_finished_and_known(tmp_path):
    with layout(tmp_path / "out.h5") as h5file:
        skips.replace(h5file, NEW, AFTER, "update-1")
        h5file.move("skipped", "skipped_next")  # as if killed after the old list's removal, before the move
        skips.finish_swap(h5file)
        assert skips.read(h5file) == NEW and skips.swapped_for(h5file, AFTER, "update-1")
        assert not skips.swapped_for(h5file, Committed(7, 8, 2), "update-1")
        assert not skips.swapped_for(h5file, AFTER, "update-2")  # a later update with the same counters
