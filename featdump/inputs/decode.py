"""Decode: an image file to 8-bit RGB pixels with Pillow (EXIF rotation, any mode, reduced-scale JPEGs), and a
one-line reason when a file cannot be used."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps

JPEG_EXTENSIONS = frozenset({".jpg", ".jpeg"})


def open_rgb(path: Path | BinaryIO, draft: tuple[int, int] | None = None) -> Image.Image:
    """Decode PATH as 8-bit RGB, with EXIF orientation applied; raises on anything undecodable.

    Grayscale, palette, RGBA (alpha dropped, as torchvision's ImageFolder loader does), CMYK and
    16-bit images are converted; images over Pillow's pixel limit are refused as decompression bombs.
    With DRAFT (width, height), a JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8) that keeps
    it at least that large; other formats are decoded whole.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(path) as image:
            if draft is not None and image.format == "JPEG":
                image.draft(image.mode, draft)
            image.load()
            image = ImageOps.exif_transpose(image)
            return _to_rgb(image)


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode.startswith("I") or image.mode == "F":
        gray = _scale_to_8_bits(image)
        return Image.fromarray(gray, mode="L").convert("RGB")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    return image.convert("RGB")


def _scale_to_8_bits(image: Image.Image) -> np.ndarray:
    """16-bit (and 32-bit) grayscale scaled to 0-255 by value, not clipped."""
    values = np.asarray(image).astype(np.float64)
    if image.mode.startswith("I;16") or values.max(initial=0) > 255:
        full_scale = 65535.0
    elif image.mode == "F" and values.max(initial=0) <= 1.0:
        full_scale = 1.0
    else:
        full_scale = 255.0
    return np.clip(np.rint(values * (255.0 / full_scale)), 0, 255).astype(np.uint8)


def describe_failure(error: BaseException) -> str:
    """One line saying why an image could not be used."""
    if isinstance(error, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return f"decompression bomb: {error}"
    if isinstance(error, FileNotFoundError):
        broken_link = error.filename and os.path.islink(error.filename)
        return "file not found (a broken symlink?)" if broken_link else "file not found"
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def check_regular_file(path: Path) -> os.stat_result:
    """PATH's stat, or raise unless it (followed through links) is a regular file: a FIFO would block a read."""
    found = os.stat(path)
    if not stat.S_ISREG(found.st_mode):
        raise OSError("not a regular file (a pipe, socket or device)")
    return found


def plain_jpeg(path: Path | BinaryIO, draft: tuple[int, int] | None = None) -> bool:
    """An RGB/gray JPEG without EXIF rotation, within Pillow's pixel limit, and (with DRAFT) too small for a
    reduced-scale decode, which the CPU does and nvjpeg cannot (reads the header only)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(path) as image:
            orientation = image.getexif().get(0x0112, 1)
            scalable = draft is not None and min(image.size) >= 2 * min(draft)
            return image.format == "JPEG" and image.mode in ("RGB", "L") and orientation == 1 and not scalable
