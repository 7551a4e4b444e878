"""The image list, and decoding of a hostile folder: bad files recorded, odd-but-valid files converted right."""

from __future__ import annotations

import io
import os

import h5py
import numpy as np
import pytest
from PIL import Image

from featdump.errors import NoImages
from featdump.inputs import find_images
from featdump.inputs.decode import open_rgb

from .helpers import run_featdump


def rgb(width=40, height=30, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)


def test_find_images_sorted_recursive_any_case(tmp_path):
    for relative in ["b/z.JPG", "a/sub/y.png", "a/x.tiff", "b/readme.txt", "a/.hidden/q.webp"]:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(b"")
    images = find_images(tmp_path)
    assert images.paths == ("a/.hidden/q.webp", "a/sub/y.png", "a/x.tiff", "b/z.JPG")
    assert images.classes == ("a", "b") and images.labels == (0, 0, 0, 1)


def test_images_at_the_root_have_no_labels(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(b"")
    (tmp_path / "y.jpg").write_bytes(b"")
    images = find_images(tmp_path)
    assert images.labels == (-1, -1) and images.classes == ()


def test_missing_and_empty_folders(tmp_path):
    with pytest.raises(NoImages, match="does not exist"):
        find_images(tmp_path / "nope")
    with pytest.raises(NoImages, match="No images in"):
        find_images(tmp_path)


def test_symlink_loops_do_not_hang(tmp_path):
    (tmp_path / "a").mkdir()
    Image.fromarray(rgb()).save(tmp_path / "a" / "x.png")
    os.symlink(tmp_path, tmp_path / "a" / "loop")
    assert find_images(tmp_path).paths == ("a/x.png",)


def make_hostile_folder(root):
    """Every bad case and every odd-but-valid case; returns (expected pixels by path, bad paths)."""
    good, bad = {}, []
    valid = root / "valid"
    broken = root / "broken"
    valid.mkdir(parents=True)
    broken.mkdir()

    def add(name, image, expected, **save):
        image.save(valid / name, **save)
        good[f"valid/{name}"] = expected

    base = rgb()
    add("plain.png", Image.fromarray(base), base)
    gray = base[..., 0]
    add("gray.png", Image.fromarray(gray, "L"), np.stack([gray] * 3, axis=-1))
    palette_image = Image.fromarray(base).quantize(16)
    palette_image.info["transparency"] = 0
    palette = np.array(palette_image.getpalette()[:48], dtype=np.uint8).reshape(16, 3)
    add("palette.png", palette_image, palette[np.asarray(palette_image)], transparency=0)
    rgba = np.dstack([base, np.full(base.shape[:2], 7, np.uint8)])
    add("rgba.png", Image.fromarray(rgba, "RGBA"), base)
    add("cmyk.tif", Image.fromarray(base).convert("CMYK"), base)
    deep = np.random.default_rng(1).integers(0, 65536, size=(30, 40), dtype=np.uint16)
    scaled = np.rint(deep / 257.0).astype(np.uint8)
    add("deep16.png", Image.fromarray(deep), np.stack([scaled] * 3, axis=-1))
    add("lossless.webp", Image.fromarray(base), base, lossless=True)
    add("bitmap.bmp", Image.fromarray(base), base)
    add("UPPER.TIFF", Image.fromarray(base), base)
    add("with space é ü 名.png", Image.fromarray(base), base)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to display
    smooth = np.asarray(Image.fromarray(rgb(4, 3, seed=2)).resize((40, 30), Image.BILINEAR))
    add("rotated.jpg", Image.fromarray(smooth), np.rot90(smooth, k=-1), exif=exif, quality=95, subsampling=0)
    os.symlink(valid / "plain.png", valid / "link.png")
    good["valid/link.png"] = base

    jpeg = io.BytesIO()
    Image.fromarray(rgb(200, 150)).save(jpeg, "JPEG")
    (broken / "truncated.jpg").write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 2])
    (broken / "zero.jpg").write_bytes(b"")
    (broken / "text.png").write_text("this is not an image")
    Image.new("1", (10000, 10000)).save(broken / "bomb.png")  # 100 Mpx: over Pillow's 89 Mpx limit
    os.symlink(broken / "missing.png", broken / "dangling.png")
    bad = ["broken/bomb.png", "broken/dangling.png", "broken/text.png", "broken/truncated.jpg", "broken/zero.jpg"]
    return good, bad


def test_odd_but_valid_images_decode_to_the_right_pixels(tmp_path):
    good, _ = make_hostile_folder(tmp_path)
    for relative, expected in good.items():
        decoded = np.asarray(open_rgb(tmp_path / relative))
        assert decoded.shape == expected.shape, relative
        if relative.endswith(".jpg"):  # lossy: close to the clockwise rotation, far from the other one
            assert np.abs(decoded.astype(int) - expected).mean() < 3, relative
            assert np.abs(decoded.astype(int) - np.rot90(expected, k=2)).mean() > 10, relative
        else:
            np.testing.assert_array_equal(decoded, expected, err_msg=relative)


def test_hostile_folder_run_skips_and_records_bad_files(tmp_path):
    good, bad = make_hostile_folder(tmp_path / "images")
    output = tmp_path / "out.h5"
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "maxpool", "-b", "4", "-j", "2",
                          tmp_path / "images", output)
    assert result.returncode == 0, result.stderr
    assert f"Wrote {len(good)} images ({len(bad)} skipped)" in result.stderr
    with h5py.File(output, "r") as h5file:
        assert sorted(h5file["paths"].asstr()[:]) == sorted(good)
        assert h5file["features/maxpool"].shape[0] == len(good)
        reasons = dict(zip(h5file["skipped/paths"].asstr()[:], h5file["skipped/reasons"].asstr()[:]))
    assert sorted(reasons) == bad
    assert reasons["broken/bomb.png"].startswith("decompression bomb")
    assert "truncated" in reasons["broken/truncated.jpg"]
    assert reasons["broken/dangling.png"] == "file not found (a broken symlink?)"
    assert "UnidentifiedImageError" in reasons["broken/zero.jpg"]


def test_a_batch_of_only_bad_images_is_fine(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    Image.fromarray(rgb()).save(root / "a.png")
    for name in ("b.jpg", "c.jpg", "d.jpg"):
        (root / name).write_bytes(b"junk")
    Image.fromarray(rgb()).save(root / "e.png")
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "fc", "-b", "1", "-j", "0",
                          root, tmp_path / "o.h5")
    assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "o.h5", "r") as h5file:
        assert list(h5file["paths"].asstr()[:]) == ["a.png", "e.png"]
        assert h5file["features/fc"].shape == (2, 1000)


def test_on_error_fail_stops_with_path_and_reason(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    Image.fromarray(rgb()).save(root / "a.png")
    (root / "b.jpg").write_bytes(b"junk")
    result = run_featdump("extract", "-m", "resnet18", "-w", "none", "-l", "fc", "--on-error", "fail",
                          root, tmp_path / "o.h5")
    assert result.returncode == 1
    assert "Error: Cannot use image 'b.jpg': UnidentifiedImageError" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "o.h5").exists()
