"""Hooks: a context manager that captures copies of selected layer outputs and stops the forward early."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping

import torch
from torch import nn

from featdump.errors import FeatdumpError, NotTraceable, StopForward, first_sentence
from featdump.forward.graph import pruned_forward, same_outputs
from featdump.forward.layers import Layer, Snapshot
from featdump.forward.probe import take_part

log = logging.getLogger("featdump")


class Capture:
    """Captures the outputs of LAYERS; `run(inputs)` returns {layer name: captured tensor}.

    Each capture is a new tensor made at hook time by its layer's SNAPSHOTS entry (a copy, maybe reduced/cast), so
    in-place operations later in the forward cannot change it. Calls of a module are counted per forward, so
    `NAME:K` picks its K-th call. With STOP_EARLY, the forward ends as soon as the last capture is taken.
    With PRUNE, a traced graph that skips all work the layers do not need replaces the hooks when the
    model traces and the graph's outputs equal the hooks' on EXAMPLE (a batch of inputs), or without that check
    when the same graph of a copy of this model was checked already (CHECKED: a warm worker's earlier shard).
    The model runs in eval mode under torch.inference_mode(); hooks are removed and the model's
    training flag restored on exit, also on error.
    """

    def __init__(self, model: nn.Module, layers: list[Layer], snapshots: Mapping[str, Snapshot],
                 stop_early: bool = True, prune: bool = False, example: torch.Tensor | None = None,
                 checked: bool = False):
        self._model = model
        self._layers = layers
        self._prune = prune
        self._example = example
        self._checked = checked
        self._pruned = None
        self.strategy = "hooks"  # or "graph" once a pruned graph is checked and in use ("compiled graph")
        self._snapshots = snapshots
        self._stop_early = stop_early
        self._layers_by_call: dict[str, dict[int, list[Layer]]] = defaultdict(lambda: defaultdict(list))
        for layer in layers:
            self._layers_by_call[layer.path][layer.call].append(layer)
        self._expected = len(layers)
        self._handles: list = []
        self._calls: dict[str, int] = defaultdict(int)
        self._captured: dict[str, torch.Tensor] = {}

    def __enter__(self) -> Capture:
        self._was_training = self._model.training
        self._model.eval()
        self._add_hooks()
        if self._prune:
            self._try_pruned_graph()
        return self

    def __exit__(self, *exc_info) -> None:
        self._remove_hooks()
        self._model.train(self._was_training)

    def _add_hooks(self) -> None:
        for path in self._layers_by_call:
            module = self._model.get_submodule(path)
            self._handles.append(module.register_forward_hook(self._hook_for(path)))

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _try_pruned_graph(self) -> None:
        """Use a pruned graph if the model traces and it gives what the hooks give on the example."""
        try:
            pruned = pruned_forward(self._model, self._layers, self._snapshots)
        except NotTraceable as error:
            log.info("No pruned graph: the model does not trace (%s); capturing with hooks, the forward stops once the "
                     "last layer asked has run.", first_sentence(error))
            return
        if not (self._checked or self._agrees(pruned)):
            return
        self._remove_hooks()
        self._pruned, self.strategy = pruned, "graph"
        log.debug("Capturing with a traced graph that computes only what the layers need.")

    def _agrees(self, pruned) -> bool:
        """Whether PRUNED gives what the hooks give on the example (no example: not known, not used)."""
        if self._example is None:
            return False
        expected = self.run(self._example)
        self._remove_hooks()  # the graph calls the hooked modules
        with torch.inference_mode():
            agree = same_outputs(pruned(self._example), expected)
        self._add_hooks()
        if not agree:
            log.debug("Capturing with hooks: the traced graph's outputs differ from the hooks'.")
        return agree

    @property
    def graph(self):
        """The pruned graph module in use (strategy "graph"), else None."""
        return self._pruned

    def use_compiled(self, forward) -> None:
        """Run FORWARD (the graph compiled, same outputs) in place of the graph."""
        self._pruned, self.strategy = forward, "compiled graph"

    def run(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """One forward pass of INPUTS in inference mode; the captured outputs by layer name."""
        if self._pruned is not None:
            with torch.inference_mode():
                return self._pruned(inputs)
        self.start_forward()
        try:
            with torch.inference_mode():
                self._model(inputs)
        except StopForward:
            pass
        captured = self.take()
        if len(captured) != self._expected:
            missing = sorted(set(self._all_names()) - set(captured))
            raise FeatdumpError(f"Layer(s) {', '.join(missing)} did not run in this forward pass.")
        return captured

    def start_forward(self) -> None:
        """Forget the previous forward's calls and captures (called before each forward)."""
        self._calls.clear()
        self._captured = {}

    def take(self) -> dict[str, torch.Tensor]:
        """The captures of the forward that just ran, by layer name."""
        captured, self._captured = self._captured, {}
        return captured

    def calls(self, path: str) -> int:
        """How many times module PATH ran in the current forward."""
        return self._calls[path]

    def _all_names(self):
        return [layer.name for layer in self._layers]

    def _hook_for(self, path: str):
        wanted = self._layers_by_call[path]

        def hook(module, args, output):
            self._calls[path] += 1
            for layer in wanted.get(self._calls[path], ()):
                tensor = take_part(output, layer.part, layer.name)
                self._captured[layer.name] = self._snapshots[layer.name](tensor)
            if self._stop_early and len(self._captured) == self._expected:
                raise StopForward

        return hook
