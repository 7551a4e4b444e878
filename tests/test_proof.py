"""The proof (`featdump.job.proof`): a run off the reference path (here bf16/fp16 autocast and --compile on the CPU)
records per-layer errors of a seeded sample of its images recomputed on the CPU in fp32, eager; info and the
summary show it; --proof 0 turns it off; an fp16 overflow stops the run naming the layer; an out-of-memory error
of the forward is one line, its rows kept, and the same command finishes."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

import featdump
from featdump.job.proof import row_errors
from featdump.job.sampling import plan_sample
from featdump.job.tolerances import bound
from tests.makers import faults

from .helpers import featdump_env, images_fixture, read_output, run_featdump, user_project, write_images

MODELS = '''
from pathlib import Path

import torch
from torch import nn


class Overflowing(nn.Module):
    """A convolution whose outputs pass fp16's 65,504 (about 1.6e5), finite in fp32."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=8, bias=False)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(self.conv(x)).flatten(1)


def overflowing():
    model = Overflowing()
    with torch.no_grad():
        model.conv.weight.fill_(3000.0)
    return model


class Offset(nn.Module):
    """(x + 1000) - 1000: x itself in fp32; in bf16 (spacing 4 near 1000) every |x| < 2 is rounded away to 0."""

    def forward(self, x):
        return (x + 1000.0) - 1000.0


class Gated(nn.Module):
    """Exact in fp32; in bf16 its `offset` output is 0 where fp32's is about -1.4 to 1.4: a precision that does not
    fit the model at that layer, whose CPU emulation is as wrong as the run."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, stride=8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 8)
        self.offset = Offset()

    def forward(self, x):
        return self.offset(self.fc(self.pool(self.conv(x)).flatten(1)))


def gated():
    return Gated()


class Tiny(nn.Module):
    """Values of about 1e-8, finite and exact in fp32: fp16 holds no weight that small (its rows are zeros), and
    float16 storage none of its values (below its smallest normal, 6.1e-5)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=8, bias=False)
        self.pool = nn.AdaptiveAvgPool2d(1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.linspace(-1e-9, 2e-9, 108).reshape(4, 3, 3, 3))

    def forward(self, x):
        return self.pool(self.conv(x)).flatten(1)


def tiny():
    return Tiny()


class RunsOutOfMemory(nn.Module):
    """Raises CUDA's out-of-memory error at its third forward of a real batch while MARKER exists (then deletes it)."""

    marker = None
    batches = 0

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, stride=4)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        if x.shape[0] > 4:  # not the dry forwards of a few images
            RunsOutOfMemory.batches += 1
            if RunsOutOfMemory.batches == 3 and self.marker is not None and Path(self.marker).exists():
                Path(self.marker).unlink()
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return self.pool(torch.relu(self.conv(x))).flatten(1)


class CpuAllocatorFails(nn.Module):
    """Fails as the CPU allocator (or Python) does at its second forward of a real batch while MARKER exists."""

    batches = 0

    def __init__(self, error):
        super().__init__()
        torch.manual_seed(0)
        self.error = error
        self.conv = nn.Conv2d(3, 8, 3, stride=4)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        if x.shape[0] > 4:
            CpuAllocatorFails.batches += 1
            import os

            marker = Path(os.environ.get("OOM_MARKER", "/nonexistent"))
            if CpuAllocatorFails.batches == 2 and marker.exists():
                marker.unlink()
                raise self.error
        return self.pool(torch.relu(self.conv(x))).flatten(1)


def allocator_fails():
    CpuAllocatorFails.batches = 0
    return CpuAllocatorFails(RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't "
                                          "allocate memory: you tried to allocate 89915392000 bytes. Error code 12"))


def memory_error():
    CpuAllocatorFails.batches = 0
    return CpuAllocatorFails(MemoryError())


def runs_out_of_memory():
    import os

    RunsOutOfMemory.marker = os.environ.get("OOM_MARKER")
    return RunsOutOfMemory()
