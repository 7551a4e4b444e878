"""The same rows, in the same order, with the same values, whatever the batch size and worker count."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from featdump.job.runner import extract

from .helpers import settings_for, write_images


@pytest.mark.slow  # 8 s or more of the quick suite on a 2-core Zen 3 (AVX2): kept to CI's full run
def test_batch_size_and_workers_do_not_change_rows(tmp_path):
    images = tmp_path / "images"
    expected_paths = write_images(images, {"x": 6, "y": 5})
    results = []
    for batch_size, workers in [(1, 0), (3, 2), (64, 1)]:
        output = tmp_path / f"b{batch_size}w{workers}.h5"
        extract(settings_for(images, output, layers=("layer2.0.bn1", "avgpool"), batch_size=batch_size,
                             num_workers=workers))
        with h5py.File(output, "r") as h5file:
            results.append((list(h5file["paths"].asstr()[:]), h5file["labels"][:],
                            h5file["features/layer2.0.bn1"][:], h5file["features/avgpool"][:]))
    for paths, labels, bn, pooled in results:
        assert paths == expected_paths
        np.testing.assert_array_equal(labels, results[0][1])
        np.testing.assert_allclose(bn, results[0][2], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(pooled, results[0][3], rtol=1e-4, atol=1e-4)
