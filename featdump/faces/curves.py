"""Curves: a PROBES.h5 or ENC.h5 drawn as the picture papers show: accuracy (or median r) by layer, in the model's
order, each fold's score as a dot and their mean with its spread (`--plot`, `featdump show RESULTS`); and the lines
`featdump info` says of such a file."""

from __future__ import annotations

import h5py
import numpy as np

from featdump.output.layout import text_of

GROUP = "readouts"  # as analysis/readouts writes it (read here without importing torch)


def is_readouts(h5file: h5py.File) -> bool:
    return GROUP in h5file and "fold" in h5file


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
    measure = "accuracy" if kind == "probe" else "median r"
    figure, axis = plt.subplots(figsize=(max(4.5, 0.5 * len(names) + 2.5), 4))
    places = np.arange(len(names))
    for fold in range(scores.shape[1]):
        axis.scatter(places, scores[:, fold], s=10, color="0.6", zorder=2, label="folds" if fold == 0 else None)
    mean, spread = np.nanmean(scores, 1), np.nanstd(scores, 1)
    axis.errorbar(places, mean, yerr=spread, color="C0", marker="o", capsize=3, zorder=3,
                  label=f"mean {measure} (± sd over folds)")
    if kind == "probe":
        classes = len(h5file["columns"])
        axis.axhline(1.0 / classes, color="0.4", linestyle=":", linewidth=1, label=f"chance (1/{classes})")
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
    measure = "accuracy" if kind == "probe" else "median r"
    columns = [text_of(name) for name in h5file["columns"][:]]
    what = "classes" if kind == "probe" else "targets"
    lines = [f"file:       {path}",
             f"result:     featdump {kind}: {'ridge classifiers' if kind == 'probe' else 'ridge encoding models'} "
             f"of {len(names)} layer{'s' * (len(names) != 1)}",
             f"complete:   {'yes' if h5file.attrs.get('complete', False) else 'no (run the same command to resume)'}",
             f"images:     {len(h5file['fold'])}, {scores.shape[1] if len(names) else '?'} folds",
             f"{what + ':':<11} {len(columns)} ({', '.join(columns[:8])}{', ...' if len(columns) > 8 else ''})",
             f"alphas:     {', '.join(f'{value:g}' for value in h5file['alphas'][:])}",
             f"layers ({measure}, mean over folds ± sd):"]
    lines += [f"  {name}: {np.nanmean(row):.3f} ± {np.nanstd(row):.3f}" for name, row in zip(names, scores)]
    lines.append("draw:       featdump show " + str(path))
    return lines


def _made_from(h5file: h5py.File) -> dict:
    import json

    return json.loads(h5file.attrs.get("made_from", "{}"))
