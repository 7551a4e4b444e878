"""The model as a run uses it: loaded (once per warm worker), placed on its device in its precision and memory
format, probed, its layers resolved and each layer's reduction bound; what each layer's dataset holds."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from featdump.errors import ModelFailed, UsageProblem
from featdump.forward.device import place_model
from featdump.forward.hardware import precision_misfit
from featdump.forward.layers import Layer, Snapshot, in_model_order, resolve
from featdump.forward.memory_format import choose_memory_format, format_name
from featdump.forward.probe import UNKNOWN_AXES, probe
from featdump.inputs import ImageList
from featdump.inputs.clips import preprocess_for
from featdump.inputs.preprocess import Preprocess
from featdump.job import dependencies, warm
from featdump.job.proof import (
    departures,
    reference_copy,
)
from featdump.job.settings import Settings
from featdump.output.specs import DatasetSpec
from featdump.reductions.methods import bind, snapshot
from featdump.reductions.record import Reduction
from featdump.reductions.rules import choose, method_of
from featdump.sources.models import LoadedModel, load_model
from featdump.sources.tokens import TokenLayout, token_layout

log = logging.getLogger("featdump")


@dataclass
class Model:
    """The model side of a run: the loaded model on its device, its preprocessing, the layers, what each keeps
    (REDUCTIONS: bound ones; a pca:K layer's is bound once its fit is known) and the storage DTYPE."""

    loaded: LoadedModel
    preprocess: Preprocess
    layers: list[Layer]
    chosen: dict[str, str]  # each layer's reduction, as text
    reductions: dict[str, Reduction]
    device: torch.device
    dtype: str
    memory_format: torch.memory_format  # of the weights and of every batch of inputs
    infos: list = dataclasses.field(default_factory=list)  # the probe's LayerInfos, to resolve more layers by
    reference: torch.nn.Module | None = None  # the model on the reference path (CPU, fp32), for the proof
    exact: Preprocess | None = None  # the preprocessing without --fast-decode's reduced decode (None: PREPROCESS)

    @property
    def exact_preprocess(self) -> Preprocess:
        """The model's preprocessing exactly, as the proof's reference path runs it: made once with the run's."""
        return self.exact or self.preprocess

    def with_layers(self, names: list[str], chosen: dict[str, str], fits: dict | None = None) -> Model:
        """This model capturing the layers NAMES (in the model's order) with the reductions CHOSEN (FITS: the PCA
        fits of pca:K layers, by name); layers this model has keep what they have."""
        own = {layer.name: layer for layer in self.layers}
        missing = [name for name in names if name not in own]
        if missing:
            own.update((layer.name, layer) for layer in resolve(missing, self.infos, "the model"))
        layers = in_model_order([own[name] for name in names], self.infos)
        model = dataclasses.replace(self, layers=layers, chosen={name: chosen[name] for name in names},
                                    reductions={name: self.reductions[name] for name in names
                                                if name in self.reductions})
        for layer in layers:
            if layer.name not in model.reductions:
                layout, unknown = model.tokens(layer)
                model.reductions[layer.name] = bind(chosen[layer.name], layer.name, layer.shape, layout,
                                                    pca_fit=(fits or {}).get(layer.name), tokens_unknown=unknown,
                                                    axes=layer.axes)
        return model

    @property
    def specs(self) -> dict[str, DatasetSpec]:
        """Each layer's dataset."""
        return {layer.name: _dataset_spec(layer, self.reductions.get(layer.name), self.dtype, self.tokens(layer)[0])
                for layer in self.layers}

    def tokens(self, layer: Layer) -> tuple[TokenLayout | None, str]:
        """LAYER's token layout at the input size the preprocessing makes, or why it has none."""
        return token_layout(layer.shape, self.loaded.tokens, self.preprocess.size)

    @property
    def device_bytes(self) -> int:
        """What the reductions hold on the device (projection matrices)."""
        return sum(reduction.device_bytes for reduction in self.reductions.values())

    def snapshots(self) -> dict[str, Snapshot]:
        """Each layer's output to the tensor stored: reduced on the device, float32, a new tensor (the storage
        dtype is the writer's cast)."""
        return {layer.name: snapshot(layer.batch_dim, layer.fold, self.reductions[layer.name])
                for layer in self.layers}


def _dataset_spec(layer: Layer, reduction: Reduction | None, dtype: str, layout: TokenLayout | None) -> DatasetSpec:
    """What LAYER's dataset holds per image; a token layout only where the tokens are stored as they are."""
    if reduction is None:  # a pca:K layer before its fit
        raise UsageProblem(f"Layer {layer.name}: its PCA fit is not made yet.")
    tokens = (layout.prefix, *layout.grid) if layout is not None and reduction.shape == layer.shape else None
    kept = len(reduction.shape) == len(layer.shape) == 3 and layer.axes != UNKNOWN_AXES  # kept whole, or some channels
    axes = layer.axes if kept else None
    return DatasetSpec(reduction.shape, dtype, layer.layout, layer.part, tokens, reduction.text,
                       reduction.attributes, reduction.fit, axes)


def prepare_model(settings: Settings, device: torch.device, images: ImageList) -> Model:
    """The loaded model on DEVICE, its split preprocessing (of IMAGES' clips, for a video job), the validated
    layers and their datasets."""
    key = dependencies.run_key(settings)
    loaded = warm.loaded_model(key, lambda: load_model(**dict(dependencies.model_key(settings))))
    proved = (settings.proof and departures_of(settings, device)) or settings.precision != "fp32"  # bf16/fp16: watched
    reference = reference_copy(loaded.module) if proved else None
    preprocess = preprocess_for(loaded, images, settings.fast_decode)
    exact = preprocess_for(loaded, images) if settings.fast_decode else None
    memory_format, why = choose_memory_format(loaded.module, preprocess.input_shape)
    log.debug("Memory layout: %s (%s).", format_name(memory_format), why)
    loaded.module = place_model(loaded.module, device, settings.precision, memory_format)
    misfit = precision_misfit(settings.precision, device)
    if misfit:  # before any batch: a job 10x slower than fp32 is not found out from its ETA
        log.warning(misfit)
    if settings.fast_decode and preprocess.draft is None:
        log.warning("--fast-decode needs a resize in the preprocessing; decoding every image whole.")
    try:
        infos = warm.shared("probe", (key, str(device), memory_format, preprocess.input_shape),
                            lambda: probe(loaded.module, preprocess.input_shape, loaded.rows_within,
                                          loaded.stated_axes))
    except ModelFailed:
        preprocess.check_one_size(preprocessing_name(settings))  # the likelier cause, said instead
        raise
    layers = resolve(list(settings.layers), infos, settings.model)
    for layer in layers:
        if layer.layout:
            log.info("Layer %s holds the batch in dimension %d: stored batch-first, %s.", layer.name,
                     layer.batch_dim, layer.layout)
    chosen = choose(settings.reduce, [layer.name for layer in layers], infos, settings.model)
    model = Model(loaded, preprocess, layers, chosen, {}, device, settings.dtype, memory_format, infos, reference,
                  exact)
    for layer in layers:
        if method_of(chosen[layer.name]) != "pca":
            layout, unknown = model.tokens(layer)
            model.reductions[layer.name] = bind(chosen[layer.name], layer.name, layer.shape, layout,
                                                tokens_unknown=unknown, axes=layer.axes)
    return model


def departures_of(settings: Settings, device: torch.device) -> list[str]:
    """How this run departs from the reference path (none: it is the reference)."""
    return departures(device, settings.precision, settings.compile, settings.decode, settings.fast_decode)


def preprocessing_name(settings: Settings) -> str:
    """The preprocessing as the user knows it, for messages."""
    return f"--transform {settings.transform}" if settings.transform else f"the preprocessing of {settings.model}"
