"""The small model the conformance kit extracts with: a convolution, a ReLU and a pooling over 32 x 32 images, its
weights seeded (nothing downloaded), so that a reader's rows are read and compared, not a network's cost paid.

    featdump extract --model featdump.testing.models:small --transform featdump.testing.models:small_transform ...
"""

from __future__ import annotations


def small():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())


def small_transform():
    from torchvision.transforms import Compose, Resize, ToTensor

    return Compose([Resize((32, 32)), ToTensor()])
