"""Any name the filesystem can hold gets its row, and the run completes; links and special files never hang."""

from __future__ import annotations

import os

import h5py
import numpy as np
from PIL import Image

from featdump.output.layout import raw_paths

from .helpers import run_featdump

ODD_NAMES = [
    b"caf\xe9.jpg",  # Latin-1, not UTF-8
    b"\xff\xfe bytes.png",
    b"new\nline.jpg",
    b"tab\there.jpg",
    b" leading space.jpg",
    b"trailing space .jpg",
    ("long_" + "x" * 240 + ".jpg").encode(),
    "猫 🐱 ünïcödé.png".encode(),
    b"back\\xe9slash.jpg",  # valid UTF-8 that looks like an escaped byte
]


def write_picture(path: bytes, seed: int) -> None:
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    with open(path, "wb") as handle:
        Image.fromarray(pixels).save(handle, format="PNG" if path.endswith(b".png") else "JPEG")


def test_every_name_gets_its_row_and_exact_bytes_back(tmp_path):
    root = os.fsencode(tmp_path / "images")
    os.makedirs(os.path.join(root, b"cl\xe0ss"))  # a class folder that is not UTF-8 either
    os.makedirs(os.path.join(root, b"plain"))
    for index, name in enumerate(ODD_NAMES):
        write_picture(os.path.join(root, b"cl\xe0ss" if index % 2 else b"plain", name), index)
    os.symlink(b"nowhere.jpg", os.path.join(root, b"plain", b"dangling \xe9.jpg"))
    os.symlink(b"loop_b.jpg", os.path.join(root, b"plain", b"loop_a.jpg"))  # a link loop on a file
    os.symlink(b"loop_a.jpg", os.path.join(root, b"plain", b"loop_b.jpg"))
    os.symlink(os.path.join(root, b"plain"), os.path.join(root, b"plain", b"again"))  # a folder loop
    os.mkfifo(os.path.join(root, b"plain", b"pipe.jpg"))  # reading it would block forever
    output = tmp_path / "out.h5"
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "avgpool", "-b", "4",
                          os.fsdecode(root), output, timeout=240)  # default loader workers
    assert result.returncode == 0, result.stderr
    assert f"Wrote {len(ODD_NAMES)} images (4 skipped)" in result.stderr
    expected = sorted(os.path.join(b"cl\xe0ss" if i % 2 else b"plain", name) for i, name in enumerate(ODD_NAMES))
    with h5py.File(output, "r") as h5file:
        texts = list(h5file["paths"].asstr()[:])  # plain h5py reads every row as text
        assert sorted(raw_paths(h5file)) == expected
        assert h5file["features/avgpool"].shape[0] == len(ODD_NAMES)
        assert "plain/caf\\xe9.jpg" in texts and "cl\\xe0ss/\\xff\\xfe bytes.png" in texts
        assert "plain/new\nline.jpg" in texts
        assert "plain/back\\xe9slash.jpg" in texts  # shown alike, told apart by raw_paths
        assert len(h5file["raw_paths/rows"]) == 5  # only the names that are not UTF-8
        skipped = dict(zip(raw_paths(h5file, "skipped/"), h5file["skipped/reasons"].asstr()[:]))
        classes = list(h5file["labels"].attrs["classes"])
    assert sorted(skipped) == [b"plain/dangling \xe9.jpg", b"plain/loop_a.jpg", b"plain/loop_b.jpg",
                               b"plain/pipe.jpg"]
    assert skipped[b"plain/pipe.jpg"] == "OSError: not a regular file (a pipe, socket or device)"
    assert "Too many levels of symbolic links" in skipped[b"plain/loop_a.jpg"]
    assert [c.decode() if isinstance(c, bytes) else c for c in classes] == ["cl\\xe0ss", "plain"]
    info = run_featdump("info", output)
    assert info.returncode == 0 and "skipped:    4" in info.stdout
    from featdump.faces.atlas import atlas

    atlas(output, tmp_path / "site", k=len(ODD_NAMES))  # every row on every unit's page, drawn from its bytes
    page = (tmp_path / "site" / "units" / "avgpool" / "0.html").read_text()
    assert page.count('<div class="pic"><img') == 2 * len(ODD_NAMES) + 5 and "missing" not in page

