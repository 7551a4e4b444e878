"""torchvision's semantic segmentation models (deeplabv3 x3, fcn x2, lraspp): their weights' transforms (the shorter
side resized to 520, normalised), then a centre crop to a 520 square, so that every image gives one shape (the
classification convention; `--transform` overrides it). The model's output is a dict: its parts are layers, `@out`
(and `@aux` where the model has an auxiliary classifier)."""

from __future__ import annotations

import logging

from torchvision.transforms._presets import ImageClassification

log = logging.getLogger("featdump")


def square_transform(name: str, transforms) -> ImageClassification:
    """TRANSFORMS (SemanticSegmentation: resize of the shorter side, normalisation) with a centre crop to a square
    of the resize's size: an ImageClassification of those values, split as a classifier's."""
    size = transforms.resize_size[0]
    log.info("%s: each image resized (its shorter side to %d) and centre-cropped to %dx%d, then normalised: its "
             "weights' transforms with a square crop, so that every image gives one shape (--transform overrides).",
             name, size, size, size)
    return ImageClassification(crop_size=size, resize_size=size, mean=transforms.mean, std=transforms.std,
                               interpolation=transforms.interpolation, antialias=transforms.antialias)
