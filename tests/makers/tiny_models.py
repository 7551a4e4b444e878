"""The small models of the compile tests and the precision benchmarks (a CNN with in-place ops and a reused module,
a tiny ViT), as the text of a factory module: each writes it where featdump imports it from. Two convolutions over
32x32 images, where featdump's own costs are the point, are `featdump.testing.models`' (the readers' kit's)."""

MODELS = '''
import os

import torch
from torch import nn
from torchvision.models import VisionTransformer


class Reused(nn.Module):
    """A small CNN: in-place ReLUs (one rewrites the BatchNorm's output), one ReLU module called twice, and an
    in-place residual addition that rewrites conv2's output."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=4)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        x = self.relu(self.bn(self.conv1(x)))
        y = self.conv2(x)
        y += x
        return self.pool(self.relu(y)).flatten(1)


def cnn():
    torch.manual_seed(0)
    model = Reused()
    model.bn.eps = float(os.environ.get("TINY_BN_EPS", "1e-5"))  # a factory whose code changes between runs
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


def vit():
    torch.manual_seed(0)
    return VisionTransformer(image_size=224, patch_size=32, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128)


def refuses_compilation(x):
    if torch.compiler.is_compiling():
        raise RuntimeError("this op has no compiled form")
    return x * 2


torch.fx.wrap("refuses_compilation")


class Uncompilable(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=8)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(refuses_compilation(self.conv(x)))


class Untraceable(Uncompilable):
    def forward(self, x):
        x = self.conv(x)
        return self.pool(x if x.sum() > 0 else -x)  # data-dependent: torch.fx cannot trace it


def uncompilable():
    torch.manual_seed(0)
    return Uncompilable()


def untraceable():
    torch.manual_seed(0)
    return Untraceable()
'''
