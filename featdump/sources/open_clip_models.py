"""open_clip:ARCH — an open_clip model's image tower (model.visual) with open_clip's own preprocessing."""

from __future__ import annotations

import difflib
import logging
from typing import TYPE_CHECKING

from featdump.errors import InvalidWeights, UnknownModel, UsageProblem, WeightsUnavailable, first_sentence
from featdump.sources import timm_models
from featdump.sources.registry import Built, ModelRequest, Source, default_weights, random_weights
from featdump.sources.tokens import TokenRule

if TYPE_CHECKING:  # torch is imported when a model is built, not for the help that lists this source
    from torch import nn


def _open_clip():
    try:
        import open_clip
    except ImportError as error:
        raise UsageProblem("open_clip: models need open_clip: pip install 'featdump[open_clip]' (or pip install "
                           "open_clip_torch).") from error
    return open_clip


def check_name(arch: str) -> None:
    names = _open_clip().list_models()
    if arch not in names:
        close = difflib.get_close_matches(arch, names, n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join('open_clip:' + name for name in close)}?" if close else ""
        raise UnknownModel(f"open_clip has no architecture {arch!r}.{hint} `open_clip.list_models()` lists them.")


def build(arch: str, weights: str, seed: int) -> tuple[nn.Module, nn.Module, str, dict, TokenRule | None]:
    """(model.visual, preprocessing, what was loaded, source, token rule) for weights 'none' (random, after
    torch.manual_seed(SEED)), DEFAULT (open_clip's first pretrained tag for ARCH) or a pretrained tag."""
    open_clip = _open_clip()
    check_name(arch)
    tags = open_clip.list_pretrained_tags_by_model(arch)
    if random_weights(weights):
        tag = None
    elif default_weights(weights):
        if not tags:
            raise InvalidWeights(f"open_clip has no pretrained weights for {arch}; pass --weights none or a file.")
        tag = tags[0]
    elif weights in tags:
        tag = weights
    else:
        raise InvalidWeights(f"Unknown weights {weights!r} for open_clip:{arch}: use DEFAULT, none, a checkpoint "
                             f"file, or one of {', '.join(tags) or '(none published)'}.")
    import torch

    torch.manual_seed(seed)
    try:
        logging.disable(logging.WARNING)  # open_clip warns on the root logger that a random model is random
        try:
            model, _, preprocessing = open_clip.create_model_and_transforms(arch, pretrained=tag)
        finally:
            logging.disable(logging.NOTSET)
    except (OSError, RuntimeError) as error:  # the hub offline, a missing cache entry
        raise WeightsUnavailable(f"Could not get open_clip's {arch} weights {tag!r} ({first_sentence(error)}). They "
                                 "are read from the Hugging Face cache when present; pass --weights none for a "
                                 "random network, or --weights PATH for a local file.") from error
    visual = model.visual.eval()
    source = {"source": "open_clip", "arch": arch, "pretrained": tag, "open_clip_version": open_clip.__version__}
    return visual, preprocessing, tag or "none", source, token_rule(visual)


def token_rule(visual: nn.Module) -> TokenRule | None:
    """open_clip's VisionTransformer: a class token (`class_embedding`) and `patch_size`; a timm trunk as timm's
    models state it; any other tower (a ResNet) has no tokens."""
    if getattr(visual, "class_embedding", None) is not None:
        return TokenRule.stated(1, getattr(visual, "patch_size", None))
    trunk = getattr(visual, "trunk", None)
    return timm_models.token_rule(trunk) if trunk is not None else None


class OpenClipSource(Source):
    """open_clip:ARCH: its image tower, the weights its tag names, its preprocessing."""

    name = prefix = "open_clip"
    kind = "open_clip:ARCH, its image tower, the weights its tag (-w) names (pip install 'featdump[open_clip]')"
    example = "-m open_clip:ViT-B-32 -w laion2b_s34b_b79k -l 'transformer.resblocks.*'"

    def check(self, spec: str) -> None:
        check_name(self.bare(spec))

    def build(self, request: ModelRequest) -> Built:
        module, preprocessing, label, source, tokens = build(self.bare(request.spec), request.weights, request.seed)
        return Built(module, label, source, preprocessing, tokens)
