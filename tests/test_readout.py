"""Read-outs (`featdump probe`, `featdump encode`): equal to scikit-learn's RidgeClassifierCV and RidgeCV fitted on
each fold's training rows (the same alpha, the same held-out predictions) for narrow and wide layers, read in one
block or many; targets in any form and row order; folds stratified and seeded; bad input in one line; a kill
resumed; memory bounded whatever the layer's width."""

from __future__ import annotations

import csv
import json
import signal

import h5py
import numpy as np
import pytest

import featdump
from featdump.errors import UsageProblem
from featdump.readout import passes
from featdump.readout.folds import assign_folds

from .helpers import peak_rss_mib, run_featdump, start_featdump, write_images, write_output

sklearn = pytest.importorskip("sklearn")
from sklearn.linear_model import RidgeClassifierCV, RidgeCV  # noqa: E402

ROWS = 90
ALPHAS = [1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6]
CLASSES = ("cat", "dog", "fox")


def layers_with_signal(rows: int = ROWS, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Class labels, a narrow layer (24 features: D < N) and a wide map (4 x 10 x 10: D > N) that carry them, both
    noisy enough (the wide one's noise strong along some directions) that the best alpha is inside ALPHAS."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(rows) % 3)
    narrow = rng.standard_normal((3, 24))[labels] * 0.6 + rng.standard_normal((rows, 24)) + 3.0  # a common offset
    rotation = np.linalg.qr(rng.standard_normal((400, 400)))[0]
    wide = (rng.standard_normal((rows, 400)) * np.linspace(5.0, 0.1, 400)) @ rotation + 3.0
    wide[:, :10] += rng.standard_normal((3, 10))[labels] * 2.0
    return {"narrow": narrow.astype(np.float32), "wide": wide.reshape(rows, 4, 10, 10).astype(np.float32)}, labels


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("readout")
    layers, labels = layers_with_signal()
    write_output(root / "feats.h5", layers, labels=labels, classes=CLASSES)
    rng = np.random.default_rng(1)
    flat = {name: values.reshape(ROWS, -1).astype(np.float64) for name, values in layers.items()}
    targets = flat["narrow"][:, :5] @ rng.standard_normal((5, 4))
    targets += 0.3 * flat["wide"][:, :3] @ rng.standard_normal((3, 4)) + rng.standard_normal(targets.shape)
    paths = [f"{CLASSES[label]}/{row:04d}.jpg" for row, label in enumerate(labels)]
    return {"root": root, "file": root / "feats.h5", "flat": flat, "labels": labels, "targets": targets,
            "paths": paths}


def write_table(path, paths, columns: dict[str, np.ndarray], order=None, delimiter=","):
    """A CSV/TSV with a path column and COLUMNS, its rows in ORDER."""
    order = np.arange(len(paths)) if order is None else order
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter=delimiter)
        writer.writerow(["path", *columns])
        for row in order:
            writer.writerow([paths[row], *(repr(float(values[row])) for values in columns.values())])
    return path


def relative_error(mine: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.max(np.abs(mine - theirs)) / np.max(np.abs(theirs)))


@pytest.mark.parametrize("layer", ["narrow", "wide"])
@pytest.mark.parametrize("memory", ["1GB", "24KB"])  # one block; many slabs of the wide map, a third pass narrow
def test_probe_equals_ridge_classifier_cv_on_every_fold(study, layer, memory):
    readout = featdump.probe(study["file"], [layer], folds=5, alphas=ALPHAS, memory=memory, device="cpu")[layer]
    features, labels = study["flat"][layer], study["labels"]
    assert readout.predicted.shape == (ROWS, 3) and readout.columns == list(CLASSES)
    chosen = set()
    for fold in range(5):
        train, test = readout.fold != fold, readout.fold == fold
        model = RidgeClassifierCV(alphas=ALPHAS).fit(features[train], labels[train])
        assert readout.alpha[fold] == model.alpha_
        assert relative_error(readout.predicted[test], model.decision_function(features[test])) < 1e-4
        assert readout.accuracy[fold] == pytest.approx(model.score(features[test], labels[test]))
        chosen.add(model.alpha_)
    assert readout.score > 0.45  # the classes are in the features: above chance (1/3)
    assert chosen - {ALPHAS[0], ALPHAS[-1]}  # an alpha inside the grid: the choice is tested, not an edge


def test_a_binary_probe_has_a_column_per_class_as_scikit_learn_s_one(study, tmp_path):
    two = study["labels"] % 2
    write_output(tmp_path / "two.h5", {"narrow": study["flat"]["narrow"].astype(np.float32)}, labels=two)
    readout = featdump.probe(tmp_path / "two.h5", folds=3, alphas=ALPHAS, device="cpu")["narrow"]
    features = study["flat"]["narrow"]
    for fold in range(3):
        train, test = readout.fold != fold, readout.fold == fold
        model = RidgeClassifierCV(alphas=ALPHAS).fit(features[train], two[train])
        assert readout.alpha[fold] == model.alpha_
        decision = model.decision_function(features[test])
        assert relative_error(readout.predicted[test, 1], decision) < 1e-4
        np.testing.assert_allclose(readout.predicted[test, 0], -readout.predicted[test, 1], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("layer", ["narrow", "wide"])
@pytest.mark.parametrize("per_target", [False, True])
def test_encode_equals_ridge_cv_with_targets_in_another_row_order(study, tmp_path, layer, per_target):
    targets = study["targets"]
    shuffled = np.random.default_rng(3).permutation(ROWS)
    table = write_table(tmp_path / "targets.csv", study["paths"],
                        {f"unit{index}": targets[:, index] for index in range(targets.shape[1])}, shuffled)
    readout = featdump.encode(study["file"], table, [layer], folds=4, alphas=ALPHAS, per_target=per_target,
                              device="cpu")[layer]
    assert readout.columns == ["unit0", "unit1", "unit2", "unit3"]
    features = study["flat"][layer]
    for fold in range(4):
        train, test = readout.fold != fold, readout.fold == fold
        model = RidgeCV(alphas=ALPHAS, alpha_per_target=per_target).fit(features[train], targets[train])
        np.testing.assert_array_equal(readout.alpha[fold], model.alpha_)
        assert relative_error(readout.predicted[test], model.predict(features[test])) < 1e-4
    for index in range(targets.shape[1]):
        actual, predicted = targets[:, index], readout.predicted[:, index]
        assert readout.r[index] == pytest.approx(np.corrcoef(actual, predicted)[0, 1], rel=1e-9)
        r2 = 1 - ((actual - predicted) ** 2).sum() / ((actual - actual.mean()) ** 2).sum()
        assert readout.r2[index] == pytest.approx(r2, rel=1e-9)
    assert readout.score == pytest.approx(np.median(readout.r)) and readout.score > 0.2


def test_targets_as_csv_tsv_npy_or_hdf5_with_its_own_paths_give_one_readout(study, tmp_path):
    targets, paths = study["targets"], study["paths"]
    order = np.random.default_rng(4).permutation(ROWS)
    columns = {f"v{index}": targets[:, index] for index in range(targets.shape[1])}
    np.save(tmp_path / "targets.npy", targets)
    with h5py.File(tmp_path / "brain.h5", "w") as h5file:
        group = h5file.create_group("it")
        group["responses"] = targets[order]
        group["paths"] = np.array([paths[row] for row in order], dtype=object).astype(h5py.string_dtype())
    forms = [write_table(tmp_path / "t.csv", paths, columns, order),
             write_table(tmp_path / "t.tsv", paths, columns, order[::-1], delimiter="\t"),
             tmp_path / "targets.npy", f"{tmp_path / 'brain.h5'}:it/responses"]
    results = [featdump.encode(study["file"], form, "narrow", folds=3, alphas=ALPHAS, device="cpu")["narrow"]
               for form in forms]
    for result in results[1:]:
        np.testing.assert_allclose(result.predicted, results[0].predicted, rtol=1e-12)
        np.testing.assert_array_equal(result.fold, results[0].fold)


def test_folds_are_stratified_seeded_and_recorded(study, tmp_path):
    labels = study["labels"]
    folds = assign_folds(ROWS, 4, seed=7, classes=labels)
    np.testing.assert_array_equal(folds, assign_folds(ROWS, 4, seed=7, classes=labels))
    assert not np.array_equal(folds, assign_folds(ROWS, 4, seed=8, classes=labels))
    sizes = np.bincount(folds)
    assert sizes.max() - sizes.min() <= 1
    for label in range(3):  # each class spread evenly: 30 images over 4 folds, 7 or 8 in each
        counts = np.bincount(folds[labels == label], minlength=4)
        assert counts.max() - counts.min() <= 1, counts
    result = run_featdump("probe", study["file"], "-l", "narrow", "--folds", "4", "--seed", "7", "--alphas",
                          "0.1,1,10", "-o", tmp_path / "p.h5")
    assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "p.h5", "r") as h5file:
        np.testing.assert_array_equal(h5file["fold"][:], folds)
        np.testing.assert_array_equal(h5file["alphas"][:], [0.1, 1.0, 10.0])
        assert h5file["readouts/narrow/predicted"].shape == (ROWS, 3)


def test_labels_from_a_csv_match_the_output_s_own(study, tmp_path):
    with open(tmp_path / "labels.csv", "w") as handle:
        for row in np.random.default_rng(5).permutation(ROWS):
            handle.write(f"{study['paths'][row]},{CLASSES[study['labels'][row]]}\n")
    own = featdump.probe(study["file"], "wide", folds=3, alphas=ALPHAS, device="cpu")["wide"]
    given = featdump.probe(study["file"], "wide", folds=3, alphas=ALPHAS, labels=tmp_path / "labels.csv",
                           device="cpu")["wide"]
    np.testing.assert_array_equal(given.fold, own.fold)
    np.testing.assert_allclose(given.predicted, own.predicted, rtol=1e-12)


def test_paths_the_two_sides_do_not_share_are_refused_unless_common(study, tmp_path):
    paths = [*study["paths"][5:], "extra/1.jpg", "extra/2.jpg"]
    values = np.concatenate([study["targets"][5:, 0], [1.0, 2.0]])
    table = write_table(tmp_path / "t.csv", paths, {"score": values})
    refused = run_featdump("encode", study["file"], table, "-o", tmp_path / "e.h5")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"5 of {str(study['file'])!r}'s 90 images have no row" in refused.stderr
    assert "2 of its 87 rows name no image" in refused.stderr and "--common" in refused.stderr
    result = run_featdump("encode", study["file"], table, "--common", "-l", "narrow", "--alphas", "1,10",
                          "-o", tmp_path / "e.h5")
    assert result.returncode == 0, result.stderr
    assert "--common: 2 of" in result.stderr and "87 rows name no image of the output ('extra/1.jpg', ...) and 5 " \
        f"of its 90 images have no row there ({study['paths'][0]!r}, ...): using the 85 both have." in result.stderr
    # what --common left out: counted, and one of each side named
    with h5py.File(tmp_path / "e.h5", "r") as h5file:
        assert len(h5file["fold"]) == 85 and h5file["readouts/narrow/predicted"].shape == (85, 1)
        assert [name.decode() for name in h5file["paths"][:]] == study["paths"][5:]


@pytest.mark.parametrize("memory", ["1GB", "24KB"])  # one slab read through h5py; many, each row's read straight
def test_common_fits_the_gram_of_the_rows_used_alone(study, tmp_path, monkeypatch, memory):
    used = np.arange(0, ROWS, 2)  # labels for half the rows
    labels = study["labels"]
    with open(tmp_path / "labels.csv", "w") as handle:
        handle.writelines(f"{study['paths'][row]},{CLASSES[labels[row]]}\n" for row in used)
    sizes, real = [], passes.gram

    def measured_gram(*arguments, **options):
        stats = real(*arguments, **options)
        sizes.append(tuple(stats.centred.shape))
        return stats

    monkeypatch.setattr(passes, "gram", measured_gram)
    readout = featdump.probe(study["file"], "wide", folds=3, alphas=ALPHAS, labels=tmp_path / "labels.csv",
                             common=True, memory=memory, device="cpu")["wide"]
    assert sizes == [(len(used), len(used))]  # not (90, 90)
    features = study["flat"]["wide"][used]
    for fold in range(3):
        train, test = readout.fold != fold, readout.fold == fold
        model = RidgeClassifierCV(alphas=ALPHAS).fit(features[train], labels[used][train])
        assert readout.alpha[fold] == model.alpha_
        assert relative_error(readout.predicted[test], model.decision_function(features[test])) < 1e-4


def test_a_probe_of_a_csv_s_labels_records_those_labels(study, tmp_path):
    """The CSV's classes (other than the output's folder labels) are the file's /labels and /classes: the accuracy
    recomputed from the file is the one recorded."""
    with open(tmp_path / "labels.csv", "w") as handle:
        handle.writelines(f"{path},{'odd' if row % 2 else 'even'}\n" for row, path in enumerate(study["paths"]))
    result = run_featdump("probe", study["file"], "--labels", tmp_path / "labels.csv", "-l", "narrow",
                          "--folds", "3", "-o", tmp_path / "p.h5")
    assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "p.h5", "r") as h5file:
        labels, fold = h5file["labels"][:], h5file["fold"][:]
        assert [name.decode() for name in h5file["columns"][:]] == ["even", "odd"]
        assert [str(name) for name in h5file["labels"].attrs["classes"]] == ["even", "odd"]
        assert labels.tolist() == [row % 2 for row in range(ROWS)]
        right = h5file["readouts/narrow/predicted"][:].argmax(1) == labels
        recorded = h5file["readouts/narrow/accuracy"][:]
    np.testing.assert_allclose([right[fold == number].mean() for number in range(3)], recorded)


