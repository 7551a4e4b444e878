"""Never lose work: SIGKILL at random moments, SIGTERM/SIGINT, resume, refused resumes, locks, disk full."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import numpy as np
import pytest

from featdump.errors import ResumeMismatch
from featdump.job.runner import extract

from .helpers import (
    CrashAfterFirstBatch,
    assert_same_rows,
    committed_rows,
    images_fixture,
    read_output,
    run_featdump,
    settings_for,
    start_featdump,
    write_images,
)

TRIALS = int(os.environ.get("FEATDUMP_FAULT_TRIALS", "6"))  # a soak: FEATDUMP_FAULT_TRIALS=200
LAYERS = "conv1,layer1.0.relu:2"


def extract_args(images, output, *extra):
    """Small batches (many commits to kill between); loader workers as users run them (the default)."""
    return ["extract", "-m", "resnet18", "-w", "none", "-l", LAYERS, "-b", "4", *extra, images, output]


folder = images_fixture({"a": 20, "b": 19}, size=(48, 40), broken={"a/broken.jpg": b"not a jpeg"})


def wait_for_line(process: subprocess.Popen, text: str) -> bool:
    """Read stderr until a line containing TEXT (True) or its end (False)."""
    return any(text in line for line in process.stderr)


@pytest.fixture(scope="module")
def clean(folder, tmp_path_factory):
    """The uninterrupted run's content, and how long it ran after its first progress line."""
    output = tmp_path_factory.mktemp("clean") / "clean.h5"
    process = start_featdump(*extract_args(folder, output))
    assert wait_for_line(process, "img/s")  # the first progress line: the first batch is written
    loop_started = time.monotonic()
    process.stderr.read()
    assert process.wait() == 0
    return read_output(output), time.monotonic() - loop_started


@pytest.mark.slow  # 6 random SIGKILLs (FEATDUMP_FAULT_TRIALS); restarts after a kill stay in the quick suite
def test_sigkill_at_random_moments_then_resume_equals_a_clean_run(folder, clean, tmp_path):
    expected, loop_seconds = clean
    output, partial = tmp_path / "out.h5", tmp_path / "out.h5.partial"
    rng = random.Random(1234)
    kills = kills_with_rows = 0
    while kills < TRIALS:
        process = start_featdump(*extract_args(folder, output))
        if rng.random() < 0.2:
            delay = rng.uniform(0.0, 4.0)  # during start-up, file creation or reopening
        else:
            wait_for_line(process, "img/s")  # the batch loop is running (or there was nothing left to do)
            delay = rng.uniform(0.0, 1.1 * loop_seconds)
        try:
            process.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
            kills += 1
            if output.exists():  # killed after the atomic rename: the file is complete
                assert_same_rows(read_output(output), expected)
                output.unlink()
            elif partial.exists():  # every kill leaves a file that opens, exact up to its committed rows
                rows = committed_rows(partial)
                assert rows >= 0, "the partial file opens"
                kills_with_rows += rows > 0
                assert_same_rows(read_output(partial, rows), expected, rows)
            continue
        assert process.returncode == 0, process.stderr.read()
        assert_same_rows(read_output(output), expected)
        output.unlink()  # finished before the kill: start over for the next trial
    result = run_featdump(*extract_args(folder, output))
    assert result.returncode == 0, result.stderr
    final = read_output(output)
    assert_same_rows(final, expected)
    assert final["complete"] and final["skipped"] == ["a/broken.jpg"]
    assert not partial.exists() and not (tmp_path / "out.h5.lock").exists()
    print(f"\nfault injection: {kills} SIGKILLs, {kills_with_rows} with committed rows, 0 failures")
    assert kills_with_rows >= TRIALS // 4, "too few kills landed after the first commit to test anything"


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(child) for child in handle.read().split()]


