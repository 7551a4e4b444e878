"""RDMs and CKA from stored features, out of core: equal to rsatoolbox's and to a direct numpy computation, exact
where a naive float32 Gram loses its digits, within the memory bound whatever the layer's width, resumed after a
kill, and on every kind of output (merged views, reduced layers, float16, a partial file's committed rows)."""

from __future__ import annotations

import math
import shutil
import signal
import warnings

import h5py
import numpy as np
import pytest
import torch

import featdump
from featdump.job.runner import extract

from .helpers import (
    CrashAfterFirstBatch,
    peak_rss_mib,
    run_featdump,
    settings_for,
    start_featdump,
    write_images,
    write_output,
)

rsatoolbox = pytest.importorskip("rsatoolbox")
from rsatoolbox.data import Dataset  # noqa: E402
from rsatoolbox.rdm import calc_rdm  # noqa: E402

BASE = ["extract", "-m", "resnet18", "-w", "none"]


def off_diagonal(matrix: np.ndarray) -> np.ndarray:
    return matrix[~np.eye(len(matrix), dtype=bool)]


def reference_rdm(rows: np.ndarray, metric: str) -> np.ndarray:
    """rsatoolbox's RDM (correlation, euclidean) or numpy's cosine, in float64."""
    rows = rows.reshape(len(rows), -1).astype(np.float64)
    if metric == "cosine":
        unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        return 1.0 - unit @ unit.T
    return calc_rdm(Dataset(rows), method=metric).get_matrices()[0]


def reference_cka(first: np.ndarray, second: np.ndarray, unbiased: bool) -> float:
    """Linear CKA from the raw (uncentred) rows, as the papers write it."""
    first, second = (rows.reshape(len(rows), -1).astype(np.float64) for rows in (first, second))
    n = len(first)

    def hsic(k, l):  # noqa: E741 - the papers' names
        if not unbiased:
            centre = np.eye(n) - 1.0 / n
            return np.sum((centre @ k @ centre) * (centre @ l @ centre))
        k, l = k.copy(), l.copy()  # noqa: E741
        np.fill_diagonal(k, 0)
        np.fill_diagonal(l, 0)
        return (np.sum(k * l) + k.sum() * l.sum() / ((n - 1) * (n - 2)) - 2 / (n - 2) * k.sum(0) @ l.sum(0)) \
            / (n * (n - 3))

    k, l = first @ first.T, second @ second.T  # noqa: E741
    return hsic(k, l) / np.sqrt(hsic(k, k) * hsic(l, l))


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """12 images; resnet18 (seed 0) layers whole, srp-reduced and float16; the same model with seed 1."""
    root = tmp_path_factory.mktemp("analysis")
    write_images(root / "images", {"cats": 6, "dogs": 6}, size=(40, 32))
    layers = ["-l", "layer1,layer3,avgpool,fc", "--reduce", "fc=srp:32"]
    for name, extra in (("out.h5", []), ("seed1.h5", ["--seed", "1"]), ("half.h5", ["--dtype", "float16"])):
        result = run_featdump(*BASE, *layers, *extra, root / "images", root / name)
        assert result.returncode == 0, result.stderr
    return root


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
@pytest.mark.parametrize("metric", ["correlation", "euclidean", "cosine"])
def test_rdms_equal_rsatoolbox_s_read_in_many_slabs(study, tmp_path, metric):
    result = run_featdump("rdm", study / "out.h5", "--metric", metric, "--memory", "64KB", "-o", tmp_path / "r.h5")
    assert result.returncode == 0, result.stderr
    assert f"Wrote the {metric} RDMs of 4 layers over 12 images" in result.stderr
    with h5py.File(tmp_path / "r.h5", "r") as h5file:
        assert list(h5file.attrs["layers"]) == ["layer1", "layer3", "avgpool", "fc"]
        assert list(h5file["paths"].asstr()[:]) == featdump.load(study / "out.h5", "fc").paths
        assert list(h5file["labels"][:]) == [0] * 6 + [1] * 6
        for layer in ("layer1", "layer3", "avgpool", "fc"):
            ours, expected = h5file["rdms"][layer][:], reference_rdm(featdump.load(study / "out.h5", layer).features,
                                                                      metric)
            assert h5file["rdms"][layer].attrs["metric"] == metric and ours.dtype == np.float64
            np.testing.assert_allclose(off_diagonal(ours), off_diagonal(expected), rtol=1e-5)
            assert np.all(np.diag(ours) == 0)


