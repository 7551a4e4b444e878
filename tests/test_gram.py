"""Gram: a layer's Gram statistics accumulated out of core, slab by slab, equal numpy's on the whole matrix."""

from __future__ import annotations

import dataclasses
import math

import h5py
import numpy as np
import pytest
import torch

from featdump.analysis.gram import gram, slab_width, slabs


@pytest.mark.parametrize("shape,budget", [((3, 4, 5), 7), ((3, 4, 5), 20), ((6,), 4), ((2, 3), 1000)])
def test_the_slabs_cover_a_row_once_in_c_order(shape, budget):
    cut = slabs(shape, budget)
    assert all(slab_width(shape, slab) <= max(budget, 1) for slab in cut)
    covered = np.concatenate([np.arange(math.prod(shape)).reshape(shape)[slab].ravel() for slab in cut])
    assert covered.tolist() == list(range(math.prod(shape)))


@pytest.mark.parametrize("exact", [False, True])
def test_the_statistics_read_in_many_slabs_equal_the_whole_matrix_s(tmp_path, exact):
    values = np.random.default_rng(0).normal(3.0, 2.0, (9, 4, 5, 6)).astype(np.float32)
    with h5py.File(tmp_path / "layer.h5", "w") as h5file:
        h5file["layer"] = values
    with h5py.File(tmp_path / "layer.h5", "r") as h5file:
        memory = 9 * 4 * 30 * 2 + (9 * 256 * 8 if exact else 0)  # two slabs of 30 of the 120 features
        found = gram(h5file["layer"], 9, memory, torch.device("cpu"), exact=exact)
    rows = values.reshape(9, -1).astype(np.float64)
    centred = rows - rows.mean(0)
    np.testing.assert_allclose(found.centred.numpy(), centred @ centred.T, rtol=1e-5, atol=1e-4)
    spare = dataclasses.replace(found, centred=found.centred.clone())  # each made in place of `centred`: spent
    made = found.uncentred()
    assert made.data_ptr() == found.centred.data_ptr()  # made in place of `centred`: the statistics are spent
    np.testing.assert_allclose(made.numpy(), rows @ rows.T, rtol=1e-6)
    in_row = rows - rows.mean(1, keepdims=True)
    np.testing.assert_allclose(spare.row_centred().numpy(), in_row @ in_row.T, rtol=1e-5, atol=1e-4)
    assert found.features == 120 and not found.nonfinite.any() and not found.constant.any()


def test_rows_that_are_constant_zero_or_not_finite_are_named(tmp_path):
    values = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    values[1], values[2], values[3, 4] = 7.0, 0.0, np.nan
    with h5py.File(tmp_path / "layer.h5", "w") as h5file:
        h5file["layer"] = values
    with h5py.File(tmp_path / "layer.h5", "r") as h5file:
        found = gram(h5file["layer"], np.array([0, 1, 2, 3]), 1 << 20, torch.device("cpu"))
    assert found.rows == 4
    assert found.constant.tolist() == [False, True, True, False] and found.zero.tolist() == [False, False, True, False]
    assert found.nonfinite.tolist() == [False, False, False, True]
