"""Preprocess: a model's preprocessing split in two, pixels in the loader workers, normalisation on the device."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from PIL import Image
from torch import nn
from torchvision.transforms import Resize
from torchvision.transforms import functional as F
from torchvision.transforms._presets import ImageClassification

from featdump.errors import MixedSizes


class Preprocess:
    """The model's preprocessing split in two: pixels() runs in the workers, normalize() on the device.

    For torchvision's ImageClassification transforms, pixels() resizes and crops the PIL image to a
    uint8 (C, H, W) array and normalize() scales and normalises a batch of them, which gives exactly
    what `transforms(pil_image)` gives. Other transforms run whole in the workers.
    """

    def __init__(self, transforms: nn.Module, fast_decode: bool = False):
        self.transforms = transforms
        self.split = isinstance(transforms, ImageClassification)
        if self.split:
            self.size = (transforms.crop_size[0], transforms.crop_size[-1])
            self._shape = (3, *self.size)
        else:  # any other transform: the size it makes of a photo-shaped image
            self._shape = tuple(transforms(Image.new("RGB", (640, 480))).shape)
            self.size = self._shape[-2:]
        self._portrait_size = self.size if self.split else tuple(transforms(Image.new("RGB", (480, 640))).shape[-2:])
        resize = self._resize_target()
        self.draft = (2 * resize, 2 * resize) if fast_decode and resize else None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One input's shape past the batch axis, as the preprocessing makes it: (3, H, W) for an image (a
        processor's patches for SigLIP2: (patches, values))."""
        return self._shape

    def _resize_target(self) -> int | None:
        """The size the preprocessing resizes to (its largest side value), if it starts with a resize."""
        if self.split:
            return max(self.transforms.resize_size) if self.transforms.resize_size else None
        steps = getattr(self.transforms, "transforms", [self.transforms])
        for step in steps:
            if isinstance(step, Resize):
                size = step.size if isinstance(step.size, (list, tuple)) else [step.size]
                return max(size)
        return None

    def geometry(self) -> dict:
        """The resize and centre crop the model's input comes from, when torchvision-style ({} otherwise)."""
        if not self.split:
            return {}
        return {"resize": list(self.transforms.resize_size or []), "crop": list(self.transforms.crop_size)}

    def check_sizes(self, shapes: Mapping[str, tuple[int, ...]], named: str) -> None:
        """MixedSizes when an image (path: its (C, H, W) as preprocessed) does not come out at the model's input
        size: a transform that resizes without a crop makes one size per aspect ratio. NAMED: the preprocessing
        as the user knows it (`--transform mod:fn`)."""
        odd = {path: shape[-2:] for path, shape in shapes.items() if tuple(shape[-2:]) != self.size}
        others = {shape[-2:] for shape in shapes.values()} - {self.size}
        if not odd and len(others) < 2:
            return
        path, (height, width) = next(iter(odd.items()))
        raise MixedSizes(
            f"{named} makes images of different sizes ({path!r} comes out {height}x{width}, a 640x480 image "
            f"{self.size[0]}x{self.size[1]}), and a batch needs one size: {self._size_advice()}."
        )

    def check_one_size(self, named: str) -> None:
        """MixedSizes when the preprocessing makes a portrait photo another size than a landscape one."""
        self.check_sizes({"a 480x640 image": (3, *self._portrait_size)}, named)

    def _size_advice(self) -> str:
        if hasattr(self.transforms, "processor"):  # a Hugging Face image processor
            return ("its image processor resizes without cropping; set do_center_crop to true (with a crop_size) in "
                    "its preprocessor_config.json, or pass a --transform that ends in a crop")
        return "add a crop (e.g. transforms.CenterCrop(224) after the Resize) or resize to a fixed (height, width)"

    def pixels(self, image: Image.Image) -> np.ndarray:
        if not self.split:
            return self.transforms(image).numpy()
        return np.asarray(self.resize_and_crop(image), dtype=np.uint8).transpose(2, 0, 1)

    def resize_and_crop(self, image):
        """Resize and centre-crop a PIL image or a uint8 (C, H, W) tensor (the GPU path's)."""
        t = self.transforms
        image = F.resize(image, t.resize_size, interpolation=t.interpolation, antialias=t.antialias)
        return F.center_crop(image, t.crop_size)

    def normalize(self, batch: torch.Tensor) -> torch.Tensor:
        """uint8 (N, C, H, W) -> normalised float, as convert_image_dtype + normalize compute it, with the
        mean and std kept on the batch's device (no host copies, no read-back per batch)."""
        if not self.split:
            return batch.float()
        mean, std = self._constants(batch.device)
        return (batch.float() / 255.0).sub_(mean).div_(std)

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        cached = self.__dict__.setdefault("_on_device", {})
        if device not in cached:
            mean = torch.tensor(self.transforms.mean, dtype=torch.float32).view(-1, 1, 1)
            std = torch.tensor(self.transforms.std, dtype=torch.float32).view(-1, 1, 1)
            cached[device] = (mean.to(device), std.to(device))
        return cached[device]
