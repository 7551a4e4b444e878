"""The atlas's pages (`faces.atlas` writes them): the index, a grid of unit tiles with its data (atlas.js), and a
page per unit: its top, bottom and quantile images with their values, files and classes, a map's or a token
grid's maximum boxed, its histogram with its axes."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featdump.analysis.stored import Stored
from featdump.output.netcdf import axis_kinds
from featdump.units.top import QUANTILES, Ranking

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


class Tiles:
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
                           "href": f"units/{slug(name)}/{unit}.html",
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


@dataclass(frozen=True)
class Grid:
    """Where a unit's positions lie on the image: ROWS x COLUMNS cells from position FIRST on (a ViT's class token
    before them); KIND names them (positions of a map, or tokens)."""

    rows: int
    columns: int
    first: int = 0
    kind: str = "positions"

    def box(self, position: int) -> str:
        """The box over the cell of POSITION; none for a position off the grid (the class token)."""
        cell = int(position) - self.first
        if cell < 0 or cell >= self.rows * self.columns:
            return ""
        y, x = divmod(cell, self.columns)
        return (f'<div class="box" style="left:{100 * x / self.columns:.2f}%;top:{100 * y / self.rows:.2f}%;'
                f'width:{100 / self.columns:.2f}%;height:{100 / self.rows:.2f}%"></div>')


def grid_of(shape: tuple[int, ...], attributes: dict) -> Grid | None:
    """Where a position lies for a layer whose rows are maps (channel, y, x), or tokens of a square grid of patches
    (with a class token first, or none); None otherwise."""
    kinds = axis_kinds(shape, attributes)
    if len(shape) == 3 and "y" in kinds and "x" in kinds and shape[kinds.index("y")] * shape[kinds.index("x")] > 1:
        return Grid(shape[kinds.index("y")], shape[kinds.index("x")])
    if kinds == ["token", "feature"]:
        for first in (0, 1):
            side = int(round((shape[0] - first) ** 0.5))
            if side > 1 and side * side == shape[0] - first:
                return Grid(side, side, first, "tokens")
    return None


def slug(name: str) -> str:
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
        box = grid.box(position) if grid is not None and position >= 0 else ""
        picture = f'<div class="pic"><img src="../../thumbs/{picture_name}" alt="{title}">{box}</div>'
    label_of = int(stored.labels[row])
    kind = f'<div class="class">{html.escape(stored.classes[label_of])}</div>' if 0 <= label_of < len(
        stored.classes) else ""
    name = html.escape(stored.paths[row].rsplit("/", 1)[-1])
    return (f'<div class="cell" data-row="{row}">{picture}<div class="value">{label}{value:.4g}</div>'
            f'<div class="name" title="{title} (row {row})">{name}</div>{kind}</div>')


def unit_page(stored: Stored, name: str, unit: int, ranking: Ranking, grid, pictures: dict, units: int) -> str:
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
            f'<h2>Lowest</h2>{_lowest_tied(ranking, unit)}<div class="grid" id="bottom">{bottom_cells}</div>'
            f'<h2>Across its range</h2><div class="grid" id="quantiles">{spectrum_cells}</div>'
            f'<h2>Over all {stored.rows} images</h2><div class="hist" id="histogram">{bars}</div>'
            f'{_histogram_axes(ranking.histogram[unit], ranking.edges[unit], ranking, unit)}'
            f'{keys}</body></html>')


def _what_the_value_is(grid: Grid | None) -> str:
    if grid is not None and grid.kind == "tokens":
        return (f"Under each image: the unit's maximum over its {grid.first + grid.rows * grid.columns} tokens (the "
                f"box marks the patch of the {grid.rows} x {grid.columns} grid where it lies; none where it is the "
                "class token); then the image's file and class.")
    if grid is not None:
        return (f"Under each image: the unit's maximum over its {grid.rows} x {grid.columns} positions (the box "
                "marks where it lies); then the image's file and class.")
    return "Under each image: the unit's value (its maximum over its positions, where it has several); then the " \
        "image's file and class."


def _lowest_tied(ranking: Ranking, unit: int) -> str:
    """Where the lowest images are ties (a ReLU's zeros): how many images share the lowest value, as the quantiles
    tell it, and that those shown are the first in the file's order, not the least; else nothing."""
    lowest = float(ranking.bottom_values[unit, 0])
    if float(ranking.bottom_values[unit, -1]) != lowest:
        return ""
    tied = [quantile for quantile, value in zip(QUANTILES, ranking.quantile_values[unit]) if float(value) == lowest]
    share = f"at least {max(tied):.0%} of the images" if tied else "more images than are shown"
    return (f'<p id="ties">{share} have the lowest value, {lowest:.4g}: those shown are the first of them in the '
            "file's order, not the least.</p>")


def _histogram_axes(counts: np.ndarray, edges: np.ndarray, ranking: Ranking, unit: int) -> str:
    return (f'<p id="axes">x: the unit\'s value, {len(edges) - 1} bars from {float(edges[0]):.4g} to '
            f"{float(edges[-1]):.4g} (the range of a sample of the images), a bar before them for the images below "
            f"and one after for those above; y: images, the tallest bar {int(counts.max())} of {int(counts.sum())}. "
            f"All images: {float(ranking.bottom_values[unit, 0]):.4g} to {float(ranking.values[unit, 0]):.4g}.</p>")


def _histogram(counts: np.ndarray, edges: np.ndarray) -> str:
    """The bars of a unit's histogram over every image: the bins between EDGES, and those below and above them."""
    tallest = max(int(counts.max()), 1)
    titles = [f"below {edges[0]:.4g}"] + [f"{low:.4g} to {high:.4g}" for low, high in zip(edges[:-1], edges[1:])] + \
        [f"above {edges[-1]:.4g}"]
    return "".join(f'<div style="height:{60 * int(count) / tallest:.1f}px" title="{html.escape(title)}: '
                   f'{int(count)}"></div>' for count, title in zip(counts, titles))


def index_page(output: Path, layers: dict[str, int]) -> str:
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
