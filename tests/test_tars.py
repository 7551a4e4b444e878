"""Tar shards (the webdataset layout) as input: real tar files packed from real image folders."""

from __future__ import annotations

import io
import json
import shutil
import signal
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models import get_model_weights

from featdump.errors import NoImages
from featdump.faces.show import _read
from featdump.inputs import find_images
from featdump.inputs.gpu_decode import to_device_inputs
from featdump.inputs.loader import ImageDataset, collate
from featdump.inputs.preprocess import Preprocess
from featdump.inputs.tar_names import expand_braces
from featdump.inputs.tar_scan import scan_tar
from featdump.output.merge import merge

from .helpers import SMALL_RESNET, committed_rows, featdump_env, read_output, run_featdump, start_featdump, write_images
from .makers import small_resnet

EXTRACT = ["extract", *SMALL_RESNET, "-l", "layer4.1.relu:2,avgpool"]


def add_member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def pack(folder: Path, shards: Path, count: int, first: int = 0) -> list[Path]:
    """FOLDER's images in sorted order, split into COUNT consecutive tars in SHARDS (webdataset layout: KEY.jpg,
    KEY.cls holding the class index, KEY.json), as img2dataset writes them."""
    images = find_images(folder)
    shards.mkdir(exist_ok=True)
    written = []
    for index in range(count):
        path = shards / f"{first + index:05d}.tar"
        with tarfile.open(path, "w") as archive:
            for position in range(index * len(images) // count, (index + 1) * len(images) // count):
                relative = images.paths[position]
                key = relative.rsplit(".", 1)[0]
                add_member(archive, relative, (folder / relative).read_bytes())
                add_member(archive, f"{key}.cls", f"{images.labels[position]}\n".encode())
                add_member(archive, f"{key}.json", json.dumps({"source": relative}).encode())
        written.append(path)
    return written


def member_path(row_path: str) -> str:
    """00001.tar/cats/img_003.jpg -> cats/img_003.jpg"""
    return row_path.split("/", 1)[1]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """16 images in two class folders, and the same images as 4 tars."""
    root = tmp_path_factory.mktemp("packed")
    write_images(root / "images", {"cats": 8, "dogs": 8}, size=(40, 32))
    pack(root / "images", root / "shards", 4)
    return root


@pytest.fixture(scope="module")
def folder_run(packed):
    """The folder's rows, extracted with the default workers and batch size."""
    output = packed / "folder.h5"
    result = run_featdump(*EXTRACT, packed / "images", output)
    assert result.returncode == 0, result.stderr
    return read_output(output)


def assert_rows_equal_the_folder(content: dict, folder: dict) -> None:
    index = {path: row for row, path in enumerate(folder["paths"])}
    rows = [index[member_path(path)] for path in content["paths"]]
    for layer in ("layer4.1.relu:2", "avgpool"):
        np.testing.assert_array_equal(content[layer], folder[layer][rows])
    np.testing.assert_array_equal(content["labels"], folder["labels"][rows])


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_rows_from_four_tars_equal_the_folder_they_were_packed_from(packed, folder_run):
    output = packed / "tars.h5"
    result = run_featdump(*EXTRACT, packed / "shards" / "{00000..00003}.tar", output)  # default workers, batch size
    assert result.returncode == 0, result.stderr
    content = read_output(output)
    assert [member_path(path) for path in content["paths"]] == folder_run["paths"]  # tar order: the folder's order
    assert content["paths"][:2] == ["00000.tar/cats/img_000.jpg", "00000.tar/cats/img_001.jpg"]
    assert content["paths"][-1] == "00003.tar/dogs/img_007.jpg"
    assert_rows_equal_the_folder(content, folder_run)
    assert set(content["labels"].tolist()) == {0, 1}  # from the .cls members
    assert content["skipped"] == [] and content["complete"]

    info = run_featdump("info", output)
    assert info.returncode == 0 and "rows:       16\n" in info.stdout, info.stdout
    values, _, image, path = _read(output, "layer4.1.relu:2", 5)  # show reads the image back from its tar
    assert path == "00001.tar/cats/img_005.png" and image is not None  # its transform keeps no geometry
    np.testing.assert_array_equal(image, np.asarray(Image.open(packed / "images" / "cats/img_005.png").convert("RGB")))


@pytest.mark.parametrize("spelling", ["glob", "list", "one tar"])
def test_other_ways_to_name_the_tars(packed, tmp_path, spelling):
    shards = packed / "shards"
    if spelling == "glob":
        images = shards / "*.tar"
    elif spelling == "list":
        images = tmp_path / "tars.txt"
        images.write_text("".join(f"{shards / f'{index:05d}.tar'}\n" for index in range(4)))
    else:
        images = shards / "00002.tar"
    found = find_images(images)
    assert found.root == shards
    assert len(found) == (4 if spelling == "one tar" else 16)
    assert found.paths[0] == ("00002.tar/dogs/img_000.jpg" if spelling == "one tar" else "00000.tar/cats/img_000.jpg")


def test_brace_patterns_expand_as_bash_does():
    assert expand_braces("s/{008..011}.tar") == ["s/008.tar", "s/009.tar", "s/010.tar", "s/011.tar"]
    assert expand_braces("{a,b}/{1..2}.tar") == ["a/1.tar", "a/2.tar", "b/1.tar", "b/2.tar"]
    assert expand_braces("{3..1}") == ["3", "2", "1"]
    assert expand_braces("x{y}.tar") == ["x{y}.tar"]


def test_a_missing_shard_in_a_pattern_is_one_line_exit_2_before_reading(packed, tmp_path):
    output = tmp_path / "out.h5"
    result = run_featdump(*EXTRACT, packed / "shards" / "{00000..00005}.tar", output)
    assert result.returncode == 2
    assert result.stderr == (f"Error: The pattern '{packed / 'shards' / '{00000..00005}.tar'}' names 6 tar files; 2 of "
                             f"them are missing: {packed / 'shards' / '00004.tar'}, {packed / 'shards' / '00005.tar'}. "
                             "Nothing was read.\n")
    assert not list(tmp_path.iterdir())
    with pytest.raises(NoImages, match="matches no file"):
        find_images(packed / "shards" / "*.tarx")
    with pytest.raises(NoImages, match="It holds 4 .tar files: for tar shards, pass"):
        find_images(packed / "shards")


def test_a_broken_member_and_a_damaged_tar_are_recorded(packed, folder_run, tmp_path):
    shards = tmp_path / "shards"
    first, second = pack(packed / "images", shards, 2)
    with tarfile.open(first, "a") as archive:  # a sixth member that is no image
        add_member(archive, "zz/broken.jpg", b"not an image at all")
    members = tarfile.open(second).getmembers()
    cut = members[7 * 3].offset_data + 100  # 100 bytes into the 8th image of the second tar
    with open(second, "r+b") as handle:
        handle.truncate(cut)
    output = tmp_path / "out.h5"
    result = run_featdump(*EXTRACT, shards / "*.tar", output)
    assert result.returncode == 0, result.stderr
    content = read_output(output)
    assert len(content["paths"]) == 8 + 7
    assert_rows_equal_the_folder(content, folder_run)
    offset = members[7 * 3].offset
    assert content["skipped"] == ["00000.tar/zz/broken.jpg", f"00001.tar@{offset}"]
    assert content["reasons"][0] == "UnidentifiedImageError: cannot identify image file '00000.tar/zz/broken.jpg'"
    assert content["reasons"][1].startswith(f"DamagedTar: truncated: member 'dogs/img_007.jpg' at byte "
                                            f"{offset} needs")
    assert f"Tar {shards / '00001.tar'} is damaged at byte {offset}" in result.stderr


def test_every_kind_of_damage_keeps_the_members_before_it(packed, tmp_path):
    good = pack(packed / "images", tmp_path / "good", 1)[0]
    members = tarfile.open(good).getmembers()
    end = members[-1].offset_data + -(-members[-1].size // 512) * 512  # the end-of-archive blocks start here
    data = good.read_bytes()
    cases = {
        "no_end": data[:end],  # cut exactly after a member
        "garbage": data[:members[6].offset] + b"this is no tar header".ljust(512, b"x") + data[members[7].offset:],
        "not_a_tar": b"x" * 2048,
        "cut_in_header": data[:members[6].offset + 100],
    }
    expected = {"no_end": (16, end, "truncated: the file ends"),
                "garbage": (2, members[6].offset, "corrupt: the bytes"), "not_a_tar": (0, 0, "not a readable tar"),
                "cut_in_header": (2, members[6].offset, "truncated")}
    for name, content in cases.items():
        path = tmp_path / f"{name}.tar"
        path.write_bytes(content)
        scan = scan_tar(path)
        images, offset, reason = expected[name]
        assert len(scan.images) == images, name
        assert scan.damage[0] == offset and scan.damage[1].startswith(reason), (name, scan.damage)
    assert scan_tar(good).damage is None and scan_tar(good).ignored == {".json": 16}


@pytest.mark.slow  # a real process killed mid-tar, and its resume
def test_kill_and_resume_in_the_middle_of_a_shard(packed, folder_run, tmp_path):
    output, partial = tmp_path / "out.h5", tmp_path / "out.h5.partial"
    arguments = [*EXTRACT, "-b", "2", packed / "shards" / "*.tar", output]  # 4 images per tar: rows 2, 6, ... mid-tar
    process = start_featdump(*arguments, env=featdump_env(**{small_resnet.HOLD_AFTER: "1"}))  # default workers
    while committed_rows(partial) <= 0 and process.poll() is None:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    rows = committed_rows(partial)
    assert rows == 2, "held after its first batch: killed in the middle of the first tar"
    resumed = run_featdump(*arguments)
    assert resumed.returncode == 0, resumed.stderr
    assert f"Resuming at image {rows} of 16" in resumed.stderr
    content = read_output(output)
    assert [member_path(path) for path in content["paths"]] == folder_run["paths"]
    assert_rows_equal_the_folder(content, folder_run)


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_shards_split_by_whole_tars_and_merge_equal_one_run(packed, folder_run, tmp_path):
    output = tmp_path / "out.h5"
    for index in range(2):
        result = run_featdump(*EXTRACT, "--shard", f"{index}/2", packed / "shards" / "*.tar", output)
        assert result.returncode == 0, result.stderr
        assert f"images {8 * index} to {8 * index + 7} of 16" in result.stderr
    first = read_output(tmp_path / "out.shard-0-of-2.h5")
    assert {path.split("/")[0] for path in first["paths"]} == {"00000.tar", "00001.tar"}  # only its own tars
    merge(output, copy=True)
    merged = read_output(output)
    assert [member_path(path) for path in merged["paths"]] == folder_run["paths"]
    assert_rows_equal_the_folder(merged, folder_run)


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_update_after_a_fifth_tar(packed, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(packed / "shards", shards)
    output = tmp_path / "out.h5"
    arguments = [*EXTRACT, "--update", shards / "*.tar", output]
    assert run_featdump(*arguments).returncode == 0
    write_images(tmp_path / "more", {"birds": 3}, seed=7, size=(40, 32))
    pack(tmp_path / "more", shards, 1, first=4)
    updated = run_featdump(*arguments)
    assert updated.returncode == 0, updated.stderr
    assert f"Wrote 3 images (0 skipped) to {output}, 19 in all (0 skipped)," in updated.stderr
    fresh = tmp_path / "fresh.h5"
    assert run_featdump(*EXTRACT, shards / "*.tar", fresh).returncode == 0
    content, expected = read_output(output), read_output(fresh)
    assert content["paths"] == expected["paths"] and content["paths"][-1] == "00004.tar/birds/img_002.png"
    for layer in ("layer4.1.relu:2", "avgpool"):
        np.testing.assert_allclose(content[layer], expected[layer], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(content["labels"], expected["labels"])
    before = output.stat().st_mtime_ns
    again = run_featdump(*arguments)
    assert again.returncode == 0 and "Nothing new:" in again.stderr, again.stderr
    assert output.stat().st_mtime_ns == before  # decided read-only: the file untouched


@pytest.mark.slow  # one of the quick suite's heaviest; its capability has quicker tests too
def test_fast_decode_and_the_gpu_jpeg_path_read_tars_as_they_read_files(packed, tmp_path):
    folder, tars = find_images(packed / "images"), find_images(packed / "shards" / "*.tar")
    assert [member_path(path) for path in tars.paths] == list(folder.paths)
    preprocess = Preprocess(get_model_weights("resnet18").DEFAULT.transforms())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    inputs = {}
    for name, images in {"folder": folder, "tars": tars}.items():
        dataset = ImageDataset(images, preprocess, gpu_jpegs=True)
        items = [dataset[position] for position in range(len(images))]
        assert [item.kind for item in items] == ["pixels" if path.endswith(".png") else "jpeg" for path in folder.paths]
        inputs[name] = to_device_inputs(collate(items), preprocess, images, device)
    torch.testing.assert_close(inputs["tars"], inputs["folder"], rtol=0, atol=0)
    rows = {}
    for name, images in {"folder": packed / "images", "tars": packed / "shards" / "*.tar"}.items():
        result = run_featdump(*EXTRACT, "--fast-decode", "-j", "1", images, tmp_path / f"{name}.h5")
        assert result.returncode == 0, result.stderr
        rows[name] = read_output(tmp_path / f"{name}.h5")
    assert_rows_equal_the_folder(rows["tars"], rows["folder"])


@pytest.mark.parametrize("tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_headers_are_read_as_tarfile_reads_them_in_every_format(tmp_path, tar_format):
    path = tmp_path / "formats.tar"
    folder = "a_long_folder_name_" * 6  # a 114-character folder: a ustar prefix, a GNU long name, a pax path
    names = ["k1.jpg", "k1.cls", f"{folder}/k2.png", f"{folder}/k2.cls", "k3.jpg"]
    with tarfile.open(path, "w", format=tar_format) as archive:
        for index, name in enumerate(names):
            add_member(archive, name, str(index).encode() * (1 if name.endswith(".cls") else 700 * index + 1))
    expected = [(m.name, m.offset_data, m.size) for m in tarfile.open(path).getmembers() if not m.name.endswith("cls")]
    scan = scan_tar(path)
    assert [(name, offset, size) for name, offset, size, _ in scan.images] == expected
    assert [label for *_, label in scan.images] == [1, 3, -1] and scan.damage is None


def test_every_image_member_of_a_sample_is_a_row_and_the_summary_counts_what_was_not_used(packed, tmp_path):
    """Frames of a sequence share a webdataset key (clip1/frame.0000.jpg ... frame.0003.jpg: key clip1/frame);
    each is a row with the sample's label. Members named ./KEY.EXT are read back by show."""
    from click.testing import CliRunner

    from featdump.faces.cli import main

    frames = sorted((packed / "images" / "cats").iterdir())[:4]
    with tarfile.open(tmp_path / "clips.tar", "w") as archive:
        for index, source in enumerate(frames):
            add_member(archive, f"clip1/frame.{index:04d}{source.suffix}", source.read_bytes())
        add_member(archive, "clip1/frame.cls", b"7\n")
        add_member(archive, "clip1/frame.json", b"{}")
        add_member(archive, "./clip2/still.jpg", frames[0].read_bytes())
        add_member(archive, "./clip2/still.txt", b"a caption")
    result = CliRunner().invoke(main, [*EXTRACT, "-j", "0", str(tmp_path / "clips.tar"), str(tmp_path / "out.h5")])
    assert result.exit_code == 0, result.output
    content = read_output(tmp_path / "out.h5")
    assert content["paths"] == [f"clips.tar/clip1/frame.{index:04d}{source.suffix}"
                                for index, source in enumerate(frames)] + ["clips.tar/./clip2/still.jpg"]
    assert content["labels"].tolist() == [7, 7, 7, 7, -1] and content["skipped"] == []
    summary = result.output.strip().splitlines()[-1]
    assert summary.startswith("Wrote 5 images (0 skipped)")
    assert summary.endswith("; 2 tar members not used, not images (1 .json, 1 .txt)."), summary
    folder = CliRunner().invoke(main, [*EXTRACT, "-j", "0", str(packed / "images" / "cats"), str(tmp_path / "f.h5")])
    assert folder.exit_code == 0
    by_path = dict(zip(read_output(tmp_path / "f.h5")["paths"], read_output(tmp_path / "f.h5")["avgpool"]))
    for row, source in enumerate(frames):
        np.testing.assert_array_equal(content["avgpool"][row], by_path[source.name])
    _, _, image, path = _read(tmp_path / "out.h5", "avgpool", 4)
    assert path == "clips.tar/./clip2/still.jpg" and image is not None


def test_a_compressed_tar_is_refused_saying_why(packed, tmp_path):
    from click.testing import CliRunner

    from featdump.faces.cli import main

    with tarfile.open(tmp_path / "00000.tar.gz", "w:gz") as archive:
        archive.add(packed / "shards" / "00000.tar", arcname="inner.tar")
    result = CliRunner().invoke(main, [*EXTRACT, str(tmp_path / "00000.tar.gz"), str(tmp_path / "out.h5")])
    assert result.exit_code == 2 and not (tmp_path / "out.h5").exists()
    assert result.stderr.strip() == (
        f"Error: {str(tmp_path / '00000.tar.gz')!r} is a gzip-compressed tar, which featdump does not read: each "
        "image is read at its offset in the tar (to decode in parallel, resume and split into shards), and a "
        "compressed stream has no offsets. Decompress it to a plain .tar once (e.g. gunzip -k, zstd -d) and pass "
        "that.")
