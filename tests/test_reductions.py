"""Reductions on the device: per-layer rules, channels, sparse random projections and PCA, exact against a
recomputation from the whole activations, stable across batch sizes, resumes and shards."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

import featdump
from featdump.errors import UsageProblem
from featdump.faces.cli import main
from featdump.job.runner import extract
from featdump.output.merge import merge
from featdump.reductions.pca import fit
from featdump.reductions.srp import nonzeros_per_input, srp_matrix

from .helpers import CrashAfterFirstBatch, images_fixture, read_features, run_featdump, settings_for, write_images

images = images_fixture({"a": 32, "b": 32}, seed=5)  # 64 images in two class folders


@pytest.fixture(scope="module")
def whole(images, tmp_path_factory):
    """resnet18 (random, seed 0) layer2 and layer3 of the 64 images, whole (flattened)."""
    output = tmp_path_factory.mktemp("whole") / "whole.h5"
    extract(settings_for(images, output, layers=("layer2", "layer3"), reduce=("flatten",), batch_size=16))
    return read_features(output)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_srp_rows_are_the_rebuilt_matrix_applied_and_keep_pairwise_distances(images, whole, tmp_path):
    output = tmp_path / "srp.h5"
    extract(settings_for(images, output, layers=("layer2",), reduce=("srp:1024",), batch_size=16))
    projected = read_features(output)["layer2"]
    full = whole["layer2"]
    assert full.shape == (64, 100352) and projected.shape == (64, 1024)
    matrix = srp_matrix(0, "layer2", 100352, 1024)
    rebuilt = (matrix.t() @ torch.from_numpy(full).t()).t().numpy()
    np.testing.assert_allclose(projected, rebuilt, rtol=1e-4, atol=1e-4 * np.abs(rebuilt).max())
    assert matrix._nnz() == 100352 * nonzeros_per_input(100352, 1024)  # density c/K, about 1/sqrt(D)
    pairs = [(i, j) for i in range(64) for j in range(i + 1, 64)]
    ratios = np.array([np.linalg.norm(projected[i] - projected[j]) / np.linalg.norm(full[i] - full[j])
                       for i, j in pairs])
    assert np.mean(np.abs(ratios - 1) <= 0.10) >= 0.95, np.percentile(ratios, [2.5, 50, 97.5])
    with h5py.File(output) as h5file:
        attrs = h5file["features/layer2"].attrs
        assert attrs["reduction"] == "srp:1024" and attrs["srp_input_dim"] == 100352 and attrs["srp_seed"] == 0
        assert attrs["srp_rebuild"] == "featdump.srp_matrix(0, 'layer2', 100352, 1024)"
        rebuilt_as_recorded = eval(attrs["srp_rebuild"], {"featdump": featdump})  # the recipe runs as written
        assert torch.equal(rebuilt_as_recorded.to_dense(), matrix.to_dense())
    assert featdump.load(output, "layer2").reduction == "srp:1024"


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_count_sketch_is_srp_with_one_nonzero_per_input_and_keeps_distances(images, whole, tmp_path):
    output = tmp_path / "sketch.h5"
    extract(settings_for(images, output, layers=("layer2",), reduce=("countsketch:1024:3",), batch_size=16))
    sketched, full = read_features(output)["layer2"], whole["layer2"]
    matrix = srp_matrix(3, "layer2", 100352, 1024, "countsketch")
    dense = matrix.to_dense()
    assert ((dense != 0).sum(dim=1) == 1).all() and torch.equal(dense.abs().max(dim=1).values, torch.ones(100352))
    rebuilt = (matrix.t() @ torch.from_numpy(full).t()).t().numpy()
    np.testing.assert_allclose(sketched, rebuilt, rtol=1e-4, atol=1e-4 * np.abs(rebuilt).max())
    with h5py.File(output) as h5file:
        attrs = h5file["features/layer2"].attrs
        assert attrs["reduction"] == "countsketch:1024:3" and attrs["srp_nonzeros_per_input"] == 1
        recipe = eval(attrs["srp_rebuild"], {"featdump": featdump})  # the recipe runs as written
        assert torch.equal(recipe.to_dense(), dense)
    pairs = [(i, j) for i in range(64) for j in range(i + 1, 64)]
    ratios = np.array([np.linalg.norm(sketched[i] - sketched[j]) / np.linalg.norm(full[i] - full[j])
                       for i, j in pairs])
    srp = srp_matrix(3, "layer2", 100352, 1024).to_dense()
    projected = full @ srp.numpy()
    srp_ratios = np.array([np.linalg.norm(projected[i] - projected[j]) / np.linalg.norm(full[i] - full[j])
                           for i, j in pairs])
    assert abs(np.mean(ratios ** 2) - 1) < 0.05  # kept in expectation
    assert np.std(ratios) <= 1.5 * np.std(srp_ratios), (np.std(ratios), np.std(srp_ratios))  # about as tight
    assert np.mean(np.abs(ratios - 1) <= 0.10) >= 0.95, np.percentile(ratios, [2.5, 50, 97.5])


def test_srp_matrix_is_a_pure_function_of_seed_layer_and_sizes():
    first, again = srp_matrix(0, "layer2", 5000, 256), srp_matrix(0, "layer2", 5000, 256)
    assert torch.equal(first.indices(), again.indices()) and torch.equal(first.values(), again.values())
    assert not torch.equal(first.indices(), srp_matrix(1, "layer2", 5000, 256).indices())
    assert not torch.equal(first.indices(), srp_matrix(0, "layer3", 5000, 256).indices())
    c = nonzeros_per_input(5000, 256)
    assert c == round(256 / math.sqrt(5000)) == 4
    assert torch.allclose(first.values().abs(), torch.tensor(c ** -0.5))
    dense = first.to_dense()
    assert ((dense != 0).sum(dim=1) == c).all()  # every input feeds exactly c distinct outputs
    # the squared norm is kept in expectation: over many random vectors, on average
    x = torch.randn(2000, 5000, generator=torch.Generator().manual_seed(0))
    ratio = ((x @ dense).square().sum(1) / x.square().sum(1)).mean()
    assert abs(ratio.item() - 1) < 0.01


@pytest.mark.slow  # four runs and a kill
def test_srp_and_per_layer_rules_are_the_same_whatever_the_batch_size_and_after_a_resume(images, tmp_path):
    """Rows equal within 1e-5 relative (batch sizes change the convolutions' summation order, not the rows)."""
    rules = ("avgpool", "layer2=srp:256", "layer3=srp:128:7", "layer4=channels:10-19")
    base = settings_for(images, tmp_path / "b16.h5", layers=("layer2", "layer3", "layer4"), reduce=rules,
                        batch_size=16, num_workers=None)
    extract(base)
    extract(dataclasses.replace(base, output=tmp_path / "b5.h5", batch_size=5))
    resumed = dataclasses.replace(base, output=tmp_path / "resumed.h5", batch_size=8)
    with pytest.raises(RuntimeError, match="simulated crash"):
        extract(resumed, CrashAfterFirstBatch())
    extract(resumed)
    expected = read_features(tmp_path / "b16.h5")
    assert expected["layer2"].shape == (64, 256) and expected["layer3"].shape == (64, 128)
    assert expected["layer4"].shape == (64, 10, 7, 7)
    for other in ("b5.h5", "resumed.h5"):
        for name, values in read_features(tmp_path / other).items():
            np.testing.assert_allclose(values, expected[name], rtol=1e-5, atol=1e-5 * np.abs(expected[name]).max())


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_channels_are_the_slice_of_the_whole_output(images, tmp_path):
    whole_map, part = tmp_path / "whole.h5", tmp_path / "part.h5"
    extract(settings_for(images, whole_map, layers=("layer4",), batch_size=32))
    extract(settings_for(images, part, layers=("layer4",), reduce=("channels:3-5",), batch_size=32, dtype="float16"))
    np.testing.assert_allclose(read_features(part)["layer4"], read_features(whole_map)["layer4"][:, 3:6],
                               rtol=1e-3, atol=1e-3)


@pytest.mark.slow  # three runs and a merge
def test_shards_of_a_projected_job_merge_to_the_single_run(images, tmp_path):
    single = settings_for(images, tmp_path / "one.h5", layers=("layer3", "avgpool"),
                          reduce=("layer3=srp:64", "avgpool=pca:4"), pca_fit="20", batch_size=16)
    extract(single)
    for index in range(2):
        extract(dataclasses.replace(single, output=tmp_path / "sharded.h5", shard=f"{index}/2"))
    assert not (tmp_path / "sharded.h5.pca.lock").exists()
    merge(tmp_path / "sharded.h5")
    one, merged = read_features(tmp_path / "one.h5"), read_features(tmp_path / "sharded.h5")
    for name in one:
        np.testing.assert_allclose(merged[name], one[name], rtol=1e-5, atol=1e-5)
    with h5py.File(tmp_path / "sharded.h5") as h5file:
        assert h5file["features/layer3"].attrs["reduction"] == "srp:64"
        assert h5file["pca/avgpool/components"].shape == (4, 512)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_pca_equals_an_exact_pca_of_the_fit_set(images, whole, tmp_path):
    output = tmp_path / "pca.h5"
    extract(settings_for(images, output, layers=("layer3",), reduce=("pca:6",), pca_fit="24", batch_size=16))
    fit_set = whole["layer3"][:24].astype(np.float64)
    mean = fit_set.mean(axis=0)
    _, singular, axes = np.linalg.svd(fit_set - mean, full_matrices=False)
    loaded = featdump.load(output, "layer3")
    stored = loaded.pca_fit
    assert loaded.reduction == "pca:6" and stored["fitted_on"].startswith("the first 24 images of")
    np.testing.assert_allclose(stored["mean"], mean, rtol=1e-5, atol=1e-6 * np.abs(mean).max())
    correlations = [abs(np.corrcoef(stored["components"][k], axes[k])[0, 1]) for k in range(6)]
    assert min(correlations[:4]) >= 0.999, correlations
    np.testing.assert_allclose(stored["explained_variance"], singular[:6] ** 2 / 23, rtol=0.01)
    projected = (whole["layer3"] - stored["mean"]) @ stored["components"].T
    np.testing.assert_allclose(loaded.features, projected, rtol=1e-4, atol=1e-4 * np.abs(projected).max())
    assert (tmp_path / "pca.h5.pca.h5").exists() and not (tmp_path / "pca.h5.pca-stage.h5").exists()


@pytest.mark.parametrize("rows, dim", [(60, 500), (400, 30)])  # the Gram and the covariance paths
def test_a_fit_in_small_blocks_equals_numpys_svd(tmp_path, rows, dim):
    generator = np.random.default_rng(0)
    values = (generator.standard_normal((rows, dim)) * np.linspace(5, 0.1, dim)).astype(np.float32)
    with h5py.File(tmp_path / "rows.h5", "w") as h5file:
        dataset = h5file.create_dataset("rows", data=values, chunks=(7, dim))
        made = fit(dataset, rows, 5, "test", limit=16 * 1024**2 if dim == 30 else 3 * 1024**2)
    centred = values.astype(np.float64) - values.mean(axis=0)
    _, singular, axes = np.linalg.svd(centred, full_matrices=False)
    assert made.method == ("gram" if dim > rows else "covariance")
    for k in range(5):
        assert abs(np.dot(made.components[k], axes[k])) > 0.999999
    np.testing.assert_allclose(made.explained_variance, singular[:5] ** 2 / (rows - 1), rtol=1e-9)
    assert made.total_variance == pytest.approx((centred ** 2).sum() / (rows - 1))


class CrashInSecondPass(CrashAfterFirstBatch):
    """Crashes after the first batch of the second pass over images (the projection after the PCA fit)."""

    passes = 0

    def start(self, total, done, noun="image"):
        self.passes += 1

    def advance(self, images):
        if self.passes == 2:
            super().advance(images)


@pytest.mark.slow  # two kills; the quick suite keeps the kill after staging
def test_a_kill_during_the_fit_and_during_the_projection_resume_to_the_same_rows(images, tmp_path):
    settings = settings_for(images, tmp_path / "straight.h5", layers=("layer4",), reduce=("pca:5",), pca_fit="32",
                            batch_size=8, num_workers=None)
    extract(settings)
    expected = read_features(tmp_path / "straight.h5")["layer4"]
    for name, crash in (("fit", CrashAfterFirstBatch()), ("projection", CrashInSecondPass())):
        resumed = dataclasses.replace(settings, output=tmp_path / f"{name}.h5")
        with pytest.raises(RuntimeError, match="simulated crash"):
            extract(resumed, crash)
        left = tmp_path / (f"{name}.h5.pca-stage.h5.partial" if name == "fit" else f"{name}.h5.partial")
        assert left.exists()
        extract(resumed)
        np.testing.assert_allclose(read_features(resumed.output)["layer4"], expected, rtol=1e-5, atol=1e-5)


class CrashAfterStaging(CrashAfterFirstBatch):
    """Lets the fit images' activations be staged whole, then crashes before the fit (a kill between the two)."""

    def advance(self, images):
        pass

    def close(self):
        raise RuntimeError("simulated crash")


@pytest.mark.slow  # a fit, a kill after staging, a resume and an --overwrite
def test_a_kill_after_staging_resumes_the_fit_and_overwrite_starts_over(images, tmp_path):
    settings = settings_for(images, tmp_path / "straight.h5", layers=("layer4",), reduce=("pca:5",), pca_fit="24",
                            batch_size=8)
    expected = read_features(extract(settings).output)["layer4"]
    for overwrite in (False, True):
        killed = dataclasses.replace(settings, output=tmp_path / f"killed-{overwrite}.h5")
        with pytest.raises(RuntimeError, match="simulated crash"):
            extract(killed, CrashAfterStaging())
        staged = tmp_path / f"killed-{overwrite}.h5.pca-stage.h5"
        assert staged.exists() and not (tmp_path / f"killed-{overwrite}.h5.pca.h5").exists()
        extract(dataclasses.replace(killed, overwrite=overwrite))
        np.testing.assert_allclose(read_features(killed.output)["layer4"], expected, rtol=1e-5, atol=1e-5)
        assert not staged.exists() and not Path(f"{staged}.partial").exists()


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_fit_refused_after_staging_leaves_nothing_and_the_record_counts_the_images_fitted(tmp_path):
    folder = tmp_path / "images"
    write_images(folder, {"": 8}, seed=2)
    broken = sorted(folder.iterdir())[:3]
    for path in broken:
        path.write_bytes(b"not an image")
    command = ["extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "-j", "0", "--pca-fit", "8",
               str(folder), str(tmp_path / "out.h5")]
    refused = CliRunner().invoke(main, [*command, "--reduce", "pca:6"])
    assert refused.exit_code == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        "Error: --reduce pca:6 needs more fit images than components: the fit set has 5 that could be read (3 "
        "skipped) (--pca-fit); use at least 7, or a smaller K.")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["images"]  # no staging, no lock, no output
    result = CliRunner().invoke(main, [*command, "--reduce", "pca:4"])
    assert result.exit_code == 0, result.stderr
    with h5py.File(tmp_path / "out.h5") as h5file:
        fitted = h5file["pca/avgpool"]
        assert fitted.attrs["images"] == 5 and h5file["features/avgpool"].attrs["pca_fit_images"] == 5
        assert fitted.attrs["fitted_on"] == f"the first 8 images of {folder}, 3 of them skipped"
        assert list(fitted["skipped_paths"].asstr()[:]) == [path.name for path in broken]
        assert all("cannot identify image file" in why for why in fitted["skipped_reasons"].asstr()[:])


