"""Failed transfers (C14, C15): a failed store publishes nothing, a failed load is never
retried. The two judges on hand-made traces, on the executable system's seeds (the
reference holds, ``publish-failed-store`` is refuted by the failed-store seed) and on the
system with the failed chunks kept (the shape of a release that marks nothing bad)."""

from __future__ import annotations

import dataclasses

import pytest

from kvcontract.impl.system import offload
from kvcontract.impl.system.lifecycle import run_program
from kvcontract.impl.variants import REFERENCE, get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lifecycle import (
    DeferCause,
    JobEvent,
    JobKind,
    JobRecord,
    LifecycleTrace,
    LookupRecord,
    RequestState,
    StateRecord,
    WaitedChunk,
)
from kvcontract.spec.properties import lifecycle as lc
from kvcontract.vocabulary import Impact

GEOMETRY = Geometry((fa(4), swa(4, 8)))
KEYS = ("g0c0", "g0c1")


def _trace(jobs: tuple[JobRecord, ...], lookups: tuple[LookupRecord, ...]) -> LifecycleTrace:
    return LifecycleTrace(steps=12, deferral_bound=4, jobs=jobs, lookups=lookups,
                          states=(StateRecord(0, "c", RequestState.WAITING),))


def _job(step: int, job_id: int, request: str, kind: JobKind, event: JobEvent,
         keys: tuple[str, ...] = KEYS) -> JobRecord:
    return JobRecord(step, job_id, request, kind, event, 0, (0, 1), keys)


def _hit(step: int, keys: tuple[str, ...] = KEYS) -> LookupRecord:
    return LookupRecord(step, "c", 0, 8, load_ranges=((0, (0, 2)),), load_keys=keys)


FAILED_STORE = (_job(1, 0, "p", JobKind.STORE, JobEvent.SUBMITTED),
                _job(2, 0, "p", JobKind.STORE, JobEvent.FAILED))


# -- a failed store publishes nothing (C14) ----------------------------------------------
def test_a_hit_loading_a_failed_store_is_corruption() -> None:
    (found,) = lc.failed_store_unpublished(_trace(FAILED_STORE, (_hit(3),)), GEOMETRY)
    assert found.impact is Impact.CORRUPTION
    assert "loads g0c0, whose store job failed at step 2" in found


def test_a_failed_store_stored_again_or_not_loaded_holds() -> None:
    again = (*FAILED_STORE, _job(3, 1, "c", JobKind.STORE, JobEvent.SUBMITTED),
             _job(4, 1, "c", JobKind.STORE, JobEvent.COMPLETED))
    assert lc.failed_store_unpublished(_trace(again, (_hit(5),)), GEOMETRY) == []
    # ... but a lookup before the store completed again still reads the failed one.
    assert lc.failed_store_unpublished(_trace(again, (_hit(3),)), GEOMETRY)
    recompute = LookupRecord(3, "c", 0, 0)
    assert lc.failed_store_unpublished(_trace(FAILED_STORE, (recompute,)), GEOMETRY) == []
    # A lookup in the failure's own step may have preceded it: not judged.
    assert lc.failed_store_unpublished(_trace(FAILED_STORE, (_hit(2),)), GEOMETRY) == []
    completed = (_job(1, 0, "p", JobKind.STORE, JobEvent.SUBMITTED),
                 _job(2, 0, "p", JobKind.STORE, JobEvent.COMPLETED))
    assert lc.failed_store_unpublished(_trace(completed, (_hit(3),)), GEOMETRY) == []


# -- a failed load is never retried (C15) ------------------------------------------------
FAILED_LOAD = (_job(3, 4, "c", JobKind.LOAD, JobEvent.SUBMITTED),
               _job(4, 4, "c", JobKind.LOAD, JobEvent.FAILED))


def test_loading_a_failed_chunk_again_from_the_same_state_is_a_stall() -> None:
    lookups = (_hit(3), LookupRecord(4, "c", 0, 0), _hit(9))  # recompute, then (after a
    # preemption, say) the same chunks again
    (found,) = lc.failed_load_not_retried(_trace(FAILED_LOAD, lookups), GEOMETRY)
    assert found.impact is Impact.STALL
    assert "step 9: c loads g0c0 again, whose load failed at step 4" in found
    # The existing judge sees only the hit the request resumed with, not this one.
    assert lc.recovers_from_failed_load(_trace(FAILED_LOAD, lookups), GEOMETRY) == []


