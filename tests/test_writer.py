"""The HDF5 writer on real files: layout, chunking, commit counters, discarding uncommitted rows, finish."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from featdump.errors import OutputExists, ResumeMismatch
from featdump.output.layout import partial_path
from featdump.output.skipped import Skip
from featdump.output.specs import DatasetSpec, chunk_shape
from featdump.output.writer import FeatureWriter

from .helpers import featdump_env

SPECS = {"layer": DatasetSpec((2, 3), "float32")}


def open_writer(output, fingerprint=None, **options):
    return FeatureWriter.open(output, SPECS, fingerprint or {"model": "m"}, {"model": "m", "layers": ["layer"]},
                              ["cats", "dogs"], batch_size=4, **options)


def rows(count, start=0):
    return np.arange(start * 6, (start + count) * 6, dtype=np.float32).reshape(count, 2, 3)


@pytest.mark.parametrize("shape, dtype, batch, expected", [
    ((512,), "float32", 64, (64, 512)),  # one batch of 2 KiB rows: 128 KiB
    ((1000,), "float16", 4, (36, 1000)),  # tiny batches: 9 whole batches make 64 KiB
    ((64, 56, 56), "float32", 64, (4, 64, 56, 56)),  # 4 MiB maximum: 5 rows fit, 4 divide the batch
    ((64, 56, 56), "float32", 63, (3, 64, 56, 56)),  # 3 divides 63
    ((64, 224, 224), "float32", 8, (1, 16, 224, 224)),  # a 12.8 MB row is split along channels
])
def test_chunk_shapes(shape, dtype, batch, expected):
    chunks = chunk_shape(DatasetSpec(shape, dtype), batch)
    assert chunks == expected
    assert np.prod(chunks) * np.dtype(dtype).itemsize <= 4 * 1024 * 1024
    assert chunks[0] % batch == 0 or batch % chunks[0] == 0  # chunk boundaries fall on batch boundaries


def test_layout_commit_and_finish(tmp_path):
    output = tmp_path / "out.h5"
    writer = open_writer(output)
    writer.append({"layer": rows(3)}, ["cats/a.jpg", "cats/b.jpg", "dogs/ü.jpg"], [0, 0, 1], [], images_done=3)
    writer.append({"layer": rows(0)}, [], [], [Skip("dogs/bad.jpg", "truncated")], images_done=4)
    assert (writer.committed_rows, writer.committed_images, writer.committed_skipped) == (3, 4, 1)
    assert partial_path(output).exists() and not output.exists()
    assert writer.finish() == output
    assert not partial_path(output).exists() and not (tmp_path / "out.h5.lock").exists()
    with h5py.File(output, "r") as h5file:
        np.testing.assert_array_equal(h5file["features/layer"][:], rows(3))
        assert list(h5file["paths"].asstr()[:]) == ["cats/a.jpg", "cats/b.jpg", "dogs/ü.jpg"]
        assert list(h5file["labels"][:]) == [0, 0, 1]
        assert list(h5file["labels"].attrs["classes"]) == ["cats", "dogs"]
        assert list(h5file["skipped/reasons"].asstr()[:]) == ["truncated"]
        assert h5file.attrs["complete"] and list(h5file.attrs["committed"]) == [3, 4, 1]
        assert list(h5file.attrs["layers"]) == ["layer"]


def test_reopen_discards_rows_beyond_the_commit(tmp_path):
    output = tmp_path / "out.h5"
    writer = open_writer(output)
    writer.append({"layer": rows(4)}, list("abcd"), [0] * 4, [], images_done=4)
    writer.close()
    with h5py.File(partial_path(output), "r+") as h5file:  # what a kill mid-batch can leave behind
        for name, values in (("features/layer", rows(2, 4)), ("paths", np.array(["e", "f"], dtype=object))):
            h5file[name].resize(6, axis=0)
            h5file[name][4:6] = values
    writer = open_writer(output)
    assert writer.committed_rows == 4 and writer.committed_images == 4
    writer.append({"layer": rows(1, 9)}, ["g"], [1], [], images_done=5)
    writer.finish()
    with h5py.File(output, "r") as h5file:
        assert list(h5file["paths"].asstr()[:]) == list("abcdg")
        np.testing.assert_array_equal(h5file["features/layer"][:], np.concatenate([rows(4), rows(1, 9)]))


def test_reopen_with_another_fingerprint_is_refused_once_it_holds_work(tmp_path):
    output = tmp_path / "out.h5"
    open_writer(output, {"model": "resnet18", "seed": 0}).close()  # a run that failed before its first batch
    empty = open_writer(output, {"model": "resnet18", "seed": 1})  # nothing to keep: started anew, not blocking
    assert empty.committed_images == 0
    empty.append({"layer": rows(2)}, ["a", "b"], [0, 1], [], images_done=2)
    empty.close()
    with pytest.raises(ResumeMismatch, match=r"seed: 1 when started, 2 now"):
        open_writer(output, {"model": "resnet18", "seed": 2})
    assert open_writer(output, {"model": "resnet18", "seed": 1}).committed_rows == 2  # still resumable
    open_writer(output, {"model": "resnet18", "seed": 2}, overwrite=True).close()


def test_existing_output_is_refused(tmp_path):
    output = tmp_path / "out.h5"
    output.write_bytes(b"x")
    with pytest.raises(OutputExists):
        open_writer(output)


def test_stale_string_references_left_by_a_kill_are_cleared(tmp_path):
    """A kill can leave path rows past the stored extent that point into a heap block never written: the next
    run writes over them, and HDF5 would try to free what they point to."""
    output = tmp_path / "out.h5"
    writer = open_writer(output, {"model": "m", "image_count": 100})
    writer.append({"layer": rows(4)}, list("abcd"), [0] * 4, [], images_done=4)
    writer.close()
    with h5py.File(partial_path(output), "r+") as h5file:  # forge it: garbage references past row 4
        paths = h5file["paths"]
        _, raw = paths.id.read_direct_chunk((0,))
        width = len(raw) // paths.chunks[0]
        garbage = (b"\x05\x00\x00\x00" + (123456789).to_bytes(8, "little") + b"\x07\x00\x00\x00") * 4
        paths.id.write_direct_chunk((0,), raw[:4 * width] + garbage + raw[8 * width:])
    writer = open_writer(output, {"model": "m", "image_count": 100})
    writer.append({"layer": rows(2, 4)}, ["x", "y"], [1, 1], [], images_done=6)
    writer.finish()
    with h5py.File(output, "r") as h5file:
        assert list(h5file["paths"].asstr()[:]) == list("abcdxy")


def test_chunks_a_kill_left_past_the_recorded_end_of_the_file_are_taken_in(tmp_path):
    """A kill after HDF5 flushed a chunk index but before it wrote the superblock: the index holds chunks past
    the end of allocation the superblock records. Resuming freed them ("addr overflow") and gave their addresses
    to new chunks, so rows written after the resume read back as zeros."""
    output = tmp_path / "out.h5"
    specs = {"f": DatasetSpec((64, 28, 28), "float32")}  # 800 KB rows: a chunk of 4 rows is 3.2 MB

    def append(writer, start):
        writer.append({"f": np.full((4, 64, 28, 28), start, np.float32)}, [f"a/{row}.jpg" for row in
                      range(start, start + 4)], [0] * 4, [], start + 4)

    writer = FeatureWriter.open(output, specs, {"image_count": 100}, {}, [], batch_size=4)
    append(writer, 0)
    append(writer, 4)
    writer.close()
    partial = partial_path(output)
    superblock = partial.read_bytes()[:48]
    assert superblock[8] == 0  # version 0: the end of allocation is bytes 40-48, no checksum
    with h5py.File(partial, "r+") as h5file:  # a killed run's rows past the commit, its chunk index flushed
        h5file["features/f"].resize(16, axis=0)
        h5file["features/f"][8:16] = 99.0
    forged = bytearray(partial.read_bytes())
    forged[40:48] = superblock[40:48]  # ... its superblock not: the recorded end as at the last commit
    partial.write_bytes(bytes(forged))
    writer = FeatureWriter.open(output, specs, {"image_count": 100}, {}, [], batch_size=4)
    append(writer, 8)
    writer.finish()
    with h5py.File(output, "r") as h5file:
        np.testing.assert_array_equal(h5file["features/f"][:, 0, 0, 0], np.repeat([0.0, 4.0, 8.0], 4))


KILLED_WHILE_CREATING = """
import os, signal, sys
from featdump.output import writer
from featdump.output.specs import DatasetSpec
writer.fingerprints.store = lambda *_: os.kill(os.getpid(), signal.SIGKILL)  # dies with the layout half made
writer.FeatureWriter.open(sys.argv[1], {"layer": DatasetSpec((2, 3), "float32")}, {"model": "m"}, {}, [], 4)
"""


@pytest.mark.slow  # a real process killed: kept to CI's full run, where a Ray test met the file it leaves
def test_a_kill_while_the_partial_file_is_created_does_not_block_the_next_run(tmp_path):
    """Killed between HDF5's first bytes and the finished layout: no OUT.partial HDF5 cannot open is left behind
    (the run that met one had to be told to --overwrite); the same command then starts and finishes."""
    output = tmp_path / "out.h5"
    killed = subprocess.run([sys.executable, "-c", KILLED_WHILE_CREATING, str(output)], env=featdump_env(),
                            capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    assert not partial_path(output).exists()
    writer = open_writer(output)
    writer.append({"layer": rows(2)}, ["a", "b"], [0, 1], [], images_done=2)
    writer.finish()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.h5"]
    with h5py.File(output, "r") as h5file:
        np.testing.assert_array_equal(h5file["features/layer"][:], rows(2))


KILLED_APPENDER = """
import sys, numpy as np
from featdump.output.specs import DatasetSpec
from featdump.output.skipped import Skip
from featdump.output.writer import FeatureWriter
writer = FeatureWriter.open(sys.argv[1], {"f": DatasetSpec((64, 28, 28), "float32")}, {"image_count": 10**6},
                            {}, [], batch_size=4)
