"""The request lifecycle on vLLM's own scheduler, judged by C13-C15 (issue 21, item 5).

Every assertion reads the run's own record (the lifecycle log of
:mod:`kvcontract.live.lifecycle`), never a number pasted from a run: which steps the
stalled consumer was deferred, which jobs ended how, what the scheduler did with a failed
load. The mapping to the core's vocabulary and the audit's UNKNOWN rows are checked
without vLLM too.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import pytest

from kvcontract.live.lifecycle import to_trace
from kvcontract.live.observation import (
    LifecycleLog,
    LiveObservation,
    LookupDecision,
    RequestOutcome,
    RequestSnapshot,
)
from kvcontract.live.scenarios import (
    FAIL_POLICY_NOTE,
    FAILURES,
    LIFECYCLE,
    LIFECYCLE_GEOMETRY,
    LIFECYCLE_JUDGED,
    ScenarioResult,
    judge_lifecycle,
    run_scenario,
)
from kvcontract.spec.lifecycle import RequestState, transition_allowed
from kvcontract.tools.audit.lifecycle_stage import (
    NOT_LIVE_NOTE,
    lifecycle_section,
    run_lifecycle_rows,
)
from kvcontract.vocabulary import Impact, Verdict
from tests.live.conftest import has, needs_vllm


@functools.cache
def scenario(name: str) -> ScenarioResult:
    """Each scenario run once per test session (vLLM's import is shared too)."""
    return run_scenario(name)


def verdict_of(result: ScenarioResult, clause: str) -> tuple[Verdict, Impact | None]:
    found = {c.clause: c for c in result.clauses}[clause]
    return found.verdict, found.impact


# -- without vLLM: the mapping and the audit's rows ---------------------------------------
def _snapshot(step: int, status: str, computed: int) -> RequestSnapshot:
    return RequestSnapshot(step, "r", status, computed, 32)


def _decision(step: int, answer: int | None, **causes: int) -> LookupDecision:
    return LookupDecision(step, "r", 0, answer, (), causes.get("pending", 0), 0, False,
                          answer is None,
                          tuple((0, 0, "k/g0", "hit-pending")
                                for _ in range(causes.get("pending", 0))))


def test_states_follow_the_lifecycle_through_defer_load_run_and_preemption() -> None:
    log = LifecycleLog(decisions=[_decision(0, None, pending=1), _decision(1, 16),
                                  _decision(5, 0)],
                       snapshots=[_snapshot(0, "WAITING", 0),
                                  _snapshot(1, "WAITING_FOR_REMOTE_KVS", 16),
                                  _snapshot(2, "RUNNING", 24), _snapshot(3, "RUNNING", 33),
                                  _snapshot(4, "PREEMPTED", 0), _snapshot(5, "RUNNING", 32),
                                  _snapshot(6, "FINISHED_LENGTH_CAPPED", 34),
                                  _snapshot(7, "FINISHED_LENGTH_CAPPED", 34)])
    observation = LiveObservation({}, "test", steps=8,
                                  requests={"r": RequestOutcome("r", arrived=0)},
                                  lifecycle=log)
    trace = to_trace(observation)
    states = [s.state for s in trace.states_of("r")]
    assert states == [RequestState.WAITING, RequestState.DEFERRED,
                      RequestState.HIT_ACCEPTED, RequestState.LOADING,
                      RequestState.RUNNING_PREFILL, RequestState.RUNNING_DECODE,
                      RequestState.PREEMPTED, RequestState.READMITTED,
                      RequestState.HIT_ACCEPTED, RequestState.RUNNING_DECODE,
                      RequestState.FINISHED]
    assert all(transition_allowed(a, b) for a, b in itertools.pairwise(states))
    deferred = trace.lookups_of("r")[0]
    assert deferred.answer is None and [c.value for c in deferred.causes] == ["hit-pending"]
    assert trace.lookups_of("r")[1].answer == 16  # local hit 0 + 16 external tokens


def test_a_run_without_a_lifecycle_record_is_refused() -> None:
    with pytest.raises(ValueError, match="run_lifecycle"):
        to_trace(LiveObservation({}, "test"))


def test_an_incomplete_record_is_unknown_never_a_pass() -> None:
    log = LifecycleLog(recorder_errors=["jobs at step 3: KeyError: 7"])
    observation = LiveObservation({}, "test", lifecycle=log)
    verdicts = judge_lifecycle(observation, LIFECYCLE_GEOMETRY)
    assert [v.verdict for v in verdicts] == [Verdict.UNKNOWN] * 3
    assert all("KeyError" in v.reason for v in verdicts)
    assert any("incomplete" in note for note in to_trace(observation).notes)


def test_the_audit_names_what_it_cannot_check() -> None:
    report: dict[str, object] = {"target": "builtin:reference", "notes": []}
    lifecycle_section(report, live=False)
    assert report["notes"] == [NOT_LIVE_NOTE]
    section = run_lifecycle_rows({"target": "builtin:reference"})
    rows = section["rows"]
    assert [r["clause"] for r in rows] == ["C13", "C14", "C15"]
    assert {r["verdict"] for r in rows} == {"UNKNOWN"}
    assert all(r["why"] for r in rows)


# -- on vLLM ----------------------------------------------------------------------------
@needs_vllm
def test_stalled_store_defers_every_step_after_the_store_and_is_a_stall() -> None:
    result = scenario("stalled-store")
    observation = result.observation
    assert observation is not None and observation.lifecycle is not None
    log = observation.lifecycle
    stores = [j for j in log.jobs.values() if j.kind == "store"]
    assert stores and all(not j.ended for j in stores)  # the worker never reports them
    arrived = observation.requests["consumer"].arrived
    assert arrived is not None and arrived > max(j.submitted for j in stores)
    deferred = log.deferred_steps("consumer")
    assert deferred == list(range(arrived, observation.steps))  # every step, to the end
    assert not [d for d in log.decisions if d.request == "consumer" and not d.deferred]
    assert all(d.clock_started and d.pending_chunks for d in log.decisions
               if d.request == "consumer")
    verdict, impact = verdict_of(result, "C13")
    assert (verdict, impact) == (Verdict.COUNTEREXAMPLE, Impact.STALL)
    finding = {c.clause: c for c in result.clauses}["C13"].findings[0]
    assert f"{len(deferred)} lookups" in finding
    assert result.numbers["deferred_lookups"] == len(deferred)
    assert result.numbers["bound_enforced"] is False


@needs_vllm
@pytest.mark.parametrize("name", ["abort-queued", "abort-final-prefill", "abort-decode",
                                  "abort-loads-in-flight"])
def test_aborts_are_clean_and_every_job_ends_once(name: str) -> None:
    result = scenario(name)
    assert result.outcome == "clean"
    observation = result.observation
    assert observation is not None and observation.lifecycle is not None
    log = observation.lifecycle
    assert all(j.ended and j.reported.count(j.completed) <= 1 for j in log.jobs.values())
    assert log.end is not None and not log.end.open_jobs
    assert not log.end.pending_keys and not log.end.loading_keys
    assert [verdict_of(result, c)[0] for c in ("C13", "C14", "C15")] == [Verdict.TESTED] * 3


@needs_vllm
def test_abort_with_a_load_in_flight_leaves_nothing_loading() -> None:
    result = scenario("abort-loads-in-flight")
    observation = result.observation
    assert observation is not None and observation.lifecycle is not None
    loads = [j for j in observation.lifecycle.jobs.values()
             if j.kind == "load" and j.request == "aborted"]
    aborted_at = (observation.requests["aborted"].arrived or 0) + 1
    assert any(j.submitted < aborted_at and j.completed is not None
               and j.completed >= aborted_at for j in loads)
    assert observation.accepted_hit("again") is not None  # decided, not left waiting


@needs_vllm
def test_preemption_flushes_the_stores_in_flight() -> None:
    result = scenario("preemption-stores-in-flight")
    observation = result.observation
    assert observation is not None and observation.lifecycle is not None
    log = observation.lifecycle
    flushed = [j for j in log.jobs.values() if j.flushed]
    assert flushed and all(j.completed == j.flushed[0] for j in flushed)
    assert not [d for d in log.decisions if d.deferred and d.own_jobs]
    assert verdict_of(result, "C14")[0] is Verdict.TESTED


@needs_vllm
def test_a_failed_load_in_the_release_worker() -> None:
    """Where the release's worker reports failed transfers, the failure reaches the
    scheduler's failure API and its default policy (``fail``) fails the request with an
    error, as the policy documents: no finding, a note; where the worker asserts every
    transfer succeeded, the step raises there and nothing recovers (a crash)."""
    result = scenario("failed-load")
    observation = result.observation
    assert observation is not None and observation.lifecycle is not None
    if has("failed-transfer-jobs"):
        assert observation.lifecycle.load_failure_policy == "fail"
        assert verdict_of(result, "C15")[0] is Verdict.TESTED
        assert "kv_load_failure_policy='fail'" in result.numbers["note"]
        assert result.outcome == "clean"
        failed = [j for j in observation.lifecycle.jobs.values() if j.failed is not None]
        assert [(j.kind, j.request) for j in failed] == [("load", "consumer")]
        assert observation.lifecycle.load_failures[0].request == "consumer"
        assert observation.requests["consumer"].status == "FINISHED_ERROR"
        assert "release's own offloading worker" in result.numbers["reachable"]
        assert verdict_of(result, "C14")[0] is Verdict.TESTED
    else:
        assert result.outcome.startswith("raised AssertionError")
        assert result.numbers["raised_in"][0].endswith("get_finished")
        assert verdict_of(result, "C14") == (Verdict.COUNTEREXAMPLE, Impact.CRASH)
        assert verdict_of(result, "C15") == (Verdict.COUNTEREXAMPLE, Impact.CRASH)


@needs_vllm
def test_a_failed_store_in_the_release_worker() -> None:
    """Where the release's worker reports failed transfers, the connector drops the
    failed store's chunks (nothing pending, the resend recomputes what they held);
    where it asserts, the step raises."""
    result = scenario("failed-store")
    observation = result.observation
    assert observation is not None and observation.lifecycle is not None
    if has("failed-transfer-jobs"):
        assert result.outcome == "clean"
        failed = [j for j in observation.lifecycle.jobs.values() if j.failed is not None]
        assert [(j.kind, j.request) for j in failed] == [("store", "producer")]
        end = observation.lifecycle.end
        assert end is not None and not end.pending_keys and not end.open_jobs
        assert observation.accepted_hit("consumer") == 0  # its first chunk was dropped
        assert [c.verdict for c in result.clauses] == [Verdict.TESTED] * 3
    else:
        assert result.outcome.startswith("raised AssertionError")
        assert verdict_of(result, "C14") == (Verdict.COUNTEREXAMPLE, Impact.CRASH)


@needs_vllm
def test_the_recompute_policy_restarts_the_request_from_token_zero() -> None:
    """Under ``recompute`` the request is looked up again from token 0; where the
    release marks a request whose load failed (``load_failed``), that lookup skips the
    offloaded tier (hit 0: the failure is not retried); where it does not, it loads the
    same chunks again from the manager's unchanged state (C15's stall)."""
    result = scenario("failed-load-recompute")
    observation = result.observation
    assert observation is not None and observation.lifecycle is not None
    failure = observation.lifecycle.load_failures[0]
    assert failure.num_computed_before > 0 and failure.num_computed_after == 0
    after = [d for d in observation.lifecycle.decisions
             if d.request == "consumer" and d.step > failure.step]
    assert after and after[0].local_hit == 0  # looked up again from token 0
    assert observation.requests["consumer"].status == "FINISHED_LENGTH_CAPPED"
    if has("load-failed-flag"):
        assert after[0].answer == 0
        assert verdict_of(result, "C15")[0] is Verdict.TESTED
    else:
        assert after[-1].answer == failure.num_computed_before
        assert verdict_of(result, "C15") == (Verdict.COUNTEREXAMPLE, Impact.STALL)
        # the failed load retried: the keys its next hit loads are the failed ones
        c15 = {c.clause: c for c in result.clauses}["C15"]
        assert any(f.startswith("failed-load-not-retried: ") and " again, whose load failed"
                   in f for f in c15.findings), c15.findings


@needs_vllm
def test_the_default_policy_fails_the_request_as_documented() -> None:
    """vLLM's default ``kv_load_failure_policy`` is ``fail``: the request ends with an
    error, which the policy documents; C15 (recovery) holds and the row says what the
    client sees."""
    result = scenario("failed-load-fail-policy")
    observation = result.observation
    assert observation is not None and observation.lifecycle is not None
    assert observation.lifecycle.load_failure_policy == "fail"
    assert observation.requests["consumer"].status == "FINISHED_ERROR"
    assert verdict_of(result, "C15")[0] is Verdict.TESTED
    assert result.numbers["note"] == FAIL_POLICY_NOTE
    assert [c.ok for c in result.checks if "kv_load_failure_policy" in c.what] == [True]


@needs_vllm
def test_a_request_failed_under_the_recompute_policy_is_a_crash(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``recompute`` a request vLLM fails with an error is C15's finding: the
    scheduler's recovery is asked for and not given (vLLM's flag forced off under the
    policy's name, as a release that ignores the policy would)."""
    from kvcontract.live import lifecycle

    def ignore_policy(engine: Any, policy: str) -> None:
        engine.vllm_config.kv_transfer_config.kv_load_failure_policy = policy
        engine.scheduler.recompute_kv_load_failures = False

    monkeypatch.setattr(lifecycle, "_set_load_failure_policy", ignore_policy)
    result = run_scenario("failed-load-recompute")  # not the cached, unpatched run
    observation = result.observation
    assert observation is not None and observation.lifecycle is not None
    assert observation.lifecycle.load_failure_policy == "recompute"
    assert observation.requests["consumer"].status == "FINISHED_ERROR"
    assert verdict_of(result, "C15") == (Verdict.COUNTEREXAMPLE, Impact.CRASH)
    c15 = {c.clause: c for c in result.clauses}["C15"]
    assert "kv_load_failure_policy='recompute'" in c15.findings[0]


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("name", LIFECYCLE_JUDGED)
def test_every_lifecycle_scenario_is_judged(name: str) -> None:
    result = scenario(name)
    assert [c.clause for c in result.clauses] == ["C13", "C14", "C15"]
    assert all(c.verdict is not Verdict.UNKNOWN for c in result.clauses)
    if name in LIFECYCLE and name != "stalled-store":
        assert all(c.verdict is Verdict.TESTED for c in result.clauses), result.clauses
    # a failure the release handles (it drops a failed store, never retries a failed
    # load) is no finding; the others are
    handled = {"failed-load-fail-policy"}
    if has("failed-transfer-jobs"):
        handled |= {"failed-load"}
        if has("load-failed-flag"):
            handled |= {"failed-store", "failed-load-recompute"}
    if name in FAILURES:
        assert any(c.verdict is Verdict.COUNTEREXAMPLE for c in result.clauses) == (
            name not in handled), result.clauses


@needs_vllm
@pytest.mark.slow
def test_audit_rows_for_the_installed_release() -> None:
    section = run_lifecycle_rows({"target": "vllm:installed"})
    rows = section["rows"]
    assert {r["scenario"] for r in rows} == set(LIFECYCLE_JUDGED)
    stall = [r for r in rows if r["scenario"] == "stalled-store" and r["clause"] == "C13"]
    assert stall[0]["impact"] == "stall" and stall[0]["live"].startswith("confirmed live")


@needs_vllm
def test_an_abort_ends_a_deferral_and_releases_the_request() -> None:
    result = scenario("abort-deferred")
    observation = result.observation
    assert observation is not None and observation.lifecycle is not None
    log = observation.lifecycle
    arrived = observation.requests["consumer"].arrived
    assert arrived is not None
    deferred = log.deferred_steps("consumer")
    assert deferred and deferred[0] == arrived
    aborted = [s.step for s in log.snapshots
               if s.request == "consumer" and s.status == "FINISHED_ABORTED"]
    assert aborted and max(deferred) < aborted[0]  # no lookup after the abort
    assert log.end is not None and not log.end.requests["consumer"].tracked
    assert verdict_of(result, "C14")[0] is Verdict.TESTED
