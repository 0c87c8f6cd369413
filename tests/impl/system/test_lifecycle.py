"""The executable system's request lifecycle (C13-C15): deadline, abort, preemption,
failed loads, cache reset, and the trace it reports (kvcontract.impl.system.lifecycle)."""

from __future__ import annotations

import pytest

from kvcontract.errors import GeometryError, UsageError
from kvcontract.impl.system.engine import OffloadSystem, StoreJobError, SystemConfig
from kvcontract.impl.system.lifecycle import ProgramConfig, parse_operation, run_program
from kvcontract.impl.variants import REFERENCE, get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lifecycle import DeferCause, JobEvent, JobKind, RequestState
from kvcontract.vocabulary import LookupResult

GEOMETRY = Geometry((fa(4), swa(4, 8)))
STALLED = ["add p", "stall-store", "step", "add c", "step"]
"""The producer's first store job stalls; the consumer resends its prompt."""


def _lookups(trace: object, request: str) -> list[tuple[int, int | None, bool]]:
    return [(r.step, r.answer, r.by_deadline)
            for r in trace.lookups_of(request)]  # type: ignore[attr-defined]


def test_stalled_store_is_decided_at_the_deadline() -> None:
    trace = run_program(GEOMETRY, REFERENCE, STALLED)
    lookups = _lookups(trace, "c")
    # Deferred from step 2 (the chunks it needs are pending), decided D = 4 steps later
    # over the ready chunks: the full-attention prefix is pending, so it recomputes.
    assert lookups[0][:2] == (2, None)
    assert lookups[-1] == (6, 0, True)
    assert all(answer is None for _, answer, _ in lookups[:-1])
    first = trace.lookups_of("c")[0]
    assert DeferCause.HIT_PENDING in first.causes
    assert {w.key for w in first.waited_on} == {"g0c0", "g0c1"}
    assert trace.states_of("c")[-1].state is RequestState.FINISHED
    assert set(trace.stalled_keys) == {"g0c0", "g0c1"}


def test_without_a_bound_the_request_waits_forever() -> None:
    trace = run_program(GEOMETRY, REFERENCE, STALLED, ProgramConfig(deferral_bound=None))
    assert all(answer is None for _, answer, _ in _lookups(trace, "c"))
    assert "c" in trace.final.open_requests
    assert trace.deferral_bound is None


@pytest.mark.parametrize("variant", ["resetting-deadline", "no-deadline"])
def test_deadline_variants_never_decide(variant: str) -> None:
    trace = run_program(GEOMETRY, get_implementation(variant), STALLED)
    assert all(answer is None for _, answer, _ in _lookups(trace, "c"))
    assert len(_lookups(trace, "c")) == trace.steps - 1


def test_abort_before_scheduling_stores_nothing() -> None:
    trace = run_program(GEOMETRY, REFERENCE, ["add p", "abort p"])
    assert trace.exceptions == () and trace.jobs == ()
    assert [o.offered for o in trace.offers] == [(), ()]
    assert [s.state for s in trace.states] == [RequestState.WAITING, RequestState.ABORTED]


def test_abort_before_scheduling_crashes_the_defective_store_path() -> None:
    trace = run_program(GEOMETRY, get_implementation("abort-unscheduled-crash"),
                        ["add p", "abort p"])
    (error,) = trace.exceptions
    assert error.where == "abort" and error.type_name == "StoreJobError"
    assert "len(offload_keys) == len(offload_block_ids)" in error.message
    system = OffloadSystem(SystemConfig(GEOMETRY, get_implementation("abort-unscheduled-crash"),
                                        tensor_backed=False))
    system.add_request("p", list(range(17)))
    with pytest.raises(StoreJobError):
        system.abort("p")


def test_abort_while_loading_cancels_each_load_once() -> None:
    program = ["add p", "step", "step", "step", "add c", "step", "abort c"]
    trace = run_program(GEOMETRY, REFERENCE, program)
    loads = [j for j in trace.jobs if j.kind is JobKind.LOAD and j.request == "c"]
    submitted = {j.job_id for j in loads if j.event is JobEvent.SUBMITTED}
    cancelled = [j.job_id for j in loads if j.event is JobEvent.CANCELLED]
    assert submitted and sorted(cancelled) == sorted(submitted)
    assert not any(j.event is JobEvent.COMPLETED for j in loads)
    assert trace.final.referenced_keys == () and trace.final.loading_keys == ()
    assert trace.states_of("c")[-1].state is RequestState.ABORTED


