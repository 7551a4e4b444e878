"""Provenance: what a new output records of its making (the model, its source, the layers, the versions, the
command, every setting)."""

from __future__ import annotations

import json
import logging
import time

import torch
import torchvision

from featdump.inputs import ImageList
from featdump.job.identity import RunIdentity
from featdump.job.model import Model
from featdump.job.settings import Settings
from featdump.locations import Location
from featdump.version import __version__

log = logging.getLogger("featdump")


def provenance(settings: Settings, model: Model, images: ImageList) -> dict:
    """The attributes a new output records: what made it, from which images, with which versions and command."""
    root = images.root
    return {
        **({"image_listing": json.dumps(images.listing, sort_keys=True)} if images.listing else {}),
        **(images.clips.attributes() if images.clips is not None else {}),
        "model": settings.model,
        "weights": model.loaded.weights,
        "model_source": json.dumps(model.loaded.source, sort_keys=True),
        "seed": settings.seed,
        **RunIdentity.of(settings, model).described(),
        "preprocessing": repr(model.loaded.preprocessing),
        "image_geometry": json.dumps(model.preprocess.geometry()),  # how `show` lays the image under the maps
        "image_root": Location.of(root).absolute,
        "dtype": settings.dtype,
        "precision": settings.precision,
        "fast_decode": settings.fast_decode,
        "featdump_version": __version__,
        "torch_version": str(torch.__version__),
        "torchvision_version": str(torchvision.__version__),
        "command": settings.command,
        "settings": json.dumps(settings.effective(), sort_keys=True),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