def running(pid: int) -> bool:
    """Alive and not a zombie (a dead orphan waits here for a reaper that may never come)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def open_files(pid: int) -> set[str]:
    files = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            files.add(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            pass
    return files


@pytest.mark.slow  # real processes, 10-15 s each; the quick suite kills a run in test_writer and test_progress
@pytest.mark.parametrize("trial", [0, 1, 2])
def test_restart_right_after_a_sigkill_resumes(folder, clean, tmp_path, trial):
    """Only the main process is killed; its loader workers die with it and hold none of the output's files."""
    output = tmp_path / "out.h5"
    process = start_featdump(*extract_args(folder, output))
    wait_for_progress(process)
    while committed_rows(tmp_path / "out.h5.partial") <= 0:
        time.sleep(0.02)
    workers = children(process.pid)
    assert workers, "the default configuration runs loader workers"
    for worker in workers:
        held = open_files(worker)
        assert not {str(output) + ".lock", str(output) + ".partial"} & held, held
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = time.monotonic()
    time.sleep(0.1 * trial)  # restarts at 0, 0.1 and 0.2 s after the kill
    restart = start_featdump(*extract_args(folder, output))
    deadline = killed_at + 0.5
    while any(running(worker) for worker in workers) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(running(worker) for worker in workers), "orphaned loader workers outlived the main process"
    stderr = restart.stderr.read()
    assert restart.wait(timeout=120) == 0, stderr
    assert "Resuming at image " in stderr
    assert_same_rows(read_output(output), clean[0])


def wait_for_progress(process: subprocess.Popen) -> list[str]:
    lines = []
    for line in process.stderr:
        lines.append(line)
        if " images (" in line and "img/s" in line:
            return lines
    raise AssertionError("no progress line: " + "".join(lines))


@pytest.mark.slow  # real processes signalled: make test-all (test_writer and test_progress kill runs quickly)
@pytest.mark.parametrize("signal_number, exit_code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_sigint_commit_and_resume(folder, clean, tmp_path, signal_number, exit_code):
    output = tmp_path / "out.h5"
    process = start_featdump(*extract_args(folder, output, "-b", "2"))
    wait_for_progress(process)
    process.send_signal(signal_number)
    stderr = process.stderr.read()
    assert process.wait(timeout=60) == exit_code, stderr
    name = signal.Signals(signal_number).name
    message = [line for line in stderr.splitlines() if line.startswith("Error: ")]
    assert len(message) == 1 and message[0].startswith(f"Error: Stopped by {name} after ")
    assert message[0].endswith("images; run the same command again to resume.")
    assert (tmp_path / "out.h5.partial").exists() and not output.exists()
    result = run_featdump(*extract_args(folder, output, "-b", "2"))
    assert result.returncode == 0, result.stderr
    assert "Resuming at image " in result.stderr
    final = read_output(output)
    assert final["complete"]
    for key in ("paths", "labels"):
        assert list(final[key]) == list(clean[0][key])
    np.testing.assert_allclose(final["conv1"], clean[0]["conv1"], rtol=1e-5, atol=1e-5)  # other batch size


@pytest.mark.slow  # real signals to a real process
def test_second_ctrl_c_exits_at_once_leaving_a_valid_file(folder, clean, tmp_path):
    output = tmp_path / "out.h5"
    process = start_featdump(*extract_args(folder, output, "-b", "1"))
    wait_for_progress(process)
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130
    partial = tmp_path / "out.h5.partial"
    rows = committed_rows(partial)
    content = read_output(partial, rows)
    assert content["paths"] == clean[0]["paths"][:rows]
    np.testing.assert_allclose(content["conv1"], clean[0]["conv1"][:rows], rtol=1e-5, atol=1e-5)


def make_partial(images, output, **overrides):
    with pytest.raises(RuntimeError, match="simulated crash"):
        extract(settings_for(images, output, **overrides), CrashAfterFirstBatch())
    assert output.with_name(output.name + ".partial").exists()


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_resume_refused_when_configuration_or_images_change(tmp_path):
    images = tmp_path / "images"
    write_images(images, {"a": 5, "b": 4})
    output = tmp_path / "out.h5"
    make_partial(images, output, layers=("avgpool",))
    with pytest.raises(ResumeMismatch, match=r'layers: \["avgpool"\] when started, \["fc"\] now'):
        extract(settings_for(images, output, layers=("fc",)))
    write_images(images, {"c": 1}, seed=5)
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "-b", "4", images, output)
    assert result.returncode == 2
    assert "the image set changed: 9 images when started, 10 now" in result.stderr
    assert "pass --overwrite to start over" in result.stderr
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "--overwrite", images, output)
    assert result.returncode == 0 and read_output(output)["avgpool"].shape[0] == 10


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_finished_output_is_never_touched(tmp_path):
    images = tmp_path / "images"
    write_images(images, {"a": 3})
    output = tmp_path / "out.h5"
    extract(settings_for(images, output))
    before = (output.read_bytes(), output.stat().st_mtime_ns)
    same = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", images, output)
    assert same.returncode == 0 and "Nothing new" in same.stderr  # the same command again: done already
    other = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer4", images, output)
    assert other.returncode == 2 and "already exists, made by another command" in other.stderr
    assert (output.read_bytes(), output.stat().st_mtime_ns) == before