def test_failed_load_recomputes_and_drops_the_failed_chunks() -> None:
    program = ["add p", "step", "step", "step", "fail-load", "add c", "step"]
    trace = run_program(GEOMETRY, REFERENCE, program)
    (recovery,) = trace.recoveries
    assert recovery.request == "c" and recovery.failed_keys
    # The failed chunks left the manager: the next lookup answers MISS for them, so the
    # request resumes at what is still on offer (here: nothing of the failed prefix).
    assert recovery.resumed_at == 0
    assert not set(recovery.resumed_keys) & set(recovery.failed_keys)
    states = [s.state for s in trace.states_of("c")]
    assert states[:4] == [RequestState.WAITING, RequestState.HIT_ACCEPTED,
                          RequestState.LOADING, RequestState.WAITING]
    assert states[-1] is RequestState.FINISHED
    assert trace.final.referenced_keys == ()


def test_failed_chunks_answer_miss_afterwards() -> None:
    system = OffloadSystem(SystemConfig(GEOMETRY, REFERENCE, tensor_backed=False,
                                        gpu_prefix_cache=False))
    tokens = [(7 * i + 3) % 50 for i in range(17)]
    system.add_request("p", tokens)
    for _ in range(6):
        system.step(64)
    system.fail_next_load()
    system.add_request("c", tokens)
    system.step(64)  # c's hit is accepted, its loads submitted
    assert system.manager.lookup(system.chunk_key(tokens, 0, 0)) is LookupResult.HIT
    system.drain()  # the loads end (one failed): c recovers, nothing recomputed yet
    assert any(line.startswith("recover c") for line in system.log)
    assert system.manager.lookup(system.chunk_key(tokens, 0, 0)) is LookupResult.MISS
    assert system.requests["c"].num_computed == 0


def test_preemption_with_a_store_in_flight_is_safe() -> None:
    program = ["add p", "step", "preempt p", "step", "add c", "step"]
    trace = run_program(GEOMETRY, REFERENCE, program)
    assert trace.exceptions == () and trace.final.stale_stores == ()
    states = [s.state for s in trace.states_of("p")]
    assert RequestState.PREEMPTED in states and RequestState.READMITTED in states
    assert states[-1] is RequestState.FINISHED


def test_cache_reset_keeps_chunks_a_load_holds() -> None:
    program = ["add p", "step", "step", "step", "add c", "step", "reset-cache", "step"]
    trace = run_program(GEOMETRY, REFERENCE, program)
    loads = [j for j in trace.jobs if j.kind is JobKind.LOAD]
    assert loads and all(j.event is not JobEvent.FAILED for j in loads)
    assert trace.exceptions == () and trace.final.referenced_keys == ()


def test_operations_are_checked() -> None:
    assert parse_operation("abort p") == ("abort", "p")
    assert parse_operation("step") == ("step", None)
    for bad in ("jump", "abort", "step 3", ""):
        with pytest.raises(UsageError):
            parse_operation(bad)
    with pytest.raises(GeometryError):
        SystemConfig(GEOMETRY, REFERENCE, deferral_bound=-1)


RETRIED = ["add p", "step", "step", "step", "retry-lookups", "step", "add c",
           *["step"] * 7]
"""The producer prefills, then the offload tier answers RETRY for ``RETRY_STEPS`` steps
while the consumer resends its prompt."""


def test_a_retried_lookup_is_decided_at_the_deadline() -> None:
    trace = run_program(GEOMETRY, REFERENCE, RETRIED)
    lookups = _lookups(trace, "c")
    first = trace.lookups_of("c")[0]
    assert first.answer is None and first.causes == (DeferCause.RETRY,)
    # Decided D steps after the first deferral, RETRY counting as missing: recompute.
    assert lookups[-1] == (lookups[0][0] + 4, 0, True)


def test_without_a_deadline_a_retried_lookup_waits_for_the_tier() -> None:
    trace = run_program(GEOMETRY, get_implementation("no-deadline"), RETRIED)
    lookups = _lookups(trace, "c")
    # Decided once the tier answers again (after RETRY_STEPS), with the stored hit.
    assert lookups[-1][1] == 16 and not lookups[-1][2]
    assert lookups[-1][0] - lookups[0][0] > 4


def test_retry_lookups_checks_its_argument() -> None:
    system = OffloadSystem(SystemConfig(GEOMETRY, REFERENCE, tensor_backed=False))
    with pytest.raises(UsageError, match="retry_lookups"):
        system.retry_lookups(-1)
    system.retry_lookups(2)
    assert system.retry_through == 2
