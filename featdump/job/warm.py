"""A warm worker: a process that runs many shards of one job (a Ray worker) lists the job's rows, builds its model
and probes it once, not once a shard. Each shard gets its own copy of the built model (a run places it, hooks it
and may compile it); the rows and the probe's findings (names and shapes) are read only and shared. Each is kept
under the key of what made it, one of each kind, and only while `kept_warm()` is on: a process that calls
`featdump.extract` twice may change a factory, a checkpoint or the images in between, and must see the change."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import TypeVar

log = logging.getLogger("featdump")
Made = TypeVar("Made")
_kept: dict[str, tuple[tuple, object]] = {}  # kind: (its key, what was made)
_warm = False


@contextlib.contextmanager
def kept_warm() -> Iterator[None]:
    """Within: rows, models and probes made for a key are kept for the next run of this process with that key."""
    global _warm
    before, _warm = _warm, True
    try:
        yield
    finally:
        _warm = before


def shared(kind: str, key: tuple, make: Callable[[], Made]) -> Made:
    """What MAKE() makes for KEY, made once while warm (the same object each time: read it, never change it)."""
    if not _warm:
        return make()
    kept = _kept.get(kind)
    if kept is None or kept[0] != key:
        _kept[kind] = (key, make())
    else:
        log.debug("Warm worker: the %s made for an earlier shard, again.", kind)
    return _kept[kind][1]


def known(kind: str, key: tuple) -> bool:
    """Whether KIND (a fact: "the graph was checked") was noted for KEY earlier in this warm process."""
    return _warm and kind in _kept and _kept[kind][0] == key


def note(kind: str, key: tuple) -> None:
    """Note KIND for KEY (while warm), for `known`."""
    if _warm:
        _kept[kind] = (key, True)


def loaded_model(key: tuple, load: Callable[[], Made]) -> Made:
    """A LoadedModel as LOAD() makes it for KEY: while warm, a copy of its module from the one loaded before."""
    loaded = shared("model", key, load)
    if not _warm:
        return loaded
    try:
        return dataclasses.replace(loaded, module=copy.deepcopy(loaded.module))
    except Exception as error:  # noqa: BLE001 - a model that cannot be copied (a factory's handle) is loaded again
        log.debug("Warm worker: the model cannot be copied (%s); loading it again.", error)
        return load()
