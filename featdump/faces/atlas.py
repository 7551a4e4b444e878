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
import html
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featdump.analysis.stored import Stored
from featdump.faces.show import image_as_seen
from featdump.output.layout import Output
from featdump.output.netcdf import axis_kinds
from featdump.units.top import QUANTILES, Ranking, top

log = logging.getLogger("featdump")
THUMB = 128  # pixels, square
CHANGED = "changed"  # a row whose image differs from the one the output read: shown as such, not drawn
STYLE = """body{font-family:sans-serif;margin:1.5em;color:#222}a{color:#05c}
.grid{display:flex;flex-wrap:wrap;gap:8px}.cell{width:128px;font-size:11px;text-align:center}
.pic{position:relative;width:128px;height:128px;background:#eee}.pic img{width:128px;height:128px;display:block}
.box{position:absolute;border:2px solid #f30;box-sizing:border-box}.missing{line-height:128px;color:#999}
.hist{display:flex;align-items:flex-end;height:60px;gap:1px}.hist div{background:#58a;width:8px}
td,th{padding:2px 8px;text-align:left}
.tiles{display:flex;flex-wrap:wrap;gap:10px}.tile{width:150px;text-decoration:none;color:#222;font-size:11px}
.tile .pics{display:grid;grid-template-columns:repeat(3,50px);grid-auto-rows:50px;background:#eee;width:150px;
height:150px}.tile .pics img{width:50px;height:50px;display:block}.tile.dead{opacity:.45}
.caption{font-weight:bold;margin-top:2px}"""


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
    site = _Site(folder, stored)
    rows = sorted({int(row) for ranking in ranked.values() for row in (*ranking.rows.ravel(),
                                                                       *ranking.bottom_rows.ravel(),
                                                                       *ranking.quantile_rows.ravel())})
    pictures = {row: site.thumbnail(row, versions[row], geometry) for row in rows}
    tiles = _Tiles(stored, pictures)
    for name, ranking in ranked.items():
        grid = _grid(*shapes[name])
        for unit in range(len(ranking.rows)):
            site.write(f"units/{_slug(name)}/{unit}.html",
                       _unit_page(stored, name, unit, ranking, grid, pictures, len(ranking.rows)))
            tiles.add(name, unit, ranking)
    site.write("atlas.js", "window.ATLAS = " + json.dumps(tiles.data(output)) + ";\n")
    site.write("style.css", STYLE)
    site.write("index.html", _index_page(output, {name: len(r.rows) for name, r in ranked.items()}))
    site.write("site.json", json.dumps(site.shows, sort_keys=True))
    site.remove_unused()
    return Written(folder, site.changed, site.unchanged)


class _Site:
    """The site's folder: a file is written only where its content changed; a thumbnail once for what it shows;
    what this run did not write or keep is removed at the end (a unit no longer shown, a picture of another
    output's)."""

    def __init__(self, folder: Path, stored: Stored):
        self.folder, self.stored, self.changed, self.unchanged = folder, stored, 0, 0
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

        stored = self.stored
        if _changed_since(stored.root, stored.paths[row], recorded):
            return CHANGED
        start = float(stored.clip_starts[row]) if stored.clip_starts is not None else None
        name = _picture_name(stored, row, recorded, geometry, start)
        path = self.folder / "thumbs" / name
        if not path.exists():
            seen = image_as_seen(stored.root, stored.paths[row], geometry, start)
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


def _picture_name(stored: Stored, row: int, recorded: np.ndarray, geometry: dict, start: float | None) -> str:
    """A thumbnail's file name, from what it shows: where the image lies, its path (its bytes, as stored), the
    version the output recorded of it (size and time, or a digest of its bytes), the clip's start and how the
    model saw it."""
    shown = [stored.root, os.fsencode(stored.paths[row]).hex(), [int(value) for value in recorded], start,
             geometry]
    return hashlib.blake2b(json.dumps(shown, sort_keys=True).encode(), digest_size=12).hexdigest() + ".jpg"


