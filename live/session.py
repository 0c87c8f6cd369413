"""An incremental driver of the live engine: the fuzzer's program operations on vLLM.

Contract: a :class:`LiveSession` runs one engine (:func:`~kvcontract.live.build.build`)
one operation at a time, with the operations and arguments of kvcontract's executable
system (:class:`~kvcontract.impl.system.engine.OffloadSystem`: ``add_request``,
``step``, ``finish``, ``finish_with_error``, ``abort``, ``preempt``, ``drain``,
``stall_next_store``, ``fail_next_load``, ``retry_lookups``) and of its test fixtures
(:class:`~kvcontract.tools.harness.SystemHarness`: ``install_chunk``, ``mark_loading``,
``perturb_left_chunk``, ``fail_next_store``, ``evict_gpu_cache``), so a fuzz program
drives both. Each operation reaches vLLM through vLLM's own API:

* ``step(budget)``: ``Scheduler.max_num_scheduled_tokens`` is set to ``budget`` (the
  scheduler reads it at every ``schedule()``), then one schedule / host-worker /
  ``update_from_output`` step of :class:`~kvcontract.live.run.LiveRun` (whose recorder
  observes the connector's manager: one recorder for traces and sessions);
* ``finish``: ``Scheduler.finish_requests(..., FINISHED_STOPPED)``; ``abort``: the same
  with ``FINISHED_ABORTED``; both are ignored where the executable system ignores them
  (a finish during prefill, either while the request's load is in flight), so the two
  systems run the same program;
* ``preempt``: the scheduler's own ``_preempt_request`` on a running request (what it
  does under memory pressure), the request taken out of ``running`` first, as vLLM does;
* ``drain``: every job the worker will report is reported now, in one step with a zero
  token budget (nothing is computed);
* ``evict_gpu_cache``: ``reset_prefix_cache(reset_connector=False)``, or, while requests
  hold blocks (vLLM then refuses the reset), ``BlockPool.evict_blocks`` on every free
  block: the GPU prefix cache loses what no request holds, the offloaded tier is kept;
* ``fail_next_store``: where the release's worker reports failed transfers (capability
  ``failed-transfer-jobs``, 0.34.0), the next store job is reported failed
  (``failed_jobs``) and the connector drops its chunks (absent), as the executable
  system does; where it does not (0.33.0: a job is done or not reported at all), the
  next store job is never reported (its chunks stay HIT_PENDING) while the executable
  system drops them (the differential's ``failed-store`` class);
* ``stall_next_store``: the next store job is never reported (its chunks stay pending
  on both systems);
* ``fail_next_load``: the next load job is reported failed through the scheduler's own
  failure API (its request in ``failed_recving``, and in ``failed_jobs`` where the
  release has them), as the executable system fails it, under vLLM's
  ``kv_load_failure_policy = "recompute"`` (the system's recovery; vLLM's default,
  ``fail``, ends the request with an error); vLLM then decides (0.34.0 marks the request
  so it never loads from the offloaded tier again, C15);
* ``finish_with_error``: ``Scheduler.finish_requests(..., FINISHED_ERROR)`` on a running
  request wherever its prefill is (a grammar or encoder-cache error; C14's store horizon),
  ignored on any other, as the executable system ignores it;
* ``retry_lookups``: the connector's manager answers RETRY to every lookup of the next
  program steps (a stand-in tier with an asynchronous lookup in flight, wrapped around
  vLLM's manager; vLLM's connector decides what a RETRY means);
* ``install_chunk`` / ``mark_loading``: the chunk's offload keys computed by vLLM (a
  probe ``Request`` hashed by the engine's block hasher, then
  ``RequestOffloadState.update_offload_keys``), put into vLLM's ``CPUOffloadingManager``
  by its own API: ``prepare_store`` + ``complete_store`` (READY), ``prepare_store`` alone
  (PENDING), ``prepare_load`` plus the connector's being-loaded set (another request is
  loading it, as ``update_state_after_alloc`` records an asynchronous load);
* ``perturb_left_chunk``: only ``loading`` has a live equivalent; ``absent``, ``pending``
  and ``stale`` would take a chunk vLLM stored out of its manager, which has no API for
  that (eviction is its LRU's choice), so they raise :class:`NotReplayableError`.

A state with no faithful live equivalent raises :class:`NotReplayableError` (the
program is reported ``not replayable`` with the reason); an exception vLLM raises in a
step is recorded in the observation (a crash) and the session stops there; an exception
of the driver's own (:mod:`kvcontract.live.gaps`) is recorded as a driver gap and stops
it too (the program is not replayable). The fixtures need the release's
``RequestOffloadState`` and key positions (capabilities ``request-offload-state``,
``key-positions``); without them they raise :class:`NotReplayableError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvcontract.impl.system.engine import RETRY_STEPS
from kvcontract.live.build import BuildOptions, LiveEngine, Refused, build
from kvcontract.live.capabilities import has, vllm_names
from kvcontract.live.observation import LiveObservation
from kvcontract.live.run import LiveRun, shutdown
from kvcontract.live.trace import Trace, TraceRequest
from kvcontract.live.worker import HostWorker, Timing
from kvcontract.spec import multigroup
from kvcontract.spec.geometry import Geometry
from kvcontract.vocabulary import LookupResult

CHUNK_STATES = ("ready", "pending", "absent")
"""The chunk states a fixture installs (``impl.system.offload.ChunkState`` values)."""


class NotReplayableError(Exception):
    """A program operation with no faithful equivalent on the live engine."""


class _FailingWorker(HostWorker):
    """The host-only worker, with the next ``fail_stores`` store jobs failed: reported
    failed (``failed_jobs``) where the release's connector knows failed stores
    (capability ``failed-transfer-jobs``: it drops the chunks), never reported where it
    does not (0.33.0: a store it never hears of stays pending); and the next
    ``stall_stores`` store jobs never reported."""

    fail_stores: int = 0
    stall_stores: int = 0
    fail_loads: int = 0

    def submit(self, metadata: Any) -> None:
        before = set(self.pending)
        super().submit(metadata)
        for job_id in sorted(set(self.pending) - before):
            job = self.pending[job_id]
            if not job.is_store:
                if self.fail_loads > 0:
                    self.fail_loads -= 1
                    job.failed = True
                continue
            if self.fail_stores > 0:
                self.fail_stores -= 1
                if has("failed-transfer-jobs"):
                    job.failed = True
                else:
                    job.due = None
            elif self.stall_stores > 0:
                self.stall_stores -= 1
                job.due = None


class _RetryingManager:
    """The connector's manager, answering RETRY to every lookup while the session's
    RETRY window is open (``LiveSession.retry_lookups``): what an offload tier with an
    asynchronous lookup in flight answers (vLLM's ``LookupResult.RETRY``, which its
    connector defers on); every other call, and every lookup outside the window, is the
    manager's own."""

    def __init__(self, inner: Any, session: LiveSession) -> None:
        self._inner = inner
        self._session = session

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name != "lookup":
            return attribute

        def lookup(*args: Any, **kwargs: Any) -> Any:
            if self._session.retrying():
                return _vllm_lookup_result("RETRY")
            return attribute(*args, **kwargs)

        return lookup


