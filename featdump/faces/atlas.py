"""Atlas: a static site of what each unit answers to, from an output and its ranking (`units.top`): an index of the
layers and their units (searchable, paged), a page per unit with its top and bottom images as the model saw them,
the value under each, where a map's maximum lies, the unit's histogram over all images and the classes its top
images come from; the arrow keys move between units. Plain files: it opens from file:// and from a bucket, with no
server and no network (the data the index searches is a script, not a fetch). A thumbnail is named by what it
shows (the image's path and the version the output recorded of it, and how the model saw it), so a folder reused for
another output, or for the same one re-extracted in another order, never shows one image for another; an image
changed since the output read it is shown as changed, not drawn. A rerun writes only the files whose content
changed, and removes the pages and thumbnails no unit shows any more.

    DIR/index.html, DIR/atlas.js (the units), DIR/style.css, DIR/site.json (the output it shows)
    DIR/units/LAYER/UNIT.html
    DIR/thumbs/KEY.jpg
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featdump.analysis.stored import Stored
from featdump.faces.atlas_pages import CHANGED, STYLE, Tiles, grid_of, index_page, slug, unit_page
from featdump.faces.show import image_as_seen
from featdump.output.layout import Output
from featdump.units.top import top

log = logging.getLogger("featdump")
THUMB = 128  # pixels, square


@dataclass(frozen=True)
class Written:
    """What a run of the atlas wrote: its folder, the files it changed and those it left as they were."""

    folder: Path
    changed: int
    unchanged: int


def atlas(output: str | Path, folder: str | Path, layers: list[str] | str | None = None, k: int = 16,
          memory: str = "1GB", overwrite: bool = False) -> Written:
    """The site of OUTPUT's LAYERS (all by default) in FOLDER: the ranking made or read (`units.top`, beside
    OUTPUT; OVERWRITE: made again), each unit's histogram, the thumbnails and the pages."""
    output, folder = Path(output), Path(folder)
    stored = Stored.read(output)
    ranked = top(output, layers, k=k, memory=memory, overwrite=overwrite)
    with Output.open(output) as opened:
        geometry = json.loads(opened.attrs.get("image_geometry", "{}"))
        shapes = {name: (opened.features(name).shape[1:], dict(opened.features(name).attrs)) for name in ranked}
        versions = opened.file["file_stats"][:stored.rows]
        names = opened.raw_paths()  # a name that is not UTF-8 as its bytes (its text in /paths is not the file's)
    site = _Site(folder, stored, names)
    rows = sorted({int(row) for ranking in ranked.values() for row in (*ranking.rows.ravel(),
                                                                       *ranking.bottom_rows.ravel(),
                                                                       *ranking.quantile_rows.ravel())})
    pictures = {row: site.thumbnail(row, versions[row], geometry) for row in rows}
    tiles = Tiles(stored, pictures)
    for name, ranking in ranked.items():
        grid = grid_of(*shapes[name])
        for unit in range(len(ranking.rows)):
            site.write(f"units/{slug(name)}/{unit}.html",
                       unit_page(stored, name, unit, ranking, grid, pictures, len(ranking.rows)))
            tiles.add(name, unit, ranking)
    site.write("atlas.js", "window.ATLAS = " + json.dumps(tiles.data(output)) + ";\n")
    site.write("style.css", STYLE)
    site.write("index.html", index_page(output, {name: len(r.rows) for name, r in ranked.items()}))
    site.write("site.json", json.dumps(site.shows, sort_keys=True))
    site.remove_unused()
    return Written(folder, site.changed, site.unchanged)


class _Site:
    """The site's folder: a file is written only where its content changed; a thumbnail once for what it shows;
    what this run did not write or keep is removed at the end (a unit no longer shown, a picture of another
    output's)."""

    def __init__(self, folder: Path, stored: Stored, names: list[bytes]):
        self.folder, self.stored, self.names, self.changed, self.unchanged = folder, stored, names, 0, 0
        self.kept: set[Path] = set()
        self.shows = {"output": str(stored.path.resolve()), "run": stored.fingerprint, "rows": stored.rows}
        before = _shown_before(folder)
        if before is not None and before != self.shows:
            log.info("%s held the atlas of %s (%d rows): made again for %s; a picture is named by its image, so "
                     "none of the other's is shown for one of these.", folder, before.get("output"),
                     before.get("rows", 0), self.shows["output"])

    def write(self, relative: str, text: str) -> None:
        path = self.folder / relative
        self.kept.add(path)
        data = text.encode()
        if path.exists() and path.read_bytes() == data:
            self.unchanged += 1
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.changed += 1

    def thumbnail(self, row: int, recorded: np.ndarray, geometry: dict) -> str | None:
        """The name of row ROW's thumbnail (the image as the model saw it), made where it is not there yet;
        CHANGED where the image's file differs from the one the output read (RECORDED: its size and version);
        None where it is gone."""
        from PIL import Image

        stored, relative = self.stored, os.fsdecode(self.names[row])
        if _changed_since(stored.root, relative, recorded):
            return CHANGED
        start = float(stored.clip_starts[row]) if stored.clip_starts is not None else None
        name = _picture_name(stored.root, self.names[row], recorded, geometry, start)
        path = self.folder / "thumbs" / name
        if not path.exists():
            seen = image_as_seen(stored.root, relative, geometry, start)
            if seen is None:
                return None
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(seen).resize((THUMB, THUMB)).save(path, quality=88)
            self.changed += 1
        self.kept.add(path)
        return name

    def remove_unused(self) -> None:
        """Remove the pages and thumbnails this run neither wrote nor kept."""
        for part in ("units", "thumbs"):
            for path in sorted((self.folder / part).rglob("*")) if (self.folder / part).is_dir() else []:
                if path.is_file() and path not in self.kept:
                    path.unlink()
                    self.changed += 1


def _shown_before(folder: Path) -> dict | None:
    """What the site in FOLDER showed (its site.json), None where there is none (or a site made before it was
    recorded)."""
    try:
        return json.loads((folder / "site.json").read_text())
    except (OSError, ValueError):
        return None


def _picture_name(root: str, name: bytes, recorded: np.ndarray, geometry: dict, start: float | None) -> str:
    """A thumbnail's file name, from what it shows: where the image lies (ROOT), its path (NAME, its bytes), the
    version the output recorded of it (size and time, or a digest of its bytes), the clip's start and how the
    model saw it."""
    shown = [root, name.hex(), [int(value) for value in recorded], start, geometry]
    return hashlib.blake2b(json.dumps(shown, sort_keys=True).encode(), digest_size=12).hexdigest() + ".jpg"


def _changed_since(root: str, relative: str, recorded: np.ndarray) -> bool:
    """Whether the file of a row (a plain file under a local ROOT) differs now from the one the output read
    (RECORDED: its size and modification time; a negative size: not known). A row that is no file here (at a
    URL, in a tar, an array) is read back as it is kept."""
    if int(recorded[0]) < 0:
        return False
    try:
        found = os.stat(os.path.join(os.fsencode(root), os.fsencode(relative)))
    except OSError:
        return False
    return (found.st_size, found.st_mtime_ns) != (int(recorded[0]), int(recorded[1]))
