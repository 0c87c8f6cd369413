"""What the live engine did, in kvcontract's vocabulary.

Chunks are named per geometry group (the group of :class:`~kvcontract.spec.geometry.Geometry`
whose layers a vLLM KV-cache group holds) and chunk index ``k`` (the chunk ending at
token ``(k + 1) * tpc``), lookup answers are :class:`~kvcontract.vocabulary.LookupResult`
words, an exception vLLM raised is a crash (C2's "not found" / "not ready" among them).
An exception of kvcontract's own driver (a call or read that does not fit the installed
vLLM's API) is a :class:`DriverGap`, kept apart: it is kvcontract's gap, never a verdict
about vLLM, and a run that has one is judged by no one (UNKNOWN, not replayable).
Plain data: no vLLM object is kept, so an observation is printed or written as JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kvcontract.vocabulary import Impact, LookupResult


@dataclass(frozen=True)
class LookupAnswer:
    """One ``OffloadingManager.lookup`` the connector made."""

    step: int
    request: str
    group: int
    vllm_group: int
    chunk: int
    result: LookupResult


@dataclass(frozen=True)
class MatchAnswer:
    """One ``get_num_new_matched_tokens``: the offloaded hit the connector offered past
    the local (GPU prefix-cache) hit; ``external`` None: deferred (asked again later)."""

    step: int
    request: str
    local_hit: int
    external: int | None
    asynchronous: bool


@dataclass(frozen=True)
class LoadRecord:
    """One ``prepare_load``: the chunks loaded per geometry group."""

    step: int
    request: str
    chunks: dict[int, tuple[int, ...]]

    def ranges(self) -> dict[int, tuple[int, int]]:
        """Per group, ``[lo, hi)`` of the chunks loaded (contiguous in every case seen)."""
        return {g: (min(c), max(c) + 1) for g, c in self.chunks.items() if c}


@dataclass(frozen=True)
class StoreOffer:
    """One ``prepare_store``: the chunks offered per geometry group, those the manager
    took as new, and the chunks it evicted for them (any group)."""

    step: int
    request: str
    offered: dict[int, tuple[int, ...]]
    new: dict[int, tuple[int, ...]]
    evicted: int
    refused: bool = False
    """The manager returned None: no room (every chunk in use)."""


@dataclass(frozen=True)
class LiveException:
    """An exception vLLM raised during a step (the run stops there)."""

    step: int
    where: str
    type: str
    message: str

    @property
    def impact(self) -> Impact:
        return Impact.CRASH


@dataclass(frozen=True)
class DriverGap:
    """kvcontract's driver did not fit the installed vLLM's API during a step (a call
    with arguments the release does not take, an attribute of a vLLM object the driver
    expected, an attribute vLLM read from one of the driver's stand-ins): the run stops
    there and says nothing about vLLM (:mod:`kvcontract.live.gaps`)."""

    step: int
    where: str
    api: str
    """The vLLM API the driver called or read (or its own object vLLM read)."""
    type: str
    message: str
    frame: str
    """``file:line function`` of the frame that raised."""

    def text(self) -> str:
        return (f"kvcontract's live driver does not fit the installed vLLM at {self.api} "
                f"({self.type}: {self.message}; {self.frame}): a gap of kvcontract, not a "
                "verdict about vLLM")


@dataclass
class RequestOutcome:
    """One request's course through the engine."""

    name: str
    arrived: int | None = None
    first_compute_step: int | None = None
    reused_tokens: int | None = None
    """Tokens computed before its first compute step (GPU prefix hit + offloaded hit)."""
    scheduled: list[int] = field(default_factory=list)
    """Tokens scheduled per step it ran."""
    deferred_steps: int = 0
    """Steps it was waiting (admitted or not) after its arrival and before its first
    compute step: a deferred lookup, an asynchronous load in flight, no room."""
    preempted: int = 0
    status: str | None = None
    num_computed: int = 0
    junctions: set[int] = field(default_factory=set)
    """Every non-zero shared-prefix junction vLLM left on the request
    (``Request.shared_prefix_boundary``) in a step that scheduled it: the connector's
    and the KV-cache manager's alike (docs/CONTRACT.md 9.3); empty where the release has
    none."""
    connector_junctions: set[int] = field(default_factory=set)
    """The junctions the offloading connector itself set on the request
    (``_maybe_register_shared_prefix_junction`` raised ``shared_prefix_boundary``)."""


@dataclass
class JobRecord:
    """One transfer job of the connector, from its submission in a step's
    ``OffloadingConnectorMetadata`` to what became of it (steps of the trace)."""

    job_id: int
    request: str
    kind: str
    """``load`` or ``store``."""
    submitted: int
    blocks: tuple[int, ...]
    """GPU block ids: a store's sources, a load's destinations."""
    keys: int
    """Offload keys (chunks) it moves."""
    sync: bool = False
    chunks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Per geometry group, the request's chunk indices it moves."""
    key_texts: tuple[str, ...] = ()
    """The manager's offload keys it moves (hex)."""
    group_blocks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Per geometry group, its GPU blocks (``blocks`` split by ``group_sizes``)."""
    reported: list[int] = field(default_factory=list)
    """Steps at which the worker reported it done (``completed_jobs``)."""
    completed: int | None = None
    """Step at which the connector took the report (the job left its ``_jobs``)."""
    failed: int | None = None
    """Step at which the worker reported its failure (``failed_recving``)."""
    flushed: list[int] = field(default_factory=list)
    """Steps whose ``jobs_to_flush`` named it."""
    dropped: int | None = None
    """Step at which the connector discarded it without a completion (a cache reset:
    the job is cancelled, its late report ignored as stale)."""
    reused_blocks: list[tuple[int, int]] = field(default_factory=list)
    """``(step, block)``: a source block of this store allocated again while the store
    was in flight, in a step that did not flush it (its bytes may be overwritten
    before they are stored)."""

    @property
    def ended(self) -> bool:
        return self.completed is not None or self.dropped is not None


@dataclass(frozen=True)
class LookupDecision:
    """One answer of the connector's ``get_num_new_matched_tokens`` and what a deferral
    (``answer`` None) waited on, read from the connector's own state during the call."""

    step: int
    request: str
    local_hit: int
    answer: int | None
    own_jobs: tuple[int, ...]
    """The request's in-flight transfer jobs (``transfer_jobs``): it waits on them."""
    pending_chunks: int
    """Manager lookups of this call answered HIT_PENDING."""
    retry_chunks: int
    """Manager lookups of this call answered RETRY."""
    others_loading: bool
    """Deferred with every lookup a hit while chunks were being loaded by another
    request (``_chunks_being_loaded``)."""
    clock_started: bool
    """``deferred_lookup_start_time`` is set after the call (vLLM measures the wait)."""
    waited: tuple[tuple[int, int, str, str], ...] = ()
    """``(group, chunk, key hex, cause)`` of each chunk the call waited on: ``hit-pending``
    and ``retry`` manager answers, ``loading-elsewhere`` keys of the request counted as
    being loaded."""

    @property
    def deferred(self) -> bool:
        return self.answer is None


@dataclass(frozen=True)
class RequestSnapshot:
    """A request's state at the end of a step (after ``update_from_output``)."""

    step: int
    request: str
    status: str
    """vLLM's ``RequestStatus`` name."""
    num_computed: int
    num_prompt: int


@dataclass(frozen=True)
class StoreStepOffer:
    """One ``prepare_store`` with the request's status and computed tokens the store
    step ran with (an ended request's are what it computed)."""

    step: int
    request: str
    status: str
    """vLLM's ``RequestStatus`` name."""
    num_computed: int
    num_prompt: int
    offered: dict[int, tuple[int, ...]]


@dataclass(frozen=True)
class LoadFailure:
    """A load the worker reported failed and what the scheduler did with its request."""

    step: int
    request: str
    num_computed_before: int
    num_computed_after: int
    status_after: str


@dataclass(frozen=True)
class RequestEnd:
    """A request's state when the trace ended."""

    name: str
    status: str
    num_computed: int
    transfer_jobs: tuple[int, ...]
    """Jobs the connector still counts in flight for it."""
    tracked: bool
    """The connector still holds its ``_req_status``."""


@dataclass
class LifecycleEnd:
    """The engine's state when the trace ended."""

    step: int
    open_jobs: tuple[int, ...]
    """Job ids still in the connector's ``_jobs`` (neither completed nor cancelled)."""
    write_pending_chunks: int | None
    """Chunks the manager still holds HIT_PENDING (an in-flight store), where the
    manager counts them."""
    chunks_being_loaded: int
    """Keys the connector still counts as being loaded."""
    waiting_for_remote_kv: tuple[str, ...]
    """Requests still waiting for a load."""
    requests: dict[str, RequestEnd] = field(default_factory=dict)
    worker_stalled: tuple[int, ...] = ()
    pending_keys: tuple[str, ...] = ()
    """The manager's HIT_PENDING keys (hex), where its policy lists its chunks."""
    referenced_keys: tuple[str, ...] = ()
    """Keys whose manager reference count is above 0 (a load not released)."""
    loading_keys: tuple[str, ...] = ()
    """The keys the connector counts as being loaded (hex)."""
    """Jobs the worker will never report (Timing ``never``)."""


@dataclass
class LifecycleLog:
    """What the lifecycle clauses (C13-C15) judge, recorded from vLLM's own objects
    during a trace (:mod:`kvcontract.live.lifecycle`)."""

    jobs: dict[int, JobRecord] = field(default_factory=dict)
    decisions: list[LookupDecision] = field(default_factory=list)
    load_failures: list[LoadFailure] = field(default_factory=list)
    snapshots: list[RequestSnapshot] = field(default_factory=list)
    offers: list[StoreStepOffer] = field(default_factory=list)
    cancelled_by_reset: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    """``(step, job ids)`` a cache reset discarded."""
    raised_in: list[str] = field(default_factory=list)
    """Where the release's worker raised on a failed transfer (``file:line function``)."""
    load_failure_policy: str | None = None
    """The engine's ``kv_load_failure_policy`` during the trace (the release's default
    unless the trace chose one); None where the release has no such setting."""
    recorder_errors: list[str] = field(default_factory=list)
    """Errors of the recorder itself (not vLLM's): the record is incomplete."""
    end: LifecycleEnd | None = None

    def deferred_steps(self, request: str) -> list[int]:
        """Steps at which ``request``'s lookup was deferred."""
        return sorted({d.step for d in self.decisions if d.request == request and d.deferred})


@dataclass
class LiveObservation:
    """Everything one trace did on the live engine."""

    geometry: dict[str, Any]
    vllm_version: str
    steps: int = 0
    lookups: list[LookupAnswer] = field(default_factory=list)
    matches: list[MatchAnswer] = field(default_factory=list)
    loads: list[LoadRecord] = field(default_factory=list)
    stores: list[StoreOffer] = field(default_factory=list)
    requests: dict[str, RequestOutcome] = field(default_factory=dict)
    exceptions: list[LiveException] = field(default_factory=list)
    """What vLLM raised (a crash)."""
    driver_gaps: list[DriverGap] = field(default_factory=list)
    """Where kvcontract's driver did not fit vLLM's API (the run is not judged)."""
    resets: list[tuple[int, str, bool]] = field(default_factory=list)
    """``(step, kind, result)`` of every cache reset."""
    flushed_jobs: int = 0
    stalled_jobs: int = 0
    failed_loads: int = 0
    cpu_chunks: int | None = None
    notes: list[str] = field(default_factory=list)
    lifecycle: LifecycleLog | None = None
    """The lifecycle record, when the trace ran through
    :func:`kvcontract.live.lifecycle.run_lifecycle`."""

    @property
    def crashed(self) -> bool:
        return bool(self.exceptions)

    @property
    def driver_gap(self) -> DriverGap | None:
        """The first gap of kvcontract's driver, None when the run says something about
        vLLM."""
        return self.driver_gaps[0] if self.driver_gaps else None

    def accepted_hit(self, request: str) -> int | None:
        """The offloaded hit the connector finally offered ``request`` (its last answer
        that was not deferred), None if it never answered."""
        answers = [m.external for m in self.matches if m.request == request]
        final = [a for a in answers if a is not None]
        return final[-1] if final else None

    def stored_chunks(self, group: int, request: str | None = None) -> set[int]:
        """Chunks of ``group`` offered to ``prepare_store`` (by ``request``)."""
        found: set[int] = set()
        for offer in self.stores:
            if request is None or offer.request == request:
                found.update(offer.offered.get(group, ()))
        return found

    def load_ranges(self, request: str) -> dict[int, tuple[int, int]]:
        """Per group, the chunks loaded for ``request`` (all its loads)."""
        chunks: dict[int, set[int]] = {}
        for load in self.loads:
            if load.request == request:
                for g, cs in load.chunks.items():
                    chunks.setdefault(g, set()).update(cs)
        return {g: (min(c), max(c) + 1) for g, c in chunks.items() if c}

    def lookup_states(self, request: str) -> dict[int, dict[int, str]]:
        """Per group and chunk, the last answer the manager gave ``request``."""
        found: dict[int, dict[int, str]] = {}
        for answer in self.lookups:
            if answer.request == request:
                found.setdefault(answer.group, {})[answer.chunk] = answer.result.name
        return found

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["lookups"] = [dict(asdict(a), result=a.result.name) for a in self.lookups]
        data["crashed"] = self.crashed
        for outcome in data["requests"].values():  # sets of junctions, as sorted lists
            for name in ("junctions", "connector_junctions"):
                outcome[name] = sorted(outcome[name])
        return data
