"""Named scenarios on the live engine: the lifecycle only a real engine reaches, and the
two lost-hit findings of 0.31-0.34 confirmed on vLLM's own code.

Each scenario builds its engine, drives its trace and returns a :class:`ScenarioResult`:
the outcome (``clean``, or the exception vLLM raised: C2's crash), the numbers it
observed, and checks of those numbers against the spec (a check that fails is a
finding of the scenario, not an error of the run). A run that stopped on a gap of
kvcontract's own driver (:mod:`kvcontract.live.gaps`) is neither: its result is UNKNOWN
(``driver_gap``, no checks, C13-C15 UNKNOWN naming the gap). :data:`SCENARIOS` names
them for ``kvcontract live --scenario NAME`` and the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcontract.live.build import BuildOptions, Refused
from kvcontract.live.capabilities import has
from kvcontract.live.confirm import (
    Confirmation,
    _traces,
    confirm,
    confirm_case,
    end_to_end_case,
    options_for,
)
from kvcontract.live.gaps import DriverGapError
from kvcontract.live.lifecycle import judge, run_lifecycle
from kvcontract.live.observation import LiveObservation
from kvcontract.live.partial_tail import (
    PARTIAL_TAIL_GEOMETRY,
    run_partial_tail,
    run_partial_tail_being_loaded,
)
from kvcontract.live.trace import (
    Phase,
    Trace,
    TraceEvent,
    TraceRequest,
    producer_consumer,
    prompt_tokens,
)
from kvcontract.live.worker import Timing
from kvcontract.spec.geometry import Geometry, fa, mamba, swa
from kvcontract.spec.models import get_preset
from kvcontract.spec.properties.end_to_end import gpu_hit_unit, promised_hit
from kvcontract.vocabulary import Impact, Verdict

LIFECYCLE_GEOMETRY = Geometry((fa(16), swa(4, 8)))
"""FA bs 16 + SWA bs 4 (sw 8), retention None: a tail at every alignment boundary, so
stores happen during chunked prefill."""
STEP_TOKENS = 16
"""The lifecycle scenarios' chunked-prefill budget."""


@dataclass(frozen=True)
class Check:
    """One observed number against what the spec (or the scenario) expects."""

    what: str
    expected: Any
    observed: Any
    ok: bool


@dataclass(frozen=True)
class ClauseVerdict:
    """One lifecycle clause on one live run: ``TESTED`` (no judge found a violation on
    this trace: evidence, not a proof), ``COUNTEREXAMPLE`` (the judges' findings, worst
    impact first) or ``UNKNOWN`` (the run could not be judged: ``reason``)."""

    clause: str
    verdict: Verdict
    impact: Impact | None = None
    findings: tuple[str, ...] = ()
    """``judge: message`` of each violation."""
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"clause": self.clause, "verdict": self.verdict.value,
                "impact": None if self.impact is None else self.impact.value,
                "findings": list(self.findings), "reason": self.reason}


LIFECYCLE_CLAUSES = ("C13", "C14", "C15")


def judge_lifecycle(result: LiveObservation | Refused, geometry: Geometry,
                    ) -> list[ClauseVerdict]:
    """C13-C15's judges (:mod:`kvcontract.spec.properties.lifecycle`) on a run recorded
    by :func:`~kvcontract.live.lifecycle.run_lifecycle`; UNKNOWN naming why when it
    cannot be judged."""
    if isinstance(result, Refused):
        return [ClauseVerdict(c, Verdict.UNKNOWN, reason=f"vLLM refused the geometry: "
                              f"{result.reason}") for c in LIFECYCLE_CLAUSES]
    gap = result.driver_gap
    if gap is not None:
        return _unknown_clauses(gap.text())
    if result.lifecycle is None:
        return [ClauseVerdict(c, Verdict.UNKNOWN, reason="the run has no lifecycle record")
                for c in LIFECYCLE_CLAUSES]
    if result.lifecycle.recorder_errors:
        why = ("the lifecycle record is incomplete (the recorder failed: "
               f"{result.lifecycle.recorder_errors[0]})")
        return [ClauseVerdict(c, Verdict.UNKNOWN, reason=why) for c in LIFECYCLE_CLAUSES]
    found = judge(result, geometry)
    verdicts: list[ClauseVerdict] = []
    order = list(Impact)
    for clause in LIFECYCLE_CLAUSES:
        violations = [(name.split("/", 1)[1], v) for name, vs in found.items()
                      if name.startswith(clause + "/") for v in vs]
        if not violations:
            verdicts.append(ClauseVerdict(clause, Verdict.TESTED))
            continue
        violations.sort(key=lambda nv: order.index(nv[1].impact))
        verdicts.append(ClauseVerdict(clause, Verdict.COUNTEREXAMPLE, violations[0][1].impact,
                                      tuple(f"{n}: {v}" for n, v in violations)))
    return verdicts


@dataclass
class ScenarioResult:
    name: str
    description: str
    geometry: str
    outcome: str
    """``clean``, ``raised Type: message`` or ``refused: reason``."""
    numbers: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    observation: LiveObservation | None = None
    clauses: list[ClauseVerdict] = field(default_factory=list)
    """C13-C15 on the run (lifecycle scenarios)."""
    driver_gap: str | None = None
    """The run stopped on a gap of kvcontract's driver: the scenario is UNKNOWN."""

    @property
    def ok(self) -> bool:
        """Every check holds (False for an UNKNOWN result: nothing was checked)."""
        return self.driver_gap is None and all(check.ok for check in self.checks)

    @property
    def unknown(self) -> bool:
        """Nothing about vLLM was observed (a driver gap)."""
        return self.driver_gap is not None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": " ".join(self.description.split()),
                "geometry": self.geometry, "outcome": self.outcome, "ok": self.ok,
                "unknown": self.unknown, "driver_gap": self.driver_gap,
                "numbers": self.numbers,
                "checks": [vars(check) for check in self.checks],
                "clauses": [c.to_json() for c in self.clauses]}


