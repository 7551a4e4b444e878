"""Each unit's top and bottom images (`featdump.units.top`, `featdump top`): equal to a stable argsort of the
scores over the whole layer (ties to the lower row) on a conv layer, a pooled layer and a token layer, over a
merged view of shards; the maximum's position; the mean; memory bounded by --memory, not the layer; a killed pass
resumes at the layer it stopped in."""

from __future__ import annotations

import os
import tracemalloc

import h5py
import numpy as np
import pytest

import featdump
from featdump.units import top as units
from tests.makers.tiny_models import MODELS

from .helpers import REPO, featdump_env, run_featdump, user_project

K = 5


def reference(features: np.ndarray, unit_axis: int | None, score: str = "max"):
    """(scores, positions) per (row, unit), from the whole layer in memory."""
    rows = len(features)
    flat = features.reshape(rows, -1, 1) if unit_axis is None else \
        np.moveaxis(features, 1 + unit_axis, 1).reshape(rows, features.shape[1 + unit_axis], -1)
    flat = flat.astype(np.float64)
    if score == "mean":
        return flat.mean(axis=2), None
    return flat.max(axis=2), flat.argmax(axis=2)


def assert_ranked_as_argsort(ranking, scores, positions, k=K):
    rows = np.arange(len(scores))
    for unit in range(scores.shape[1]):
        highest = np.lexsort((rows, -scores[:, unit]))[:k]
        lowest = np.lexsort((rows, scores[:, unit]))[:k]
        np.testing.assert_array_equal(ranking.rows[unit], highest)
        np.testing.assert_array_equal(ranking.values[unit], scores[highest, unit])
        np.testing.assert_array_equal(ranking.bottom_rows[unit], lowest)
        if positions is not None and ranking.positions[unit][0] >= 0:
            np.testing.assert_array_equal(ranking.positions[unit], positions[highest, unit])


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """resnet18's layer1 (64 x 56 x 56) and avgpool over 14 images, in 2 shards merged as a view; and a tiny ViT's
    token layer (tokens x features)."""
    folder = tmp_path_factory.mktemp("top")
    with user_project(folder, "tiny_models", MODELS, {"a": 7, "b": 7}):
        for index in range(2):
            assert run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer1,avgpool", "-b", "4",
                                "--shard", f"{index}/2", folder / "images", folder / "cnn.h5").returncode == 0
        assert run_featdump("merge", "--view", folder / "cnn.h5").returncode == 0
        env = featdump_env(PYTHONPATH=f"{folder}{os.pathsep}{REPO}")
        made = run_featdump("extract", "-m", "tiny_models:vit", "-w", "none", "-l", "encoder.layers.encoder_layer_0",
                            folder / "images", folder / "vit.h5", env=env)
        assert made.returncode == 0, made.stderr
        yield folder


def assert_spectrum_of(ranking, scores):
    """Each unit's histogram counts every row (np.histogram's within the edges, the rest below and above them);
    with fewer rows than the sample, every row is sampled: each quantile's image is that order statistic."""
    for unit in range(scores.shape[1]):
        edges, counts = ranking.edges[unit], ranking.histogram[unit]
        assert counts.sum() == len(scores)
        slack = units.ROUNDING * (abs(edges[0]) + abs(edges[-1]))  # a score a rounding away from an end: inside
        near = np.where(np.abs(scores[:, unit] - edges[0]) <= slack, edges[0], scores[:, unit])
        near = np.where(np.abs(near - edges[-1]) <= slack, edges[-1], near)
        within, _ = np.histogram(near, bins=edges)
        np.testing.assert_array_equal(counts[1:-1], within)
        assert counts[0] == (near < edges[0]).sum() and counts[-1] == (near > edges[-1]).sum()
        order = np.lexsort((np.arange(len(scores)), scores[:, unit]))
        expected = order[np.round(np.array(units.QUANTILES) * (len(scores) - 1)).astype(int)]
        np.testing.assert_array_equal(ranking.quantile_rows[unit], expected)
        np.testing.assert_array_equal(ranking.quantile_values[unit], scores[expected, unit])


