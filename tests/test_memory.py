"""Bounded memory: peak RSS depends on the batch, not on the number of images."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from .helpers import featdump_env, write_images, write_output

MEASURE = """
import resource, subprocess, sys
subprocess.run([sys.executable, "-m", "featdump", *sys.argv[1:]], check=True, capture_output=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak_rss_kib(images, output) -> int:
    """Peak RSS of one featdump process (a fresh parent, so no other child counts)."""
    args = ["extract", "-m", "resnet18", "-w", "none", "-l", "conv1", "-b", "8", "-j", "0", images, output]
    result = subprocess.run([sys.executable, "-c", MEASURE, *map(str, args)], capture_output=True, text=True,
                            env=featdump_env(), check=True)
    return int(result.stdout.strip())


@pytest.mark.slow  # four processes measured whole
def test_peak_rss_does_not_grow_with_the_number_of_images(tmp_path):
    write_images(tmp_path / "small", {"a": 40}, size=(32, 32))
    write_images(tmp_path / "large", {"a": 160}, size=(32, 32))
    small = peak_rss_kib(tmp_path / "small", tmp_path / "small.h5")
    large = peak_rss_kib(tmp_path / "large", tmp_path / "large.h5")
    # conv1 is 3.2 MB per image: holding the features in RAM would add ~390 MB for the larger run.
    print(f"\npeak RSS: {small / 1024:.0f} MiB for 40 images, {large / 1024:.0f} MiB for 160 images")
    assert large <= small * 1.15, (small, large)


LOAD = """
import resource, sys
import featdump
featdump.load(sys.argv[1], "small", xarray=True)  # xarray and h5netcdf imported, a layer read: the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
array = featdump.load(sys.argv[1], "wide", xarray=True)
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, array.nbytes)
"""


@pytest.mark.slow  # a whole process, measured
def test_load_as_xarray_takes_about_the_layer_once(tmp_path):
    """The array xarray wraps is the one read (it read 688 MiB for a 196 MiB layer when xarray copied it)."""
    rows = 800
    wide = np.random.default_rng(0).standard_normal((rows, 256, 16, 16), dtype=np.float32)  # 200 MiB
    write_output(tmp_path / "out.h5", {"wide": wide, "small": wide[:, :1, 0, 0].copy()}, batch=64)
    del wide
    result = subprocess.run([sys.executable, "-c", LOAD, tmp_path / "out.h5"], capture_output=True, text=True,
                            env=featdump_env(), check=True)
    before, after, layer = (int(value) for value in result.stdout.split())
    grown = (after - before) * 1024
    assert grown <= 1.25 * layer, f"{grown / 2**20:.0f} MiB for a {layer / 2**20:.0f} MiB layer"
    print(f"load(xarray=True): {grown / 2**20:.0f} MiB more for a {layer / 2**20:.0f} MiB layer")
