"""benchmarks/gpu_check.py, the GPU path's one prepared check, run here as a dry run (CUDA absent): every step runs
at a tiny size or says why it was skipped, the results file holds them, and a fault the proof must stop is stopped,
so that the script is known to run before a GPU machine's few minutes are spent on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import featdump_env

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # about 3 minutes on 2 Zen 3 cores: every step of the check, tiny
def test_the_gpu_check_runs_every_step_as_a_dry_run_and_writes_its_results(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", str(tmp_path / "out"), "--dry-run",
                           "--budget", "1500"],  # a 2-core CPU shared with the suite: time to spare
                          cwd=REPO, capture_output=True, text=True, env=featdump_env(), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    steps = {step["name"]: step for step in result["steps"]}
    assert list(steps) == ["install", "cuda tests", "benchmarks", "proof panel"] and result["dry_run"]
    assert steps["install"]["status"] == "skipped" and "--dry-run" in steps["install"]["why"]
    for name in ("cuda tests", "benchmarks", "proof panel"):
        assert steps[name]["status"] == "ok" and steps[name]["why"].startswith("--dry-run"), steps[name]
    assert "passed" in steps["cuda tests"]["figures"]["summary"]
    assert any("avgpool --decode cpu --precision bf16" in row for row in steps["benchmarks"]["figures"]["rows"])
    panel = steps["proof panel"]["figures"]
    assert panel["sound_runs"] == panel["finished"] == 1 and panel["faults"] == panel["caught"] == 1
    assert result["versions"]["gpu"] == "none" and result["versions"]["torch"]
    assert "| proof panel | ok |" in done.stdout  # the short table
