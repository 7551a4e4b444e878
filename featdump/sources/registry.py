"""The registry of model sources: each source (torchvision, timm, Hugging Face, open_clip, your factory, a saved
file) is one module that registers one `Source`, saying which --model names it claims, how it checks one before
any image is read, what it takes of a video, and how it builds one (a `Built` record). `models.load_model` asks
the registry; a new source is one more module that registers itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from featdump.sources.tokens import TokenRule

if TYPE_CHECKING:  # torch is imported when a model is built, not for a command's help
    from torch import nn


@dataclass(frozen=True)
class ModelClip:
    """What a model takes of a video: clips of FRAMES frames sampled at FPS a second (None: each video's own rate),
    each one input (TAKES_CLIPS: a video model, whose preprocessing takes a clip's (T, C, H, W) uint8 frames); an
    image model takes one frame a row, with its image preprocessing."""

    frames: int = 1
    fps: float | None = None
    takes_clips: bool = False


@dataclass
class Built:
    """What a source builds for a --model: the module, its own PREPROCESSING (None: the ImageNet default), the
    WEIGHTS loaded (as recorded), where it came from (SOURCE, part of the fingerprint), its token rule, the modules
    whose outputs are rows of an image (a detector's backbone) and the axes its 3-d maps state."""

    module: nn.Module
    weights: str
    source: dict
    preprocessing: nn.Module | None = None
    tokens: TokenRule | None = None
    rows_within: tuple[str, ...] = ()
    stated_axes: dict = field(default_factory=dict)


WANTED = ("default", "random", "named", "checkpoint", "structure")


@dataclass(frozen=True, kw_only=True)
class ModelRequest:
    """What a job asks a source to build: the --model SPEC, its --weights (DEFAULT: the source's own, none: random
    weights of SEED, or a name the source knows), a --transform, and whether a pickled model may be loaded. WANTED
    says which of these the weights are, as torchvision's weights enums tell its models: the source's own
    (`default`), random (`random`), weights the source names (`named`), a network whose weights a checkpoint
    replaces after it is built (`checkpoint`: WEIGHTS is none), or only its structure, any weights, none downloaded
    (`structure`, as list-layers asks: WEIGHTS is none)."""

    spec: str
    weights: str = "DEFAULT"
    seed: int = 0
    transform: str | None = None
    trust_pickle: bool = False
    wanted: str = ""  # one of WANTED; "" : told by WEIGHTS (default, random or named)

    def __post_init__(self) -> None:
        if not self.wanted:
            told = "default" if default_weights(self.weights) else "random" if random_weights(self.weights) \
                else "named"
            object.__setattr__(self, "wanted", told)
        if self.wanted not in WANTED:
            raise ValueError(f"ModelRequest(wanted={self.wanted!r}): one of {', '.join(WANTED)}")

    @property
    def random(self) -> bool:
        """-w none, a checkpoint to follow, or only the structure: a network of random weights (seeded by SEED)
        serves (a source that cannot build one tells the three apart by WANTED)."""
        return random_weights(self.weights)

    @property
    def default(self) -> bool:
        """-w DEFAULT: the weights the source names as its own."""
        return default_weights(self.weights)


def default_weights(weights: str) -> bool:
    """Whether --weights WEIGHTS asks for the source's own weights (`DEFAULT`, in any case)."""
    return weights.upper() == "DEFAULT"


def random_weights(weights: str) -> bool:
    """Whether --weights WEIGHTS asks for random weights (`none`, in any case): decided here for every source."""
    return weights.lower() == "none"


class Source:
    """One place models come from. NAME is recorded; the defaults say nothing and refuse nothing."""

    name = "source"
    order = 0  # asked in this order: prefixed names first, files, factories, then torchvision's plain names
    prefix: str | None = None  # a source whose names are PREFIX:NAME (timm:, hf:, open_clip:)
    kind = "a model"  # the --model names it claims, as the help and the docs list them
    example = "-m NAME -l LAYER"  # the options of an extract command using it, for the docs

    def claims(self, spec: str) -> bool:
        """Whether --model SPEC names a model of this source (by default: SPEC starts with PREFIX:)."""
        return self.prefix is not None and spec.startswith(self.prefix + ":")

    def bare(self, spec: str) -> str:
        """SPEC without this source's PREFIX: (timm:resnet50 -> resnet50)."""
        return spec.removeprefix(f"{self.prefix}:") if self.prefix else spec

    def check(self, spec: str) -> None:
        """Fail fast (a one-line error) when SPEC names nothing this source can build."""

    def clip(self, spec: str) -> ModelClip | None:
        """What SPEC's model takes of a video, known before it is built (None: one frame a row)."""
        return None

    def cpu_only(self, spec: str) -> str | None:
        """Why SPEC's model runs on the CPU only, or None."""
        return None

    def build(self, request: ModelRequest) -> Built:
        """The model REQUEST asks for, built."""
        raise NotImplementedError


_SOURCES: list[Source] = []


def register(source: type[Source]) -> type[Source]:
    """Register SOURCE (a class decorator); sources registered first are asked first."""
    _SOURCES.append(source())
    return source


_PLUGINS_LOADED = False
SOURCES_GROUP = "featdump.sources"


def _checked_source(name: str, kind) -> type[Source]:
    """KIND, entry point NAME's Source class, made once to check that it makes one (a plugin that cannot is left
    out, not a failure of every command)."""
    kind()
    return kind


def source_for(spec: str) -> Source:
    """The source that claims --model SPEC (the torchvision source, asked last, claims any plain name)."""
    return next(source for source in sorted(sources(), key=lambda source: source.order) if source.claims(spec))


def model_kinds() -> str:
    """The --model names every source claims, plain names first, as one phrase (the help of --model)."""
    return "; ".join(source.kind for source in sorted(sources(), key=lambda source: -source.order))


def sources() -> list[Source]:
    """Every source: featdump's own and those registered through the entry point group `featdump.sources` (each a
    Source class; torch.hub's comes that way too), loaded once."""
    global _PLUGINS_LOADED
    if not _PLUGINS_LOADED:
        _PLUGINS_LOADED = True
        from featdump import plugins

        for kind in plugins.load(SOURCES_GROUP, _checked_source):
            if not any(isinstance(source, kind) for source in _SOURCES):
                register(kind)
    if not _SOURCES:
        raise RuntimeError("No model source is registered: featdump is not installed here (its sources register "
                           "through its package's entry points): pip install -e . in its checkout.")
    return list(_SOURCES)