def test_rules_the_most_specific_wins_and_config_tables(images, tmp_path):
    config = tmp_path / "job.toml"
    config.write_text('model = "resnet18"\nweights = "none"\nlayers = ["layer1.*", "layer2.0"]\nbatch_size = 32\n'
                      '[reduce]\ndefault = "avgpool"\n"layer1.*" = "maxpool"\n"layer1.1" = "flatten"\n')
    result = run_featdump("extract", "--config", config, "-j", "0", images, tmp_path / "out.h5")
    assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "out.h5") as h5file:
        kept = {name: h5file["features"][name].attrs["reduction"] for name in h5file.attrs["layers"]}
    assert kept == {"layer1.0": "maxpool", "layer1.1": "flatten", "layer2.0": "avgpool"}
    info = run_featdump("info", tmp_path / "out.h5")
    assert "layer1.1: (200704,) float32, flatten" in info.stdout


@pytest.mark.parametrize("arguments, message", [
    (["--reduce", "srp:0"], "'reduce' must give srp:K a number of components K of at least 1, not 'srp:0'."),
    (["--reduce", "srp:x"], "'reduce' must give srp:K a number of components K of at least 1, not 'srp:x'."),
    (["--reduce", "layer4=mean"], "'reduce' must be REDUCTION or PATTERN=REDUCTION, REDUCTION one of none"),
    (["--reduce", "pca:4"], "--reduce pca:K needs --pca-fit N (the first N images) or --pca-fit PATH"),
    (["--reduce", "pca:8", "--pca-fit", "5"], "--reduce pca:8 needs more fit images than components: the fit set "
                                              "has 5 (--pca-fit); use at least 9, or a smaller K."),
    (["--reduce", "pca:2", "--pca-fit", "500"], "--pca-fit 500:"),
    (["--reduce", "avgpool", "--reduce", "layer9=srp:4"], "--reduce 'layer9=srp:4' applies to none of the selected"),
    (["--reduce", "avgpool", "--reduce", "flatten"], "Layer 'layer4' gets two reductions from equally specific "
                                                     "rules ('avgpool', 'flatten')"),
    (["--reduce", "srp:30000"], "--reduce srp:30000: layer 'layer4' has only 25088 values per image"),
    (["--reduce", "channels:0-600"], "--reduce channels:0-600: layer 'layer4' has shape (512, 7, 7)"),
])
def test_bad_reductions_are_one_line_exit_2_and_write_nothing(images, tmp_path, arguments, message):
    result = CliRunner().invoke(main, ["extract", "-m", "resnet18", "-w", "none", "-l", "layer4", *arguments,
                                       str(images), str(tmp_path / "out.h5")])
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"Error: {message}") and result.stderr.count("\n") == 1, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_missing_or_empty_fit_set_names_pca_fit(images, tmp_path):
    (tmp_path / "empty").mkdir()
    for fit_set, message in ((tmp_path / "nothing", f"--pca-fit {str(tmp_path / 'nothing')!r} does not exist"),
                             (tmp_path / "empty", f"--pca-fit {str(tmp_path / 'empty')!r}: No images in")):
        result = CliRunner().invoke(main, ["extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "--reduce",
                                           "pca:4", "--pca-fit", str(fit_set), str(images), str(tmp_path / "o.h5")])
        assert result.exit_code == 2 and result.stderr.startswith(f"Error: {message}"), result.stderr


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_an_srp_seed_is_recorded_in_one_canonical_form(images, tmp_path):
    output = extract(settings_for(images, tmp_path / "seeded.h5", layers=("avgpool",), reduce=("srp:64:007",)))
    with h5py.File(output.output) as h5file:
        assert h5file["features/avgpool"].attrs["reduction"] == "srp:64:7"
        assert json.loads(h5file.attrs["reduce"]) == {"avgpool": "srp:64:7"}
        assert json.loads(h5file.attrs["settings"])["reduce"] == ["srp:64:7"]
        assert json.loads(h5file.attrs["fingerprint"])["reduce"] == {"avgpool": "srp:64:7"}


