"""Lifecycle programs on the executable system, reported as a ``LifecycleTrace``.

Contract: :func:`run_program` builds an :class:`~.engine.OffloadSystem` (mocked bytes:
the lifecycle is bookkeeping) over a geometry and an
:class:`~kvcontract.impl.bundle.Implementation`, runs a short program of lifecycle
operations (:data:`OPERATIONS`) and a fixed tail of scheduler steps, completes every job
that can complete, and returns what happened in the words of
:mod:`kvcontract.spec.lifecycle`, mapped from the system's lifecycle events
(:meth:`~.engine.OffloadSystem.subscribe_lifecycle`) by :class:`TraceRecorder`. It
judges nothing (the judges are :mod:`kvcontract.spec.properties.lifecycle`). An
operation that raises ends the program, as an engine-fatal error ends vLLM's engine:
the exception is a record of the trace.

Every request of a program has the same prompt (a resend: the second request's hit is
what the first one stored), so a program's chunks name the same keys across requests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from kvcontract.errors import UsageError
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.system.engine import OffloadSystem, SystemConfig
from kvcontract.impl.system.events import (
    DecisionEvent,
    DeferralEvent,
    Event,
    LifecycleEvent,
    LoadCrashEvent,
    RecoveryEvent,
    StateEvent,
    StoreOfferEvent,
    TransferEvent,
)
from kvcontract.spec.geometry import Geometry
from kvcontract.spec.lifecycle import (
    ExceptionRecord,
    FinalState,
    JobRecord,
    LifecycleTrace,
    LookupRecord,
    RecoveryRecord,
    RequestState,
    StaleStore,
    StateRecord,
    StoreOfferRecord,
    WaitedChunk,
)

OPERATIONS = ("step", "add", "abort", "preempt", "finish", "error", "stall-store",
              "fail-store", "fail-load", "reset-cache", "retry-lookups")
"""A program's operations: ``step`` (one scheduler step), ``add NAME``, ``abort NAME``,
``preempt NAME``, ``finish NAME``, ``error NAME`` (a running request finishes with an
error wherever its prefill is: vLLM's ``FINISHED_ERROR``), and the environment's
faults: ``stall-store`` (the
next store job never completes), ``fail-store`` (the next store job fails),
``fail-load`` (the next load job fails), ``reset-cache`` (GPU and offload prefix caches
dropped, but for what jobs in flight hold), ``retry-lookups`` (the offload tier answers
RETRY to every lookup for longer than the deferral bound)."""

_NAMED = frozenset({"add", "abort", "preempt", "finish", "error"})

FATAL_NOTE = "the program ended at the exception (engine-fatal)"
"""A trace's note when an operation raised: what the judges see stops there."""


@dataclass(frozen=True)
class ProgramConfig:
    """The fixed part of every program of a scope."""

    prompt_len: int = 17
    max_new_tokens: int = 2
    token_budget: int = 8
    """Tokens per scheduler step: the producer's prompt prefills over three steps, so an
    abort or a preemption can land mid-prefill, after the final prefill step or during
    decode."""
    tail_steps: int = 8
    """Steps run after the program (more than the bound, so a deadline can fire)."""
    deferral_bound: int | None = 4
    delay_steps: int = 1
    capacity_chunks: int = 64
    gpu_prefix_cache: bool = False
    """Off by default: every hit of a resend is the offload's, so its lifecycle shows."""


def parse_operation(text: str) -> tuple[str, str | None]:
    """``"abort p"`` -> ``("abort", "p")``; raises UsageError naming a bad operation."""
    words = text.split()
    if not words or words[0] not in OPERATIONS:
        raise UsageError(f"unknown lifecycle operation {text!r}; choose from "
                         f"{', '.join(OPERATIONS)}")
    verb = words[0]
    if verb in _NAMED:
        if len(words) != 2:
            raise UsageError(f"lifecycle operation {text!r} needs one request name")
        return verb, words[1]
    if len(words) != 1:
        raise UsageError(f"lifecycle operation {text!r} takes no argument")
    return verb, None


def prompt_tokens(length: int) -> list[int]:
    """The prompt every request of a program sends (deterministic, vocab 50)."""
    return [(7 * i + 3) % 50 for i in range(length)]


@dataclass
class TraceRecorder:
    """Maps the system's lifecycle events to the records of a ``LifecycleTrace``."""

    lookups: list[LookupRecord] = field(default_factory=list)
    jobs: list[JobRecord] = field(default_factory=list)
    states: list[StateRecord] = field(default_factory=list)
    exceptions: list[ExceptionRecord] = field(default_factory=list)
    offers: list[StoreOfferRecord] = field(default_factory=list)
    recoveries: list[RecoveryRecord] = field(default_factory=list)
    stale: list[StaleStore] = field(default_factory=list)
    _open_recovery: dict[str, int] = field(default_factory=dict)
    """Request -> index in ``recoveries`` of a recovery not resumed yet."""
    _last_decision: dict[str, DecisionEvent] = field(default_factory=dict)
    step: int = 0

    def __call__(self, event: LifecycleEvent) -> None:
        if isinstance(event, StateEvent):
            self.states.append(StateRecord(event.step, event.request, event.state,
                                           event.num_computed))
            self._maybe_resumed(event)
        elif isinstance(event, DeferralEvent):
            self.lookups.append(LookupRecord(
                event.step, event.request, event.local_hit, None, event.causes,
                tuple(WaitedChunk(g, k, key, cause) for g, k, key, cause in event.waited_on)))
        elif isinstance(event, DecisionEvent):
            self.lookups.append(LookupRecord(
                event.step, event.request, event.local_hit, event.hit, (), (),
                event.load_ranges, event.by_deadline, event.load_keys))
            self._last_decision[event.request] = event
        elif isinstance(event, TransferEvent):
            self.jobs.append(JobRecord(event.step, event.job_id, event.request, event.kind,
                                       event.event, event.group, event.chunks, event.keys))
            self.stale.extend(StaleStore(event.step, event.request, event.job_id, event.group,
                                         block, reason) for block, reason in event.stale)
        elif isinstance(event, StoreOfferEvent):
            self.offers.append(StoreOfferRecord(event.step, event.request, event.group,
                                                event.status.value, event.num_computed,
                                                event.offered))
        elif isinstance(event, RecoveryEvent):
            self._last_decision.pop(event.request, None)
            self._open_recovery[event.request] = len(self.recoveries)
            self.recoveries.append(RecoveryRecord(
                event.step, event.request, event.local_hit, event.hit, event.failed,
                event.failed_keys, None))

    def _maybe_resumed(self, event: StateEvent) -> None:
        index = self._open_recovery.get(event.request)
        if index is None or event.state not in (RequestState.RUNNING_PREFILL,
                                                RequestState.RUNNING_DECODE):
            return
        del self._open_recovery[event.request]
        decision = self._last_decision.get(event.request)
        self.recoveries[index] = replace(
            self.recoveries[index], resumed_at=event.num_computed,
            resumed_load_ranges=() if decision is None else decision.load_ranges,
            resumed_keys=() if decision is None else decision.load_keys)

    def crash(self, event: Event) -> None:
        """The main channel's load refusal (``LoadCrashEvent``) is an exception record."""
        if isinstance(event, LoadCrashEvent):
            self.exceptions.append(ExceptionRecord(
                self.step, event.request, "load", event.error.name, event.message))

    @classmethod
    def attach(cls, system: OffloadSystem, *, load_crashes: bool = True) -> TraceRecorder:
        """A recorder subscribed to ``system``'s lifecycle channel and, with
        ``load_crashes``, to its main channel's load refusals (exception records). A
        judge that already reports a refused load as C2's crash (the fuzzer's monitor)
        leaves them out, so one root cause is one finding."""
        recorder = cls()
        system.subscribe_lifecycle(recorder)
        if load_crashes:
            system.subscribe(recorder.crash)
        return recorder

    def trace(self, system: OffloadSystem, *, fatal: bool = False) -> LifecycleTrace:
        """What happened so far on ``system`` (the recorder's records and the system's
        state now), judged by the deferral bound ``system`` was configured with;
        ``fatal``: the program ended at an exception (a note of the trace says so)."""
        final = system.lifecycle_final()
        return LifecycleTrace(
            steps=system.steps, deferral_bound=system.config.deferral_bound,
            lookups=tuple(self.lookups), jobs=tuple(self.jobs),
            states=tuple(self.states), exceptions=tuple(self.exceptions),
            offers=tuple(self.offers), recoveries=tuple(self.recoveries),
            final=FinalState(
                pending_keys=final["pending"], loading_requests=final["loading_requests"],
                loading_keys=final["loading_keys"], referenced_keys=final["referenced"],
                stale_stores=tuple(self.stale), open_requests=final["open"]),
            stalled_keys=final["stalled"], notes=(FATAL_NOTE,) if fatal else (),
            fatal=fatal,
        )


def run_program(geometry: Geometry, impl: Implementation, program: Sequence[str],
                config: ProgramConfig | None = None) -> LifecycleTrace:
    """Run ``program`` and the config's tail of steps; the trace of what happened."""
    config = config or ProgramConfig()
    operations = [parse_operation(op) for op in program]
    system = OffloadSystem(SystemConfig(
        geometry, impl, tensor_backed=False, capacity_chunks=config.capacity_chunks,
        delay_steps=config.delay_steps, deferral_bound=config.deferral_bound,
        gpu_prefix_cache=config.gpu_prefix_cache))
    recorder = TraceRecorder.attach(system)
    tokens = prompt_tokens(config.prompt_len)
    fatal = False
    schedule: list[tuple[str, str | None]] = [*operations,
                                              *(("step", None),) * config.tail_steps]
    for verb, name in schedule:
        recorder.step = system.steps
        try:
            _apply(system, verb, name, tokens, config)
        except Exception as exc:  # engine-fatal: the trace records it and ends
            recorder.exceptions.append(ExceptionRecord(
                system.steps, name, verb, type(exc).__name__, str(exc)))
            fatal = True
            break
    if not fatal:
        try:
            system.drain()
        except Exception as exc:
            recorder.exceptions.append(ExceptionRecord(
                system.steps, None, "drain", type(exc).__name__, str(exc)))
    return recorder.trace(system, fatal=fatal)


_REQUEST_VERBS: dict[str, Callable[[OffloadSystem, str], None]] = {
    "abort": OffloadSystem.abort,
    "preempt": OffloadSystem.preempt,
    "finish": OffloadSystem.finish,
    "error": OffloadSystem.finish_with_error,
}
"""The verbs on one named request: the system's method each calls."""
_SYSTEM_VERBS: dict[str, Callable[[OffloadSystem], None]] = {
    "stall-store": OffloadSystem.stall_next_store,
    "fail-store": OffloadSystem.inject_store_failure,
    "fail-load": OffloadSystem.fail_next_load,
    "reset-cache": OffloadSystem.reset_prefix_cache,
    "retry-lookups": OffloadSystem.retry_lookups,
}
"""The verbs on the system itself: the method each calls."""


def _apply(system: OffloadSystem, verb: str, name: str | None, tokens: list[int],
           config: ProgramConfig) -> None:
    if verb == "step":
        system.step(config.token_budget)
    elif verb == "add":
        assert name is not None
        if name not in system.requests:
            system.add_request(name, tokens, config.max_new_tokens)
    elif verb in _REQUEST_VERBS:
        assert name is not None
        _REQUEST_VERBS[verb](system, name)
    elif verb in _SYSTEM_VERBS:
        _SYSTEM_VERBS[verb](system)
