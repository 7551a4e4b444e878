"""The conformance kit of a reader: the checks every reader of featdump passes, for a plugin's author to run over
theirs. Subclass `ReaderConformance` in a test module, say how to make a sample input (and, where the kind allows,
how to grow it, one with a corrupt row, a junk one), and pytest runs each check:

    from featdump.testing.readers import ReaderConformance, Sample

    class TestLmdbReader(ReaderConformance):
        reader = "lmdb"                               # its --reader name

        def make_input(self, folder):                 # at least 8 rows
            return Sample(write_lmdb(folder / "set.lmdb", 8), rows=8)

        def append_rows(self, sample):                # the input saved again with rows appended; their count
            return append_to_lmdb(sample.images, 3)

        def make_input_with_a_corrupt_row(self, folder):  # (sample, the name of the row that cannot be decoded)
            ...

        def make_bad_input(self, folder):             # an input of its kind that cannot be read at all
            (folder / "junk.lmdb").write_bytes(b"junk")
            return str(folder / "junk.lmdb")

A hook left as it is (raising NotImplementedError) skips its checks, saying so. The checks: the listing (every
row, names unique and stable, the same digest twice), extraction (every row read, the same features twice),
resume after a SIGKILL (equal to a run never killed), `--update` after rows are appended (the new rows added, none
of the old marked stale), two shards merged (equal to one run), the rows read back (for `show` and the atlas), a
corrupt row recorded as a skip, and a junk input refused in one line (exit 1 or 2), nothing left behind.
They extract with `featdump.testing.models:small` (32 x 32 images, weights seeded): nothing is downloaded."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

MODEL = ["-m", "featdump.testing.models:small", "--transform", "featdump.testing.models:small_transform",
         "-l", "1,4"]
KILL_PATIENCE = 120  # seconds a killed run may take to commit its first batch


@dataclass(frozen=True)
class Sample:
    """An input the reader reads: IMAGES as the user names it, the ROWS it holds, and any options its reader needs
    (`--reader-option`, `--array`: as on the command line)."""

    images: str
    rows: int
    options: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Ran:
    """What a command said: its exit code and what it wrote (stdout and stderr)."""

    exit_code: int
    said: str


class ReaderConformance:
    """The checks of a reader (see the module's docstring); `reader` is its --reader name."""

    reader = ""

    def make_input(self, folder: Path) -> Sample:
        raise NotImplementedError

    def append_rows(self, sample: Sample) -> int:
        raise NotImplementedError

    def make_input_with_a_corrupt_row(self, folder: Path) -> tuple[Sample, str]:
        raise NotImplementedError

    def make_bad_input(self, folder: Path) -> str:
        raise NotImplementedError

    @pytest.fixture
    def sample(self, tmp_path) -> Sample:
        made = self.make_input(tmp_path / "input")
        assert made.rows >= 8, "the kit's sample holds at least 8 rows (shards, a resume after a batch)"
        return made

    def extract(self, sample: Sample, output: Path, *more: str) -> Ran:
        return run_cli(["extract", *MODEL, "--reader", self.reader, *sample.options, *more, sample.images,
                        str(output)])

    def test_the_listing_names_every_row_once_and_the_same_each_time(self, sample):
        from featdump.inputs import find_images

        first, second = (find_images(sample.images, reader=self.reader, **_options(sample)) for _ in range(2))
        assert len(first) == sample.rows, f"{len(first)} rows listed, the sample holds {sample.rows}"
        assert len(set(first.paths)) == len(first.paths), "two rows share a name"
        assert first.paths == second.paths and first.labels == second.labels
        assert first.digest() == second.digest(), "the listing's digest differs between two listings"

    def test_every_row_is_read_and_the_same_twice(self, sample, tmp_path):
        for name in ("one.h5", "two.h5"):
            ran = self.extract(sample, tmp_path / name)
            assert ran.exit_code == 0, ran.said
        one, two = _read(tmp_path / "one.h5"), _read(tmp_path / "two.h5")
        assert len(one.paths) == sample.rows and not one.skipped, (one.skipped, ran.said)
        assert one.paths == two.paths
        np.testing.assert_array_equal(one.features, two.features)
        assert np.isfinite(one.features).all()

    def test_a_killed_run_resumes_to_the_rows_of_one_never_killed(self, sample, tmp_path):
        output = tmp_path / "killed.h5"
        arguments = ["extract", *MODEL, "--reader", self.reader, *sample.options, "-b", "2", sample.images,
                     str(output)]
        process = subprocess.Popen([sys.executable, "-m", "featdump", *arguments], env=_this_path(),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + KILL_PATIENCE
        while _committed(output) < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        _, said = process.communicate()
        if process.returncode == 0:
            pytest.skip("the run finished before it could be killed (too few rows for this machine)")
        assert process.returncode == -signal.SIGKILL, said
        resumed = run_cli(arguments)
        assert resumed.exit_code == 0, resumed.said
        assert self.extract(sample, tmp_path / "straight.h5", "-b", "2").exit_code == 0
        _assert_same_rows(_read(output), _read(tmp_path / "straight.h5"))

    def test_an_update_after_rows_are_appended_adds_them_and_marks_none_stale(self, sample, tmp_path):
        output = tmp_path / "grown.h5"
        assert self.extract(sample, output).exit_code == 0
        before = _read(output)
        try:
            added = self.append_rows(sample)
        except NotImplementedError:
            pytest.skip(f"{type(self).__name__}.append_rows is not given: this kind of input does not grow")
        grown = self.extract(sample, output, "--update")
        assert grown.exit_code == 0, grown.said
        after = _read(output)
        assert len(after.paths) == sample.rows + added and after.paths[:sample.rows] == before.paths
        np.testing.assert_array_equal(after.features[:sample.rows], before.features)
        assert after.stale == 0, f"{after.stale} old rows marked stale by rows appended"

    def test_two_shards_merge_into_the_rows_of_one_run(self, sample, tmp_path):
        for index in range(2):
            ran = self.extract(sample, tmp_path / "sharded.h5", "--shard", f"{index}/2")
            assert ran.exit_code == 0, ran.said
        merged = run_cli(["merge", str(tmp_path / "sharded.h5")])
        assert merged.exit_code == 0, merged.said
        assert self.extract(sample, tmp_path / "single.h5").exit_code == 0
        _assert_same_rows(_read(tmp_path / "sharded.h5"), _read(tmp_path / "single.h5"))

    def test_every_row_is_read_back_for_show_and_the_atlas(self, sample, tmp_path):
        from featdump.faces.show import image_as_seen

        output = tmp_path / "out.h5"
        assert self.extract(sample, output).exit_code == 0
        stored = _read(output)
        missing = [path for path in stored.paths if image_as_seen(stored.root, path, {}) is None]
        assert not missing, f"rows not read back: {missing[:3]}"
        drawn = run_cli(["show", str(output), "--layer", "1", "--index", "0", "-o", str(tmp_path / "row.png")])
        assert drawn.exit_code == 0 and (tmp_path / "row.png").exists(), drawn.said

    def test_a_corrupt_row_is_recorded_as_a_skip_and_the_others_read(self, tmp_path):
        try:
            sample, corrupt = self.make_input_with_a_corrupt_row(tmp_path / "corrupt")
        except NotImplementedError:
            pytest.skip(f"{type(self).__name__}.make_input_with_a_corrupt_row is not given: no row of this kind "
                        "can be corrupt")
        ran = self.extract(sample, tmp_path / "out.h5")
        assert ran.exit_code == 0, ran.said
        stored = _read(tmp_path / "out.h5")
        assert stored.skipped == [corrupt] and len(stored.paths) == sample.rows - 1, (stored.skipped, ran.said)

    def test_a_junk_input_is_refused_in_one_line(self, tmp_path):
        try:
            junk = self.make_bad_input(tmp_path / "junk")
        except NotImplementedError:
            pytest.skip(f"{type(self).__name__}.make_bad_input is not given")
        ran = run_cli(["extract", *MODEL, "--reader", self.reader, junk, str(tmp_path / "out.h5")])
        errors = [line for line in ran.said.splitlines() if line.startswith("Error")]
        assert ran.exit_code in (1, 2) and len(errors) == 1, ran.said
        assert "Traceback" not in ran.said and "Internal error" not in ran.said, ran.said
        assert not (tmp_path / "out.h5").exists() and not (tmp_path / "out.h5.partial").exists()


@dataclass(frozen=True)
class _Stored:
    paths: list[str]
    features: np.ndarray
    skipped: list[str]
    stale: int
    root: str


def _read(output: Path) -> _Stored:
    from featdump.output.layout import Output, text_of

    with Output.open(output) as held:
        rows = held.committed.rows
        return _Stored(held.paths(), held.features("4")[:rows], held.paths("skipped/"), held.stale_count(),
                       text_of(held.attrs.get("image_root")) or "")


def _assert_same_rows(one: _Stored, other: _Stored) -> None:
    assert one.paths == other.paths
    np.testing.assert_array_equal(one.features, other.features)


def _committed(partial_of: Path) -> int:
    from featdump.output.layout import Output

    partial = partial_of.with_name(partial_of.name + ".partial")
    try:
        with Output.open(partial, locking=False) as held:
            return held.committed.rows
    except Exception:  # not there yet, or being made
        return 0


def _options(sample: Sample) -> dict:
    """SAMPLE's --array and --reader-option as find_images takes them."""
    options, given = {}, list(sample.options)
    while given:
        flag, value = given.pop(0), given.pop(0)
        if flag == "--array":
            options["array"] = value
        elif flag == "--reader-option":
            options["reader_options"] = (*options.get("reader_options", ()), value)
    return options


def _this_path() -> dict:
    """This process's environment, its import path handed on: a process started from a test imports what it does
    (the plugin, featdump)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(entry for entry in sys.path if entry)}


def run_cli(arguments: list[str]) -> Ran:
    """ARGUMENTS through featdump's command line in this process, its logging put back after it."""
    from click.testing import CliRunner

    from featdump.faces.cli import main

    logger = logging.getLogger("featdump")
    before = (list(logger.handlers), logger.level, logger.propagate)
    try:
        result = CliRunner().invoke(main, [str(argument) for argument in arguments])
    finally:
        logger.handlers[:], logger.level, logger.propagate = before
    return Ran(result.exit_code, result.output)
