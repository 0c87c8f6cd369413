"""The request lifecycle on the live engine, recorded from vLLM's own objects.

:func:`run_lifecycle` drives a :class:`~kvcontract.live.trace.Trace` as
:func:`~kvcontract.live.run.run_trace` does and also records, into
:class:`~kvcontract.live.observation.LifecycleLog`, what the lifecycle clauses judge:

* every answer of the connector's ``get_num_new_matched_tokens`` and, for a deferral,
  what it waited on, read from the connector during the call (the request's own
  in-flight ``transfer_jobs``, the manager's HIT_PENDING and RETRY answers of the call,
  chunks another request is loading: ``_chunks_being_loaded``) and whether vLLM's
  deferral clock (``deferred_lookup_start_time``) runs;
* every load and store job: submitted (``OffloadingConnectorMetadata``), reported by the
  worker (``completed_jobs``; failed: ``failed_jobs`` where the release's worker metadata
  has it, else a load's ``failed_recving``), taken by the connector (it left
  ``_jobs``), flushed (``jobs_to_flush``), discarded by a cache reset; a store whose
  source block vLLM allocated again while it was in flight, in a step that did not
  flush it (the blocks each step allocates: the connector's own
  ``_current_batch_allocated_block_ids`` plus the scheduler output's new block ids, read
  just before ``build_connector_meta`` consumes them);
* a failed load's recovery (the request's ``num_computed_tokens`` before and after the
  scheduler took the failure);
* the end state: jobs still open, chunks the manager holds HIT_PENDING, keys counted as
  being loaded, requests still waiting for a load or still tracked by the connector.

Everything is read or wrapped on the engine's instances (no vLLM code restated, none
patched in its module): the run's own recorders (:mod:`kvcontract.live.run`) stay
as they are. :func:`to_trace` maps the log to the core's lifecycle vocabulary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvcontract.live.build import BuildOptions, LiveEngine, Refused, build
from kvcontract.live.capabilities import vllm_names
from kvcontract.live.observation import (
    JobRecord,
    LifecycleEnd,
    LifecycleLog,
    LiveObservation,
    LoadFailure,
    LookupDecision,
    RequestEnd,
    RequestSnapshot,
    StoreStepOffer,
)
from kvcontract.live.run import LiveRun, shutdown
from kvcontract.live.trace import Trace
from kvcontract.spec.geometry import Geometry
from kvcontract.spec.lifecycle import (
    ENDED_STATES,
    DeferCause,
    ExceptionRecord,
    FinalState,
    JobEvent,
    JobKind,
    LifecycleTrace,
    LookupRecord,
    RecoveryRecord,
    RequestState,
    StaleReason,
    StaleStore,
    StateRecord,
    StoreOfferRecord,
    WaitedChunk,
)
from kvcontract.spec.lifecycle import JobRecord as TraceJobRecord
from kvcontract.spec.properties.base import Violation
from kvcontract.spec.properties.lifecycle import judge_trace
from kvcontract.vocabulary import LookupResult, RequestStatus

LOAD_FAILURE_POLICIES = ("fail", "recompute")
"""vLLM's ``KVTransferConfig.kv_load_failure_policy`` values."""


def _block_ids(spec: Any) -> tuple[int, ...]:
    ids = getattr(spec, "block_ids", None)
    if ids is None:
        return ()
    return tuple(int(b) for b in list(ids))


KEY_HASH_HEX = 16
"""Hex digits of a key's block hash kept in its text (enough to tell keys apart in a
trace; the text is for reading and comparing within one run)."""


def key_text(key: Any) -> str:
    """An offload key as text: the start of its block hash and its vLLM group (vLLM's
    keys are bytes, read through ``get_offload_group_idx``)."""
    if not isinstance(key, (bytes, bytearray)):
        return str(key)
    group = vllm_names("vllm.v1.kv_offload.base", "get_offload_group_idx")(key)
    return f"{bytes(key).hex()[:KEY_HASH_HEX]}/g{int(group)}"


