"""The proof's channel statistics, alone: a channel's mean shift against its spread, a channel's scale."""

from __future__ import annotations

import numpy as np

from featdump.job.channels import MIN_ROWS, ChannelMeans, ChannelScales, channel_axis


def test_channel_means_have_no_error_before_enough_rows_then_the_spread_over_the_root_of_their_count():
    means = ChannelMeans()
    rng = np.random.default_rng(0)
    for _ in range(MIN_ROWS - 1):
        means.add(rng.normal(size=(3, 10)))
        assert means.errors() is None
    means.add(rng.normal(size=(3, 10)))
    assert means.means().shape == (3,) and means.errors().shape == (3,) and (means.errors() > 0).all()


def test_a_channel_scaled_by_two_percent_shows_a_deviation_of_two_percent():
    base = np.random.default_rng(1).normal(size=(4, 50))
    got = base.copy()
    got[2] *= 1.02
    scales = ChannelScales()
    scales.add(got, base)
    np.testing.assert_allclose(scales.deviations(), [0, 0, 0.02, 0], atol=1e-12)
    assert scales.apart()[2] > 0 and scales.apart()[0] == 0


def test_the_channel_axis_of_a_vector_is_its_only_one():
    assert channel_axis((512,), {}) == 0
