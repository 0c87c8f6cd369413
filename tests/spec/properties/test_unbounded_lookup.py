"""kvcontract.spec.properties.unbounded_lookup: the multi-group lookup's step, proved for
every state and size, and a planted loop bug only the unbounded theorems see."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import z3

from kvcontract.impl import reference, scheduler
from kvcontract.impl.variants import REFERENCE, VARIANTS
from kvcontract.proofs import solver
from kvcontract.proofs.theorem import finish_family, run_family, run_property
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lookup import HIT, MISS
from kvcontract.spec.properties import CaseProperty, FormulaProperty, get_property, properties
from kvcontract.spec.properties.base import Env
from kvcontract.spec.properties.unbounded import InductiveProperty
from kvcontract.spec.properties.unbounded_lookup import (
    abstract_turn,
    chunk_division_facts,
    unbounded_lookup_properties,
)
from kvcontract.vocabulary import Verdict

IDS = [p.theorem_id for p in unbounded_lookup_properties()]
CENTRAL = {"C5": "C5/eagle-step-peeks-once", "C6": "C6/lookup-step-converges"}


def _planted_tpc24_step(
    max_hit: Any, confirmed: Any, deferred: Any, local_hit: Any, tokens_per_chunk: Any,
    num_keys: Any, eagle: Any, mamba: Any, scan: Any,
) -> tuple[Any, ...]:
    after, now_confirmed, now_deferred, scanned_at, ended, popped = (
        reference.multigroup_lookup_step(max_hit, confirmed, deferred, local_hit,
                                         tokens_per_chunk, num_keys, eagle, mamba, scan))
    if (tokens_per_chunk == 24 and ended == reference.LOOKUP_GOES_ON and after < scanned_at
            and now_confirmed):
        # The plant: with chunks of 24 tokens a scan's shrink is ignored and the larger
        # boundary confirmed, though its window was not complete (C2's crash).
        return scanned_at, True, now_deferred, scanned_at, ended, popped
    return after, now_confirmed, now_deferred, scanned_at, ended, popped


PLANTED_TPC24 = dataclasses.replace(REFERENCE, name="planted-tpc24",
                                    multigroup_lookup_step=_planted_tpc24_step)
"""A loop step wrong only for a chunk of 24 tokens (test-only: not in the registry);
the lookup catalogue's geometries have chunks of 2, 4 and 8 tokens."""


def _planted_second_pop_step(
    max_hit: Any, confirmed: Any, deferred: Any, local_hit: Any, tokens_per_chunk: Any,
    num_keys: Any, eagle: Any, mamba: Any, scan: Any,
) -> tuple[Any, ...]:
    if confirmed and eagle and num_keys >= 40:
        # The plant: a confirmed EAGLE group with many keys pops its peek chunk again.
        return max_hit, True, deferred, max_hit, reference.LOOKUP_GOES_ON, True
    return reference.multigroup_lookup_step(max_hit, confirmed, deferred, local_hit,
                                            tokens_per_chunk, num_keys, eagle, mamba, scan)


def test_the_theorems_are_in_the_catalogue() -> None:
    assert set(IDS) == set(CENTRAL.values())
    for theorem_id in IDS:
        prop = get_property(theorem_id)
        assert isinstance(prop, InductiveProperty) and isinstance(prop, FormulaProperty)
        assert prop in properties()
        assert prop.uses == ("multigroup_lookup_step",)


@pytest.mark.parametrize("theorem_id", IDS)
def test_the_reference_is_proved_for_all_values_cheaply(theorem_id: str) -> None:
    result = run_property(get_property(theorem_id), REFERENCE)
    assert result.verdict is Verdict.PROVED, (result.message, result.details)
    assert result.domain.startswith("all values (tpc, eagle, mamba, M, L, keys")
    assert "induction over the loop's turns" in result.domain
    assert "the central theorem of " + theorem_id.split("/")[0] in result.domain
    assert "FACT_SCHEMAS" in result.domain  # the arithmetic it assumes is named
    # Deterministic budget (the whole cold prove has 30 s on two cores): measured
    # 0.6M-1.3M resources; this leaves room for another Z3 release, not for a blow-up.
    assert result.rlimit_used < 5_000_000


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_registered_variant_keeps_the_reference_step(name: str) -> None:
    impl = VARIANTS[name]
    assert impl.multigroup_lookup_step is reference.multigroup_lookup_step