def _unknown_clauses(why: str) -> list[ClauseVerdict]:
    return [ClauseVerdict(c, Verdict.UNKNOWN, reason=why) for c in LIFECYCLE_CLAUSES]


def _outcome(result: LiveObservation | Refused) -> str:
    if isinstance(result, Refused):
        return f"refused: {result.reason}"
    if result.driver_gap is not None:
        return f"driver gap: {result.driver_gap.text()}"
    if result.exceptions:
        first = result.exceptions[0]
        return f"raised {first.type}: {first.message}"
    return "clean"


def _result(name: str, description: str, geometry: Geometry,
            result: LiveObservation | Refused) -> ScenarioResult:
    observation = None if isinstance(result, Refused) else result
    found = ScenarioResult(name, description, geometry.describe(), _outcome(result),
                           observation=observation)
    if observation is not None and observation.driver_gap is not None:
        found.driver_gap = observation.driver_gap.text()
        found.clauses = judge_lifecycle(result, geometry)
        return found
    found.checks.append(Check("vLLM raised no exception", "clean", found.outcome,
                              found.outcome == "clean"))
    if observation is None or observation.lifecycle is not None:
        found.clauses = judge_lifecycle(result, geometry)
    return found


def _from_confirmation(name: str, description: str, confirmation: Confirmation,
                       geometry: Geometry) -> ScenarioResult:
    outcome = ("clean" if confirmation.raised is None and confirmation.refused is None
               else f"raised {confirmation.raised}" if confirmation.raised
               else f"refused: {confirmation.refused}")
    result = ScenarioResult(name, description, geometry.describe(), outcome,
                            numbers=confirmation.to_json(),
                            observation=confirmation.observation)
    result.checks.append(Check("vLLM raised no exception", "clean", outcome,
                               outcome == "clean"))
    return result


# -- the two findings ---------------------------------------------------------------------
def window_formula(prompt_len: int = 4500, bpc: int = 1) -> ScenarioResult:
    """Command R7B (Cohere2: vLLM's sw 4097), retention 0: a resend after the producer's
    stores completed. Upstream's window ``cdiv(sw, tpc)`` asks one chunk more than the
    store path keeps at the replay boundary, so the offloaded hit is lost."""
    geometry = get_preset("command-r7b").geometry(bpc)
    confirmation = confirm(geometry, prompt_len, "resend")
    result = _from_confirmation(
        "window-formula", "Command R7B (sw 4097), retention 0, resend: the window "
        "formula's lost hit", confirmation, geometry)
    result.checks.append(Check("the spec promises a hit (GPU floor > 0)", "> 0",
                               confirmation.gpu_promise, confirmation.gpu_promise > 0))
    result.numbers["confirmed"] = confirmation.verdict == "lost-hit"
    return result


def eagle_replay(prompt_len: int = 4100, bpc: int = 1,
                 preset: str = "gpt-oss-20b-eagle3") -> ScenarioResult:
    """GPT-OSS with an EAGLE-3 drafter, retention 0: the store path keeps ``P - 1``
    alone, not the GPU's EAGLE replay boundary, so the resend's offloaded hit is lost."""
    geometry = get_preset(preset).geometry(bpc)
    confirmation = confirm(geometry, prompt_len, "resend")
    result = _from_confirmation(
        "eagle-replay", f"{preset}, retention 0, resend: the EAGLE replay boundary's "
        "lost hit", confirmation, geometry)
    result.checks.append(Check("the spec promises a hit (GPU floor > 0)", "> 0",
                               confirmation.gpu_promise, confirmation.gpu_promise > 0))
    result.numbers["confirmed"] = confirmation.verdict == "lost-hit"
    return result


# -- lifecycle ------------------------------------------------------------------------------
def _resend(name: str, tokens: list[int]) -> TraceRequest:
    return TraceRequest(name, tuple(tokens), max_tokens=1)


def abort_queued() -> ScenarioResult:
    """One sequence at a time: a second request waits in the queue behind a running
    one and is aborted there. Nothing of it is looked up, loaded or stored."""
    geometry = LIFECYCLE_GEOMETRY
    first = TraceRequest("running", tuple(prompt_tokens(64)), max_tokens=4)
    queued = TraceRequest("queued", tuple(prompt_tokens(64, offset=10_000)), max_tokens=4,
                          abort_at=2)
    result_ = run_lifecycle(geometry, Trace((Phase((first, queued)),)),
                        BuildOptions(max_num_batched_tokens=STEP_TOKENS, max_num_seqs=1))
    result = _result("abort-queued", abort_queued.__doc__ or "", geometry, result_)
    if isinstance(result_, LiveObservation):
        outcome = result_.requests["queued"]
        result.numbers.update(status=outcome.status, scheduled=sum(outcome.scheduled),
                              stores=len([s for s in result_.stores
                                          if s.request == "queued"]))
        result.checks.append(Check("the queued request never ran", 0,
                                   sum(outcome.scheduled), not outcome.scheduled))
        result.checks.append(Check("it ends aborted", "FINISHED_ABORTED", outcome.status,
                                   outcome.status == "FINISHED_ABORTED"))
    return result


def _judge_case(result: ScenarioResult, case: Any, options: BuildOptions | None = None,
                timing: Timing | None = None) -> None:
    """C13-C15 on ``case``'s trace, run again through
    :func:`~kvcontract.live.lifecycle.run_lifecycle` (the confirmation's own run does not
    record the lifecycle): the same requests, timing and engine settings."""
    producer, consumer = _traces(case)
    run = run_lifecycle(case.geometry, producer_consumer(producer, consumer, timing=timing),
                        options_for(case, options))
    result.clauses = judge_lifecycle(run, case.geometry)


