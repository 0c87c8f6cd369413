"""Named scenarios on the live engine: the lifecycle only a real engine reaches, and the
two lost-hit findings of 0.31-0.33 confirmed on vLLM's own code.

Each scenario builds its engine, drives its trace and returns a :class:`ScenarioResult`:
the outcome (``clean``, or the exception vLLM raised: C2's crash), the numbers it
observed, and checks of those numbers against the spec (a check that fails is a
finding of the scenario, not an error of the run). :data:`SCENARIOS` names them for
``kvcontract live --scenario NAME`` and the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcontract.live.build import BuildOptions, Refused
from kvcontract.live.confirm import Confirmation, confirm, confirm_case, end_to_end_case
from kvcontract.live.observation import LiveObservation
from kvcontract.live.run import run_trace
from kvcontract.live.trace import (
    Phase,
    Trace,
    TraceEvent,
    TraceRequest,
    prompt_tokens,
)
from kvcontract.live.worker import Timing
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.models import get_preset
from kvcontract.spec.properties.end_to_end import gpu_hit_unit, promised_hit

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

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": " ".join(self.description.split()),
                "geometry": self.geometry, "outcome": self.outcome, "ok": self.ok,
                "numbers": self.numbers,
                "checks": [vars(check) for check in self.checks]}


def _outcome(result: LiveObservation | Refused) -> str:
    if isinstance(result, Refused):
        return f"refused: {result.reason}"
    if result.exceptions:
        first = result.exceptions[0]
        return f"raised {first.type}: {first.message}"
    return "clean"


def _result(name: str, description: str, geometry: Geometry,
            result: LiveObservation | Refused) -> ScenarioResult:
    observation = None if isinstance(result, Refused) else result
    found = ScenarioResult(name, description, geometry.describe(), _outcome(result),
                           observation=observation)
    found.checks.append(Check("vLLM raised no exception", "clean", found.outcome,
                              found.outcome == "clean"))
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
    result_ = run_trace(geometry, Trace((Phase((first, queued)),)),
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
    return result


def abort_stores_in_flight(prompt_len: int = 96, steps_run: int = 3,
                           delay: int = 3) -> ScenarioResult:
    """As ``abort-mid-prefill``, with the worker finishing stores ``delay`` steps late:
    the abort finds store jobs in flight; they finish after it (no crash, no lost hit
    once they are done)."""
    case = end_to_end_case(LIFECYCLE_GEOMETRY, prompt_len, "resend",
                           steps=(STEP_TOKENS,) * steps_run, ending="aborted")
    confirmation = confirm_case(case, timing=Timing("delayed", delay, "store"))
    result = _from_confirmation("abort-stores-in-flight",
                                abort_stores_in_flight.__doc__ or "", confirmation,
                                LIFECYCLE_GEOMETRY)
    observation = confirmation.observation
    if observation is not None:
        result.numbers["flushed_jobs"] = observation.flushed_jobs
    _consumer_check(result, confirmation)
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
    result_ = run_trace(geometry, Trace((Phase((first, second), max_steps=400),)),
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
    result_ = run_trace(geometry, trace, BuildOptions(max_num_batched_tokens=STEP_TOKENS))
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
    result_ = run_trace(geometry, trace, BuildOptions(max_num_batched_tokens=STEP_TOKENS))
    result = _result("stalled-store", stalled_store.__doc__ or "", geometry, result_)
    if isinstance(result_, LiveObservation):
        outcome = result_.requests["consumer"]
        pending = sum(1 for a in result_.lookups
                      if a.request == "consumer" and a.result.name == "HIT_PENDING")
        result.numbers.update(deferred_steps=outcome.deferred_steps,
                              first_compute_step=outcome.first_compute_step,
                              pending_answers=pending, stalled_jobs=result_.stalled_jobs,
                              wait_steps=wait_steps)
        result.checks.append(Check("the lookup saw the pending chunks", "> 0", pending,
                                   pending > 0))
    return result


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
    result_ = run_trace(geometry, Trace(tuple(phases)),
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
    confirmation = confirm_case(case, BuildOptions(async_scheduling=True))
    result = _from_confirmation("async-scheduler", async_scheduler.__doc__ or "",
                                confirmation, LIFECYCLE_GEOMETRY)
    _consumer_check(result, confirmation)
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
}
"""Every named scenario (``kvcontract live --scenario NAME``)."""

FINDINGS = ("window-formula", "eagle-replay")
LIFECYCLE = tuple(name for name in SCENARIOS if name not in FINDINGS)


def run_scenario(name: str) -> ScenarioResult:
    """Run the scenario ``name`` (KeyError naming the known ones otherwise)."""
    if name not in SCENARIOS:
        raise KeyError(f"unknown live scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name]()
