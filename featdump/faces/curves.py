"""Curves: a PROBES.h5 or ENC.h5 drawn as the picture papers show: accuracy (or median r) by layer, in the model's
order, each fold's score as a dot and their mean with its spread (`--plot`, `featdump show RESULTS`); and the lines
`featdump info` says of such a file."""

from __future__ import annotations

import h5py
import numpy as np

from featdump.faces.regions import has_regions, region_lines
from featdump.output.layout import text_of
from featdump.readout.scores import MEASURES, chance, layer_score

GROUP = "readouts"  # as analysis/readouts writes it (read here without importing torch)


def is_readouts(h5file: h5py.File) -> bool:
    return GROUP in h5file and "fold" in h5file


def layer_summaries(h5file: h5py.File, kind: str, names: list[str]) -> np.ndarray:
    """Each layer's one number (`readout.scores`), as the summary line and `Readout.score` give it."""
    def read(name: str, key: str):
        return h5file[GROUP][name][key][:] if key in h5file[GROUP][name] else None
    return np.array([layer_score(kind, read(name, "accuracy"), read(name, "r")) for name in names])


def layer_scores(h5file: h5py.File) -> tuple[str, list[str], np.ndarray]:
    """(kind, the layers in their recorded order, (layers, K) each fold's score) of a finished or partial result."""
    kind = text_of(h5file.attrs.get("kind")) or text_of(dict(_made_from(h5file)).get("kind", "probe"))
    held = list(h5file[GROUP])
    recorded = [text_of(name) for name in h5file.attrs.get("layers", [])] or list(_made_from(h5file).get("layers", []))
    names = [name for name in recorded if name in held] + [name for name in held if name not in recorded]
    scores = np.array([h5file[GROUP][name]["fold_score"][:] for name in names]).reshape(len(names), -1)
    return kind, names, scores


def draw_readouts(plt, h5file: h5py.File):
    kind, names, scores = layer_scores(h5file)
    measure = MEASURES[kind]
    figure, axis = plt.subplots(figsize=(max(4.5, 0.5 * len(names) + 2.5), 4))
    places = np.arange(len(names))
    for fold in range(scores.shape[1]):
        axis.scatter(places, scores[:, fold], s=10, color="0.6", zorder=2,
                     label=f"each fold's {measure}" if fold == 0 else None)
    summaries = layer_summaries(h5file, kind, names)
    spread = np.nanstd(scores, 1) if kind == "probe" else None
    axis.errorbar(places, summaries, yerr=spread, color="C0", marker="o", capsize=3, zorder=3,
                  label="accuracy (mean ± sd over folds)" if kind == "probe" else
                  "median r (over targets, every image held out once)")
    if kind == "probe":
        majority, uniform = chance(h5file["labels"][:])
        axis.axhline(majority, color="0.4", linestyle=":", linewidth=1,
                     label=f"chance (majority class, {majority:.2f})")
        if abs(majority - uniform) > 1e-9:
            axis.axhline(uniform, color="0.7", linestyle=":", linewidth=1, label=f"1 / classes ({uniform:.2f})")
    axis.set_xticks(places, names, rotation=60, ha="right", fontsize=8)
    axis.set_ylabel(measure)
    images, folds = len(h5file["fold"]), scores.shape[1]
    title = "linear probe" if kind == "probe" else f"encoding model ({len(h5file['columns'])} targets)"
    axis.set_title(f"{title}, {images} images, {folds}-fold", fontsize=10)
    axis.legend(fontsize=7)
    figure.tight_layout()
    return figure


