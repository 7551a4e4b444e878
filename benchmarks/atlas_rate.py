"""`featdump atlas` at the size users browse: resnet50's `avgpool` (2,048 units) over IMAGES JPEGs, 16 images at the
top and the bottom of each unit: the ranking, the thumbnails and the 2,048 pages written once, then the same
command again (which writes only what changed: nothing).

    python -m benchmarks.atlas_rate [--images 1000] [--write-results]
"""

from __future__ import annotations

import argparse
import shutil

from benchmarks.common import HERE, machine, make_images, timed_featdump, write_section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    images = make_images(HERE / "data" / f"images-{args.images}", args.images)
    output, site = HERE / "data" / "atlas.h5", HERE / "data" / "atlas-site"
    for stale in (output.with_name("atlas.top.h5"), site):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
    timed_featdump("extract", "-m", "resnet50", "-w", "none", "-l", "avgpool", "--overwrite", images, output,
                   what="the extraction the atlas is made from")
    first, _ = timed_featdump("atlas", output, "-k", "16", "-o", site, what="atlas, first")
    again, _ = timed_featdump("atlas", output, "-k", "16", "-o", site, what="atlas, again")
    pages = len(list((site / "units").rglob("*.html")))
    thumbs = len(list((site / "thumbs").glob("*.jpg")))
    table = "\n".join([f"Machine: {machine()}", "",
                       "| atlas of resnet50 avgpool (2,048 units), -k 16 | images | pages | thumbnails | time (s) |",
                       "| --- | ---: | ---: | ---: | ---: |",
                       f"| first (ranking, thumbnails, pages) | {args.images} | {pages} | {thumbs} | {first:.1f} |",
                       f"| the same command again | {args.images} | {pages} | {thumbs} | {again:.1f} |"])
    print(table)
    if args.write_results:
        write_section("atlas_rate", f"Command: `python -m benchmarks.atlas_rate --images {args.images}`\n\n{table}")


if __name__ == "__main__":
    main()
