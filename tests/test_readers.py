"""Inputs as readers: each kind of input claims the Locations it reads, local or at a URL, in one order; an option
that names a part of another kind of input is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from featdump.errors import NoImages, UsageProblem
from featdump.inputs import readers
from featdump.inputs.readers import Asked, read_images
from featdump.locations import Location

from .helpers import write_images


def claimant(where, asked=Asked()) -> str:
    return type(next(reader for reader in readers.readers() if reader.claims(Location.of(where), asked))).__name__


def test_each_kind_of_input_is_claimed_by_its_reader(tmp_path):
    write_images(tmp_path / "folder", {"a": 2})
    (tmp_path / "list.txt").write_text("folder/a/img_000.png\n")
    np.save(tmp_path / "brick.npy", np.zeros((2, 8, 8, 3), np.uint8))
    (tmp_path / "shard-0.tar").write_bytes(b"")
    assert claimant(tmp_path / "folder") == "Folder"
    assert claimant(tmp_path / "list.txt") == "ListFile"
    assert claimant(tmp_path / "brick.npy") == "Arrays"
    assert claimant(tmp_path / "shard-0.tar") == "Tars"
    assert claimant("s3://bucket/lists/train.csv") == "ListFile"
    assert claimant("https://host/cat.jpg") == "OneObject"
    assert claimant("s3://bucket/shards/{000..003}.tar") == "Tars"


def test_a_listed_folder_reads_as_its_reader_lists_it(tmp_path):
    write_images(tmp_path / "folder", {"a": 2, "b": 1})
    listed = read_images(Location.of(tmp_path / "folder"), Asked())
    assert len(listed) == 3 and list(listed.labels) == [0, 0, 1]


def test_nothing_there_and_options_of_another_kind_are_one_line_each(tmp_path):
    with pytest.raises(NoImages, match="does not exist"):
        read_images(Location.of(tmp_path / "missing"), Asked())
    write_images(tmp_path / "folder", {"a": 1})
    with pytest.raises(UsageProblem, match="--image-column, --label-column and --split name parts of Parquet tables"):
        read_images(Location.of(tmp_path / "folder"), Asked(image_column="image"))
    with pytest.raises(UsageProblem, match="--array imgBrick names an array of a file of arrays"):
        read_images(Location.of(tmp_path / "folder"), Asked(array="imgBrick"))


def test_classes_are_the_first_level_folders_when_every_image_lies_in_one():
    """One rule for a folder and a store prefix (ImageFolder's): sorted first-level folders, else no class."""
    from featdump.inputs.folder import class_labels

    assert class_labels(["b/x.png", "a/y.png", "b/deep/z.png"]) == ((1, 0, 1), ("a", "b"))
    assert class_labels(["x.png", "a/y.png"]) == ((-1, -1), ())


def test_a_long_folder_walk_says_how_far_it_got_and_when_it_is_done(tmp_path, caplog):
    import logging

    from featdump.inputs import folder

    for index in range(2100):  # names are enough: the walk opens no file
        (tmp_path / "photos" / f"{index // 700}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "photos" / f"{index // 700}" / f"{index:05d}.jpg").touch()
    with caplog.at_level(logging.INFO, logger="featdump"):
        walk = folder._walk(tmp_path / "photos", every_seconds=0.0)
        images, videos = walk.images, walk.videos
    assert len(images) == 2100 and not videos
    said = [record.getMessage() for record in caplog.records]
    assert any("images found so far" in line and "2048 images" in line for line in said), said
    assert said[-1].startswith(f"Listed {tmp_path / 'photos'}: 2100 images in "), said
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="featdump"):
        folder._walk(tmp_path / "photos")  # a quick walk says nothing
    assert not caplog.records


def test_a_folder_of_arrow_files_is_told_how_to_read_it(tmp_path):
    saved = tmp_path / "saved"
    (saved / "train").mkdir(parents=True)
    (saved / "train" / "data-00000-of-00001.arrow").write_bytes(b"ARROW1")
    (saved / "train" / "state.json").write_text("{}")
    with pytest.raises(NoImages, match=r"It holds Arrow files in '.*saved/train', as Hugging Face's "
                                       r"Dataset.save_to_disk writes: pass the folder save_to_disk wrote"):
        read_images(Location.of(str(saved)), Asked())
