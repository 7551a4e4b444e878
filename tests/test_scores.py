"""A read-out layer's one number and a probe's chance, alone."""

from __future__ import annotations

import numpy as np

from featdump.readout.scores import chance, layer_score


def test_a_probe_scores_its_mean_accuracy_and_an_encoding_its_median_r():
    assert layer_score("probe", np.array([0.5, 0.7]), None) == 0.6
    assert layer_score("encode", None, np.array([0.1, np.nan, 0.3, 0.2])) == 0.2
    assert np.isnan(layer_score("encode", None, np.array([np.nan])))


def test_chance_is_the_majority_share_and_the_uniform_guess():
    assert chance(np.array([0, 0, 0, 1, -1])) == (0.75, 0.5)
