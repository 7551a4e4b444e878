"""Where featdump keeps what it can always compute again (model names, tar indexes, folder listings):
$XDG_CACHE_HOME/featdump, default ~/.cache/featdump. Whatever lies there may be deleted at any time."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache(*parts: str) -> Path:
    """The path PARTS under featdump's cache folder (not created)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "featdump", *parts)
