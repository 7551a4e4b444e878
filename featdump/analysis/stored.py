"""Stored: an output as an analysis reads it: its committed rows (a file being extended gives those it had when
read), their paths and labels, its layers in model order, and what identifies it for a resumable result."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from featdump.forward.patterns import select_stored
from featdump.output.layout import Output, occurrences, text_of


@dataclass(frozen=True)
class Stored:
    path: Path
    rows: int
    paths: list[str]
    labels: np.ndarray
    classes: list[str]
    layers: list[str]  # in the order the run recorded them (its model's order)
    fingerprint: str  # a digest of the run's fingerprint: which run made the file
    root: str = ""  # the image_root the paths are relative to (a folder, or a URL prefix)
    clip_starts: np.ndarray | None = None  # a video job's: each row's clip start (seconds)
    clip_ends: np.ndarray | None = None  # ... its offset (seconds; None in files made before it was recorded)
    video_rates: np.ndarray | None = None  # ... its video's frame rate (None in files made before)
    stale: int = 0  # rows whose image was gone or changed at the last --update (`featdump info` names them)

    @classmethod
    def read(cls, path: str | Path) -> Stored:
        path = Path(path)
        with Output.open(path) as output:
            layers = output.layers
            fingerprint = hashlib.sha256(json.dumps(output.fingerprint, sort_keys=True).encode()).hexdigest()[:16]
            rows = output.committed.rows
            coordinate = {name: output.file[name][:rows] if name in output.file else None
                          for name in ("clip_start", "clip_end", "video_rate")}
            return cls(path, rows, output.paths(), output.labels(), output.classes, layers, fingerprint,
                       text_of(output.attrs.get("image_root")) or "", coordinate["clip_start"],
                       coordinate["clip_end"], coordinate["video_rate"], output.stale_count())

    def row_keys(self) -> list[tuple]:
        """What names each row across outputs: (path, clip start) for clips of videos; else (path, k) for the
        k-th row of its path (a tar member named twice)."""
        if self.clip_starts is not None:
            return [(path, round(float(start), 6)) for path, start in zip(self.paths, self.clip_starts)]
        return list(zip(self.paths, occurrences(self.paths)))

    def select(self, selectors: list[str] | None) -> list[str]:
        """The layers SELECTORS name (patterns as in extract); all of them when None."""
        return list(self.layers) if not selectors else select_stored(selectors, self.layers, repr(str(self.path)))

    def identity(self) -> dict:
        """What a result over this file records, to be resumed only over the same rows of the same run."""
        rows = hashlib.sha256("\n".join(self.paths).encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return {"file": str(self.path.resolve()), "rows": self.rows, "paths": rows, "run": self.fingerprint}

    @contextmanager
    def dataset(self, layer: str) -> Iterator[h5py.Dataset]:
        """LAYER's dataset, the file open only while it is read (an --update can commit between two layers)."""
        with Output.open(self.path) as output:
            yield output.features(layer)

    def size(self, layer: str) -> int:
        """Bytes of LAYER's committed rows."""
        with self.dataset(layer) as dataset:
            return self.rows * int(np.prod(dataset.shape[1:])) * dataset.dtype.itemsize


def listed(layers: list[str] | str | None) -> list[str] | None:
    """LAYERS given as a list or as comma-separated text, as a list (None: all of them)."""
    if layers is None:
        return None
    return [part for part in (layers.split(",") if isinstance(layers, str) else layers) if part.strip()]
