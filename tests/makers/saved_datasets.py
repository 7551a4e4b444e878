"""Folders as Hugging Face's `Dataset.save_to_disk` writes them (datasets 5.2: `state.json`, `dataset_info.json`,
`data-0000N-of-0000M.arrow` Arrow IPC streams of an `image` struct of bytes and path and a ClassLabel `label`), and
a `DatasetDict`'s (`dataset_dict.json`, a folder per split), written with pyarrow, without the `datasets` package."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

FEATURES = {"image": {"_type": "Image"}, "label": {"names": ["cat", "dog"], "_type": "ClassLabel"}}


def save_dataset(folder: Path, images: list[bytes], labels: list[int], files: int = 1, batch: int = 4) -> Path:
    """IMAGES (encoded) and LABELS saved in FOLDER as save_to_disk saves a Dataset, over FILES Arrow files of record
    batches of BATCH rows."""
    folder.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])), ("label", pa.int64())],
                       metadata={"huggingface": json.dumps({"info": {"features": FEATURES}})})
    per_file = -(-len(images) // files)
    names = []
    for index in range(files):
        name = f"data-{index:05d}-of-{files:05d}.arrow"
        rows = range(index * per_file, min(len(images), (index + 1) * per_file))
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            for start in range(rows.start, rows.stop, batch):
                part = range(start, min(rows.stop, start + batch))
                writer.write_batch(pa.record_batch(
                    [pa.array([{"bytes": images[row], "path": f"{row}.png"} for row in part], schema.field(0).type),
                     pa.array([labels[row] for row in part], pa.int64())], schema=schema))
        names.append(name)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": name} for name in names],
                                                   "_fingerprint": "0", "_split": None}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": FEATURES}))
    return folder


def save_dataset_dict(folder: Path, splits: dict[str, tuple[list[bytes], list[int]]]) -> Path:
    """SPLITS ({name: (images, labels)}) saved in FOLDER as DatasetDict.save_to_disk saves them."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, (images, labels) in splits.items():
        save_dataset(folder / name, images, labels)
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
    return folder
