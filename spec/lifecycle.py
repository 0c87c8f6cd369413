"""The life of one request, written once: states, transitions, and the trace vocabulary.

Contract (docs/CONTRACT.md section 10, clauses C13-C15): this module states what a
scheduler and an offloading connector may do with one request and the chunks it waits
on, and the words every backend reports a run in. It holds no decision of any
implementation and imports neither Z3, torch nor vLLM.

* :class:`RequestState` and :data:`TRANSITIONS`: the scheduler's and the connector's
  states of one request (waiting, lookup deferred, hit accepted, load in flight,
  running, preempted, re-admitted, finished, aborted) and the moves between them that
  the contract allows. A move not listed is a C14 violation.
* :class:`DeferCause`: why a lookup may answer "not yet" (``None``): a RETRY, a
  HIT_PENDING chunk in the window it would use (C3), a chunk another request is
  loading, or the request's own transfers still in flight (a preempted request
  re-admitted with a store in flight: vLLM 0.33.0 ``get_num_new_matched_tokens``).
* :class:`JobKind`, :class:`JobEvent`: store and load jobs, submitted once and ended
  once (completed, failed or cancelled).
* The observation vocabulary: :class:`LifecycleTrace`, plain frozen data per scheduler
  step and request (lookups and what they waited on, jobs per chunk and group,
  exceptions, load-failure recoveries, the end state: chunks left pending, requests
  still counted as loading, stores whose blocks were freed or reused). The executable
  system (:mod:`kvcontract.impl.system`) and the live backend (vLLM's own scheduler)
  map their runs to it; the judges of :mod:`kvcontract.spec.properties.lifecycle` read
  nothing else.
* The deferral bound (C13): :func:`deferral_age` and :func:`within_deferral_bound`,
  int-or-Z3 like every spec formula.

Why the bound counts scheduler steps from the *first* deferral: a request is deferred
because a job it waits on has not completed; if the job stalls, every later lookup
fails the same way, so a clock restarted at each failed lookup (or promotion round:
vLLM #53087) never expires, and with no clock at all (vLLM #49829, 0.33.0 measures
``deferred_lookup_start_time`` but enforces nothing) the request waits until the
client gives up. A bound in steps is what a scheduler can enforce deterministically;
``D`` is a parameter of the contract (:data:`DEFAULT_DEFERRAL_BOUND`), not a constant
of the proof.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from kvcontract.spec.arith import Bool, Num

DEFAULT_DEFERRAL_BOUND = 4
"""``D``: the scheduler steps a request may stay deferred after its first deferral
before the connector decides (recompute, or the hit the ready chunks serve). Small
enough that an exhaustive scope reaches it; a deployment states its own."""


class RequestState(str, enum.Enum):
    """Where one request is, as the scheduler and the connector see it together."""

    WAITING = "waiting"
    """Queued, never looked up (or put back after a preemption or a failed load)."""
    DEFERRED = "deferred"
    """Its last lookup answered ``None``: it is asked again next step."""
    HIT_ACCEPTED = "hit-accepted"
    """The lookup decided a number of tokens (possibly 0: recompute)."""
    LOADING = "loading"
    """Load jobs of its external hit are in flight."""
    RUNNING_PREFILL = "running-prefill"
    RUNNING_DECODE = "running-decode"
    PREEMPTED = "preempted"
    """Its GPU blocks were freed; it waits to be re-admitted."""
    READMITTED = "readmitted"
    """A preempted request taken back: it is looked up again from token 0."""
    FINISHED = "finished"
    ABORTED = "aborted"


ENDED_STATES = frozenset({RequestState.FINISHED, RequestState.ABORTED})
"""A request in one of these has no more steps (and no job of its may start)."""

_ANY_LIVE = frozenset(RequestState) - ENDED_STATES

TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    RequestState.WAITING: frozenset({RequestState.DEFERRED, RequestState.HIT_ACCEPTED,
                                     RequestState.ABORTED}),
    RequestState.DEFERRED: frozenset({RequestState.DEFERRED, RequestState.HIT_ACCEPTED,
                                      RequestState.ABORTED}),
    RequestState.HIT_ACCEPTED: frozenset({RequestState.LOADING, RequestState.RUNNING_PREFILL,
                                          RequestState.RUNNING_DECODE, RequestState.ABORTED}),
    RequestState.LOADING: frozenset({RequestState.RUNNING_PREFILL, RequestState.RUNNING_DECODE,
                                     RequestState.WAITING, RequestState.ABORTED}),
    RequestState.RUNNING_PREFILL: frozenset({RequestState.RUNNING_PREFILL,
                                             RequestState.RUNNING_DECODE,
                                             RequestState.PREEMPTED, RequestState.FINISHED,
                                             RequestState.ABORTED}),
    RequestState.RUNNING_DECODE: frozenset({RequestState.RUNNING_DECODE,
                                            RequestState.PREEMPTED, RequestState.FINISHED,
                                            RequestState.ABORTED}),
    RequestState.PREEMPTED: frozenset({RequestState.READMITTED, RequestState.ABORTED}),
    RequestState.READMITTED: frozenset({RequestState.DEFERRED, RequestState.HIT_ACCEPTED,
                                        RequestState.ABORTED}),
    RequestState.FINISHED: frozenset(),
    RequestState.ABORTED: frozenset(),
}
"""The moves the contract allows (C14). ``LOADING -> WAITING`` is the recovery of a
failed or cancelled load (C15): the request is looked up again over what is left.
A request starts ``WAITING``."""

assert set(TRANSITIONS) == set(RequestState)
assert all(TRANSITIONS[s] <= frozenset(RequestState) for s in _ANY_LIVE)


def transition_allowed(before: RequestState, after: RequestState) -> bool:
    return after in TRANSITIONS[before]


class DeferCause(str, enum.Enum):
    """Why a lookup answered ``None`` (C13: every deferral has one)."""

    RETRY = "retry"
    """A chunk's location is unknown: an asynchronous lookup is in flight."""
    HIT_PENDING = "hit-pending"
    """A chunk of the window the hit would use is still being stored (C3)."""
    LOADING_ELSEWHERE = "loading-elsewhere"
    """A chunk of the load set is being loaded by another request."""
    OWN_TRANSFER = "own-transfer"
    """The request's own jobs (a store from before its preemption) are in flight."""