def test_top_equals_an_argsort_of_the_whole_layer_on_maps_pooled_and_token_layers(sharded):
    ranked = featdump.top(sharded / "cnn.h5", "layer1,avgpool", k=K)
    layer1 = featdump.load(sharded / "cnn.h5", "layer1").features  # (14, 64, 56, 56): channels first
    assert_ranked_as_argsort(ranked["layer1"], *reference(layer1, 0))
    assert_spectrum_of(ranked["layer1"], reference(layer1, 0)[0])
    assert ranked["layer1"].rows.shape == (64, K) and (ranked["layer1"].positions >= 0).all()
    pooled = featdump.load(sharded / "cnn.h5", "avgpool").features
    assert_ranked_as_argsort(ranked["avgpool"], *reference(pooled, 0))
    assert (ranked["avgpool"].positions == -1).all()  # one position a unit: nowhere to show
    with h5py.File(sharded / "cnn.top.h5", "r") as h5file:  # beside the output, labelled like it
        assert h5file.attrs["complete"] and h5file["top/layer1/rows"].shape == (64, K)
        assert [path.decode() for path in h5file["paths"][:]] == featdump.load(sharded / "cnn.h5", "layer1").paths
    tokens = featdump.top(sharded / "vit.h5", k=K, to=sharded / "vit-top.h5")
    stored = featdump.load(sharded / "vit.h5", "encoder.layers.encoder_layer_0").features  # (14, tokens, features)
    ranking = tokens["encoder.layers.encoder_layer_0"]
    assert ranking.rows.shape == (stored.shape[2], K)  # a unit per feature, its maximum over the tokens
    assert_ranked_as_argsort(ranking, *reference(stored, 1))
    assert_spectrum_of(ranking, reference(stored, 1)[0])


def test_the_mean_score_and_the_cli(sharded, tmp_path):
    result = run_featdump("top", sharded / "cnn.h5", "-l", "layer1", "-k", "3", "--score", "mean", "-o",
                          tmp_path / "mean.h5")
    assert result.returncode == 0 and "Ranked 64 units of 1 layer into" in result.stderr, result.stderr
    megabytes = 14 * 64 * 56 * 56 * 4 / 1e6  # layer1's rows: the progress line counts them, in MB
    assert f"INFO: {int(megabytes)}/{int(megabytes)} MB (100%)" in result.stderr, result.stderr
    ranking = units.read_top(tmp_path / "mean.h5", ["layer1"])["layer1"]
    layer1 = featdump.load(sharded / "cnn.h5", "layer1").features
    assert_ranked_as_argsort(ranking, *reference(layer1, 0, "mean"), k=3)
    assert_spectrum_of(ranking, reference(layer1, 0, "mean")[0])
    again = run_featdump("top", sharded / "cnn.h5", "-l", "layer1", "-k", "3", "--score", "mean", "-o",
                         tmp_path / "mean.h5")
    assert again.returncode == 0  # finished by this same command: read back, nothing computed


def test_memory_stays_bounded_by_memory_not_the_layer(sharded, tmp_path):
    layer_bytes = 14 * 64 * 56 * 56 * 8  # the layer as float64 scores would be made from: 22 MB
    tracemalloc.start()
    try:
        featdump.top(sharded / "cnn.h5", "layer1", k=K, memory="2MB", to=tmp_path / "small.h5")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < layer_bytes / 4, peak
    assert_ranked_as_argsort(units.read_top(tmp_path / "small.h5", ["layer1"])["layer1"],
                             *reference(featdump.load(sharded / "cnn.h5", "layer1").features, 0))


def test_a_killed_pass_resumes_at_the_layer_it_stopped_in(sharded, tmp_path, monkeypatch):
    ranked_layers = []
    original = units.rank_layer

    def killed_at_avgpool(stored, name, *args):
        if name == "avgpool":
            raise KeyboardInterrupt
        ranked_layers.append(name)
        return original(stored, name, *args)

    monkeypatch.setattr(units, "rank_layer", killed_at_avgpool)
    with pytest.raises(KeyboardInterrupt):
        featdump.top(sharded / "cnn.h5", "layer1,avgpool", k=K, to=tmp_path / "t.h5")
    assert (tmp_path / "t.h5.partial").exists() and not (tmp_path / "t.h5").exists()
    monkeypatch.setattr(units, "rank_layer", lambda stored, name, *args: ranked_layers.append(name) or
                        original(stored, name, *args))
    resumed = featdump.top(sharded / "cnn.h5", "layer1,avgpool", k=K, to=tmp_path / "t.h5")
    assert ranked_layers == ["layer1", "avgpool"]  # layer1 once, before the kill; avgpool after it
    assert_ranked_as_argsort(resumed["layer1"], *reference(featdump.load(sharded / "cnn.h5", "layer1").features, 0))


def test_a_layer_larger_than_the_sample_is_counted_whole_and_its_quantile_images_are_near_their_ranks(tmp_path):
    """20,000 rows of 8 units, slabs of a few thousand: every row is counted in its unit's histogram, and each
    quantile's image (from the seeded sample of 1,024 rows: a rank's standard error about 1.4%) lies within 5% of
    rank of that quantile."""
    from tests.makers.outputs import write_output

    values = np.random.default_rng(3).standard_normal((20_000, 8), dtype=np.float32)
    write_output(tmp_path / "wide.h5", {"pooled": values}, batch=4096)
    ranking = featdump.top(tmp_path / "wide.h5", "pooled", k=4, memory="1MB")["pooled"]
    assert_ranked_as_argsort(ranking, values.astype(np.float64), None, k=4)
    for unit in range(8):
        assert ranking.histogram[unit].sum() == 20_000
        ranks = (values[:, unit] < ranking.quantile_values[unit][:, None]).mean(axis=1)
        assert np.abs(ranks - np.array(units.QUANTILES)).max() < 0.05, ranks


