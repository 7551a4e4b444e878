"""Peak memory of a Parquet job by row group: the same camera photos in one row group (as pandas, pyarrow and
img2dataset-style writers leave a file) and in groups of 64 rows, read by `featdump extract` with the default
workers and batch size; the peak resident memory of its whole process tree (the main process and its loader
workers, sampled every 50 ms).

    python -m benchmarks.table_memory [--rows 2000] [--out DIR]
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine
from tests.makers.photos import camera_photo


def write_table(path: Path, rows: int, group: int) -> int:
    """ROWS JPEG camera photos in one Parquet file of row groups of GROUP rows; its size in bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = []
    for index in range(rows):
        buffer = io.BytesIO()
        camera_photo(index, (800, 600)).save(buffer, format="JPEG", quality=90)  # each its own: no dictionary
        data.append(buffer.getvalue())
    pq.write_table(pa.table({"jpg": pa.array(data, pa.binary())}), path, row_group_size=group)
    return path.stat().st_size


def tree_rss_mib(pid: int) -> float:
    """The resident memory of PID and every process below it, in MiB."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total / 1024


def peak_of(command: list[str]) -> tuple[float, float]:
    """(peak MiB of COMMAND's process tree, its seconds)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0.0
    while process.poll() is None:
        peak = max(peak, tree_rss_mib(process.pid))
        time.sleep(0.05)
    if process.returncode != 0:
        raise RuntimeError(process.stderr.read())
    return peak, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--out", type=Path, help="a folder for the tables (default: a temporary one)")
    args = parser.parse_args()
    print(f"Machine: {machine()}", flush=True)
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.out or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        print("| row groups | file (MiB) | peak RSS, process tree (MiB) | s |")
        print("| --- | ---: | ---: | ---: |")
        for group, label in ((args.rows, "one of all rows"), (64, "64 rows each")):
            table = folder / f"group-{group}.parquet"
            size = write_table(table, args.rows, group)
            peak, seconds = peak_of([sys.executable, "-m", "featdump", "-q", "extract", "-m", "resnet18", "-w",
                                     "none", "-l", "avgpool", "--overwrite", str(table),
                                     str(folder / f"out-{group}.h5")])
            print(f"| {label} | {size / 2**20:.0f} | {peak:.0f} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
