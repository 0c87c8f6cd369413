"""kvcontract.spec.properties.sequences: the scanner specification's own properties,
evaluated on concrete lookup-state sequences (the prover decides them for all)."""

from __future__ import annotations

import pytest

from kvcontract.impl.variants import REFERENCE
from kvcontract.spec.lookup import HIT, HIT_PENDING, MISS, RETRY, LookupResult
from kvcontract.spec.properties import FormulaProperty, WitnessError, get_property
from kvcontract.spec.properties.sequences import (
    SEQUENCE_MAX_LENGTH,
    SEQUENCE_WINDOWS,
    sequence_properties,
)

IDS = ["C2/spec-scan-hit-only", "C3/spec-scan-pending-scope", "C4/spec-scan-rightmost"]


def _values(states: list[LookupResult], window: int, initial: int) -> dict[str, int]:
    values = {f"s{k}": 0 for k in range(SEQUENCE_MAX_LENGTH)}
    values.update({f"s{k}": int(s) for k, s in enumerate(states)})
    return {**values, "n": len(states), "W": window, "initial": initial}


# Each sequence exercises one rule of the declarative scanner (docs/CONTRACT.md 4.3).
SEQUENCES = [
    ([HIT, HIT_PENDING], 2, 2),  # a pending key inside the window defers
    ([HIT, HIT, MISS, HIT_PENDING], 2, 2),  # 8.1: the pending key outside does not
    ([HIT, HIT, MISS, HIT, HIT], 2, 2),  # two complete windows: the rightmost wins
    ([HIT, HIT, MISS, HIT, HIT], 2, 3),  # the right run is short of I: [0, 2)
    ([HIT, HIT, HIT, HIT, HIT], 2, 3),
    ([HIT_PENDING, HIT, MISS, MISS], 3, 3),  # no window: the prefix run, deferred
    ([MISS, HIT, HIT, MISS, HIT, HIT, HIT, MISS, HIT, HIT, HIT, HIT], 4, 4),
    ([HIT, HIT, HIT, HIT, HIT, HIT, HIT, HIT, HIT, HIT, HIT, HIT], 4, 5),
    ([MISS], 1, 1),
]


@pytest.mark.parametrize("theorem", IDS)
@pytest.mark.parametrize(("states", "window", "initial"), SEQUENCES)
def test_the_spec_holds_on_concrete_sequences(
    theorem: str, states: list[LookupResult], window: int, initial: int
) -> None:
    prop = get_property(theorem)
    values = _values(states, window, initial)
    assert prop.admissible(values)
    assert prop.violation(values, REFERENCE) is None
    assert prop.replay(prop.witness(values), REFERENCE) is None


@pytest.mark.parametrize("theorem", IDS)
def test_states_outside_the_four_results_are_inadmissible(theorem: str) -> None:
    prop = get_property(theorem)
    assert not prop.admissible(_values([HIT, LookupResult.HIT], 1, 1) | {"s1": 4})
    assert not prop.admissible(_values([HIT, HIT], 1, 1) | {"s0": -1})
    # Only the first n variables are the sequence: s5 = 9 is ignored for n = 2.
    assert prop.admissible(_values([HIT, HIT], 1, 1) | {"s5": 9})


def test_pending_scope_excludes_retry() -> None:
    prop = get_property("C3/spec-scan-pending-scope")
    assert not prop.admissible(_values([HIT, RETRY, HIT], 1, 1))
    with pytest.raises(WitnessError, match="outside the domain"):
        prop.replay(prop.witness(_values([HIT, RETRY, HIT], 1, 1)), REFERENCE)
    assert get_property("C2/spec-scan-hit-only").admissible(_values([HIT, RETRY, HIT], 1, 1))


def test_a_witness_names_every_variable() -> None:
    prop = get_property("C4/spec-scan-rightmost")
    with pytest.raises(WitnessError, match="lacks s2, s3"):
        prop.decode({"values": {"s0": 1, "s1": 1, "n": 2, "W": 1, "initial": 1}})


def test_configs_and_variables() -> None:
    for prop in sequence_properties():
        assert isinstance(prop, FormulaProperty)
        assert prop.uses == ()
        assert prop.variables == tuple(f"s{k}" for k in range(12))
        configs = prop.configs()
        assert len(configs) == SEQUENCE_MAX_LENGTH * len(SEQUENCE_WINDOWS) * 2
        assert {(c.values["W"], c.values["initial"] - c.values["W"]) for c in configs} == {
            (w, x) for w in (1, 2, 3, 4) for x in (0, 1)}
        assert max(c.values["n"] for c in configs) == 12
    assert [p.theorem_id for p in sequence_properties()] == IDS


def test_picture() -> None:
    prop = get_property("C3/spec-scan-pending-scope")
    picture = prop.draw(prop.witness(_values([HIT, HIT, MISS, HIT_PENDING], 2, 2)), REFERENCE)
    assert picture.states == {0: [HIT, HIT, MISS, HIT_PENDING]}
    assert picture.windows == {0: (0, 2)}
    assert picture.notes == ["spec answer: 2"]
    deferred = prop.draw(prop.witness(_values([HIT, HIT_PENDING], 2, 2)), REFERENCE)
    assert deferred.notes == ["spec answer: defer"]
    assert deferred.num_tokens == 2
