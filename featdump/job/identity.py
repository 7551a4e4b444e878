"""Identity: what one run is, resolved once from its Settings and its model (the layers as expanded, each layer's
reduction, the decode path in use, the device, the memory layout, the input size, the PCA fits), and every key and
record made from it: the fingerprint's fields, the compiled package's key, the checked graph's key and the parts of
the provenance that describe the model's side. A site that needs one asks the identity; none adds a part by hand.
What a Settings field changes is read from its mark (`job.dependencies`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from featdump.forward.device import resolve_decode
from featdump.job import dependencies
from featdump.job.model import Model
from featdump.job.settings import Settings


@dataclass(frozen=True)
class RunIdentity:
    """One run's Settings and what its model resolved them to."""

    settings: Settings
    layers: tuple[str, ...]  # as expanded, in the model's order
    reduce: dict  # each layer's reduction, as text
    decode: str  # the decode path in use (cpu or gpu)
    device: str
    memory_format: str
    input_shape: tuple[int, ...]
    fits: dict  # a pca:K layer's fit digest, by layer

    @classmethod
    def of(cls, settings: Settings, model: Model) -> RunIdentity:
        fits = {name: getattr(reduction.fit, "digest", None) for name, reduction in model.reductions.items()
                if reduction.fit is not None}
        return cls(settings, tuple(layer.name for layer in model.layers), dict(model.chosen),
                   resolve_decode(settings.decode, model.device, model.preprocess), str(model.device),
                   str(model.memory_format), tuple(model.preprocess.input_shape), fits)

    def fingerprinted(self) -> dict:
        """The fields the output's fingerprint records by name (`dependencies.fingerprinted`), as resolved."""
        return dependencies.fingerprinted(self.settings, layers=list(self.layers), reduce=self.reduce,
                                          decode=self.decode)

    def compiled(self) -> dict:
        """What a compiled forward depends on beyond its weights and input batch (`forward.ahead`'s key)."""
        resolved = dependencies.compiled_key(self.settings, layers=list(self.layers), reduce=self.reduce,
                                             device=self.device)
        return {**resolved, "fits": self.fits}

    def graph(self) -> tuple:
        """What a checked pruned graph holds for (a warm worker checks it once)."""
        return (dependencies.run_key(self.settings), tuple(self.reduce.items()), self.device, self.memory_format,
                self.input_shape)

    def described(self) -> dict:
        """The provenance's record of the run's layers and reductions."""
        return {"layers": list(self.layers), "reduce": json.dumps(self.reduce)}
