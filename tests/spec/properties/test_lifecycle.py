"""C13-C15: the lifecycle judges on hand-made traces, the case space's codec, the
reference on a slice of the programs (the whole catalogue: slow), each lifecycle
variant refuted with a readable witness, and the deadline rule proved by induction."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from kvcontract.errors import WitnessError
from kvcontract.impl.variants import REFERENCE, get_implementation
from kvcontract.proofs.theorem import run_property
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lifecycle import (
    DeferCause,
    FinalState,
    JobEvent,
    JobKind,
    JobRecord,
    LifecycleTrace,
    LookupRecord,
    RecoveryRecord,
    RequestState,
    StaleReason,
    StaleStore,
    StateRecord,
    StoreOfferRecord,
    WaitedChunk,
    transition_allowed,
)
from kvcontract.spec.properties import lifecycle as lc
from kvcontract.vocabulary import Impact, Verdict

GEOMETRY = Geometry((fa(4), swa(4, 8)))
PENDING = (DeferCause.HIT_PENDING,)
WAITED = (WaitedChunk(0, 0, "g0c0", DeferCause.HIT_PENDING),)


def _deferred(steps: range, decided_at: int | None = None) -> tuple[LookupRecord, ...]:
    records = [LookupRecord(s, "c", 0, None, PENDING, WAITED) for s in steps]
    if decided_at is not None:
        records.append(LookupRecord(decided_at, "c", 0, 0, by_deadline=True))
    return tuple(records)


def _trace(**fields: object) -> LifecycleTrace:
    base = LifecycleTrace(steps=12, deferral_bound=4,
                          states=(StateRecord(0, "c", RequestState.WAITING),))
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


# -- C13 ------------------------------------------------------------------------------
def test_a_deferral_decided_within_the_bound_holds() -> None:
    trace = _trace(lookups=_deferred(range(2, 6), decided_at=6))
    assert lc.deferral_is_bounded(trace, GEOMETRY) == []


def test_a_late_decision_is_a_delay_and_an_endless_one_a_stall() -> None:
    late = lc.deferral_is_bounded(_trace(lookups=_deferred(range(2, 9), 9)), GEOMETRY)
    assert [v.impact for v in late] == [Impact.DELAY]
    assert "7 steps, past the bound D = 4" in late[0]
    endless = lc.deferral_is_bounded(_trace(lookups=_deferred(range(2, 12))), GEOMETRY)
    assert [v.impact for v in endless] == [Impact.STALL]
    assert "never decided" in endless[0] and "g0 chunk 0 (hit-pending)" in endless[0]
    # A trace that ends before the bound says nothing; an abort after it is a stall
    # (the client gave up).
    short = _trace(steps=4, lookups=_deferred(range(2, 4)))
    assert lc.deferral_is_bounded(short, GEOMETRY) == []
    gave_up = _trace(lookups=_deferred(range(2, 9)), states=(
        StateRecord(0, "c", RequestState.WAITING), StateRecord(9, "c", RequestState.ABORTED)))
    assert [v.impact for v in lc.deferral_is_bounded(gave_up, GEOMETRY)] == [Impact.STALL]


def test_a_deferral_needs_a_cause_and_names_its_chunks() -> None:
    bare = _trace(lookups=(LookupRecord(2, "c", 0, None),))
    assert "no cause" in lc.deferral_has_cause(bare, GEOMETRY)[0]
    unnamed = _trace(lookups=(LookupRecord(2, "c", 0, None, PENDING),))
    assert "names no chunk" in lc.deferral_has_cause(unnamed, GEOMETRY)[0]
    retry = _trace(lookups=(LookupRecord(2, "c", 0, None, (DeferCause.RETRY,)),))
    assert lc.deferral_has_cause(retry, GEOMETRY) == []


def test_waiting_on_a_store_that_ended_is_a_delay() -> None:
    store = (JobRecord(1, 0, "p", JobKind.STORE, JobEvent.SUBMITTED, 0, (0,), ("g0c0",)),
             JobRecord(3, 0, "p", JobKind.STORE, JobEvent.COMPLETED, 0, (0,), ("g0c0",)))
    trace = _trace(lookups=_deferred(range(2, 5), 5), jobs=store)
    found = lc.decides_once_ready(trace, GEOMETRY)
    # The lookup of step 3 may have run before the store's completion in step 3 (one
    # step's order is not in a trace): only the steps after it are owed the chunk.
    assert [v[:30] for v in found] == ["step 4: c still waits on g0c0,"]
    assert found[0].impact is Impact.DELAY


# -- C14 ------------------------------------------------------------------------------
def test_transitions() -> None:
    assert transition_allowed(RequestState.LOADING, RequestState.WAITING)  # C15 recovery
    assert not transition_allowed(RequestState.FINISHED, RequestState.RUNNING_DECODE)
    jump = _trace(states=(StateRecord(0, "c", RequestState.WAITING),
                          StateRecord(1, "c", RequestState.RUNNING_DECODE)))
    assert "waiting -> running-decode" in lc.follows_transitions(jump, GEOMETRY)[0]


def test_jobs_end_exactly_once_unless_stalled() -> None:
    twice = _trace(jobs=(
        JobRecord(1, 7, "c", JobKind.LOAD, JobEvent.SUBMITTED, 0, (0,), ("g0c0",)),
        JobRecord(2, 7, "c", JobKind.LOAD, JobEvent.CANCELLED, 0, (0,), ("g0c0",)),
        JobRecord(2, 7, "c", JobKind.LOAD, JobEvent.COMPLETED, 0, (0,), ("g0c0",))))
    (found,) = lc.jobs_end_once(twice, GEOMETRY)
    assert "ended 2 times (cancelled, completed)" in found and found.impact is Impact.CRASH
    open_job = (JobRecord(1, 3, "p", JobKind.STORE, JobEvent.SUBMITTED, 0, (0,), ("g0c0",)),)
    assert "never ended" in lc.jobs_end_once(_trace(jobs=open_job), GEOMETRY)[0]
    assert lc.jobs_end_once(_trace(jobs=open_job, stalled_keys=("g0c0",)), GEOMETRY) == []
    # After an engine-fatal exception the end state is the crash's: only the exception is
    # a finding (C14/raises-nothing), not the jobs and chunks it left behind.
    crashed = _trace(jobs=open_job, fatal=True, final=FinalState(pending_keys=("g0c0",)))
    assert lc.jobs_end_once(crashed, GEOMETRY) == []
    assert lc.nothing_left_pending(crashed, GEOMETRY) == []


def test_what_is_left_at_the_end() -> None:
    final = FinalState(pending_keys=("g0c1",), loading_requests=("c",),
                       referenced_keys=("g1c2",), stale_stores=(
                           StaleStore(3, "p", 4, 1, 9, StaleReason.REUSED),))
    trace = _trace(final=final)
    impacts = [v.impact for v in lc.nothing_left_pending(trace, GEOMETRY)]
    assert impacts == [Impact.STALL, Impact.STALL, Impact.WASTE]
    (stale,) = lc.stores_only_live_blocks(trace, GEOMETRY)
    assert "block 9, already reused" in stale and stale.impact is Impact.CORRUPTION


def test_an_aborted_request_offers_nothing_past_its_computed_tokens() -> None:
    offer = StoreOfferRecord(0, "p", 0, "aborted", 0, (0, 1))
    (found,) = lc.ended_store_horizon(_trace(offers=(offer,)), GEOMETRY)
    assert "0 tokens computed" in found and "chunk 0 (tokens 0-4)" in found
    fine = StoreOfferRecord(4, "p", 0, "aborted", 9, (0, 1))
    assert lc.ended_store_horizon(_trace(offers=(fine,)), GEOMETRY) == []


# -- C15 ------------------------------------------------------------------------------
def test_resuming_over_a_failed_chunk_is_running_on_missing_kv() -> None:
    # The FA chunk 1 failed; resuming at 16 tokens needs FA chunks 0-3.
    failed = RecoveryRecord(5, "c", 0, 16, ((0, 1),), ("g0c1",), resumed_at=16)
    (found,) = lc.recovers_from_failed_load(_trace(recoveries=(failed,)), GEOMETRY)
    assert "group 0 chunk 1 failed" in found and found.impact is Impact.CORRUPTION
    # The SWA window of a boundary at 16 tokens (sw 8) is chunks 2-3: a failed SWA chunk
    # 0 is not needed there, only below the window.
    below = RecoveryRecord(5, "c", 0, 16, ((1, 0),), ("g1c0",), resumed_at=16)
    assert lc.recovers_from_failed_load(_trace(recoveries=(below,)), GEOMETRY) == []
    assert list(lc.needed_chunks(GEOMETRY, GEOMETRY.groups[1], 16)) == [2, 3]
    recomputed = dataclasses.replace(failed, resumed_at=0)
    assert lc.recovers_from_failed_load(_trace(recoveries=(recomputed,)), GEOMETRY) == []
    reloaded = dataclasses.replace(recomputed, resumed_keys=("g0c1",))
    assert "loads the same chunk again" in lc.recovers_from_failed_load(
        _trace(recoveries=(reloaded,)), GEOMETRY)[0]


def test_judge_trace_names_every_judge() -> None:
    judged = lc.judge_trace(_trace(), GEOMETRY)
    assert list(judged) == [f"{c}/{n}" for c, n, _, _ in lc.JUDGES]
    assert list(lc.JUDGE_IMPACT) == [n for _, n, _, _ in lc.JUDGES]
    assert all(v == [] for v in judged.values())
    assert list(lc.judge_trace(_trace(), GEOMETRY, ["C15"])) == [
        "C15/resumes-on-present-kv", "C15/failed-load-state-consistent",
        "C15/failed-load-not-retried"]


# -- the case space --------------------------------------------------------------------
def test_cases_round_trip_and_bad_witnesses_are_named() -> None:
    case = next(iter(lc.lifecycle_cases()))
    assert case.label == "stalled-store"
    assert lc.LifecycleCase.from_json(case.to_json()) == case
    with pytest.raises(WitnessError, match="unknown lifecycle action 'jump'"):
        lc.LIFECYCLE_SPACE.decode({**case.to_json(), "actions": ["jump"]})
    assert case.program() == ["add p", "stall-store", "step", "add c", "step"]


def _case_properties() -> list[lc.CaseProperty]:
    return [p for p in lc.lifecycle_properties() if isinstance(p, lc.CaseProperty)]


def _first_violation(impl_name: str, depth: int) -> dict[str, tuple[lc.LifecycleCase, str]]:
    impl = get_implementation(impl_name)
    found: dict[str, tuple[lc.LifecycleCase, str]] = {}
    for case in lc.lifecycle_cases(depth):
        for prop in _case_properties():
            if prop.theorem_id not in found:
                message = prop.check(case, impl)
                if message is not None:
                    found[prop.theorem_id] = (case, message)
    return found


def test_the_reference_passes_the_seeds_and_short_programs() -> None:
    assert _first_violation("reference", depth=1) == {}


@pytest.mark.slow
def test_the_reference_passes_every_program_of_the_catalogue() -> None:
    assert _first_violation("reference", depth=lc.LIFECYCLE_DEPTH) == {}


@pytest.mark.parametrize(("variant", "theorem", "seed", "impact", "text"), [
    ("no-deadline", "C13/deferral-bounded", "stalled-store", Impact.STALL, "never decided"),
    ("resetting-deadline", "C13/deferral-bounded", "stalled-store", Impact.STALL,
     "deferred from step 2 to step 10"),
    ("abort-unscheduled-crash", "C14/raises-nothing", "abort-unscheduled", Impact.CRASH,
     "len(offload_keys) == len(offload_block_ids)"),
    ("publish-failed-store", "C14/failed-store-unpublished", "failed-store",
     Impact.CORRUPTION, "whose store job failed at step 2"),
])
def test_each_lifecycle_variant_is_refuted_by_its_seed(
        variant: str, theorem: str, seed: str, impact: Impact, text: str) -> None:
    case, message = _first_violation(variant, depth=0)[theorem]
    assert case.label == seed and text in message
    prop = next(p for p in _case_properties() if p.theorem_id == theorem)
    assert prop.impact_of(message) is impact
    # The witness replays by id, and the reference holds on it.
    witness = prop.witness(case)
    assert prop.replay(witness, get_implementation(variant)) == message
    assert prop.replay(witness, REFERENCE) is None
    picture = prop.draw(witness, get_implementation(variant))
    assert isinstance(picture, lc.TimelinePicture) and picture.timeline
    assert picture.offending_steps


def test_the_deadline_rule_is_proved_and_the_defective_rules_refuted() -> None:
    prop = lc.lifecycle_properties()[0]
    assert prop.theorem_id == "C13/deadline-rule-bounds-age"
    assert run_property(prop, REFERENCE).verdict is Verdict.PROVED
    for variant in ("resetting-deadline", "no-deadline"):
        result = run_property(prop, get_implementation(variant))
        assert result.verdict is Verdict.COUNTEREXAMPLE, variant
        assert result.impact == Impact.STALL.value
    # On ints: the reference's clock keeps the first step, the resetting one does not.
    values = {"t0": 2, "t": 6, "start": 2, "D": 4}
    assert prop.violation(values, REFERENCE) is None
    assert prop.violation(values, get_implementation("resetting-deadline")) is not None
    assert all(prop.admissible({"t0": a, "t": a + b + 1, "start": a, "D": c})
               for a, b, c in itertools.product(range(3), repeat=3))


def test_scoped_runs_size_the_programs_to_the_geometry() -> None:
    big = Geometry((fa(16), swa(16, 128)), blocks_per_chunk=4)
    assert lc.scoped_program_size(big) == (257, 86)  # 128 + 2 * 64 + 1, in three steps
    cases = list(lc.scoped_cases([("big", big)]))
    assert len(cases) == len(lc.SEED_PROGRAMS) + 1 + len(lc.ACTIONS)
    assert {c.config().prompt_len for c in cases} == {257}
    assert lc.LifecycleCase.from_json(cases[0].to_json()) == cases[0]
    seed = next(c for c in cases if c.label == "stalled-final-store")
    prop = next(p for p in _case_properties() if p.name == "deferral-bounded")
    assert "never decided" in (prop.check(seed, get_implementation("no-deadline")) or "")
    assert prop.check(seed, REFERENCE) is None
    with pytest.raises(WitnessError, match="prompt_len and token_budget"):
        lc.LIFECYCLE_SPACE.decode({**seed.to_json(), "prompt_len": -1})