def test_tables_as_spreadsheets_write_them(study, tmp_path):
    """A byte-order mark (Excel's UTF-8 CSV), spaces around the column names, labels that are equal numbers."""
    paths = study["paths"]
    table = tmp_path / "bom.csv"
    table.write_text("\ufeffpath, score \n" + "".join(f"{path},{row * 0.5}\n" for row, path in enumerate(paths)),
                     encoding="utf-8")
    encoded = featdump.encode(study["file"], table, "narrow", folds=3, device="cpu")["narrow"]
    assert encoded.columns == ["score"]
    with open(tmp_path / "numbers.csv", "w", encoding="utf-8-sig") as handle:
        handle.writelines(f"{path},{('1', '01', '1.0')[row % 3]}\n" for row, path in enumerate(paths))
    probed = featdump.probe(study["file"], "narrow", folds=3, labels=tmp_path / "numbers.csv", device="cpu")
    assert probed["narrow"].columns == ["01", "1", "1.0"]  # the same order whatever Python's hash seed


def test_targets_named_by_absolute_paths_under_the_image_root_are_matched(study, tmp_path):
    layers, labels = layers_with_signal()
    rooted = tmp_path / "rooted.h5"
    write_output(rooted, {"narrow": layers["narrow"]}, labels=labels, classes=CLASSES, root="/data/stimuli")
    absolute = write_table(tmp_path / "abs.csv", [f"/data/stimuli/{path}" for path in study["paths"]],
                           {"score": study["targets"][:, 0]})
    relative = write_table(tmp_path / "rel.csv", study["paths"], {"score": study["targets"][:, 0]})
    mine = featdump.encode(rooted, absolute, folds=3, device="cpu")["narrow"]
    theirs = featdump.encode(rooted, relative, folds=3, device="cpu")["narrow"]
    np.testing.assert_array_equal(mine.predicted, theirs.predicted)
    elsewhere = write_table(tmp_path / "other.csv", [f"/elsewhere/{path}" for path in study["paths"]],
                            {"score": study["targets"][:, 0]})
    with pytest.raises(UsageProblem) as refused:
        featdump.encode(rooted, elsewhere, device="cpu")
    assert f"the output {study['paths'][0]!r}, {study['paths'][1]!r}, ..." in str(refused.value)
    assert "image_root '/data/stimuli'" in str(refused.value)