def test_waiting_on_a_failed_chunk_is_a_delay() -> None:
    waits = LookupRecord(5, "c", 0, None, (DeferCause.LOADING_ELSEWHERE,),
                         (WaitedChunk(0, 1, "g0c1", DeferCause.LOADING_ELSEWHERE),))
    (found,) = lc.failed_load_not_retried(
        _trace(FAILED_LOAD, (_hit(3), waits, LookupRecord(6, "c", 0, 0))), GEOMETRY)
    assert found.impact is Impact.DELAY and "waits on g0c1" in found
    # The tier's RETRY, or another request's load of the chunk, is another cause (C13).
    retry = LookupRecord(5, "c", 0, None, (DeferCause.RETRY,),
                         (WaitedChunk(0, 1, "g0c1", DeferCause.RETRY),))
    assert lc.failed_load_not_retried(_trace(FAILED_LOAD, (_hit(3), retry)), GEOMETRY) == []
    other = (*FAILED_LOAD, _job(5, 7, "d", JobKind.LOAD, JobEvent.SUBMITTED))
    assert lc.failed_load_not_retried(_trace(other, (_hit(3), waits)), GEOMETRY) == []


def test_recomputing_or_loading_fresh_bytes_after_a_failed_load_holds() -> None:
    assert lc.failed_load_not_retried(
        _trace(FAILED_LOAD, (_hit(3), LookupRecord(4, "c", 0, 0))), GEOMETRY) == []
    stored = (*FAILED_LOAD, _job(5, 6, "c", JobKind.STORE, JobEvent.SUBMITTED),
              _job(6, 6, "c", JobKind.STORE, JobEvent.COMPLETED))
    assert lc.failed_load_not_retried(
        _trace(stored, (_hit(3), LookupRecord(4, "c", 0, 0), _hit(9))), GEOMETRY) == []
    # Another request loading the chunks is not this request's retry.
    other = dataclasses.replace(_hit(9), request="d")
    assert lc.failed_load_not_retried(_trace(FAILED_LOAD, (_hit(3), other)), GEOMETRY) == []


# -- on the executable system -------------------------------------------------------------
def _seed(label: str) -> list[lc.LifecycleCase]:
    return [c for c in lc.lifecycle_cases(depth=0) if c.label == label]


@pytest.mark.parametrize("label", ["failed-store", "failed-load"])
def test_the_reference_holds_on_the_failed_transfer_seeds(label: str) -> None:
    for case in _seed(label):
        trace = run_program(case.geometry, REFERENCE, case.program(), case.config())
        assert any(j.event is JobEvent.FAILED for j in trace.jobs)
        # the resend looked up after the failure, and its hit loads nothing that failed
        assert any(r.request == "c" and r.answer is not None for r in trace.lookups)
        assert lc.failed_store_unpublished(trace, case.geometry) == []
        assert lc.failed_load_not_retried(trace, case.geometry) == []


def test_publish_failed_store_is_refuted_by_the_failed_store_seed() -> None:
    impl = get_implementation("publish-failed-store")
    prop = next(p for p in lc.lifecycle_properties()
                if p.theorem_id == "C14/failed-store-unpublished")
    assert isinstance(prop, lc.CaseProperty)
    for case in _seed("failed-store"):
        message = prop.check(case, impl)
        assert message is not None and "store job failed at step" in message
        assert prop.impact_of(message) is Impact.CORRUPTION
        assert prop.replay(prop.witness(case), impl) == message
        assert prop.check(case, REFERENCE) is None


def test_keeping_a_failed_loads_chunks_is_a_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    # The shape of a release whose recovery marks nothing bad (0.33.0 fed a failure
    # through the scheduler's failure API): the chunks stay in the manager and the
    # request's next hit loads them again.
    monkeypatch.setattr(offload.ChunkBook, "drop", lambda self, keys: [])
    (case, *_) = _seed("failed-load")
    trace = run_program(case.geometry, REFERENCE, case.program(), case.config())
    (found, *_) = lc.failed_load_not_retried(trace, case.geometry)
    assert "again, whose load failed" in found and found.impact is Impact.STALL