def test_products_in_blocks_of_rows_fill_the_whole_matrix(study, monkeypatch):
    """The products are computed for the blocks on and above the diagonal and mirrored: with blocks of 5 rows,
    12 rows make 3 blocks (one short), and every entry still equals rsatoolbox's."""
    monkeypatch.setattr("featdump.analysis.gram.ROW_BLOCK", 5)
    ours = featdump.rdm(study / "out.h5", "layer3", metric="euclidean", memory="64KB", device="cpu")["layer3"]
    expected = reference_rdm(featdump.load(study / "out.h5", "layer3").features, "euclidean")
    np.testing.assert_allclose(off_diagonal(ours), off_diagonal(expected), rtol=1e-5)
    np.testing.assert_array_equal(ours, ours.T)


def test_a_large_common_offset_keeps_its_digits(tmp_path):
    """Activations far from zero (1000 + noise): a float32 Gram cancels to noise, the centred slabs do not."""
    rng = np.random.default_rng(0)
    values = (1000.0 + rng.standard_normal((16, 300_000))).astype(np.float32)
    write_output(tmp_path / "offset.h5", {"wide": values})
    expected = reference_rdm(values, "euclidean")
    ours = featdump.rdm(tmp_path / "offset.h5", metric="euclidean", memory="2MB", device="cpu")["wide"]
    np.testing.assert_allclose(off_diagonal(ours), off_diagonal(expected), rtol=1e-5)
    naive = torch.from_numpy(values) @ torch.from_numpy(values).T  # what a float32 Gram gives
    norms = torch.diagonal(naive)
    naive = ((norms[:, None] + norms[None, :] - 2 * naive) / values.shape[1]).numpy()
    assert np.max(np.abs(off_diagonal(naive) - off_diagonal(expected)) / off_diagonal(expected)) > 1e-2
    for metric in ("correlation", "cosine"):
        ours = featdump.rdm(tmp_path / "offset.h5", metric=metric, memory="2MB", device="cpu")["wide"]
        np.testing.assert_allclose(off_diagonal(ours), off_diagonal(reference_rdm(values, metric)), rtol=1e-5)


@pytest.mark.slow  # 512 MB written, two processes measured whole
def test_a_layer_wider_than_the_memory_bound_stays_within_it(tmp_path):
    rng = np.random.default_rng(1)
    wide = rng.standard_normal((64, 2_000_000), dtype=np.float32)  # 512 MB of features
    write_output(tmp_path / "wide.h5", {"wide": wide, "narrow": wide[:, :1000].copy()})
    narrow_peak = peak_rss_mib("rdm", tmp_path / "wide.h5", "-l", "narrow", "--memory", "32MB", "-o",
                               tmp_path / "narrow-rdm.h5")
    wide_peak = peak_rss_mib("rdm", tmp_path / "wide.h5", "-l", "wide", "--memory", "32MB", "-o",
                             tmp_path / "wide-rdm.h5")
    print(f"\npeak RSS: {narrow_peak:.0f} MiB for 1,000 features, {wide_peak:.0f} MiB for 2,000,000 (512 MB)")
    assert wide_peak - narrow_peak < 32 + 24, (narrow_peak, wide_peak)  # the slab, and allocator slack
    with h5py.File(tmp_path / "wide-rdm.h5", "r") as h5file:
        np.testing.assert_allclose(off_diagonal(h5file["rdms/wide"][:]),
                                   off_diagonal(reference_rdm(wide, "correlation")), rtol=1e-5)


