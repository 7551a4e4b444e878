"""A reader and a model source from outside featdump, registered through its entry point groups
(`featdump.readers`, `featdump.sources`) as an installed package registers them, used with no featdump edit."""

from __future__ import annotations

import os
import sys

import pytest

import featdump

from .helpers import REPO, featdump_env, run_featdump

PLUGIN = '''
import hashlib
import io
import os

import numpy as np
from PIL import Image
from torch import nn

from featdump.inputs.imagelist import Encoded, ImageList, Storage, open_each
from featdump.inputs.readers import Reader
from featdump.sources.registry import Built, Source


class Swatches(Storage):
    """Each row a solid colour a line of the .colors file names (r,g,b); a row's version is its colour."""

    def __init__(self, colours):
        self.colours = colours

    def open(self, root, relative, position):
        buffer = io.BytesIO()
        Image.new("RGB", (64, 48), self.colours[position]).save(buffer, format="PNG")
        return Encoded(relative, self.stat(root, relative, position), data=buffer.getvalue())

    def open_as_ready(self, root, relatives, positions):
        return open_each(self, root, relatives, positions)

    def stat(self, root, relative, position):
        red, green, blue = self.colours[position]
        return 0, red << 16 | green << 8 | blue

    def select(self, positions):
        return Swatches([self.colours[position] for position in positions])

    def digest(self, root, paths, labels, sizes):
        return hashlib.sha256(repr((self.colours, list(paths))).encode()).hexdigest()

    def groups(self):
        return None

    def left_out(self):
        return {}


class ColourFile(Reader):
    priority = 15

    def claims(self, where, asked):
        return where.text.endswith(".colors")

    def read(self, where, asked):
        colours = parsed(where.path)
        names = tuple(f"{where.name}/{index}" for index in range(len(colours)))
        return ImageList(where.path.parent, names, (-1,) * len(colours), (), Swatches(colours))

    def read_back(self, root, relative):
        name, _, index = relative.rpartition("/")
        path = os.path.join(root, name)
        if not name.endswith(".colors") or not os.path.isfile(path):
            return None
        return Swatches(parsed(path)).open(root, relative, int(index)).data


def parsed(path):
    return [tuple(int(v) for v in line.split(",")) for line in open(path).read().split()]


class Flat(Source):
    name = prefix = "flat"

    def build(self, request):
        return Built(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), "none", {"source": "flat"})
'''
ENTRY_POINTS = """[featdump.readers]
colours = swatches:ColourFile

[featdump.sources]
flat = swatches:Flat
"""


@pytest.mark.slow  # a fresh interpreter over an installed plugin: 10 s of the quick suite on Zen 3 (CI runs it)
def test_a_reader_and_a_source_installed_from_outside_are_used_with_no_featdump_edit(tmp_path):
    site = tmp_path / "site"
    (site / "swatches-1.0.dist-info").mkdir(parents=True)  # as pip installs a package: its metadata on the path
    (site / "swatches-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: swatches\nVersion: 1.0\n")
    (site / "swatches-1.0.dist-info" / "entry_points.txt").write_text(ENTRY_POINTS)
    (site / "swatches.py").write_text(PLUGIN)
    (tmp_path / "set.colors").write_text("255,0,0\n0,255,0\n0,0,255\n")
    env = featdump_env(PYTHONPATH=f"{site}{os.pathsep}{REPO}")
    result = run_featdump("extract", "-m", "flat:pool", "-w", "none", "-l", "1", tmp_path / "set.colors",
                          tmp_path / "out.h5", env=env, process=True)
    assert result.returncode == 0, result.stderr
    rows = featdump.load(tmp_path / "out.h5", "1")
    assert rows.paths == ["set.colors/0", "set.colors/1", "set.colors/2"]
    assert rows.features.shape == (3, 3)
    assert [int(row.argmax()) for row in rows.features] == [0, 1, 2]  # red, green, blue after ImageNet's normalising


BROKEN_ENTRY_POINTS = """[featdump.readers]
lmdb = featdump_lmdb:LmdbReader

[featdump.sources]
lmdbnets = featdump_lmdb:LmdbSource
"""


