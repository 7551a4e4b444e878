"""Direct reads (`featdump.output.direct`): a span of rows read from the file's bytes equals h5py's read of it, in
featdump's own chunked outputs, contiguous datasets and merged views; every layout whose bytes are not the rows
(compressed or split chunks, another byte order, a file open for writing) is left to h5py."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from featdump.output.direct import read_direct
from featdump.output.views import read_span
from tests.makers.outputs import write_output


def test_a_featdump_output_read_directly_equals_h5py_across_chunks_and_the_last_one(tmp_path):
    values = np.random.default_rng(0).standard_normal((301, 3, 5, 7), dtype=np.float32)
    write_output(tmp_path / "out.h5", {"maps": values}, batch=64)
    with h5py.File(tmp_path / "out.h5", "r") as h5file:
        dataset = h5file["features"]["maps"]
        assert dataset.chunks is not None and dataset.chunks[0] < 301  # spans below cross chunks
        for start, stop in [(0, 301), (5, 6), (0, dataset.chunks[0] + 1), (dataset.chunks[0] - 2, 290), (300, 301)]:
            np.testing.assert_array_equal(read_direct(dataset, start, stop), values[start:stop])
        buffer = np.full((40, 3, 5, 7), np.nan, dtype=np.float32)
        assert read_span(dataset, 100, 140, out=buffer) is buffer
        np.testing.assert_array_equal(buffer, values[100:140])


def test_a_contiguous_dataset_is_read_directly(tmp_path):
    values = np.arange(600, dtype=np.float64).reshape(50, 12)
    with h5py.File(tmp_path / "plain.h5", "w") as h5file:
        h5file["values"] = values
    with h5py.File(tmp_path / "plain.h5", "r") as h5file:
        np.testing.assert_array_equal(read_direct(h5file["values"], 7, 41), values[7:41])


@pytest.mark.parametrize("layout", ["gzip", "shuffled", "split rows", "big-endian", "open for writing", "unwritten"])
def test_layouts_whose_bytes_are_not_the_rows_are_left_to_h5py(tmp_path, layout):
    values = np.random.default_rng(1).standard_normal((64, 16)).astype(np.float32)
    options = {"gzip": dict(chunks=(8, 16), compression="gzip"), "shuffled": dict(chunks=(8, 16), shuffle=True),
               "split rows": dict(chunks=(8, 4)), "big-endian": dict(chunks=(8, 16), dtype=">f4"),
               "open for writing": dict(chunks=(8, 16)), "unwritten": dict(chunks=(8, 16))}[layout]
    with h5py.File(tmp_path / "odd.h5", "w") as h5file:
        if layout == "unwritten":
            dataset = h5file.create_dataset("values", shape=(64, 16), dtype="f4", **options)
            dataset[:8] = values[:8]  # the chunks after the first never written
        else:
            h5file.create_dataset("values", data=values, **options)
    with h5py.File(tmp_path / "odd.h5", "r+" if layout == "open for writing" else "r") as h5file:
        dataset = h5file["values"]
        assert read_direct(dataset, 0, 64) is None
        expected = values if layout != "unwritten" else np.concatenate([values[:8], np.zeros((56, 16), "f4")])
        np.testing.assert_array_equal(read_span(dataset, 0, 64), expected)
        buffer = np.empty((10, 16), dtype=dataset.dtype)
        np.testing.assert_array_equal(read_span(dataset, 3, 13, out=buffer), expected[3:13])


def test_a_merged_view_reads_each_shard_directly(tmp_path):
    values = np.random.default_rng(2).standard_normal((90, 6), dtype=np.float32)
    layout = h5py.VirtualLayout(shape=(90, 6), dtype="f4")
    for index, (start, stop) in enumerate([(0, 40), (40, 90)]):
        write_output(tmp_path / f"shard{index}.h5", {"pooled": values[start:stop]}, batch=16)
        layout[start:stop] = h5py.VirtualSource(f"shard{index}.h5", "features/pooled", shape=(stop - start, 6))
    with h5py.File(tmp_path / "view.h5", "w") as h5file:
        h5file.create_virtual_dataset("pooled", layout)
    with h5py.File(tmp_path / "view.h5", "r") as h5file:
        dataset = h5file["pooled"]
        assert dataset.is_virtual and read_direct(dataset, 0, 90) is None
        np.testing.assert_array_equal(read_span(dataset, 30, 70), values[30:70])
        np.testing.assert_array_equal(read_span(dataset, 30, 70, out=np.empty((40, 6), "f4")), values[30:70])
