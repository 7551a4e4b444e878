"""resnet18 in miniature, for the tests whose point is not the model (readers, stores, tables, resume, update,
info, analysis of stored rows): the module paths the tests name (conv1, layer1 to layer4, layer3.0.downsample.1,
layer4.1.relu called twice, avgpool, fc) over 32 x 32 inputs, 12 or 24 channels, its weights seeded. An extract
of a few images costs about a quarter of resnet18's at 224 pixels.

Its convolutions are depthwise (each output channel sums one input channel's window): a row is then the same bits
whatever batch it was computed in, as resnet18's at 224 pixels are on the CPUs the tests run on. oneDNN's full
convolutions over small maps sum in an order that follows the batch (a last bit of difference), which would break
the tests that compare a resumed or updated run with a clean one bit for bit.

    featdump extract -m tests.makers.small_resnet:build --transform featdump.testing.models:small_transform ...

With HOLD_AFTER=N in its environment, a run holds still before its batch N + 1, until the file HOLD_RELEASE names
exists (or a minute has passed), so that a test's kill or outage lands mid-run however loaded the machine is; the
same command without it runs normally.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import nn


def _depthwise(inputs: int, outputs: int, size: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inputs, outputs, size, stride, padding=size // 2, groups=inputs, bias=False)


class Block(nn.Module):
    """torchvision's BasicBlock with depthwise convolutions: the same modules, called in the same order."""

    def __init__(self, inputs: int, outputs: int, stride: int = 1):
        super().__init__()
        self.conv1 = _depthwise(inputs, outputs, 3, stride)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _depthwise(outputs, outputs, 3)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.downsample = nn.Sequential(_depthwise(inputs, outputs, 1, stride), nn.BatchNorm2d(outputs)) \
            if stride != 1 or inputs != outputs else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        out += identity
        return self.relu(out)


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = _depthwise(3, 12, 3)
        self.bn1 = nn.BatchNorm2d(12)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = nn.Sequential(Block(12, 12))
        self.layer2 = nn.Sequential(Block(12, 12, 2))
        self.layer3 = nn.Sequential(Block(12, 24, 2))
        self.layer4 = nn.Sequential(Block(24, 24, 2), Block(24, 24))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(24, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


HOLD_AFTER, HOLD_RELEASE = "FEATDUMP_TEST_HOLD_AFTER", "FEATDUMP_TEST_HOLD_RELEASE"


class _HoldAfter:
    """A forward pre-hook of the first convolution that holds the process still once BATCHES batches of images
    have gone through it, until RELEASE exists or for up to SECONDS; the rows before stay committed by the writer's
    thread. Not counted: the probe's forward on the meta device, a trace's proxies, and the random example (values
    below 0, where small_transform's images lie in [0, 1]) on which the runner checks its traced graph."""

    def __init__(self, batches: int, release: Path | None, seconds: float = 60.0):
        self.batches, self.release, self.seconds, self.seen = batches, release, seconds, 0

    def __call__(self, module: nn.Module, inputs: tuple) -> None:
        images = inputs[0]
        if not isinstance(images, torch.Tensor) or images.device.type == "meta" or bool((images < 0).any()):
            return
        self.seen += 1
        deadline = time.monotonic() + self.seconds
        while self.seen > self.batches and time.monotonic() < deadline:
            if self.release is not None and self.release.exists():
                return
            time.sleep(0.01)


def build() -> SmallResNet:
    """The model, its weights drawn from torch's generator as featdump seeds it (--seed, 0 by default)."""
    model = SmallResNet().eval()
    batches = os.environ.get(HOLD_AFTER)
    if batches is not None:
        release = os.environ.get(HOLD_RELEASE)
        model.conv1.register_forward_pre_hook(_HoldAfter(int(batches), Path(release) if release else None))
    return model
