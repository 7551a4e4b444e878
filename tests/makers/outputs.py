"""Synthetic featdump outputs, written by featdump's own writer, for the tests and the benchmarks of what reads
finished outputs (analyses, read-outs, training)."""

from __future__ import annotations

import numpy as np

from featdump.output.specs import DatasetSpec
from featdump.output.writer import FeatureWriter


def write_output(path, layers: dict[str, np.ndarray], batch: int = 8, labels=None, classes=("a", "b"),
                 root: str | None = None):
    """A featdump output written by featdump's own writer, holding LAYERS' rows (one image path per row:
    CLASS/NNNN.jpg, relative to ROOT when given), labelled LABELS (default: rows alternate between the two
    CLASSES)."""
    rows = len(next(iter(layers.values())))
    labels = np.arange(rows) % 2 if labels is None else np.asarray(labels)
    specs = {name: DatasetSpec(values.shape[1:], str(values.dtype)) for name, values in layers.items()}
    attributes = {"model": "synthetic", "layers": list(layers), **({"image_root": root} if root else {})}
    writer = FeatureWriter.open(path, specs, {"image_count": rows, "layers": list(layers)}, attributes,
                                list(classes), batch)
    for start in range(0, rows, batch):
        stop = min(start + batch, rows)
        writer.append({name: values[start:stop] for name, values in layers.items()},
                      [f"{classes[labels[row]]}/{row:04d}.jpg" for row in range(start, stop)],
                      [int(labels[row]) for row in range(start, stop)], [], stop)
    return writer.finish()