def _changed_since(root: str, relative: str, recorded: np.ndarray) -> bool:
    """Whether the file of a row (a plain file under a local ROOT) differs now from the one the output read
    (RECORDED: its size and modification time; a negative size: not known)."""
    if int(recorded[0]) < 0 or "://" in str(root):
        return False
    try:
        found = os.stat(os.path.join(os.fsencode(root), os.fsencode(relative)))
    except OSError:
        return False  # gone, or not a file (a member of a tar, a row of an array): read back as it is kept
    return (found.st_size, found.st_mtime_ns) != (int(recorded[0]), int(recorded[1]))


class _Tiles:
    """The index's data: a tile per unit (its layer, number, top value, its first top images' thumbnails, the class
    most of its top images come from and their share, whether it is dead: every value equal), the thumbnails named
    once in a list the tiles point into."""

    SHOWN = 9  # top images on a unit's tile

    def __init__(self, stored: Stored, pictures: dict):
        self.stored, self.pictures = stored, pictures
        self.thumbs: dict[str, int] = {}
        self.units: list[dict] = []

    def add(self, name: str, unit: int, ranking: Ranking) -> None:
        rows = [int(row) for row in ranking.rows[unit]]
        shown = [self.pictures.get(row) for row in rows]
        shown = [picture for picture in shown if picture not in (None, CHANGED)][:self.SHOWN]
        main, share = self._main_class(rows)
        self.units.append({"layer": name, "unit": unit, "top": _finite(ranking.values[unit, 0]),
                           "href": f"units/{_slug(name)}/{unit}.html",
                           "pics": [self.thumbs.setdefault(picture, len(self.thumbs)) for picture in shown],
                           "cls": main, "share": share,
                           "dead": int(ranking.values[unit, 0] == ranking.bottom_values[unit, 0])})

    def _main_class(self, rows: list[int]) -> tuple[int, float]:
        """The class most of ROWS are of (the lower one in a tie) and their share of ROWS; (-1, 0) unlabelled."""
        labels = np.asarray([int(self.stored.labels[row]) for row in rows])
        labels = labels[labels >= 0]
        if not self.stored.classes or not len(labels):
            return -1, 0.0
        counts = np.bincount(labels)
        return int(counts.argmax()), round(float(counts.max()) / len(rows), 4)

    def data(self, output: Path) -> dict:
        return {"output": str(output), "classes": list(self.stored.classes), "thumbs": list(self.thumbs),
                "units": self.units}


