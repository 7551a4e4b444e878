"""A warm worker (`job.warm`, what a Ray worker runs its shards in): the job's rows, its model, its probe and the
check of its pruned graph are made once for many shards, each shard runs its own copy of the model, and the rows
equal cold shards'. Outside it, every run builds anew (a factory changed between two runs is seen)."""

from __future__ import annotations

import importlib

import numpy as np

from featdump.forward.hooks import Capture
from featdump.job import staging, warm
from featdump.output.merge import merge

from .helpers import read_output, settings_for, user_project

FACTORY = """
import torch

BUILDS = []


def build(weights=None):
    BUILDS.append(1)
    torch.manual_seed(0)
    width = WIDTH
    return torch.nn.Sequential(torch.nn.Conv2d(3, width, 5, stride=4), torch.nn.ReLU(inplace=True),
                               torch.nn.Conv2d(width, 6, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
"""


def run_shards(images, output, count: int) -> None:
    for index in range(count):
        staging.extract(settings_for(images, output, model="warmnet:build", layers=("1", "4"),
                                     shard=f"{index}/{count}"))


def test_a_warm_worker_builds_once_and_its_shards_equal_cold_ones(tmp_path, monkeypatch):
    checks = []
    agrees = Capture._agrees
    monkeypatch.setattr(Capture, "_agrees", lambda capture, pruned: checks.append(1) or agrees(capture, pruned))
    with user_project(tmp_path, "warmnet", FACTORY.replace("WIDTH", "5"), {"a": 5, "b": 4}) as project:
        import warmnet

        run_shards(project / "images", tmp_path / "cold.h5", 3)
        assert len(warmnet.BUILDS) == 3 and len(checks) == 3
        with warm.kept_warm():
            run_shards(project / "images", tmp_path / "warm.h5", 3)
        assert len(warmnet.BUILDS) == 4 and len(checks) == 4  # three more shards, one build, one graph check
        cold, hot = (read_output(merge(tmp_path / name)) for name in ("cold.h5", "warm.h5"))
        assert hot["paths"] == cold["paths"] and len(cold["paths"]) == 9
        for layer in ("1", "4"):  # "1" is an in-place ReLU's: a shard's hooks left on a shared model would show
            np.testing.assert_array_equal(hot[layer], cold[layer])


def test_outside_a_warm_worker_each_run_builds_anew_and_sees_a_changed_factory(tmp_path):
    with user_project(tmp_path, "warmnet", FACTORY.replace("WIDTH", "5"), {"a": 3}) as project:
        import warmnet

        with warm.kept_warm():  # a warm run keeps its model ...
            staging.extract(settings_for(project / "images", tmp_path / "one.h5", model="warmnet:build",
                                         layers=("0",)))
        (project / "warmnet.py").write_text(FACTORY.replace("WIDTH", "7"))  # the user widens the first layer
        importlib.reload(warmnet)
        staging.extract(settings_for(project / "images", tmp_path / "two.h5", model="warmnet:build",
                                     layers=("0",)))
        assert len(warmnet.BUILDS) == 1  # ... which a later run outside it does not use
        assert read_output(tmp_path / "one.h5")["0"].shape[1] == 5
        assert read_output(tmp_path / "two.h5")["0"].shape[1] == 7
