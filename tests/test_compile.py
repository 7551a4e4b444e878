"""--compile: the pruned graph compiled with inductor equals eager (in-place ops and reused modules included), a
model that does not compile runs eager, the compile cache is reused, and the memory layout is chosen per model.
Small models: CI has 2 cores."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from torchvision.models import VisionTransformer, resnet18

from featdump.forward.memory_format import choose_memory_format
from tests.makers.tiny_models import MODELS  # the text each test writes as its factory module

from .helpers import REPO, featdump_env, run_featdump, start_featdump, user_project

# The compiled path's tests run with oneDNN and ATen held to AVX2, whatever this CPU has: a tolerance tuned on
# AVX-512 that cries wolf where inductor's AVX2 code sums in another order fails here, on any CI machine.
HELD_TO_AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
LAYERS = {"tiny_models:cnn": "bn,relu:1,conv2,relu:2,pool",
          "tiny_models:vit": "encoder.layers.encoder_layer_0,encoder.ln"}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The models above and 6 images: batches of 4 and 2, so the last batch is short."""
    with user_project(tmp_path_factory.mktemp("compile"), "tiny_models", MODELS, {"": 6}) as folder:
        yield folder


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """An inductor cache holding only its checks of this CPU's vector instruction sets (a C++ build of each, 10-15 s
    on 2 cores, made in every new cache folder): each test's --compile-cache starts as a copy, as a user's second
    cache on the same machine would find them; what the tests assert, the packages, is made in each."""
    folder = tmp_path_factory.mktemp("probed")
    check = "from torch._inductor.cpu_vec_isa import valid_vec_isa_list; valid_vec_isa_list()"
    subprocess.run([sys.executable, "-c", check], check=True, timeout=600,
                   env=featdump_env(TORCHINDUCTOR_CACHE_DIR=str(folder), **HELD_TO_AVX2))
    return folder


def new_cache(probed, folder):
    """FOLDER, a new --compile-cache with inductor's instruction-set checks in it (`probed`)."""
    shutil.copytree(probed, folder)
    return folder


def extract(project, model: str, output, *options, **environment):
    env = featdump_env(PYTHONPATH=f"{project}{os.pathsep}{REPO}", TORCH_LOGS="recompiles",
                       **{**HELD_TO_AVX2, **environment})
    result = run_featdump("-v", "extract", "-m", model, "-w", "none", "-l", LAYERS.get(model, "pool"), "-b", "4",
                          *options, project / "images", output, env=env, process=True)  # a fresh process each:
    assert result.returncode == 0, result.stderr  # dynamo's and inductor's in-memory caches are per process
    with h5py.File(output, "r") as h5file:
        features = {name: h5file["features"][name][:] for name in h5file.attrs["layers"]}
        return features, str(h5file.attrs["compiled"]), result.stderr


def assert_compiled_equals_eager(eager: dict, compiled: dict, note: str, log: str, output) -> None:
    """A run built its AOTInductor package once (the short last batch padded), proved it against eager fp32 held to
    AVX2, and stored what eager stores, to 1e-4 of each layer's largest value."""
    assert note.startswith("yes: AOTInductor package"), note
    assert "Built the compiled forward in" in log and "compiled graph capture" in log
    assert "Recompiling" not in log  # the short last batch is padded: one compile per run
    with h5py.File(output, "r") as h5file:  # proved against eager fp32, held to AVX2
        (proof,) = json.loads(h5file.attrs["proof"])
    assert proof["configuration"] == "cpu, compile" and proof["proved"], proof
    assert all(layer["used"] < 1 for layer in proof["layers"].values()), proof
    for name, values in eager.items():
        scale = max(float(np.abs(values).max()), 1e-6)
        assert float(np.abs(compiled[name] - values).max()) <= 1e-4 * scale, name


@pytest.mark.slow  # inductor compiles for 10-20 s on 2 cores
def test_a_compiled_vit_equals_eager(project, probed, tmp_path):
    """The tiny ViT's compiled run (the CNN's, with its in-place ops and reused module, is the first run of
    test_later_runs_load_the_package_and_a_damaged_one_is_built_anew)."""
    eager, eager_note, _ = extract(project, "tiny_models:vit", tmp_path / "eager.h5")
    compiled, note, log = extract(project, "tiny_models:vit", tmp_path / "compiled.h5", "--compile",
                                  "--compile-cache", new_cache(probed, tmp_path / "cache"))
    assert eager_note == "no"
    assert_compiled_equals_eager(eager, compiled, note, log, tmp_path / "compiled.h5")


