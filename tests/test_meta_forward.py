"""The dry forward on the meta device: a normalisation answers with its input's shape and the strides computing it
gives; one whose weights do not fit its input is left to PyTorch, which refuses it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from featdump.errors import ModelFailed
from featdump.forward import probe as probe_module
from featdump.forward.meta import forward_on_meta
from featdump.forward.probe import probe

NORMS = {
    "batch": lambda: nn.BatchNorm2d(6),
    "batch, no running statistics": lambda: nn.BatchNorm2d(6, track_running_stats=False),
    "instance": lambda: nn.InstanceNorm2d(6, affine=True),
    "group": lambda: nn.GroupNorm(3, 6),
    "layer over the last two": lambda: nn.LayerNorm((5, 7)),
    "layer without weights": lambda: nn.LayerNorm(7, elementwise_affine=False),
}


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("norm", NORMS)
def test_a_norm_on_the_meta_device_has_the_shape_and_strides_of_the_computed_one(norm, layout):
    module = NORMS[norm]().eval()
    computed = module(torch.rand(2, 6, 5, 7).to(memory_format=layout))
    answered = {}
    module.register_forward_hook(lambda _, args, output: answered.setdefault("output", output))
    forward_on_meta(module if layout is torch.contiguous_format else _ChannelsLast(module), (2, 6, 5, 7))
    assert answered["output"].is_meta
    assert answered["output"].shape == computed.shape and answered["output"].stride() == computed.stride()


class _ChannelsLast(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x.contiguous(memory_format=torch.channels_last))


class NormsInARow(nn.Module):
    """Every kind of norm after a convolution, then a view that needs the strides a real forward gives."""

    def __init__(self, norm_channels: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.batch, self.group = nn.BatchNorm2d(norm_channels), nn.GroupNorm(4, 8)
        self.instance, self.layer = nn.InstanceNorm2d(8, affine=True), nn.LayerNorm(16)

    def forward(self, x):
        x = self.layer(self.instance(self.group(self.batch(self.conv(x)))))
        return x.view(x.shape[0], -1)


def test_a_model_of_norms_is_probed_on_the_meta_device_as_for_real():
    model = NormsInARow().eval()
    for batch in (2, 3):
        on_meta = probe_module._recorded(model, (3, 16, 16), batch, (), on_meta=True)
        assert on_meta == probe_module._recorded(model, (3, 16, 16), batch, (), on_meta=False)
        assert on_meta[0]["layer"] == [{None: (batch, 8, 16, 16)}]


def test_a_norm_whose_weights_do_not_fit_is_refused_on_the_meta_device_and_then_for_real():
    model = NormsInARow(norm_channels=5).eval()
    with pytest.raises(RuntimeError):
        forward_on_meta(model, (2, 3, 16, 16))
    with pytest.raises(ModelFailed, match="fails on a batch of 2"):
        probe(model, (3, 16, 16))
