"""Bounded memory: peak RSS depends on the batch, not on the number of images."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import featdump_env, write_images

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