class JobKind(str, enum.Enum):
    STORE = "store"
    LOAD = "load"


class JobEvent(str, enum.Enum):
    """One line of a job's life: submitted once, then exactly one of the others."""

    SUBMITTED = "submitted"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


JOB_ENDINGS = frozenset({JobEvent.COMPLETED, JobEvent.FAILED, JobEvent.CANCELLED})


class StaleReason(str, enum.Enum):
    FREED = "freed"
    """The block was released to the GPU pool before the store captured it."""
    REUSED = "reused"
    """The block was handed to another request (or position) before the capture."""


# -- the observation vocabulary -----------------------------------------------------------
@dataclass(frozen=True)
class WaitedChunk:
    """A chunk a deferred lookup waited on: ``(group, chunk)`` of the request, the
    manager's key (as text, so traces compare across backends) and why."""

    group: int
    chunk: int
    key: str
    cause: DeferCause


@dataclass(frozen=True)
class LookupRecord:
    """One lookup of a waiting (or re-admitted) request at a scheduler step."""

    step: int
    request: str
    local_hit: int
    """The tokens the GPU prefix cache serves (``L``)."""
    answer: int | None
    """The accepted boundary in tokens (``>= local_hit``), ``None`` for a deferral."""
    causes: tuple[DeferCause, ...] = ()
    """Why it deferred (empty when it decided)."""
    waited_on: tuple[WaitedChunk, ...] = ()
    load_ranges: tuple[tuple[int, tuple[int, int]], ...] = ()
    """The chunks loaded per group for a decided external hit, ``((group, (lo, hi)),)``."""
    by_deadline: bool = False
    """The answer was forced by the deferral bound (recompute or the ready hit)."""
    load_keys: tuple[str, ...] = ()
    """The manager's keys the decided external hit loads, as text (empty: it loads
    nothing, or the backend did not observe them)."""


@dataclass(frozen=True)
class JobRecord:
    """One line of a transfer job's life."""

    step: int
    job_id: int
    request: str
    kind: JobKind
    event: JobEvent
    group: int
    chunks: tuple[int, ...]
    """The request's chunk indices the job moves (of ``group``)."""
    keys: tuple[str, ...] = ()
    """The manager's keys of those chunks, as text, in the same order."""


@dataclass(frozen=True)
class StateRecord:
    """A request entered ``state`` at ``step`` with ``num_computed`` tokens computed."""

    step: int
    request: str
    state: RequestState
    num_computed: int = 0


@dataclass(frozen=True)
class ExceptionRecord:
    """The implementation raised (the serving code would fail a request or the step)."""

    step: int
    request: str | None
    where: str
    """The operation that raised: ``lookup``, ``store``, ``abort``, ``load``, ..."""
    type_name: str
    message: str


