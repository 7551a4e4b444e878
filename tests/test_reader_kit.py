"""The readers' conformance kit (`featdump.testing.readers`) run over featdump's own readers of local inputs (a
folder, a list file, tars, a zip, an array, Parquet tables) and over a reader installed from outside as a package
installs it (tests/test_plugins.py's colour swatches): each passes every check its kind allows. The plugin's run
is in the quick suite (the plugin boundary); featdump's own readers' in CI's full run (each a dozen small
extractions, their behaviours held by their own quick tests too)."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from featdump.testing.readers import ReaderConformance, Sample

from .helpers import write_images
from .test_plugins import ENTRY_POINTS, PLUGIN

JUNK = b"this is no image at all"


def encoded(count: int, start: int = 0) -> list[bytes]:
    """COUNT small JPEGs, each its own colour pattern (START: the first one's seed)."""
    data = []
    for index in range(start, start + count):
        pixels = np.random.default_rng(index).integers(0, 256, (24, 32, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        data.append(buffer.getvalue())
    return data


@pytest.mark.slow  # the folder reader's checks are the quick suite's everywhere else; the kit's run over it in CI
class TestFolder(ReaderConformance):
    reader = "folder"

    def make_input(self, folder):
        write_images(folder, {"cats": 4, "dogs": 4})
        return Sample(str(folder), 8)

    def append_rows(self, sample):
        write_images(Path(sample.images) / "zebras", {"": 3}, seed=9)
        return 3

    def make_input_with_a_corrupt_row(self, folder):
        write_images(folder, {"cats": 4, "dogs": 4})
        (folder / "dogs" / "img_001.jpg").write_bytes(JUNK)
        return Sample(str(folder), 8), "dogs/img_001.jpg"

    def make_bad_input(self, folder):
        folder.mkdir(parents=True)
        (folder / "notes.txt").write_text("no images here")
        return str(folder)


@pytest.mark.slow
class TestListFile(ReaderConformance):
    reader = "list"

    def make_input(self, folder):
        names = write_images(folder / "images", {"a": 4, "b": 4})
        (folder / "set.txt").write_text("".join(f"images/{name}\n" for name in names))
        return Sample(str(folder / "set.txt"), 8)

    def append_rows(self, sample):
        folder = Path(sample.images).parent
        names = write_images(folder / "more", {"c": 3}, seed=9)
        with open(sample.images, "a") as listed:
            listed.write("".join(f"more/{name}\n" for name in names))
        return 3

    def make_input_with_a_corrupt_row(self, folder):
        sample = self.make_input(folder)
        (folder / "images" / "b" / "img_002.png").write_bytes(JUNK)
        return sample, "images/b/img_002.png"


@pytest.mark.slow
class TestTars(ReaderConformance):
    reader = "tar"

    def make_input(self, folder, corrupt: int | None = None):
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(folder / "shard.tar", "w") as made:
            for index, data in enumerate(encoded(8)):
                _add_member(made, f"{index:05d}.jpg", JUNK if index == corrupt else data)
        return Sample(str(folder / "shard.tar"), 8)

    def append_rows(self, sample):
        with tarfile.open(sample.images, "a") as grown:
            for index, data in enumerate(encoded(3, start=100)):
                _add_member(grown, f"{8 + index:05d}.jpg", data)
        return 3

    def make_input_with_a_corrupt_row(self, folder):
        return self.make_input(folder, corrupt=5), "shard.tar/00005.jpg"

    def make_bad_input(self, folder):
        folder.mkdir(parents=True)
        (folder / "junk.tar").write_bytes(JUNK)
        return str(folder / "junk.tar")


def _add_member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size = len(data)
    archive.addfile(member, io.BytesIO(data))


@pytest.mark.slow
class TestZip(ReaderConformance):
    reader = "zip"

    def make_input(self, folder, corrupt: int | None = None):
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(folder / "set.zip", "w") as made:
            for index, data in enumerate(encoded(8)):
                made.writestr(f"{'ab'[index % 2]}/{index:03d}.jpg", JUNK if index == corrupt else data)
        return Sample(str(folder / "set.zip"), 8)

    def append_rows(self, sample):
        with zipfile.ZipFile(sample.images, "a") as grown:
            for index, data in enumerate(encoded(3, start=100)):
                grown.writestr(f"c/{index:03d}.jpg", data)
        return 3

    def make_input_with_a_corrupt_row(self, folder):
        return self.make_input(folder, corrupt=3), "set.zip/b/003.jpg"

    def make_bad_input(self, folder):
        folder.mkdir(parents=True)
        (folder / "junk.zip").write_bytes(JUNK)
        return str(folder / "junk.zip")


@pytest.mark.slow
class TestArray(ReaderConformance):
    reader = "array"

    def make_input(self, folder):
        folder.mkdir(parents=True)
        pixels = np.random.default_rng(0).integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
        with h5py.File(folder / "stimuli.hdf5", "w") as h5file:
            h5file.create_dataset("imgBrick", data=pixels, maxshape=(None, 32, 32, 3))
        return Sample(str(folder / "stimuli.hdf5"), 8)

    def append_rows(self, sample):
        with h5py.File(sample.images, "a") as h5file:
            h5file["imgBrick"].resize(11, axis=0)
            h5file["imgBrick"][8:] = np.random.default_rng(1).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
        return 3

    def make_bad_input(self, folder):
        folder.mkdir(parents=True)
        with h5py.File(folder / "labels.hdf5", "w") as h5file:
            h5file["labels"] = np.arange(10)
        return str(folder / "labels.hdf5")


@pytest.mark.slow
class TestParquet(ReaderConformance):
    reader = "parquet"

    def make_input(self, folder, corrupt: int | None = None, rows: int = 8):
        import pyarrow as pa
        import pyarrow.parquet as pq

        folder.mkdir(parents=True, exist_ok=True)
        data = [JUNK if index == corrupt else image for index, image in enumerate(encoded(rows))]
        pq.write_table(pa.table({"jpg": pa.array(data, pa.binary()), "label": list(range(rows))}),
                       folder / "train.parquet", row_group_size=3)
        return Sample(str(folder / "train.parquet"), 8)

    def append_rows(self, sample):  # the table saved again with rows appended, as a re-saved dataset is
        self.make_input(Path(sample.images).parent, rows=11)
        return 3

    def make_input_with_a_corrupt_row(self, folder):
        return self.make_input(folder, corrupt=6), "train.parquet/6"

    def make_bad_input(self, folder):
        folder.mkdir(parents=True)
        (folder / "junk.parquet").write_bytes(JUNK)
        return str(folder / "junk.parquet")


class TestAPluginReader(ReaderConformance):
    """tests/test_plugins.py's reader of .colors files (a solid colour a line), installed on the path as a package
    installs it, found through the entry point group."""

    reader = "colours"

    @pytest.fixture(autouse=True)
    def installed(self, tmp_path, monkeypatch):
        from featdump import plugins
        from featdump.inputs import readers

        site = tmp_path / "site"
        (site / "swatches-1.0.dist-info").mkdir(parents=True)
        (site / "swatches-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: swatches\n"
                                                                  "Version: 1.0\n")
        (site / "swatches-1.0.dist-info" / "entry_points.txt").write_text(ENTRY_POINTS)
        (site / "swatches.py").write_text(PLUGIN)
        monkeypatch.syspath_prepend(str(site))
        monkeypatch.setattr(readers, "READERS", ())  # loaded again, with the plugin
        monkeypatch.setattr(plugins, "_BROKEN", {})
        yield
        import sys

        sys.modules.pop("swatches", None)

    def make_input(self, folder):
        folder.mkdir(parents=True)
        colours = np.random.default_rng(2).integers(0, 256, (8, 3))
        (folder / "set.colors").write_text("".join(",".join(map(str, colour)) + "\n" for colour in colours))
        return Sample(str(folder / "set.colors"), 8)

    def append_rows(self, sample):
        with open(sample.images, "a") as listed:
            listed.write("1,2,3\n4,5,6\n7,8,9\n")
        return 3

    def make_bad_input(self, folder):
        folder.mkdir(parents=True)
        (folder / "junk.colors").write_text("red, green and blue\n")
        return str(folder / "junk.colors")

