"""--reduce rules, alone: their syntax, one spelling, a config table, and which layer gets which reduction."""

from __future__ import annotations

import pytest

from featdump.errors import UsageProblem
from featdump.reductions.rules import canonical_rule, check_rule, choose, method_of, rules_from_table, uses_pca


@pytest.mark.parametrize("item, said", [
    ("=avgpool", "with a layer name or pattern before ="), ("channels:9-2", "A <= B"),
    ("srp:0", "at least 1"), ("pca:8:3", "the fit set is --pca-fit"), ("srp:8:x", "an integer seed"),
    ("mean", "REDUCTION one of"),
])
def test_a_malformed_rule_says_what_is_wrong(item, said):
    with pytest.raises(ValueError, match=said):
        check_rule(item)


def test_a_rule_has_one_spelling_and_its_method():
    assert canonical_rule("layer2=srp:64:007") == "layer2=srp:64:7"
    assert canonical_rule("srp:64:0") == "srp:64"
    assert method_of("srp:64:7") == "srp" and method_of("avgpool") == "avgpool"
    assert uses_pca(("layer1=pca:8",)) and not uses_pca(("avgpool", "layer2=srp:16"))
    assert rules_from_table({"default": "avgpool", "layer4": "flatten"}) == ["avgpool", "layer4=flatten"]


def test_the_most_specific_rule_wins_and_a_rule_that_selects_nothing_is_refused():
    names = ["layer1", "layer2", "avgpool"]
    assert choose(("avgpool", "layer2=srp:16"), names, [], "m") == {
        "layer1": "avgpool", "layer2": "srp:16", "avgpool": "avgpool"}
    assert choose((), names, [], "m") == {name: "none" for name in names}
    with pytest.raises(UsageProblem, match="applies to none of the selected layers"):
        choose(("fc=flatten",), names, [], "m")