def readout_lines(path, h5file: h5py.File) -> list[str]:
    """What `featdump info` says of a PROBES.h5 or ENC.h5."""
    kind, names, scores = layer_scores(h5file)
    columns = [text_of(name) for name in h5file["columns"][:]]
    what = "classes" if kind == "probe" else "targets"
    lines = [f"file:       {path}",
             f"result:     featdump {kind}: {'ridge classifiers' if kind == 'probe' else 'ridge encoding models'} "
             f"of {len(names)} layer{'s' * (len(names) != 1)}",
             f"complete:   {'yes' if h5file.attrs.get('complete', False) else 'no (run the same command to resume)'}",
             f"images:     {len(h5file['fold'])}, {scores.shape[1] if len(names) else '?'} folds",
             f"{what + ':':<11} {len(columns)} ({', '.join(columns[:8])}{', ...' if len(columns) > 8 else ''})",
             f"alphas:     {', '.join(f'{value:g}' for value in h5file['alphas'][:])}",
             *_time_lines(_made_from(h5file), h5file),
             "layers (accuracy, mean over folds ± sd):" if kind == "probe" else
             "layers (median r over targets of the held-out predictions pooled over the folds; then each fold's "
             "own median r, lowest to highest):"]
    summaries = layer_summaries(h5file, kind, names)
    lines += [f"  {name}: {summary:.3f} ± {np.nanstd(row):.3f}" if kind == "probe" else
              f"  {name}: pooled {summary:.3f} (folds {np.nanmin(row):.3f} to {np.nanmax(row):.3f})"
              for name, summary, row in zip(names, summaries, scores)]
    if kind == "probe" and names:
        lines += _probe_test_lines(h5file, names)
    if has_regions(h5file):
        lines += region_lines(h5file)
    lines.append("draw:       featdump show " + str(path))
    return lines


def _probe_test_lines(h5file: h5py.File, names: list[str]) -> list[str]:
    """Each layer's held-out accuracy over the images with its 95% interval, and McNemar's tests between the
    layers on the same images (every pair up to 6 layers; else each layer against the next)."""
    from featdump.readout.paired import correct, paired_tests, wilson

    labels = h5file["labels"][:]
    rights = [correct(h5file[GROUP][name]["predicted"][:], labels) for name in names]
    lines = ["held out (every image once): accuracy, 95% interval (Wilson)"]
    for name, right in zip(names, rights):
        low, high = wilson(int(right.sum()), len(right))
        lines.append(f"  {name}: {right.mean():.3f} ({low:.3f} to {high:.3f})")
    if len(names) < 2:
        return lines
    if len(names) <= 6:
        pairs = paired_tests(names, rights)
        lines.append(f"McNemar (the same images; p Bonferroni-corrected over {len(pairs)} pairs):")
    else:
        pairs = [paired_tests([first, second], [one, other])[0] for first, second, one, other in
                 zip(names, names[1:], rights, rights[1:])]
        lines.append("McNemar (the same images; each layer against the next, uncorrected):")
    lines += [f"  {pair.first} vs {pair.second}: {pair.only_first} right only in {pair.first}, {pair.only_second} "
              f"only in {pair.second}, p = {pair.p_corrected:.3g}" for pair in pairs]
    return lines


def _time_lines(made_from: dict, h5file: h5py.File) -> list[str]:
    """How a read-out of clip rows handled time: its folds (the scheme used), delays and gap."""
    lines = []
    if made_from.get("folds_by") == "video":
        paths = [text_of(item) for item in h5file["paths"][:]] if "paths" in h5file else []
        fold = h5file["fold"][:]
        whole = all(len(set(fold[[row for row, path in enumerate(paths) if path == video]])) == 1
                    for video in set(paths))
        lines.append("folds:      whole videos, each in one fold" if whole else
                     "folds:      stretches of time of each video, one a fold (fewer videos than folds)")
    if made_from.get("delays"):
        lines.append(f"delays:     {', '.join(map(str, made_from['delays']))} steps of {made_from['delay_step']:g} s")
    if made_from.get("gap"):
        lines.append(f"gap:        {made_from['gap']:g} s left out of training on both sides of a held-out stretch")
    return lines


def _made_from(h5file: h5py.File) -> dict:
    import json

    return json.loads(h5file.attrs.get("made_from", "{}"))