def test_a_fit_too_large_for_the_memory_limit_is_refused_with_the_numbers():
    from featdump.reductions.pca import check_fit_fits

    check_fit_fits("avgpool", 600, 512, 512)  # K = D: every component, accepted
    with pytest.raises(UsageProblem, match="layer 'avgpool' has only 512 values per image; choose K of at most 512"):
        check_fit_fits("avgpool", 600, 512, 513)
    with pytest.raises(UsageProblem, match=r"needs about [0-9.]+ GiB .* over the limit of 4\.0 GiB"):
        check_fit_fits("layer1", 20000, 802816, 16, limit=4 * 1024**3)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run `pytest -m cuda` on a GPU node)")
def test_projections_on_cuda_equal_the_cpus():
    from featdump.reductions.methods import bind

    generator = torch.Generator().manual_seed(0)
    batch = torch.relu(torch.randn(16, 128, 28, 28, generator=generator))
    for channels_last in (False, True):
        inputs = batch.contiguous(memory_format=torch.channels_last) if channels_last else batch
        reduction = bind("srp:512", "layer2", (128, 28, 28))
        on_cpu, on_cuda = reduction.apply(inputs), reduction.apply(inputs.cuda()).cpu()
        torch.testing.assert_close(on_cuda, on_cpu, rtol=1e-5, atol=1e-5 * on_cpu.abs().max().item())


