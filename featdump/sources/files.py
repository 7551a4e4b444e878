"""A whole model saved with torch.save(model): unpickled only with --trust-pickle; TorchScript/export refused."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from featdump.errors import InvalidWeights, UsageProblem, first_sentence
from featdump.sources import timm_models
from featdump.sources.registry import Built, ModelRequest, Source

if TYPE_CHECKING:  # torch is imported when a model is built, not for the help that lists this source
    from torch import nn

MODEL_FILE_SUFFIXES = (".pt", ".pth", ".pt2", ".pkl", ".ckpt", ".bin")


def looks_like_model_file(spec: str) -> bool:
    return spec.endswith(MODEL_FILE_SUFFIXES) or Path(spec).is_file()


def build(path_text: str, trust_pickle: bool) -> nn.Module:
    path = Path(path_text)
    if not path.is_file():
        raise UsageProblem(f"Model file {path_text!r} does not exist.")
    kind = _archive_kind(path)
    if kind == "torch.export archive":
        raise UsageProblem(f"{path_text!r} is a program torch.export.save wrote: pass --model export:{path_text} (its "
                           "module paths restored by torch.export.unflatten).")
    if kind:
        raise UsageProblem(
            f"{path_text!r} is a {kind}: hooks cannot see inside it. Build the nn.Module in Python instead "
            "(--model package.module:build, with --weights a state_dict saved from it)."
        )
    if not trust_pickle:
        raise UsageProblem(
            f"{path_text!r} holds a pickled model: loading it runs whatever code the file contains. If you trust "
            "its origin pass --trust-pickle; otherwise save a state_dict and use --model package.module:build "
            "--weights STATE_DICT."
        )
    import torch

    try:
        module = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # unpickling fails in many ways (missing classes, a bad file)
        raise InvalidWeights(f"Could not load the model in {path_text!r}: {first_sentence(error)}. Its classes "
                             "must be importable (run featdump where its code is).") from error
    if not isinstance(module, torch.nn.Module):
        raise UsageProblem(f"{path_text!r} holds a {type(module).__name__}, not a whole model; a state_dict goes "
                           "with --weights, beside the --model that builds it.")
    return module


def _archive_kind(path: Path) -> str | None:
    """'TorchScript archive' / 'torch.export archive' when PATH is one (both are zip files with telltale names)."""
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    if any(name.endswith("serialized_exported_program.json") or "/models/" in name and name.endswith(".json")
           for name in names) or path.suffix == ".pt2":
        return "torch.export archive"
    if any(name.endswith("constants.pkl") or "/code/" in name for name in names):
        return "TorchScript archive"
    return None


class FileSource(Source):
    """A whole model saved with torch.save (--trust-pickle)."""

    name = "file"
    order = 1
    kind = 'a whole model saved with torch.save(model) (--trust-pickle)'
    example = '-m model.pt --trust-pickle -l block3'

    def claims(self, spec: str) -> bool:
        return looks_like_model_file(spec)

    def build(self, request: ModelRequest) -> Built:
        module = build(request.spec, request.trust_pickle)
        source = {"source": "file", "sha256": file_digest(Path(request.spec))}
        return Built(module, "the saved model", source, tokens=timm_models.token_rule(module))  # as timm's, if stated


def file_digest(path: Path) -> str:
    """The SHA-256 of the file at PATH, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