def test_a_long_fit_is_announced_with_its_cost_and_counted_fold_by_fold(study, monkeypatch, caplog):
    """Thresholds lowered so that this small layer's fits count as long ones."""
    import featdump.readout.readouts as readouts

    monkeypatch.setattr(readouts, "_SAY_COST_ABOVE", 0.0)
    monkeypatch.setattr(readouts, "_SAY_COST_FROM", 1)
    monkeypatch.setattr(passes.FitClock, "quiet_below", 0.0)
    with caplog.at_level("INFO", logger="featdump"):
        featdump.probe(study["file"], "wide", folds=3, device="cpu")
    said = [record.getMessage() for record in caplog.records]
    cost = next(line for line in said if "its fit is 3 eigendecompositions of 60 x 60" in line)
    assert "fewer --folds, or the layer reduced at extract (--reduce wide=srp:4096" in cost
    folds = [line for line in said if "fitted (" in line]
    assert [line.split(": ", 1)[1].split(" fitted")[0] for line in folds] == [f"fold {k} of 3" for k in (1, 2, 3)]
    assert "s for the other 2)" in folds[0] and folds[-1].endswith("s so far).")


def test_bad_input_is_one_line(study, tmp_path):
    paths = study["paths"]
    with open(tmp_path / "one-class.csv", "w") as handle:
        handle.writelines(f"{path},cat\n" for path in paths)
    with open(tmp_path / "words.csv", "w") as handle:
        handle.write("path,score\n" + "".join(f"{path},{'high' if row == 4 else row}\n"
                                              for row, path in enumerate(paths)))
    nan = write_table(tmp_path / "nan.csv", paths, {"score": np.where(np.arange(ROWS) == 2, np.nan, 1.0)},
                      order=np.arange(ROWS)[::-1])  # the NaN on the CSV's line 89 (the output's row 3)
    with open(tmp_path / "empty-label.csv", "w") as handle:
        handle.writelines(f"{path},{'' if row == 5 else 'cat' if row % 2 else 'dog'}\n"
                          for row, path in enumerate(paths))
    twice = write_table(tmp_path / "twice.csv", [*paths, paths[0]], {"score": np.arange(ROWS + 1.0)})
    np.save(tmp_path / "short.npy", np.zeros(10))
    bad_rows = {"narrow": study["flat"]["narrow"].astype(np.float32)}
    bad_rows["narrow"][6, 3] = np.nan
    write_output(tmp_path / "nan-rows.h5", bad_rows, labels=study["labels"], classes=CLASSES)
    write_output(tmp_path / "unlabelled.h5", bad_rows, labels=np.full(ROWS, -1))  # not from class folders
    out = tmp_path / "r.h5"
    for arguments, message in (
        (["probe", study["file"], "--folds", "100", "-o", out], "90 images cannot be split into 100 folds"),
        (["probe", study["file"], "--labels", tmp_path / "one-class.csv", "-o", out], "two classes at least"),
        (["encode", study["file"], tmp_path / "words.csv", "-o", out], "'high' is not a number"),
        (["encode", study["file"], nan, "-o", out], "NaN or infinite target value (the first: line 89, 'score')"),
        (["probe", study["file"], "--labels", tmp_path / "empty-label.csv", "-o", out],
         f"gives 1 image an empty label ({paths[5]!r})"),
        (["encode", study["file"], twice, "-o", out], "twice"),
        (["encode", study["file"], tmp_path / "short.npy", "-o", out], "has 10 rows but"),
        (["encode", study["file"], tmp_path / "none.csv", "-o", out], "No targets file"),
        (["probe", study["file"], "-l", "layer9", "-o", out], "holds no layer 'layer9'"),
        (["probe", study["file"], "--alphas", "-1,2", "-o", out], "--alphas '-1,2'"),
        (["-q", "probe", tmp_path / "nan-rows.h5", "-o", out], f"holds NaN or inf in 1 row ({paths[6]!r}"),
        (["probe", tmp_path / "nothing.h5", "-o", out], "No file"),
        (["probe", tmp_path / "unlabelled.h5", "-o", out], "90 images have no label"),
    ):
        result = run_featdump(*arguments)
        assert result.returncode == 2 and message in result.stderr, (arguments, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert not out.exists()


def test_a_matrix_too_large_for_the_machine_is_refused_with_the_way_out(study, monkeypatch):
    monkeypatch.setattr(passes, "free_memory", lambda device: 10_000)  # a machine with 10 KB free
    with pytest.raises(UsageProblem, match=r"90 x 90 matrices.*--reduce wide=srp:4096"):
        featdump.probe(study["file"], "wide", device="cpu")


def test_result_is_drawn_described_and_done_when_run_again(study, tmp_path):
    pytest.importorskip("matplotlib")
    command = ["encode", study["file"], study["root"] / "targets.npy", "--alphas", "1:1e3:4", "-o",
               tmp_path / "enc.h5", "--plot", tmp_path / "enc.png"]
    np.save(study["root"] / "targets.npy", study["targets"])
    result = run_featdump(*command)
    assert result.returncode == 0, result.stderr
    assert "Wrote the encoding models of 2 layers over 90 images" in result.stderr and "median r" in result.stderr
    assert (tmp_path / "enc.png").stat().st_size > 5000
    described = run_featdump("info", tmp_path / "enc.h5")
    assert described.returncode == 0 and "featdump encode: ridge encoding models of 2 layers" in described.stdout
    assert "narrow: " in described.stdout and "wide: " in described.stdout
    as_json = json.loads(run_featdump("info", "--json", tmp_path / "enc.h5").stdout)
    assert as_json["result"] == "encode" and list(as_json["layers"]) == ["narrow", "wide"]
    fitted = featdump.encode(study["file"], study["root"] / "targets.npy", alphas="1:1e3:4", device="cpu")
    best = max(fitted.values(), key=lambda readout: readout.score)
    assert f"the best, {best.layer}: median r {best.score:.3f}" in result.stderr  # one median r everywhere
    for name, readout in fitted.items():
        assert as_json["measure"] == "median r" and as_json["layers"][name]["score"] == pytest.approx(readout.score)
        assert f"  {name}: pooled {readout.score:.3f} (folds " in described.stdout
    drawn = run_featdump("show", tmp_path / "enc.h5", "-o", tmp_path / "again.png")
    assert drawn.returncode == 0 and (tmp_path / "again.png").exists()
    again = run_featdump(*command)
    assert again.returncode == 0 and "Nothing to do: already wrote" in again.stderr, again.stderr
    loaded = featdump.encode(study["file"], study["root"] / "targets.npy", alphas="1:1e3:4", to=tmp_path / "enc.h5",
                             device="cpu")
    fresh = featdump.encode(study["file"], study["root"] / "targets.npy", alphas="1:1e3:4", device="cpu")
    for name in ("narrow", "wide"):
        np.testing.assert_array_equal(loaded[name].predicted, fresh[name].predicted)
        np.testing.assert_array_equal(loaded[name].r, fresh[name].r)


def test_the_probe_picture_s_chance_is_the_majority_class_s_share(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from featdump.faces.curves import draw_readouts

    labels = (np.arange(ROWS) % 10 >= 3).astype(np.int64)  # 30% / 70%
    layers, _ = layers_with_signal()
    write_output(tmp_path / "unbalanced.h5", {"narrow": layers["narrow"]}, labels=labels, classes=("few", "many"))
    featdump.probe(tmp_path / "unbalanced.h5", folds=3, device="cpu", to=tmp_path / "p.h5")
    with h5py.File(tmp_path / "p.h5", "r", locking=False) as h5file:
        figure = draw_readouts(plt, h5file)
    drawn = figure.axes[0].get_legend_handles_labels()[1]
    assert "chance (majority class, 0.70)" in drawn and "1 / classes (0.50)" in drawn, drawn


def test_probe_of_a_real_extraction_from_class_folders(tmp_path):
    write_images(tmp_path / "images", {"apples": 8, "pears": 8}, size=(40, 32))
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "layer4,avgpool", tmp_path / "images",
                          tmp_path / "feats.h5")
    assert result.returncode == 0, result.stderr
    readouts = featdump.probe(tmp_path / "feats.h5", folds=4, alphas=ALPHAS, device="cpu")
    labels = featdump.load(tmp_path / "feats.h5", "avgpool").labels
    for name in ("layer4", "avgpool"):  # wide (25,088 features) and wide (512 > 16 images)
        features = featdump.load(tmp_path / "feats.h5", name).features.reshape(16, -1).astype(np.float64)
        readout = readouts[name]
        assert readout.columns == ["apples", "pears"]
        for fold in range(4):
            train, test = readout.fold != fold, readout.fold == fold
            model = RidgeClassifierCV(alphas=ALPHAS).fit(features[train], labels[train])
            assert readout.alpha[fold] == model.alpha_
            assert relative_error(readout.predicted[test, 1], model.decision_function(features[test])) < 1e-4


@pytest.mark.slow  # a real process killed
def test_a_kill_resumes_at_the_first_layer_not_written(tmp_path):
    rng = np.random.default_rng(2)
    labels = np.arange(40) % 2
    layers = {f"block{index}": rng.standard_normal((40, 300_000), dtype=np.float32) for index in range(4)}
    write_output(tmp_path / "blocks.h5", layers, labels=labels)
    command = ["probe", tmp_path / "blocks.h5", "--memory", "4MB", "--device", "cpu", "-o", tmp_path / "p.h5"]
    process = start_featdump(*command)
    for line in process.stderr:
        if "The probe of block0 is in" in line:
            process.send_signal(signal.SIGKILL)
            break
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before the kill"
    assert (tmp_path / "p.h5.partial").exists() and not (tmp_path / "p.h5").exists()
    result = run_featdump(*command)
    assert result.returncode == 0, result.stderr
    assert "Resuming: 1 of 4 layers' read-outs are in" in result.stderr or "Resuming: 2 of 4" in result.stderr
    fresh = featdump.probe(tmp_path / "blocks.h5", device="cpu", memory="4MB")
    with h5py.File(tmp_path / "p.h5", "r") as h5file:
        assert list(h5file["readouts"]) == sorted(layers) and "writing" not in h5file
        for name in layers:
            np.testing.assert_allclose(h5file["readouts"][name]["predicted"][:], fresh[name].predicted, rtol=1e-9)


@pytest.mark.slow  # 480 MB written, two processes measured whole
def test_a_layer_wider_than_the_memory_bound_stays_within_it(tmp_path):
    rng = np.random.default_rng(1)
    wide = rng.standard_normal((60, 2_000_000), dtype=np.float32)  # 480 MB of features
    write_output(tmp_path / "wide.h5", {"wide": wide, "narrow": wide[:, :1000].copy()}, labels=np.arange(60) % 2)
    narrow_peak = peak_rss_mib("probe", tmp_path / "wide.h5", "-l", "narrow", "--memory", "32MB", "--device", "cpu",
                               "-o", tmp_path / "narrow.h5")
    wide_peak = peak_rss_mib("probe", tmp_path / "wide.h5", "-l", "wide", "--memory", "32MB", "--device", "cpu",
                             "-o", tmp_path / "wide-probe.h5")
    print(f"\npeak RSS: {narrow_peak:.0f} MiB for 1,000 features, {wide_peak:.0f} MiB for 2,000,000 (480 MB)")
    assert wide_peak - narrow_peak < 32 + 32, (narrow_peak, wide_peak)  # the slabs, and allocator slack


@pytest.mark.slow  # 392 MiB written, four processes measured whole
@pytest.mark.parametrize("command", ["probe", "encode"])
def test_a_read_out_given_memory_peaks_within_it_plus_the_stated_overhead(tmp_path, command):
    """The bound the docs state (readouts.md): a read-out given --memory M peaks at most M + 32 MiB above the same
    read-out of a narrow layer; here, a layer of resnet18 layer1's shape over 512 images (392 MiB), M = 64 MB."""
    rng = np.random.default_rng(2)
    wide = rng.standard_normal((512, 64, 56, 56), dtype=np.float32)
    write_output(tmp_path / "study.h5", {"layer1": wide, "narrow": wide[:, :4, 0, 0].copy()}, batch=64,
                 labels=np.arange(512) % 4, classes=("a", "b", "c", "d"))
    del wide
    extra = []
    if command == "encode":  # its targets: an .npy in the output's row order
        np.save(tmp_path / "targets.npy", rng.standard_normal((512, 5)))
        extra = [tmp_path / "targets.npy"]

    def peak(layer: str) -> float:
        return peak_rss_mib(command, tmp_path / "study.h5", *extra, "-l", layer, "--memory", "64MB", "--device",
                            "cpu", "-o", tmp_path / f"{layer}-{command}.h5")
    narrow, layer = peak("narrow"), peak("layer1")
    print(f"\n{command} peak RSS: {narrow:.0f} MiB narrow, {layer:.0f} MiB for a 392 MiB layer (--memory 64MB)")
    assert layer - narrow <= 64_000_000 / 2**20 + 32, (narrow, layer)  # M + the stated 32 MiB
    assert layer - narrow <= 0.25 * 392, (narrow, layer)  # the bound: a quarter of the layer


def test_a_float16_layer_reads_as_its_values_in_float32(tmp_path):
    layers, labels = layers_with_signal()
    half = {name: values.astype(np.float16) for name, values in layers.items()}
    write_output(tmp_path / "half.h5", half, labels=labels, classes=CLASSES)
    write_output(tmp_path / "widened.h5", {name: values.astype(np.float32) for name, values in half.items()},
                 labels=labels, classes=CLASSES)
    for name in layers:
        ours = featdump.probe(tmp_path / "half.h5", name, folds=3, alphas=ALPHAS, device="cpu")[name]
        widened = featdump.probe(tmp_path / "widened.h5", name, folds=3, alphas=ALPHAS, device="cpu")[name]
        np.testing.assert_array_equal(ours.alpha, widened.alpha)
        np.testing.assert_allclose(ours.predicted, widened.predicted, rtol=1e-9, atol=1e-12)


def test_stretches_of_a_film_are_cut_by_onset_whatever_order_its_rows_are_in():
    """One film's 12 TRs in time order, and the same TRs as an update leaves them (four read again, appended): each
    onset gets the same fold, three contiguous stretches of time."""
    onsets = np.arange(12) * 1.5
    fresh = assign_folds(12, 3, 0, videos=np.zeros(12), onsets=onsets)
    order = np.r_[0:3, 7:12, 3:7]  # rows 3-6 were skipped, then read again by --update
    updated = assign_folds(12, 3, 0, videos=np.zeros(12), onsets=onsets[order])
    assert dict(zip(onsets[order], updated)) == dict(zip(onsets, fresh))
    np.testing.assert_array_equal(fresh, np.repeat([0, 1, 2], 4))


def test_targets_name_paths_in_either_unicode_form(tmp_path):
    """An image listed as "café" composed (NFC) matches a targets table that spells it decomposed (NFD)."""
    import unicodedata

    folder = tmp_path / "images"
    write_images(folder, {"": 6}, size=(40, 32))
    for index, path in enumerate(sorted(folder.iterdir())):
        path.rename(folder / unicodedata.normalize("NFC", f"café_{index}{path.suffix}"))
    assert run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", folder,
                        tmp_path / "out.h5").returncode == 0
    paths = featdump.load(tmp_path / "out.h5", "avgpool").paths
    (tmp_path / "y.csv").write_text("path,y\n" + "".join(
        f"{unicodedata.normalize('NFD', path)},{index}\n" for index, path in enumerate(paths)))
    fitted = run_featdump("encode", tmp_path / "out.h5", tmp_path / "y.csv", "--folds", "2", "-o", tmp_path / "e.h5")
    assert fitted.returncode == 0, fitted.stderr


