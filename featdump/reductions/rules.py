"""Reduction rules: which reduction each layer gets, from --reduce REDUCTION (every layer) and
PATTERN=REDUCTION (the layers PATTERN selects, patterns as in --layers); the most specific rule wins:
a layer's exact name, then the pattern with the most literal characters, then a bare REDUCTION.

    --reduce avgpool --reduce 'layer2=srp:4096' --reduce 'layer4.*=channels:0-63'

Config files give the same as a list, or as a table whose key `default` is the bare rule:

    [reduce]
    default = "avgpool"
    layer2 = "srp:4096"

The syntax of a reduction is checked here too (without torch: settings check every value when made).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from featdump.errors import UsageProblem
from featdump.forward.patterns import is_pattern, match_pattern

SIMPLE = ("none", "flatten", "avgpool", "maxpool", "spacepool", "cls", "patchmean")
NAMES = (*SIMPLE, "channels:A-B", "srp:K", "countsketch:K", "pca:K")
CHANNELS = re.compile(r"^channels:(\d+)-(\d+)$")
_PROJECTION = re.compile(r"^(srp|countsketch|pca):([^:]*)(?::(.*))?$")


@dataclass(frozen=True)
class Rule:
    """One --reduce item: a PATTERN (None: every layer) and the REDUCTION its layers get."""

    pattern: str | None
    reduction: str

    @classmethod
    def parse(cls, item: str) -> Rule:
        pattern, equals, reduction = item.rpartition("=")
        return cls(pattern.strip() if equals else None, canonical(reduction.strip()))

    @property
    def specificity(self) -> tuple[int, int]:
        if self.pattern is None:
            return (0, 0)
        if not is_pattern(self.pattern):
            return (2, len(self.pattern))
        return (1, len(re.sub(r"\[[^\]]*\]|[*?]", "", self.pattern)))

    def __str__(self) -> str:
        return self.reduction if self.pattern is None else f"{self.pattern}={self.reduction}"


def check_rule(item: str) -> None:
    """ValueError saying what is wrong with one --reduce item (the option's check)."""
    pattern, equals, reduction = item.rpartition("=")
    if equals and not pattern.strip():
        raise ValueError("must be REDUCTION or PATTERN=REDUCTION, with a layer name or pattern before =")
    check_syntax(reduction.strip())


def check_syntax(text: str) -> None:
    """ValueError saying what is wrong with the reduction TEXT."""
    if text in SIMPLE:
        return
    channels = CHANNELS.match(text)
    if channels:
        if int(channels[1]) > int(channels[2]):
            raise ValueError("must name channels:A-B with A <= B")
        return
    projection = _PROJECTION.match(text)
    if not projection:
        raise ValueError(f"must be REDUCTION or PATTERN=REDUCTION, REDUCTION one of {', '.join(NAMES)}")
    method, k, seed = projection.groups()
    if not k.isdigit() or int(k) < 1:
        raise ValueError(f"must give {method}:K a number of components K of at least 1")
    if method == "pca" and seed is not None:
        raise ValueError("must be pca:K (the fit set is --pca-fit)")
    if method in ("srp", "countsketch") and seed is not None and not seed.isdigit():
        raise ValueError(f"must give {method}:K:SEED an integer seed")


def method_of(text: str) -> str:
    """'srp', 'countsketch', 'pca', 'channels' or the simple reduction's name."""
    return text.split(":", 1)[0]


def canonical(text: str) -> str:
    """TEXT as recorded: srp:K:0 written srp:K, numbers without leading zeros."""
    projection = _PROJECTION.match(text)
    if not projection or not projection[2].isdigit():
        return text
    method, k, seed = projection[1], int(projection[2]), projection[3]
    if seed is None or (seed.isdigit() and int(seed) == 0):
        return f"{method}:{k}"
    return f"{method}:{k}:{int(seed) if seed.isdigit() else seed}"


def canonical_rule(item: str) -> str:
    """A --reduce item as recorded everywhere: PATTERN=REDUCTION with the reduction canonical (srp:64:007 is
    srp:64:7)."""
    return str(Rule.parse(item))


def rules_from_table(table: dict) -> list[str]:
    """A config file's [reduce] table as --reduce items (`default` the bare rule)."""
    return [str(value) if key == "default" else f"{key}={value}" for key, value in table.items()]


def uses_pca(items: tuple[str, ...]) -> bool:
    return any(method_of(Rule.parse(item).reduction) == "pca" for item in items)


def choose(items: tuple[str, ...], names: list[str], infos, model_name: str) -> dict[str, str]:
    """Each selected layer's reduction (by name, in NAMES' order): 'none' where no rule applies.
    UsageProblem for a rule that selects none of NAMES, or two equally specific rules that disagree."""
    rules = [Rule.parse(item) for item in items]
    selected = set(names)
    applies: dict[str, list[Rule]] = {name: [] for name in names}
    for rule in rules:
        if rule.pattern is None:
            matched = selected
        elif is_pattern(rule.pattern):
            matched = selected.intersection(match_pattern(rule.pattern, infos, model_name))
        else:
            matched = selected & {rule.pattern}
        if not matched:
            raise UsageProblem(f"--reduce {str(rule)!r} applies to none of the selected layers "
                               f"({', '.join(names[:8])}{', ...' if len(names) > 8 else ''}); a rule's pattern "
                               "selects among --layers.")
        for name in matched:
            applies[name].append(rule)
    return {name: _most_specific(name, found) for name, found in applies.items()}


def _most_specific(name: str, rules: list[Rule]) -> str:
    if not rules:
        return "none"
    best = max(rule.specificity for rule in rules)
    winners = {rule.reduction: rule for rule in rules if rule.specificity == best}
    if len(winners) > 1:
        raise UsageProblem(f"Layer {name!r} gets two reductions from equally specific rules "
                           f"({', '.join(repr(str(rule)) for rule in winners.values())}); make one more specific.")
    return next(iter(winners))
