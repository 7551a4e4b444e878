"""`featdump compare` (`featdump.analysis.compare`): layers' RDMs against data RDMs, equal to rsatoolbox on the same
RDMs (each comparison, the noise ceiling, every bootstrap sample given the same indices), and right on data with a
known answer: a planted layer is the best, above its noisier neighbour with p < 0.05, within the ceiling; a layer of
noise is not above zero; identical subjects have a ceiling of 1."""

from __future__ import annotations

import csv

import h5py
import numpy as np
import pytest

import featdump
from featdump.analysis.compare import compare

from .helpers import run_featdump

IMAGES, SUBJECTS = 24, 6
rsatoolbox = pytest.importorskip("rsatoolbox")


def correlation_rdm(features: np.ndarray) -> np.ndarray:
    return 1 - np.corrcoef(features)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """An output of three layers over 24 images (one planted: the data's pattern and a little noise; its neighbour:
    more noise; one of noise alone), their RDMs (`featdump rdm`), and six subjects' RDMs of the same pattern."""
    from tests.makers.outputs import write_output

    folder = tmp_path_factory.mktemp("compare")
    rng = np.random.default_rng(0)
    pattern = rng.standard_normal((IMAGES, 40))
    layers = {"planted": pattern + 0.3 * rng.standard_normal((IMAGES, 40)),
              "neighbour": pattern + 1.5 * rng.standard_normal((IMAGES, 40)),
              "noise": rng.standard_normal((IMAGES, 40))}
    paths = [f"img/{index:03d}.jpg" for index in range(IMAGES)]
    write_output(folder / "out.h5", {name: values.astype(np.float32) for name, values in layers.items()}, paths=paths)
    featdump.rdm(folder / "out.h5", to=folder / "rdms.h5")
    subjects = np.stack([correlation_rdm(pattern + 0.8 * rng.standard_normal((IMAGES, 40)))
                         for _ in range(SUBJECTS)])
    np.savez(folder / "data.npz", rdms=subjects, paths=np.array(paths))
    return folder


def _rsatoolbox_rdms(matrices: np.ndarray):
    return rsatoolbox.rdm.RDMs(np.stack([rsatoolbox.rdm.RDMs(matrix[None]).get_vectors()[0] for matrix in matrices]))


