"""The suite's fixtures and set-up (the functions the tests share are in `helpers`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.makers.seaweed import SeaweedFS, SeaweedUnavailable

from .helpers import write_images


def pytest_configure(config):
    """The suite's expectations are the CPU's (fp32, exact against recomputations on the CPU): it sees no GPU, also
    on a GPU node, where `auto` would otherwise send about 100 CLI calls to CUDA. `pytest -m cuda` runs the tests
    marked cuda there, with the GPU."""
    selection = config.option.markexpr or ""
    if "cuda" not in selection or "not cuda" in selection:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything asks torch for a device; subprocesses inherit it


def pytest_terminal_summary(terminalreporter):
    """The machine the durations above were measured on (a CPU without native bf16 runs its tests 4-12x slower)."""
    from featdump.forward.hardware import cpu

    here = cpu()
    terminalreporter.write_line(f"Machine: {here.name} ({here.instruction_set}), {os.cpu_count()} cores")


@pytest.fixture
def image_folder(tmp_path) -> Path:
    """Two class folders, 7 images in all."""
    root = tmp_path / "images"
    write_images(root, {"cats": 4, "dogs": 3})
    return root


@pytest.fixture
def small_filesystem(tmp_path):
    """A 40 MB tmpfs (root only): a disk that fills up; `mount -o remount,size=...` grows it."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here ({made.stderr.strip() or 'not permitted'})")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture(scope="session")
def seaweed_server(tmp_path_factory):
    """A SeaweedFS server for the whole run (or each pytest worker's part of it): started once, 0.6-1.6 s here
    (skipped, with the reason, where it cannot start)."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweed"))
    try:
        server.start()
    except SeaweedUnavailable as why:
        pytest.skip(str(why))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def seaweed(seaweed_server):
    """The SeaweedFS server as new for this test module: every bucket an earlier module made is gone."""
    seaweed_server.empty()
    return seaweed_server


@pytest.fixture
def store_env(seaweed, monkeypatch, tmp_path):
    """This process's environment pointed at the SeaweedFS server, as a user's shell would be (its cache in
    TMP_PATH/cache)."""
    for key, value in seaweed.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return seaweed