done = writer.committed_images
print("appending", flush=True)
while True:
    paths = [f"folder/image_{i:07d}.jpg" for i in range(done, done + 4)]
    skipped = [Skip(paths[0] + ".bad", "truncated")] if done % 12 == 0 else []
    writer.append({"f": np.full((4, 64, 28, 28), done, np.float32)}, paths, [0] * 4, skipped, done + 4)
    done += 4
"""


@pytest.mark.slow  # kills of the HDF5 writer mid-append: 5, or FEATDUMP_FAULT_TRIALS for a soak
def test_sigkill_during_appends_never_breaks_the_next_run(tmp_path):
    output = tmp_path / "out.h5"
    rng = random.Random(7)
    for _ in range(int(os.environ.get("FEATDUMP_FAULT_TRIALS", "5"))):
        process = subprocess.Popen([sys.executable, "-c", KILLED_APPENDER, str(output)], env=featdump_env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert process.stdout.readline() == "appending\n"  # killed while appending, however slow the start
        time.sleep(rng.uniform(0.05, 0.6))
        process.kill()
        process.wait()
        assert "Error" not in process.stderr.read()  # every restart wrote on from its commit
    with h5py.File(partial_path(output), "r") as h5file:
        rows_done = int(h5file.attrs["committed"][0])
        assert rows_done > 0
        assert list(h5file["paths"].asstr()[:rows_done]) == [f"folder/image_{i:07d}.jpg" for i in range(rows_done)]
        assert h5file["features/f"][rows_done - 1, 0, 0, 0] == rows_done - 4