def test_info_on_a_partial_file(tmp_path):
    images = tmp_path / "images"
    write_images(images, {"a": 6})
    output = tmp_path / "out.h5"
    make_partial(images, output, batch_size=2)
    result = run_featdump("info", output)
    assert result.returncode == 0
    assert "complete:   no" in result.stdout
    assert "progress:   2 of 6 images done" in result.stdout


@pytest.mark.slow  # two writer processes
def test_second_writer_is_refused_and_first_completes(folder, clean, tmp_path):
    output = tmp_path / "out.h5"
    slow = ["extract", "-m", "resnet50", "-w", "none", "-l", "layer4", "-b", "1", "-j", "0", folder, output]
    first = start_featdump(*slow)
    wait_for_progress(first)
    second = run_featdump(*extract_args(folder, output))
    assert second.returncode == 1
    assert second.stderr.strip().endswith(
        f"Error: Another featdump is writing '{output}' (it holds '{output}.lock'); "
        "wait for it to finish or stop it first.")
    first.stderr.read()
    assert first.wait(timeout=300) == 0
    final = read_output(output)
    assert final["complete"] and final["paths"] == clean[0]["paths"]
    assert final["layer4"].shape == (39, 2048, 7, 7)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_disk_full_gives_one_line_and_resumes_once_space_is_freed(folder, clean, tmp_path, small_filesystem):
    output = small_filesystem / "out.h5"
    result = run_featdump(*extract_args(folder, output, "--no-space-check"))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"Error: No space left while writing '{output}.partial'")
    assert errors[0].endswith("Free some space and run the same command again to resume.")
    assert "Traceback" not in result.stderr
    assert committed_rows(output.with_name("out.h5.partial")) > 0
    subprocess.run(["mount", "-o", "remount,size=400m", str(small_filesystem)], check=True)
    result = run_featdump(*extract_args(folder, output, "--no-space-check"))
    assert result.returncode == 0, result.stderr
    assert_same_rows(read_output(output), clean[0])


def test_space_check_refuses_up_front(folder, small_filesystem):
    result = run_featdump(*extract_args(folder, small_filesystem / "out.h5"))
    assert result.returncode == 1
    assert "Error: The output needs about " in result.stderr and "--no-space-check" in result.stderr
    assert not list(small_filesystem.iterdir())


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_the_same_command_after_its_input_grew_is_told_to_update_not_called_another_command(tmp_path):
    images = tmp_path / "images"
    write_images(images, {"a": 3})
    output = tmp_path / "out.h5"
    command = ["extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", images, output]
    assert run_featdump(*command).returncode == 0
    write_images(images, {"b": 2}, seed=3)  # the folder gains images
    again = run_featdump(*command)
    assert again.returncode == 2 and "made by this command over other images (the image set changed" in \
        again.stderr and "pass --update to add new images" in again.stderr, again.stderr
    assert "another command" not in again.stderr