def test_the_alphas_grid_from_a_list_a_range_or_numbers_and_a_bad_one_refused():
    from featdump.errors import BadOption
    from featdump.readout.ridge import parse_alphas

    np.testing.assert_allclose(parse_alphas("0.1,1,10"), [0.1, 1, 10])
    np.testing.assert_allclose(parse_alphas("1e-2:1e2:5"), [1e-2, 1e-1, 1, 10, 100])
    np.testing.assert_allclose(parse_alphas([3, 4]), [3, 4])
    for bad in ("", "0,1", "a:b:c", "-1"):
        with pytest.raises(BadOption, match="give positive numbers"):
            parse_alphas(bad)


def test_an_image_with_several_rows_keeps_them_in_one_fold(tmp_path, caplog):
    """An output naming 10 of its 30 images twice (a list that named them twice): encode deals images, not rows, to
    the folds, so no row is held out while its copy trains; said in one line."""
    import logging

    from tests.makers.outputs import write_output

    rng = np.random.default_rng(0)
    paths = [f"a/{index:03d}.jpg" for index in range(30)] + [f"a/{index:03d}.jpg" for index in range(10)]
    write_output(tmp_path / "twice.h5", {"pooled": rng.standard_normal((40, 5)).astype(np.float32)}, paths=paths)
    table = write_table(tmp_path / "targets.csv", paths[:30], {"y": rng.standard_normal(30)})
    with caplog.at_level(logging.INFO, logger="featdump"):
        readout = featdump.encode(tmp_path / "twice.h5", table, ["pooled"], folds=4, device="cpu")["pooled"]
    np.testing.assert_array_equal(readout.fold[:10], readout.fold[30:])
    assert sorted(np.bincount(readout.fold).tolist()) == [10, 10, 10, 10]  # balanced by rows
    assert "10 images have more than one row: each one's rows are kept in one fold." in caplog.text