def _random_fit(k: int, dim: int, seed: int = 0):
    from featdump.reductions.pca import PcaFit

    rng = np.random.default_rng(seed)
    components = np.linalg.qr(rng.standard_normal((dim, k)))[0].T
    return PcaFit(rng.standard_normal(dim), components, np.ones(k), float(k), 100, "a test", "gram")


@pytest.mark.parametrize("precision", [torch.bfloat16, torch.float16])
def test_pca_under_autocast_equals_the_projection_in_float64(precision):
    """The forward's autocast does not reach the projection: the rows are the layer's output (as autocast made it)
    projected in float32, within float32's rounding of the float64 projection (3e-3 off before)."""
    from featdump.reductions.methods import bind, snapshot

    shape = (64, 14, 14)
    fitted = _random_fit(8, math.prod(shape))
    take = snapshot(0, 1, bind("pca:8", "layer2", shape, pca_fit=fitted))
    output = torch.relu(torch.randn(6, *shape, generator=torch.Generator().manual_seed(1))).to(precision)
    with torch.autocast("cpu", dtype=precision):
        rows = take(output)
    exact = (output.double().flatten(1).numpy() - fitted.mean) @ fitted.components.T
    assert rows.dtype == torch.float32
    np.testing.assert_allclose(rows.numpy(), exact, rtol=0, atol=2e-6 * np.abs(exact).max())


@pytest.mark.parametrize("precision", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("text", ["srp:64", "countsketch:64", "avgpool", "maxpool", "channels:3-9", "flatten", "none"])
def test_every_reduction_under_autocast_computes_in_float32(precision, text):
    """Under autocast each reduction gives what it gives, outside autocast, on the output widened to float32."""
    from featdump.reductions.methods import bind, snapshot

    shape = (32, 7, 7)
    reduction = bind(text, "layer3", shape)
    output = torch.randn(4, *shape, generator=torch.Generator().manual_seed(2)).to(precision)
    with torch.autocast("cpu", dtype=precision):
        rows = snapshot(0, 1, reduction)(output)
    expected = reduction.apply(output.float())
    assert rows.dtype == torch.float32 and torch.equal(rows, expected.contiguous())
