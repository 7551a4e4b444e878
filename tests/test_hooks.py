"""The capture object: copies at hook time, counts calls, stops early, always removes its hooks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from featdump.forward.hooks import Capture
from featdump.forward.layers import resolve
from featdump.forward.probe import probe
from featdump.reductions.methods import bind, snapshot
from featdump.sources.tokens import TokenLayout


def take(reduce: str, shape: tuple[int, ...]):
    """The snapshot of a batch-first layer of per-image SHAPE reduced with REDUCE (float32 out: the storage dtype's
    cast is `output.storage`'s)."""
    return snapshot(0, 1, bind(reduce, "x", shape))


def copies(layers, reduce="none"):
    """Each layer's snapshot, as the runner makes them."""
    return {layer.name: snapshot(layer.batch_dim, layer.fold, bind(reduce, layer.name, layer.shape))
            for layer in layers}


class InPlaceNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)
        self.head = CountingLinear()

    def forward(self, x):
        y = self.linear(x)
        y = self.act(y)
        y += 1.0  # in-place on the ReLU output
        y = self.act(y - 3.0)
        return self.head(y)


class CountingLinear(nn.Linear):
    def __init__(self):
        super().__init__(4, 2)
        self.runs = 0

    def forward(self, x):
        self.runs += 1
        return super().forward(x)


def capture_for(model, selectors, reduce="none", stop_early=True):
    layers = resolve(selectors, probe(model, (4,)), "net")
    return Capture(model, layers, copies(layers, reduce), stop_early=stop_early)


def test_captures_are_copies_untouched_by_later_inplace_ops():
    torch.manual_seed(0)
    model = InPlaceNet().eval()
    x = torch.randn(5, 4)
    with capture_for(model, ["linear", "act:1", "act:2"]) as capture:
        captured = capture.run(x)
    with torch.no_grad():
        linear = model.linear(x)
        first = torch.relu(linear)
        second = torch.relu(first + 1.0 - 3.0)
    assert (linear < 0).any()
    torch.testing.assert_close(captured["linear"], linear)
    torch.testing.assert_close(captured["act:1"], first)
    torch.testing.assert_close(captured["act:2"], second)


def test_forward_stops_after_last_requested_layer():
    model = InPlaceNet().eval()
    stopping, running_on = capture_for(model, ["act:2"]), capture_for(model, ["act:2"], stop_early=False)
    model.head.runs = 0  # forget the probes' dry runs
    with stopping as capture:
        capture.run(torch.randn(2, 4))
    assert model.head.runs == 0
    with running_on as capture:
        capture.run(torch.randn(2, 4))
    assert model.head.runs == 1


def test_hooks_removed_on_exit_even_on_error_and_training_flag_restored():
    model = InPlaceNet().train()
    with pytest.raises(RuntimeError):
        with capture_for(model, ["linear"]) as capture:
            assert model.linear._forward_hooks
            assert not model.training
            capture.run(torch.randn(2, 3))  # wrong width: the forward fails
    assert not model.linear._forward_hooks and not model.act._forward_hooks
    assert model.training


def test_outputs_are_inference_tensors_without_grad():
    model = InPlaceNet()
    with capture_for(model, ["linear"]) as capture:
        out = capture.run(torch.randn(2, 4))["linear"]
    assert not out.requires_grad


@pytest.mark.parametrize("reduce, shape, expected", [
    ("none", (8, 5, 5), (8, 5, 5)), ("flatten", (8, 5, 5), (200,)), ("avgpool", (8, 5, 5), (8,)),
    ("maxpool", (8, 5, 5), (8,)), ("avgpool", (197, 768), (768,)), ("cls", (197, 768), (768,)),
    ("avgpool", (10,), (10,)),
])
def test_reductions(reduce, shape, expected):
    layout = TokenLayout(1, (14, 14)) if shape == (197, 768) else None  # a ViT-B/16's tokens
    assert bind(reduce, "x", shape, layout).shape == expected
    x = torch.randn(2, *shape)
    out = snapshot(0, 1, bind(reduce, "x", shape, layout))(x)
    assert out.shape == (2, *expected) and out.dtype == torch.float32  # the storage dtype is output.storage's cast
    if reduce == "avgpool" and len(shape) == 3:
        torch.testing.assert_close(out.float(), x.mean(dim=(2, 3)), rtol=1e-3, atol=1e-3)
    if reduce == "cls":
        torch.testing.assert_close(out.float(), x[:, 0], rtol=1e-3, atol=1e-3)


def test_snapshot_never_returns_a_view():
    x = torch.randn(2, 3)
    out = take("none", (3,))(x)
    x.zero_()
    assert out.abs().sum() > 0