def _finite(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


def _grid(shape: tuple[int, ...], attributes: dict) -> tuple[int, int] | None:
    """(H, W) of a layer whose rows are maps (channel, y, x): where a position lies; None otherwise."""
    kinds = axis_kinds(shape, attributes)
    if len(shape) == 3 and "y" in kinds and "x" in kinds and shape[kinds.index("y")] * shape[kinds.index("x")] > 1:
        return shape[kinds.index("y")], shape[kinds.index("x")]
    return None


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _cell(stored: Stored, row: int, value: float, position: int, grid, pictures: dict, label: str = "") -> str:
    """One image of a unit's page: its thumbnail (or "missing", or "changed"), the maximum's box, its value, its
    file's name and class."""
    title = html.escape(stored.paths[row])
    picture_name = pictures.get(row)
    if picture_name is None or picture_name == CHANGED:
        shown = "missing" if picture_name is None else "changed since"
        picture = f'<div class="pic missing">{shown}</div>'
    else:
        box = ""
        if grid is not None and position >= 0:
            y, x = divmod(int(position), grid[1])
            box = (f'<div class="box" style="left:{100 * x / grid[1]:.2f}%;top:{100 * y / grid[0]:.2f}%;'
                   f'width:{100 / grid[1]:.2f}%;height:{100 / grid[0]:.2f}%"></div>')
        picture = f'<div class="pic"><img src="../../thumbs/{picture_name}" alt="{title}">{box}</div>'
    label_of = int(stored.labels[row])
    kind = f'<div class="class">{html.escape(stored.classes[label_of])}</div>' if 0 <= label_of < len(
        stored.classes) else ""
    name = html.escape(stored.paths[row].rsplit("/", 1)[-1])
    return (f'<div class="cell" data-row="{row}">{picture}<div class="value">{label}{value:.4g}</div>'
            f'<div class="name" title="{title} (row {row})">{name}</div>{kind}</div>')


def _unit_page(stored: Stored, name: str, unit: int, ranking: Ranking, grid, pictures: dict, units: int) -> str:
    top_cells = "".join(_cell(stored, int(row), float(value), int(position), grid, pictures) for row, value, position
                        in zip(ranking.rows[unit], ranking.values[unit], ranking.positions[unit]))
    bottom_cells = "".join(_cell(stored, int(row), float(value), -1, grid, pictures) for row, value
                           in zip(ranking.bottom_rows[unit], ranking.bottom_values[unit]))
    spectrum_cells = "".join(_cell(stored, int(row), float(value), -1, grid, pictures, f"{quantile:.0%}: ")
                             for quantile, row, value in zip(QUANTILES, ranking.quantile_rows[unit],
                                                             ranking.quantile_values[unit]))
    bars = _histogram(ranking.histogram[unit], ranking.edges[unit])
    classes = ""
    if stored.classes:
        labels = [int(stored.labels[row]) for row in ranking.rows[unit] if int(stored.labels[row]) >= 0]
        found = sorted({label: labels.count(label) for label in labels}.items(), key=lambda item: -item[1])
        classes = "<p id=\"classes\">Top images' classes: " + ", ".join(
            f"{html.escape(stored.classes[label])} {count}" for label, count in found) + "</p>"
    previous = f"{unit - 1}.html" if unit > 0 else ""
    following = f"{unit + 1}.html" if unit + 1 < units else ""
    links = (f'<a id="previous" href="{previous}">&larr; unit {unit - 1}</a> ' if previous else "") + \
        '<a href="../../index.html">index</a>' + \
        (f' <a id="next" href="{following}">unit {unit + 1} &rarr;</a>' if following else "")
    keys = ("<script>document.addEventListener('keydown', function (e) {"
            "var to = e.key === 'ArrowRight' || e.key === 'j' ? 'next' : e.key === 'ArrowLeft' || e.key === 'k' ? "
            "'previous' : null; var a = to && document.getElementById(to); if (a) { location.href = a.href; }"
            "});</script>")
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(name)} unit {unit}</title>'
            f'<link rel="stylesheet" href="../../style.css"></head><body><p>{links}</p>'
            f'<h1>{html.escape(name)}, unit {unit}</h1><p id="value">{_what_the_value_is(grid)}</p>{classes}'
            f'<h2>Highest</h2><div class="grid" id="top">{top_cells}</div>'
            f'<h2>Lowest</h2><div class="grid" id="bottom">{bottom_cells}</div>'
            f'<h2>Across its range</h2><div class="grid" id="quantiles">{spectrum_cells}</div>'
            f'<h2>Over all {stored.rows} images</h2><div class="hist" id="histogram">{bars}</div>'
            f'<p>{float(ranking.bottom_values[unit, 0]):.4g} to {float(ranking.values[unit, 0]):.4g}</p>'
            f'{keys}</body></html>')


def _what_the_value_is(grid) -> str:
    if grid is not None:
        return (f"Under each image: the unit's maximum over its {grid[0]} x {grid[1]} positions (the box marks "
                "where it lies); then the image's file and class.")
    return "Under each image: the unit's value (its maximum over its positions, where it has several); then the " \
        "image's file and class."


def _histogram(counts: np.ndarray, edges: np.ndarray) -> str:
    """The bars of a unit's histogram over every image: the bins between EDGES, and those below and above them."""
    tallest = max(int(counts.max()), 1)
    titles = [f"below {edges[0]:.4g}"] + [f"{low:.4g} to {high:.4g}" for low, high in zip(edges[:-1], edges[1:])] + \
        [f"above {edges[-1]:.4g}"]
    return "".join(f'<div style="height:{60 * int(count) / tallest:.1f}px" title="{html.escape(title)}: '
                   f'{int(count)}"></div>' for count, title in zip(counts, titles))


