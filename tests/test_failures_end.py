"""A job that hits an error ends: within seconds, with one line, a non-zero exit, no process left behind and
nothing that blocks the next run; with the default loader workers, as users run it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from featdump.faces.cli import main

from .helpers import featdump_env

TRANSFORMS = '''
from torchvision import transforms

def resize_only():
    return transforms.Compose([transforms.Resize(32), transforms.ToTensor()])

def resize_and_crop():
    return transforms.Compose([transforms.Resize(32), transforms.CenterCrop(32), transforms.ToTensor()])
'''


def write_aspect_ratios(folder, count=12):
    """Landscape, portrait and square images: a resize without a crop makes three sizes of them."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for index in range(count):
        width, height = [(64, 48), (48, 64), (50, 50)][index % 3]
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(folder / f"{index:02d}.jpg")
    return folder


def run_in_own_session(args, cwd, timeout=90):
    """featdump as a real process in a process group of its own; (result, seconds, processes of the group left)."""
    env = featdump_env(PYTHONPATH=f"{cwd}{os.pathsep}{featdump_env()['PYTHONPATH']}")
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "featdump", *map(str, args)], cwd=cwd, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise AssertionError(f"featdump {' '.join(map(str, args))} did not end within {timeout} s") from None
    seconds = time.monotonic() - started
    time.sleep(0.5)
    try:
        os.killpg(process.pid, 0)
        left = True
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        left = False
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr), seconds, left


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line[:4].isdigit()]  # log lines start with a date


@pytest.mark.slow  # two real runs
def test_a_transform_without_a_crop_ends_the_job_with_one_line_and_the_corrected_command_runs(tmp_path):
    (tmp_path / "shapes.py").write_text(TRANSFORMS)
    images = write_aspect_ratios(tmp_path / "images")
    command = ["extract", "-m", "resnet18", "--weights", "none", "-l", "layer1", "images", "out.h5"]
    result, seconds, left = run_in_own_session([*command, "--transform", "shapes:resize_only"], tmp_path)
    assert result.returncode == 2, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("Error: --transform shapes:resize_only makes images of different "
                                                   "sizes"), result.stderr
    assert "crop" in lines[0] and "Traceback" not in result.stderr
    assert seconds < 60 and not left  # no worker outlived it
    assert not (tmp_path / "out.h5.lock").exists() and not (tmp_path / "out.h5").exists()

    fixed, _, left = run_in_own_session([*command, "--transform", "shapes:resize_and_crop"], tmp_path)
    assert fixed.returncode == 0, fixed.stderr  # the failed run's empty partial does not block it
    assert not left and (tmp_path / "out.h5").exists()
    assert images.exists()


def test_under_j0_the_same_message(tmp_path, monkeypatch):
    (tmp_path / "shapes.py").write_text(TRANSFORMS)
    write_aspect_ratios(tmp_path / "images")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(main, ["extract", "-m", "resnet18", "--weights", "none", "-l", "layer1", "-j", "0",
                                       "--transform", "shapes:resize_only", str(tmp_path / "images"),
                                       str(tmp_path / "out.h5")])
    assert result.exit_code == 2
    assert error_lines(result.output)[0].startswith("Error: --transform shapes:resize_only makes images of "
                                                    "different sizes ("), result.output
    assert "all input arrays" not in result.output


@pytest.mark.slow  # a real process and its workers
def test_a_bad_image_under_on_error_fail_ends_the_job_and_leaves_no_worker(tmp_path):
    images = write_aspect_ratios(tmp_path / "images", count=9)
    for path in images.iterdir():  # all one size: only the broken file fails
        Image.new("RGB", (48, 48), "gray").save(path)
    (images / "07.jpg").write_bytes(b"not a jpeg")
    result, seconds, left = run_in_own_session(
        ["extract", "-m", "resnet18", "--weights", "none", "-l", "layer1", "-b", "4", "--on-error", "fail",
         "images", "out.h5"], tmp_path)
    assert result.returncode == 1, result.stderr
    assert error_lines(result.stderr) == [error_lines(result.stderr)[0]]
    assert "Cannot use image '07.jpg'" in result.stderr
    assert seconds < 60 and not left


def test_an_hf_processor_without_a_center_crop_is_named_with_what_to_change(tmp_path):
    transformers = __import__("pytest").importorskip("transformers")
    import torch

    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                    image_size=32, patch_size=8)
    transformers.ViTModel(config).save_pretrained(tmp_path / "vit")
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, do_center_crop=False).save_pretrained(tmp_path / "vit")
    write_aspect_ratios(tmp_path / "images", count=6)
    result = CliRunner().invoke(main, ["extract", "-m", f"hf:{tmp_path / 'vit'}", "-l", "embeddings", "-j", "0",
                                       str(tmp_path / "images"), str(tmp_path / "out.h5")])
    assert result.exit_code == 2
    line = error_lines(result.output)[0]
    assert line.startswith(f"Error: the preprocessing of hf:{tmp_path / 'vit'} makes images of different sizes"), line
    assert "set do_center_crop to true" in line
