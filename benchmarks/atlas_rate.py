"""`featdump atlas` at the size users browse: resnet50's LAYER (`layer4`: 2,048 units of 7 x 7 maps) over IMAGES
JPEGs, 16 images at the top and the bottom of each unit: the ranking, the thumbnails and the 2,048 pages written
once, then the same command again (which writes only what changed: nothing). Then the index at INDEX_UNITS units
(an output of that many pooled units over 64 images, written directly): the atlas's time, the size of its
`atlas.js`, and the index's load in headless Chromium (from the request to its first page of tiles drawn).

    python -m benchmarks.atlas_rate [--images 2000] [--layer layer4] [--index-units 100000] [--write-results]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np

from benchmarks.common import HERE, machine, make_images, timed_featdump, write_section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--layer", default="layer4")
    parser.add_argument("--index-units", type=int, default=100_000)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    rows = [_layer_rows(args.images, args.layer), _index_row(args.index_units)]
    header = ["| atlas | images | units | pages | thumbnails | atlas.js (MB) | time (s) | index drawn (s) |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    table = "\n".join([f"Machine: {machine()}", "", *header, *[row for part in rows for row in part]])
    print(table)
    if args.write_results:
        write_section("atlas_rate", f"Command: `python -m benchmarks.atlas_rate --images {args.images} --layer "
                                    f"{args.layer} --index-units {args.index_units}`\n\n{table}")


def _layer_rows(images: int, layer: str) -> list[str]:
    """The atlas of resnet50's LAYER over IMAGES JPEGs, first and again (the extraction before it not counted)."""
    folder = make_images(HERE / "data" / f"images-{images}", images)
    output, site = HERE / "data" / "atlas.h5", HERE / "data" / "atlas-site"
    _clear(output.with_name("atlas.top.h5"), site)
    timed_featdump("extract", "-m", "resnet50", "-w", "none", "-l", layer, "--overwrite", folder, output,
                   what="the extraction the atlas is made from")
    first, _ = timed_featdump("atlas", output, "-k", "16", "-o", site, what="atlas, first")
    again, _ = timed_featdump("atlas", output, "-k", "16", "-o", site, what="atlas, again")
    pages, thumbs, script = _site_sizes(site)
    return [f"| resnet50 {layer}, -k 16, first (ranking, thumbnails, pages) | {images} | {pages} | {pages} | "
            f"{thumbs} | {script:.1f} | {first:.1f} | |",
            f"| the same command again | {images} | {pages} | {pages} | {thumbs} | {script:.1f} | {again:.1f} | |"]


def _index_row(units: int) -> list[str]:
    """The atlas of an output of UNITS pooled units over 64 images, and its index's load in Chromium."""
    from tests.makers.outputs import write_output

    folder = make_images(HERE / "data" / "images-64", 64)
    paths = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*.jpg"))
    output, site = HERE / "data" / "atlas-index.h5", HERE / "data" / "atlas-index-site"
    _clear(output, output.with_name("atlas-index.top.h5"), site)
    values = np.random.default_rng(0).standard_normal((64, units)).astype(np.float32)
    (folder / "index-view").mkdir(exist_ok=True)
    for index, path in enumerate(paths):  # the names write_output gives its rows (class/NNNN.jpg), as links
        link = folder / "index-view" / f"{'ab'[index % 2]}" / f"{index:04d}.jpg"
        link.parent.mkdir(exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(folder / path)
    write_output(output, {"pooled": values}, batch=64, root=str(folder / "index-view"))
    started = time.perf_counter()
    timed_featdump("atlas", output, "-k", "4", "-o", site, what="atlas of the index")
    made = time.perf_counter() - started
    pages, thumbs, script = _site_sizes(site)
    drawn = _index_load_seconds(site / "index.html")
    return [f"| an index of {units:,} pooled units, -k 4 | 64 | {units} | {pages} | {thumbs} | {script:.1f} | "
            f"{made:.1f} | {drawn if isinstance(drawn, str) else f'{drawn:.2f}'} |"]


def _site_sizes(site: Path) -> tuple[int, int, float]:
    pages = sum(1 for _ in (site / "units").rglob("*.html"))
    thumbs = sum(1 for _ in (site / "thumbs").glob("*.jpg"))
    return pages, thumbs, (site / "atlas.js").stat().st_size / 1e6


def _index_load_seconds(index: Path) -> float | str:
    """Seconds from the request of INDEX in headless Chromium to its first page of tiles drawn; a dash where no
    Chromium is installed."""
    chromium, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not (chromium and driver):
        return "-"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(driver), options=options)
    try:
        started = time.perf_counter()
        browser.get(index.as_uri())  # returns at the load event: atlas.js parsed, the first page drawn
        tiles = browser.execute_script("return document.querySelectorAll('#units a.tile').length")
        assert tiles == 100, tiles
        return time.perf_counter() - started
    finally:
        browser.quit()


def _clear(*paths: Path) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
