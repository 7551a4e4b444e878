"""hub:OWNER/NAME:ENTRY and hub:/path/to/repo:ENTRY — models published through torch.hub (DINOv2 and many research
models ship only that way), loaded offline: a GitHub repository from torch.hub's cache (`torch.hub.get_dir()`, as
an earlier `torch.hub.load` left it), or a local checkout (`source='local'`). One module is the whole source; it
registers itself through the entry point `featdump.sources`, as a third-party source would.

`-w none` calls the entry point with `pretrained=False` where it takes `pretrained` (seeded), and is refused where it
does not; otherwise the entry point's own weights (a download it makes itself fails offline in one line). Hub models
carry no preprocessing: the ImageNet default is used and named in the log, unless `--transform` names another.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from pathlib import Path

from featdump.errors import UnknownModel, UsageProblem, WeightsUnavailable, first_sentence
from featdump.sources.registry import Built, ModelRequest, Source

log = logging.getLogger("featdump")


class HubSource(Source):
    """hub:REPO:ENTRY, a torch.hub entry point of a cached GitHub repository or a local checkout."""

    name = prefix = "hub"
    kind = ('hub:ORG/REPO:ENTRY or hub:/path/to/checkout:ENTRY, a torch.hub entry point, offline (its cache, '
            'a local checkout)')
    example = '-m hub:facebookresearch/dinov2:dinov2_vits14 -l blocks.11'

    def check(self, spec: str) -> None:
        folder, entry = _located(self.bare(spec))
        entries = _entries(folder)
        if entry not in entries:
            raise UnknownModel(f"--model {spec}: {folder}/hubconf.py has no entry point {entry!r}; it has "
                               f"{', '.join(sorted(entries))}.")

    def build(self, request: ModelRequest) -> Built:
        spec = request.spec
        folder, entry = _located(self.bare(spec))
        self.check(spec)
        import torch

        takes_pretrained = "pretrained" in inspect.signature(_entries(folder)[entry]).parameters
        if request.wanted in ("checkpoint", "structure") and not takes_pretrained:
            module = self._own(folder, entry, spec, {}, request.wanted)
            label = "none" if request.wanted == "structure" else "the entry point's own, then the checkpoint"
        elif request.random:
            if not takes_pretrained:
                raise UsageProblem(f"--model {spec}: its entry point takes no `pretrained` argument, so featdump "
                                   "cannot ask it for a random network: leave out --weights none (its own weights).")
            torch.manual_seed(request.seed)
            module = torch.hub.load(str(folder), entry, source="local", trust_repo=True, pretrained=False)
            label = "none"
        elif request.default:
            module = self._own(folder, entry, spec, {"pretrained": True} if takes_pretrained else {}, "default")
            label = "the entry point's own"
        else:
            raise UsageProblem(f"--model {spec}: --weights takes DEFAULT or none for a hub model (its entry point "
                               "chooses its weights).")
        if not isinstance(module, torch.nn.Module):
            raise UsageProblem(f"--model {spec}: its entry point returned a {type(module).__name__}, not a module.")
        if not request.transform:
            log.info("%s: a torch.hub model states no preprocessing: the ImageNet default (resize 256, centre crop "
                     "224, ImageNet mean and std); name your own with --transform.", spec)
        source = {"source": "hub", "hub_repo": self.bare(spec).rsplit(":", 1)[0], "hub_entry": entry,
                  "hubconf": hashlib.sha256((folder / "hubconf.py").read_bytes()).hexdigest()[:16]}
        return Built(module.eval(), label, source)


    @staticmethod
    def _own(folder: Path, entry: str, spec: str, keywords: dict, wanted: str):
        """The entry point's module as it builds it (its own weights, KEYWORDS given), or WeightsUnavailable in
        one line saying what was WANTED."""
        import torch

        try:
            return torch.hub.load(str(folder), entry, source="local", trust_repo=True, **keywords)
        except Exception as error:  # an entry point's download fails in many ways; offline is the common one
            why = {"default": "; pass --weights none for a random network",
                   "checkpoint": ": its entry point takes no `pretrained` argument, so it is built with its own "
                                 "weights before the checkpoint replaces them",
                   "structure": ": its entry point takes no `pretrained` argument, so its layers are listed from "
                                "the network it builds with its own weights"}[wanted]
            raise WeightsUnavailable(f"--model {spec}: its entry point could not load its weights "
                                     f"({first_sentence(error)}). Weights a hub model downloads are read from "
                                     f"torch.hub's cache (TORCH_HOME) when present{why}.") from error


def _located(name: str) -> tuple[Path, str]:
    """(the repository's folder, the entry point) of REPO:ENTRY: a local checkout, or a GitHub OWNER/NAME[:REF]
    from torch.hub's cache."""
    repo, _, entry = name.rpartition(":")
    if not repo or not entry:
        raise UsageProblem(f"--model hub:{name}: name an entry point, hub:OWNER/NAME:ENTRY or hub:/path/to/repo:ENTRY.")
    local = Path(repo).expanduser()
    if repo.startswith((".", "/", "~")) or local.is_dir():
        if not (local / "hubconf.py").is_file():
            raise UsageProblem(f"--model hub:{name}: {local} holds no hubconf.py.")
        return local.resolve(), entry
    return _cached(repo), entry


def _cached(repo: str) -> Path:
    """The folder torch.hub's cache holds GitHub's OWNER/NAME[:REF] in (OWNER_NAME_REF; any ref when none given)."""
    owner_name, _, ref = repo.partition(":")
    if owner_name.count("/") != 1:
        raise UsageProblem(f"--model hub:{repo}:...: name a GitHub repository as OWNER/NAME, or a local folder.")
    owner, name = owner_name.split("/")
    import torch

    hub = Path(torch.hub.get_dir())
    found = sorted(hub.glob(f"{owner}_{name}_{ref or '*'}"))
    found = [folder for folder in found if (folder / "hubconf.py").is_file()]
    if not found:
        raise UsageProblem(f"--model hub:{repo}:...: torch.hub's cache ({hub}) holds no copy of {owner_name}, and "
                           "featdump reads models offline: run torch.hub.load once where the network can be reached "
                           "(TORCH_HOME shared with this machine), or clone it and name its folder, hub:/path:ENTRY.")
    return found[0]


def _entries(folder: Path) -> dict:
    """The entry points of FOLDER's hubconf.py (its public functions, as torch.hub lists them)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"featdump_hubconf_{abs(hash(str(folder)))}", folder / "hubconf.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return {name: value for name, value in vars(module).items() if inspect.isfunction(value)
            and not name.startswith("_")}
