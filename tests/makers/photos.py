"""Synthetic camera photos (12 MP JPEGs by default): the same generator for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CAMERA_SIZE = (4032, 3024)  # a 12 MP phone or camera photo


def camera_photo(seed: int, size: tuple[int, int] = CAMERA_SIZE) -> Image.Image:
    """Smooth colour fields, hard-edged shapes and sensor-like noise: compresses like a photo (~1-2 MB)."""
    rng = np.random.default_rng(seed)
    width, height = size
    field = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(size, Image.BICUBIC)
    draw = ImageDraw.Draw(field)
    for _ in range(12):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        w, h = int(rng.integers(width // 20, width // 4)), int(rng.integers(height // 20, height // 4))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x, y, x + w, y + h], fill=colour)
    noise = rng.normal(0, 4, (height, width // 4, 3)).astype(np.int16).repeat(4, axis=1)[:, :width]
    pixels = np.clip(np.asarray(field, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def write_camera_photos(folder: Path, count: int, size: tuple[int, int] = CAMERA_SIZE, rotated_every: int = 4,
                        start: int = 0) -> list[Path]:
    """COUNT photos as quality-90 JPEGs under FOLDER (kept if already there); every ROTATED_EVERY-th one is
    stored landscape with EXIF orientation 6, as a phone held upright writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(start, start + count):
        path = folder / f"photo_{index:05d}.jpg"
        paths.append(path)
        if path.exists():
            continue
        exif = Image.Exif()
        if rotated_every and index % rotated_every == rotated_every - 1:
            exif[0x0112] = 6
        camera_photo(index, size).save(path, quality=90, exif=exif.tobytes())
    return paths