def test_the_quantile_images_of_a_file_sorted_by_class_are_as_near_their_ranks_as_an_independent_sample(tmp_path):
    """20,000 rows in 64 classes of consecutive rows (as every folder's output is sorted), each class shifting the
    scores: the quantile images are drawn by rows, not by blocks of consecutive rows (a cluster sample, 3% of rank
    off), so their rank error is an independent sample's of 1,024 (1.4% at most, one standard error): RMS within 2%,
    none beyond 5%."""
    from tests.makers.outputs import write_output

    rng = np.random.default_rng(7)
    classes = np.repeat(np.arange(64), 20_000 // 64 + 1)[:20_000]
    values = (rng.standard_normal((64, 8))[classes] + 0.3 * rng.standard_normal((20_000, 8))).astype(np.float32)
    write_output(tmp_path / "sorted.h5", {"pooled": values}, batch=4096)
    ranking = featdump.top(tmp_path / "sorted.h5", "pooled", k=2)["pooled"]
    errors = np.array([(values[:, unit] < ranking.quantile_values[unit][:, None]).mean(axis=1) - units.QUANTILES
                       for unit in range(8)])
    assert np.sqrt((errors ** 2).mean()) < 0.02 and np.abs(errors).max() < 0.05, errors


def test_a_mean_score_is_binned_the_same_whatever_slab_summed_it(tmp_path):
    """A token layer of 1,000 rows (every row in the sample) ranked by the mean in slabs of other shapes than the
    sample's reads: a unit's own maximum and minimum fall in its last and first bins, never above or below them
    (summation order rounded them 1 ulp out, in 185 of 768 ViT units)."""
    from tests.makers.outputs import write_output

    values = (np.random.default_rng(0).standard_normal((1000, 197, 16)) * 3 + 1).astype(np.float32)
    write_output(tmp_path / "tokens.h5", {"tokens": values}, batch=64)
    ranking = featdump.top(tmp_path / "tokens.h5", "tokens", k=3, score="mean", memory="2MB")["tokens"]
    assert (ranking.histogram[:, 0] == 0).all() and (ranking.histogram[:, -1] == 0).all(), ranking.histogram
    assert (ranking.histogram.sum(axis=1) == 1000).all()


def test_top_of_an_output_on_a_web_server_writes_its_ranking_locally_and_says_so_before_the_pass(tmp_path):
    """An output at an http:// URL (a plain web server on loopback, which takes no uploads), no -o: ranked on its
    local copy, the ranking kept beside that copy, said before the pass and in the last line; exit 0, no upload
    tried."""
    from tests.makers.outputs import write_output
    from tests.stores import http_server

    values = np.random.default_rng(8).standard_normal((30, 4), dtype=np.float32)
    (tmp_path / "served").mkdir()
    write_output(tmp_path / "served" / "out.h5", {"pooled": values})
    env = featdump_env(FEATDUMP_SCRATCH=str(tmp_path / "scratch"))
    with http_server(tmp_path / "served", ranges=True) as base:
        result = run_featdump("top", f"{base}/out.h5", "-k", "3", env=env)
    assert result.returncode == 0, result.stderr
    ranked = next((tmp_path / "scratch").rglob("out.top.h5"))
    assert "takes no uploads: the ranking is written beside its local copy" in result.stderr
    assert result.stderr.index("takes no uploads") < result.stderr.index("Ranking pooled")
    assert f"into {ranked} in" in result.stderr, result.stderr
    assert_ranked_as_argsort(units.read_top(ranked, ["pooled"])["pooled"], values.astype(np.float64), None, k=3)


@pytest.mark.parametrize("highest", [True, False])
def test_ties_go_to_the_lower_row_across_slabs(highest):
    """Scores of few values (a ReLU's zeros tie by the thousand): each unit's K, slab after slab, are a stable
    sort's."""
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, (300, 7)).astype(np.float64)
    kept = units._Kept(6, highest)
    for start in range(0, 300, 37):
        kept.add(scores[start:start + 37].T, np.arange(start, min(300, start + 37)), None)
    rows = np.arange(300)
    for unit in range(7):
        expected = np.lexsort((rows, (-1 if highest else 1) * scores[:, unit]))[:6]
        np.testing.assert_array_equal(kept.rows[unit], expected)


