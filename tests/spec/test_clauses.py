"""kvcontract.spec.clauses: the catalogue C1-C12 and lookup by id (docs/CONTRACT.md 9)."""

from __future__ import annotations

import dataclasses

import pytest

from kvcontract.errors import UnknownClauseError, UsageError
from kvcontract.spec import clauses
from kvcontract.spec.clauses import CLAUSES, Clause, clause_ids, get_clause


def test_catalogue_in_order() -> None:
    assert clause_ids() == [f"C{i}" for i in range(1, 13)]
    assert [c.id for c in CLAUSES] == clause_ids()
    assert [c.title for c in CLAUSES] == [
        "retention", "load safety", "readiness scope", "maximality", "EAGLE", "convergence",
        "supply covers demand", "store economy", "store horizon", "well-formed stores",
        "data integrity", "no lost hits"]


def test_only_c11_is_checked_by_the_system() -> None:
    assert {c.id: c.proved_by for c in CLAUSES if c.proved_by != "prover"} == {"C11": "system"}
    assert all(c.statement for c in CLAUSES)


def test_the_docstring_states_every_clause() -> None:
    doc = clauses.__doc__ or ""
    for clause in CLAUSES:
        assert f"\n{clause.id} {clause.title}\n" in doc, clause.id


@pytest.mark.parametrize(("wanted", "found"), [("C3", "C3"), ("c3", "C3"), (" C10\n", "C10"),
                                               ("c11", "C11")])
def test_get_clause_normalizes(wanted: str, found: str) -> None:
    clause = get_clause(wanted)
    assert isinstance(clause, Clause) and clause.id == found
    assert clause is CLAUSES[int(found[1:]) - 1]


@pytest.mark.parametrize("wanted", ["C13", "C0", "3", "", "C"])
def test_unknown_clause(wanted: str) -> None:
    with pytest.raises(UnknownClauseError) as info:
        get_clause(wanted)
    assert info.value.clause == wanted
    assert info.value.known == clause_ids()
    assert str(info.value) == (f"unknown clause {wanted!r}; known clauses: "
                               + ", ".join(clause_ids()))
    assert isinstance(info.value, UsageError)


def test_clauses_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        CLAUSES[0].title = "something else"  # type: ignore[misc]
