"""Encoding models normalised and bounded (`featdump encode --repeats --rois --table`): each target's noise ceiling
from repeated trials as NSD computes it, each layer's score per region with a bootstrap interval over the images,
the share of the ceiling it reaches, and paired tests between layers per region, on data with a known answer."""

from __future__ import annotations

import csv

import h5py
import numpy as np
import pytest

import featdump
from featdump.errors import UsageProblem
from featdump.readout.bounds import _resampled_r
from featdump.readout.ceilings import averaged_trials, trial_groups

from .helpers import run_featdump

IMAGES, TRIALS, FEATURES = 150, 3, 12


def test_the_ncsnr_and_ceiling_are_those_of_the_signal_and_noise_the_trials_were_made_with():
    rng = np.random.default_rng(0)
    images, signal_sd, noise_sd = 3000, np.array([0.5, 1.0, 2.0, 0.0]), 1.0
    signal = rng.standard_normal((images, 1)) * signal_sd
    trials = np.repeat(signal, TRIALS, axis=0) + noise_sd * rng.standard_normal((images * TRIALS, len(signal_sd)))
    keys = np.repeat(np.arange(images), TRIALS).tolist()
    _, group = trial_groups(keys)
    means, ceilings = averaged_trials(trials, group, np.arange(images))
    np.testing.assert_allclose(means, signal + (trials - np.repeat(signal, TRIALS, axis=0)).reshape(
        images, TRIALS, -1).mean(axis=1), atol=1e-12)
    np.testing.assert_allclose(ceilings.ncsnr[:3], signal_sd[:3] / noise_sd, rtol=0.06)
    assert ceilings.ncsnr[3] < 0.1  # no signal: (almost) no ceiling
    expected = (signal_sd / noise_sd) ** 2 / ((signal_sd / noise_sd) ** 2 + 1 / TRIALS)
    np.testing.assert_allclose(ceilings.ceiling[:3], expected[:3], atol=0.03)

    _, exact = averaged_trials(np.repeat(signal, TRIALS, axis=0), group, np.arange(images))  # identical trials
    np.testing.assert_array_equal(exact.ceiling, 1.0)

    counts = np.array([3] * 10 + [2] * 5 + [1] * 5)  # NSD: A images of 3 trials, B of 2, C of 1
    group = np.repeat(np.arange(len(counts)), counts)
    values = np.random.default_rng(1).standard_normal((len(group), 2)) + np.repeat(np.arange(len(counts)), counts)[
        :, None]
    _, uneven = averaged_trials(values, group, np.arange(len(counts)))
    squared = uneven.ncsnr ** 2
    nsd = squared / (squared + (10 / 3 + 5 / 2 + 5 / 1) / 20)  # NSD's formula, as its paper writes it
    np.testing.assert_allclose(uneven.ceiling, nsd, rtol=1e-12)