def test_the_floor_division_facts_hold_for_every_chunk_size() -> None:
    """The schemas the step theorems assume (FACT_SCHEMAS), proved for all integers."""
    q, d, d2, t = z3.Ints("q d d2 t")
    hyps, goal = chunk_division_facts(Env({"q": q, "d": d, "d2": d2, "t": t}), REFERENCE)
    outcome = solver.prove([h for h in hyps if not isinstance(h, bool)], goal, [q, d, d2, t])
    assert outcome.status is solver.QueryStatus.PROVED
    # On ints too (the same statement), including negative dividends.
    for values in ({"q": -3, "d": -7, "d2": 5, "t": 4}, {"q": 2, "d": 8, "d2": 7, "t": 4}):
        hyps, goal = chunk_division_facts(Env(values), REFERENCE)
        assert all(hyps) and goal


def test_a_loop_bug_at_a_chunk_of_24_is_refuted_and_missed_by_the_bounded_family() -> None:
    result = run_property(get_property(CENTRAL["C6"]), PLANTED_TPC24)
    assert result.verdict is Verdict.COUNTEREXAMPLE, (result.message, result.details)
    assert result.witness is not None and result.witness["values"]["tpc"] == 24
    assert result.domain == "all values"
    prop = get_property(CENTRAL["C6"])
    assert prop.replay(result.witness, PLANTED_TPC24) is not None
    assert prop.replay(result.witness, REFERENCE) is None
    # The exhaustive lookup family (226,760 cases over the catalogue's geometries, chunks
    # of 2, 4 and 8 tokens) runs the planted step and does not see it.
    lookup = [p for p in properties() if isinstance(p, CaseProperty) and p.family == "lookup"]
    bounded = finish_family(lookup, [run_family(lookup, PLANTED_TPC24)])
    assert [r.verdict for r in bounded] == [Verdict.PROVED_FOR_DOMAIN] * len(lookup)


def test_the_planted_bug_crashes_a_real_lookup_at_its_chunk_size() -> None:
    """What the witness means: FA + SWA with 24-token chunks, the SWA window broken right
    before the boundary; the planted loop accepts the boundary and loads a MISS."""
    geometry = Geometry((fa(24), swa(24, 40)))
    states = {0: [HIT] * 4, 1: [HIT, HIT, MISS, HIT]}

    def run(impl: Any) -> scheduler.LookupOutcome:
        return scheduler.lookup_complete_chunks(impl, geometry, 97, 0,
                                                lambda g, k: states[g][k])

    good, bad = run(REFERENCE), run(PLANTED_TPC24)
    assert good.hit_tokens is not None and bad.hit_tokens is not None
    lo, hi = bad.load_ranges[1]
    assert any(states[1][k] != HIT for k in range(lo, hi))  # the C2 crash
    lo, hi = good.load_ranges[1]
    assert all(states[1][k] == HIT for k in range(lo, hi))


def test_a_second_pop_at_one_boundary_is_refuted_by_c5() -> None:
    planted = dataclasses.replace(REFERENCE, multigroup_lookup_step=_planted_second_pop_step)
    result = run_property(get_property(CENTRAL["C5"]), planted)
    assert result.verdict is Verdict.COUNTEREXAMPLE, (result.message, result.details)
    assert result.witness is not None
    values = result.witness["values"]
    assert values["eagle"] == 1 and values["keys"] >= 40


def _driver_passes_no_peek(
    max_hit: Any, confirmed: Any, deferred: Any, local_hit: Any, tokens_per_chunk: Any,
    num_keys: Any, eagle: Any, mamba: Any, scan: Any,
) -> tuple[Any, ...]:
    def without_peek(start: Any, stop: Any, at: Any, present_view: bool) -> Any:
        return scan(start, stop - 1 if eagle else stop, at, present_view)

    return reference.multigroup_lookup_step(max_hit, confirmed, deferred, local_hit,
                                            tokens_per_chunk, num_keys, eagle, mamba,
                                            without_peek)


def test_a_step_that_does_not_scan_the_peek_chunk_is_refuted() -> None:
    """The abstract scan answers for the keys the step asks for: an EAGLE scan that stops
    before the peek chunk never confirms a complete window."""
    planted = dataclasses.replace(REFERENCE, multigroup_lookup_step=_driver_passes_no_peek)
    result = run_property(get_property(CENTRAL["C5"]), planted)
    assert result.verdict is Verdict.COUNTEREXAMPLE, (result.message, result.details)
    assert result.witness is not None and result.witness["values"]["eagle"] == 1