@pytest.mark.parametrize("method", ["corr", "spearman", "tau-a", "cosine", "corr_cov", "cosine_cov"])
def test_scores_and_the_noise_ceiling_equal_rsatoolbox_s(study, method):
    import warnings

    from rsatoolbox.inference import boot_noise_ceiling
    from rsatoolbox.rdm import compare as their_compare

    result = compare(study / "rdms.h5", study / "data.npz", method=method, resample="none")
    data = _rsatoolbox_rdms(np.load(study / "data.npz")["rdms"])
    models = featdump.rdm(study / "out.h5", to=study / "rdms.h5")
    for name, score in zip(result.layers, result.scores):
        theirs = np.mean(their_compare(_rsatoolbox_rdms(models[name][None]), data, method))
        assert score == pytest.approx(theirs, abs=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ceiling = boot_noise_ceiling(data, method=method)
    np.testing.assert_allclose(result.ceiling, ceiling, atol=1e-10, rtol=0)


@pytest.mark.parametrize(("resample", "method"), [("subjects", "corr"), ("images", "corr"), ("both", "corr"),
                                                   ("images", "corr_cov"), ("both", "cosine_cov")])
def test_every_bootstrap_sample_equals_rsatoolbox_s_given_the_same_indices(study, tmp_path, resample, method):
    """(An image drawn twice makes NaN pairs: the whitened comparisons' fit over the pairs left, too.)"""
    from rsatoolbox.rdm import compare as their_compare

    result = compare(study / "rdms.h5", study / "data.npz", method=method, resample=resample, samples=20, seed=3,
                     indices=tmp_path / "indices.npz")
    drawn = np.load(tmp_path / "indices.npz")
    data = _rsatoolbox_rdms(np.load(study / "data.npz")["rdms"])
    data.pattern_descriptors["index"] = np.arange(IMAGES)
    models = featdump.rdm(study / "out.h5", to=study / "rdms.h5")
    for sample, (subjects, images) in enumerate(zip(drawn["subjects"], drawn["images"])):
        theirs = data.subsample("index", subjects)
        if resample != "subjects":
            theirs = theirs.subsample_pattern("index", images)
        for layer, name in enumerate(result.layers):
            model = _rsatoolbox_rdms(models[name][None])
            model.pattern_descriptors["index"] = np.arange(IMAGES)
            if resample != "subjects":
                model = model.subsample_pattern("index", images)
            expected = np.mean(their_compare(model, theirs, method))
            assert result.evaluations[sample, layer] == pytest.approx(expected, abs=1e-10)


def test_a_planted_layer_is_best_above_its_neighbour_within_the_ceiling_and_noise_is_not_above_zero(study, tmp_path):
    result = run_featdump("compare", study / "rdms.h5", study / "data.npz", "--samples", "200", "--bootstrap",
                          "both", "-o", tmp_path / "v4.csv", "--plot", tmp_path / "v4.png")  # a noise layer's chance
    assert result.returncode == 0, result.stderr
    from PIL import Image

    assert Image.open(tmp_path / "v4.png").size[0] > 400  # the figure of the paper, drawn
    assert "best planted" in result.stderr
    with open(tmp_path / "v4.csv") as handle:
        rows = {row["layer"]: row for row in csv.DictReader(handle)}
    assert list(rows) == ["planted", "neighbour", "noise"]
    planted, neighbour, noise = rows["planted"], rows["neighbour"], rows["noise"]
    assert float(planted["score"]) > float(neighbour["score"]) > float(noise["score"])
    assert float(planted["low"]) <= float(planted["score"]) <= float(planted["high"])
    assert float(planted["score"]) <= float(planted["ceiling_high"]) + 0.05
    assert float(planted["ceiling_low"]) <= float(planted["ceiling_high"])
    assert float(planted["p_zero"]) < 0.05 and float(noise["p_zero"]) > 0.05
    assert int(planted["n_images"]) == IMAGES and int(planted["n_subjects"]) == SUBJECTS
    with open(tmp_path / "v4.pairs.csv") as handle:
        pairs = {(row["first"], row["second"]): row for row in csv.DictReader(handle)}
    above = pairs[("planted", "neighbour")]
    assert float(above["difference"]) > 0 and float(above["p_corrected"]) < 0.05 and above["significant"] == "True"
    assert above["correction"] == "bonferroni" and float(above["p_corrected"]) == pytest.approx(
        min(1.0, 3 * float(above["p"])))


def test_identical_subjects_have_a_ceiling_of_one(study, tmp_path):
    same = np.repeat(np.load(study / "data.npz")["rdms"][:1], 4, axis=0)
    np.savez(tmp_path / "same.npz", rdms=same, paths=np.load(study / "data.npz")["paths"])
    for method in ("corr", "spearman", "cosine"):
        result = compare(study / "rdms.h5", tmp_path / "same.npz", method=method, resample="none")
        np.testing.assert_allclose(result.ceiling, (1.0, 1.0), atol=1e-12)


def test_an_output_is_compared_through_rdms_computed_beside_it_and_other_images_need_common(study, tmp_path):
    import shutil

    shutil.copy(study / "out.h5", tmp_path / "out.h5")
    fewer = np.load(study / "data.npz")
    np.savez(tmp_path / "fewer.npz", rdms=fewer["rdms"][:, 2:, 2:], paths=fewer["paths"][2:])
    refused = run_featdump("compare", tmp_path / "out.h5", tmp_path / "fewer.npz", "-o", tmp_path / "r.csv")
    assert refused.returncode == 2 and "2 only in the first ('img/000.jpg', ...)" in refused.stderr
    assert "pass --common" in refused.stderr and not (tmp_path / "r.csv").exists()
    made = run_featdump("compare", tmp_path / "out.h5", tmp_path / "fewer.npz", "--common", "--bootstrap", "none",
                        "-l", "planted", "-o", tmp_path / "r.csv")
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "out.rdms.h5").exists()  # computed beside the output first
    with open(tmp_path / "r.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["layer"] for row in rows] == ["planted"] and int(rows[0]["n_images"]) == IMAGES - 2
    np.savez(tmp_path / "one.npz", rdms=fewer["rdms"][:1], paths=fewer["paths"])
    for bad, said in ((tmp_path / "one.npz", "a noise ceiling needs two at least"),):
        wrong = run_featdump("compare", study / "rdms.h5", bad, "-o", tmp_path / "w.csv")
        assert wrong.returncode == 2 and said in wrong.stderr and "Traceback" not in wrong.stderr


def test_condensed_rdms_in_hdf5_the_fdr_and_what_cannot_be_compared(study, tmp_path):
    """DATA as HDF5 holding condensed RDMs (scipy's squareform order) gives the same result as the full matrices;
    --fdr corrects the pairs as scipy's Benjamini-Hochberg does; an unknown method, resampling, layer or a DATA of
    another shape is refused in one line."""
    import h5py
    from scipy.spatial.distance import squareform
    from scipy.stats import false_discovery_control

    from featdump.errors import BadOption, UsageProblem

    held = np.load(study / "data.npz")
    with h5py.File(tmp_path / "data.h5", "w") as h5file:
        h5file["rdms"] = np.stack([squareform(matrix, checks=False) for matrix in held["rdms"]])
        h5file["paths"] = held["paths"].astype(h5py.string_dtype())
    full = compare(study / "rdms.h5", study / "data.npz", samples=50, fdr=True)
    condensed = compare(study / "rdms.h5", tmp_path / "data.h5", samples=50, fdr=True)
    np.testing.assert_allclose(condensed.scores, full.scores, rtol=0, atol=1e-12)
    np.testing.assert_allclose(condensed.evaluations, full.evaluations, rtol=0, atol=1e-12)
    read_each_time = compare(study / "rdms.h5", tmp_path / "data.h5", samples=50, resample="both", memory="1KB")
    in_memory = compare(study / "rdms.h5", study / "data.npz", samples=50, resample="both")
    np.testing.assert_allclose(read_each_time.evaluations, in_memory.evaluations, rtol=0, atol=1e-12)
    assert [pair["correction"] for pair in full.pairs] == ["fdr"] * 3
    np.testing.assert_allclose([pair["p_corrected"] for pair in full.pairs],
                               false_discovery_control([pair["p"] for pair in full.pairs], method="bh"), atol=1e-12)
    for options, refused in (({"method": "riemann"}, BadOption), ({"resample": "folds"}, BadOption),
                             ({"layers": "nosuch*"}, UsageProblem)):
        with pytest.raises(refused):
            compare(study / "rdms.h5", study / "data.npz", **options)
    np.savez(tmp_path / "short.npz", rdms=held["rdms"][:, :5, :5], paths=held["paths"])
    with pytest.raises(UsageProblem, match=r"its rdms are \(6, 5, 5\) for 24 paths"):
        compare(study / "rdms.h5", tmp_path / "short.npz")
    forgotten = run_featdump("compare", study / "rdms.h5", "-o", tmp_path / "v4.csv")  # DATA left out
    assert forgotten.returncode == 2 and "Missing argument 'DATA'" in forgotten.stderr, forgotten.stderr
    assert len(forgotten.stderr.strip().splitlines()) == 1 and not (tmp_path / "v4.csv").exists()


def test_the_table_as_netcdf_opens_in_xarray_and_the_csv_in_pandas(study, tmp_path):
    import pandas as pd
    import xarray as xr

    assert featdump.compare is compare  # the same function from the package's API
    result = compare(study / "rdms.h5", study / "data.npz", samples=50, to=tmp_path / "v4.nc")
    compare(study / "rdms.h5", study / "data.npz", samples=50, to=tmp_path / "v4.csv")
    with xr.open_dataset(tmp_path / "v4.nc") as table:
        assert list(table["layer"].values) == result.layers
        np.testing.assert_allclose(table["score"].values, result.scores)
        assert float(table["ceiling_high"]) == pytest.approx(result.ceiling[1])
        assert list(table["first"].values) == [pair["first"] for pair in result.pairs]
        assert table.attrs["n_subjects"] == SUBJECTS and table.attrs["correction"] == "bonferroni"
    frame = pd.read_csv(tmp_path / "v4.csv")
    assert list(frame.columns) == ["layer", "score", "low", "high", "ceiling_low", "ceiling_high", "p_zero",
                                   "n_images", "n_subjects"]
    np.testing.assert_allclose(frame["score"], result.scores)
    assert list(pd.read_csv(tmp_path / "v4.pairs.csv")["first"]) == [pair["first"] for pair in result.pairs]


def test_two_models_outputs_are_compared_layer_against_layer_and_must_name_the_same_images(study, tmp_path):
    """Two models' RDM files (the second's rows in another order): their layers named FILE:LAYER, each the same
    score as compared alone, tested against each other's; files naming other images need --common."""
    import h5py

    with h5py.File(study / "rdms.h5") as source, h5py.File(tmp_path / "other.h5", "w") as other:
        order = np.random.default_rng(1).permutation(IMAGES)
        other["rdms/planted"] = source["rdms/planted"][:][order][:, order]
        other["paths"] = np.asarray(source["paths"].asstr()[:], dtype=object)[order].astype(h5py.string_dtype())
    alone = compare(study / "rdms.h5", study / "data.npz", samples=30)
    both = compare([study / "rdms.h5", tmp_path / "other.h5"], study / "data.npz", samples=30)
    assert both.layers == ["rdms:planted", "rdms:neighbour", "rdms:noise", "other:planted"]
    np.testing.assert_allclose(both.scores[:3], alone.scores, atol=1e-12)
    assert both.scores[3] == pytest.approx(alone.scores[0], abs=1e-12)  # the same RDM, rows reordered
    assert ("rdms:planted", "other:planted") in {(pair["first"], pair["second"]) for pair in both.pairs}
    with h5py.File(tmp_path / "fewer.h5", "w") as fewer:
        fewer["rdms/planted"] = np.load(study / "data.npz")["rdms"][0][2:, 2:]
        fewer["paths"] = np.load(study / "data.npz")["paths"][2:].astype(h5py.string_dtype())
    refused = run_featdump("compare", study / "rdms.h5", tmp_path / "fewer.h5", study / "data.npz", "-o",
                           tmp_path / "r.csv")
    assert refused.returncode == 2 and "pass --common to compare the models" in refused.stderr, refused.stderr
    made = run_featdump("compare", study / "rdms.h5", tmp_path / "fewer.h5", study / "data.npz", "--common",
                        "--bootstrap", "none", "-o", tmp_path / "r.csv")
    assert made.returncode == 0, made.stderr


def test_data_rdms_saved_by_rsatoolbox_are_read_by_their_path_descriptor(study, tmp_path):
    held = np.load(study / "data.npz")
    vectors = np.stack([matrix[np.triu_indices(IMAGES, k=1)] for matrix in held["rdms"]])
    rsatoolbox.rdm.RDMs(vectors, pattern_descriptors={"path": list(held["paths"])}).save(
        str(tmp_path / "theirs.hdf5"), file_type="hdf5")
    theirs = compare(study / "rdms.h5", tmp_path / "theirs.hdf5", samples=20)
    ours = compare(study / "rdms.h5", study / "data.npz", samples=20)
    np.testing.assert_allclose(theirs.scores, ours.scores, atol=1e-12)
    rsatoolbox.rdm.RDMs(vectors).save(str(tmp_path / "unnamed.hdf5"), file_type="hdf5")
    refused = run_featdump("compare", study / "rdms.h5", tmp_path / "unnamed.hdf5", "-o", tmp_path / "r.csv")
    assert refused.returncode == 2 and "none of its pattern descriptors (index) names the images" in refused.stderr


def _many_layers(folder, layers: int, images: int = 200, subjects: int = 3) -> None:
    """A `featdump rdm`-like file of LAYERS random RDMs over IMAGES, and SUBJECTS' data RDMs (data.npz, and
    data.h5 as HDF5)."""
    rng = np.random.default_rng(layers)
    paths = [f"img/{index:04d}.jpg" for index in range(images)]
    with h5py.File(folder / "rdms.h5", "w") as h5file:
        h5file["paths"] = np.array(paths, dtype=h5py.string_dtype())
        for layer in range(layers):
            h5file[f"rdms/layer{layer}"] = correlation_rdm(rng.standard_normal((images, 10)))
    rdms = np.stack([correlation_rdm(rng.standard_normal((images, 10))) for _ in range(subjects)])
    np.savez(folder / "data.npz", rdms=rdms, paths=np.array(paths))
    with h5py.File(folder / "data.h5", "w") as h5file:
        h5file["rdms"], h5file["paths"] = rdms, np.array(paths, dtype=h5py.string_dtype())


def test_one_layer_s_rdm_is_in_memory_at_a_time(tmp_path):
    import tracemalloc

    peaks = {}
    for layers in (4, 16):
        folder = tmp_path / str(layers)
        folder.mkdir()
        _many_layers(folder, layers)
        tracemalloc.start()
        compare(folder / "rdms.h5", folder / "data.npz", samples=10, resample="images")
        peaks[layers] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    one = 200 * 200 * 8
    assert peaks[16] - peaks[4] < 2 * one, (peaks, one)  # 12 more layers, not 12 more RDMs held


def test_data_rdms_beyond_memory_are_read_a_subject_at_a_time_with_the_same_result(tmp_path):
    """Data RDMs (HDF5) that do not fit --memory are read a subject at a time: the same scores, ceiling and
    resamples as held, and 9 more subjects cost no more memory (held, they cost 9 RDMs: the test can tell)."""
    import tracemalloc

    images, peaks = 100, {}
    for subjects in (3, 12):
        folder = tmp_path / str(subjects)
        folder.mkdir()
        _many_layers(folder, 2, images=images, subjects=subjects)
        found = {}
        for memory in ("1GB", "64KB"):
            tracemalloc.start()
            found[memory] = compare(folder / "rdms.h5", folder / "data.h5", samples=3, resample="both",
                                    memory=memory)
            peaks[subjects, memory] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        np.testing.assert_allclose(found["64KB"].evaluations, found["1GB"].evaluations, rtol=0, atol=1e-12)
        np.testing.assert_allclose(found["64KB"].scores, found["1GB"].scores, rtol=0, atol=1e-12)
        np.testing.assert_allclose(found["64KB"].ceiling, found["1GB"].ceiling, rtol=0, atol=1e-12)
    vector = images * (images - 1) // 2 * 8
    assert peaks[12, "64KB"] - peaks[3, "64KB"] < 2 * vector, (peaks, vector)
    assert peaks[12, "1GB"] - peaks[3, "1GB"] > 8 * vector, (peaks, vector)


def test_the_same_command_again_reads_its_evaluations_back_and_a_stopped_one_resumes_at_its_layer(
        study, tmp_path, monkeypatch, caplog):
    import featdump.analysis.compare as comparing

    real, calls = comparing.layer_scores, []

    def stopping(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # stopped during the second layer (Ctrl-C, a kill: the partial stays)
        return real(*args)

    monkeypatch.setattr(comparing, "layer_scores", stopping)
    table = tmp_path / "v4.csv"
    with pytest.raises(KeyboardInterrupt):
        compare(study / "rdms.h5", study / "data.npz", samples=40, resample="both", to=table)
    assert (tmp_path / "v4.evaluations.h5.partial").exists() and not table.exists()
    monkeypatch.setattr(comparing, "layer_scores", real)
    caplog.clear()  # (the stopped run's lines too, where an earlier test left the logger at INFO)
    with caplog.at_level("INFO", logger="featdump"):
        resumed = compare(study / "rdms.h5", study / "data.npz", samples=40, resample="both", to=table)
    said = caplog.text
    assert "Compared planted (1 of 3)" not in said and "Compared neighbour (2 of 3)" in said, said  # resumed
    fresh = compare(study / "rdms.h5", study / "data.npz", samples=40, resample="both")
    np.testing.assert_array_equal(resumed.evaluations, fresh.evaluations)
    caplog.clear()
    with caplog.at_level("INFO", logger="featdump"):
        again = compare(study / "rdms.h5", study / "data.npz", samples=40, resample="both", to=table)
    assert "read back, nothing computed" in caplog.text and "Compared" not in caplog.text
    np.testing.assert_array_equal(again.evaluations, fresh.evaluations)
    other = run_featdump("compare", study / "rdms.h5", study / "data.npz", "--samples", "40", "--seed", "1",
                         "-o", table)  # asked otherwise: the evaluations replaced, the table rewritten
    assert other.returncode == 0 and "replaced" in other.stderr, other.stderr


@pytest.mark.parametrize(("rows_at_once", "pairs_at_once"), [(256, 1 << 20), (2, 7)], ids=["default", "small"])
def test_an_rdm_cut_to_chosen_or_resampled_images_equals_numpy_s_index(monkeypatch, rows_at_once, pairs_at_once):
    """An RDM's vector over chosen images (reordered, a subset, drawn with repeats: NaN for an image with itself),
    from the square matrix read a block of rows at a time or from the condensed vector, equals numpy's index of the
    whole matrix, whatever the blocks."""
    from scipy.spatial.distance import squareform

    from featdump.analysis import data_rdms

    monkeypatch.setattr(data_rdms, "ROWS_AT_ONCE", rows_at_once)
    monkeypatch.setattr(data_rdms, "PAIRS_AT_ONCE", pairs_at_once)
    rng = np.random.default_rng(0)
    for size in (3, 24, 101):
        matrix = rng.random((size, size))
        matrix = matrix + matrix.T
        np.fill_diagonal(matrix, 0)
        for chosen in (np.arange(size), rng.permutation(size), np.sort(rng.integers(0, size, size)),
                       rng.integers(0, size, size // 2 + 2)):
            expected = matrix[chosen][:, chosen]
            expected[chosen[:, None] == chosen[None, :]] = np.nan
            expected = expected[np.triu_indices(len(chosen), k=1)]
            reads = []

            def rows_of(rows, matrix=matrix, reads=reads):
                reads.append(len(rows))
                return matrix[rows]

            np.testing.assert_array_equal(data_rdms.square_vector(rows_of, chosen), expected)
            np.testing.assert_array_equal(data_rdms.condensed_vector(squareform(matrix), size, chosen), expected)
            assert max(reads) <= rows_at_once
