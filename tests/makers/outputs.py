"""Synthetic featdump outputs, written by featdump's own writer, for the tests and the benchmarks of what reads
finished outputs (analyses, read-outs, training)."""

from __future__ import annotations

import os

import numpy as np

from featdump.output.specs import DatasetSpec
from featdump.output.writer import FeatureWriter


def write_output(path, layers: dict[str, np.ndarray], batch: int = 8, labels=None, classes=("a", "b"),
                 root: str | None = None, paths: list[str] | None = None):
    """A featdump output written by featdump's own writer, holding LAYERS' rows (one image path per row:
    CLASS/NNNN.jpg, relative to ROOT when given), labelled LABELS (default: rows alternate between the two
    CLASSES), or named PATHS; each row's file_stats those of its file under ROOT, where it is there (else
    unknown)."""
    rows = len(next(iter(layers.values())))
    labels = np.arange(rows) % 2 if labels is None else np.asarray(labels)
    specs = {name: DatasetSpec(values.shape[1:], str(values.dtype)) for name, values in layers.items()}
    attributes = {"model": "synthetic", "layers": list(layers), **({"image_root": root} if root else {})}
    writer = FeatureWriter.open(path, specs, {"image_count": rows, "layers": list(layers)}, attributes,
                                list(classes), batch)
    named = paths if paths is not None else [f"{classes[labels[row]]}/{row:04d}.jpg" for row in range(rows)]
    for start in range(0, rows, batch):
        stop = min(start + batch, rows)
        writer.append({name: values[start:stop] for name, values in layers.items()}, named[start:stop],
                      [int(labels[row]) for row in range(start, stop)], [], stop,
                      [_file_stats(root, named[row]) for row in range(start, stop)])
    return writer.finish()


def _file_stats(root: str | None, relative: str) -> tuple[int, int]:
    """(size, mtime_ns) of ROOT/RELATIVE as a run records them, or (-1, -1) where there is no such file."""
    try:
        found = os.stat(os.path.join(root, relative)) if root else None
    except OSError:
        found = None
    return (found.st_size, found.st_mtime_ns) if found is not None else (-1, -1)
