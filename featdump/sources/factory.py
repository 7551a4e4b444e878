"""package.module:callable — your own model (and --transform) built by a function you name."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from typing import TYPE_CHECKING

from featdump.errors import UsageProblem
from featdump.sources import timm_models
from featdump.sources.registry import Built, ModelClip, ModelRequest, Source

if TYPE_CHECKING:  # torch is imported when a model is built, not for the help that lists this source
    from torch import nn

log = logging.getLogger("featdump")


def import_object(spec: str, what: str):
    """The object SPEC ('package.module:name', from the current folder or the Python path) names."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageProblem(f"Bad {what} {spec!r}: use package.module:callable.")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageProblem(f"Cannot import {module_name!r} for {what} {spec!r}: {error}. Run featdump from the "
                           "folder that holds it, or put it on PYTHONPATH.") from error
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UsageProblem(f"{module_name!r} has no {attribute!r} (for {what} {spec!r}).")
        target = getattr(target, part)
    return target


def build(spec: str, seed: int) -> tuple[nn.Module, dict]:
    """The nn.Module the factory SPEC returns (called with no arguments after torch.manual_seed(SEED))."""
    factory = import_object(spec, "--model")
    if not callable(factory):
        raise UsageProblem(f"--model {spec!r} is not callable: name a function or class returning an nn.Module.")
    import torch

    torch.manual_seed(seed)
    module = factory()
    if not isinstance(module, torch.nn.Module):
        raise UsageProblem(f"--model {spec!r} returned a {type(module).__name__}, not a torch.nn.Module.")
    return module, {"source": "factory", "factory": spec, "factory_file": _source_file(factory)}


def declared_clip(spec: str) -> tuple[int, float | None] | None:
    """The clip the factory SPEC declares it takes, as its attribute `featdump_clip = (frames, fps)` (fps None: each
    video's own rate), or None: an image model."""
    declared = getattr(import_object(spec, "--model"), "featdump_clip", None)
    if declared is None:
        return None
    try:
        frames, fps = declared
        frames, fps = int(frames), (float(fps) if fps is not None else None)
    except (TypeError, ValueError) as error:
        raise UsageProblem(f"--model {spec!r} declares featdump_clip = {declared!r}: give (frames, frames a second), "
                           "e.g. (16, 15.0), or (16, None) for each video's own rate.") from error
    if frames < 1 or (fps is not None and not fps > 0):
        raise UsageProblem(f"--model {spec!r} declares featdump_clip = {declared!r}: frames must be 1 or more and the "
                           "rate positive.")
    return frames, fps


def default_clip_transform(spec: str):
    """The preprocessing of a factory that declares clips, when no --transform names one: torchvision's Kinetics
    clip transform (VideoClassification: resize 128x171, crop 112, Kinetics mean and std); None for an image
    model (whose default is the ImageNet one)."""
    if declared_clip(spec) is None:
        return None
    from torchvision.transforms._presets import VideoClassification

    log.info("No --transform for %s: using torchvision's Kinetics clip transform (resize 128x171, crop 112).", spec)
    return VideoClassification(crop_size=(112, 112), resize_size=(128, 171))


def transform(spec: str):
    """The preprocessing --transform SPEC names: a transform object as it is, or a function/class called with
    no arguments to make one."""
    target = import_object(spec, "--transform")
    if inspect.isfunction(target) or inspect.isclass(target):
        target = target()
    if not callable(target):
        raise UsageProblem(f"--transform {spec!r} gives a {type(target).__name__}, which cannot transform an image.")
    return target


def _source_file(obj) -> str:
    try:
        return inspect.getsourcefile(obj) or "?"
    except TypeError:
        return "?"


class FactorySource(Source):
    """package.module:callable: your factory returning an nn.Module (its clip as it declares it)."""

    name = "factory"
    order = 2
    kind = 'package.module:callable, your factory returning an nn.Module (from the current folder or PYTHONPATH)'
    example = '-m mynets:build --transform mynets:preprocess -l block3'

    def claims(self, spec: str) -> bool:
        return ":" in spec

    def check(self, spec: str) -> None:
        import_object(spec, "--model")

    def clip(self, spec: str) -> ModelClip | None:
        declared = declared_clip(spec)
        return ModelClip(*declared, takes_clips=True) if declared else None

    def build(self, request: ModelRequest) -> Built:
        spec = request.spec
        module, source = build(spec, request.seed)
        label = "none" if request.random else "as the factory builds it"
        preprocessing = default_clip_transform(spec) if not request.transform else None
        return Built(module, label, source, preprocessing, timm_models.token_rule(module))  # as timm's, if stated