@dataclass(frozen=True)
class StoreOfferRecord:
    """The chunks one group's store step offered when a request ended or ran a step."""

    step: int
    request: str
    group: int
    status: str
    """The request status the store step ran with (``RequestStatus`` value)."""
    num_computed: int
    """Tokens whose KV the request had computed when the step ran."""
    offered: tuple[int, ...]


@dataclass(frozen=True)
class RecoveryRecord:
    """What a request did after a failed or cancelled load of an external hit.

    ``valid`` gives, per group, the chunk indices whose KV was on the GPU after the
    failure (the local hit's and the loads that completed); ``resumed_at`` the tokens the
    request counted as computed when it next ran (``None``: it never ran again in the
    trace, e.g. aborted).
    """

    step: int
    request: str
    local_hit: int
    hit: int
    failed: tuple[tuple[int, int], ...]
    """``(group, chunk)`` of the chunks whose load failed or was cancelled."""
    failed_keys: tuple[str, ...]
    resumed_at: int | None
    resumed_load_ranges: tuple[tuple[int, tuple[int, int]], ...] = ()
    """The load set of the hit it resumed with (a later lookup's), if external."""
    resumed_keys: tuple[str, ...] = ()
    """The manager's keys the resumed hit loaded, as text."""


@dataclass(frozen=True)
class StaleStore:
    """A store job that would read a GPU block no longer the request's."""

    step: int
    request: str
    job_id: int
    group: int
    block: int
    reason: StaleReason


@dataclass(frozen=True)
class FinalState:
    """What is left once the trace's steps ran and every job that can end has ended."""

    pending_keys: tuple[str, ...] = ()
    """Manager keys still HIT_PENDING."""
    loading_requests: tuple[str, ...] = ()
    """Requests still counted as loading by the connector."""
    loading_keys: tuple[str, ...] = ()
    """Keys still counted as being loaded (by anyone)."""
    referenced_keys: tuple[str, ...] = ()
    """Keys whose manager reference count is not 0 (a load never released)."""
    stale_stores: tuple[StaleStore, ...] = ()
    open_requests: tuple[str, ...] = ()
    """Requests that neither finished nor aborted (a scenario may leave some running)."""


@dataclass(frozen=True)
class LifecycleTrace:
    """A run in kvcontract's lifecycle words: the only input of the C13-C15 judges."""

    steps: int
    """Scheduler steps run."""
    deferral_bound: int | None
    """The ``D`` the run was configured with (``None``: the backend states none)."""
    lookups: tuple[LookupRecord, ...] = ()
    jobs: tuple[JobRecord, ...] = ()
    states: tuple[StateRecord, ...] = ()
    exceptions: tuple[ExceptionRecord, ...] = ()
    offers: tuple[StoreOfferRecord, ...] = ()
    recoveries: tuple[RecoveryRecord, ...] = ()
    final: FinalState = field(default_factory=FinalState)
    stalled_keys: tuple[str, ...] = ()
    """Keys of jobs the scenario's environment never completes (a stalled worker): the
    system is not blamed for them staying pending, only for waiting on them forever."""
    notes: tuple[str, ...] = ()
    """What the backend could not observe (named, so an absent record is not a pass)."""
    fatal: bool = False
    """The run ended at an exception (engine-fatal): its end state is what the crash
    left, so the judges of the end state say nothing (the exception is the finding)."""

    def requests(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for request in (*(r.request for r in self.states), *(r.request for r in self.lookups)):
            seen.setdefault(request, None)
        return tuple(seen)

    def lookups_of(self, request: str) -> tuple[LookupRecord, ...]:
        return tuple(r for r in self.lookups if r.request == request)

    def states_of(self, request: str) -> tuple[StateRecord, ...]:
        return tuple(r for r in self.states if r.request == request)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (enums as their values) for reports and witnesses."""
        import dataclasses

        def plain(value: Any) -> Any:
            if isinstance(value, enum.Enum):
                return value.value
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                return {f.name: plain(getattr(value, f.name))
                        for f in dataclasses.fields(value)}
            if isinstance(value, (tuple, list)):
                return [plain(v) for v in value]
            return value

        result: dict[str, Any] = plain(self)
        return result


# -- the deferral bound (C13) ------------------------------------------------------------
def deferral_age(first_deferred_step: Num, step: Num) -> Num:
    """Steps a request has been deferred at ``step`` since its first deferral."""
    return step - first_deferred_step


def within_deferral_bound(first_deferred_step: Num, step: Num, bound: Num) -> Bool:
    """C13: at ``step`` the request is still deferred only if its age is at most ``D``."""
    return deferral_age(first_deferred_step, step) <= bound