def test_a_probe_s_info_gives_each_layer_s_interval_and_mcnemar_s_tests_between_layers(tmp_path):
    """A layer that separates two classes and one of noise, 200 images: info gives each held-out accuracy with its
    Wilson interval (as statsmodels computes it) and McNemar's exact test between them on the same images (as a
    binomial of the discordant images), Bonferroni-corrected."""
    from scipy.stats import binomtest

    from featdump.faces.info import describe
    from featdump.readout.paired import correct, wilson
    from tests.makers.outputs import write_output

    rng = np.random.default_rng(2)
    labels = np.arange(200) % 2
    signal = rng.standard_normal((200, 8)) + 1.5 * labels[:, None]
    write_output(tmp_path / "out.h5", {"signal": signal.astype(np.float32),
                                       "noise": rng.standard_normal((200, 8)).astype(np.float32)}, labels=labels)
    featdump.probe(tmp_path / "out.h5", folds=4, device="cpu", to=tmp_path / "probes.h5")
    lines = "\n".join(describe(tmp_path / "probes.h5"))
    with h5py.File(tmp_path / "probes.h5") as h5file:
        rights = {name: correct(h5file["readouts"][name]["predicted"][:], h5file["labels"][:])
                  for name in ("signal", "noise")}
    low, high = wilson(int(rights["signal"].sum()), 200)
    assert f"  signal: {rights['signal'].mean():.3f} ({low:.3f} to {high:.3f})" in lines, lines
    share = rights["signal"].mean()  # Wilson's interval by its formula, apart from featdump's
    centre = (share + 1.96 ** 2 / 400) / (1 + 1.96 ** 2 / 200)
    assert (low + high) / 2 == pytest.approx(centre, abs=1e-4) and low < share < high
    only_signal = int((rights["signal"] & ~rights["noise"]).sum())
    only_noise = int((~rights["signal"] & rights["noise"]).sum())
    p = binomtest(only_signal, only_signal + only_noise, 0.5).pvalue
    assert (f"  signal vs noise: {only_signal} right only in signal, {only_noise} only in noise, p = {p:.3g}"
            in lines), lines
    assert p < 0.001
