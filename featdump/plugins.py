"""Plugins: the readers and model sources other packages register through featdump's entry point groups
(`featdump.readers`, `featdump.sources`), loaded when first asked for. A plugin that fails to load (its import
raises, a dependency is missing, it makes no object) is left out with one warning naming it, its package and the
error: it breaks no command that does not need it, and a command that finds nothing for its input or model says
which plugins were left out."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("featdump")


@dataclass(frozen=True)
class Broken:
    """A plugin left out: its entry point's name, its package, and why."""

    name: str
    package: str
    error: str

    def said(self) -> str:
        return f"{self.name!r} of package {self.package} ({self.error})"


_BROKEN: dict[str, list[Broken]] = {}  # group: the plugins of it left out, once it was loaded


def load(group: str, make: Callable[[str, object], object]) -> list:
    """MAKE(its name, what it loads) for each entry point of GROUP that loads and makes; the others are left out,
    each with one warning."""
    from importlib.metadata import entry_points

    made, broken = [], []
    for entry in entry_points(group=group):
        try:
            made.append(make(entry.name, entry.load()))
        except Exception as error:  # noqa: BLE001 - whatever a plugin raises, it is left out and said
            package = entry.dist.name if entry.dist is not None else "unknown"
            broken.append(Broken(entry.name, package, f"{type(error).__name__}: {error}"))
            log.warning("The %s plugin %s is left out: it failed to load. Reinstall or remove that package.",
                        group.split(".")[-1].rstrip("s"), broken[-1].said())
    _BROKEN[group] = broken
    return made


def left_out(group: str) -> str:
    """A phrase naming GROUP's plugins that failed to load (for a message that found no reader or source), or ""."""
    broken = _BROKEN.get(group, [])
    if not broken:
        return ""
    return (f" (left out because it failed to load: {'; '.join(plugin.said() for plugin in broken)}; it may be the "
            "one for this)")


def noting_left_out(group: str, error: Exception) -> Exception:
    """ERROR (a refusal: no reader, no model) with GROUP's plugins that failed to load named after its message, where
    any did; ERROR itself otherwise."""
    note = left_out(group)
    if not note:
        return error
    noted = type(error)(f"{str(error).rstrip('.')}{note}.")
    noted.__cause__ = error
    return noted
