"""The commands' summary lines and the word more a usage error gets, alone."""

from __future__ import annotations

import time

import numpy as np

from featdump.faces import sayings


def test_a_layer_taken_for_images_gets_a_word_more(tmp_path):
    assert sayings.spaced_layers(["-l", "layer1", "layer2", "images", "out.h5"]) == \
        " Layers are comma-separated: -l layer1,layer2."
    (tmp_path / "layer2").mkdir()
    assert sayings.spaced_layers(["-l", "layer1", str(tmp_path / "layer2"), "out.h5"]) == ""


def test_the_rdm_line_counts_layers_and_rows_and_says_when_it_was_done_before(tmp_path):
    line = sayings.rdms_line("correlation", {"a": np.zeros((5, 5))}, tmp_path / "r.h5", None, time.perf_counter(),
                             True)
    assert line.startswith("Nothing to do: already wrote the correlation RDMs of 1 layer over 5 images to ")
    assert sayings.done_or_wrote(False) == "Wrote"