class LiveSession:
    """One live engine driven by program operations (see the module docstring)."""

    def __init__(self, engine: LiveEngine, timing: Timing | None = None) -> None:
        self.engine = engine
        # The connector's own manager, before LiveRun wraps it in its recording proxy:
        # fixtures are no request's lookups, loads or stores.
        self.manager: Any = engine.connector_scheduler.manager
        self.program_steps = 0
        """``step`` operations run (a drain's step is not one: the executable system's
        drain computes nothing and looks nothing up)."""
        self.retry_through = -1
        """The last program step whose lookups answer RETRY (:meth:`retry_lookups`)."""
        self._in_step = False
        # Inside the recording proxy LiveRun installs next, so a RETRY is recorded as
        # the connector saw it.
        engine.connector_scheduler.manager = _RetryingManager(self.manager, self)
        self.run = LiveRun(engine, Trace((), timing or Timing()))
        self.worker = _FailingWorker(self.run.worker.timing, release=self.run.worker.release)
        self.run.worker = self.worker
        self.observation: LiveObservation = self.run.observation
        self.log: list[str] = []
        """What the session did that is not a vLLM decision (ignored operations)."""
        self.stopped = False
        """vLLM raised: the session ignores further operations."""
        self._fixtures = 0
        self._closed = False

    @classmethod
    def open(cls, geometry: Geometry, options: BuildOptions | None = None,
             timing: Timing | None = None) -> LiveSession | Refused:
        """A session on a fresh engine for ``geometry``, or why vLLM will not build it."""
        engine = build(geometry, options)
        if isinstance(engine, Refused):
            return engine
        return cls(engine, timing)

    def close(self) -> LiveObservation:
        """Finish the observation and release the engine; the observation."""
        if not self._closed:
            self._closed = True
            self.run.finish()
            shutdown(self.engine)
        return self.observation

    # -- the system's operations ----------------------------------------------------------
    def _guard(self, where: str, action: Any, *args: Any) -> Any:
        if self.stopped:
            return None
        try:
            return action(*args)
        except NotReplayableError:
            raise
        except Exception as exc:  # vLLM's own failure (or a driver gap) is the observation
            self.run.record_exception(exc, where)
            self.stopped = True
            return None

    def _request(self, name: str) -> Any:
        return self.run.live.get(name)

    def add_request(self, name: str, tokens: Sequence[int], max_new_tokens: int = 2) -> None:
        # The executable system computes a request's ``max_new_tokens``-th sampled token
        # before it finishes; vLLM finishes a request when it samples its
        # ``max_tokens``-th, never computing it: one more sample computes as many tokens.
        spec = TraceRequest(name, tuple(int(t) for t in tokens),
                            max_tokens=max_new_tokens + 1)
        self._guard("add_request", self.run.arrive, spec)

    def step(self, budget: int) -> None:
        self.program_steps += 1
        self._in_step = True
        try:
            self._guard("step", self._step, budget)
        finally:
            self._in_step = False

    def retrying(self) -> bool:
        """Whether the lookups made now answer RETRY: during program steps up to
        ``retry_through``, the executable system's numbering (its steps count from 1)."""
        return self._in_step and self.program_steps <= self.retry_through

    def retry_lookups(self, steps: int = RETRY_STEPS) -> None:
        """Every lookup of the next ``steps`` program steps answers RETRY, as
        ``OffloadSystem.retry_lookups``."""
        self.retry_through = self.program_steps + steps

    def _step(self, budget: int) -> None:
        self.engine.scheduler.max_num_scheduled_tokens = int(budget)
        self.run.step_once()

    def finish(self, name: str) -> None:
        request = self._request(name)
        if request is None or request.is_finished():
            return
        status = str(request.status.name)
        if status == "WAITING_FOR_REMOTE_KVS":
            self.log.append(f"finish {name} ignored (loading)")
            return
        if request.num_computed_tokens < request.num_prompt_tokens:
            # The executable system's rule: a request is finished by sampling, so a stop
            # while waiting or prefilling is an abort, and the program says so explicitly.
            self.log.append(f"finish {name} ignored ({status.lower()}, prompt not computed)")
            return
        self._guard("finish", self._end, request, "FINISHED_STOPPED")

    def abort(self, name: str) -> None:
        request = self._request(name)
        if request is None or request.is_finished():
            return
        if str(request.status.name) == "WAITING_FOR_REMOTE_KVS":
            self.log.append(f"abort {name} ignored (loading)")
            return
        self._guard("abort", self._end, request, "FINISHED_ABORTED")

    def finish_with_error(self, name: str) -> None:
        request = self._request(name)
        if request is None or str(request.status.name) != "RUNNING":
            self.log.append(f"error-finish {name} ignored (not running)")
            return
        self._guard("finish_with_error", self._end, request, "FINISHED_ERROR")

    def _end(self, request: Any, status: str) -> None:
        RequestStatus = vllm_names("vllm.v1.request", "RequestStatus")
        self.engine.scheduler.finish_requests(request.request_id, RequestStatus[status])

    def preempt(self, name: str) -> None:
        request = self._request(name)
        if request is None or str(request.status.name) != "RUNNING":
            return
        self._guard("preempt", self._preempt, request)

    def _preempt(self, request: Any) -> None:
        import time

        if not has("preempt-request"):
            raise NotReplayableError("the installed vLLM's Scheduler has no "
                                     "_preempt_request(request, timestamp) to preempt with")
        scheduler = self.engine.scheduler
        if request not in scheduler.running:
            return
        # vLLM's contract for _preempt_request: the caller pops it from running.
        scheduler.running.remove(request)
        scheduler._preempt_request(request, time.monotonic())
        outcome = self.observation.requests.get(self.run.recorder.names.get(
            request.request_id, request.request_id))
        if outcome is not None:
            outcome.preempted += 1

    def drain(self) -> None:
        """Every job the worker will report is reported, in one step computing nothing."""
        if not self.worker.pending:
            return
        for job in self.worker.pending.values():
            if job.due is not None:
                job.due = self.worker.step
        self._guard("drain", self._step, 0)

    # -- the fixtures -------------------------------------------------------------------
    def evict_gpu_cache(self) -> None:
        self._guard("evict_gpu_cache", self._evict_gpu_cache)

    def _evict_gpu_cache(self) -> None:
        scheduler = self.engine.scheduler
        if scheduler.reset_prefix_cache(reset_connector=False):
            self.observation.resets.append((self.run.step, "reset-prefix-cache", True))
            return
        pool = scheduler.kv_cache_manager.block_pool
        free = {block.block_id for block in pool.free_block_queue.get_all_free_blocks()}
        pool.evict_blocks(free)
        self.observation.resets.append((self.run.step, "evict-free-blocks", True))

    def fail_next_store(self) -> None:
        self.worker.fail_stores += 1

    def fail_next_load(self) -> None:
        # The executable system recovers a failed load as vLLM's recompute policy does
        # (docs/CONTRACT.md C15); under its default, fail, vLLM ends the request with an
        # error instead, which no model step mirrors.
        from kvcontract.live.lifecycle import _set_load_failure_policy

        _set_load_failure_policy(self.engine, "recompute")
        self.worker.fail_loads += 1

    def stall_next_store(self) -> None:
        """The next store job is never reported (a stalled write, vLLM #49829); where the
        release knows no failed store, ``fail_next_store`` is the same knob."""
        self.worker.stall_stores += 1

    def offload_keys(self, tokens: Sequence[int]) -> tuple[dict[tuple[int, int], list[Any]],
                                                           Any]:
        """vLLM's offload keys of every complete chunk ``(geometry group, chunk)`` of a
        request with ``tokens`` (one key per vLLM group of the geometry group), and the
        probe's request context (the keys' positions are set on it)."""
        try:
            RequestOffloadState = vllm_names(
                "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler",
                "RequestOffloadState")
            ReqContext = vllm_names("vllm.v1.kv_offload.base", "ReqContext")
        except (ImportError, AttributeError) as exc:
            raise NotReplayableError(
                f"this vLLM release has no RequestOffloadState/ReqContext ({exc}): the "
                "fixtures' offload keys cannot be computed by vLLM") from None
        SamplingParams = vllm_names("vllm.sampling_params", "SamplingParams")
        Request = vllm_names("vllm.v1.request", "Request")

        self._fixtures += 1
        rid = f"kvcontract-fixture-{self._fixtures}"
        probe = Request(rid, [int(t) for t in tokens], SamplingParams(max_tokens=1), None,
                        block_hasher=self.engine.block_hasher)
        context = ReqContext(req_id=rid)
        config = self.engine.connector_scheduler.config
        state = RequestOffloadState(config=config, req=probe, req_context=context,
                                    offloading_context=self.manager.on_new_request(context))
        state.update_offload_keys()
        keys: dict[tuple[int, int], list[Any]] = {}
        for group_config, group_state in zip(config.kv_group_configs, state.group_states,
                                             strict=True):
            g = self.engine.group_of[group_config.group_idx]
            for k, key in enumerate(group_state.offload_keys):
                keys.setdefault((g, k), []).append(key)
        return keys, context

    def _chunk(self, tokens: Sequence[int], group: int, chunk: int) -> tuple[list[Any], Any]:
        keys, context = self.offload_keys(tokens)
        found = keys.get((int(group), int(chunk)))
        if not found:
            raise NotReplayableError(
                f"group {group} has no complete chunk {chunk} in {len(tokens)} tokens")
        return found, context

    def install_chunk(self, tokens: Sequence[int], group: int, chunk: int,
                      state: Any) -> None:
        """Put the chunk's keys into vLLM's manager in ``state`` (ready, pending, absent)."""
        value = str(getattr(state, "value", state))
        if value not in CHUNK_STATES:
            raise NotReplayableError(f"unknown chunk state {state!r}")
        keys, context = self._chunk(tokens, group, chunk)
        present = [k for k in keys if self.manager.lookup(k, context) is not _miss()]
        if value == "absent":
            if present:
                raise NotReplayableError(
                    f"install_chunk(absent) of group {group} chunk {chunk}, which vLLM's "
                    "manager holds: it has no API to drop one chunk")
            return
        if present:
            raise NotReplayableError(
                f"install_chunk({value}) of group {group} chunk {chunk}, which vLLM's "
                "manager already holds: it cannot be put in another state")
        output = self.manager.prepare_store(keys, context)
        if output is None:
            raise NotReplayableError(
                f"vLLM's manager has no room to install group {group} chunk {chunk}")
        if value == "ready":
            self.manager.complete_store(output.keys_to_store, context)

    def mark_loading(self, tokens: Sequence[int], group: int, chunk: int) -> None:
        """Another request is loading the chunk: vLLM's manager pins it for the load
        (``prepare_load``) and the connector counts it as being loaded."""
        keys, context = self._chunk(tokens, group, chunk)
        self._hold_loading(keys, context, f"group {group} chunk {chunk}")

    def _hold_loading(self, keys: list[Any], context: Any, what: str) -> None:
        if any(self.manager.lookup(k, context) is not _hit() for k in keys):
            raise NotReplayableError(f"mark_loading of {what}, which is not ready in "
                                     "vLLM's manager (prepare_load asserts it is)")
        self.manager.prepare_load(keys, context)
        being_loaded = self.engine.connector_scheduler._chunks_being_loaded
        if being_loaded is None:
            raise NotReplayableError("the connector tracks no chunks being loaded "
                                     "(prefix caching is off)")
        being_loaded.update(keys)

    def perturb_left_chunk(self, tokens: Sequence[int], state: str) -> None:
        """``loading``: the harness's left chunk (the first of the read range of the SWA
        group with the widest range, at the boundary the contract accepts given vLLM's
        own GPU hit and manager states) is marked being loaded. Other states would take
        a stored chunk out of vLLM's manager: not replayable."""
        if state != "loading":
            raise NotReplayableError(
                f"perturb_left_chunk({state}): vLLM's CPUOffloadingManager has no API to "
                "drop a stored chunk or make it pending again (eviction is its LRU's)")
        geo = self.engine.geometry
        keys, context = self.offload_keys(tokens)
        found = multigroup.left_chunk(
            geo, len(tokens), self._gpu_hit(tokens),
            lambda g, k: _kv_state(self.manager, keys[(g, k)], context))
        if found is None:
            self.log.append("perturb: no boundary to perturb")
            return
        best, g, chunk = found
        self._hold_loading(keys[(g, chunk)], context, f"group {g} chunk {chunk}")
        self.log.append(f"perturb g{g} chunk {chunk} of boundary {best} -> loading")

    def _gpu_hit(self, tokens: Sequence[int]) -> int:
        """The GPU prefix hit vLLM's KV-cache manager gives a request with ``tokens``."""
        SamplingParams = vllm_names("vllm.sampling_params", "SamplingParams")
        Request = vllm_names("vllm.v1.request", "Request")

        probe = Request("kvcontract-gpu-probe", [int(t) for t in tokens],
                        SamplingParams(max_tokens=1), None,
                        block_hasher=self.engine.block_hasher)
        # The scheduler's own local-hit rule (with a connector: the connector's variant).
        return int(self.engine.scheduler._get_local_prefix_cache_hit(probe)[1])


def _vllm_lookup_result(name: str) -> Any:
    return getattr(vllm_names("vllm.v1.kv_offload.base", "LookupResult"), name)


def _miss() -> Any:
    return _vllm_lookup_result("MISS")


def _hit() -> Any:
    return _vllm_lookup_result("HIT")


def _kv_state(manager: Any, keys: list[Any], context: Any) -> LookupResult:
    """A chunk's state over its vLLM groups' keys, in kvcontract's words (the worst)."""
    results = [LookupResult[str(manager.lookup(k, context).name)] for k in keys]
    for word in (LookupResult.MISS, LookupResult.HIT_PENDING, LookupResult.RETRY):
        if word in results:
            return word
    return LookupResult.HIT