@pytest.mark.slow  # a real process killed
def test_a_kill_resumes_at_the_first_layer_not_written(tmp_path):
    rng = np.random.default_rng(2)
    layers = {f"block{index}": rng.standard_normal((24, 400_000), dtype=np.float32) for index in range(4)}
    write_output(tmp_path / "blocks.h5", layers)
    command = ["rdm", tmp_path / "blocks.h5", "--memory", "256KB", "--device", "cpu", "-o", tmp_path / "r.h5"]
    process = start_featdump(*command)
    for line in process.stderr:
        if "The RDM of block0 is in" in line:
            process.send_signal(signal.SIGKILL)
            break
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before the kill"
    assert (tmp_path / "r.h5.partial").exists() and not (tmp_path / "r.h5").exists()
    result = run_featdump(*command)
    assert result.returncode == 0, result.stderr
    assert "Resuming: " in result.stderr and "layers' RDMs are in" in result.stderr
    fresh = featdump.rdm(tmp_path / "blocks.h5", device="cpu", memory="256KB")  # the same slabs: the same sums
    with h5py.File(tmp_path / "r.h5", "r") as h5file:
        assert sorted(h5file["rdms"]) == sorted(layers) and "writing" not in h5file
        for name in layers:
            np.testing.assert_array_equal(h5file["rdms"][name][:], fresh[name])
    again = run_featdump(*command)  # the same command on its finished result: done
    assert again.returncode == 0 and "Nothing to do: already wrote" in again.stderr, again.stderr


def test_cka_within_one_output_equals_numpy_and_is_drawn(study, tmp_path):
    layers = ["layer1", "layer3", "avgpool", "fc"]
    rows = {layer: featdump.load(study / "out.h5", layer).features for layer in layers}
    for unbiased in (False, True):
        result = featdump.cka(study / "out.h5", unbiased=unbiased, memory="64KB", device="cpu")
        assert result.rows == result.columns == layers and result.images == 12
        expected = [[reference_cka(rows[a], rows[b], unbiased) for b in layers] for a in layers]
        np.testing.assert_allclose(result.values, expected, rtol=1e-6, atol=1e-7)  # CKA lies in [-1, 1]
    cli = run_featdump("cka", study / "out.h5", "-l", "layer*", "--unbiased", "-o", tmp_path / "c.h5", "--plot",
                       tmp_path / "c.png")
    assert cli.returncode == 0, cli.stderr
    info = run_featdump("info", tmp_path / "c.h5")  # a result is described, and how to draw it
    assert info.returncode == 0 and "featdump cka: unbiased linear CKA, 2 x 2 layers" in info.stdout, info.stdout
    assert f"draw:       featdump show {tmp_path / 'c.h5'}" in info.stdout
    assert "Wrote unbiased CKA of 2 x 2 layers over 12 images" in cli.stderr
    with h5py.File(tmp_path / "c.h5", "r") as h5file:
        assert list(h5file["cka"].attrs["rows"]) == ["layer1", "layer3"] and h5file["cka"].attrs["unbiased"]
        assert h5file["cka"][0, 1] == pytest.approx(reference_cka(rows["layer1"], rows["layer3"], True), rel=1e-6)
    assert (tmp_path / "c.png").stat().st_size > 10_000 and not (tmp_path / "c.h5.grams.partial").exists()
    shown = run_featdump("show", tmp_path / "c.h5", "-o", tmp_path / "shown.png")
    assert shown.returncode == 0 and (tmp_path / "shown.png").exists()


