"""The run identity (`featdump.job.identity`): the fingerprint's fields, the compiled and graph keys and the
provenance's layers all come from one record of what the model resolved the settings to."""

from __future__ import annotations

import dataclasses

import torch

from featdump.job import dependencies
from featdump.job.identity import RunIdentity
from featdump.job.model import prepare_model
from featdump.job.plan import make_plan

from .helpers import settings_for, write_images


def test_every_key_comes_from_the_resolved_identity(tmp_path):
    write_images(tmp_path / "images", {"": 2})
    settings = settings_for(tmp_path / "images", tmp_path / "out.h5", layers=("layer4.*",), weights="none")
    plan = make_plan(settings)
    model = prepare_model(plan.settings, torch.device("cpu"), plan.images)
    identity = RunIdentity.of(plan.settings, model)
    expanded = [layer.name for layer in model.layers]
    assert list(identity.layers) == expanded and len(expanded) > 1  # the pattern as the model resolved it
    assert identity.fingerprinted() == dependencies.fingerprinted(plan.settings, layers=expanded,
                                                                  reduce=model.chosen, decode="cpu")
    assert identity.compiled()["layers"] == expanded and identity.compiled()["fits"] == {}
    assert identity.described()["layers"] == expanded
    moved = dataclasses.replace(identity, device="cuda:0")
    assert moved.graph() != identity.graph() and moved.compiled() != identity.compiled()
    assert moved.fingerprinted() == identity.fingerprinted()  # where a run computes is not what its rows are