@pytest.fixture
def broken_plugin(tmp_path, monkeypatch):
    """A package installed on the path whose reader and source need a dependency that is missing (`lmdb`)."""
    from featdump import plugins
    from featdump.inputs import readers
    from featdump.sources import registry

    site = tmp_path / "site"
    (site / "featdump_lmdb-0.1.dist-info").mkdir(parents=True)
    (site / "featdump_lmdb-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: featdump-lmdb\nVersion: 0.1\n")
    (site / "featdump_lmdb-0.1.dist-info" / "entry_points.txt").write_text(BROKEN_ENTRY_POINTS)
    (site / "featdump_lmdb.py").write_text("import lmdb_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(readers, "READERS", ())  # loaded again, with the broken plugin
    monkeypatch.setattr(registry, "_PLUGINS_LOADED", False)
    monkeypatch.setattr(plugins, "_BROKEN", {})
    yield tmp_path
    sys.modules.pop("featdump_lmdb", None)


def test_a_plugin_that_fails_to_load_is_left_out_with_one_warning_and_breaks_no_other_command(broken_plugin):
    from .helpers import write_images

    said = ("plugin 'lmdb' of package featdump-lmdb (ModuleNotFoundError: No module named "
            "'lmdb_that_is_not_installed') is left out")
    helped = run_featdump("extract", "--help")
    assert helped.returncode == 0 and "extract [OPTIONS] IMAGES OUTPUT" in helped.stdout, helped.stderr
    assert helped.stderr.count(said) == 1 and "Internal error" not in helped.stderr, helped.stderr
    assert "source plugin 'lmdbnets' of package featdump-lmdb" in helped.stderr, helped.stderr
    write_images(broken_plugin / "images", {"": 2}, size=(32, 24))
    ran = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", broken_plugin / "images",
                       broken_plugin / "out.h5")
    assert ran.returncode == 0 and featdump.load(broken_plugin / "out.h5", "avgpool").features.shape == (2, 512, 1, 1)
    (broken_plugin / "rows.lmdb").mkdir()  # the input the broken reader was for: nothing else reads it
    refused = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", broken_plugin / "rows.lmdb",
                           broken_plugin / "lmdb.h5")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "left out because it failed to load: 'lmdb' of package featdump-lmdb" in refused.stderr.splitlines()[-1]
    unknown = run_featdump("extract", "-m", "lmdbnets:tiny", "-l", "avgpool", broken_plugin / "images",
                           broken_plugin / "net.h5")
    assert unknown.returncode == 2 and "'lmdbnets' of package featdump-lmdb" in unknown.stderr.splitlines()[-1]


FAILING = '''
import hashlib
import io

from PIL import Image

from featdump.inputs.imagelist import Encoded, ImageList, Storage
from featdump.inputs.readers import Reader, ReaderOption


class Rows(Storage):
    """Plain images (red from the row, green and blue GREY); a row from FAILS_FROM on raises as a corrupt database
    does (not an OSError: not a row's skip)."""

    def __init__(self, fails_from, grey=90):
        self.fails_from, self.grey = fails_from, grey

    def open(self, root, relative, position):
        if position >= self.fails_from:
            raise RuntimeError("MDB_CORRUPTED: Located page was wrong type\\n(mdb_get)")
        buffer = io.BytesIO()
        Image.new("RGB", (32, 24), (position * 40, self.grey, self.grey)).save(buffer, format="PNG")
        return Encoded(relative, (len(buffer.getvalue()), 0), data=buffer.getvalue())

    def open_as_ready(self, root, relatives, positions):
        for index, (relative, position) in enumerate(zip(relatives, positions)):
            yield index, self.open(root, relative, position)

    def stat(self, root, relative, position):
        return 0, 0

    def select(self, positions):
        return self

    def digest(self, root, paths, labels, sizes):
        return hashlib.sha256(repr(list(paths)).encode()).hexdigest()


class RowsFile(Reader):
    priority = 15
    kind = "rows files (.rows)"
    options = (ReaderOption("grey", int, "the green and blue of every image, 0-255"),)

    def claims(self, where, asked):
        return where.text.endswith(".rows")

    def read(self, where, asked):
        count, fails_from = (int(value) for value in where.path.read_text().split())
        names = tuple(f"{where.name}/{index}" for index in range(count))
        return ImageList(where.path.parent, names, (-1,) * count, (), Rows(fails_from, asked.option(self, "grey", 90)))
'''