@pytest.mark.slow  # make test-all: a second extraction
def test_cka_between_two_outputs_matches_rows_by_path(study, tmp_path):
    result = featdump.cka(study / "out.h5", study / "seed1.h5", layers="layer3,avgpool", other_layers=["fc"],
                          device="cpu")
    assert result.rows == ["layer3", "avgpool"] and result.columns == ["fc"]
    for index, layer in enumerate(result.rows):
        expected = reference_cka(featdump.load(study / "out.h5", layer).features,
                                 featdump.load(study / "seed1.h5", "fc").features, False)
        assert result.values[index, 0] == pytest.approx(expected, rel=1e-6)
    # Another folder: 3 images the first output lacks, 2 of its images missing, rows in another order.
    shutil.copytree(study / "images", tmp_path / "images")
    (tmp_path / "images" / "cats" / "img_000.jpg").unlink()
    (tmp_path / "images" / "dogs" / "img_004.jpg").unlink()
    write_images(tmp_path / "images", {"birds": 3}, seed=7, size=(40, 32))
    assert run_featdump(*BASE, "-l", "avgpool", "--seed", "1", tmp_path / "images", tmp_path / "other.h5").returncode \
        == 0
    refused = run_featdump("cka", study / "out.h5", tmp_path / "other.h5", "-l", "avgpool", "-o", tmp_path / "c.h5")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "2 of " in refused.stderr and "3 of its 13 are not in the first" in refused.stderr
    assert "--common" in refused.stderr and not (tmp_path / "c.h5").exists()
    common = featdump.cka(study / "out.h5", tmp_path / "other.h5", layers="avgpool", common=True, device="cpu")
    first, second = featdump.load(study / "out.h5", "avgpool"), featdump.load(tmp_path / "other.h5", "avgpool")
    shared = [path for path in first.paths if path in second.paths]
    assert common.images == len(shared) == 10
    expected = reference_cka(first.features[[first.paths.index(path) for path in shared]],
                             second.features[[second.paths.index(path) for path in shared]], False)
    assert common.values[0, 0] == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow  # every kind of output: merged views, shards, float16
def test_rdms_of_every_kind_of_output(study, tmp_path):
    """Compressed layers, float16 ones, srp-reduced ones (above), a merged view over shards, a killed run's
    committed rows; and an rsatoolbox RDMs from the API."""
    gzip = tmp_path / "gzip.h5"  # compressed chunks: read through h5py, slab by slab
    assert run_featdump(*BASE, "-l", "layer1", "--compression", "gzip", study / "images", gzip).returncode == 0
    np.testing.assert_allclose(featdump.rdm(gzip, memory="64KB", device="cpu")["layer1"],
                               featdump.rdm(study / "out.h5", "layer1", memory="64KB", device="cpu")["layer1"],
                               rtol=1e-12, atol=1e-12)
    half = featdump.rdm(study / "half.h5", ["layer3"], metric="euclidean", device="cpu")["layer3"]
    stored = featdump.load(study / "half.h5", "layer3").features
    assert stored.dtype == np.float16
    np.testing.assert_allclose(off_diagonal(half), off_diagonal(reference_rdm(stored, "euclidean")), rtol=1e-5)
    output = tmp_path / "sharded.h5"
    for shard in ("0/2", "1/2"):
        assert run_featdump(*BASE, "-l", "avgpool", "--shard", shard, study / "images", output).returncode == 0
    assert run_featdump("merge", output).returncode == 0
    merged = featdump.rdm(output, "avgpool", device="cpu")["avgpool"]
    np.testing.assert_allclose(merged, featdump.rdm(study / "out.h5", "avgpool", device="cpu")["avgpool"],
                               rtol=1e-6, atol=1e-9)
    with pytest.raises(RuntimeError, match="simulated crash"):
        extract(settings_for(study / "images", tmp_path / "killed.h5", layers=("avgpool",)), CrashAfterFirstBatch())
    partial = featdump.rdm(tmp_path / "killed.h5.partial", device="cpu")["avgpool"]
    assert partial.shape == (4, 4)  # the first batch's rows, committed before the crash
    rows = featdump.load(study / "out.h5", "avgpool").features[:4]
    np.testing.assert_allclose(off_diagonal(partial), off_diagonal(reference_rdm(rows, "correlation")), rtol=1e-5)
    rdms = featdump.rdm(study / "out.h5", "layer*", device="cpu", as_rsatoolbox=True)
    assert isinstance(rdms, rsatoolbox.rdm.RDMs) and rdms.n_rdm == 2 and rdms.n_cond == 12
    assert rdms.rdm_descriptors["layer"] == ["layer1", "layer3"]
    assert list(rdms.pattern_descriptors["path"]) == featdump.load(study / "out.h5", "fc").paths
    expected = calc_rdm(Dataset(featdump.load(study / "out.h5", "layer3").features.reshape(12, -1)
                                .astype(np.float64)), method="correlation")
    np.testing.assert_allclose(rdms.dissimilarities[1], expected.dissimilarities[0], rtol=1e-5)