def test_info_tells_a_top_file_and_names_the_one_beside_an_output(tmp_path):
    from click.testing import CliRunner

    from featdump.faces.cli import main
    from tests.makers.outputs import write_output

    write_output(tmp_path / "out.h5", {"pooled": np.arange(24, dtype=np.float32).reshape(6, 4)})
    featdump.top(tmp_path / "out.h5", k=2)
    told = CliRunner().invoke(main, ["info", str(tmp_path / "out.top.h5")])
    assert told.exit_code == 0 and "featdump top: each unit's 2 highest and lowest rows" in told.output
    assert "  pooled: 4 units" in told.output
    assert f"featdump.top({str((tmp_path / 'out.h5').resolve())!r}, k=2)" in told.output  # the output, not the file
    beside = CliRunner().invoke(main, ["info", str(tmp_path / "out.h5")])
    assert f"top:        {tmp_path / 'out.top.h5'}" in beside.output, beside.output


def test_the_api_returns_the_same_as_an_xarray_dataset(tmp_path):
    from tests.makers.outputs import write_output

    values = np.random.default_rng(5).standard_normal((30, 6), dtype=np.float32)
    write_output(tmp_path / "out.h5", {"pooled": values})
    ranking = featdump.top(tmp_path / "out.h5", k=3)["pooled"]
    dataset = featdump.top(tmp_path / "out.h5", k=3, as_xarray=True)["pooled"]
    assert dict(dataset.sizes) == {"unit": 6, "rank": 3, "bin": units.BINS + 2, "edge": units.BINS + 1,
                                   "quantile": len(units.QUANTILES)}
    np.testing.assert_array_equal(dataset["rows"].values, ranking.rows)
    np.testing.assert_array_equal(dataset["values"].sel(unit=2).values, ranking.values[2])
    paths = featdump.load(tmp_path / "out.h5", "pooled").paths
    assert dataset["paths"].sel(unit=4, rank=0).item() == paths[ranking.rows[4, 0]]
    assert dataset["quantile_rows"].sel(quantile=0.5).values.tolist() == ranking.quantile_rows[:, 2].tolist()


def test_top_of_an_output_in_a_store_ranks_its_local_copy_and_uploads_the_ranking_beside_it(store_env, tmp_path,
                                                                                            monkeypatch):
    """A finished output at an s3:// URL (a real SeaweedFS on loopback): ranked as the same file here, the
    ranking uploaded as URL.top.h5 beside it; the copy is kept on the scratch disk for a rerun."""
    from tests.makers.outputs import write_output

    monkeypatch.setenv("FEATDUMP_SCRATCH", str(tmp_path / "scratch"))
    values = np.random.default_rng(6).standard_normal((40, 5), dtype=np.float32)
    write_output(tmp_path / "here.h5", {"pooled": values})
    fs = store_env.client()
    fs.mkdir("ranked")
    fs.put(str(tmp_path / "here.h5"), "ranked/run/out.h5")
    ranked = featdump.top("s3://ranked/run/out.h5", k=3)["pooled"]
    assert_ranked_as_argsort(ranked, values.astype(np.float64), None, k=3)
    assert fs.exists("ranked/run/out.top.h5")
    assert [path.name for path in (tmp_path / "scratch").rglob("out.h5")] == ["out.h5"]  # the local copy, kept
    fs.get("ranked/run/out.top.h5", str(tmp_path / "fetched.top.h5"))
    np.testing.assert_array_equal(units.read_top(tmp_path / "fetched.top.h5", ["pooled"])["pooled"].rows, ranked.rows)
    result = run_featdump("top", "s3://ranked/run/out.h5", "-k", "3")
    assert result.returncode == 0 and "into s3://ranked/run/out.top.h5" in result.stderr, result.stderr


@pytest.mark.parametrize("highest", [True, False])
def test_nan_scores_come_last_and_are_counted_in_no_bin(tmp_path, highest):
    """A unit with NaN scores (a model that overflowed on some images): its K are a stable sort's with NaN last, even
    where fewer than K numbers remain in a slab; the histogram counts every number and no NaN."""
    from tests.makers.outputs import write_output

    rng = np.random.default_rng(1)
    values = rng.standard_normal((400, 5)).astype(np.float32)
    values[rng.random((400, 5)) < 0.2] = np.nan  # a fifth of the scores NaN in every unit
    values[:390, 4] = np.nan  # unit 4: ten numbers in all, NaN throughout the first slabs
    write_output(tmp_path / "nan.h5", {"pooled": values})
    ranking = featdump.top(tmp_path / "nan.h5", "pooled", k=12, memory="20KB")["pooled"]
    rows, scores = np.arange(400), values.astype(np.float64)
    for unit in range(5):
        order = np.lexsort((rows, -scores[:, unit] if highest else scores[:, unit]))[:12]
        np.testing.assert_array_equal(ranking.rows[unit] if highest else ranking.bottom_rows[unit], order)
        assert ranking.histogram[unit].sum() == np.isfinite(scores[:, unit]).sum()
