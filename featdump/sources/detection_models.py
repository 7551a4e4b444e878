"""torchvision's object detection models (Faster, Mask and Keypoint R-CNN, RetinaNet, FCOS, SSD, SSDlite): each image
resized to a square of the model's own size (its `min_size`; SSD's fixed size) by PIL (bilinear, antialiased)
before the model's transform, which then only normalises: the square needs no resize and no padding (its side is
a multiple of 32, or SSD's own size), so a row's values do not depend on the other images of its batch.

Rows come from the backbone: its maps by key (`backbone@0`, `backbone@pool`: the FPN's levels) and any module
inside it. The detections (lists of boxes per image), the proposals and the ROI heads' per-proposal tensors are not
rows of an image: they are refused in one line that names the backbone's layers instead, and `list-layers` marks
them. The forward stops after the last layer asked, so a backbone layer runs neither the RPN nor the heads.
"""

from __future__ import annotations

import logging

from torch import nn
from torchvision.transforms._presets import ImageClassification

log = logging.getLogger("featdump")

ROWS_WITHIN = ("backbone",)  # the modules whose outputs (and their modules') are rows of an image


class SquareResize(ImageClassification):
    """An image resized to SIZE x SIZE (PIL, bilinear, antialiased) as floats in [0, 1] (the model normalises):
    split as a classifier's transforms are (uint8 pixels in the loader workers, the scaling on the device)."""

    def __init__(self, size: int):
        super().__init__(crop_size=size, resize_size=size, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
        self.resize_size = [size, size]  # both sides: a square, whatever the image's aspect

    def __repr__(self) -> str:
        return f"SquareResize({self.crop_size[0]}x{self.crop_size[0]}, bilinear, antialiased, to [0, 1])"


def square_size(module: nn.Module) -> int:
    """The side of the square MODULE's transform keeps as it is: SSD's fixed size, else its min_size."""
    transform = module.transform
    fixed = getattr(transform, "fixed_size", None)
    return int(fixed[0]) if fixed else int(transform.min_size[-1])


def square_transform(name: str, module: nn.Module) -> SquareResize:
    size = square_size(module)
    log.info("%s: each image resized to %dx%d (bilinear, antialiased) before the model's own transform, which then "
             "normalises without resizing or padding: a row does not depend on its batch (--transform overrides).",
             name, size, size)
    return SquareResize(size)