def test_bad_input_is_one_line(study, tmp_path):
    for arguments, message in (
        (["rdm", study / "out.h5", "-l", "layer9", "-o", tmp_path / "r.h5"], "holds no layer 'layer9'"),
        (["rdm", study / "out.h5", "--memory", "lots", "-o", tmp_path / "r.h5"], "--memory 'lots'"),
        (["rdm", tmp_path / "nothing.h5", "-o", tmp_path / "r.h5"], "No file"),
        (["rdm", study / "out.h5", "-l", "nope*", "-o", tmp_path / "r.h5"], "matches no layer"),
        (["cka", study / "out.h5", "-o", tmp_path / "c.h5", "--device", "cuda:7"], "cuda"),
    ):
        result = run_featdump(*arguments)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not list(tmp_path.iterdir())


def test_rdm_and_cka_check_the_gpus_free_memory_before_they_start(study, tmp_path, monkeypatch):
    """On a GPU with 1 MB free (CUDA faked, its free memory as torch reports it), neither starts: one line with the
    numbers and the way out, nothing written."""
    from featdump.errors import UsageProblem

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**20, 80 * 2**30))
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    with pytest.raises(UsageProblem, match=r"An RDM over 12 images needs .* for its 1 12 x 12 matrix in float64 and "
                                           r"its slabs, and cuda:0 has 1\.0 MB free \(room for 0 images\): .*"
                                           r"--device cpu"):
        featdump.rdm(study / "out.h5", "layer1", device="cuda", to=tmp_path / "r.h5")
    with pytest.raises(UsageProblem, match=r"CKA over 12 images needs .* for its 3 12 x 12 matrices .* and cuda:0 has "
                                           r"1\.0 MB free"):
        featdump.cka(study / "out.h5", layers="layer1", device="cuda", to=tmp_path / "c.h5")
    assert not list(tmp_path.iterdir())


