"""Folders Hugging Face's `save_to_disk` writes (`featdump.inputs.saved_datasets`, registered as a plugin is): a
Dataset's rows equal its images read as files, in order, with its ClassLabel names as classes; a DatasetDict's
split chosen with --split, refused without when it has several; rows read memory-mapped, not loaded; a save with
rows appended marks none stale; and the readers' conformance kit passes over it."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import featdump
from featdump.testing.readers import ReaderConformance, Sample

from .helpers import run_featdump
from .makers.saved_datasets import save_dataset, save_dataset_dict

SMALL = ["extract", "-m", "featdump.testing.models:small", "--transform", "featdump.testing.models:small_transform",
         "-l", "1,4"]


def pngs(count: int, start: int = 0) -> list[bytes]:
    data = []
    for index in range(start, start + count):
        buffer = io.BytesIO()
        Image.fromarray(np.random.default_rng(index).integers(0, 256, (24, 32, 3), dtype=np.uint8)).save(buffer, "PNG")
        data.append(buffer.getvalue())
    return data


def test_a_saved_dataset_s_rows_equal_its_images_as_files_with_its_classes(tmp_path):
    images = pngs(10)
    save_dataset(tmp_path / "saved", images, [index % 2 for index in range(10)], files=3, batch=2)
    for index, data in enumerate(images):
        (tmp_path / "files" / f"{index:02d}").mkdir(parents=True)
        (tmp_path / "files" / f"{index:02d}" / "image.png").write_bytes(data)
    assert run_featdump(*SMALL, tmp_path / "saved", tmp_path / "saved.h5").returncode == 0
    assert run_featdump(*SMALL, tmp_path / "files", tmp_path / "files.h5").returncode == 0
    saved, files = featdump.load(tmp_path / "saved.h5", "1"), featdump.load(tmp_path / "files.h5", "1")
    assert saved.paths == [f"saved/{index}" for index in range(10)]
    np.testing.assert_array_equal(saved.features, files.features)
    assert list(saved.labels) == [index % 2 for index in range(10)]
    told = run_featdump("info", tmp_path / "saved.h5")
    assert "classes:    2 (cat, dog)" in told.stdout, told.stdout


def test_a_dataset_dict_s_split_is_chosen_with_split_and_refused_without(tmp_path):
    save_dataset_dict(tmp_path / "dict", {"train": (pngs(6), [0] * 6), "test": (pngs(3, start=50), [1] * 3)})
    refused = run_featdump(*SMALL, tmp_path / "dict", tmp_path / "out.h5")
    assert refused.returncode == 2 and "splits train, test: choose one with --split" in refused.stderr
    assert not (tmp_path / "out.h5").exists()
    chosen = run_featdump(*SMALL, "--split", "test", tmp_path / "dict", tmp_path / "out.h5")
    assert chosen.returncode == 0, chosen.stderr
    assert featdump.load(tmp_path / "out.h5", "4").paths == ["test/0", "test/1", "test/2"]
    wrong = run_featdump(*SMALL, "--split", "validation", tmp_path / "dict", tmp_path / "other.h5")
    assert wrong.returncode == 2 and "--split validation: not one of its splits" in wrong.stderr


def test_rows_are_read_memory_mapped_not_loaded(tmp_path):
    """A batch of 4 rows of a 40 MB Arrow file: the process's memory grows by far less than the file."""
    import tracemalloc

    from featdump.inputs.saved_datasets import read_saved

    noise = np.random.default_rng(0).integers(0, 256, (512, 512, 3), dtype=np.uint8)
    big = []
    for index in range(50):
        buffer = io.BytesIO()
        Image.fromarray(np.roll(noise, index, axis=0)).save(buffer, "PNG")  # ~0.8 MB each, incompressible
        big.append(buffer.getvalue())
    save_dataset(tmp_path / "big", big, [0] * 50, batch=10)
    images = read_saved(tmp_path / "big")
    tracemalloc.start()
    try:
        read = [found for _, found in images.open_as_ready([20, 21, 22, 23])]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [found.data for found in read] == big[20:24]
    assert peak < 8e6, peak  # the four images' bytes and little else: not the file's 40 MB


@pytest.mark.slow  # the kit's dozen extractions: CI's full run; the reader's own tests above are quick
class TestSavedDatasets(ReaderConformance):
    reader = "saved"

    def make_input(self, folder, rows: int = 8, corrupt: int | None = None):
        images = pngs(rows)
        if corrupt is not None:
            images[corrupt] = b"junk"
        save_dataset(folder / "saved", images, [index % 2 for index in range(rows)], files=2, batch=3)
        return Sample(str(folder / "saved"), 8)

    def append_rows(self, sample):  # saved again with 3 rows appended, as a re-saved dataset is
        from pathlib import Path

        for old in Path(sample.images).glob("*.arrow"):
            old.unlink()
        self.make_input(Path(sample.images).parent, rows=11)
        return 3

    def make_input_with_a_corrupt_row(self, folder):
        return self.make_input(folder, corrupt=5), "saved/5"

    def make_bad_input(self, folder):
        (folder / "saved").mkdir(parents=True)
        (folder / "saved" / "state.json").write_text('{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}')
        (folder / "saved" / "data-00000-of-00001.arrow").write_bytes(b"junk")
        return str(folder / "saved")


def test_what_a_saved_dataset_lacks_is_said_in_one_line_and_a_dict_of_one_split_needs_no_split(tmp_path):
    """--split on one Dataset, a --label-column it lacks: refused; a DatasetDict of one split is read without
    --split; a row kept by its path (no bytes) is read from that file, one with neither is a recorded skip."""
    from featdump.errors import UsageProblem
    from featdump.inputs.saved_datasets import _encoded, read_saved, read_saved_row

    images = pngs(4)
    save_dataset(tmp_path / "one", images, [0, 1, 0, 1])
    with pytest.raises(UsageProblem, match="is one saved Dataset, not a DatasetDict"):
        read_saved(tmp_path / "one", split="train")
    with pytest.raises(UsageProblem, match="--label-column kind: .* has no such column"):
        read_saved(tmp_path / "one", label_column="kind")
    save_dataset_dict(tmp_path / "dict", {"train": (images, [0, 0, 1, 1])})
    listed = read_saved(tmp_path / "dict")
    assert listed.paths == ("train/0", "train/1", "train/2", "train/3") and listed.classes == ("cat", "dog")
    assert read_saved_row(str(tmp_path / "dict"), "train/2") == images[2]
    assert read_saved_row(str(tmp_path), "nowhere/2") is None
    (tmp_path / "kept.png").write_bytes(images[1])
    by_path = _encoded("one/9", {"bytes": None, "path": str(tmp_path / "kept.png")})
    assert by_path.data == images[1]
    assert isinstance(_encoded("one/9", {"bytes": None, "path": None}), ValueError)