class _ManagerTap:
    """The connector's manager (the run's recording proxy, or the manager itself) with
    each ``lookup``'s key and answer and each ``prepare_store`` handed to the recorder;
    every call is delegated unchanged."""

    def __init__(self, inner: Any, recorder: _LifecycleRecorder) -> None:
        self._inner = inner
        self._recorder = recorder

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name == "lookup":
            def lookup(key: Any, *args: Any, **kwargs: Any) -> Any:
                result = attribute(key, *args, **kwargs)
                self._recorder.lookup_answers.append((key, args[0] if args else None,
                                                      result))
                return result

            return lookup
        if name == "prepare_store":
            def prepare_store(keys: Any, *args: Any, **kwargs: Any) -> Any:
                keys = list(keys)
                self._recorder.guarded("prepare_store", lambda: self._recorder.store_offered(
                    keys, args[0] if args else None))
                return attribute(keys, *args, **kwargs)

            return prepare_store
        return attribute


def _base_manager(manager: Any) -> Any:
    """The manager under the recording proxies."""
    while hasattr(manager, "_inner"):
        manager = manager._inner
    return manager


@dataclass
class _LifecycleRecorder:
    """Wraps the engine's scheduler and connector instances for one run."""

    engine: LiveEngine
    run: LiveRun
    log: LifecycleLog
    step: int = 0
    lookup_answers: list[tuple[Any, Any, Any]] = field(default_factory=list)
    """``(key, context, result)`` of the manager lookups since the last reading."""
    scheduler_output: Any = None

    # -- names ----------------------------------------------------------------------
    def name(self, rid: str) -> str:
        names: dict[str, str] = getattr(getattr(self.run, "recorder", None), "names", {})
        return names.get(rid, rid.split("#", 1)[0])

    def guarded(self, what: str, record: Callable[[], None]) -> None:
        """Run one piece of recording; an error of the recorder's own (never vLLM's: the
        wrapped calls are outside) is kept in the log, so the run is not judged on an
        incomplete record and vLLM is not blamed for it."""
        try:
            record()
        except Exception as exc:
            self.log.recorder_errors.append(f"{what} at step {self.step}: "
                                            f"{type(exc).__name__}: {exc}")

    # -- installation ---------------------------------------------------------------
    def install(self) -> None:
        scheduler = self.engine.scheduler
        connector_scheduler = self.engine.connector_scheduler
        scheduler.update_from_output = self._wrap_update(scheduler.update_from_output)
        scheduler.reset_prefix_cache = self._wrap_reset(scheduler.reset_prefix_cache)
        connector_scheduler.build_connector_meta = self._wrap_meta(
            connector_scheduler.build_connector_meta)
        connector_scheduler.get_num_new_matched_tokens = self._wrap_matched(
            connector_scheduler.get_num_new_matched_tokens)
        connector_scheduler.manager = _ManagerTap(connector_scheduler.manager, self)

    # -- keys -----------------------------------------------------------------------
    def chunk_of(self, key: Any, context: Any) -> tuple[int, int]:
        """``(geometry group, chunk index)`` of an offload key, as the run names them."""
        group, _, chunk = self.run.recorder.chunk_of(key, context)
        return group, chunk

    def _context(self, rid: str) -> Any:
        status = self.engine.connector_scheduler._req_status.get(rid)
        return None if status is None else status.req_context

    def store_offered(self, keys: list[Any], context: Any) -> None:
        rid = str(getattr(context, "req_id", ""))
        request = self.engine.scheduler.requests.get(rid)
        if request is None:
            return
        scheduled = getattr(self.scheduler_output, "num_scheduled_tokens", {}) or {}
        computed = int(request.num_computed_tokens)
        if not request.is_finished():
            computed += int(scheduled.get(rid, 0))
        chunks: dict[int, list[int]] = {}
        for key in keys:
            group, chunk = self.chunk_of(key, context)
            chunks.setdefault(group, []).append(chunk)
        self.log.offers.append(StoreStepOffer(
            self.step, self.name(rid), str(request.status.name), computed,
            int(request.num_prompt_tokens), {g: tuple(sorted(c)) for g, c in chunks.items()}))

    def _wrap_meta(self, build_meta: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def recorded(scheduler_output: Any) -> Any:
            allocated: set[int] = set()
            self.guarded("allocated blocks",
                         lambda: allocated.update(self._allocated(scheduler_output)))
            self.scheduler_output = scheduler_output
            meta = build_meta(scheduler_output)
            self.guarded("jobs", lambda: self._record_jobs(meta, allocated))
            return meta

        return recorded

    def _allocated(self, scheduler_output: Any) -> set[int]:
        """GPU blocks this step allocates, as the connector counts them for its flush
        rule: its own set (blocks of loads allocated this step) and the output's new
        block ids (read before ``build_connector_meta`` clears its set)."""
        yield_req_data = vllm_names("vllm.distributed.kv_transfer.kv_connector.utils",
                                    "yield_req_data")
        found = {int(b) for b in getattr(self.engine.connector_scheduler,
                                         "_current_batch_allocated_block_ids", ())}
        for _, groups, _ in yield_req_data(scheduler_output):
            for ids in groups or ():
                found.update(int(b) for b in ids if b != 0)
        for copy in getattr(scheduler_output, "kv_cache_block_copies", None) or ():
            found.add(int(copy.dst_block_id))
        return found

    def _record_jobs(self, meta: Any, allocated: set[int]) -> None:
        jobs = self.log.jobs
        flush = {int(j) for j in getattr(meta, "jobs_to_flush", None) or ()}
        for job in jobs.values():
            if job.job_id in flush:
                job.flushed.append(self.step)
            in_flight = (job.kind == "store" and not job.ended and job.submitted < self.step
                         and job.failed is None)
            if in_flight and job.job_id not in flush:
                job.reused_blocks += [(self.step, b) for b in job.blocks if b in allocated]
        for kind, submitted in (("load", getattr(meta, "load_jobs", None)),
                                ("store", getattr(meta, "store_jobs", None))):
            for job_id, job in (submitted or {}).items():
                jobs[int(job_id)] = self._job(int(job_id), kind, job)

    def _job(self, job_id: int, kind: str, job: Any) -> JobRecord:
        """The record of a job just submitted: its keys from the connector's own job
        status, its GPU blocks from the GPU side of its transfer spec."""
        rid = str(job.req_id)
        gpu = job.dst_spec if kind == "load" else job.src_spec
        blocks = _block_ids(gpu)
        status = self.engine.connector_scheduler._jobs.get(job_id)
        keys = list(getattr(status, "keys", None) or ())
        context = self._context(rid)
        chunks: dict[int, list[int]] = {}
        for key in keys:
            group, chunk = self.chunk_of(key, context)
            chunks.setdefault(group, []).append(chunk)
        group_blocks: dict[int, tuple[int, ...]] = {}
        sizes = list(getattr(gpu, "group_sizes", None) or ())
        if sizes and sum(sizes) == len(blocks):
            start = 0
            for vgroup, size in enumerate(sizes):
                group = self.engine.group_of[vgroup]
                group_blocks[group] = group_blocks.get(group, ()) + blocks[start:start + size]
                start += size
        return JobRecord(job_id, self.name(rid), kind, self.step, blocks, len(keys),
                         sync=bool(getattr(job, "sync", False)),
                         chunks={g: tuple(sorted(c)) for g, c in chunks.items()},
                         key_texts=tuple(sorted(key_text(k) for k in keys)),
                         group_blocks=group_blocks)

    def _open_jobs(self) -> set[int]:
        return {int(j) for j in getattr(self.engine.connector_scheduler, "_jobs", {})}

    def _wrap_update(self, update: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def recorded(scheduler_output: Any, model_output: Any) -> Any:
            output = getattr(model_output, "kv_connector_output", None)
            meta = getattr(output, "kv_connector_worker_meta", None)
            reported = {int(j) for j in getattr(meta, "completed_jobs", None) or {}}
            failed_jobs = {int(j) for j in getattr(meta, "failed_jobs", None) or ()}
            failed = {str(r) for r in getattr(output, "failed_recving", None) or ()}
            before = self._open_jobs()
            computed = self._computed(failed)
            try:
                return update(scheduler_output, model_output)
            finally:
                self.guarded("job reports", lambda: self._after_update(
                    reported, failed, before, computed, failed_jobs))
                self.step += 1

        return recorded

    def _computed(self, rids: Iterable[str]) -> dict[str, int]:
        requests = self.engine.scheduler.requests
        return {r: int(requests[r].num_computed_tokens) for r in rids if r in requests}

    def _after_update(self, reported: set[int], failed: set[str], before: set[int],
                      computed: dict[str, int], failed_jobs: Iterable[int] = ()) -> None:
        after = self._open_jobs()
        failed_jobs = set(failed_jobs)
        for job_id in reported:
            job = self.log.jobs.get(job_id)
            if job is None:
                continue
            job.reported.append(self.step)
            if job_id in failed_jobs and job.failed is None:
                job.failed = self.step
            if job_id in before and job_id not in after:
                job.completed = self.step
        requests = self.engine.scheduler.requests
        for name, request in self.run.live.items():
            self.log.snapshots.append(RequestSnapshot(
                self.step, name, str(request.status.name), int(request.num_computed_tokens),
                int(request.num_prompt_tokens)))
        for rid in sorted(failed):
            loads = [job for job in self.log.jobs.values()
                     if job.kind == "load" and job.request == self.name(rid)
                     and job.failed is None]
            marked = any(job.kind == "load" and job.request == self.name(rid)
                         and job.failed == self.step for job in self.log.jobs.values())
            if loads and not marked:  # the request's latest load: one in flight at a time
                max(loads, key=lambda job: job.submitted).failed = self.step
            request = requests.get(rid)
            self.log.load_failures.append(LoadFailure(
                self.step, self.name(rid), computed.get(rid, 0),
                int(request.num_computed_tokens) if request is not None else 0,
                str(request.status.name) if request is not None else "gone"))

    def _wrap_reset(self, reset: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            before = self._open_jobs()
            result = reset(*args, **kwargs)
            self.guarded("reset", lambda: self._after_reset(before))
            return result

        return recorded

    def _after_reset(self, before: set[int]) -> None:
        dropped = before - self._open_jobs()
        for job_id in dropped:
            job = self.log.jobs.get(job_id)
            if job is not None and job.completed is None:
                job.dropped = self.step
        if dropped:
            self.log.cancelled_by_reset.append((self.step, tuple(sorted(dropped))))

    def _wrap_matched(self, matched: Callable[..., tuple[int | None, bool]],
                      ) -> Callable[..., tuple[int | None, bool]]:
        connector = self.engine.connector_scheduler

        def recorded(request: Any, num_computed_tokens: int, *args: Any,
                     **kwargs: Any) -> tuple[int | None, bool]:
            rid = str(request.request_id)
            status = connector._req_status.get(rid)
            own = tuple(sorted(int(j) for j in status.transfer_jobs)) if status else ()
            self.lookup_answers = []
            result = matched(request, num_computed_tokens, *args, **kwargs)
            self.guarded("lookup decision", lambda: self._decision(
                rid, int(num_computed_tokens), own, result))
            return result

        return recorded

    def _decision(self, rid: str, num_computed_tokens: int, own: tuple[int, ...],
                  result: tuple[int | None, bool]) -> None:
        """The lookup decision just made and, for a deferral, what it waited on."""
        connector = self.engine.connector_scheduler
        status = connector._req_status.get(rid)
        answer = None if result[0] is None else int(result[0])
        waited: list[tuple[int, int, str, str]] = []
        for key, context, found in self.lookup_answers:
            name = str(getattr(found, "name", found))
            if name in (LookupResult.HIT_PENDING.name, LookupResult.RETRY.name):
                group, chunk = self.chunk_of(key, context)
                cause = "hit-pending" if name == LookupResult.HIT_PENDING.name else "retry"
                waited.append((group, chunk, key_text(key), cause))
        pending = sum(1 for w in waited if w[3] == "hit-pending")
        retry = sum(1 for w in waited if w[3] == "retry")
        others = False
        being_loaded = getattr(connector, "_chunks_being_loaded", None) or set()
        if answer is None and not own and not pending and not retry and being_loaded:
            for group_state in getattr(status, "group_states", ()):
                for key in group_state.offload_keys:
                    if key in being_loaded:
                        group, chunk = self.chunk_of(key, status.req_context)
                        waited.append((group, chunk, key_text(key),
                                       "loading-elsewhere"))
                        others = True
        clock = status is not None and getattr(
            status, "deferred_lookup_start_time", None) is not None
        self.log.decisions.append(LookupDecision(
            self.step, self.name(rid), num_computed_tokens, answer, own, pending,
            retry, others, clock, tuple(waited)))

    # -- the end --------------------------------------------------------------------
    def finish(self) -> None:
        connector = self.engine.connector_scheduler
        scheduler = self.engine.scheduler
        manager = _base_manager(connector.manager)
        pending = getattr(manager, "_num_write_pending_chunks", None)
        chunks = getattr(getattr(manager, "_policy", None), "chunks", None) or {}
        pending_keys = tuple(sorted(key_text(k) for k, c in chunks.items()
                                    if not c.is_ready))
        referenced = tuple(sorted(key_text(k) for k, c in chunks.items() if c.ref_cnt > 0))
        waiting = vllm_names("vllm.v1.request", "RequestStatus").WAITING_FOR_REMOTE_KVS
        ends: dict[str, RequestEnd] = {}
        for name, request in self.run.live.items():
            status = connector._req_status.get(request.request_id)
            ends[name] = RequestEnd(
                name, str(request.status.name), int(request.num_computed_tokens),
                tuple(sorted(int(j) for j in status.transfer_jobs)) if status else (),
                status is not None)
        self.log.end = LifecycleEnd(
            self.step, tuple(sorted(self._open_jobs())),
            None if pending is None else int(pending),
            len(getattr(connector, "_chunks_being_loaded", None) or ()),
            tuple(sorted(self.name(r.request_id) for r in scheduler.requests.values()
                         if r.status == waiting)),
            ends, tuple(self.run.worker.stalled), pending_keys, referenced,
            tuple(sorted(key_text(k) for k in getattr(connector, "_chunks_being_loaded",
                                                       None) or ())))


def run_lifecycle(geometry: Geometry, trace: Trace, options: BuildOptions | None = None,
                  *, load_failure_policy: str | None = None,
                  ) -> LiveObservation | Refused:
    """Build the engine for ``geometry``, drive ``trace`` through it and record its
    lifecycle: the observation (``lifecycle`` filled), or
    :class:`~kvcontract.live.build.Refused`. ``load_failure_policy`` (``fail`` or
    ``recompute``) is vLLM's ``kv_load_failure_policy``; None keeps the release's
    default."""
    if load_failure_policy is not None and load_failure_policy not in LOAD_FAILURE_POLICIES:
        raise ValueError(f"load_failure_policy must be one of {LOAD_FAILURE_POLICIES}, "
                         f"not {load_failure_policy!r}")
    engine = build(geometry, options)
    if isinstance(engine, Refused):
        return engine
    try:
        if load_failure_policy is not None:
            _set_load_failure_policy(engine, load_failure_policy)
        run = LiveRun(engine, trace)
        recorder = _LifecycleRecorder(engine, run, LifecycleLog())
        recorder.install()
        observation = run.run()
        recorder.log.raised_in = list(getattr(run.worker, "raised_in", ()))
        recorder.log.load_failure_policy = getattr(
            engine.vllm_config.kv_transfer_config, "kv_load_failure_policy", None)
        with contextlib.suppress(Exception):  # a half-built end state is recorded as absent
            recorder.finish()
        observation.lifecycle = recorder.log
        return observation
    finally:
        shutdown(engine)


def _set_load_failure_policy(engine: LiveEngine, policy: str) -> None:
    """The policy on the config, and the scheduler's flag derived from it the way
    ``Scheduler.__init__`` derives it (``recompute_kv_load_failures``): the scheduler is
    already built when the trace chooses the policy."""
    config = engine.vllm_config.kv_transfer_config
    config.kv_load_failure_policy = policy
    engine.scheduler.recompute_kv_load_failures = policy == "recompute"


# -- the core's vocabulary -------------------------------------------------------------
_WHERE = {"step": "schedule()/update_from_output()"}
"""The operation a live exception names, in the trace's words."""
_CAUSES = {"hit-pending": DeferCause.HIT_PENDING, "retry": DeferCause.RETRY,
           "loading-elsewhere": DeferCause.LOADING_ELSEWHERE}

TRACE_NOTES = (
    "live: a store's source block freed but not allocated again is not counted stale "
    "(its bytes stay until vLLM hands the block out); blocks are compared with those "
    "vLLM allocates in each step the store is in flight and does not flush",
    "live: a vLLM job spans every KV-cache group; its record names the lowest geometry "
    "group's chunks and every group's keys",
    "live: a request vLLM decided but had no room for stays hit-accepted until it is "
    "admitted (it is asked again; the lifecycle has no move back to waiting for it)",
    "live: a request vLLM fails with an error (FINISHED_ERROR) ends as aborted",
    "live: vLLM states no deferral bound (deferred_lookup_start_time feeds a latency "
    "histogram only); the trace is judged by the contract's default D",
)
"""What the live trace cannot show or shows in its own way (``LifecycleTrace.notes``)."""


_QUEUED = frozenset({RequestState.WAITING, RequestState.DEFERRED, RequestState.HIT_ACCEPTED,
                     RequestState.READMITTED})
"""States of a request that is not running: vLLM's WAITING or PREEMPTED status at the end
of a step leaves them as they are (a decided request vLLM had no room for stays decided
and is asked again)."""
_RUNNING = frozenset({RequestState.RUNNING_PREFILL, RequestState.RUNNING_DECODE})


def _state_of(snapshot: RequestSnapshot, last: RequestState) -> RequestState | None:
    """The lifecycle state vLLM's status shows at the end of a step, None when it shows
    no move from ``last``."""
    status = snapshot.status
    if status == "WAITING_FOR_REMOTE_KVS":
        return RequestState.LOADING
    if status == "RUNNING":
        return (RequestState.RUNNING_PREFILL if snapshot.num_computed < snapshot.num_prompt
                else RequestState.RUNNING_DECODE)
    if status == "PREEMPTED":
        return RequestState.PREEMPTED if last in _RUNNING else None
    if status in ("FINISHED_ABORTED", "FINISHED_ERROR"):
        # failed with an error (a failed load under kv_load_failure_policy "fail"): it
        # ends without completing, as an abort does
        return RequestState.ABORTED
    if status.startswith("FINISHED"):
        return RequestState.FINISHED
    return None


def _states(observation: LiveObservation, log: LifecycleLog) -> list[StateRecord]:
    """Each request's lifecycle states from its lookups and its end-of-step statuses."""
    found: list[StateRecord] = []
    for name, outcome in observation.requests.items():
        events: list[tuple[int, int, LookupDecision | RequestSnapshot]] = [
            (d.step, 0, d) for d in log.decisions if d.request == name]
        events += [(s.step, 1, s) for s in log.snapshots if s.request == name]
        found += _request_states(name, outcome.arrived or 0,
                                 [e for _, _, e in sorted(events, key=lambda e: e[:2])])
    return found


def _request_states(name: str, arrived: int,
                    events: list[LookupDecision | RequestSnapshot]) -> list[StateRecord]:
    states = [StateRecord(arrived, name, RequestState.WAITING, 0)]

    def emit(step: int, state: RequestState, computed: int) -> None:
        if states[-1].state is not state:
            states.append(StateRecord(step, name, state, computed))

    for event in events:
        last = states[-1].state
        if last in ENDED_STATES:
            break
        if isinstance(event, LookupDecision):
            if last is RequestState.PREEMPTED:
                emit(event.step, RequestState.READMITTED, 0)
            elif last is RequestState.LOADING:  # a failed load put it back
                emit(event.step, RequestState.WAITING, event.local_hit)
            emit(event.step, RequestState.DEFERRED if event.deferred
                 else RequestState.HIT_ACCEPTED, event.local_hit)
            continue
        state = _state_of(event, last)
        if state is None:
            continue
        if state is RequestState.FINISHED and last not in _RUNNING:
            # it ran (its last prefill tokens, after its hit or its load) and sampled its
            # last token within this step
            emit(event.step, RequestState.RUNNING_PREFILL, event.num_computed)
        emit(event.step, state, event.num_computed)
    return states


def _offer_status(offer: StoreStepOffer) -> str:
    if offer.status == "FINISHED_ABORTED":
        return RequestStatus.ABORTED.value
    if offer.status.startswith("FINISHED"):
        return RequestStatus.FINISHED.value
    return (RequestStatus.PREFILLING.value if offer.num_computed < offer.num_prompt
            else RequestStatus.DECODING.value)


def _job_lines(job: JobRecord) -> list[TraceJobRecord]:
    kind = JobKind.LOAD if job.kind == "load" else JobKind.STORE
    group = min(job.chunks) if job.chunks else 0
    chunks = job.chunks.get(group, ())

    def line(step: int, event: JobEvent) -> TraceJobRecord:
        return TraceJobRecord(step, job.job_id, job.request, kind, event, group, chunks,
                              job.key_texts)

    lines = [line(job.submitted, JobEvent.SUBMITTED)]
    if job.failed is not None:
        lines.append(line(job.failed, JobEvent.FAILED))
    elif job.completed is not None:
        lines.append(line(job.completed, JobEvent.COMPLETED))
    elif job.dropped is not None:
        lines.append(line(job.dropped, JobEvent.CANCELLED))
    return lines


def _recoveries(observation: LiveObservation, log: LifecycleLog) -> list[RecoveryRecord]:
    found: list[RecoveryRecord] = []
    for failure in log.load_failures:
        failed_jobs = [j for j in log.jobs.values()
                       if j.kind == "load" and j.request == failure.request
                       and j.failed == failure.step]
        failed = tuple((g, c) for j in failed_jobs for g, cs in sorted(j.chunks.items())
                       for c in cs)
        failed_keys = tuple(k for j in failed_jobs for k in j.key_texts)
        decided = [d for d in log.decisions
                   if d.request == failure.request and d.answer is not None]
        before = [d for d in decided if d.step <= failure.step]
        after = [d for d in decided if d.step > failure.step]
        local = before[-1].local_hit if before else 0
        hit = local + (before[-1].answer or 0) if before else 0
        resumed = after[0] if after else None
        resumed_at = None if resumed is None else resumed.local_hit + (resumed.answer or 0)
        ranges: tuple[tuple[int, tuple[int, int]], ...] = ()
        keys: tuple[str, ...] = ()
        if resumed is not None:
            loads = [r for r in observation.loads
                     if r.request == failure.request and r.step >= resumed.step]
            if loads:
                ranges = tuple(sorted(loads[0].ranges().items()))
            keys = tuple(k for j in log.jobs.values()
                         if j.kind == "load" and j.request == failure.request
                         and j.submitted >= resumed.step for k in j.key_texts)
        found.append(RecoveryRecord(failure.step, failure.request, local, hit, failed,
                                    failed_keys, resumed_at, ranges, keys))
    return found


def _final(observation: LiveObservation, log: LifecycleLog) -> FinalState:
    end = log.end
    stale = tuple(
        StaleStore(step, job.request, job.job_id,
                   next((g for g, bs in job.group_blocks.items() if block in bs), 0),
                   block, StaleReason.REUSED)
        for job in log.jobs.values() for step, block in job.reused_blocks)
    if end is None:
        return FinalState(stale_stores=stale)
    loading = set(end.waiting_for_remote_kv)
    for name, request in end.requests.items():
        if any(log.jobs[j].kind == "load" for j in request.transfer_jobs if j in log.jobs):
            loading.add(name)
    open_requests = tuple(sorted(n for n, r in end.requests.items()
                                 if not r.status.startswith("FINISHED")))
    return FinalState(end.pending_keys, tuple(sorted(loading)), end.loading_keys,
                      end.referenced_keys, stale, open_requests)


def to_trace(observation: LiveObservation) -> LifecycleTrace:
    """The live run in the core's lifecycle words (:mod:`kvcontract.spec.lifecycle`),
    the only input of the C13-C15 judges. ValueError when the run was not recorded by
    :func:`run_lifecycle`."""
    log = observation.lifecycle
    if log is None:
        raise ValueError("this live observation has no lifecycle record: run the trace "
                         "through kvcontract.live.lifecycle.run_lifecycle")
    lookups: list[LookupRecord] = []
    for decision in log.decisions:
        causes: list[DeferCause] = []
        waited: tuple[WaitedChunk, ...] = ()
        ranges: tuple[tuple[int, tuple[int, int]], ...] = ()
        loaded: tuple[str, ...] = ()
        if decision.deferred:
            if decision.retry_chunks:
                causes.append(DeferCause.RETRY)
            if decision.pending_chunks:
                causes.append(DeferCause.HIT_PENDING)
            if decision.others_loading:
                causes.append(DeferCause.LOADING_ELSEWHERE)
            if decision.own_jobs:
                causes.append(DeferCause.OWN_TRANSFER)
            waited = tuple(WaitedChunk(g, c, k, _CAUSES[cause])
                           for g, c, k, cause in decision.waited)
        elif decision.answer:
            loads = [r for r in observation.loads
                     if r.request == decision.request and r.step == decision.step]
            if loads:
                ranges = tuple(sorted(loads[-1].ranges().items()))
            # The keys its load jobs read: the jobs the connector built for the request
            # in the step that decided (vLLM builds them in the same schedule() call).
            loaded = tuple(k for j in sorted(log.jobs.values(), key=lambda j: j.job_id)
                           if j.kind == "load" and j.request == decision.request
                           and j.submitted == decision.step for k in j.key_texts)
        answer = None if decision.answer is None else decision.local_hit + decision.answer
        lookups.append(LookupRecord(decision.step, decision.request, decision.local_hit,
                                    answer, tuple(causes), waited, ranges,
                                    load_keys=loaded))
    stalled = tuple(sorted({k for j in (log.end.worker_stalled if log.end else ())
                            if j in log.jobs for k in log.jobs[j].key_texts}))
    offers = tuple(StoreOfferRecord(o.step, o.request, g, _offer_status(o), o.num_computed,
                                    chunks)
                   for o in log.offers for g, chunks in sorted(o.offered.items()))
    notes = TRACE_NOTES if log.end is not None else (
        *TRACE_NOTES, "live: the end state could not be read (the run stopped in a step)")
    notes = (*notes, *(f"live: the recorder failed ({e}): the record is incomplete"
                       for e in log.recorder_errors))
    return LifecycleTrace(
        steps=observation.steps, deferral_bound=None, lookups=tuple(lookups),
        jobs=tuple(line for job in sorted(log.jobs.values(), key=lambda j: j.job_id)
                   for line in _job_lines(job)),
        states=tuple(_states(observation, log)),
        exceptions=tuple(ExceptionRecord(e.step, None, _WHERE.get(e.where, e.where), e.type,
                                         e.message)
                         for e in observation.exceptions),
        offers=offers, recoveries=tuple(_recoveries(observation, log)),
        final=_final(observation, log), stalled_keys=stalled, notes=notes)


def judge(observation: LiveObservation, geometry: Geometry,
          ) -> dict[str, list[Violation]]:
    """C13-C15's judges on the live run: ``{"C13/deferral-bounded": [...], ...}``."""
    return judge_trace(to_trace(observation), geometry)
