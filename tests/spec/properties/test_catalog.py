"""kvcontract.spec.properties.catalog: every property once, in clause order, by id."""

from __future__ import annotations

import pytest

from kvcontract.errors import UsageError
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.clauses import CLAUSES
from kvcontract.spec.properties import (
    CaseProperty,
    FormulaProperty,
    UnknownPropertyError,
    WitnessError,
    get_property,
    properties,
    replay,
)

CLAUSE_ORDER = [c.id for c in CLAUSES]


def test_properties_are_in_clause_order() -> None:
    ranks = [CLAUSE_ORDER.index(p.clause) for p in properties()]
    assert ranks == sorted(ranks)
    # Every clause the prover checks has at least one property; C11 (system) has none.
    assert {p.clause for p in properties()} == set(CLAUSE_ORDER) - {"C11"}


def test_within_a_clause_formulas_come_before_case_properties() -> None:
    by_clause: dict[str, list[str]] = {}
    for prop in properties():
        by_clause.setdefault(prop.clause, []).append(prop.kind)
    for kinds in by_clause.values():
        assert kinds == sorted(kinds, key=lambda k: k != "arith")
    # C2: first-run, later-run (formulas), the spec scan (sequence), then scan and lookup.
    c2 = [p.name for p in properties() if p.clause == "C2"]
    assert c2 == ["first-run-covers-load", "later-run-covers-load", "spec-scan-hit-only",
                  "scan-accepts-only-hit", "lookup-loads-only-hit"]


def test_ids_and_names_are_unique() -> None:
    ids = [p.theorem_id for p in properties()]
    names = [p.name for p in properties()]
    assert len(set(ids)) == len(ids)
    assert len(set(names)) == len(names)  # so that a bare name is never ambiguous


def test_properties_are_built_once() -> None:
    assert properties() is properties()


def test_get_property_by_id_and_by_bare_name() -> None:
    prop = get_property("C2/first-run-covers-load")
    assert isinstance(prop, FormulaProperty)
    assert prop.theorem_id == "C2/first-run-covers-load"
    assert get_property("first-run-covers-load") is prop
    assert get_property("  C2/first-run-covers-load \n") is prop
    mask = get_property("segment-boundaries-supplied[eagle-none]")
    assert mask.theorem_id == "C7/segment-boundaries-supplied[eagle-none]"
    scan = get_property("C3/scan-defers-only-in-scope")
    assert isinstance(scan, CaseProperty) and scan.family == "scan"


def test_every_property_is_found_by_its_id() -> None:
    for prop in properties():
        assert get_property(prop.theorem_id) is prop
        assert get_property(prop.name) is prop


@pytest.mark.parametrize("wanted", ["C9/first-run-covers-load", "C2/nope", "segment-boundaries"])
def test_unknown_property_names_the_known_ids(wanted: str) -> None:
    with pytest.raises(UnknownPropertyError) as info:
        get_property(wanted)
    message = str(info.value)
    assert message.startswith(f"no property {wanted!r}; known: C1/retained-blocks-exact, ")
    for prop in properties():
        assert prop.theorem_id in message
    assert isinstance(info.value, UsageError)


def test_replay_by_id() -> None:
    # docs/CONTRACT.md 8.2 in one group: bs 4, bpc 1, N 5, sw 2, e 1 (lw 2, W 1).
    witness = {"kind": "arith", "theorem": "C2/first-run-covers-load",
               "values": {"bs": 4, "bpc": 1, "N": 5, "Lb": 0, "sw": 2, "e": 1}}
    assert replay("C2/first-run-covers-load", witness, get_implementation("reference")) is None
    message = replay("first-run-covers-load", witness, get_implementation("unaligned-hit"))
    assert message is not None
    assert message.startswith("the window checked for a candidate boundary N covers")
    assert "N=5" in message
    scan = {"states": ["MISS", "HIT_PENDING"], "initial_window": 2, "window": 1}
    assert replay("C3/scan-defers-only-in-scope", scan, get_implementation("reference")) is None
    assert replay("C3/scan-defers-only-in-scope", scan,
                  get_implementation("stale-pending")) is not None


def test_replay_errors() -> None:
    reference = get_implementation("reference")
    with pytest.raises(UnknownPropertyError):
        replay("C2/nope", {"values": {}}, reference)
    with pytest.raises(WitnessError, match="outside the domain"):
        replay("C2/first-run-covers-load",
               {"values": {"bs": 4, "bpc": 1, "N": 0, "Lb": 0, "sw": 2, "e": 1}}, reference)
    with pytest.raises(WitnessError, match="a scan witness cannot be read"):
        replay("C3/scan-defers-only-in-scope", {"states": ["HIT"]}, reference)