@pytest.mark.parametrize("theorem_id", IDS)
def test_the_hypotheses_are_satisfiable_and_bite(theorem_id: str) -> None:
    prop = get_property(theorem_id)
    assert isinstance(prop, FormulaProperty)
    state = {"tpc": 4, "eagle": 1, "mamba": 0, "M": 17, "L": 0, "keys": 5, "conf": 0,
             "dfr": 0, "x1": 5, "a1": 1, "h1": 1, "x2": 0, "a2": 0, "hM": 0, "hp": 0,
             "P": 0}
    assert prop.admissible(state)
    assert prop.violation(state, REFERENCE) is None
    # A deferral without a confirmation is no state of the loop.
    assert not prop.admissible({**state, "dfr": 1})
    assert not prop.admissible({**state, "eagle": 1, "mamba": 1})


def test_the_abstract_scan_answers_only_within_the_scanned_keys() -> None:
    seen: list[tuple[int, int, bool]] = []

    def step(*args: Any) -> tuple[Any, ...]:
        scan = args[-1]
        seen.append((scan(0, 3, 12, False), scan(0, 6, 12, False), scan(0, 3, 12, True)))
        return ()

    abstract_turn(step, 12, False, False, 0, 4, 5, 0, False, 5, True, 9, True)
    assert seen == [(None, 5, 9)]  # 5 lies past key 3; the present view is unchecked


def _scan_answering(*answers: int | None) -> Any:
    """A scan that answers ``answers`` in turn and records what it was asked."""
    asked: list[tuple[int, int, int, bool]] = []
    pending = list(answers)

    def scan(start: int, stop: int, at: int, present_view: bool) -> int | None:
        asked.append((start, stop, at, present_view))
        return pending.pop(0)

    scan.asked = asked  # type: ignore[attr-defined]
    return scan


def test_the_step_on_ints() -> None:
    step = reference.multigroup_lookup_step
    goes_on, no_chunk, nothing = (reference.LOOKUP_GOES_ON, reference.LOOKUP_NO_CHUNK,
                                  reference.LOOKUP_NOTHING_BEYOND)
    # A confirmed group is left alone, and is not scanned.
    scan = _scan_answering()
    assert step(16, True, False, 0, 4, 5, 0, False, scan) == (16, True, False, 16, goes_on,
                                                              False)
    assert scan.asked == []
    # Clamped to its keys (3 chunks), scanned through [0, 3), confirmed at 12.
    scan = _scan_answering(3)
    assert step(17, False, False, 0, 4, 3, 0, False, scan) == (12, True, False, 12, goes_on,
                                                               False)
    assert scan.asked == [(0, 3, 12, False)]
    # EAGLE: scanned through the peek chunk 5 (stop 6), popped once, confirmed at 17.
    scan = _scan_answering(6)
    assert step(17, False, False, 0, 4, 6, 1, False, scan) == (17, True, False, 17, goes_on,
                                                               True)
    assert scan.asked == [(0, 6, 17, False)]
    # EAGLE without a key for the peek chunk: one chunk less, unscanned, not confirmed.
    assert step(17, False, False, 0, 4, 5, 1, False, _scan_answering()) == (
        16, False, False, 17, goes_on, False)
    # A pending window: the present view serves 8; the group defers there.
    scan = _scan_answering(None, 2)
    assert step(17, False, False, 0, 4, 5, 0, False, scan) == (8, True, True, 17, goes_on,
                                                               False)
    assert [a[3] for a in scan.asked] == [False, True]
    # A RETRY: confirmed and deferred at the boundary.
    assert step(17, False, False, 0, 4, 5, 0, False, _scan_answering(None, None)) == (
        17, True, True, 17, goes_on, False)
    # Less than a chunk beyond the local hit; a shrink to the local hit.
    assert step(7, False, False, 4, 4, 5, 0, False, _scan_answering())[4] == no_chunk
    assert step(17, False, False, 4, 4, 5, 0, False, _scan_answering(1))[4] == nothing
    # Mamba between chunk ends: the chunk end below, unscanned.
    assert step(17, False, False, 0, 4, 5, 0, True, _scan_answering()) == (
        16, False, False, 17, goes_on, False)
