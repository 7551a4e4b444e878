"""torchvision's optical flow models (raft_small, raft_large) on pairs of frames: each row of a video is a clip of 2
frames (`--clip 2`, the model's own), and the model's output (`-l @`) is RAFT's last flow estimate for the pair,
(2, H, W): the x and y motion, in pixels, from the first frame to the second. Its modules keep their paths
(feature_encoder, context_encoder, update_block, ...)."""

from __future__ import annotations

import torch
import torchvision
from torch import nn
from torchvision.models import list_models

from featdump.errors import UsageProblem

PAIR = 2  # frames a row of a flow model holds
_MULTIPLE = 8  # RAFT's feature maps are 1/8 of the frame: its height and width must be multiples of 8


def flow_model_names() -> list[str]:
    return list_models(module=torchvision.models.optical_flow)


def is_flow_model(name: str) -> bool:
    return name in flow_model_names()


class FlowPairs(nn.Module):
    """A RAFT model taking a batch of frame pairs (N, 2, C, H, W) as one input, its output the last flow estimate
    (N, 2, H, W). RAFT's modules are this module's children (the same objects), so their paths are RAFT's own."""

    def __init__(self, raft: nn.Module):
        super().__init__()
        for name, child in raft.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "_raft", raft)  # not a child: its modules are already this one's

    def train(self, mode: bool = True) -> FlowPairs:
        self._raft.train(mode)
        return super().train(mode)

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        return self._raft(pairs[:, 0], pairs[:, 1])[-1]


class FlowTransform:
    """A flow model's preprocessing of a clip: its 2 frames ((2, C, H, W) uint8) centre-cropped to multiples of 8
    (RAFT's requirement; at most 7 pixels of each side), then the weights' transforms (OpticalFlow: to [-1, 1])."""

    takes_clips = True

    def __init__(self, transforms, name: str):
        self.transforms, self.name = transforms, name

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        if frames.shape[0] != PAIR:
            raise UsageProblem(f"{self.name} estimates the flow between a pair of frames: give --clip 2, not "
                               f"--clip {frames.shape[0]}.")
        height, width = (size - size % _MULTIPLE for size in frames.shape[-2:])
        frames = torchvision.transforms.functional.center_crop(frames, [height, width])
        first, second = self.transforms(frames[0], frames[1])
        return torch.stack([first, second])

    def __repr__(self) -> str:
        return f"FlowTransform({self.transforms!r}, crop to multiples of {_MULTIPLE})"
