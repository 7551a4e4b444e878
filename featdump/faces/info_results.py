"""What `featdump info` says of the file of an analysis (`rdm`, `cka`, `probe`, `encode`, `top`): what it is over,
how far it got, what it holds and how to read it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from featdump.output.layout import open_to_read, partial_path, text_of


def read_result(path: Path) -> dict | None:
    """What a file of `featdump rdm`, `cka`, `probe` or `encode` (or its .partial) at PATH holds, as plain values;
    None for any other file."""
    path = path if path.exists() else partial_path(path)
    try:
        with open_to_read(path) as h5file:
            if "made_from" not in h5file.attrs:
                return None  # (a featdump output: `info` answers it without the modules below)
            from featdump.faces.curves import is_readouts, layer_scores, layer_summaries
            from featdump.readout.scores import MEASURES
            from featdump.units.top import GROUP as TOP
            state = {"state": "complete" if h5file.attrs.get("complete", False) else "partial", "file": str(path),
                     "images": len(h5file["paths"]) if "paths" in h5file else None}
            if "rdms" in h5file:
                held = list(h5file["rdms"])
                order = [text_of(name) for name in h5file.attrs.get("layers", []) if text_of(name) in held]
                return {**state, "result": "rdm", "metric": text_of(h5file.attrs.get("metric")),
                        "layers": order + [name for name in held if name not in order]}
            if "cka" in h5file:
                matrix = h5file["cka"]
                return {**state, "result": "cka", "unbiased": bool(matrix.attrs.get("unbiased", False)),
                        "rows": [text_of(name) for name in matrix.attrs["rows"]],
                        "columns": [text_of(name) for name in matrix.attrs["columns"]], "cka": matrix[:].tolist()}
            if TOP in h5file:
                ranked = h5file[TOP]
                source = json.loads(h5file.attrs["made_from"]).get("source", {}).get("file", "OUTPUT")
                return {**state, "result": "top", "layers": {name: len(ranked[name]["rows"]) for name in ranked},
                        "k": int(h5file.attrs.get("k", 0)), "score": text_of(h5file.attrs.get("score")),
                        "source": source}
            if not is_readouts(h5file):
                return None
            kind, names, scores = layer_scores(h5file)
            summaries = layer_summaries(h5file, kind, names)
            return {"state": "complete" if h5file.attrs.get("complete", False) else "partial", "file": str(path),
                    "result": kind, "images": len(h5file["fold"]), "measure": MEASURES[kind],
                    "columns": [text_of(name) for name in h5file["columns"][:]],
                    "layers": {name: {"score": summary, "mean": float(np.nanmean(row)), "folds": row.tolist()}
                               for name, summary, row in zip(names, summaries, scores)}}
    except OSError:
        return None


def _matrix_lines(results: dict) -> list[str]:
    """What `featdump info` says of an RDMS.h5 or CKA.h5."""
    lines = [f"file:       {results['file']}",
             f"complete:   {'yes' if results['state'] == 'complete' else 'no (run the same command to resume)'}",
             f"rows:       {results['images']} (images, or clips of videos)"]
    if results["result"] == "rdm":
        lines += [f"result:     featdump rdm: {results['metric']} RDMs of {len(results['layers'])} layers",
                  "layers:"] + [f"  {name}" for name in results["layers"]]
    else:
        lines += [f"result:     featdump cka: {'unbiased ' if results['unbiased'] else ''}linear CKA, "
                  f"{len(results['rows'])} x {len(results['columns'])} layers", "cka:"]
        lines += [f"  {row}: " + ", ".join(f"{column} {value:.3f}" for column, value in zip(results["columns"], values))
                  for row, values in zip(results["rows"], results["cka"])]
    return lines + [f"draw:       featdump show {results['file']}"]


def _top_lines(results: dict) -> list[str]:
    """What `featdump info` says of a TOP.h5."""
    return [f"file:       {results['file']}",
            f"complete:   {'yes' if results['state'] == 'complete' else 'no (run the same command to resume)'}",
            f"rows:       {results['images']} (images, or clips of videos)",
            f"result:     featdump top: each unit's {results['k']} highest and lowest rows ({results['score']} over "
            "its positions), its histogram and its rows at quantiles", "layers:"] + \
        [f"  {name}: {units} units" for name, units in results["layers"].items()] + \
        [f"read:       featdump.top({results['source']!r}, k={results['k']}) (the output it ranks) or h5py "
         "f['top/LAYER/rows']"]


def result_lines(path: Path, results: dict) -> list[str]:
    """Lines saying what the file of `featdump rdm`, `cka`, `probe`, `encode` or `top` at PATH holds."""
    if results["result"] in ("rdm", "cka"):
        return _matrix_lines(results)
    if results["result"] == "top":
        return _top_lines(results)
    from featdump.faces.curves import readout_lines

    with open_to_read(path) as h5file:
        return readout_lines(path, h5file)
