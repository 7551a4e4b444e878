"""Patterns: layer selectors with * ? [...] within a name, ** across names, :* for every call and @PART for the
parts of tuple or dict outputs, expanded against the probe in model order."""

from __future__ import annotations

import difflib
import fnmatch
import logging
import re
from typing import TYPE_CHECKING

from featdump.errors import UnknownLayer

if TYPE_CHECKING:  # the probe needs torch; patterns are text (settings check them without it)
    from featdump.forward.probe import LayerInfo

log = logging.getLogger("featdump")


LAYER_LIKE = re.compile(r"[A-Za-z_]\w*(\.\w+)*(:\d+)?(@[\w.]+)?")  # layer2, layer4.1.relu:2, backbone@pool


def is_pattern(text: str) -> bool:
    return any(character in text for character in "*?[")


def expand(selectors: list[str], infos: list[LayerInfo], model_name: str) -> list[str]:
    """SELECTORS with each pattern replaced by the layer names it matches (in model order); plain names as
    they are. Duplicates collapse to their first place."""
    names: dict[str, None] = {}
    for text in (selector.strip() for selector in selectors):
        if not is_pattern(text):
            names.setdefault(text)
            continue
        matched = match_pattern(text, infos, model_name)
        log.info("Pattern %r selects %d layer%s: %s.", text, len(matched), "s" * (len(matched) != 1),
                 ", ".join(matched) if len(matched) <= 12 else ", ".join(matched[:12]) + ", ...")
        for name in matched:
            names.setdefault(name)
    return list(names)


def match_pattern(text: str, infos: list[LayerInfo], model_name: str) -> list[str]:
    """The layer names (PATH, or PATH:K for modules that run several times) that the pattern TEXT selects.

    In the path, * and ? and [...] match within one dotted component, ** any number of components (at
    the end, at least one: layer2.** is everything inside layer2);
    PATH:* selects every call, PATH:K the K-th; @PART (with * ? [...]) parts of tuple or dict outputs.
    Modules that never run, or whose output is not a tensor or not per image, are left out. UnknownLayer
    when nothing matches or the pattern is malformed.
    """
    hint = f"Run `featdump list-layers {model_name} --match PATTERN` to try patterns."
    text, _, part_pattern = text.partition("@")
    path_pattern, _, call = text.partition(":")
    components = path_pattern.split(".")
    if not path_pattern or "" in components or any("**" in part and part != "**" for part in components) \
            or text.count("[") != text.count("]") or (call and call != "*" and not call.isdigit()):
        raise UnknownLayer(f"Bad layer pattern {text!r}: use * ? [...] within a name, ** for any number of "
                           f"names, and :* or :K for calls. {hint}")
    names = []
    for info in infos:
        if not info.path or not _components_match(components, info.path.split(".")):  # @ is named, not matched
            continue
        calls = [index for index in range(1, info.calls + 1) if part_pattern or _default_stored(info, index)]
        if call.isdigit():
            calls = [index for index in calls if index == int(call)]
        for index in calls:
            name = info.path if info.calls == 1 and not call else f"{info.path}:{index}"
            if not part_pattern:
                names.append(name)
                continue
            names += [f"{name}@{part.name}" for part in info.parts[index - 1]
                      if fnmatch.fnmatchcase(part.name, part_pattern) and part.batch_dim is not None]
    if not names:
        literal = path_pattern.replace("**", "").replace("*", "").replace("?", "").strip(".")
        close = difflib.get_close_matches(literal, [info.path for info in infos], n=5, cutoff=0.6)
        maybe = f" Close matches: {', '.join(close)}." if close else ""
        raise UnknownLayer(f"Layer pattern {text!r} matches no layer of {model_name}.{maybe} {hint}")
    return names


def _default_stored(info: LayerInfo, call: int) -> bool:
    """Whether PATH alone (no @PART) names a per-image tensor of call CALL: a tensor output, a tuple's first
    tensor, or a dict's only one."""
    parts = info.parts[call - 1] if info.parts else ()
    fold = info.folds[call - 1] if info.folds else None
    if info.refusal:
        return False
    if info.kind == "tensor" or not parts:
        return info.shapes[call - 1] is not None and (not info.batch_dims or info.batch_dims[call - 1] is not None
                                                      or (fold is not None and fold.contiguous))
    if info.kind == "dict" and len(parts) != 1:
        return False
    return parts[0].batch_dim is not None


def _components_match(pattern: list[str], path: list[str]) -> bool:
    if not pattern:
        return not path
    if pattern == ["**"]:  # a trailing ** selects what is below, not the module itself
        return bool(path)
    if pattern[0] == "**":
        return _components_match(pattern[1:], path) or (bool(path) and _components_match(pattern, path[1:]))
    return bool(path) and fnmatch.fnmatchcase(path[0], pattern[0]) and _components_match(pattern[1:], path[1:])


def select_stored(selectors: list[str], names: list[str], where: str) -> list[str]:
    """The layer NAMES an output holds (PATH, PATH:K, PATH@PART) that SELECTORS pick, in NAMES' order: a plain
    name as it is, a pattern as in `match_pattern` (its :K and @PART parts matched as text). UnknownLayer naming
    WHERE when a name is not held or a pattern picks nothing."""
    chosen: dict[str, None] = {}
    for text in (selector.strip() for selector in selectors if selector.strip()):
        if not is_pattern(text):
            if text not in names:
                close = difflib.get_close_matches(text, names, n=5, cutoff=0.6)
                maybe = f" Close matches: {', '.join(close)}." if close else ""
                raise UnknownLayer(f"{where} holds no layer {text!r}.{maybe} It holds {', '.join(names)}.")
            chosen.setdefault(text)
            continue
        path, suffix = _split_suffix(text)
        matched = [name for name in names if _components_match(path.split("."), _split_suffix(name)[0].split("."))
                   and fnmatch.fnmatchcase(_split_suffix(name)[1], suffix or _split_suffix(name)[1])]
        if not matched:
            raise UnknownLayer(f"Layer pattern {text!r} matches no layer of {where}; it holds {', '.join(names)}.")
        for name in matched:
            chosen.setdefault(name)
    return [name for name in names if name in chosen]


def _split_suffix(name: str) -> tuple[str, str]:
    """'layer1.0.relu:2@0' -> ('layer1.0.relu', ':2@0')."""
    cut = min((index for index in (name.find(":"), name.find("@")) if index >= 0), default=len(name))
    return name[:cut], name[cut:]