def _consumer_check(result: ScenarioResult, confirmation: Confirmation) -> None:
    result.checks.append(Check(
        "the consumer's hit is the spec's promise (C12: not below the GPU floor)",
        f">= {confirmation.gpu_promise}", confirmation.observed_hit,
        confirmation.verdict in ("as-promised", "more-than-promised")))


def abort_mid_prefill(prompt_len: int = 96, steps_run: int = 3) -> ScenarioResult:
    """A producer aborted after ``steps_run`` prefill steps of 16 tokens; its stores
    complete; a resend gets what the aborted producer owes (C9's real horizon, C12)."""
    case = end_to_end_case(LIFECYCLE_GEOMETRY, prompt_len, "resend",
                           steps=(STEP_TOKENS,) * steps_run, ending="aborted")
    confirmation = confirm_case(case)
    result = _from_confirmation("abort-mid-prefill", abort_mid_prefill.__doc__ or "",
                                confirmation, LIFECYCLE_GEOMETRY)
    _consumer_check(result, confirmation)
    _judge_case(result, case)
    return result


def abort_stores_in_flight(prompt_len: int = 96, steps_run: int = 3,
                           delay: int = 3) -> ScenarioResult:
    """As ``abort-mid-prefill``, with the worker finishing stores ``delay`` steps late:
    the abort finds store jobs in flight; they finish after it (no crash, no lost hit
    once they are done)."""
    case = end_to_end_case(LIFECYCLE_GEOMETRY, prompt_len, "resend",
                           steps=(STEP_TOKENS,) * steps_run, ending="aborted")
    timing = Timing("delayed", delay, "store")
    confirmation = confirm_case(case, timing=timing)
    result = _from_confirmation("abort-stores-in-flight",
                                abort_stores_in_flight.__doc__ or "", confirmation,
                                LIFECYCLE_GEOMETRY)
    observation = confirmation.observation
    if observation is not None:
        result.numbers["flushed_jobs"] = observation.flushed_jobs
    _consumer_check(result, confirmation)
    _judge_case(result, case, timing=timing)
    return result


def preemption(gpu_blocks: int = 20, prompt_len: int = 32,
               decode: int = 100) -> ScenarioResult:
    """Two requests whose decodes outgrow a small GPU pool (admission reserves only the
    prompt): vLLM preempts one (the connector flushes its store jobs) and re-admits it,
    and the re-admitted request looks its own offloaded chunks up again."""
    geometry = LIFECYCLE_GEOMETRY
    first = TraceRequest("first", tuple(prompt_tokens(prompt_len)), max_tokens=decode)
    second = TraceRequest("second", tuple(prompt_tokens(prompt_len, offset=10_000)),
                          max_tokens=decode)
    result_ = run_lifecycle(geometry, Trace((Phase((first, second), max_steps=400),)),
                        BuildOptions(max_num_batched_tokens=STEP_TOKENS,
                                     gpu_blocks=gpu_blocks,
                                     max_model_len=prompt_len + decode + 28))
    result = _result("preemption", preemption.__doc__ or "", geometry, result_)
    if isinstance(result_, LiveObservation):
        preempted = sum(o.preempted for o in result_.requests.values())
        statuses = {n: o.status for n, o in result_.requests.items()}
        lookups = {n: [(m.step, m.local_hit, m.external) for m in result_.matches
                       if m.request == n] for n in ("first", "second")}
        result.numbers.update(preempted=preempted, statuses=statuses,
                              flushed_jobs=result_.flushed_jobs, lookups=lookups,
                              steps=result_.steps)
        result.checks.append(Check("a request was preempted", ">= 1", preempted,
                                   preempted >= 1))
        result.checks.append(Check("both finish", "FINISHED_LENGTH_CAPPED", statuses,
                                   all(s == "FINISHED_LENGTH_CAPPED"
                                       for s in statuses.values())))
    return result