@pytest.mark.slow
def test_later_runs_load_the_package_and_a_damaged_one_is_built_anew(project, probed, tmp_path):
    """The CNN's package through its life: the first compiled run builds it and equals eager, the next loads it, a
    damaged one is removed (and so built again, as the first run built a missing one), and a factory whose code
    changed gets a package of its own."""
    cache = new_cache(probed, tmp_path / "shared-cache")
    eager, eager_note, _ = extract(project, "tiny_models:cnn", tmp_path / "eager.h5")
    assert eager_note == "no"
    seconds, features = [], []
    for run in range(2):
        values, note, log = extract(project, "tiny_models:cnn", tmp_path / f"run{run}.h5", "--compile",
                                    "--compile-cache", cache)
        if run == 0:
            assert_compiled_equals_eager(eager, values, note, log, tmp_path / "run0.h5")
        verb = "Built" if run == 0 else "Loaded"
        assert f"{verb} the compiled forward in" in log and note.startswith("yes: AOTInductor package"), log
        assert ("found for this traced graph: no export" in log) == (run == 1), log  # the export ran once
        seconds.append(float(note.split(" in ")[1].split(" s")[0]))
        features.append(values)
    assert seconds[1] < seconds[0] / 2, seconds
    for name, values in features[0].items():
        np.testing.assert_array_equal(features[1][name], values)
    (package,) = (cache / "aoti").glob("*.pt2")
    package.write_bytes(b"not a package")  # damaged (a disk fault, a copy cut short)
    values, note, log = extract(project, "tiny_models:cnn", tmp_path / "run2.h5", "--compile", "--compile-cache",
                                cache)
    assert "no ahead-of-time package" in log and note.startswith("yes: inductor"), log
    assert not package.exists()  # removed: the next run builds it again, as run 0 built the missing one
    # The factory's code changed between two runs (its BatchNorm's eps): a new package, equal to the new eager.
    eager, _, _ = extract(project, "tiny_models:cnn", tmp_path / "eager-changed.h5", TINY_BN_EPS="1e-4")
    compiled, note, log = extract(project, "tiny_models:cnn", tmp_path / "changed.h5", "--compile", "--compile-cache",
                                  cache, TINY_BN_EPS="1e-4")
    assert "Built the compiled forward in" in log and note.startswith("yes: AOTInductor package"), log
    (changed,) = (cache / "aoti").glob("*.pt2")  # the damaged one was removed: this is the new key's own
    assert changed.name != package.name
    for name, values in eager.items():
        scale = max(float(np.abs(values).max()), 1e-6)
        assert float(np.abs(compiled[name] - values).max()) <= 1e-5 * scale, name


@pytest.mark.slow
def test_an_array_s_tasks_sharing_a_cache_build_the_package_once(project, probed, tmp_path):
    cache = new_cache(probed, tmp_path / "shared-cache")
    env = featdump_env(PYTHONPATH=f"{project}{os.pathsep}{REPO}")
    tasks = [start_featdump("-v", "extract", "-m", "tiny_models:cnn", "-w", "none", "-l", "pool", "-b", "4",
                            "--compile", "--compile-cache", cache, "--shard", f"{index}/2", project / "images",
                            tmp_path / "out.h5", env=env) for index in range(2)]
    logs = [task.communicate(timeout=600)[1] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], logs
    built = [log for log in logs if "Built the compiled forward in" in log]
    loaded = [log for log in logs if "Loaded the compiled forward in" in log]
    assert len(built) == 1 and len(loaded) == 1, logs
    assert len(list((cache / "aoti").glob("*.pt2"))) == 1 and not list((cache / "aoti").glob(".*partial*"))


@pytest.mark.parametrize("model, why", [
    ("tiny_models:uncompilable", "it does not compile (Unsupported"),
    ("tiny_models:untraceable", "the model does not trace to a graph"),
])
@pytest.mark.slow
def test_a_model_that_does_not_compile_runs_eager_and_says_why(project, tmp_path, model, why):
    """It ran eager, and its fp32 proof says it is the reference path itself, with no bound of 0 that fp32's
    rounding would exceed infinitely."""
    eager, _, _ = extract(project, model, tmp_path / "eager.h5")
    features, note, log = extract(project, model, tmp_path / "out.h5", "--compile")
    assert f"--compile: running eager, {why}" in log
    assert note.startswith(f"no: {why}")
    np.testing.assert_array_equal(features["pool"], eager["pool"])
    with h5py.File(tmp_path / "out.h5", "r") as h5file:
        (proof,) = json.loads(h5file.attrs["proof"])
    assert proof == {"configuration": "cpu", "reference": proof["reference"], "proved": False,
                     "why": "the run is the reference path"}, proof


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_bf16_compile_that_fell_back_to_eager_is_recorded_as_eager_in_the_proof(project, tmp_path):
    """--compile --precision bf16 on a model that does not trace: it ran eager, and its proof says so: "cpu,
    bf16", proved (fp32's: test_a_model_that_does_not_compile_runs_eager_and_says_why)."""
    _, note, _ = extract(project, "tiny_models:untraceable", tmp_path / "out.h5", "--compile", "--precision", "bf16")
    assert note.startswith("no: the model does not trace to a graph")
    with h5py.File(tmp_path / "out.h5", "r") as h5file:
        (proof,) = json.loads(h5file.attrs["proof"])
    assert proof["configuration"] == "cpu, bf16" and proof["proved"], proof["configuration"]
    assert all(layer["used"] < 1 for layer in proof["layers"].values()), proof


