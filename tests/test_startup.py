"""Commands that answer at once: the help of featdump and of each command, `info` of an output, and a usage error
(a missing IMAGES, an unknown option, an unknown torchvision name once torchvision's names are kept) run in a fresh
interpreter without importing torch, torchvision, pyarrow, fsspec or a model source's library. Their times are
`python -m benchmarks.startup`'s, not a test's."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import featdump_env, run_featdump, write_output

HEAVY = ("torch", "torchvision", "pyarrow", "fsspec", "timm", "transformers", "open_clip", "ray", "av")

# featdump ARGS in a fresh interpreter, as the `featdump` script runs it; then the heavy modules it imported and the
# exit code, as one JSON line on stderr (after whatever the command printed).
RUN = """
import atexit, json, sys
heavy = {heavy!r}
def imported():
    print("\\n" + json.dumps(sorted(name for name in heavy if name in sys.modules)), file=sys.stderr)
atexit.register(imported)
sys.argv = ["featdump", *sys.argv[1:]]
from featdump.faces.cli import console
console()
"""


def run_fresh(*args, env=None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """featdump ARGS in a new interpreter: the finished process and the heavy modules it imported."""
    done = subprocess.run([sys.executable, "-c", RUN.format(heavy=HEAVY), *map(str, args)], capture_output=True,
                          text=True, env=env or featdump_env(), timeout=120)
    return done, json.loads(done.stderr.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def finished_output(tmp_path_factory):
    output = tmp_path_factory.mktemp("startup") / "feats.h5"
    write_output(output, {"layer1": np.ones((6, 4, 2, 2), np.float32), "avgpool": np.ones((6, 4), np.float32)})
    return output


COMMANDS = ("list-layers", "extract", "merge", "info", "show", "rdm", "cka", "probe", "encode", "doctor", "top",
            "atlas")


@pytest.mark.parametrize("args", [("--help",), *((command, "--help") for command in COMMANDS)],
                         ids=lambda args: " ".join(args))
def test_help_imports_no_heavy_library(args):
    done, imported = run_fresh(*args)
    assert done.returncode == 0, done.stderr
    assert "Usage: featdump" in done.stdout
    assert imported == []


def test_extract_help_lists_every_source_and_reader_without_them(tmp_path):
    done, imported = run_fresh("extract", "--help")
    text = " ".join(done.stdout.split())
    assert "timm:NAME" in text and "hf:ORG/NAME" in text and "torchvision model name" in text  # the sources' kinds
    assert ".zip of images" in text and "Parquet tables" in text  # the readers' kinds, the zip plugin's too
    assert imported == []


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_info_imports_no_heavy_library(finished_output, as_json):
    done, imported = run_fresh("info", *(["--json"] if as_json else []), finished_output)
    assert done.returncode == 0, done.stderr
    if as_json:
        assert json.loads(done.stdout)["rows"] == 6
    else:
        assert "rows:       6" in done.stdout.splitlines() and "  avgpool: (4,) float32" in done.stdout.splitlines()
    assert imported == []


def test_usage_errors_answer_before_torch_is_imported(tmp_path):
    missing, imported = run_fresh("extract", "-m", "resnet18", "-l", "avgpool", tmp_path / "nonexist", "o.h5")
    assert missing.returncode == 2 and "IMAGES" in missing.stderr and "does not exist" in missing.stderr
    assert imported == []
    unknown, imported = run_fresh("extract", "--nosuch", tmp_path, "o.h5")
    assert unknown.returncode == 2 and "No such option '--nosuch'" in unknown.stderr
    assert imported == []
    assert not (tmp_path / "o.h5").exists() and not (tmp_path / "o.h5.partial").exists()


def test_an_unknown_torchvision_name_answers_at_once_once_the_names_are_kept(tmp_path):
    """The first check of a name lists torchvision's names and keeps them (here in this process, where torchvision
    is imported already); the next, in a fresh interpreter, answers from them with the same line, importing
    neither torch nor torchvision."""
    from featdump.sources.torchvision_names import names_by_task

    (tmp_path / "images").mkdir()
    env = featdump_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    args = ("extract", "-m", "resnet5O", "-l", "avgpool", tmp_path / "images", tmp_path / "o.h5")
    names_by_task.cache_clear()  # (an earlier test's names in this process: listed again, into this cache)
    first = run_featdump(*args, env=env)
    names_by_task.cache_clear()
    assert first.returncode == 2 and "Unknown model 'resnet5O'. Did you mean: resnet50" in first.stderr
    kept = list((tmp_path / "cache" / "featdump").glob("torchvision-*-models.json"))
    assert len(kept) == 1 and "resnet50" in json.loads(kept[0].read_text())["classification"]
    again, imported = run_fresh(*args, env=env)
    assert again.returncode == 2 and again.stderr.splitlines()[0] == first.stderr.splitlines()[0]
    assert imported == []


def test_kept_names_that_cannot_be_read_are_listed_again(tmp_path, monkeypatch):
    """A half-written or foreign file where the names are kept is not trusted: torchvision lists them again."""
    from importlib import metadata

    from featdump.sources.torchvision_names import names_by_task

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    kept = tmp_path / "cache" / "featdump" / f"torchvision-{metadata.version('torchvision')}-models.json"
    kept.parent.mkdir(parents=True)
    for written in ('{"classification": ["resnet5O"', '["resnet5O"]', '{"classification": [5]}'):
        kept.write_text(written)  # cut short, another shape, not names
        names_by_task.cache_clear()
        listed = names_by_task()
        names_by_task.cache_clear()
        assert "resnet50" in listed["classification"] and "resnet5O" not in listed["classification"]
        assert json.loads(kept.read_text()) == listed  # written anew, whole
