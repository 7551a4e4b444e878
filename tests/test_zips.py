"""Images in zip archives (`featdump.inputs.zips`, registered through the entry point `featdump.readers`): rows
equal the same images as files, stored and deflated members, ZIP64, labels from the first folder inside, resume,
--update, shards, show, and an archive at a URL."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

import featdump
from featdump.job.runner import extract

from .helpers import SMALL_RESNET, SMALL_RESNET_SETTINGS, CrashAfterFirstBatch, run_featdump, settings_for, write_images

EXTRACT = ["extract", *SMALL_RESNET, "-l", "layer1,avgpool"]


def archive_of(folder, archive, compression=zipfile.ZIP_DEFLATED, force_zip64=False, skip=()):
    """FOLDER's files zipped into ARCHIVE (their paths inside relative to FOLDER), SKIP left out."""
    with zipfile.ZipFile(archive, "w", compression=compression) as made:
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder).as_posix()
            if path.is_file() and relative not in skip:
                with made.open(relative, "w", force_zip64=force_zip64) as member:
                    member.write(path.read_bytes())
    return archive


def rows_of(source, output, *options):
    result = run_featdump(*EXTRACT, *options, source, output)
    assert result.returncode == 0, result.stderr
    return featdump.load(output, "layer1")


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
@pytest.mark.parametrize("compression, zip64", [(zipfile.ZIP_DEFLATED, False), (zipfile.ZIP_STORED, True)])
def test_a_zip_s_rows_equal_its_images_as_files_with_labels_from_its_first_folders(tmp_path, compression, zip64):
    write_images(tmp_path / "files", {"cats": 4, "dogs": 3})
    (tmp_path / "files" / "README.txt").write_text("not an image: left out")
    archive = archive_of(tmp_path / "files", tmp_path / "stimuli.zip", compression, zip64)
    zipped = rows_of(archive, tmp_path / "zip.h5")
    files = rows_of(tmp_path / "files", tmp_path / "files.h5")
    np.testing.assert_array_equal(zipped.features, files.features)
    assert zipped.paths == [f"stimuli.zip/{path}" for path in files.paths]
    assert zipped.paths[0] == "stimuli.zip/cats/img_000.jpg"
    assert zipped.labels.tolist() == files.labels.tolist() and zipped.classes == ["cats", "dogs"]
    drawn = run_featdump("show", tmp_path / "zip.h5", "--layer", "layer1", "--index", "5", "-o", tmp_path / "s.png")
    assert drawn.returncode == 0 and (tmp_path / "s.png").exists(), drawn.stderr


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_killed_zip_job_resumes_shards_merge_and_update_reads_a_grown_archive(tmp_path):
    write_images(tmp_path / "files", {"a": 6, "b": 6})
    grown = archive_of(tmp_path / "files", tmp_path / "full.zip")
    archive = archive_of(tmp_path / "files", tmp_path / "set.zip", skip={"b/img_005.png"})
    single = rows_of(archive, tmp_path / "single.h5", "-b", "4")
    crashed = tmp_path / "crashed.h5"
    with pytest.raises(RuntimeError):
        extract(settings_for(str(archive), crashed, layers=("layer1", "avgpool"),
                             **SMALL_RESNET_SETTINGS), CrashAfterFirstBatch())
    np.testing.assert_array_equal(rows_of(archive, crashed, "-b", "4").features, single.features)
    for index in range(2):
        assert run_featdump(*EXTRACT, "--shard", f"{index}/2", archive, tmp_path / "sharded.h5").returncode == 0
    assert run_featdump("merge", tmp_path / "sharded.h5").returncode == 0
    np.testing.assert_array_equal(featdump.load(tmp_path / "sharded.h5", "layer1").features, single.features)
    archive.write_bytes(grown.read_bytes())  # the archive gains its last image
    updated = run_featdump(*EXTRACT, "--update", archive, tmp_path / "single.h5")
    assert updated.returncode == 0 and "1 new image" in updated.stderr, updated.stderr
    assert len(featdump.load(tmp_path / "single.h5", "layer1").paths) == 12


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_a_zip_at_a_url_reads_as_the_local_one(store_env, tmp_path):
    write_images(tmp_path / "files", {"a": 3})
    (tmp_path / "upload").mkdir()
    archive = archive_of(tmp_path / "files", tmp_path / "upload" / "set.zip")
    store_env.upload(tmp_path / "upload", "s3://datasets/zips")
    remote = rows_of("s3://datasets/zips/set.zip", tmp_path / "remote.h5")
    local = rows_of(archive, tmp_path / "local.h5")
    assert remote.paths == local.paths == ["set.zip/a/img_000.jpg", "set.zip/a/img_001.jpg", "set.zip/a/img_002.png"]
    np.testing.assert_array_equal(remote.features, local.features)


def test_what_is_not_a_readable_zip_is_refused_in_one_line(tmp_path):
    (tmp_path / "broken.zip").write_bytes(b"PK not really an archive")
    refused = run_featdump(*EXTRACT, tmp_path / "broken.zip", tmp_path / "out.h5")
    assert refused.returncode == 2 and "is not a zip archive that can be read" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    with zipfile.ZipFile(tmp_path / "text.zip", "w") as made:
        made.writestr("notes.txt", "no image")
    empty = run_featdump(*EXTRACT, tmp_path / "text.zip", tmp_path / "empty.h5")
    assert empty.returncode == 2 and "holds no image" in empty.stderr, empty.stderr