'''


images = images_fixture({"a": 10, "b": 10}, seed=3)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_bf16_run_proves_its_rows_and_info_and_the_summary_show_it(images, tmp_path):
    output = tmp_path / "bf16.h5"
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer2,avgpool", "--precision", "bf16",
                          images, output)
    assert result.returncode == 0, result.stderr
    assert "; proof: 8 images recomputed on the reference path, each layer within its bounds (nearest: " in \
        result.stderr
    with h5py.File(output, "r") as h5file:
        (proof,) = json.loads(h5file.attrs["proof"])
    assert proof["configuration"] == "cpu, bf16" and proof["proved"] and proof["emulated"] == ["bf16"]
    for layer in proof["layers"].values():  # each row's bound: 3x its own emulation's error, plus bf16's floor
        assert 2**-8 < layer["bound"] <= 3 * layer["emulated"] + 2**-8 + 1e-12
        assert 1e-4 < layer["emulated"] < 0.05 and layer["nearest"] <= layer["bound"] and layer["used"] < 1
    assert len(proof["images"]) == len(set(proof["images"])) == 8  # 20 images in one default batch of 64: all first
    bf16 = featdump.load(output, "layer2").features
    reference = tmp_path / "fp32.h5"
    assert run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer2,avgpool", images,
                        reference).returncode == 0
    fp32 = featdump.load(reference, "layer2")
    rows = [fp32.paths.index(path) for path in proof["images"]]
    errors = row_errors(bf16[rows].reshape(8, -1).astype(np.float64), fp32.features[rows].reshape(8, -1))
    assert proof["layers"]["layer2"]["largest"] == pytest.approx(max(errors), rel=1e-3)
    assert proof["layers"]["layer2"]["median"] == pytest.approx(float(np.median(errors)), rel=1e-3)  # fp32 paths: 1e-7
    assert 1e-4 < max(errors) < 0.05  # bf16 is not fp32, and within its bound
    info = run_featdump("info", output).stdout
    assert "proof:      cpu, bf16: 8 images recomputed on the reference path (cpu, fp32, eager, hooks" in info
    assert "the CPU), emulated in bf16" in info
    assert (f"  layer2: largest {max(errors):.1e}, median {np.median(errors):.1e} "
            f"(bound {proof['layers']['layer2']['bound']:.1e}); whole row ") in info
    assert json.loads(run_featdump("info", "--json", output).stdout)["proof"] == [proof]
    with h5py.File(reference, "r") as h5file:  # the reference path needs no proof, and says so
        assert json.loads(h5file.attrs["proof"])[0] == {
            "configuration": "cpu", "reference": "cpu, fp32, eager, hooks, the original files decoded on the CPU",
            "proved": False, "why": "the run is the reference path"}


@pytest.mark.slow  # bf16 without native kernels, in a fresh process
def test_a_bf16_run_held_to_avx2_is_proved_without_a_false_alarm(tmp_path):
    """oneDNN and ATen held to AVX2 whatever this CPU has (bf16 emulated, summed in AVX2's order, as on a Zen 3): a
    sound bf16 run is proved, each layer within its bounds, and the run said first what bf16 costs here."""
    write_images(tmp_path / "images", {"": 8}, seed=5)
    env = featdump_env(ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2")
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer1,layer2", "--precision", "bf16",
                          tmp_path / "images", tmp_path / "held.h5", env=env, process=True)
    assert result.returncode == 0, result.stderr
    assert "--precision bf16 on this CPU" in result.stderr and "oneDNN held to AVX2" in result.stderr
    with h5py.File(tmp_path / "held.h5", "r") as h5file:
        (proof,) = json.loads(h5file.attrs["proof"])
    assert proof["configuration"] == "cpu, bf16" and proof["proved"], proof
    assert set(proof["layers"]) == {"layer1", "layer2"} and all(layer["used"] < 1 for layer in proof["layers"].values())


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_proof_0_turns_it_off_and_a_config_file_sets_it_the_same(images, tmp_path):
    output = tmp_path / "off.h5"
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer1", "--precision", "bf16",
                          "--proof", "0", images, output)  # layer1: the forward stops there (bf16 is slow on AVX2)
    assert result.returncode == 0 and "proof:" not in result.stderr, result.stderr
    assert "proof:      none (cpu, bf16: --proof 0)" in run_featdump("info", output).stdout
    config = tmp_path / "run.toml"
    config.write_text('model = "resnet18"\nweights = "none"\nlayers = ["layer1"]\nprecision = "bf16"\nproof = 2\n')
    assert run_featdump("extract", "--config", config, images, tmp_path / "two.h5").returncode == 0
    with h5py.File(tmp_path / "two.h5", "r") as h5file:
        assert len(json.loads(h5file.attrs["proof"])[0]["images"]) == 2
    bad = run_featdump("extract", "-m", "resnet18", "-l", "avgpool", "--proof", "-1", images, tmp_path / "x.h5")
    assert bad.returncode == 2 and "--proof" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_an_fp16_overflow_stops_the_run_naming_the_layer(images, tmp_path):
    with user_project(tmp_path, "proof_models", MODELS, {}):
        fp32 = run_featdump("extract", "-m", "proof_models:overflowing", "-l", "conv", images, tmp_path / "fp32.h5",
                            cwd=tmp_path)
        assert fp32.returncode == 0, fp32.stderr
        assert np.isfinite(featdump.load(tmp_path / "fp32.h5", "conv").features).all()
        assert np.abs(featdump.load(tmp_path / "fp32.h5", "conv").features).max() > 65504
        result = run_featdump("extract", "-m", "proof_models:overflowing", "-l", "conv", "--precision", "fp16",
                              images, tmp_path / "fp16.h5", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    message = error_line(result.stderr)
    assert message.startswith("Error: Layer conv: the rows of cpu, fp16 are non-finite (inf or NaN) where the "
                              "reference path's are finite"), message
    assert message.endswith("Run again with --precision fp32 (nothing was committed: it starts over)."), message
    assert not (tmp_path / "fp16.h5").exists()  # never passed off as done


@pytest.mark.slow  # the CPU allocation failure's one line stays quick; this resume runs in make test-all
def test_out_of_memory_in_the_forward_is_one_line_keeps_the_rows_and_the_same_command_finishes(tmp_path):
    """140 images in default batches of 64: the third batch's forward raises; two batches stay committed."""
    with user_project(tmp_path, "oom_models", MODELS, {"": 140}) as folder:
        (folder / "marker").touch()
        command = ["extract", "-m", "oom_models:runs_out_of_memory", "-l", "pool", folder / "images",
                   folder / "out.h5"]
        env = {**__import__("os").environ, "OOM_MARKER": str(folder / "marker")}
        failed = run_featdump(*command, env=env, cwd=folder)
        assert failed.returncode == 1, failed.stderr
        message = error_line(failed.stderr)
        assert message.startswith(
            "Error: Out of memory on cpu at --batch-size 64 (CUDA out of memory. Tried to allocate 20.00 GiB)"), message
        assert message.endswith("run the same command with a smaller --batch-size (e.g. 32) to resume."), message
        assert len(read_output(folder / "out.h5.partial", rows=None)["paths"]) == 128
        finished = run_featdump(*command, env=env, cwd=folder)
        assert finished.returncode == 0 and "resumed at image 128" in finished.stderr, finished.stderr
        straight = run_featdump(*command[:-1], folder / "straight.h5", env=env, cwd=folder)
        assert straight.returncode == 0, straight.stderr
    np.testing.assert_array_equal(read_output(folder / "out.h5")["pool"], read_output(folder / "straight.h5")["pool"])


def error_line(stderr: str) -> str:
    """The one error line, the last of the log, and no traceback."""
    lines = stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("Error:")] == lines[-1:] and "Traceback" not in stderr, stderr
    return lines[-1]


def test_the_sample_takes_a_quarter_from_the_first_batch_and_one_row_in_each_stretch_of_the_rest():
    sample = plan_sample(8, 0, 64, 10_000, seed=5)
    assert sample.count_first == 2 and len(sample.later) == 6 and sample.seed == 5
    stretches = np.linspace(64, 10_000, 7).astype(int)
    assert sorted(np.searchsorted(stretches, sorted(sample.later), side="right") - 1) == list(range(6))
    assert plan_sample(8, 0, 64, 10_000, seed=5) == sample  # its seed makes it again
    assert plan_sample(8, 0, 64, 10_000).seed != plan_sample(8, 0, 64, 10_000).seed  # a new one each run
    assert plan_sample(8, 0, 4, 11, seed=1).count_first == 2 and len(plan_sample(8, 0, 4, 11, seed=1).later) == 6
    assert plan_sample(8, 0, 20, 20).count_first == 8 and not plan_sample(8, 0, 20, 20).later
    assert plan_sample(1, 0, 64, 10_000).count_first == 1 and not plan_sample(1, 0, 64, 10_000).later


@pytest.mark.parametrize("name, faulty", [
    ("every 7th batch", lambda rng: {row for batch in range(7, 32, 7) for row in range(8 * batch, 8 * batch + 8)}),
    ("one stale batch", lambda rng: set(range(8 * (batch := int(rng.integers(1, 32))), 8 * batch + 8))),
    ("one swapped pair", lambda rng: {(row := int(rng.integers(8, 255))), row + 1}),
])
def test_the_chance_formula_is_the_sampler_s_own(name, faulty):
    """256 rows in batches of 8, --proof 8: a fault after the first batch is met as often as docs/proof.md's formula
    says (between 1 - (1 - f)^M spread evenly and M f in one place; M = 6), over 4,000 drawn samples."""
    from featdump.job.sampling import chance_of_seeing

    rng = np.random.default_rng(0)
    trials = 4000
    met = sum(bool((plan_sample(8, 0, 8, 256).later | set(range(8))) & faulty(rng)) for _ in range(trials))
    fraction = len(faulty(rng)) / 248
    even, one_place = chance_of_seeing(8, 8, 256, fraction)
    low, high = (even, even) if name == "every 7th batch" else (one_place, one_place)
    assert low - 0.03 <= met / trials <= high + 0.03, (name, met / trials, even, one_place)


def test_errors_are_per_row_and_non_finite_only_where_the_reference_is_finite():
    reference = np.array([[1.0, -4.0, 2.0], [np.inf, 1.0, 0.0]])
    got = np.array([[1.0, -4.1, 2.0], [np.inf, 1.0, 0.0]])
    assert row_errors(got, reference) == [pytest.approx(0.025), 0.0]
    assert row_errors(np.array([[1.0, np.inf, 2.0]]), reference[:1]) == [float("inf")]
    assert bound(["cuda", "bf16", "compile"], 0.01) == pytest.approx(1e-3 + 3 * 0.01 + 2**-8 + 1e-4)
    assert bound(["bf16"], 0.01, "float16") == pytest.approx(3 * 0.01 + 2**-8 + 2**-11)
    assert bound(["cuda"], 0.5) == pytest.approx(1e-3)  # nothing emulated: the fixed bound alone
    assert bound(["bf16"], 0.05) == pytest.approx(0.1)  # the emulated part is capped by bf16's ceiling


def test_a_row_beyond_its_own_bound_stays_beyond_it_however_many_rows_are_proved():
    """Each row is judged by its own emulation: rows proved besides it (farther in the emulation) do not loosen its
    test, so --proof 256 is never more lenient than --proof 8 on the same rows."""
    from featdump.job.proof_measures import nearest_row as _nearest_row

    error, limit = _nearest_row([0.05, 0.01], [0.01, 0.01], ["bf16"], "float32")
    assert (error, limit) == (0.05, pytest.approx(3 * 0.01 + 2**-8)) and error > limit
    more = _nearest_row([0.05, 0.01, 0.08, 0.07], [0.01, 0.01, 0.03, 0.025], ["bf16"], "float32")
    assert more == (0.05, pytest.approx(3 * 0.01 + 2**-8))  # the same row, the same bound: still beyond it


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_shards_and_updates_record_their_own_proof(tmp_path):
    images = tmp_path / "images"
    write_images(images, {"a": 6, "b": 6}, seed=4)
    base = ["extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "--precision", "bf16"]
    for index in range(2):
        result = run_featdump(*base, "--shard", f"{index}/2", images, tmp_path / "out.h5")
        assert result.returncode == 0, result.stderr
    assert run_featdump("merge", tmp_path / "out.h5").returncode == 0
    with h5py.File(tmp_path / "out.h5", "r") as h5file:
        proofs = json.loads(h5file.attrs["proof"])
    assert [proof["shard"] for proof in proofs] == [0, 1] and all(proof["proved"] for proof in proofs)
    assert sorted(path for proof in proofs for path in proof["images"]) == featdump.load(tmp_path / "out.h5",
                                                                                        "avgpool").paths
    single = tmp_path / "single.h5"
    assert run_featdump(*base, images, single).returncode == 0
    write_images(images, {"c": 3}, seed=5)
    updated = run_featdump(*base, "--update", images, single)
    assert updated.returncode == 0, updated.stderr
    with h5py.File(single, "r") as h5file:
        first, update = json.loads(h5file.attrs["proof"])
    assert "run" not in first and update["run"] == "update" and update["proved"]
    assert sorted(update["images"]) == ["c/img_000.jpg", "c/img_001.jpg", "c/img_002.png"]


@pytest.mark.slow  # inception_v3 at 299 px, recomputed twice
def test_a_deep_bf16_layer_of_a_random_inception_v3_is_proved_against_its_emulation(images, tmp_path):
    """Mixed_7b.branch3x3_2a stopped every bf16 run at 5e-2 (its own bf16 error reaches 6e-2): now its bound is
    3x what CPU bf16 itself makes of the same rows."""
    output = tmp_path / "inception.h5"
    result = run_featdump("extract", "-m", "inception_v3", "-w", "none", "-l", "Mixed_7b.branch3x3_2a",
                          "--precision", "bf16", images, output)
    assert result.returncode == 0, result.stderr
    with h5py.File(output, "r") as h5file:
        (proof,) = json.loads(h5file.attrs["proof"])
    layer = proof["layers"]["Mixed_7b.branch3x3_2a"]
    assert layer["emulated"] > 1e-2 and layer["nearest"] <= layer["bound"] <= 3 * layer["emulated"] + 2**-8 + 1e-12


@pytest.mark.parametrize("fault", ["shifted", pytest.param("zeroed", marks=pytest.mark.slow),
                                   pytest.param("wrong_layer", marks=pytest.mark.slow)])  # one fault in the quick suite
def test_a_fault_in_the_copy_to_the_host_is_caught_before_the_rows_are_stored(images, tmp_path, fault):
    """The proof judges the rows as the writer receives them: a copy that shifts them by one, zeroes one, or hands
    one layer another's rows stops the run at its first batch, and the way out it names then runs. (--proof 20: every
    row of the 20 is proved, so the zeroed one is too; by default 8 of them are.)"""
    output = tmp_path / "out.h5"
    command = ["extract", "-m", "resnet18", "-w", "none", "-l", "layer2,layer3", "--precision", "bf16", "--proof",
               "20" if fault == "zeroed" else "4", images, output]  # every row shifted: 4 proved see it; the forward
    # stops at layer3 (bf16 has no native kernels on many CPUs: this test stays in the quick suite)
    with faults.injected(getattr(faults, fault)):
        result = run_featdump(*command)
    assert result.returncode == 1, result.stderr
    message = error_line(result.stderr)
    assert message.startswith("Error: Layer layer2: the rows of cpu, bf16 are "), message
    assert message.endswith("Run again with --precision fp32 (nothing was committed: it starts over)."), message
    assert not output.exists()
    way_out = run_featdump(*command[:7], "--precision", "fp32", *command[9:])
    assert way_out.returncode == 0, way_out.stderr
    assert "proof:" not in way_out.stderr  # the reference path itself


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_one_percent_error_on_one_channel_is_caught_where_bf16_s_own_error_is_larger(images, tmp_path):
    """1% of a row's largest value on channel 0 of layer4 (bf16's own error there is a few %) moves that channel's
    mean far beyond what bf16 moves any channel's."""
    with faults.injected(faults.channel_off({"layer4": 0}), {"layer4"}):
        result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer1,layer4", "--precision", "bf16",
                              images, tmp_path / "out.h5")
    message = error_line(result.stderr)
    assert message.startswith("Error: Layer layer4: the rows of cpu, bf16 are shifted by "), message
    assert " of a row's largest value on average in channel 0, beyond the " in message, message
    shift = float(message.split("shifted by ")[1].split()[0])  # 1% of the row's largest value, as injected
    assert 0.009 <= shift <= 0.011, message


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_a_fault_in_a_later_batch_keeps_its_rows_and_names_overwrite(tmp_path):
    """70 images in batches of 64: the second batch's copy is shifted; its sampled rows stop the run with the first
    batch committed, and the message's way out (another precision, with --overwrite) runs."""
    images = tmp_path / "images"
    write_images(images, {"": 70}, seed=6)
    output = tmp_path / "out.h5"
    batches = []

    def later_shifted(rows):
        batches.append(1)
        return faults.shifted(rows) if len(batches) > 1 else rows

    command = ["extract", "-m", "resnet18", "-w", "none", "-l", "layer2", "--precision", "bf16", images, output]
    with faults.injected(later_shifted):
        result = run_featdump(*command)
    message = error_line(result.stderr)
    assert message.endswith(f"Run again with --precision fp32, and --overwrite: the 64 rows committed in {output}"
                            ".partial were made this way, and no other configuration can resume them."), message
    assert len(read_output(tmp_path / "out.h5.partial", rows=None)["paths"]) == 64
    refused = run_featdump(*command[:7], "--precision", "fp32", images, output)
    assert refused.returncode == 2 and "--overwrite to start over" in refused.stderr  # why the message says it
    way_out = run_featdump(*command[:7], "--precision", "fp32", "--overwrite", images, output)
    assert way_out.returncode == 0, way_out.stderr
    assert len(featdump.load(output, "layer2").paths) == 70


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_float16_storage_overflow_stops_naming_dtype_float32_and_blames_the_storage(images, tmp_path, precision):
    with user_project(tmp_path, "proof_models", MODELS, {}):
        command = ["extract", "-m", "proof_models:overflowing", "-l", "conv", "--precision", precision, images]
        result = run_featdump(*command, "--dtype", "float16", tmp_path / "half.h5", cwd=tmp_path)
        message = error_line(result.stderr)
        assert message.startswith("Error: Layer conv: "), message
        assert " value(s) became inf when stored as float16 (largest 1." in message, message
        assert message.endswith("float16 holds at most 65,504). Run again with --dtype float32 (nothing was "
                                "committed: it starts over)."), message
        assert not (tmp_path / "half.h5").exists()
        way_out = run_featdump(*command, "--dtype", "float32", tmp_path / "half.h5", cwd=tmp_path)
        assert way_out.returncode == 0, way_out.stderr
    assert np.isfinite(featdump.load(tmp_path / "half.h5", "conv").features).all()


@pytest.mark.parametrize("model, precision", [("gated", "bf16"), ("tiny", "fp16")])
def test_a_precision_that_does_not_fit_the_model_stops_at_the_first_batch(images, tmp_path, model, precision):
    """Rows as wrong as their own emulation (bf16 rounding a layer's values away to 0; fp16 holding none of a
    model's 1e-9 weights, its rows all zeros) are not proved: the emulation itself is beyond the precision's
    ceiling, and the run stops saying the precision does not fit, before a row is written; fp32 then runs."""
    layer = "offset" if model == "gated" else "pool"
    with user_project(tmp_path, "fit_models", MODELS, {}):
        command = ["extract", "-m", f"fit_models:{model}", "-l", layer, images, tmp_path / "out.h5"]
        result = run_featdump(*command[:5], "--precision", precision, *command[5:], cwd=tmp_path)
        message = error_line(result.stderr)
        assert message.startswith(f"Error: Layer {layer}: {precision} does not fit this model at this layer: the "
                                  f"CPU's own {precision} takes its rows 1.0e+00"), message
        assert message.endswith("Run again with --precision fp32 (nothing was committed: it starts over)."), message
        assert not (tmp_path / "out.h5").exists()  # never passed off as done
        fp32 = run_featdump(*command, cwd=tmp_path)
        assert fp32.returncode == 0, fp32.stderr
    values = featdump.load(tmp_path / "out.h5", layer).features
    assert (np.abs(values).max(axis=1) > 0).all()  # fp32's rows are not zeros


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_float16_storage_underflow_stops_naming_dtype_float32_and_blames_the_storage(images, tmp_path, precision):
    """Values of about 1e-8 stored as float16 would be zeros or subnormals: the storage cast refuses them (under
    fp32, where no proof runs, too) and names --dtype float32, which then stores them."""
    with user_project(tmp_path, "fit_models", MODELS, {}):
        command = ["extract", "-m", "fit_models:tiny", "-l", "pool", "--precision", precision, images]
        result = run_featdump(*command, "--dtype", "float16", tmp_path / "half.h5", cwd=tmp_path)
        message = error_line(result.stderr)
        assert message.startswith("Error: Layer pool: 20 of 20 rows hold values no larger than "), message
        assert "below float16's smallest normal number (6.1e-05): stored as float16 they would be zeros" in message
        assert message.endswith("Run again with --dtype float32 (nothing was committed: it starts over)."), message
        assert not (tmp_path / "half.h5").exists()
        way_out = run_featdump(*command, "--dtype", "float32", tmp_path / "half.h5", cwd=tmp_path)
        assert way_out.returncode == 0, way_out.stderr
    assert (np.abs(featdump.load(tmp_path / "half.h5", "pool").features).max(axis=1) > 0).all()


def test_the_storage_cast_refuses_a_row_below_float16_s_normals_and_keeps_small_values_of_a_large_row():
    from featdump.errors import StorageUnderflow
    from featdump.output.storage import to_storage

    with pytest.raises(StorageUnderflow) as caught:
        to_storage({"a": torch_tensor([[1.0, 0.5, 1e-9], [3e-6, -1e-6, 0.0]])}, {"a": np.dtype("float16")})
    assert caught.value.layer == "a" and "1 of 2 rows" in str(caught.value)
    kept = to_storage({"a": torch_tensor([[1.0, 1e-9, 0.0], [0.0, 0.0, 0.0]])}, {"a": np.dtype("float16")})["a"]
    assert kept.dtype == np.float16 and kept[0, 0] == 1.0 and kept[0, 1] == 0.0  # below its row's rounding
    assert to_storage({"a": torch_tensor([[1e-9]])}, {"a": np.dtype("float32")})["a"][0, 0] == np.float32(1e-9)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_channel_scaled_by_two_percent_is_caught_where_bf16_s_own_error_is_far_below(images, tmp_path):
    """Channel 0 of bn1 (values of both signs: its mean barely moves) scaled by 1.02 in every row, where bf16's own
    relative error of that channel is a few 0.1%: the run stops before a row is written."""
    with faults.injected(faults.channel_scaled({"bn1": 0}, 1.02), {"bn1"}):
        result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "bn1", "--precision", "bf16",
                              images, tmp_path / "out.h5")
    message = error_line(result.stderr)  # the scale test, or the largest element's where a row's peak is channel 0
    assert message.startswith("Error: Layer bn1: the rows of cpu, bf16 are "), message
    assert "in channel 0 against the emulation's" in message or "of a row's largest value from the" in message
    assert not (tmp_path / "out.h5").exists()


@pytest.mark.parametrize("factor", [1.02, 1.0])
def test_the_scale_test_sees_a_two_percent_channel_whose_mean_does_not_move(factor):
    """A channel of zero mean (values of both signs) scaled by 1.02, where the precision's own relative error of it
    is 2^-9: its mean is where the emulation's is, its factor is not, and it moves the channel's values (of root mean
    square 0.3 of a row's largest) by 6e-3 of a row's largest value. Without the fault, noise alone, every channel
    stays within its bound."""
    from featdump.job.proof import _Evidence, _nearest_scale

    rng = np.random.default_rng(0)
    evidence = _Evidence()
    for _ in range(8):
        fp32 = rng.standard_normal((16, 49)) * 0.3
        emulated = fp32 * (1 + rng.standard_normal(fp32.shape) * 2**-9)  # bf16-like rounding of each value
        got = emulated * (1 + rng.standard_normal(fp32.shape) * 2**-9)  # another rounding of the same values
        got[3] *= factor
        evidence.scale.add(got, emulated)
        evidence.emulated_scale.add(emulated, fp32)
        evidence.emulated_largest.append(2**-9)
    value, limit, channel, found = _nearest_scale(evidence, ["bf16"])
    if factor == 1.0:
        assert value < limit
    else:
        assert channel == 3 and found == pytest.approx(1.02, abs=1e-3) and value > limit
        assert value == pytest.approx(0.02 * 0.3, rel=0.1)


@pytest.mark.parametrize("parts", [["compile"], ["cuda", "bf16"]])
def test_a_channel_of_near_zeros_is_not_held_to_its_factor(parts):
    """A channel a thousand times smaller than the row's largest value, whose values a kernel's summation order
    moves by 1% of themselves (its factor 1.0081, as inductor's AVX2 code moved resnet50's layer4), moves no value
    by anything that matters: not a fault, compiled (nothing emulated) or on a GPU in bf16 (its emulation as noisy
    as the run). A 2% factor (the panel's fault) on a channel of ordinary size is one."""
    from featdump.job.proof import _Evidence, _nearest_scale

    rng = np.random.default_rng(1)
    for size, scale, faulty in ((1e-3, 1.0081, False), (0.3, 1.02, True)):
        evidence = _Evidence()
        for _ in range(8):
            fp32 = np.abs(rng.standard_normal((16, 49))) * 0.3
            fp32[5] *= size / 0.3
            emulated = fp32 if parts == ["compile"] else fp32 * (1 + rng.standard_normal(fp32.shape) * 2**-9)
            got = emulated * (1 + rng.standard_normal(fp32.shape) * 1e-7)
            got[5] *= scale
            evidence.scale.add(got, emulated)
            evidence.emulated_scale.add(emulated, fp32)
            evidence.emulated_largest.append(0.0)
        value, limit, channel, factor = _nearest_scale(evidence, parts)
        assert channel == 5 and factor == pytest.approx(scale, abs=1e-4)
        assert (value > limit) == faulty, (size, value, limit)


@pytest.mark.parametrize("rows", [4, 8])
def test_a_channel_of_near_zeros_left_by_a_cancellation_is_not_held_to_its_factor(rows):
    """A pooled layer (one position a channel) whose channel 7 is the difference of two values about 0.3 of a row's
    largest: bf16 leaves it their absolute rounding error, at random (a sound bf16 run of resnet18 moved such a
    channel by 0.79 of itself in `featdump doctor` on Zen 3, where the emulation's own error of it was small) or
    the same in every row (one of inception_v3's `Mixed_6e` channels came out 0.83 times itself). Its factor means
    nothing: no fault. A 2% scale of an ordinary channel is one, over as few rows."""
    from featdump.job.proof import _Evidence, _nearest_scale

    rng = np.random.default_rng(2)
    for channel, case, faulty in ((7, "random", False), (7, "same in every row", False), (3, "2%", True)):
        evidence = _Evidence()
        for _ in range(rows):
            fp32 = np.abs(rng.standard_normal((512, 1))) * 0.3
            fp32[7] = 6e-5 * rng.choice([-1, 1])
            emulated = fp32 * (1 + rng.standard_normal(fp32.shape) * 2**-9)
            emulated[7] = fp32[7] * (1 + rng.standard_normal() * 1e-2)  # its emulation barely moved
            got = emulated * (1 + rng.standard_normal(fp32.shape) * 2**-9)
            if case == "random":  # the run: the inputs' rounding error
                got[7] = emulated[7] + rng.standard_normal() * 0.3 * 2**-9
            if case == "same in every row":
                got[7] = emulated[7] * 0.83
            if case == "2%":
                got[3] *= 1.02
            evidence.scale.add(got, emulated)
            evidence.emulated_scale.add(emulated, fp32)
            evidence.emulated_largest.append(2**-9)
        value, limit, found, _ = _nearest_scale(evidence, ["bf16"])
        assert (value > limit) == faulty, (rows, case, value, limit)
        if faulty:
            assert found == channel


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_two_runs_of_the_same_job_prove_other_rows_each_recorded_with_its_seed(tmp_path):
    folder = tmp_path / "images"
    write_images(folder, {"": 24}, seed=8)
    proofs = []
    for run in range(2):
        output = tmp_path / f"run{run}.h5"
        assert run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer1", "--precision", "bf16", "-b",
                            "4", folder, output).returncode == 0
        with h5py.File(output, "r") as h5file:
            (proof,) = json.loads(h5file.attrs["proof"])
        paths = featdump.load(output, "layer1").paths
        later = plan_sample(8, 0, 4, 24, seed=proof["seed"]).later  # the record names the sample's seed
        assert {paths[position] for position in later} <= set(proof["images"]) and len(proof["images"]) == 8
        proofs.append(proof)
    assert proofs[0]["seed"] != proofs[1]["seed"] and proofs[0]["images"] != proofs[1]["images"]


@pytest.mark.slow  # two whole bf16 runs of avgpool: slow where the CPU has no native bf16 (make test-all runs them)
@pytest.mark.parametrize("seed", [75, 116])
def test_a_sound_run_is_not_stopped_by_a_sample_whose_channel_means_moved_by_the_precision_alone(tmp_path, seed,
                                                                                                monkeypatch):
    """These two samples of a sound bf16 run (of the 200 drawn, the two whose avgpool channel 456 moved 2.4e-3 and
    2.6e-3 from its emulation) stopped it when a channel's mean could move 1e-3 beyond its noise."""
    from featdump.job import sampling

    write_images(tmp_path / "images", {"": 40}, seed=8)
    monkeypatch.setattr(sampling.secrets, "randbits", lambda bits: seed)
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "--precision", "bf16", "-b",
                          "4", tmp_path / "images", tmp_path / "out.h5")
    assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "out.h5", "r") as h5file:
        assert json.loads(h5file.attrs["proof"])[0]["seed"] == seed


def test_proof_0_turns_off_the_sample_but_not_the_fp16_watch(images, tmp_path):
    with user_project(tmp_path, "proof_models", MODELS, {}):
        result = run_featdump("extract", "-m", "proof_models:overflowing", "-l", "conv", "--precision", "fp16",
                              "--proof", "0", images, tmp_path / "fp16.h5", cwd=tmp_path)
    assert error_line(result.stderr).startswith("Error: Layer conv: the rows of cpu, fp16 are non-finite (inf or "
                                                "NaN) where the reference path's are finite")
    assert not (tmp_path / "fp16.h5").exists()


def test_the_storage_cast_refuses_only_what_it_made_non_finite():
    from featdump.errors import StorageOverflow
    from featdump.output.storage import to_storage

    rows = {"a": torch_tensor([[1.0, float("inf"), 7e4], [2.0, 3.0, -1e5]])}
    with pytest.raises(StorageOverflow) as caught:
        to_storage(rows, {"a": np.dtype("float16")})
    assert caught.value.layer == "a" and caught.value.largest == 1e5 and "2 value(s)" in str(caught.value)
    kept = to_storage({"a": torch_tensor([[1.0, float("inf"), float("nan")]])}, {"a": np.dtype("float16")})["a"]
    assert kept.dtype == np.float16 and np.isinf(kept[0, 1]) and np.isnan(kept[0, 2])  # the model's own
    assert to_storage(rows, {"a": np.dtype("float32")})["a"].dtype == np.float32
    wide = torch_tensor([[3e38, -65504.0, 1.5]])  # bf16 rows stored as float32: widened exactly, never refused
    assert np.array_equal(to_storage({"a": wide.bfloat16()}, {"a": np.dtype("float32")})["a"],
                          wide.bfloat16().float().numpy())
    with pytest.raises(StorageOverflow):  # bf16 holds what float16 does not
        to_storage({"a": wide.bfloat16()}, {"a": np.dtype("float16")})


def torch_tensor(values):
    import torch

    return torch.tensor(values, dtype=torch.float32)


@pytest.mark.parametrize("factory", ["allocator_fails", "memory_error"])
def test_a_cpu_allocation_failure_is_one_line_naming_the_batch_size_and_the_resume(tmp_path, factory):
    with user_project(tmp_path, "cpu_oom_models", MODELS, {"": 70}) as folder:
        (folder / "marker").touch()
        command = ["extract", "-m", f"cpu_oom_models:{factory}", "-l", "pool", folder / "images", folder / "out.h5"]
        env = {**__import__("os").environ, "OOM_MARKER": str(folder / "marker")}
        failed = run_featdump(*command, env=env, cwd=folder)
        message = error_line(failed.stderr)
        assert message.startswith("Error: Out of memory on cpu at --batch-size 64 ("), message
        assert message.endswith("run the same command with a smaller --batch-size (e.g. 32) to resume."), message
        resumed = run_featdump(*command[:5], "--batch-size", "32", *command[5:], env=env, cwd=folder)
        assert resumed.returncode == 0 and "resumed at image 64" in resumed.stderr, resumed.stderr


@pytest.mark.slow  # bf16 without native kernels on a Zen 3
def test_a_panel_cell_has_no_false_alarm_and_catches_every_fault_kind(tmp_path):
    """benchmarks.proof_panel's cell of its smallest model in bf16, seed 0: the sound run finishes, each kind of
    fault injected into the deepest layer's and the output's rows (a 2% channel scale into the shallow layer's)
    stops the run with the proof's line. The panel's other models (resnet50, mobilenet_v3_large) and seeds are the
    benchmark's (`python -m benchmarks.proof_panel`), not the suite's."""
    model = "regnet_y_400mf"
    from benchmarks import proof_panel as panel

    images = panel.write_images(tmp_path / "images")
    outcome, _, entry = panel.run(model, images, tmp_path / "run.h5", 0, tmp_path / "cache", precision="bf16")
    assert outcome == "finished", (model, outcome)
    assert panel.margin(entry)[0] < 1.0
    axes = panel.channel_axes(tmp_path / "run.h5")
    for fault in panel.FAULTS:
        with faults.injected(panel.fault_of(fault, axes), panel.faulty_layers(model, fault)):
            outcome, _, _ = panel.run(model, images, tmp_path / "fault.h5", 0, tmp_path / "cache",
                                      precision="bf16")
        assert outcome.startswith("Layer ") and "Run again with --precision fp32" in outcome, (model, fault)


def test_the_precision_s_fit_is_judged_on_the_rows_every_run_proves_not_on_the_draw():
    """A drawn row whose bf16 emulation is beyond the ceiling (0.1) does not stop the run (it is held to its own
    emulation); the same row among the first batch's, which every run of the job proves, does: no draw decides."""
    from featdump.errors import ProofFailed
    from featdump.job.proof import Proof, _Evidence

    def proof(fixed: list[bool]) -> Proof:
        made = Proof(None, None, ["bf16"], "cpu, bf16", None, False, "float32")
        made.evidence["layer4"] = _Evidence(largest=[0.01, 0.01, 0.3], whole=[0.01, 0.01, 0.25],
                                            emulated_largest=[0.01, 0.01, 0.2], emulated_whole=[0.01, 0.01, 0.2],
                                            fixed=fixed)
        return made

    proof([True, True, False])._judge()  # the far row was drawn: within 3x its own emulation
    assert proof([True, True, False]).judged("layer4").emulated == 0.01
    with pytest.raises(ProofFailed, match="bf16 does not fit this model at this layer"):
        proof([True, True, True])._judge()


def test_every_run_of_a_job_proves_the_same_rows_of_its_first_batch():
    from featdump.job.proof import Proof
    from featdump.job.sampling import plan_sample

    chosen = []
    for seed in (1, 2):
        made = Proof(None, None, ["bf16"], "cpu, bf16", plan_sample(8, 0, 16, 64, seed=seed), False, "float32")
        chosen.append(made._sampled_rows(list(range(16))))
    assert chosen[0][0] == chosen[1][0] == [0, 15]  # a quarter of 8, spread evenly over the batch: the same
    assert chosen[0][1] == chosen[1][1] == []  # the drawn ones lie after the first batch