class SideBranch(nn.Module):
    """A block whose main branch runs before the branch that is asked for (like ResNet's downsample)."""

    def __init__(self):
        super().__init__()
        self.main = CountingLinear()
        self.side = nn.Linear(4, 3)
        self.side_act = nn.ReLU(inplace=True)

    def forward(self, x):
        main = self.main(x)
        x = x.clone()
        x.relu_()  # in place, its result unused: pruning must keep it, the side branch reads x
        side = self.side(x)
        return main.sum() + self.side_act(side).sum()


def test_pruned_graph_skips_work_no_requested_layer_needs():
    torch.manual_seed(0)
    model = SideBranch().eval()
    layers = resolve(["side"], probe(model, (4,)), "net")
    example = torch.randn(2, 4)
    with Capture(model, layers, copies(layers), prune=True, example=example) as capture:
        assert capture.strategy == "graph"
        model.main.runs = 0
        out = capture.run(example)["side"]
    assert model.main.runs == 0
    torch.testing.assert_close(out, model.side(torch.relu(example)))


class Branchy(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        return y if y.sum() > 0 else -y


def test_untraceable_model_falls_back_to_hooks():
    model = Branchy().eval()
    layers = resolve(["linear"], probe(model, (4,)), "net")
    x = torch.randn(3, 4)
    with Capture(model, layers, copies(layers), prune=True, example=x) as capture:
        assert capture.strategy == "hooks"
        torch.testing.assert_close(capture.run(x)["linear"], model.linear(x))


def test_graph_and_hooks_agree_on_resnet18_inplace_victims_and_reused_modules():
    from torchvision.models import get_model

    torch.manual_seed(0)
    model = get_model("resnet18", weights=None).eval()
    selectors = ["layer1.0.bn1", "layer1.0.relu:1", "layer1.0.relu:2", "layer1.0.bn2", "layer3.0.downsample.1"]
    layers = resolve(selectors, probe(model, (3, 224, 224)), "resnet18")
    x = torch.randn(3, 3, 224, 224)
    with Capture(model, layers, copies(layers), prune=True, example=x[:2]) as graph:
        assert graph.strategy == "graph"
        by_graph = graph.run(x)
    with Capture(model, layers, copies(layers)) as hooks:
        by_hooks = hooks.run(x)
    for name in selectors:
        torch.testing.assert_close(by_graph[name], by_hooks[name], rtol=1e-5, atol=1e-5)
    assert (by_graph["layer1.0.bn1"] < 0).any()


def test_pruned_graph_does_not_run_what_follows_the_last_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 4), nn.ReLU(inplace=True),
                          nn.Linear(4, 2)).eval()
    tail_calls = []
    model[4].register_forward_hook(lambda *args: tail_calls.append(1))
    layers = resolve(["0", "2"], probe(model, (4,)), "net")
    example = torch.randn(2, 4)
    tail_calls.clear()
    with Capture(model, layers, copies(layers), prune=True, example=example) as capture:
        assert capture.strategy == "graph"
        tail_calls.clear()
        out = capture.run(example)
    assert tail_calls == []
    first = model[0](example)
    torch.testing.assert_close(out["0"], first)  # taken before the in-place ReLU
    torch.testing.assert_close(out["2"], model[2](torch.relu(first)))


class AliasedAdd(nn.Module):
    """`a += 1` changes `b` too in eager mode; a graph that records `a = a + 1` would not."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 4)

    def forward(self, x):
        a = self.first(x)
        b = a
        a += 1.0
        return self.second(b)


def test_pruned_graph_runs_augmented_assignments_in_place_like_the_model():
    torch.manual_seed(0)
    model = AliasedAdd().eval()
    layers = resolve(["second"], probe(model, (4,)), "net")
    x = torch.randn(3, 4)
    with Capture(model, layers, copies(layers), prune=True, example=x[:2]) as capture:
        assert capture.strategy == "graph"  # the graph agreed with the hooks on the example
        out = capture.run(x)["second"]
    torch.testing.assert_close(out, model.second(model.first(x) + 1.0))


def test_pruned_resnet_graph_adds_residuals_in_place():
    import operator

    from torchvision.models import get_model

    from featdump.forward.graph import pruned_forward

    model = get_model("resnet18", weights=None).eval()
    layers = resolve(["avgpool"], probe(model, (3, 64, 64)), "resnet18")
    graph = pruned_forward(model, layers, copies(layers)).graph
    targets = [node.target for node in graph.nodes if node.op == "call_function"]
    assert targets.count(operator.iadd) == 8 and operator.add not in targets  # one per BasicBlock
