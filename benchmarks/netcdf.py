"""What the NetCDF-4 dimension names cost: a 10,000-row append with them (format 3) and without (as format 2 wrote),
in time and size, and the time to open the file in xarray.

    python -m benchmarks.netcdf [--rows 10000] [--rounds 3]

The output's own writer (`FeatureWriter`, batches of 64 rows committed one by one, as a run writes them) appends
10,000 rows of two resnet50-like layers: layer4 (2048, 7, 7) pooled to avgpool (2048,), and layer3's (1024, 14,
14) reduced to srp:4096, plus a (512, 7, 7) map: 1.04 GB of float32. Without names, `netcdf.label` is a no-op.
Rounds are interleaved; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from featdump.output import netcdf
from featdump.output.layout import DatasetSpec
from featdump.output.writer import FeatureWriter

HERE = Path(__file__).resolve().parent


SPECS = {"avgpool": DatasetSpec((2048,), "float32", reduction="avgpool"),
         "layer3": DatasetSpec((4096,), "float32", reduction="srp:4096"),
         "layer4.2.conv1": DatasetSpec((512, 7, 7), "float32")}
BATCH = 64
LABEL = netcdf.label


def append(output: Path, rows: int, named: bool) -> tuple[float, float, int]:
    """(seconds to create, seconds to append ROWS and finish, bytes) of one output."""
    netcdf.label = LABEL if named else (lambda h5file: None)
    rng = np.random.default_rng(0)
    batches = {name: rng.standard_normal((BATCH, *spec.shape), dtype=np.float32) for name, spec in SPECS.items()}
    started = time.perf_counter()
    writer = FeatureWriter.open(output, SPECS, {"image_count": rows}, {"model": "benchmark"}, ["a", "b"], BATCH)
    created = time.perf_counter() - started
    started = time.perf_counter()
    for start in range(0, rows, BATCH):
        count = min(BATCH, rows - start)
        writer.append({name: values[:count] for name, values in batches.items()},
                      [f"images/{row:07d}.jpg" for row in range(start, start + count)], [row % 2 for row in
                                                                                          range(start, start + count)],
                      [], start + count)
    writer.finish()
    return created, time.perf_counter() - started, output.stat().st_size


def open_seconds(output: Path) -> float:
    import xarray as xr

    started = time.perf_counter()
    with xr.open_datatree(output, engine="h5netcdf") as tree:
        assert tree["features"]["avgpool"].dims[0] == "image"
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    results: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    opens = []
    with tempfile.TemporaryDirectory(dir=HERE) as folder:
        for round_ in range(arguments.rounds):
            for named in (False, True):
                output = Path(folder) / f"{'named' if named else 'plain'}-{round_}.h5"
                results[named].append(append(output, arguments.rows, named))
                if named:
                    opens.append(open_seconds(output))
                output.unlink()
    print(f"{arguments.rows:,} rows in batches of {BATCH}, {arguments.rounds} rounds (median):\n")
    print("| file | create (ms) | append + finish (s) | size (bytes) |")
    print("| --- | ---: | ---: | ---: |")
    for named, label in ((False, "without dimension names (format 2)"), (True, "with them (format 3)")):
        created, appended, size = (statistics.median(column) for column in zip(*results[named]))
        print(f"| {label} | {created * 1000:.1f} | {appended:.2f} | {int(size):,} |")
    plain, named = (statistics.median(row[1] for row in results[flag]) for flag in (False, True))
    extra = statistics.median(results[True][i][2] - results[False][i][2] for i in range(arguments.rounds))
    print(f"\nappend time ratio named/plain: {named / plain:.3f}; size added: {int(extra):,} bytes; "
          f"xarray open_datatree of the named file: {statistics.median(opens) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
