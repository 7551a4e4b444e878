"""timm:NAME — a timm model via timm.create_model, with timm's own eval preprocessing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from featdump.errors import UnknownModel, UsageProblem, WeightsUnavailable, first_sentence
from featdump.sources.registry import Built, ModelRequest, Source, random_weights
from featdump.sources.tokens import TokenRule

if TYPE_CHECKING:  # torch is imported when a model is built, not for the help that lists this source
    from torch import nn


def _timm():
    try:
        import timm
    except ImportError as error:
        raise UsageProblem("timm models need timm: pip install 'featdump[timm]' (or pip install timm).") from error
    return timm


def check_name(name: str) -> None:
    timm = _timm()
    if not timm.is_model(name):
        import difflib

        close = difflib.get_close_matches(name, timm.list_models(pretrained=False), n=5, cutoff=0.6)
        hint = f" Did you mean: {', '.join('timm:' + c for c in close)}?" if close else ""
        raise UnknownModel(f"timm has no model {name!r}.{hint} `timm.list_models('*pattern*')` lists them.")


def build(name: str, weights: str, seed: int) -> tuple[nn.Module, nn.Module, str, dict]:
    """(module, preprocessing, what was loaded, source) for weights 'none' (seeded) or DEFAULT (pretrained)."""
    timm = _timm()
    check_name(name)
    if random_weights(weights):
        import torch

        torch.manual_seed(seed)
        module, label = timm.create_model(name, pretrained=False), "none"
    else:
        try:
            module = timm.create_model(name, pretrained=True)
        except Exception as error:  # hub errors come in many types; offline is the common one
            raise WeightsUnavailable(
                f"Could not get timm's pretrained weights for {name} ({first_sentence(error)}). They are read from "
                "the Hugging Face cache when present (HF_HOME); pass --weights none for a random network, or "
                "--weights PATH for a local checkpoint."
            ) from error
        label = f"timm pretrained ({_tag(module)})"
    module.eval()
    config = timm.data.resolve_data_config({}, model=module)
    preprocessing = timm.data.create_transform(**config, is_training=False)
    source = {"source": "timm", "timm_version": timm.__version__, "timm_model": name, "pretrained_tag": _tag(module)}
    return module, preprocessing, label, source


def token_rule(module: nn.Module) -> TokenRule | None:
    """timm's ViTs state `num_prefix_tokens` and their patch embedding's `patch_size` (a model of your own may too,
    or a plain `patch_size`)."""
    patch = getattr(getattr(module, "patch_embed", None), "patch_size", None) or getattr(module, "patch_size", None)
    return TokenRule.stated(getattr(module, "num_prefix_tokens", None), patch)


def _tag(module: nn.Module) -> str:
    config = getattr(module, "pretrained_cfg", None) or {}
    return f"{config.get('architecture', '?')}.{config.get('tag') or 'default'}"


def stated_axes(module: nn.Module) -> dict[str, str]:
    """The axes timm states for the feature maps of a model that keeps them channels last (`output_fmt` NHWC, as
    its Swin and other windowed models do): "y,x,channel" for each module its `feature_info` names."""
    if str(getattr(module, "output_fmt", "")).upper() != "NHWC":
        return {}
    return {info["module"]: "y,x,channel" for info in getattr(module, "feature_info", []) if "module" in info}


class TimmSource(Source):
    """timm:NAME, with timm's pretrained weights and its data config's preprocessing."""

    name = prefix = "timm"
    kind = "timm:NAME (pip install 'featdump[timm]')"
    example = '-m timm:convnext_tiny -l stages.2'

    def check(self, spec: str) -> None:
        check_name(self.bare(spec))

    def build(self, request: ModelRequest) -> Built:
        module, preprocessing, label, source = build(self.bare(request.spec), request.weights, request.seed)
        return Built(module, label, source, preprocessing, token_rule(module), stated_axes=stated_axes(module))