def test_memory_format_is_chosen_per_model():
    assert choose_memory_format(resnet18(), (3, 224, 224))[0] == torch.channels_last
    tiny_vit = VisionTransformer(image_size=224, patch_size=32, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64)
    assert choose_memory_format(tiny_vit, (3, 224, 224)) == (torch.contiguous_format,
                                                             "1 Conv2d layer(s): not a convolutional network")
    pairs = (2, 3, 64, 80)  # RAFT's frame pairs: a 5-D batch, which channels_last cannot lay out
    assert choose_memory_format(resnet18(), pairs) == (torch.contiguous_format,
                                                       "its input (2, 3, 64, 80) is no (C, H, W) image")


def exported_key(eps: float) -> str:
    from featdump.forward.ahead import export, package_key

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, eps=eps)).eval()
    inputs = torch.randn(2, 3, 16, 16)
    return package_key(export(torch.fx.symbolic_trace(model), inputs), inputs, {"model": "factory:net"})


def test_the_package_key_follows_what_the_export_sees():
    """Same name, same weights, another BatchNorm eps: another package (the state dict alone is the same)."""
    assert exported_key(1e-5) == exported_key(1e-5)
    assert exported_key(1e-5) != exported_key(1e-4)


def traced_key(eps: float, scale: float = 1.0) -> str:
    from featdump.forward.ahead import graph_key

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, eps=eps)).eval()
    with torch.no_grad():
        model[0].weight.mul_(scale)
    return graph_key(torch.fx.symbolic_trace(model), torch.randn(2, 3, 16, 16), {"model": "factory:net"})


def test_the_traced_graph_s_key_sees_a_module_s_settings_and_weights():
    """The key that lets a later run skip the export changes with a BatchNorm's eps and with a weight, as the
    export's own key does; the same model gives the same key."""
    assert traced_key(1e-5) == traced_key(1e-5)
    assert traced_key(1e-5) != traced_key(1e-4)
    assert traced_key(1e-5) != traced_key(1e-5, scale=1.5)


def test_the_first_batch_check_is_tight_in_float32():
    from featdump.forward.compiling import relative_difference, tolerance

    assert tolerance("fp32") == 1e-5 and tolerance("bf16") == 5e-2 and tolerance("fp16") == 1e-2
    eager = {"bn": torch.ones(2, 8) * 10}
    assert relative_difference({"bn": eager["bn"] + 5e-4}, eager) > tolerance("fp32")  # eps 1e-5 -> 1e-4: 5e-5


@pytest.mark.slow  # one AOTInductor build
def test_compiled_bf16_is_accepted_then_loaded_and_a_rejected_package_is_kept_not_rebuilt(project, probed,
                                                                                          tmp_path):
    """bf16 compiled and eager differ by about 1e-2 (benchmarks/precision.py): the check allows bf16's rounding, so
    the package is built once and loaded by the next run. A package marked as failing the check (as a run marks
    it) is neither removed nor built again: later runs are eager at once, saying why."""
    cache = new_cache(probed, tmp_path / "cache")
    eager, _, _ = extract(project, "tiny_models:cnn", tmp_path / "eager.h5", "--precision", "bf16")
    for run, verb in enumerate(("Built", "Loaded")):
        compiled, note, log = extract(project, "tiny_models:cnn", tmp_path / f"run{run}.h5", "--compile",
                                      "--compile-cache", cache, "--precision", "bf16")
        assert f"{verb} the compiled forward in" in log and note.startswith("yes: AOTInductor package"), log
        for name, values in eager.items():
            assert float(np.abs(compiled[name] - values).max()) <= 5e-2 * float(np.abs(values).max()), name
    (package,) = (cache / "aoti").glob("*.pt2")
    package.with_suffix(".rejected").write_text("it differs from eager by 3.0e-01 of a layer's largest value\n")
    _, note, log = extract(project, "tiny_models:cnn", tmp_path / "run2.h5", "--compile", "--compile-cache", cache,
                           "--precision", "bf16")
    assert f"--compile: running eager, its package {package.name} failed the check against eager before" in log
    assert note.startswith("no: its package") and package.exists()
    assert "Built the compiled forward" not in log and "Compiled the forward" not in log
    with h5py.File(tmp_path / "run2.h5", "r") as h5file:  # a forced package failure: what ran, eager, is recorded
        assert json.loads(h5file.attrs["proof"])[0]["configuration"] == "cpu, bf16"
