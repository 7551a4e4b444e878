"""Images kept in Parquet tables (`featdump.inputs.tables`), as Hugging Face datasets keep them: rows in file order
then row order, equal to the rows of the same encoded images read as files; the image and label columns found by
themselves or named; a ClassLabel's names as the classes; an undecodable row a recorded skip; resume, shards by
files, --update with a new file, show; and the same tables read from a store prefix."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

import featdump
from featdump.job.runner import extract

from .helpers import SMALL_RESNET, SMALL_RESNET_SETTINGS, CrashAfterFirstBatch, run_featdump, settings_for

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

EXTRACT = ["extract", *SMALL_RESNET, "-l", "layer1,avgpool"]
PNG_MAGIC = b"\x89PNG"
HF_META = {"info": {"features": {"image": {"_type": "Image"},
                                 "label": {"names": ["cat", "dog", "fish"], "_type": "ClassLabel"}}}}


def encoded_images(count: int, seed: int = 0) -> list[bytes]:
    """COUNT small JPEGs and PNGs, as a dataset's image column holds them."""
    rng = np.random.default_rng(seed)
    found = []
    for index in range(count):
        image = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((64, 48))
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG" if index % 3 else "PNG")
        found.append(buffer.getvalue())
    return found


def write_dataset(folder, data: list[bytes], shards: int = 2, layout: str = "hf", start: int = 0) -> list:
    """DATA in SHARDS Parquet files (row groups of 2) under FOLDER, in Hugging Face's layout (a struct of bytes and
    path, a ClassLabel label) or as a plain binary column; returns the files."""
    folder.mkdir(parents=True, exist_ok=True)
    files, per = [], -(-len(data) // shards)
    for shard in range(shards):
        rows = range(shard * per, min(len(data), (shard + 1) * per))
        if layout == "hf":
            table = pa.table({"image": [{"bytes": data[row], "path": f"img_{start + row}.jpg"} for row in rows],
                              "label": [(start + row) % 3 for row in rows]})
            table = table.replace_schema_metadata({b"huggingface": json.dumps(HF_META).encode()})
        else:
            table = pa.table({"png": pa.array([data[row] for row in rows], pa.binary()),
                              "id": list(rows)})
        path = folder / f"train-{start // per + shard:05d}-of-{shards:05d}.parquet"
        pq.write_table(table, path, row_group_size=2)
        files.append(path)
    return files


def as_files(data: list[bytes], folder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for index, blob in enumerate(data):
        suffix = "png" if blob.startswith(PNG_MAGIC) else "jpg"
        (folder / f"{index:04d}.{suffix}").write_bytes(blob)


def rows_of(source, output, *options):
    result = run_featdump(*EXTRACT, *options, str(source), output)
    assert result.returncode == 0, result.stderr
    return featdump.load(output, "layer1")


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_hugging_face_dataset_s_rows_equal_its_images_read_as_files_with_its_labels_and_classes(tmp_path):
    data = encoded_images(7)
    write_dataset(tmp_path / "data", data)
    as_files(data, tmp_path / "files")
    table = rows_of(tmp_path / "data", tmp_path / "table.h5")
    files = rows_of(tmp_path / "files", tmp_path / "files.h5")
    np.testing.assert_array_equal(table.features, files.features)
    assert table.paths[:2] == ["train-00000-of-00002.parquet/0/img_0.jpg", "train-00000-of-00002.parquet/1/img_1.jpg"]
    assert table.paths[4] == "train-00001-of-00002.parquet/0/img_4.jpg"  # file order, then row order
    assert table.labels.tolist() == [row % 3 for row in range(7)] and table.classes == ["cat", "dog", "fish"]
    pattern = rows_of(tmp_path / "data" / "train-*.parquet", tmp_path / "glob.h5")
    braces = rows_of(f"{tmp_path / 'data'}/train-{{00000,00001}}-of-00002.parquet", tmp_path / "braces.h5")
    assert pattern.paths == braces.paths == table.paths
    drawn = run_featdump("show", tmp_path / "table.h5", "--layer", "layer1", "--index", "5", "-o", tmp_path / "s.png")
    assert drawn.returncode == 0 and (tmp_path / "s.png").exists(), drawn.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_columns_are_found_or_named_and_a_bad_row_is_a_recorded_skip(tmp_path):
    data = encoded_images(5)
    data[3] = b"not an image"
    (single,) = write_dataset(tmp_path / "plain", data, shards=1, layout="binary")
    refused = run_featdump(*EXTRACT, "--on-error", "fail", single, tmp_path / "failed.h5")
    assert refused.returncode == 1 and "Fix or remove it, or pass --on-error skip" in refused.stderr, refused.stderr
    made = run_featdump(*EXTRACT, single, tmp_path / "out.h5")  # by default: recorded, and the job goes on
    assert made.returncode == 0 and "(1 skipped)" in made.stderr, made.stderr
    loaded = featdump.load(tmp_path / "out.h5", "avgpool")
    assert loaded.paths == [f"train-00000-of-00001.parquet/{row}" for row in (0, 1, 2, 4)]
    assert (loaded.labels == -1).all()
    both = tmp_path / "both.parquet"
    pq.write_table(pa.table({"a": pa.array(data[:2], pa.binary()), "b": pa.array(data[:2], pa.binary())}), both)
    several = run_featdump(*EXTRACT, both, tmp_path / "several.h5")
    assert several.returncode == 2 and "several columns of images (a, b): choose one with --image-column" in \
        several.stderr
    assert run_featdump(*EXTRACT, "--image-column", "b", both, tmp_path / "b.h5").returncode == 0
    none = tmp_path / "none.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0]}), none)
    refused = run_featdump(*EXTRACT, none, tmp_path / "none.h5")
    assert refused.returncode == 2 and "has no column of encoded images" in refused.stderr, refused.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_killed_run_resumes_shards_split_by_files_and_update_reads_a_new_file(tmp_path):
    data = encoded_images(12, seed=1)
    write_dataset(tmp_path / "data", data[:8], shards=2)
    single = rows_of(tmp_path / "data", tmp_path / "single.h5", "-b", "4")
    crashed = tmp_path / "crashed.h5"
    with pytest.raises(RuntimeError):
        extract(settings_for(str(tmp_path / "data"), crashed, layers=("layer1", "avgpool"),
                             **SMALL_RESNET_SETTINGS), CrashAfterFirstBatch())
    np.testing.assert_array_equal(rows_of(tmp_path / "data", crashed, "-b", "4").features, single.features)
    for index in range(2):
        assert run_featdump(*EXTRACT, "--shard", f"{index}/2", tmp_path / "data",
                            tmp_path / "sharded.h5").returncode == 0
    assert run_featdump("merge", tmp_path / "sharded.h5").returncode == 0
    np.testing.assert_array_equal(featdump.load(tmp_path / "sharded.h5", "layer1").features, single.features)
    write_dataset(tmp_path / "data", data[8:], shards=1, start=8)  # the dataset gains a file
    grown = run_featdump(*EXTRACT, "--update", tmp_path / "data", tmp_path / "single.h5")
    assert grown.returncode == 0 and "4 new images" in grown.stderr, grown.stderr
    as_files(data, tmp_path / "files")
    np.testing.assert_array_equal(featdump.load(tmp_path / "single.h5", "layer1").features,
                                  rows_of(tmp_path / "files", tmp_path / "files.h5").features)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_tables_in_a_store_prefix_are_read_as_local_ones(store_env, tmp_path):
    data = encoded_images(5, seed=2)
    write_dataset(tmp_path / "data", data)
    store_env.upload(tmp_path / "data", "s3://datasets/photos/data")
    remote = rows_of("s3://datasets/photos/data/", tmp_path / "remote.h5")
    local = rows_of(tmp_path / "data", tmp_path / "local.h5")
    assert remote.paths == local.paths
    np.testing.assert_array_equal(remote.features, local.features)


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_table_in_one_row_group_is_read_a_slice_at_a_time_with_rows_equal_to_the_files(tmp_path):
    """pandas, pyarrow and img2dataset-style writers leave a file in one row group: read with the default batch
    and workers, its rows equal the files', and a read holds ROWS_PER_READ rows of the group, not the group."""
    from featdump.inputs import find_images, tables

    data = encoded_images(70, seed=3)
    pq.write_table(pa.table({"jpg": pa.array(data, pa.binary())}), tmp_path / "one.parquet", row_group_size=1000)
    assert pq.ParquetFile(tmp_path / "one.parquet").num_row_groups == 1
    as_files(data, tmp_path / "files")
    np.testing.assert_array_equal(rows_of(tmp_path / "one.parquet", tmp_path / "table.h5").features,
                                  rows_of(tmp_path / "files", tmp_path / "files.h5").features)
    listed = find_images(tmp_path / "one.parquet")
    read = dict(listed.storage.open_as_ready(listed.root, listed.paths[40:48], list(range(40, 48))))
    assert [read[index].data for index in range(8)] == data[40:48]
    cursor = next(iter(tables._CURSORS.values()))
    assert len(cursor.values) == tables.ROWS_PER_READ and cursor.start == 32  # the slice that holds rows 40-47


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_rows_that_hold_a_path_and_no_bytes_read_the_file_it_names(tmp_path):
    """Hugging Face's Image not embedded (`datasets`' to_parquet of an imagefolder): each row holds a path, absolute
    or relative to the table's folder, and no bytes; the rows are the files', named without a double slash."""
    data = encoded_images(4, seed=4)
    as_files(data, tmp_path / "data" / "files")
    names = sorted(path.name for path in (tmp_path / "data" / "files").iterdir())
    paths = [str(tmp_path / "data" / "files" / names[0]), str(tmp_path / "data" / "files" / names[1]),
             f"files/{names[2]}", f"files/{names[3]}"]
    table = pa.table({"image": [{"bytes": None, "path": path} for path in paths], "label": [0, 1, 0, 1]})
    pq.write_table(table.replace_schema_metadata({b"huggingface": json.dumps(HF_META).encode()}),
                   tmp_path / "data" / "train-00000-of-00001.parquet")
    rows = rows_of(tmp_path / "data" / "train-00000-of-00001.parquet", tmp_path / "table.h5")
    files = rows_of(tmp_path / "data" / "files", tmp_path / "files.h5")
    np.testing.assert_array_equal(rows.features, files.features)
    assert rows.paths[0] == f"train-00000-of-00001.parquet/0/{paths[0].lstrip('/')}" and "//" not in rows.paths[0]
    assert rows.paths[3] == f"train-00000-of-00001.parquet/3/files/{names[3]}"
    (tmp_path / "data" / "files" / names[3]).unlink()  # a path to a file that is gone: a recorded skip, said
    gone = run_featdump(*EXTRACT, tmp_path / "data" / "train-00000-of-00001.parquet", tmp_path / "gone.h5")
    assert gone.returncode == 0 and "(1 skipped)" in gone.stderr, gone.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_hub_layout_of_several_splits_is_refused_naming_them_and_split_chooses_one(tmp_path):
    """data/ holding train-0000{0,1}-of-00002 and test-00000-of-00001: no output of both, one line naming the
    splits; --split reads one (also from a clone of the dataset, its data/ beside README.md and .git)."""
    data = encoded_images(6, seed=5)
    write_dataset(tmp_path / "clone" / "data", data[:4], shards=2)
    (test,) = write_dataset(tmp_path / "clone" / "data", data[4:], shards=1, start=4)
    test.rename(test.with_name("test-00000-of-00001.parquet"))
    (tmp_path / "clone" / "README.md").write_text("---\ndataset_info: ...\n---\n")
    (tmp_path / "clone" / ".git").mkdir()
    for source in (tmp_path / "clone" / "data", tmp_path / "clone"):
        refused = run_featdump(*EXTRACT, source, tmp_path / "mixed.h5")
        assert refused.returncode == 2, refused.stderr
        assert "holds the splits test (1 file), train (2 files): choose one with --split NAME" in refused.stderr
        assert not (tmp_path / "mixed.h5").exists()
    train = rows_of(tmp_path / "clone", tmp_path / "train.h5", "--split", "train")
    assert len(train.paths) == 4 and all(path.startswith("train-") for path in train.paths)
    test_rows = rows_of(tmp_path / "clone" / "data", tmp_path / "test.h5", "--split", "test")
    assert test_rows.paths == ["test-00000-of-00001.parquet/0/img_4.jpg", "test-00000-of-00001.parquet/1/img_5.jpg"]
    missing = run_featdump(*EXTRACT, "--split", "validation", tmp_path / "clone", tmp_path / "none.h5")
    assert missing.returncode == 2, missing.stderr
    assert "holds no split 'validation'; it holds test (1 file), train (2 files)." in missing.stderr
    as_files(data, tmp_path / "files")
    not_tables = run_featdump(*EXTRACT, "--split", "train", tmp_path / "files", tmp_path / "nt.h5")
    assert not_tables.returncode == 2 and "--split name parts of Parquet tables" in not_tables.stderr


def test_the_split_of_a_file_is_read_from_hugging_face_s_names():
    from featdump.inputs.splits import split_of

    assert split_of("data/train-00000-of-00040.parquet") == "train"
    assert split_of("data/validation-00001-of-00002-2c1a8f0e.parquet") == "validation"
    assert split_of("default/test/0000.parquet") == "test"
    assert split_of("default/partial-train/0003.parquet") == "train"
    assert split_of("tables/one.parquet") is None


@pytest.mark.parametrize("name, split", [
    ("train.parquet", "train"), ("test.parquet", "test"), ("my_train.parquet", "train"), ("training.parquet", "train"),
    ("train-2.parquet", "train"), ("valid.parquet", "validation"), ("val.parquet", "validation"),
    ("dev_set.parquet", "validation"), ("eval.parquet", "test"), ("testing.parquet", "test"),
    ("splits/validation/part1.parquet", "validation"), ("contest.parquet", None), ("latest.parquet", None),
    ("trains.parquet", None), ("images.parquet", None),
])
def test_split_words_in_plain_names_are_read_as_datasets_reads_them(name, split):
    from featdump.inputs.splits import split_of

    assert split_of(name) == split


def test_plainly_named_split_files_are_never_mixed_and_split_chooses_one(tmp_path):
    """Dataset.to_parquet's train.parquet (6 rows) and test.parquet (2) in one folder: refused without --split,
    each split read alone with it (--split val names validation, as `datasets` has it)."""
    data = encoded_images(8, seed=7)
    for name, rows in (("train", data[:6]), ("test", data[6:])):
        (written,) = write_dataset(tmp_path / "saved", rows, shards=1, start=0 if name == "train" else 6)
        written.rename(written.with_name(f"{name}.parquet"))
    refused = run_featdump(*EXTRACT, tmp_path / "saved", tmp_path / "mixed.h5")
    assert refused.returncode == 2 and "holds the splits test (1 file), train (1 file)" in refused.stderr
    assert len(rows_of(tmp_path / "saved", tmp_path / "train.h5", "--split", "train").paths) == 6
    assert [path.split("/")[0] for path in rows_of(tmp_path / "saved", tmp_path / "test.h5", "--split",
                                                   "test").paths] == ["test.parquet"] * 2
    none = run_featdump(*EXTRACT, "--split", "val", tmp_path / "saved", tmp_path / "none.h5")
    assert none.returncode == 2 and "holds no split 'validation'" in none.stderr, none.stderr


def test_every_layout_of_tables_the_docs_name_is_read_and_hidden_folders_are_passed_by(tmp_path):
    """The converted Parquet layout (default/{train,test}/0000.parquet), given itself or its default/; a clone whose
    data/ holds split folders; a folder of shards beside a hidden .ipynb_checkpoints copy."""
    data = encoded_images(6, seed=9)
    for split, rows, start in (("train", data[:4], 0), ("test", data[4:], 4)):
        (written,) = write_dataset(tmp_path / "converted" / "default" / split, rows, shards=1, start=start)
        written.rename(written.with_name("0000.parquet"))
    for source in (tmp_path / "converted", tmp_path / "converted" / "default"):
        refused = run_featdump(*EXTRACT, source, tmp_path / "mixed.h5")
        assert refused.returncode == 2 and "holds the splits test (1 file), train (1 file)" in refused.stderr, \
            refused.stderr
    assert len(rows_of(tmp_path / "converted" / "default", tmp_path / "test.h5", "--split", "test").paths) == 2
    shards = write_dataset(tmp_path / "shards", data, shards=2)
    (tmp_path / "shards" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "shards" / ".ipynb_checkpoints" / shards[0].name).write_bytes(shards[0].read_bytes())
    assert len(rows_of(tmp_path / "shards", tmp_path / "shards.h5").paths) == 6  # not the hidden copy's rows


def stale_rows_of(output) -> list[tuple[str, str]]:
    import h5py

    with h5py.File(output, "r") as h5file:
        if "stale" not in h5file:
            return []
        return list(zip(h5file["stale/paths"].asstr()[:], h5file["stale/reasons"].asstr()[:]))


def test_a_table_saved_again_with_rows_appended_keeps_its_old_rows_and_a_rewritten_row_is_stale(tmp_path):
    """A dataset saved again as one Parquet file with two rows more: --update adds the two, no old row stale; a row
    whose image is replaced is stale, the others not."""
    data = encoded_images(6, seed=11)
    (table,) = write_dataset(tmp_path / "saved", data[:4], shards=1, layout="plain")
    assert run_featdump(*EXTRACT, table, tmp_path / "out.h5").returncode == 0
    write_dataset(tmp_path / "saved", data, shards=1, layout="plain")  # the same file name, rows appended
    grown = run_featdump(*EXTRACT, "--update", table, tmp_path / "out.h5")
    assert grown.returncode == 0 and "2 new images" in grown.stderr, grown.stderr
    assert stale_rows_of(tmp_path / "out.h5") == []
    replaced = [*data[:1], *encoded_images(1, seed=12), *data[2:]]
    write_dataset(tmp_path / "saved", replaced, shards=1, layout="plain")
    assert run_featdump(*EXTRACT, "--update", table, tmp_path / "out.h5").returncode == 0
    assert stale_rows_of(tmp_path / "out.h5") == [(f"{table.name}/1", "changed")]


def test_relative_paths_lie_under_image_root_or_the_table_s_folder_or_the_working_folder(tmp_path):
    """Rows holding `images/NNNN.png` and no bytes, the images elsewhere than the table: read from --image-root; from
    the working folder where they are not beside the table (as `datasets` resolves them); named in one skip line
    where they are in neither."""
    data = encoded_images(3, seed=13)
    as_files(data, tmp_path / "project" / "images")
    names = sorted(path.name for path in (tmp_path / "project" / "images").iterdir())
    table = pa.table({"image": [{"bytes": None, "path": f"images/{name}"} for name in names]})
    (tmp_path / "tables").mkdir()
    pq.write_table(table, tmp_path / "tables" / "rows.parquet")
    files = rows_of(tmp_path / "project" / "images", tmp_path / "files.h5")
    rooted = rows_of(tmp_path / "tables" / "rows.parquet", tmp_path / "rooted.h5", "--image-root",
                     tmp_path / "project")
    np.testing.assert_array_equal(rooted.features, files.features)
    here = run_featdump(*EXTRACT, tmp_path / "tables" / "rows.parquet", tmp_path / "here.h5", cwd=tmp_path / "project")
    assert here.returncode == 0 and "(0 skipped)" in here.stderr, here.stderr
    nowhere = run_featdump(*EXTRACT, tmp_path / "tables" / "rows.parquet", tmp_path / "none.h5", cwd=tmp_path)
    assert nowhere.returncode != 0 and "--image-root DIR names the folder" in nowhere.stderr, nowhere.stderr
    folder = run_featdump(*EXTRACT, "--image-root", tmp_path, tmp_path / "project" / "images", tmp_path / "no.h5")
    assert folder.returncode == 2 and "--image-root names the folder of Parquet tables' image paths" in \
        folder.stderr, folder.stderr


def test_an_output_made_before_rows_recorded_digests_keeps_its_rule(tmp_path):
    """An output whose rows recorded their file's size and version (before rows recorded their bytes' digest): an
    update over the same file finds nothing stale; over the file saved again, every old row (as it said then)."""
    import os

    import h5py

    from featdump.inputs.tables import _stamp

    data = encoded_images(4, seed=14)
    (table,) = write_dataset(tmp_path / "saved", data[:3], shards=1, layout="plain")
    assert run_featdump(*EXTRACT, table, tmp_path / "out.h5").returncode == 0
    found = os.stat(table)
    with h5py.File(tmp_path / "out.h5", "r+") as h5file:  # as such an output holds them
        h5file["file_stats"][:3] = [[found.st_size, _stamp(str(found.st_mtime))]] * 3
        del h5file.attrs["image_listing"]
    same = run_featdump(*EXTRACT, "--update", table, tmp_path / "out.h5")
    assert same.returncode == 0 and stale_rows_of(tmp_path / "out.h5") == [], same.stderr
    write_dataset(tmp_path / "saved", data, shards=1, layout="plain")
    assert run_featdump(*EXTRACT, "--update", table, tmp_path / "out.h5").returncode == 0
    assert [reason for _, reason in stale_rows_of(tmp_path / "out.h5")] == ["changed"] * 3


def test_a_table_row_s_stat_is_its_bytes_length_and_digest_as_a_run_records_it(tmp_path):
    from featdump.inputs.imagelist import content_digest
    from featdump.inputs.tables import read_tables

    data = encoded_images(3, seed=15)
    (table,) = write_dataset(tmp_path / "saved", data, shards=1, layout="plain")
    listed = read_tables(str(table))
    assert listed.stat(1) == (len(data[1]), content_digest(data[1]))
    assert [encoded.file_stat for _, encoded in listed.open_as_ready([1])] == [listed.stat(1)]
