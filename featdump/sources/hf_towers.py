"""A Hugging Face multimodal checkpoint's image side as one module (`vision_tower`): what `hf` builds from CLIP,
SigLIP and their kin. Its own module, as it subclasses torch's: the source imports it when it builds a model."""

from __future__ import annotations

import torch
from torch import nn


def vision_tower(model: nn.Module) -> nn.Module:
    """A multimodal model's (CLIP, SigLIP, ...) image side (`ImageFeatures`); a vision model as it is."""
    if hasattr(model, "vision_model") and (hasattr(model, "text_model") or hasattr(model, "text_config")):
        tower = model.vision_model
        tower.config = getattr(tower, "config", None) or model.config.vision_config
        return ImageFeatures(model, tower) if hasattr(model, "get_image_features") else tower
    return model


class ImageFeatures(nn.Module):
    """A multimodal checkpoint's image side as one module, whose output (`-l @`) is what the model's
    get_image_features gives: the unnormalised image embedding (CLIP's projected pooled output, SigLIP's pooled
    output). The vision tower's modules keep their paths (embeddings, encoder, ...) beside the model's other
    non-text modules (`visual_projection`, Kosmos-2's `image_to_text_projection`); the text side is neither run nor
    moved."""

    def __init__(self, model: nn.Module, tower: nn.Module):
        super().__init__()
        for name, child in tower.named_children():
            self.add_module(name, child)
        for name, parameter in tower.named_parameters(recurse=False):  # shared, so .to() moves the tower's too
            self.register_parameter(name, parameter)
        for name, buffer in tower.named_buffers(recurse=False):
            self.register_buffer(name, buffer)
        for name, child in model.named_children():  # what the image features use beside the tower (CLIP's
            if name != "vision_model" and not name.startswith("text"):  # visual_projection, Kosmos-2's
                self.add_module(name, child)  # image_to_text_projection): hooked, and moved with the tower
        object.__setattr__(self, "_model", model)  # not a child: only its image side is this module's
        self.config = tower.config
        self.main_input_name = "pixel_values"  # what get_image_features takes (OWL-ViT's tower inherits input_ids)

    def train(self, mode: bool = True) -> ImageFeatures:
        self._model.train(mode)
        return super().train(mode)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        features = self._model.get_image_features(pixel_values=pixel_values)
        return features if isinstance(features, torch.Tensor) else features.pooler_output
