"""torchvision's model names by task, known without importing torchvision once a run has written them down: a
name's check (`featdump extract -m resnet5 ...` says what it is close to) answers at once, not after the 2-5 s of
importing torch and torchvision. The list is torchvision's own (`list_models`), kept per installed torchvision
version in $XDG_CACHE_HOME/featdump (default ~/.cache/featdump); a cache that cannot be read or written is made
again or skipped, never trusted half-written."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from featdump.caches import user_cache

# task: its package in torchvision.models ("" the classifiers at the top)
PACKAGES = {"classification": "", "video": "video", "optical_flow": "optical_flow", "segmentation": "segmentation",
            "detection": "detection", "quantization": "quantization"}


@lru_cache(maxsize=1)
def names_by_task() -> dict[str, list[str]]:
    """{task: torchvision's model names of that task}, in PACKAGES' order."""
    place = _cache_file()
    kept = _read(place) if place else None
    if kept is not None:
        return kept
    listed = _listed()
    if place:
        _write(place, listed)
    return listed


def _listed() -> dict[str, list[str]]:
    import torchvision
    from torchvision.models import list_models

    return {task: list_models(module=getattr(torchvision.models, package) if package else torchvision.models)
            for task, package in PACKAGES.items()}


def _cache_file() -> Path | None:
    """Where the names of the installed torchvision are kept; None where no torchvision distribution is found (a
    source checkout on the path: listed each time)."""
    try:
        version = metadata.version("torchvision")
    except metadata.PackageNotFoundError:
        return None
    return user_cache(f"torchvision-{version}-models.json")


def _read(place: Path) -> dict[str, list[str]] | None:
    try:
        kept = json.loads(place.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or list(kept) != list(PACKAGES) or not all(
            isinstance(names, list) and all(isinstance(name, str) for name in names) for names in kept.values()):
        return None
    return kept


def _write(place: Path, listed: dict[str, list[str]]) -> None:
    """LISTED into PLACE whole (a temporary file renamed over it), or not at all (a read-only home)."""
    try:
        place.parent.mkdir(parents=True, exist_ok=True)
        written = tempfile.NamedTemporaryFile("w", dir=place.parent, suffix=".tmp", delete=False)
    except OSError:
        return
    try:
        with written:
            json.dump(listed, written)
        os.replace(written.name, place)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(written.name)