@pytest.fixture
def failing_reader(tmp_path, monkeypatch):
    """A package on the path whose reader reads `.rows` files and raises a RuntimeError from a row on."""
    from featdump import plugins
    from featdump.inputs import readers

    site = tmp_path / "site"
    (site / "rowsdb-0.1.dist-info").mkdir(parents=True)
    (site / "rowsdb-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: rowsdb\nVersion: 0.1\n")
    (site / "rowsdb-0.1.dist-info" / "entry_points.txt").write_text("[featdump.readers]\nrows = rowsdb:RowsFile\n")
    (site / "rowsdb.py").write_text(FAILING)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(readers, "READERS", ())
    monkeypatch.setattr(plugins, "_BROKEN", {})
    yield tmp_path
    sys.modules.pop("rowsdb", None)


@pytest.mark.parametrize("fails_from", [0, 4])
def test_a_reader_s_failure_in_a_loader_worker_is_one_line_and_leaves_no_empty_partial(failing_reader, fails_from):
    source, output = failing_reader / "set.rows", failing_reader / "out.h5"
    source.write_text(f"8 {fails_from}")
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "-b", "2", source, output)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert f"The reader of {failing_reader} (rowsdb.Rows) failed on 'set.rows/{fails_from}' (a batch of 2): " \
           "RuntimeError: MDB_CORRUPTED: Located page was wrong type (mdb_get)." in last, result.stderr
    partial = failing_reader / "out.h5.partial"
    assert not output.exists()
    if fails_from == 0:  # nothing read: nothing left behind
        assert not partial.exists()
    else:  # the batches before it are committed: a partial to resume, never an empty one
        assert read_committed(partial) == fails_from


def read_committed(path) -> int:
    from .helpers import committed_rows

    return committed_rows(path)


def test_an_installed_plugin_is_in_the_help_and_messages_but_not_in_featdump_s_docs(failing_reader):
    from featdump.faces import kinds
    from featdump.inputs.readers import input_kinds

    docs = (REPO / "docs" / "inputs.md").read_text()
    assert kinds.generated("inputs") in docs and "rows files" not in kinds.generated("inputs")
    assert "rows files (.rows)" in input_kinds()  # what the help of a process started now lists
    refused = run_featdump("extract", "-m", "resnet18", "-l", "avgpool", failing_reader / "none",
                           failing_reader / "o.h5")
    assert refused.returncode == 2 and "the readers: parquet, saved, rows, tar" in refused.stderr, refused.stderr


def test_reader_by_name_and_the_options_it_declares_reach_it_others_refused_in_one_line(failing_reader):
    from .helpers import write_images

    source = failing_reader / "set.rows"
    source.write_text("4 99")
    run = ["extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "--reader", "rows"]
    assert run_featdump(*run, source, failing_reader / "plain.h5").returncode == 0
    bright = run_featdump(*run, "--reader-option", "grey=250", source, failing_reader / "bright.h5")
    assert bright.returncode == 0, bright.stderr
    plain, lit = (featdump.load(failing_reader / name, "avgpool").features for name in ("plain.h5", "bright.h5"))
    assert plain.shape == lit.shape == (4, 512, 1, 1) and not (plain == lit).all()  # the option reached the reader
    write_images(failing_reader / "images", {"": 2}, size=(32, 24))
    refusals = {
        ("--reader-option", "grey=bright"): "--reader-option grey=bright: give a whole number (the green and blue "
                                            "of every image, 0-255).",
        ("--reader-option", "shade=3"): "--reader-option shade: the rows reader of IMAGES",
        ("--reader", "tiff"): "--reader tiff: no reader of that name; the readers: ",
    }
    for given, said in refusals.items():
        refused = run_featdump(*run[:-2], *given, source, failing_reader / "no.h5")
        assert refused.returncode == 2 and said in refused.stderr.splitlines()[-1], refused.stderr
    folder = run_featdump(*run[:-2], "--reader-option", "grey=3", failing_reader / "images", failing_reader / "no.h5")
    assert folder.returncode == 2 and "the folder reader of IMAGES" in folder.stderr and "(it takes none)" in \
        folder.stderr, folder.stderr
    wrong = run_featdump(*run[:-2], "--reader", "array", failing_reader / "images", failing_reader / "no.h5")
    assert wrong.returncode == 2 and "--reader array does not read IMAGES" in wrong.stderr, wrong.stderr
    assert not (failing_reader / "no.h5").exists() and not (failing_reader / "no.h5.partial").exists()
