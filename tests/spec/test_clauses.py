"""kvcontract.spec.clauses: the clause catalogue and lookup by id (docs/CONTRACT.md 9).

What is pinned here is pinned on purpose: the titles of the first twelve clauses
(reports, SARIF rules and the documents cite them) and which clauses the system rather
than the prover checks; the count and the ids are the catalogue's own (a new clause
changes no test here)."""

from __future__ import annotations

import dataclasses

import pytest

from kvcontract.errors import UnknownClauseError, UsageError
from kvcontract.spec import clauses
from kvcontract.spec.clauses import CLAUSES, Clause, clause_ids, get_clause


def test_catalogue_in_order() -> None:
    assert clause_ids() == [f"C{i}" for i in range(1, len(CLAUSES) + 1)]
    assert [c.id for c in CLAUSES] == clause_ids()
    assert clauses.clause_range() == f"C1-C{len(CLAUSES)}"
    # The titles of the first twelve clauses as the documents and the SARIF rules cite them.
    assert [c.title for c in CLAUSES[:12]] == [
        "retention", "load safety", "readiness scope", "maximality", "EAGLE", "convergence",
        "supply covers demand", "store economy", "store horizon", "well-formed stores",
        "data integrity", "no lost hits"]


def test_only_c11_is_checked_by_the_system() -> None:
    assert {c.id: c.proved_by for c in CLAUSES if c.proved_by != "prover"} == {"C11": "system"}
    assert all(c.statement for c in CLAUSES)


def test_every_clause_has_its_impact() -> None:
    """The impact is part of the clause (a new one cannot be added without it); the
    by-id mapping is derived from it."""
    assert {c.id: c.impact for c in CLAUSES} == clauses.CLAUSE_IMPACT
    assert get_clause("C2").impact is clauses.Impact.CRASH


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


@pytest.mark.parametrize("wanted", [f"C{len(CLAUSES) + 1}", "C0", "3", "", "C"])
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