def _index_page(output: Path, layers: dict[str, int]) -> str:
    """The index: a grid of units, each a tile of its top images (loaded as the page scrolls to them), paged by
    PAGE; sorted by top value, by how much its top images come from one class, or by unit (dead units last in
    each); filtered by layer, class and words."""
    rows = "".join(f"<tr><td>{html.escape(name)}</td><td>{count}</td></tr>" for name, count in layers.items())
    choices = "".join(f'<option value="{html.escape(name)}">{html.escape(name)}</option>' for name in layers)
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>featdump atlas of {html.escape(output.name)}'
            f'</title><link rel="stylesheet" href="style.css"><script src="atlas.js"></script></head><body>'
            f'<h1>{html.escape(output.name)}</h1><table><tr><th>layer</th><th>units</th></tr>{rows}</table>'
            '<p><input id="search" placeholder="layer or unit (layer4 12)" size="30"> '
            f'<select id="layer"><option value="">every layer</option>{choices}</select> '
            '<select id="class"><option value="">every class</option></select> '
            '<select id="order"><option value="top">highest top value</option>'
            '<option value="share">most of one class</option><option value="unit">unit</option></select> '
            '<button id="less">&larr;</button> <span id="page"></span> <button id="more">&rarr;</button></p>'
            f'<div id="units" class="tiles"></div><script>{INDEX_SCRIPT}</script></body></html>')


INDEX_SCRIPT = """
var PAGE = 100, page = 0, A = window.ATLAS;
function chosen(id) { return document.getElementById(id).value; }
A.classes.forEach(function (name, i) {
  var option = document.createElement('option'); option.value = i; option.textContent = name;
  document.getElementById('class').appendChild(option);
});
if (!A.classes.length) {
  document.getElementById('class').style.display = 'none';
  document.querySelector('#order option[value=share]').remove();
}
A.units.forEach(function (u, i) { u.index = i; });
function shown() {
  var words = chosen('search').trim().toLowerCase().split(/\\s+/).filter(Boolean);
  var layer = chosen('layer'), kind = chosen('class'), order = chosen('order');
  var found = A.units.filter(function (u) {
    var text = (u.layer + ' ' + u.unit + ' ' + u.layer + '/' + u.unit).toLowerCase();
    return (!layer || u.layer === layer) && (kind === '' || u.cls === Number(kind)) &&
      words.every(function (w) { return text.indexOf(w) >= 0; });
  });
  var key = {top: function (u) { return u.top === null ? Infinity : -u.top; },
             share: function (u) { return -u.share; }, unit: function (u) { return u.index; }}[order];
  return found.sort(function (a, b) { return (a.dead - b.dead) || (key(a) - key(b)) || (a.index - b.index); });
}
function tile(u) {
  var link = document.createElement('a'), pics = document.createElement('div'), caption = document.createElement('div');
  link.href = u.href; link.className = 'tile' + (u.dead ? ' dead' : '');
  pics.className = 'pics';
  u.pics.forEach(function (p) {
    var img = document.createElement('img'); img.loading = 'lazy'; img.src = 'thumbs/' + A.thumbs[p]; img.alt = '';
    pics.appendChild(img);
  });
  caption.className = 'caption';
  caption.textContent = u.layer + ' / unit ' + u.unit;
  var about = document.createElement('div');
  about.className = 'about';
  about.textContent = u.dead ? 'dead: every value ' + u.top :
    'top ' + (u.top === null ? 'NaN' : u.top.toPrecision(4)) +
    (u.cls >= 0 ? ', ' + Math.round(100 * u.share) + '% ' + A.classes[u.cls] : '');
  link.appendChild(pics); link.appendChild(caption); link.appendChild(about);
  return link;
}
function draw() {
  var found = shown(), list = document.getElementById('units');
  var pages = Math.max(1, Math.ceil(found.length / PAGE));
  page = Math.min(page, pages - 1);
  list.innerHTML = '';
  found.slice(page * PAGE, (page + 1) * PAGE).forEach(function (u) { list.appendChild(tile(u)); });
  document.getElementById('page').textContent = 'page ' + (page + 1) + ' of ' + pages + ', ' + found.length + ' units';
}
[['search', 'input'], ['layer', 'change'], ['class', 'change'], ['order', 'change']].forEach(function (pair) {
  document.getElementById(pair[0]).addEventListener(pair[1], function () { page = 0; draw(); });
});
document.getElementById('more').addEventListener('click', function () { page += 1; draw(); });
document.getElementById('less').addEventListener('click', function () { page = Math.max(0, page - 1); draw(); });
draw();
"""
