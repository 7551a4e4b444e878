"""featdump info on a running job: answers at once from the progress record, never from the file being written."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import h5py
import pytest

from .helpers import run_featdump, start_featdump, write_images


def start(images, output):
    args = ["extract", "-m", "resnet50", "-w", "none", "-l", "layer4", "-b", "2", images, output]
    return start_featdump(*args, stdout=subprocess.DEVNULL)


def info_json(output) -> dict:
    result = run_featdump("info", "--json", output, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow  # a real job polled while it runs
def test_info_on_a_running_job_then_on_the_finished_file(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out.h5"
    write_images(images, {"a": 12, "b": 12})
    job = start(images, output)
    seen = []
    text_seen = False
    while job.poll() is None:
        state = info_json(output) if (tmp_path / "out.h5.progress.json").exists() else None
        if state and state.get("state") == "running":
            assert state["pid"] == job.pid and state["image_count"] == 24 and "layer4" in state["layers"]
            seen.append(state["images_done"])
            if not text_seen:
                text = run_featdump("info", tmp_path / "out.h5.partial", timeout=60)
                assert text.returncode == 0 and f"running:    pid {job.pid} on " in text.stdout
                assert " of 24 images (" in text.stdout and "img/s" in text.stdout
                text_seen = True
        time.sleep(0.2)
    assert job.wait() == 0, job.stderr.read()
    assert len(seen) >= 2 and text_seen, "the job ended before info saw it running"
    assert seen == sorted(seen) and seen[-1] <= 24  # never decreases, never past the end
    with h5py.File(output, "r") as h5file:
        assert seen[-1] <= len(h5file["paths"]) == 24
    final = info_json(output)
    assert final["complete"] and final["rows"] == 24
    assert not (tmp_path / "out.h5.progress.json").exists()


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_info_after_a_sigkill_says_stopped_and_how_to_resume(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out.h5"
    write_images(images, {"a": 12})
    job = start(images, output)
    record = tmp_path / "out.h5.progress.json"
    while job.poll() is None and not (record.exists() and json.loads(record.read_text()).get("images_done", 0) > 0):
        time.sleep(0.05)
    job.send_signal(signal.SIGKILL)
    job.wait()
    state = info_json(output)
    assert state["state"] == "stopped" and state["job"]["images_done"] > 0 and state["job"]["pid"] == job.pid
    assert state["rows"] == state["job"]["rows"]  # the partial file, read now that nobody holds it
    text = run_featdump("info", output).stdout
    assert f"stopped:    the job (pid {job.pid} on " in text and "run the same command again to resume" in text
    assert "complete:   no" in text  # the partial file itself, readable now that nobody holds it


@pytest.mark.slow  # real processes polled from their first second
def test_info_answers_from_the_moment_the_job_holds_its_lock(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out.h5"
    write_images(images, {"a": 8})
    job = start(images, output)
    lock = tmp_path / "out.h5.lock"
    while not lock.exists() and job.poll() is None:
        time.sleep(0.01)
    states = []
    while job.poll() is None:
        result = run_featdump("info", "--json", output, timeout=60)
        if job.poll() is not None:
            break  # the job ended while info ran: it may have seen either side
        assert result.returncode == 0, result.stderr  # never "No file", never "not readable"
        state = json.loads(result.stdout)
        states.append(state["state"])
        if state["state"] == "starting":
            assert state["pid"] == job.pid
            text = run_featdump("info", output, timeout=60).stdout
            assert f"starting:   pid {job.pid} on " in text or "running:" in text or "complete:" in text
    assert job.wait() == 0, job.stderr.read()
    assert "starting" in states and "running" in states, states
    assert set(states) <= {"starting", "running", "complete"}  # complete: finished, the process still exiting
    assert info_json(output)["state"] == "complete"


def test_a_bar_of_megabytes_read_shows_sizes_and_log_lines_are_spaced(capsys, caplog):
    from featdump.faces.terminal import BarProgress, LogProgress

    bar = BarProgress("MB")
    bar.start(3535.36, 0)
    bar.advance(1422.6913280000015)
    bar.close()
    shown = capsys.readouterr().err
    assert "1.42G/3.54G" in shown and "B/s]" in shown and "1422.69" not in shown, shown
    nothing = BarProgress()  # an update that only adds layers: its new images' loop has none
    nothing.start(0, 0)
    nothing.close()
    assert capsys.readouterr().err == ""
    lines = LogProgress("MB")
    with caplog.at_level("INFO", logger="featdump"):
        lines.start(100, 0)
        for _ in range(100):  # ten 10% steps at once: one line, not ten
            lines.advance(1)
    assert len([record for record in caplog.records if "MB" in record.getMessage()]) <= 1


def test_sizes_under_a_megabyte_are_not_zero_megabytes():
    from featdump.output.progress import describe_running, running_lines
    from featdump.output.space import human_bytes

    assert [human_bytes(count) for count in (512, 350_000, 2_500_000)] == ["512 B", "350.0 KB", "2.5 MB"]
    record = {"pid": 1, "host": "h", "started": 0.0, "images_done": 1, "image_count": 2, "skipped": 0, "rate": 1.0,
              "layers": {}, "size_bytes": 350_000, "file": "out.h5"}
    assert "size:       350.0 KB so far" in running_lines(describe_running(record, running=True))


def test_rows_found_done_count_on_the_bar_but_not_in_its_rate(capsys, caplog):
    """A Ray job's driver finds shards finished before (or resumed): their rows move the bar, not the rate."""
    import time

    from featdump.faces.terminal import BarProgress, LogProgress

    lines = LogProgress(every_seconds=0.0, least_seconds=0.0)
    with caplog.at_level("INFO", logger="featdump"):
        lines.start(1000, 0)
        lines.found(900)
        time.sleep(0.2)
        lines.advance(10)
    (said,) = [record.getMessage() for record in caplog.records if "images" in record.getMessage()]
    assert said.startswith("910/1000 images (91%)") and float(said.split(", ")[1].split()[0]) < 100, said
    bar = BarProgress()
    bar.start(1000, 0)
    bar.found(900)
    time.sleep(0.2)
    bar.advance(10)
    bar.close()
    shown = capsys.readouterr().err
    assert "910/1000" in shown and "it/s" not in shown
    rate = float(shown.rsplit("img/s", 1)[0].rsplit(", ", 1)[1])
    assert rate < 100, shown  # 10 images in 0.2 s, not 910


def test_a_running_clip_job_is_described_in_clips():
    from featdump.output.progress import describe_running, running_lines

    record = {"pid": 1, "host": "h", "started": 0.0, "images_done": 3, "image_count": 9, "skipped": 0, "rate": 2.0,
              "layers": {}, "size_bytes": None, "file": "out.h5", "noun": "clip"}
    assert "progress:   3 of 9 clips (33.3%), 0 skipped, 2.0 clip/s" in running_lines(describe_running(record, True))[2]
    del record["noun"]  # a record written before it said what a row is
    assert "3 of 9 images (33.3%), 0 skipped, 2.0 img/s" in running_lines(describe_running(record, True))[2]
