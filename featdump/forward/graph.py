"""Graph: a traced copy of the forward that computes only what the requested layers need.

Hooks can stop a forward after the last requested layer, but not skip work that runs before it and
feeds nothing requested (the main branch of a ResNet block runs before its downsample branch). When a
model traces with torch.fx, the requested modules become graph leaves, each requested call gets a
snapshot node right after it (before any later in-place op can touch its output), and the nodes no
output depends on are removed (in-place ops on tensors that kept nodes read stay). `Capture` checks
the result against its hooks once and falls back to hooks if the model does not trace or the two
disagree.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Mapping

import torch
from torch import fx, nn

from featdump.errors import NotTraceable
from featdump.forward.layers import Layer, Snapshot
from featdump.forward.probe import take_part

_INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.iand, operator.ior,
                      operator.setitem}


def _in_place(operation):
    def record(self: fx.Proxy, other) -> fx.Proxy:
        return self.tracer.create_proxy("call_function", operation, (self, other), {})

    return record


class _InPlaceProxy(fx.Proxy):
    """Records `x += y` (and -=, *=, /=) as the in-place operator, as the model runs it.

    fx's own Proxy has no __iadd__, so Python records `x = x + y`: a new tensor for every residual
    addition, which costs a ResNet-50 forward several percent on a CPU.
    """

    __iadd__ = _in_place(operator.iadd)
    __isub__ = _in_place(operator.isub)
    __imul__ = _in_place(operator.imul)
    __itruediv__ = _in_place(operator.itruediv)


class _LeafTracer(fx.Tracer):
    """Traces through every module except torch's own and the requested ones, which stay single calls."""

    def __init__(self, leaves: set[str]):
        super().__init__()
        self._leaves = leaves

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return qualified_name in self._leaves or super().is_leaf_module(module, qualified_name)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _InPlaceProxy(node, self)


def pruned_forward(model: nn.Module, layers: list[Layer], snapshots: Mapping[str, Snapshot]) -> fx.GraphModule:
    """A GraphModule sharing MODEL's parameters that returns {layer name: snapshot of its output}."""
    try:
        graph = _LeafTracer({layer.path for layer in layers}).trace(model)
    except Exception as error:  # tracing fails in many model-specific ways
        raise NotTraceable(f"{type(error).__name__}: {error}") from error
    calls = defaultdict(list)
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target].append(node)
    returned = next(node for node in graph.nodes if node.op == "output")
    outputs = {}
    for layer in layers:
        if not layer.path:  # the model's own output: what its output node returns
            outputs[layer.name] = graph.call_function(snapshots[layer.name], (
                graph.call_function(take_part, (returned.args[0], layer.part, layer.name)),))
            continue
        if len(calls[layer.path]) < layer.call:
            raise NotTraceable(f"{layer.name} is not a call of the traced graph")
        node = calls[layer.path][layer.call - 1]
        with graph.inserting_after(node):
            tensor = graph.call_function(take_part, (node, layer.part, layer.name))
        with graph.inserting_after(tensor):
            outputs[layer.name] = graph.call_function(snapshots[layer.name], (tensor,))
    for node in [node for node in graph.nodes if node.op == "output"]:
        graph.erase_node(node)
    graph.output(outputs)
    _remove_unneeded(graph, model)
    return fx.GraphModule(model, graph)


def _remove_unneeded(graph: fx.Graph, model: nn.Module) -> None:
    """Drop every node no output depends on; keep an in-place op on a tensor that something kept reads."""
    nodes = list(graph.nodes)
    live: set[fx.Node] = set()
    for node in reversed(nodes):
        if node.op in ("output", "placeholder") or any(user in live for user in node.users):
            live.add(node)
        elif _may_mutate(node, model) and _mutated_tensor_is_read(node, live):
            live.add(node)
    for node in reversed(nodes):
        if node not in live:
            graph.erase_node(node)


def _mutated_tensor_is_read(node: fx.Node, live: set[fx.Node]) -> bool:
    target = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    return target is not None and any(user in live for user in target.users if user is not node)


def _may_mutate(node: fx.Node, model: nn.Module) -> bool:
    if node.op == "call_method":
        return node.target.endswith("_")
    if node.op == "call_function":
        return node.target in _INPLACE_OPERATORS or getattr(node.target, "__name__", "").endswith("_")
    if node.op == "call_module":
        return bool(getattr(model.get_submodule(node.target), "inplace", False))
    return False


def same_outputs(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    """Whether two captures agree (up to float rounding of differently fused kernels)."""
    return first.keys() == second.keys() and all(
        first[name].shape == second[name].shape and torch.allclose(first[name], second[name], rtol=1e-4, atol=1e-5)
        for name in first
    )
