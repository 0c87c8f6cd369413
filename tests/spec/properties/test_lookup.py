"""kvcontract.spec.properties.lookup: LookupCase, the lookup space and the judges of
C2-C6 on the stale-pending scheduler form of docs/CONTRACT.md 8.1 (FA bs 4 + SWA bs 4,
sw 8, 17 tokens) and its section-12 sibling, with observations built by hand."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from kvcontract.errors import GeometryError
from kvcontract.impl.variants import REFERENCE, get_implementation
from kvcontract.spec import multigroup
from kvcontract.spec.geometry import Geometry, GroupKind, fa, mamba, swa
from kvcontract.spec.lookup import HIT, HIT_PENDING, MISS, LookupResult
from kvcontract.spec.properties import WitnessError, get_property
from kvcontract.spec.properties.lookup import (
    LOOKUP_FUNCTIONS,
    LOOKUP_SPACE,
    LOOKUP_STATES,
    LookupCase,
    LookupObservation,
    _run_lookup,
    budget_is_maximal,
    contract_answer,
    converges,
    crash_of,
    defers_only_in_scope,
    eagle_peek,
    expected_hit,
    is_maximal,
    loads_only_hit,
    local_hit_is_maximal,
    lookup_cases,
    lookup_catalog,
    lookup_extra_catalog,
    lookup_properties,
    run_lookup,
    short_of_a_chunk,
)
from kvcontract.vocabulary import Impact

FA_SWA = Geometry((fa(4), swa(4, 8)))
# 8.1: FA chunks 0-3 ready; SWA 0 and 1 ready, 2 absent, 3 pending.
STALE = LookupCase("FA4+SWA4(sw8)", FA_SWA, 17, 0,
                   ((HIT,) * 4, (HIT, HIT, MISS, HIT_PENDING)))
# 12 (deferral scope): FA chunk 3 pending, SWA chunk 2 absent: the reference accepts 8.
SCOPE = LookupCase("FA4+SWA4(sw8)", FA_SWA, 17, 0,
                   ((HIT, HIT, HIT, HIT_PENDING), (HIT, HIT, MISS, HIT)))
EAGLE = LookupCase("SWA4(sw8,eagle)", Geometry((swa(4, 8, eagle=True),)), 25, 0, ((HIT,) * 6,))

ACCEPT_8 = LookupObservation(8, {0: (0, 2), 1: (0, 2)})


def _case(**change: Any) -> dict[str, Any]:
    return {**STALE.to_json(), **change}


def test_json_round_trip() -> None:
    data = STALE.to_json()
    assert data["geometry_name"] == "FA4+SWA4(sw8)"
    assert data["num_tokens"] == 17 and data["local_hit"] == 0
    assert data["states"] == {"0": ["HIT"] * 4, "1": ["HIT", "HIT", "MISS", "HIT_PENDING"]}
    assert LookupCase.from_json(data) == STALE
    assert LOOKUP_SPACE.decode(data) == STALE


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"states": {"0": ["HIT"] * 4, "1": ["HIT"] * 3}},
         "group 1 has 4 keys for 17 tokens, the witness gives 3 states"),
        ({"states": {"0": ["HIT"] * 5, "1": ["HIT"] * 4}},
         "group 0 has 4 keys for 17 tokens, the witness gives 5 states"),
        ({"local_hit": 20}, "local_hit 20 exceeds num_tokens 17"),
        ({"num_tokens": -1}, "num_tokens must be an integer >= 0, not -1"),
        ({"local_hit": True}, "local_hit must be an integer >= 0, not True"),
        ({"num_tokens": 17.0}, "num_tokens must be an integer >= 0, not 17.0"),
        ({"states": {"0": ["HIT"] * 4}}, "KeyError: '1'"),
        ({"states": {"0": ["HIT"] * 4, "1": ["HIT", "HIT", "GONE", "HIT"]}}, "'GONE'"),
    ],
)
def test_decode_rejects_malformed_cases(change: dict[str, Any], problem: str) -> None:
    with pytest.raises(WitnessError, match="a lookup witness cannot be read") as info:
        LOOKUP_SPACE.decode(_case(**change))
    assert problem in str(info.value)


def test_states_follow_the_token_count() -> None:
    # 16 tokens: still 4 keys per group; 15 tokens: 3.
    data = _case(num_tokens=16)
    assert LookupCase.from_json(data).num_tokens == 16
    with pytest.raises(ValueError, match="group 0 has 3 keys for 15 tokens"):
        LookupCase.from_json(_case(num_tokens=15))


def test_impossible_geometry_is_a_witness_error() -> None:
    data = _case()
    data["geometry"] = {**data["geometry"], "groups": [
        data["geometry"]["groups"][0], {**data["geometry"]["groups"][1], "sliding_window": 1}]}
    with pytest.raises(WitnessError, match="GeometryError: invalid geometry: sliding_window=1"):
        LOOKUP_SPACE.decode(data)
    with pytest.raises(GeometryError):  # from_json itself keeps the geometry's own error
        LookupCase.from_json(data)


def test_reference_on_the_stale_pending_form() -> None:
    observation = run_lookup(STALE, REFERENCE)
    assert observation.hit_tokens == 8
    assert observation.load_ranges == {0: (0, 2), 1: (0, 2)}
    assert observation.error is None
    assert contract_answer(STALE).best_present == 8
    assert not contract_answer(STALE).pending_in_window
    for prop in lookup_properties():
        assert prop.check(STALE, REFERENCE) is None, prop.name


def test_stale_pending_variant_defers_out_of_scope() -> None:
    impl = get_implementation("stale-pending")
    assert run_lookup(STALE, impl).hit_tokens is None
    message = "the lookup deferred, but no chunk read for the best boundary 8 is pending " \
              "(and no RETRY was seen)"
    assert get_property("C3/lookup-defers-only-in-scope").check(STALE, impl) == message
    assert get_property("C2/lookup-loads-only-hit").check(STALE, impl) is None
    picture = get_property("C3/lookup-defers-only-in-scope").draw(STALE.to_json(), impl)
    assert picture.offending == {1: {3}}  # pending, outside the read range [0, 2)
    assert picture.hit == 8
    assert picture.notes == ["implementation: defer", "spec: best boundary 8"]


def test_deferral_scope_of_a_full_attention_key() -> None:
    assert run_lookup(SCOPE, REFERENCE).hit_tokens == 8
    assert contract_answer(SCOPE).best_present == 8
    assert defers_only_in_scope(SCOPE, ACCEPT_8) is None
    # Upstream defers on FA chunk 3, which no load set of boundary 8 reads.
    assert defers_only_in_scope(SCOPE, LookupObservation(None)) is not None
    pending = LookupCase("x", FA_SWA, 17, 0, ((HIT,) * 4, (HIT, HIT, HIT_PENDING, HIT)))
    # SWA chunk 2 pending: the best boundary 16 reads SWA [2, 4); a deferral is in scope.
    assert contract_answer(pending).best_present == 16
    assert contract_answer(pending).pending_in_window
    assert defers_only_in_scope(pending, LookupObservation(None)) is None


def test_loads_only_hit_names_the_crash() -> None:
    # hit 16: SWA loads [2, 4); chunk 2 is absent.
    assert loads_only_hit(STALE, LookupObservation(16)) == (
        "hit 16 accepted but group 1 must load chunk 2, which is MISS: upstream would crash "
        "with 'not found in cache'")
    ready = LookupCase("x", FA_SWA, 17, 0, ((HIT,) * 4, (HIT, HIT, HIT, HIT_PENDING)))
    assert loads_only_hit(ready, LookupObservation(16)) == (
        "hit 16 accepted but group 1 must load chunk 3, which is HIT_PENDING: upstream would "
        "crash with 'not ready'")
    assert loads_only_hit(ready, LookupObservation(12)) is None
    assert loads_only_hit(STALE, LookupObservation(None)) is None
    local = LookupCase("x", FA_SWA, 17, 8, ((MISS,) * 4, (MISS,) * 4))
    assert loads_only_hit(local, LookupObservation(8)) is None  # nothing external loaded


def test_loads_only_hit_compares_the_reported_load_set() -> None:
    assert loads_only_hit(STALE, ACCEPT_8) is None
    assert loads_only_hit(STALE, LookupObservation(8, {0: (0, 2), 1: (1, 2)})) == (
        "hit 8 accepted but the implementation loads chunks [1, 2) of group 1, the "
        "allocation needs [0, 2)")
    assert loads_only_hit(STALE, LookupObservation(8, {0: (0, 2)})) == (
        "hit 8 accepted but the lookup reports no load set for group 1")
    assert loads_only_hit(STALE, LookupObservation(8, {0: (0, 2), 1: (0, 3)})) == (
        "hit 8 accepted and the implementation's load set says group 1 must load chunk 2, "
        "which is MISS: upstream would crash with 'not found in cache'")


def test_crash_of() -> None:
    assert crash_of(None) == "not found in cache"
    assert crash_of(MISS) == "not found in cache"
    assert crash_of(HIT_PENDING) == "not ready"


def test_is_maximal_and_expected_hit() -> None:
    assert expected_hit(STALE) == 8
    assert is_maximal(STALE, ACCEPT_8) is None
    assert is_maximal(STALE, LookupObservation(4, {0: (0, 1), 1: (0, 1)})) == (
        "the lookup accepted 4; the largest servable boundary is 8")
    assert is_maximal(STALE, LookupObservation(None)) is None
    nothing = LookupCase("x", FA_SWA, 17, 4, ((MISS,) * 4, (MISS,) * 4))
    assert expected_hit(nothing) == 4  # no servable boundary: the local hit
    assert is_maximal(nothing, LookupObservation(4)) is None
    assert is_maximal(nothing, LookupObservation(0)) is not None


def test_eagle_reference_observation() -> None:
    observation = run_lookup(EAGLE, REFERENCE)
    # 24 tokens (6 keys): no 7th key to peek at, so the group pops one chunk; 20 is
    # verified with chunk 5 as its peek, loads Load(20, 0) = [3, 5).
    assert observation.hit_tokens == 20
    assert observation.load_ranges == {0: (3, 5)}
    assert (0, 5) in observation.lookups
    assert observation.popped_at == [(0, 20)] and observation.pops == {0: 1}
    for prop in lookup_properties():
        assert prop.check(EAGLE, REFERENCE) is None, prop.name


@pytest.mark.parametrize(
    ("observation", "problem"),
    [
        (LookupObservation(20, {0: (3, 5)}, [(0, 4), (0, 3)]),
         "EAGLE group 0: the peek chunk 5 after hit 20 was never looked up"),
        (LookupObservation(20, {0: (3, 6)}, [(0, 5), (0, 4), (0, 3)]),
         "EAGLE group 0: the peek chunk 5 is in the load set"),
        (LookupObservation(20, {0: (3, 5)}, [(0, 5)], pops={0: 2},
                           popped_at=[(0, 20), (0, 20)]),
         "EAGLE group 0 popped twice at boundary 20"),
        (LookupObservation(20, {0: (3, 5)}, [(0, 5)], pops={0: 2}, popped_at=[(0, 20)]),
         "EAGLE group 0 popped 2 times for 1 verified boundaries"),
        # 24 tokens, 6 keys: a pop at 24 drops chunk 6, which has no key (a mutant that
        # popped when it had *not* peeked survived before this rule).
        (LookupObservation(20, {0: (3, 5)}, [(0, 5)], pops={0: 1}, popped_at=[(0, 24)]),
         "EAGLE group 0 popped at boundary 24, but its peek chunk 6 has no key (6 keys)"),
    ],
)
def test_eagle_peek_violations(observation: LookupObservation, problem: str) -> None:
    assert eagle_peek(EAGLE, observation) == problem


def test_eagle_peek_chunk_must_be_hit() -> None:
    pending_peek = LookupCase("x", EAGLE.geometry, 25, 0, ((HIT,) * 5 + (HIT_PENDING,),))
    observation = LookupObservation(20, {0: (3, 5)}, [(0, 5)])
    message = eagle_peek(pending_peek, observation)
    assert message is not None
    assert message.startswith("EAGLE group 0: hit 20 accepted with peek chunk 5 ")
    assert "HIT_PENDING" in message
    assert eagle_peek(EAGLE, observation) is None


def test_only_eagle_groups_pop() -> None:
    observation = LookupObservation(8, {0: (0, 2), 1: (0, 2)}, popped_at=[(1, 12)])
    assert eagle_peek(STALE, observation) == (
        "group 1 drops no block (it is not an EAGLE group) but popped at boundary 12")
    assert eagle_peek(STALE, ACCEPT_8) is None  # no EAGLE group: nothing else to check


def test_converges() -> None:
    assert converges(STALE, LookupObservation(8, max_hit_trace=[16, 8])) is None
    assert converges(STALE, LookupObservation(8, max_hit_trace=[16, 8, 12])) == (
        "maxhit grew: [16, 8, 12]")
    # 16 needs SWA chunks [2, 4): chunk 2 is absent at the final boundary.
    assert converges(STALE, LookupObservation(16, max_hit_trace=[16])) == (
        "final hit 16 is not servable by group 1: chunk 2 is not present (checked only at "
        "an earlier candidate)")
    failed = LookupObservation(None, error="no fixpoint after 64 iterations")
    assert converges(STALE, failed) == "no fixpoint after 64 iterations"
    raised = "the implementation raised ConvergenceError: no fixpoint after 64 iterations"
    for judge in (loads_only_hit, defers_only_in_scope, is_maximal, eagle_peek):
        assert judge(STALE, failed) == raised


def test_converges_does_not_ask_for_the_worth_loading_rule() -> None:
    """A final hit inside a coarser group's chunk is safe when that group's load set is
    present (the chunk is loaded whole, its tail recomputed): FA bs 8 + SWA bs 4, sw 6,
    21 tokens, hit 4 (upstream's C6 finding, withdrawn)."""
    geometry = Geometry((fa(8), swa(4, 6)))
    case = LookupCase("FA8+SWA4(sw6)", geometry, 21, 0, ((HIT, HIT), (HIT,) * 5))
    assert converges(case, LookupObservation(4, max_hit_trace=[20, 4])) is None
    # A Mamba group's state exists only at its chunk ends.
    mixed = Geometry((swa(4, 8), mamba(8)))
    at_12 = LookupCase("SWA4(sw8)+Mamba8", mixed, 25, 0, ((HIT,) * 6, (HIT,) * 3))
    message = converges(at_12, LookupObservation(12, max_hit_trace=[24, 12]))
    assert message is not None and "not a chunk end of Mamba group 1" in message


def test_catalog_and_cases() -> None:
    catalog = lookup_catalog()
    names = [name for name, *_ in catalog]
    assert len(set(names)) == len(names)
    assert catalog[0] == ("FA4+SWA4(sw8)", FA_SWA, 17, 0)
    assert all(0 <= local < tokens for _, _, tokens, local in catalog)
    first = list(itertools.islice(lookup_cases(), 3 ** 8 + 1))
    # The first geometry: 4 + 4 keys, every MISS/HIT/HIT_PENDING assignment, then the next.
    assert len(set(first[:-1])) == 3 ** 8
    assert first[0].states == ((MISS,) * 4, (MISS,) * 4)
    assert first[1].states == ((MISS,) * 4, (MISS, MISS, MISS, HIT))
    assert first[-1].geometry_name == "FA4+SWA4(sw8,e3)"
    assert LOOKUP_STATES == (LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING)


def test_properties() -> None:
    # None of these may vanish or move; a new clause's property follows them (adding one
    # edits nothing here: ARCHITECTURE.md, "How to add a clause").
    assert [p.theorem_id for p in lookup_properties()][:8] == [
        "C2/lookup-loads-only-hit", "C3/lookup-defers-only-in-scope", "C4/lookup-is-maximal",
        "C4/lookup-budget-is-maximal", "C5/eagle-peek", "C5/eagle-peeks-one-chunk",
        "C5/lookup-lookahead-drops-nothing", "C6/lookup-converges"]
    assert all(p.uses == LOOKUP_FUNCTIONS and p.family == "lookup"
               for p in lookup_properties())


def test_eagle_peek_past_the_last_key_is_a_violation() -> None:
    # 9 tokens, 2 keys: hit 8 would peek at chunk 2, which has no key (the reference
    # pops to 4); an observation that claims to have looked it up is still a violation.
    case = LookupCase("x", Geometry((swa(4, 8, eagle=True),)), 9, 0, ((HIT, HIT),))
    assert run_lookup(case, REFERENCE).hit_tokens == 4
    observation = LookupObservation(8, {0: (0, 2)}, [(0, 2), (0, 1), (0, 0)])
    message = eagle_peek(case, observation)
    assert message is not None and "peek chunk 2" in message


def test_pass_count_counts_the_clamps() -> None:
    """Found by ``kvcontract.strategies`` on a geometry vLLM builds, outside the catalogue:
    SWA bs 4 (sw 15) + SWA bs 2 (sw 12), bpc 2, 29 tokens. Clamping maxhit to a group's
    keys lowers it too, and the trace records the clamp (28 -> 24), so the reference's
    passes are within the ranking bound (decreases + 1: 3 passes when a shrink restarted
    the pass; 2 since a shrink goes on with the pass, as vLLM's loop does), and every
    clause holds."""
    from kvcontract.impl import get_implementation
    from kvcontract.spec.geometry import Geometry, swa
    from kvcontract.spec.lookup import LookupResult
    from kvcontract.spec.properties import get_property
    from kvcontract.spec.properties.lookup import LookupCase, run_lookup

    hit, pending, miss = LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.MISS
    geometry = Geometry((swa(4, 15), swa(2, 12)), blocks_per_chunk=2)
    case = LookupCase("strategies", geometry, 29, 0,
                      ((pending, hit, pending), (hit, hit, pending, miss, pending, hit, pending)))
    reference = get_implementation("reference")
    observed = run_lookup(case, reference)
    assert observed.iterations == 2 and observed.max_hit_trace == [28, 24, 12]
    for theorem in ("C2/lookup-loads-only-hit", "C3/lookup-defers-only-in-scope",
                    "C4/lookup-is-maximal", "C5/eagle-peek", "C6/lookup-converges"):
        assert get_property(theorem).check(case, reference) is None, theorem


def test_pass_bound_is_decreases_plus_one() -> None:
    """C6's ranking function: every pass but the last lowers maxhit (each lowering is in
    the trace), so a loop that reports a pass more than its decreases allow is caught."""
    assert converges(STALE, LookupObservation(8, max_hit_trace=[16, 8], iterations=2)) is None
    message = converges(STALE, LookupObservation(8, max_hit_trace=[16, 8], iterations=3))
    assert message == ("the loop reports 3 passes for 1 decreases of maxhit [16, 8]: each "
                       "pass but the last must lower it")
    assert converges(STALE, LookupObservation(8, max_hit_trace=[16, 16, 8])) == (
        "maxhit recorded twice without lowering it: [16, 16, 8]")
    assert converges(STALE, LookupObservation(8, max_hit_trace=[16, 8], iterations=0))


def test_loop_budget_is_its_ranking_bound() -> None:
    """The scheduler's iteration budget is the trace it has built (pass k needs k
    entries); an explicit ``max_iterations`` below what a case needs stops the loop."""
    from kvcontract.impl.scheduler import ConvergenceError, lookup_complete_chunks

    outcome = lookup_complete_chunks(REFERENCE, STALE.geometry, STALE.num_tokens, 0,
                                     lambda g, k: STALE.states[g][k])
    assert outcome.iterations == len(outcome.max_hit_trace) == 2
    with pytest.raises(ConvergenceError, match="did not converge in 1 iterations"):
        lookup_complete_chunks(REFERENCE, STALE.geometry, STALE.num_tokens, 0,
                               lambda g, k: STALE.states[g][k], max_iterations=1)


BUDGETED = LookupCase("FA4+SWA4(sw8),budget6", FA_SWA, 9, 0, ((HIT,) * 2, (HIT,) * 2), 6)


def test_budget_round_trip_and_decode() -> None:
    data = BUDGETED.to_json()
    assert data["max_hit_tokens"] == 6
    assert LookupCase.from_json(data) == BUDGETED
    assert "max_hit_tokens" not in STALE.to_json()  # older witnesses read the same
    assert LookupCase.from_json(STALE.to_json()).max_hit_tokens is None
    for bad in (-1, True, 6.5, "6"):
        with pytest.raises(WitnessError, match="max_hit_tokens must be None or an integer"):
            LOOKUP_SPACE.decode({**data, "max_hit_tokens": bad})


def test_budget_caps_the_contract_answer() -> None:
    """All chunks present: 8 tokens without a budget (the last is recomputed), 6 with
    a budget of 6 (FA loads chunk 1 whole for part of it; the window ends at 6)."""
    unlimited = LookupCase("x", FA_SWA, 9, 0, BUDGETED.states)
    assert expected_hit(unlimited) == 8 and expected_hit(BUDGETED) == 6
    observed = run_lookup(BUDGETED, REFERENCE)
    assert observed.hit_tokens == 6 and observed.max_hit_trace == [6]
    for prop in lookup_properties():
        assert prop.check(BUDGETED, REFERENCE) is None, prop.theorem_id
    over = is_maximal(BUDGETED, LookupObservation(8, {0: (0, 2), 1: (0, 2)}))
    assert over == "the lookup accepted 8; the largest servable boundary is 6, past the " \
        "scheduling budget of 6 tokens"
    assert getattr(over, "impact", None) is Impact.DELAY
    # Below the budget the answer is the largest servable boundary as without one.
    missing = LookupCase("x", FA_SWA, 9, 0, ((HIT, MISS), (HIT, HIT)), 6)
    assert expected_hit(missing) == 4


def test_extra_catalog() -> None:
    """A few thousand cases after the others: budgets below maxhit, the clamp, the
    lookahead-hash geometries (keys for the hashed tokens only: 4, 3 + 3 and 4), and the
    local hits inside a chunk (1, 1 + 1 and 2 + 2 keys)."""
    cases = list(lookup_cases())
    extra = {name for name, *_ in lookup_extra_catalog()}
    first = next(i for i, case in enumerate(cases) if case.geometry_name in extra)
    assert all(case.geometry_name in extra for case in cases[first:])
    budgeted = [case for case in cases if case.max_hit_tokens is not None]
    lookahead = 3 ** 4 + 3 ** 6 + 3 ** 4
    inside = 3 ** 1 + 3 ** 2 + 3 ** 4
    assert len(budgeted) == 3 ** 4 * 3
    assert len(cases) - first == 3 ** 4 * 3 + 3 ** 7 + lookahead + inside
    assert sum(1 for case in cases if case.geometry.hash_lookahead) == lookahead
    assert all(case.max_hit_tokens < case.num_tokens - 1 for case in budgeted)


def test_a_clamp_after_a_confirmation_is_checked_again() -> None:
    """SWA bs 4 (sw 8) confirms 19 (chunks 3, 4), then SWA bs 8 clamps maxhit to its two
    keys (16): at 16 the first group reads chunks 2 and 3, and chunk 2 is missing."""
    geometry = Geometry((swa(4, 8), swa(8, 12)))
    case = LookupCase("x", geometry, 20, 0, ((HIT, HIT, MISS, HIT, HIT), (HIT, HIT)))
    observed = run_lookup(case, REFERENCE)
    assert observed.max_hit_trace is not None and observed.max_hit_trace[:2] == [19, 16]
    assert observed.hit_tokens == expected_hit(case) < 16
    for prop in lookup_properties():
        assert prop.check(case, REFERENCE) is None, prop.theorem_id
    # A loop that stopped after the clamp would accept 16 and crash on chunk 2.
    assert loads_only_hit(case, LookupObservation(16, {0: (2, 4), 1: (1, 2)})) == (
        "hit 16 accepted but group 0 must load chunk 2, which is MISS: upstream would crash "
        "with 'not found in cache'")


def test_lookahead_hashes_drop_nothing() -> None:
    """docs/CONTRACT.md 2.1: under lookahead block hashes a full-attention EAGLE group
    serves the last complete chunk of a 17-token prompt (16, four keys: the 17th token
    proves the fourth block); under legacy hashes it peeks at a fifth chunk that has no
    key and pops to 12. A lookup that keeps the legacy drop under lookahead hashes (the
    mixed modes) pops, and loses the chunk."""
    lookahead = Geometry((fa(4, eagle=True),), hash_lookahead=1)
    legacy = Geometry((fa(4, eagle=True),))
    case = LookupCase("x", lookahead, 17, 0, ((HIT,) * 4,))
    prop = get_property("C5/lookup-lookahead-drops-nothing")
    observed = _run_lookup(case, REFERENCE)
    assert observed.hit_tokens == 16 and not observed.popped_at
    assert prop.check(case, REFERENCE) is None
    assert _run_lookup(LookupCase("x", legacy, 17, 0, ((HIT,) * 4,)), REFERENCE).hit_tokens == 12
    mixed = get_implementation("legacy-drop-lookahead-store")
    assert _run_lookup(case, mixed).hit_tokens == 12
    message = prop.check(case, mixed)
    assert message is not None and "popped a chunk at boundary" in message
    maximal = get_property("C4/lookup-is-maximal").check(case, mixed)
    assert maximal is not None and "16" in maximal
    # Keys exist for the hashed tokens only: 16 tokens key three blocks, not four.
    assert multigroup.complete_chunks(lookahead, lookahead.groups[0], 16) == 3
    assert multigroup.complete_chunks(legacy, legacy.groups[0], 16) == 4
    with pytest.raises(GeometryError, match="lookahead block hashes need an EAGLE group"):
        Geometry((fa(4),), hash_lookahead=1)


def test_a_budget_below_the_prompt_is_judged_on_its_own_row() -> None:
    """docs/CONTRACT.md 4.4: SWA bs 4, sw 8, 17 tokens, a budget of 12, every chunk HIT:
    the contract accepts 12; 0.33.0's order (the budget, then the recomputed token) 11.
    Only the budgeted cases are judged by this row."""
    geometry = Geometry((swa(4, 8),))
    case = LookupCase("x", geometry, 17, 0, ((HIT,) * 4,), 12)
    prop = get_property("C4/lookup-budget-is-maximal")
    assert prop.check(case, REFERENCE) is None
    clamped = get_implementation("minus-one-after-clamps")
    assert _run_lookup(case, clamped).hit_tokens == 11
    message = prop.check(case, clamped)
    assert message is not None and "12" in message
    unbudgeted = LookupCase("x", geometry, 17, 0, ((HIT,) * 4,))
    assert budget_is_maximal(unbudgeted, LookupObservation(0)) is None


def _from_the_local_hit(max_hit: Any, confirmed: Any, deferred: Any, local_hit: Any,
                        tokens_per_chunk: Any, num_keys: Any, *rest: Any) -> Any:
    """The reference's turn with the worth-loading rule of vLLM 0.33.0 and 0.34.0's early
    exits of ``_lookup_complete_chunks`` (in the reference's loop): less than a whole
    chunk between the local hit and the (clamped) boundary gives nothing."""
    from kvcontract.impl.reference import LOOKUP_NO_CHUNK

    clamped = min(max_hit, num_keys * tokens_per_chunk)
    if not confirmed and clamped - local_hit < tokens_per_chunk:
        return clamped, False, deferred, clamped, LOOKUP_NO_CHUNK, False
    return REFERENCE.multigroup_lookup_step(max_hit, confirmed, deferred, local_hit,
                                            tokens_per_chunk, num_keys, *rest)


def test_a_local_hit_inside_the_last_chunk_is_in_the_catalogue() -> None:
    """docs/vllm-findings.md (the runtime monitor's C4 finding): FA bs 4, 3 blocks a
    chunk, a 12-token request with a 4-token GPU hit and chunk 0 ready: the contract
    serves 12 (the chunk is loaded whole, 4 tokens of it already on the GPU). The
    catalogue has that shape (a local hit inside a chunk, less than a chunk to the cap,
    past the hit's chunk) on FA alone and FA + SWA, after every other case; the
    reference passes every lookup theorem on each of them, and a rule that counts a
    whole chunk from the local hit loses the hit on its own row."""
    cases = list(lookup_cases())
    shaped = [i for i, case in enumerate(cases) if short_of_a_chunk(case)]
    assert len(shaped) == 3 + 3 ** 2 + 3 ** 4
    assert shaped == list(range(len(cases) - len(shaped), len(cases)))  # the last ones
    names = {cases[i].geometry_name for i in shaped}
    assert names == {"FA4,bpc3,local4", "FA4+SWA4(sw8),bpc3,local4",
                     "FA4+SWA4(sw8),bpc2,local12"}
    for i in shaped:
        case = cases[i]
        geometry, local = case.geometry, case.local_hit
        cap = int(multigroup.lookup_cap(geometry, case.num_tokens, case.max_hit_tokens))
        assert geometry.blocks_per_chunk > 1 and case.max_hit_tokens is None
        assert geometry.groups[0].kind is GroupKind.FULL
        for group in geometry.groups:
            tpc = geometry.chunk_tokens(group)
            assert local % geometry.block_tokens(group) == 0 and local % tpc
            assert cap - local < tpc and cap // tpc > local // tpc
        for prop in lookup_properties():
            assert prop.check(case, REFERENCE) is None, (prop.theorem_id, case)
    monitor = LookupCase("FA4,bpc3,local4", Geometry((fa(4),), blocks_per_chunk=3),
                         12, 4, ((HIT,),))
    assert monitor in {cases[i] for i in shaped}
    assert expected_hit(monitor) == 12 and run_lookup(monitor, REFERENCE).hit_tokens == 12
    prop = get_property("C4/lookup-local-hit-is-maximal")
    counted = dataclasses.replace(REFERENCE, name="from-the-local-hit",
                                  multigroup_lookup_step=_from_the_local_hit)
    assert _run_lookup(monitor, counted).hit_tokens == 4
    assert prop.check(monitor, counted) == (
        "the lookup accepted 4; the largest servable boundary is 12: the local hit 4 lies "
        "inside chunk 0 of group 0 (12 tokens a chunk); the cap 12 is less than a chunk "
        "past it (8 tokens), yet past that chunk's end, and the lookup looked up no chunk")
    # It loses exactly where the contract serves more than the local hit (a pending
    # chunk included: the contract defers there, the rule answers the local hit).
    lost = [i for i in shaped if prop.check(cases[i], counted) is not None]
    assert lost == [i for i in shaped if expected_hit(cases[i]) > cases[i].local_hit]
    assert len(lost) == 42
    # Vacuous outside the shape: a chunk-aligned local hit, or a chunk or more to gain.
    aligned = LookupCase("x", FA_SWA, 21, 4, ((HIT,) * 5, (HIT,) * 5))
    assert not short_of_a_chunk(aligned)
    assert local_hit_is_maximal(aligned, LookupObservation(4)) is None
    assert not short_of_a_chunk(LookupCase("x", Geometry((fa(4),), blocks_per_chunk=3),
                                           24, 4, ((HIT,) * 2,)))