def prefix_cache_reset(prompt_len: int = 64, delay: int = 4) -> ScenarioResult:
    """A cache reset while a request runs (vLLM refuses it: blocks in use), then one
    (GPU and connector) after the producer finished with its stores still in flight
    (the worker finishes them ``delay`` steps late: the reset's fence); then a resend:
    the offloaded tier was emptied, so its hit is 0, and nothing crashes."""
    geometry = LIFECYCLE_GEOMETRY
    producer = TraceRequest("producer", tuple(prompt_tokens(prompt_len)), max_tokens=2)
    consumer = _resend("consumer", prompt_tokens(prompt_len))
    finish = -(-prompt_len // STEP_TOKENS) + 2  # prefill steps, one decode, final stores
    trace = Trace((Phase((producer,), events=(TraceEvent(1, "reset-all"),
                                              TraceEvent(finish, "reset-all")),
                         reset_prefix_cache_after=True),
                   Phase((consumer,))), Timing("delayed", delay, "store"))
    result_ = run_lifecycle(geometry, trace, BuildOptions(max_num_batched_tokens=STEP_TOKENS))
    result = _result("prefix-cache-reset", prefix_cache_reset.__doc__ or "", geometry,
                     result_)
    if isinstance(result_, LiveObservation):
        hit = result_.accepted_hit("consumer")
        result.numbers.update(resets=result_.resets, consumer_hit=hit,
                              flushed_jobs=result_.flushed_jobs,
                              stores=len(result_.stores))
        refused_running = [r for r in result_.resets if r[0] == 1]
        result.checks.append(Check("a reset while the request runs is refused", False,
                                   refused_running[0][2] if refused_running else None,
                                   bool(refused_running) and not refused_running[0][2]))
        result.checks.append(Check("after the reset the tier is empty: the resend's hit", 0,
                                   hit, hit == 0))
    return result


def stalled_store(prompt_len: int = 64, wait_steps: int = 40) -> ScenarioResult:
    """The worker never finishes the producer's stores (HIT_PENDING forever); a resend
    arrives: its lookup defers while the chunks it needs are pending. Counts the steps
    it stays deferred within ``wait_steps``."""
    geometry = LIFECYCLE_GEOMETRY
    producer = TraceRequest("producer", tuple(prompt_tokens(prompt_len)), max_tokens=1)
    consumer = _resend("consumer", prompt_tokens(prompt_len))
    trace = Trace((Phase((producer,), reset_prefix_cache_after=True, max_steps=20),
                   Phase((consumer,), max_steps=wait_steps)), Timing("never", 0, "store"))
    result_ = run_lifecycle(geometry, trace, BuildOptions(max_num_batched_tokens=STEP_TOKENS))
    result = _result("stalled-store", stalled_store.__doc__ or "", geometry, result_)
    if isinstance(result_, LiveObservation):
        outcome = result_.requests["consumer"]
        pending = sum(1 for a in result_.lookups
                      if a.request == "consumer" and a.result.name == "HIT_PENDING")
        result.numbers.update(deferred_steps=outcome.deferred_steps,
                              first_compute_step=outcome.first_compute_step,
                              pending_answers=pending, stalled_jobs=result_.stalled_jobs,
                              wait_steps=wait_steps)
        result.numbers.update(_deferral_numbers(result_, "consumer"))
        result.checks.append(Check("the lookup saw the pending chunks", "> 0", pending,
                                   pending > 0))
    return result


def _deferral_numbers(observation: LiveObservation, request: str) -> dict[str, Any]:
    """How long ``request``'s lookup stayed deferred in the trace, what it waited on,
    and whether vLLM decided it (a bound it enforces would show as a decision)."""
    log = observation.lifecycle
    if log is None:
        return {}
    decisions = [d for d in log.decisions if d.request == request]
    deferred = [d for d in decisions if d.deferred]
    decided = [d for d in decisions if not d.deferred]
    return {
        "deferred_lookups": len(deferred),
        "first_deferred_step": deferred[0].step if deferred else None,
        "last_deferred_step": deferred[-1].step if deferred else None,
        "trace_steps": observation.steps,
        "decided_at": decided[-1].step if decided and deferred
        and decided[-1].step > deferred[0].step else None,
        "bound_enforced": bool(deferred) and any(d.step > deferred[-1].step
                                                 for d in decided),
        "deferral_clock_set": all(d.clock_started for d in deferred) if deferred else None,
        "waited_on": sorted({w[3] for d in deferred for w in d.waited}
                            | ({"own-transfer"} if any(d.own_jobs for d in deferred)
                               else set())),
    }


def cpu_capacity_lru(capacity: int = 30, prompt_len: int = 64) -> ScenarioResult:
    """A CPU tier of ``capacity`` chunks and three producers with distinct prompts of
    ``prompt_len`` tokens (12 chunks each on the lifecycle geometry), one after the
    other: LRU evicts the oldest producer's chunks; a resend of the newest gets its
    promise, one of the oldest less."""
    geometry = LIFECYCLE_GEOMETRY
    prompts = {n: prompt_tokens(prompt_len, offset=1 + 10_000 * i)
               for i, n in enumerate(("a", "b", "c"))}
    phases = [Phase((TraceRequest(n, tuple(t), max_tokens=1),), reset_prefix_cache_after=True)
              for n, t in prompts.items()]
    phases.append(Phase((_resend("resend-c", prompts["c"]),), reset_prefix_cache_after=True))
    phases.append(Phase((_resend("resend-a", prompts["a"]),)))
    result_ = run_lifecycle(geometry, Trace(tuple(phases)),
                        BuildOptions(max_num_batched_tokens=prompt_len, cpu_chunks=capacity))
    result = _result("cpu-capacity-lru", cpu_capacity_lru.__doc__ or "", geometry, result_)
    if isinstance(result_, LiveObservation):
        case = end_to_end_case(geometry, prompt_len, "resend", decode=0)
        floor = promised_hit(geometry, case.producer, prompt_len, prompt_len,
                             unit=gpu_hit_unit(geometry))
        evicted = sum(s.evicted for s in result_.stores)
        refused = sum(1 for s in result_.stores if s.refused)
        hit_a, hit_c = result_.accepted_hit("resend-a"), result_.accepted_hit("resend-c")
        result.numbers.update(cpu_chunks=result_.cpu_chunks, evicted=evicted,
                              refused_stores=refused, hit_newest=hit_c, hit_oldest=hit_a,
                              promised=floor)
        result.checks.append(Check("LRU evicted chunks", "> 0", evicted, evicted > 0))
        result.checks.append(Check("the newest producer's resend gets its promise",
                                   floor, hit_c, hit_c is not None and hit_c >= floor))
        result.checks.append(Check("the oldest producer's resend gets less", f"< {floor}",
                                   hit_a, hit_a is not None and hit_a < floor))
    return result


def async_scheduler(prompt_len: int = 96) -> ScenarioResult:
    """vLLM's ``AsyncScheduler`` (which the CPU platform turns off; turned back on): a
    producer in chunked prefill of 16 tokens, then a resend, as under the plain
    scheduler: the consumer gets the promise."""
    case = end_to_end_case(LIFECYCLE_GEOMETRY, prompt_len, "resend",
                           steps=(STEP_TOKENS,) * (prompt_len // STEP_TOKENS))
    options = BuildOptions(async_scheduling=True)
    confirmation = confirm_case(case, options)
    result = _from_confirmation("async-scheduler", async_scheduler.__doc__ or "",
                                confirmation, LIFECYCLE_GEOMETRY)
    _consumer_check(result, confirmation)
    _judge_case(result, case, options)
    return result


# -- lifecycle on vLLM's own code, judged by C13-C15 (issue 21) ----------------------------
LIFECYCLE_PROMPT = 64
"""The lifecycle block's prompt: four chunked-prefill steps of :data:`STEP_TOKENS`."""


def _producer_then(consumers: tuple[Phase, ...], producer: TraceRequest,
                   timing: Timing) -> Trace:
    """``producer`` run to its end (the GPU prefix cache reset after it, the connector's
    tier kept), then the ``consumers`` phases."""
    return Trace((Phase((producer,), reset_prefix_cache_after=True), *consumers), timing)


def _lifecycle_numbers(result: ScenarioResult, observation: LiveObservation | Refused,
                       *names: str) -> None:
    if not isinstance(observation, LiveObservation):
        return
    log = observation.lifecycle
    for name in names:
        outcome = observation.requests.get(name)
        if outcome is not None:
            result.numbers[name] = {"status": outcome.status,
                                    "num_computed": outcome.num_computed,
                                    "reused_tokens": outcome.reused_tokens,
                                    "hit": observation.accepted_hit(name)}
    if log is not None:
        jobs = list(log.jobs.values())
        result.numbers["jobs"] = {
            "submitted": len(jobs), "completed": sum(j.completed is not None for j in jobs),
            "failed": sum(j.failed is not None for j in jobs),
            "cancelled": sum(j.dropped is not None for j in jobs),
            "open": len(log.end.open_jobs) if log.end else None,
            "flushed": sum(bool(j.flushed) for j in jobs)}
        if log.end is not None:
            result.numbers["end"] = {
                "pending_chunks": log.end.write_pending_chunks,
                "chunks_being_loaded": log.end.chunks_being_loaded,
                "waiting_for_remote_kv": list(log.end.waiting_for_remote_kv),
                "tracked": sorted(n for n, r in log.end.requests.items() if r.tracked)}


def _aborted_producer(name: str, doc: str, abort_at: int,
                      timing: Timing | None = None) -> ScenarioResult:
    geometry = LIFECYCLE_GEOMETRY
    producer = TraceRequest("producer", tuple(prompt_tokens(LIFECYCLE_PROMPT)),
                            max_tokens=64, abort_at=abort_at)
    consumer = _resend("consumer", prompt_tokens(LIFECYCLE_PROMPT))
    trace = _producer_then((Phase((consumer,)),), producer, timing or Timing())
    run = run_lifecycle(geometry, trace, BuildOptions(max_num_batched_tokens=STEP_TOKENS))
    result = _result(name, doc, geometry, run)
    _lifecycle_numbers(result, run, "producer", "consumer")
    if isinstance(run, LiveObservation):
        outcome = run.requests["producer"]
        result.checks.append(Check("the producer ends aborted", "FINISHED_ABORTED",
                                   outcome.status, outcome.status == "FINISHED_ABORTED"))
    return result


def abort_final_prefill() -> ScenarioResult:
    """A producer of 64 tokens in four prefill steps of 16 aborted right after its final
    prefill step (its first token sampled), then a resend."""
    steps = LIFECYCLE_PROMPT // STEP_TOKENS
    return _aborted_producer("abort-final-prefill", abort_final_prefill.__doc__ or "",
                             steps)


def abort_decode(decode_steps: int = 3) -> ScenarioResult:
    """A producer aborted after ``decode_steps`` decode steps past its prefill, then a
    resend."""
    steps = LIFECYCLE_PROMPT // STEP_TOKENS
    return _aborted_producer("abort-decode", abort_decode.__doc__ or "",
                             steps + decode_steps)


def abort_loads_in_flight(delay: int = 3) -> ScenarioResult:
    """A producer's chunks stored; a resend's load takes ``delay`` steps and the resend
    is aborted while it is in flight (vLLM's WAITING_FOR_REMOTE_KVS); then a second
    resend of the same prompt: it must be decided, not wait on the aborted load."""
    geometry = LIFECYCLE_GEOMETRY
    producer = TraceRequest("producer", tuple(prompt_tokens(LIFECYCLE_PROMPT)), max_tokens=1)
    aborted = TraceRequest("aborted", tuple(prompt_tokens(LIFECYCLE_PROMPT)), max_tokens=1,
                           abort_at=1)
    again = _resend("again", prompt_tokens(LIFECYCLE_PROMPT))
    trace = _producer_then((Phase((aborted,), reset_prefix_cache_after=True),
                            Phase((again,))), producer, Timing("delayed", delay, "load"))
    run = run_lifecycle(geometry, trace, BuildOptions(max_num_batched_tokens=STEP_TOKENS))
    result = _result("abort-loads-in-flight", abort_loads_in_flight.__doc__ or "",
                     geometry, run)
    _lifecycle_numbers(result, run, "aborted", "again")
    if isinstance(run, LiveObservation) and run.lifecycle is not None:
        loads = [j for j in run.lifecycle.jobs.values()
                 if j.kind == "load" and j.request == "aborted"]
        abort_step = (run.requests["aborted"].arrived or 0) + 1
        in_flight = any(j.submitted < abort_step and (j.completed is None
                                                      or j.completed >= abort_step)
                        for j in loads)
        result.checks.append(Check("the abort found the load in flight", True, in_flight,
                                   in_flight))
    return result


def abort_deferred(defer_steps: int = 3) -> ScenarioResult:
    """The producer's stores never finish; a resend defers on them and is aborted after
    ``defer_steps`` deferred steps: the abort ends its deferral, and the connector keeps
    nothing of it (no ``_req_status``, nothing counted as loading)."""
    geometry = LIFECYCLE_GEOMETRY
    producer = TraceRequest("producer", tuple(prompt_tokens(LIFECYCLE_PROMPT)), max_tokens=1)
    consumer = TraceRequest("consumer", tuple(prompt_tokens(LIFECYCLE_PROMPT)), max_tokens=1,
                            abort_at=defer_steps)
    trace = _producer_then((Phase((consumer,), max_steps=defer_steps + 5),), producer,
                           Timing("never", 0, "store"))
    run = run_lifecycle(geometry, trace, BuildOptions(max_num_batched_tokens=STEP_TOKENS))
    result = _result("abort-deferred", abort_deferred.__doc__ or "", geometry, run)
    _lifecycle_numbers(result, run, "consumer")
    if isinstance(run, LiveObservation) and run.lifecycle is not None:
        result.numbers.update(_deferral_numbers(run, "consumer"))
        end = run.lifecycle.end
        kept = end is not None and end.requests["consumer"].tracked
        result.checks.append(Check("the aborted request is released by the connector",
                                   False, kept, not kept))
    return result


def preemption_stores_in_flight(gpu_blocks: int = 20, prompt_len: int = 32,
                                decode: int = 100, delay: int = 200) -> ScenarioResult:
    """As ``preemption``, with stores finishing ``delay`` steps late (past the
    preemption), so a request is preempted with its stores in flight and re-admitted
    (vLLM #46014: ``assert not req_status.transfer_jobs``): the preemption flushes them
    (``jobs_to_flush``), or the re-admitted request's lookup waits on its own
    transfers."""
    geometry = LIFECYCLE_GEOMETRY
    first = TraceRequest("first", tuple(prompt_tokens(prompt_len)), max_tokens=decode)
    second = TraceRequest("second", tuple(prompt_tokens(prompt_len, offset=10_000)),
                          max_tokens=decode)
    run = run_lifecycle(geometry, Trace((Phase((first, second), max_steps=400),),
                                        Timing("delayed", delay, "store")),
                        BuildOptions(max_num_batched_tokens=STEP_TOKENS,
                                     gpu_blocks=gpu_blocks,
                                     max_model_len=prompt_len + decode + 28))
    result = _result("preemption-stores-in-flight",
                     preemption_stores_in_flight.__doc__ or "", geometry, run)
    _lifecycle_numbers(result, run, "first", "second")
    if isinstance(run, LiveObservation) and run.lifecycle is not None:
        preempted = sum(o.preempted for o in run.requests.values())
        own = [d for d in run.lifecycle.decisions if d.deferred and d.own_jobs]
        flushed = [j.job_id for j in run.lifecycle.jobs.values() if j.flushed]
        result.numbers.update(preempted=preempted, readmitted_waiting_on_own_jobs=len(own),
                              flushed_at_preemption=len(flushed))
        result.checks.append(Check("the preemption found stores in flight (flushed)",
                                   ">= 1", len(flushed), bool(flushed)))
        result.checks.append(Check("a request was preempted", ">= 1", preempted,
                                   preempted >= 1))
    return result


def _failed(name: str, doc: str, timing: Timing,
            policy: str | None = None) -> ScenarioResult:
    geometry = LIFECYCLE_GEOMETRY
    producer = TraceRequest("producer", tuple(prompt_tokens(LIFECYCLE_PROMPT)), max_tokens=1)
    consumer = _resend("consumer", prompt_tokens(LIFECYCLE_PROMPT))
    trace = _producer_then((Phase((consumer,), max_steps=40),), producer, timing)
    run = run_lifecycle(geometry, trace, BuildOptions(max_num_batched_tokens=STEP_TOKENS),
                        load_failure_policy=policy)
    result = _result(name, doc, geometry, run)
    _lifecycle_numbers(result, run, "producer", "consumer")
    if isinstance(run, LiveObservation) and run.lifecycle is not None:
        result.numbers["load_failures"] = [vars(f) for f in run.lifecycle.load_failures]
        if run.lifecycle.raised_in:
            result.numbers["raised_in"] = list(run.lifecycle.raised_in)
    return result


def failed_store() -> ScenarioResult:
    """The producer's first store fails in the worker: the failure is handed to the
    release's own offloading worker (``OffloadingConnectorWorker.get_finished``). A
    worker that reports failed transfers has the connector drop the store's chunks (the
    resend recomputes them); one that asserts every transfer succeeded raises."""
    return _failed("failed-store", failed_store.__doc__ or "",
                   Timing("worker-fail", 0, "store", count=1))


def failed_load() -> ScenarioResult:
    """The resend's load fails in the worker: the failure is handed to the release's own
    offloading worker (``OffloadingConnectorWorker.get_finished``). A worker that
    reports failed transfers hands it to the scheduler's failure API under the default
    ``kv_load_failure_policy`` (as ``failed-load-fail-policy``: whether the request
    recomputes); one that asserts every transfer succeeded raises (no recovery at all)."""
    result = _failed("failed-load", failed_load.__doc__ or "",
                     Timing("worker-fail", 0, "load", count=1))
    where = result.numbers.get("raised_in")
    if where:  # the release's worker raised on the failed load: no recovery at all
        result.clauses = [_with_finding(v, Impact.CRASH, "recovers-from-failed-load: the "
                                        f"release's worker raised on the failed load "
                                        f"({where[0]}): {result.outcome}")
                          if v.clause == "C15" else v for v in result.clauses]
    elif result.outcome == "clean":  # the release's worker reported it: the scheduler's turn
        _recomputes_check(result)
    return result


def failed_load_recompute() -> ScenarioResult:
    """The resend's first load reported failed through the scheduler's failure API
    (``failed_recving``, as a worker that supports failed transfers reports one) under
    ``kv_load_failure_policy="recompute"``: where the scheduler resumes it (for the SWA
    group, the whole window of the new boundary must be recomputed or loaded)."""
    result = _failed("failed-load-recompute", failed_load_recompute.__doc__ or "",
                     Timing("fail", 0, "load", count=1), policy="recompute")
    _recomputes_check(result)
    return result


def failed_load_fail_policy() -> ScenarioResult:
    """As ``failed-load-recompute`` under vLLM's default ``kv_load_failure_policy``
    (``fail``): whether the request recomputes or is failed with an error."""
    result = _failed("failed-load-fail-policy", failed_load_fail_policy.__doc__ or "",
                     Timing("fail", 0, "load", count=1))
    _recomputes_check(result)
    return result


SCHEDULER_FAILURE_PATH = ("the scheduler's failure API (failed_recving): reached only by a "
                          "worker that reports failed transfers; the release's offloading "
                          "worker asserts instead (failed-load)")
"""Where the ``fail``-timed load scenarios run on a release whose offloading worker
asserts every transfer succeeded: vLLM's scheduler code, fed a failure the installed
worker never reports."""

RELEASE_FAILURE_PATH = ("the scheduler's failure API (failed_recving): the release's own "
                        "offloading worker reports a failed load there (failed-load)")
"""The same where the release's worker reports failed transfers (capability
``failed-transfer-jobs``)."""


def failure_path() -> str:
    """How the installed release reaches the scheduler's failure API."""
    return RELEASE_FAILURE_PATH if has("failed-transfer-jobs") else SCHEDULER_FAILURE_PATH


def _recomputes_check(result: ScenarioResult) -> None:
    """C15 asks a failed load to leave the request recomputing where vLLM's
    ``kv_load_failure_policy`` says ``recompute``: a request vLLM fails with an error
    there is a finding of the scenario (the trace maps it to an abort, which the judges
    accept). Under ``fail`` (vLLM's default) failing the request with an error is what
    the policy documents: a check that says so, never a finding about vLLM."""
    result.numbers["reachable"] = failure_path()
    observation = result.observation
    if observation is None or "consumer" not in observation.requests:
        return
    status = observation.requests["consumer"].status
    policy = observation.lifecycle.load_failure_policy if observation.lifecycle else None
    result.numbers["load_failure_policy"] = policy
    if policy == "fail":
        # The policy's documented end (an error) or a recompute that ends normally; a
        # request the failure leaves waiting or running forever fails the check.
        ended = status in ("FINISHED_ERROR", "FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")
        result.checks.append(Check("after the failed load the request ends as "
                                   "kv_load_failure_policy='fail' documents (an error) or "
                                   "recomputes to its end (C15)",
                                   "FINISHED_ERROR or finished", status, ended))
        if status == "FINISHED_ERROR":
            result.numbers["note"] = FAIL_POLICY_NOTE
        return
    recomputes = status != "FINISHED_ERROR"
    result.checks.append(Check("after the failed load the request recomputes (C15)",
                               "not FINISHED_ERROR", status, recomputes))
    if not recomputes:
        result.clauses = [_with_finding(v, Impact.CRASH, "recomputes-after-failed-load: "
                                        f"under kv_load_failure_policy={policy!r} vLLM "
                                        "failed the request with an error "
                                        "(FINISHED_ERROR) instead of recomputing it")
                          if v.clause == "C15" else v for v in result.clauses]


FAIL_POLICY_NOTE = ("vLLM failed the request with an error (FINISHED_ERROR), as "
                    "kv_load_failure_policy='fail' (vLLM's default) documents: a transient "
                    "CPU load failure reaches the client as an error; "
                    "kv_load_failure_policy='recompute' recovers (failed-load-recompute)")


def _with_finding(verdict: ClauseVerdict, impact: Impact, finding: str) -> ClauseVerdict:
    """``verdict`` with one more finding of the scenario's own (worst impact first)."""
    order = list(Impact)
    worst = impact if verdict.impact is None or order.index(impact) < order.index(
        verdict.impact) else verdict.impact
    return ClauseVerdict(verdict.clause, Verdict.COUNTEREXAMPLE, worst,
                         (finding, *verdict.findings), verdict.reason)


# -- partial tails (the sub-chunk boundary since 0.33.0, docs/CONTRACT.md 9.2) -------------
def _partial_tail(name: str, doc: str, geometry: Geometry = PARTIAL_TAIL_GEOMETRY,
                  prompt_len: int = 230, consumer: str = "resend", *,
                  shared: int | None = None,
                  steps: tuple[int, ...] | None = None) -> ScenarioResult:
    """A producer/consumer trace through :func:`~kvcontract.live.partial_tail.run_partial_tail`,
    its checks those of the stated clauses (``PartialTailRun.checks``)."""
    run = run_partial_tail(geometry, prompt_len, consumer, shared=shared, steps=steps)
    if isinstance(run, Refused):
        return _result(name, doc, geometry, run)
    result = ScenarioResult(name, doc, geometry.describe(), _outcome(run.observation),
                            numbers=run.numbers(), observation=run.observation)
    result.checks.extend(Check(what, expected, observed, ok)
                         for what, expected, observed, ok in run.checks())
    return result


def partial_tail_resend() -> ScenarioResult:
    """FA + Mamba (bs 64, hashed in 16s), a producer of 230 tokens: its prompt ends past
    its last complete chunk (192), so vLLM stores a partial block at b(P) = 224 in both
    groups; the resend's hit is 224, its load reads the partial blocks back."""
    return _partial_tail("partial-tail-resend", partial_tail_resend.__doc__ or "")


def partial_tail_continuation() -> ScenarioResult:
    """As ``partial-tail-resend``, the consumer the producer's whole history and new
    tokens: its complete-chunk hit ends at 192, the partial tail serves 224."""
    return _partial_tail("partial-tail-continuation",
                         partial_tail_continuation.__doc__ or "", consumer="continuation")


def partial_tail_sibling() -> ScenarioResult:
    """A sibling sharing the producer's first 229 tokens (b(P) = 224 of them): 224."""
    return _partial_tail("partial-tail-sibling", partial_tail_sibling.__doc__ or "",
                         consumer="sibling")


def partial_tail_short_sibling() -> ScenarioResult:
    """A sibling sharing 220 tokens, fewer than b(P) = 224: the partial tail owes it
    nothing (its key hashes tokens the sibling does not have); the complete chunks do."""
    return _partial_tail("partial-tail-short-sibling",
                         partial_tail_short_sibling.__doc__ or "", consumer="sibling",
                         shared=220)


def partial_tail_chunked() -> ScenarioResult:
    """The producer in chunked-prefill steps of 64 tokens: vLLM still ends a step at
    b(P) = 224 and stores the partial tail; the resend gets 224."""
    return _partial_tail("partial-tail-chunked", partial_tail_chunked.__doc__ or "",
                         steps=(64, 64, 64, 38))


def partial_tail_off() -> ScenarioResult:
    """The same model hashed in blocks of 64 (the block): no boundary finer than a
    chunk, vLLM turns partial tails off, the resend's hit is the complete chunks' 192."""
    return _partial_tail("partial-tail-off", partial_tail_off.__doc__ or "",
                         Geometry((fa(64), mamba(64)), hash_block_size=64))


def partial_tail_being_loaded() -> ScenarioResult:
    """FA + Mamba (bs 64, hashed in 16s), P = 230: the complete chunks (192) in the GPU
    prefix cache, a resend loads the partial tail at b(P) = 224 (each load takes 3
    steps) and a second resend looks it up one step later, while that load is in
    flight: it must defer, not load a key being loaded (C2; vLLM 0.34.0 defers, 0.33.0
    loads it a second time), and both end with 224 tokens reused (C12)."""
    run = run_partial_tail_being_loaded()
    name = "partial-tail-being-loaded"
    doc = partial_tail_being_loaded.__doc__ or ""
    if isinstance(run, Refused):
        return _result(name, doc, PARTIAL_TAIL_GEOMETRY, run)
    result = ScenarioResult(name, doc, PARTIAL_TAIL_GEOMETRY.describe(),
                            _outcome(run.observation), numbers=run.numbers(),
                            observation=run.observation)
    result.checks.extend(Check(what, expected, observed, ok)
                         for what, expected, observed, ok in run.checks())
    return result


SCENARIOS: dict[str, Callable[[], ScenarioResult]] = {
    "window-formula": window_formula,
    "eagle-replay": eagle_replay,
    "abort-queued": abort_queued,
    "abort-mid-prefill": abort_mid_prefill,
    "abort-stores-in-flight": abort_stores_in_flight,
    "preemption": preemption,
    "prefix-cache-reset": prefix_cache_reset,
    "stalled-store": stalled_store,
    "cpu-capacity-lru": cpu_capacity_lru,
    "async-scheduler": async_scheduler,
    "abort-final-prefill": abort_final_prefill,
    "abort-decode": abort_decode,
    "abort-loads-in-flight": abort_loads_in_flight,
    "abort-deferred": abort_deferred,
    "preemption-stores-in-flight": preemption_stores_in_flight,
    "failed-store": failed_store,
    "failed-load": failed_load,
    "failed-load-recompute": failed_load_recompute,
    "failed-load-fail-policy": failed_load_fail_policy,
    "partial-tail-resend": partial_tail_resend,
    "partial-tail-continuation": partial_tail_continuation,
    "partial-tail-sibling": partial_tail_sibling,
    "partial-tail-short-sibling": partial_tail_short_sibling,
    "partial-tail-chunked": partial_tail_chunked,
    "partial-tail-off": partial_tail_off,
    "partial-tail-being-loaded": partial_tail_being_loaded,
}
"""Every named scenario (``kvcontract live --scenario NAME``)."""

FINDINGS = ("window-formula", "eagle-replay")
FAILURES = ("failed-store", "failed-load", "failed-load-recompute", "failed-load-fail-policy")
"""Lifecycle scenarios that inject a failed transfer: their outcome is what the release
does with it (a raise or a failed request is their finding, not an error of the run)."""
PARTIAL_TAILS = tuple(name for name in SCENARIOS if name.startswith("partial-tail-"))
"""Partial tails (since 0.33.0), judged by C2 and C12 at a sub-chunk boundary (not
lifecycle)."""
LIFECYCLE = tuple(name for name in SCENARIOS
                  if name not in FINDINGS + FAILURES + PARTIAL_TAILS)
LIFECYCLE_JUDGED = LIFECYCLE + FAILURES
"""Every scenario judged by C13-C15 (the audit's lifecycle rows)."""


def run_scenario(name: str) -> ScenarioResult:
    """Run the scenario ``name`` (KeyError naming the known ones otherwise). A run that
    stopped on a gap of kvcontract's driver is UNKNOWN: no checks, C13-C15 UNKNOWN."""
    if name not in SCENARIOS:
        raise KeyError(f"unknown live scenario {name!r}; known: {', '.join(SCENARIOS)}")
    function = SCENARIOS[name]
    try:
        result = function()
    except DriverGapError as exc:
        result = ScenarioResult(name, function.__doc__ or "", "", f"driver gap: {exc}",
                                driver_gap=str(exc))
    return _unknown_if_gap(result, name in LIFECYCLE_JUDGED)


def _unknown_if_gap(result: ScenarioResult, judged: bool) -> ScenarioResult:
    """``result`` made UNKNOWN when its run stopped on a driver gap: its checks read a
    run that says nothing about vLLM, so none is kept."""
    observation = result.observation
    if result.driver_gap is None and observation is not None and \
            observation.driver_gap is not None:
        result.driver_gap = observation.driver_gap.text()
        result.outcome = f"driver gap: {result.driver_gap}"
    if result.driver_gap is None:
        return result
    result.checks = []
    if judged or result.clauses:
        result.clauses = _unknown_clauses(result.driver_gap)
    return result