def test_rdm_and_cka_say_before_the_work_how_many_images_this_machine_s_memory_allows(study, tmp_path, caplog):
    import logging

    from featdump.forward.device import free_memory

    with caplog.at_level(logging.INFO, logger="featdump"):
        featdump.rdm(study / "out.h5", "layer1,avgpool", device="cpu", memory="64MB", to=tmp_path / "r.h5")
        featdump.cka(study / "out.h5", layers="layer1,avgpool", device="cpu", memory="64MB", to=tmp_path / "c.h5")
    said = [record.getMessage() for record in caplog.records if "room for up to" in record.getMessage()]
    slabs = 64 * 10**6
    for line, what, matrices in zip(said, ("2 RDMs", "CKA"), (2, 3)):  # an RDM per layer held; CKA's three
        most = int(line.rsplit("room for up to ", 1)[1].split()[0])
        assert line.startswith(f"{what} over 12 images: ") and f"for its {matrices} 12 x 12 matrices" in line, line
        assert abs(most - math.isqrt((free_memory(torch.device("cpu")) - slabs) // (8 * matrices))) < most * 0.05
    assert len(said) == 2, said


def rows_with_bad_ones(rows: int, features: int) -> np.ndarray:
    """Random rows, with NaN in row 3, inf in row 7, zeros in row 11 and a constant row 14."""
    values = np.random.default_rng(5).standard_normal((rows, features)).astype(np.float32)
    values[3, features // 2] = np.nan
    values[7, -1] = np.inf
    values[11] = 0.0
    values[14] = 5.0
    return values


def reference_with_nan(rows: np.ndarray, metric: str) -> np.ndarray:
    """rsatoolbox's RDM (numpy's cosine) of rows that may hold NaN, inf, zero or constant rows."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if metric == "cosine":
            wide = rows.astype(np.float64)
            unit = wide / np.linalg.norm(wide, axis=1, keepdims=True)
            matrix = 1.0 - unit @ unit.T
            np.fill_diagonal(matrix, 0.0)
            return matrix
        return calc_rdm(Dataset(rows.astype(np.float64)), method=metric).get_matrices()[0]


@pytest.mark.parametrize("features, memory", [(300, "64MB"), (20_000, "256KB")])  # one slab; many slabs
@pytest.mark.parametrize("metric", ["correlation", "euclidean", "cosine"])
def test_rows_without_a_distance_are_nan_in_their_row_and_column_only_as_in_rsatoolbox(tmp_path, metric, features,
                                                                                        memory, caplog):
    values = rows_with_bad_ones(20, features)
    write_output(tmp_path / "bad.h5", {"layer": values})
    ours = featdump.rdm(tmp_path / "bad.h5", metric=metric, memory=memory, device="cpu")["layer"]
    expected = reference_with_nan(values, metric)
    defined = np.isfinite(expected)
    assert not defined.all() and defined.sum() > 0.5 * defined.size  # some NaN rows, most entries defined
    np.testing.assert_array_equal(np.isfinite(ours), defined)  # NaN exactly where rsatoolbox has it
    np.testing.assert_allclose(ours[defined], expected[defined], rtol=1e-5, atol=1e-6)
    assert "has NaN in the rows and columns of" in caplog.text and "'b/0003.jpg'" in caplog.text


def test_an_rdm_with_nan_rows_says_so_on_the_command_line(tmp_path):
    write_output(tmp_path / "bad.h5", {"layer": rows_with_bad_ones(20, 50)})
    result = run_featdump("rdm", tmp_path / "bad.h5", "-o", tmp_path / "r.h5")
    assert result.returncode == 0, result.stderr
    assert "correlation RDM of layer has NaN in the rows and columns of 4 images" in result.stderr
    with h5py.File(tmp_path / "r.h5") as h5file:
        matrix = h5file["rdms/layer"][:]
    assert np.isnan(matrix[3, 0]) and np.isfinite(matrix[0, 1])


def highly_correlated_rows(rows: int, features: int) -> np.ndarray:
    """Rows alike in pattern (correlations above 0.999, as a pooled layer's), each at its own level and gain."""
    rng = np.random.default_rng(1)
    pattern = np.abs(rng.standard_normal(features)) + 0.5
    gain = np.exp(0.5 * rng.standard_normal((rows, 1)))
    return (gain * pattern * (1 + 0.01 * rng.standard_normal((rows, features))) + 3 * gain).astype(np.float32)


@pytest.mark.parametrize("features, memory", [(512, "64MB"), (40_000, "4MB")])  # avgpool-like; many slabs
@pytest.mark.parametrize("metric", ["correlation", "cosine"])
def test_rdms_of_highly_correlated_rows_are_within_1e_5_of_their_largest_entry(tmp_path, metric, features, memory):
    values = highly_correlated_rows(256, features)
    write_output(tmp_path / "alike.h5", {"layer": values})
    ours = featdump.rdm(tmp_path / "alike.h5", metric=metric, memory=memory, device="cpu")["layer"]
    expected = reference_rdm(values, metric)
    np.fill_diagonal(expected, 0.0)
    assert expected.max() < 1e-3  # the rows are that alike
    assert np.abs(ours - expected).max() <= 1e-5 * expected.max()


def test_cka_of_a_constant_layer_is_nan_with_one_line_and_a_nan_row_is_refused(tmp_path):
    values = np.random.default_rng(0).standard_normal((12, 40)).astype(np.float32)
    write_output(tmp_path / "c.h5", {"varied": values, "constant": np.ones((12, 40), dtype=np.float32)})
    result = run_featdump("cka", tmp_path / "c.h5", "-o", tmp_path / "cka.h5")
    assert result.returncode == 0, result.stderr
    assert "RuntimeWarning" not in result.stderr and "Layer constant has no variance" in result.stderr
    with h5py.File(tmp_path / "cka.h5") as h5file:
        matrix = h5file["cka"][:]
    assert np.isnan(matrix).sum() == 3 and np.isfinite(matrix).sum() == 1
    values[4, 2] = np.nan
    write_output(tmp_path / "n.h5", {"varied": values})
    refused = run_featdump("cka", tmp_path / "n.h5", "-o", tmp_path / "cka2.h5")
    assert refused.returncode == 2 and "holds NaN or inf in 1 row ('a/0004.jpg'" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "cka2.h5").exists()


def test_rdm_and_cka_run_again_on_their_finished_result_are_done(study, tmp_path):
    for command in (["rdm", study / "out.h5", "-l", "fc"], ["cka", study / "out.h5", "-l", "fc,avgpool"]):
        target = tmp_path / f"{command[0]}.h5"
        assert run_featdump(*command, "-o", target).returncode == 0
        before = target.stat().st_mtime_ns
        again = run_featdump(*command, "-o", target)
        assert again.returncode == 0 and "nothing to do" in again.stderr, again.stderr
        assert target.stat().st_mtime_ns == before
        other = run_featdump(*command, "--metric" if command[0] == "rdm" else "--unbiased",
                             *(["euclidean"] if command[0] == "rdm" else []), "-o", target)
        assert other.returncode == 2 and "--overwrite" in other.stderr, other.stderr


def test_a_large_rdm_is_drawn_as_block_means_in_class_order(tmp_path):
    """1,000 rows of 4 classes, interleaved: the picture groups them by class and draws 256 x 256 block means
    (a nearest-pixel squeeze would alias); panels fill their rows."""
    from featdump.faces.matrices import panel_columns, shown_matrix

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 1000)
    values = (labels[:, None] != labels[None, :]).astype(np.float64) + 0.01 * rng.standard_normal((1000, 1000))
    with h5py.File(tmp_path / "m.h5", "w") as h5file:
        h5file["rdm"] = values
    order = np.argsort(labels, kind="stable")
    with h5py.File(tmp_path / "m.h5", "r") as h5file:
        drawn, scale = shown_matrix(h5file["rdm"], order)
        small, whole = shown_matrix(h5file["rdm"], order[:200])
    assert drawn.shape == (256, 256) and scale == 256 / 1000 and whole == 1.0
    edges = np.linspace(0, 1000, 257).astype(int)
    ordered = values[np.ix_(order, order)]
    expected = np.array([[ordered[edges[i]:edges[i + 1], edges[j]:edges[j + 1]].mean() for j in range(256)]
                         for i in range(256)])
    np.testing.assert_allclose(drawn, expected, rtol=1e-12)
    np.testing.assert_array_equal(small, values[np.ix_(order[:200], order[:200])])
    assert drawn[:40, :40].mean() < 0.1 and drawn[:40, -40:].mean() > 0.9  # class blocks, not moire
    assert [panel_columns(count) for count in (1, 3, 5, 6, 7, 8, 16)] == [1, 3, 5, 6, 4, 4, 4]