def test_a_resample_s_r_is_the_pearson_r_of_the_images_it_draws():
    rng = np.random.default_rng(2)
    predicted, actual = rng.standard_normal((40, 5)), rng.standard_normal((40, 5))
    drawn = rng.integers(0, 40, (3, 40))
    weights = np.stack([np.bincount(indices, minlength=40) for indices in drawn])
    for found, indices in zip(_resampled_r(predicted + 100.0, actual, weights), drawn):  # an offset: exact still
        expected = [np.corrcoef(predicted[indices, target], actual[indices, target])[0, 1] for target in range(5)]
        np.testing.assert_allclose(found, expected, atol=1e-10)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """An output of two layers over 150 images ("planted" predicts V1's voxels; "noise" predicts nothing), three
    trials of 8 voxels per image (V1: 4 driven by the planted layer; V4: 4 of noise alone), and their regions."""
    from tests.makers.outputs import write_output

    folder = tmp_path_factory.mktemp("bounds")
    rng = np.random.default_rng(0)
    planted = rng.standard_normal((IMAGES, FEATURES))
    paths = [f"img/{index:04d}.jpg" for index in range(IMAGES)]
    write_output(folder / "out.h5", {"planted": planted.astype(np.float32),
                                     "noise": rng.standard_normal((IMAGES, FEATURES)).astype(np.float32)},
                 paths=paths)
    signal = np.concatenate([planted @ rng.standard_normal((FEATURES, 4)) / np.sqrt(FEATURES),
                             np.zeros((IMAGES, 4))], axis=1)
    voxels = [f"v{index}" for index in range(8)]
    with open(folder / "betas.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "trial", *voxels])
        for trial in range(TRIALS):
            noisy = signal + 0.7 * rng.standard_normal(signal.shape)
            writer.writerows([path, trial, *row] for path, row in zip(paths, noisy.round(6)))
    with open(folder / "rois.csv", "w", newline="") as handle:
        handle.write("target,region\n" + "".join(f"v{index},{'V1' if index < 4 else 'V4'}\n" for index in range(8)))
    return folder


def test_the_planted_layer_is_best_in_v1_within_its_ceiling_and_noise_is_nowhere(study, tmp_path):
    result = run_featdump("encode", study / "out.h5", study / "betas.csv", "--repeats", "--rois", study / "rois.csv",
                          "--samples", "300", "--table", tmp_path / "regions.csv", "-o", tmp_path / "enc.h5",
                          "--plot", tmp_path / "enc.png")
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "regions.csv") as handle:
        rows = {(row["layer"], row["region"]): row for row in csv.DictReader(handle)}
    v1 = rows[("planted", "V1")]
    assert float(v1["low"]) <= float(v1["score"]) <= float(v1["high"])
    assert float(v1["score"]) > 0.6 and 0.9 < float(v1["ceiling"]) <= 1.0 and float(v1["share"]) <= 1.02
    assert float(rows[("noise", "V1")]["high"]) < float(v1["low"])  # apart
    assert abs(float(rows[("planted", "V4")]["score"])) < 0.2 and float(rows[("planted", "V4")]["ceiling"]) < 0.5
    assert int(v1["n_images"]) == IMAGES and int(v1["n_targets"]) == 4
    with open(tmp_path / "regions.pairs.csv") as handle:
        pairs = {row["region"]: row for row in csv.DictReader(handle)}
    assert pairs["V1"]["significant"] == "True" and float(pairs["V1"]["better"]) == 1.0
    assert float(pairs["V1"]["p_corrected"]) < 0.05 and pairs["V1"]["correction"] == "bonferroni"
    assert "planted above noise in V1: 100% of its targets" in result.stderr, result.stderr
    with open(tmp_path / "regions.targets.csv") as handle:  # each target's r and its interval over the images
        targets = {(row["layer"], row["target"]): row for row in csv.DictReader(handle)}
    assert len(targets) == 2 * 8 and targets[("planted", "v0")]["region"] == "V1"
    for row in targets.values():
        assert float(row["low"]) <= float(row["r"]) <= float(row["high"]), row
    assert "of its noise ceiling" in result.stderr
    with h5py.File(tmp_path / "enc.h5", "r") as h5file:  # the trials' means fitted, the ceilings kept
        assert h5file["ceiling"].shape == (8,) and set(h5file["trials"][:].tolist()) == {TRIALS}
        assert "trial" not in [name.decode() for name in h5file["columns"][:]]
        stored = {(layer.decode(), region.decode()): score for layer, region, score in zip(
            h5file["regions/layer"][:], h5file["regions/region"][:], h5file["regions/score"][:])}
    assert stored[("planted", "V1")] == pytest.approx(float(v1["score"]))  # the table's numbers, kept in ENC.h5
    from PIL import Image

    assert Image.open(tmp_path / "enc.png").size[0] > 2 * 400  # a panel per region, side by side
    info = run_featdump("info", tmp_path / "enc.h5")
    assert info.returncode == 0 and "planted in V1: median r" in info.stdout, info.stdout
    assert "planted above noise in V1: 100% of its targets, p < 0.001" in info.stdout, info.stdout


def test_the_table_as_netcdf_opens_in_xarray_and_the_api_gives_the_same(study, tmp_path):
    xr = pytest.importorskip("xarray")
    readouts = featdump.encode(study / "out.h5", study / "betas.csv", repeats=True, rois=study / "rois.csv",
                               samples=50, fdr=True, table=tmp_path / "regions.nc")
    with xr.open_dataset(tmp_path / "regions.nc") as table:
        assert sorted(set(table["region"].values.tolist())) == ["V1", "V4"]
        assert list(table["pair_correction"].values) == ["fdr", "fdr"]
        planted = float(table["score"].values[(table["layer"].values == "planted")
                                              & (table["region"].values == "V1")][0])
    assert planted == pytest.approx(float(np.median(readouts["planted"].r[:4])))


def test_what_cannot_give_a_ceiling_or_regions_is_refused_in_one_line(study, tmp_path):
    np.save(tmp_path / "y.npy", np.zeros((IMAGES, 2)))
    with pytest.raises(UsageProblem, match="is an .npy, whose rows name no image"):
        featdump.encode(study / "out.h5", tmp_path / "y.npy", repeats=True)
    with open(study / "betas.csv") as handle:
        once = [line for number, line in enumerate(handle) if number <= IMAGES]  # the header and trial 0
    (tmp_path / "once.csv").write_text("".join(once))
    refused = run_featdump("encode", study / "out.h5", tmp_path / "once.csv", "--repeats", "-o", tmp_path / "e.h5")
    assert refused.returncode == 2 and "names each of its 150 images once" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    (tmp_path / "rois.csv").write_text("v0,V1\nv1,V1\nv99,V2\n")
    with pytest.raises(UsageProblem, match=r"names 1 targets the targets file lacks \(v99\) and leaves 6 of its 8"):
        featdump.encode(study / "out.h5", study / "betas.csv", repeats=True, rois=tmp_path / "rois.csv")
