"""`featdump doctor`: the machine as torch sees it, a few measured batches in each configuration asked, and the
fastest one the proof accepts as a command that then runs (`featdump.faces.doctor`, `featdump.job.trials`)."""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from featdump.faces.doctor import describe, recommendation
from featdump.forward.hardware import Cpu, Gpu
from featdump.job.settings import Settings
from featdump.job.trials import Configuration, Trial, offered, payback_rows, recommended

from .helpers import read_output, run_featdump, write_images


def test_doctor_json_names_this_machine_and_recommends_a_configuration_that_then_runs(tmp_path):
    result = run_featdump("doctor", "-m", "resnet18", "-l", "layer2", "-b", "2", "--batches", "2", "--try",
                          "cpu,fp32,bf16", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    cpu = report["machine"]["cpu"]
    assert cpu["capability"] == torch.backends.cpu.get_cpu_capability() and cpu["cores"] >= 1
    assert report["machine"]["torch"] == torch.__version__ and report["machine"]["free_disk_bytes"] > 0
    trials = {trial["configuration"]: trial for trial in report["trials"]}
    assert set(trials) == {"cpu fp32", "cpu bf16"}  # asked by name: bf16 is tried even where it is not native
    assert trials["cpu fp32"]["outcome"] == "ran" and trials["cpu fp32"]["rows_per_second"] > 0
    assert trials["cpu bf16"]["outcome"] == "ran" and trials["cpu bf16"]["proved"]  # the proof ran and accepted it
    fastest = max(trials.values(), key=lambda trial: trial["rows_per_second"])
    assert report["recommended"]["configuration"] == fastest["configuration"]
    command = shlex.split(report["recommended"]["command"])
    assert command[:2] == ["featdump", "extract"] and command[-2:] == ["IMAGES", "OUT.h5"]
    write_images(tmp_path / "images", {"": 5})
    ran = run_featdump(*command[1:-2], tmp_path / "images", tmp_path / "out.h5")
    assert ran.returncode == 0, ran.stderr
    assert len(read_output(tmp_path / "out.h5")["paths"]) == 5


def test_doctor_says_the_machine_and_its_outcomes_in_lines(tmp_path):
    result = run_featdump("doctor", "-m", "resnet18", "-l", "avgpool", "-b", "2", "--batches", "2", "--try", "fp32",
                          cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("CPU: ") and torch.backends.cpu.get_cpu_capability() in lines[0]
    assert lines[1].startswith("GPU: ") and lines[2].startswith(f"torch {torch.__version__}")
    assert any(line.split()[:2] == ["cpu", "fp32"] and "ran" in line for line in lines)
    assert lines[-2] == "Fastest the proof accepts: cpu fp32:"
    assert lines[-1].strip() == "featdump extract -m resnet18 -l avgpool -w none -b 2 --device cpu IMAGES OUT.h5"


AVX2 = Cpu("Zen 3", "AVX2", frozenset({"avx2"}))
ZEN4 = Cpu("Zen 4", "AVX512", frozenset({"avx2", "avx512f", "avx512_bf16"}))


def test_the_configurations_offered_are_the_native_ones_and_the_others_say_why():
    trials = {trial.configuration.name: trial for trial in offered(AVX2, [], compiles=True)}
    assert {name for name, trial in trials.items() if trial.outcome == "to run"} == {"cpu fp32", "cpu fp32 compile"}
    assert "no native bf16 kernels on this CPU" in trials["cpu bf16"].why
    native = {trial.configuration.name for trial in offered(ZEN4, [], compiles=False) if trial.outcome == "to run"}
    assert native == {"cpu fp32", "cpu bf16"}
    gpu = [Gpu(0, "Tesla T4", "7.5", 16 << 30)]
    on_t4 = {trial.configuration.name: trial for trial in offered(AVX2, gpu, compiles=False, asked=["cuda"])}
    assert {name for name, trial in on_t4.items() if trial.outcome == "to run"} == {"cuda fp32", "cuda fp16"}
    assert on_t4["cuda bf16"].why == "no native bf16 kernels on this GPU"


def test_the_recommendation_is_the_fastest_the_proof_accepted():
    def trial(precision, outcome, rate):
        return Trial(Configuration("cpu", precision), outcome, rows_per_second=rate)

    trials = [trial("fp32", "ran", 10.0), trial("bf16", "stopped by the proof", 30.0), trial("fp16", "ran", 12.0)]
    assert recommended(trials).configuration.precision == "fp16"
    assert recommended([trial("bf16", "failed", None)]) is None


def test_a_later_first_batch_is_weighed_against_the_faster_rate():
    eager = Trial(Configuration("cpu"), "ran", rows_per_second=24.0, warm_up_seconds=2.5)
    compiled = Trial(Configuration("cpu", compile=True), "ran", rows_per_second=30.0, warm_up_seconds=26.5)
    assert payback_rows(compiled, eager) == pytest.approx(24 / (1 / 24 - 1 / 30), abs=1)  # 2,880 rows
    assert payback_rows(eager, compiled) is None  # it starts sooner
    slower = Trial(Configuration("cpu", "bf16"), "ran", rows_per_second=3.0, warm_up_seconds=30.0)
    assert payback_rows(slower, eager) is None  # it never pays back


def test_the_recommendation_says_when_a_compile_pays_back_and_a_skip_has_no_rate():
    trials = [Trial(Configuration("cpu"), "ran", rows_per_second=24.0, warm_up_seconds=2.5),
              Trial(Configuration("cpu", compile=True), "ran", rows_per_second=30.0, warm_up_seconds=26.5, proved=True),
              Trial(Configuration("cpu", "bf16"), "skipped", why="no native bf16 kernels on this CPU")]
    base = Settings(model="resnet18", layers="avgpool", weights="none", batch_size=32, images=".", output="o.h5")
    machine = {"cpu": {"name": "Zen 3", "cores": 2, "instruction_set": "AVX2"}, "gpus": [], "compiler": "g++",
               "torch": "2", "torchvision": "0", "free_disk_bytes": 1 << 30, "disk_folder": "/tmp"}
    result = {"featdump": "0", "machine": machine, "model": "resnet18", "layers": ["avgpool"], "weights": "none",
              "batch_size": 32, "batches": 3, "trials": [trial.as_json() for trial in trials],
              "recommended": recommendation(trials[1], trials, base)}
    assert result["recommended"]["until_then"] == "cpu fp32" and result["recommended"]["pays_back_after_rows"] > 2800
    lines = list(describe(result))
    assert lines[-1].startswith("Its first batch ends 24.0 s later than cpu fp32's (building or loading its compiled")
    assert "pays that back after about 2,88" in lines[-1]
    skipped = next(line for line in lines if line.split()[:2] == ["cpu", "bf16"])
    assert skipped.split()[2].startswith("skipped")  # no rate of 0.0 for what did not run


@pytest.mark.parametrize("options, said", [(["-m", "nosuchmodel"], "Unknown model 'nosuchmodel'"),
                                           (["-m", "resnet18", "-l", "layer9"], "layer9")])
def test_a_wrong_model_or_layer_is_one_line_before_any_other_trial(tmp_path, options, said):
    result = run_featdump("doctor", *options, "-b", "2", "--batches", "2", cwd=tmp_path)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert result.stdout == "" and "doctor: cpu fp32 compile" not in result.stderr


def test_doctor_fails_when_no_configuration_ran(tmp_path):
    result = run_featdump("doctor", "-m", "resnet18", "-b", "2", "--batches", "2", "--try", "cuda", "--json",
                          cwd=tmp_path)
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: cuda runs")
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["recommended"] is None  # the JSON still says what was found
    lines = run_featdump("doctor", "-m", "resnet18", "--try", "cuda", cwd=tmp_path).stdout.splitlines()
    assert lines[-1] == "No configuration asked is on this machine (--try names a device or precision it lacks)."


@pytest.mark.parametrize("options", [["--try", "nosuch"], ["--batches", "1"]])
def test_doctor_refuses_what_it_cannot_measure_in_one_line(tmp_path, options):
    result = run_featdump("doctor", "-m", "resnet18", *options, cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
