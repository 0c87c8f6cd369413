"""Drive vLLM's real ``Scheduler`` through a :class:`~kvcontract.live.trace.Trace`.

Each step: the trace's events (aborts, cache resets), ``Scheduler.schedule()``, the
host-only worker takes the step's connector metadata, a stand-in model output (one
sampled token for every request whose scheduled tokens reach its end) carries the
worker's ``KVConnectorOutput``, ``Scheduler.update_from_output()``. The connector's
``OffloadingManager`` is observed through a recording proxy (every ``lookup``,
``prepare_load`` and ``prepare_store`` with the chunks they name) and the connector's
``get_num_new_matched_tokens`` through a wrapper; vLLM's code is run as it is.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcontract.live.build import BuildOptions, LiveEngine, Refused, build
from kvcontract.live.capabilities import has, vllm_names
from kvcontract.live.gaps import driver_gap_of
from kvcontract.live.observation import (
    LiveException,
    LiveObservation,
    LoadRecord,
    LookupAnswer,
    MatchAnswer,
    RequestOutcome,
    StoreOffer,
)
from kvcontract.live.trace import Phase, Trace, TraceRequest, sampled_token
from kvcontract.live.worker import HostWorker
from kvcontract.spec.geometry import Geometry
from kvcontract.vocabulary import LookupResult

_RECORDED = ("lookup", "prepare_load", "prepare_store")


@dataclass
class Recorder:
    """What the connector asked its manager (and what it matched), in kvcontract's
    words, appended to ``observation``; the one recorder of :class:`LiveRun` and
    :class:`~kvcontract.live.session.LiveSession`."""

    engine: LiveEngine
    observation: LiveObservation
    step: int = 0
    names: dict[str, str] = field(default_factory=dict)
    """vLLM request id -> trace name."""

    def chunk_of(self, key: Any, context: Any) -> tuple[int, int, int]:
        """``(geometry group, vLLM group, chunk index)`` of an offload key."""
        get_offload_group_idx = vllm_names("vllm.v1.kv_offload.base", "get_offload_group_idx")

        vgroup = int(get_offload_group_idx(key))
        position = getattr(context, "get_offload_key_position", None)
        if position is not None:
            end = position(key)
            tpc = self.engine.tokens_per_chunk[vgroup]
            chunk = int(end) // tpc - 1 if end is not None else -1
        else:  # 0.30: no positions on the context; the request's own key list
            chunk = self._key_index(key, context, vgroup)
        return self.engine.group_of[vgroup], vgroup, chunk

    def _key_index(self, key: Any, context: Any, vgroup: int) -> int:
        state = self.engine.connector_scheduler._req_status.get(
            str(getattr(context, "req_id", "")))
        if state is None:
            return -1
        for config, group_state in zip(state.config.kv_group_configs, state.group_states,
                                       strict=False):
            if config.group_idx == vgroup and key in group_state.offload_keys:
                return int(group_state.offload_keys.index(key))
        return -1

    def request_of(self, context: Any) -> str:
        rid = str(getattr(context, "req_id", "") or getattr(context, "request_id", ""))
        return self.names.get(rid, rid)

    def record(self, name: str, args: tuple[Any, ...], result: Any) -> None:
        context = args[1] if len(args) > 1 else None
        request = self.request_of(context)
        if name == "lookup":
            g, v, k = self.chunk_of(args[0], context)
            self.observation.lookups.append(LookupAnswer(
                self.step, request, g, v, k, LookupResult[str(result.name)]))
            return
        chunks: dict[int, list[int]] = {}
        for key in args[0]:
            g, _, k = self.chunk_of(key, context)
            chunks.setdefault(g, []).append(k)
        named = {g: tuple(sorted(c)) for g, c in chunks.items()}
        if name == "prepare_load":
            self.observation.loads.append(LoadRecord(self.step, request, named))
            return
        new: dict[int, list[int]] = {}
        evicted = 0
        if result is not None:
            for key in result.keys_to_store:
                g, _, k = self.chunk_of(key, context)
                new.setdefault(g, []).append(k)
            evicted = len(result.evicted_keys)
        self.observation.stores.append(StoreOffer(
            self.step, request, named, {g: tuple(sorted(c)) for g, c in new.items()},
            evicted, refused=result is None))


class _ManagerProxy:
    """The connector's manager, every call delegated; the recorded ones logged."""

    def __init__(self, inner: Any, recorder: Recorder) -> None:
        self._inner = inner
        self._recorder = recorder

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name not in _RECORDED:
            return attribute

        def recorded(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            self._recorder.record(name, args, result)
            return result

        return recorded


def install_recorders(engine: LiveEngine, recorder: Recorder) -> None:
    connector_scheduler = engine.connector_scheduler
    connector_scheduler.manager = _ManagerProxy(connector_scheduler.manager, recorder)
    connector = engine.scheduler.connector
    original: Callable[..., tuple[int | None, bool]] = connector.get_num_new_matched_tokens

    def matched(request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        result = original(request, num_computed_tokens)
        recorder.observation.matches.append(MatchAnswer(
            recorder.step, recorder.names.get(request.request_id, request.request_id),
            int(num_computed_tokens), None if result[0] is None else int(result[0]),
            bool(result[1])))
        return result

    connector.get_num_new_matched_tokens = matched
    register = getattr(connector_scheduler, "_maybe_register_shared_prefix_junction", None)
    if callable(register):
        connector_scheduler._maybe_register_shared_prefix_junction = _JunctionRecorder(
            register, recorder)


@dataclass
class _JunctionRecorder:
    """The connector's junction registration as it is, recording each junction it sets
    on a request (its caller passes the request's offload state first)."""

    register: Callable[..., Any]
    recorder: Recorder

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = getattr(args[0] if args else kwargs.get("req_status"), "req", None)
        before = getattr(request, "shared_prefix_boundary", None)
        result = self.register(*args, **kwargs)
        after = getattr(request, "shared_prefix_boundary", None)
        if request is not None and isinstance(after, int) and after and after != before:
            rid = str(request.request_id)
            name = self.recorder.names.get(rid, rid)
            outcome = self.recorder.observation.requests.get(name)
            if outcome is not None:
                outcome.connector_junctions.add(after)
        return result


def vllm_version() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class LiveRun:
    """One engine and the trace driven through it (:func:`run_trace` is the usual
    entry point)."""

    def __init__(self, engine: LiveEngine, trace: Trace) -> None:
        self.engine = engine
        self.trace = trace
        self.observation = LiveObservation(engine.geometry.to_dict(), vllm_version(),
                                           cpu_chunks=engine.cpu_chunks,
                                           notes=list(engine.notes))
        self.recorder = Recorder(engine, self.observation)
        self.worker = HostWorker(trace.timing,
                                 release=(engine.vllm_config, engine.kv_cache_config))
        self.step = 0
        self.live: dict[str, Any] = {}
        """trace name -> vLLM Request, for the requests that arrived."""
        install_recorders(engine, self.recorder)

    # -- requests -----------------------------------------------------------------------
    def _request(self, spec: TraceRequest) -> Any:
        SamplingParams = vllm_names("vllm.sampling_params", "SamplingParams")
        Request = vllm_names("vllm.v1.request", "Request")

        rid = f"{spec.name}#{len(self.live)}"
        self.recorder.names[rid] = spec.name
        params = SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True)
        request = Request(rid, list(spec.tokens), params, None,
                          block_hasher=self.engine.block_hasher)
        if spec.kv_transfer_params:
            request.kv_transfer_params = dict(spec.kv_transfer_params)
        return request

    def arrive(self, spec: TraceRequest) -> None:
        """Add the request ``spec`` to the scheduler now."""
        request = self._request(spec)
        self.live[spec.name] = request
        self.observation.requests[spec.name] = RequestOutcome(spec.name, arrived=self.step)
        self.engine.scheduler.add_request(request)

    def abort(self, name: str) -> None:
        """Abort the request named ``name`` (nothing when it is finished or unknown)."""
        RequestStatus = vllm_names("vllm.v1.request", "RequestStatus")

        request = self.live.get(name)
        if request is not None and not request.is_finished():
            self.engine.scheduler.finish_requests(request.request_id,
                                                  RequestStatus.FINISHED_ABORTED)

    def reset(self, kind: str) -> None:
        """``reset-prefix-cache`` (the GPU prefix cache alone) or ``reset-all``."""
        result = self.engine.scheduler.reset_prefix_cache(
            reset_connector=(kind == "reset-all"))
        self.observation.resets.append((self.step, kind, bool(result)))

    # -- one step -----------------------------------------------------------------------
    def _model_output(self, output: Any) -> Any:
        ModelRunnerOutput = vllm_names("vllm.v1.outputs", "ModelRunnerOutput")

        scheduler = self.engine.scheduler
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            request = scheduler.requests[rid]
            done = request.num_computed_tokens >= request.num_tokens
            sampled.append([sampled_token(request.num_output_tokens)] if done else [])
        kwargs: dict[str, Any] = {}
        if has("model-output-index-map"):  # dropped in 0.34: the order of req_ids is it
            kwargs["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled,
                                 kv_connector_output=self.worker.output(), **kwargs)

    def _observe_schedule(self, output: Any) -> None:
        names = self.recorder.names
        started = {r.req_id: r.num_computed_tokens for r in output.scheduled_new_reqs}
        cached = output.scheduled_cached_reqs
        for rid, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=False):
            if rid in getattr(cached, "resumed_req_ids", ()):
                started.setdefault(rid, computed)
        for rid, count in output.num_scheduled_tokens.items():
            outcome = self.observation.requests.get(names.get(rid, rid))
            if outcome is None:
                continue
            outcome.scheduled.append(int(count))
            junction = getattr(self.engine.scheduler.requests.get(rid),
                               "shared_prefix_boundary", None)
            if isinstance(junction, int) and junction:
                outcome.junctions.add(junction)
            if outcome.first_compute_step is None:
                outcome.first_compute_step = self.step
                request = self.engine.scheduler.requests[rid]
                outcome.reused_tokens = int(started.get(
                    rid, request.num_computed_tokens - count))
        for rid in output.preempted_req_ids or ():
            outcome = self.observation.requests.get(names.get(rid, rid))
            if outcome is not None:
                outcome.preempted += 1
        for name, outcome in self.observation.requests.items():
            request = self.live.get(name)
            if (outcome.first_compute_step is None and request is not None
                    and not request.is_finished()
                    and request.request_id not in output.num_scheduled_tokens):
                outcome.deferred_steps += 1

    def step_once(self) -> Any:
        """One ``schedule()`` / worker / ``update_from_output()``; the step's connector
        metadata."""
        scheduler = self.engine.scheduler
        self.recorder.step = self.step
        output = scheduler.schedule()
        self._observe_schedule(output)
        metadata = output.kv_connector_metadata
        self.worker.submit(metadata)
        scheduler.update_from_output(output, self._model_output(output))
        self.step += 1
        return metadata

    def is_idle(self, metadata: Any) -> bool:
        """No unfinished request, no job in ``metadata``, none the worker will report."""
        scheduler = self.engine.scheduler
        if scheduler.has_unfinished_requests():
            return False
        if metadata is not None and (metadata.load_jobs or metadata.store_jobs):
            return False
        return all(job.due is None for job in self.worker.pending.values())

    def run_phase(self, phase: Phase) -> bool:
        """Run one phase; False when vLLM raised (the trace stops)."""
        start = self.step
        arrivals = sorted(phase.requests, key=lambda r: r.arrive_at)
        for _ in range(phase.max_steps):
            local = self.step - start
            try:
                for spec in arrivals:
                    if spec.arrive_at == local:
                        self.arrive(spec)
                    if spec.abort_at is not None and spec.abort_at == local:
                        self.abort(spec.name)
                for event in phase.events:
                    if event.step == local:
                        if event.kind == "abort" and event.request is not None:
                            self.abort(event.request)
                        elif event.kind in ("reset-prefix-cache", "reset-all"):
                            self.reset(event.kind)
                metadata = self.step_once()
            except Exception as exc:  # vLLM's own failure is the observation
                self.record_exception(exc, "step")
                return False
            pending_arrivals = any(r.arrive_at > local for r in arrivals)
            pending_events = any(e.step > local for e in phase.events)
            if not pending_arrivals and not pending_events and self.is_idle(metadata):
                break
        if phase.reset_prefix_cache_after:
            try:
                self.reset("reset-prefix-cache")
            except Exception as exc:
                self.record_exception(exc, "reset_prefix_cache")
                return False
        return True

    def record_exception(self, exc: Exception, where: str) -> None:
        """An exception of a step (or of an operation at ``where``): a gap of
        kvcontract's driver (:func:`~kvcontract.live.gaps.driver_gap_of`), else vLLM's
        failure, the run's outcome."""
        gap = driver_gap_of(exc, self.step, where)
        if gap is not None:
            self.observation.driver_gaps.append(gap)
        else:
            self.observation.exceptions.append(LiveException(
                self.step, where, type(exc).__name__, str(exc)))

    def run(self) -> LiveObservation:
        for phase in self.trace.phases:
            if not self.run_phase(phase):
                break
        return self.finish()

    def finish(self) -> LiveObservation:
        """Fill the observation's totals and per-request outcomes; the observation."""
        observation = self.observation
        observation.steps = self.step
        observation.flushed_jobs = len(self.worker.flushed)
        observation.stalled_jobs = len(self.worker.stalled)
        observation.failed_loads = sum(1 for j in self.worker.pending.values() if j.failed)
        for name, request in self.live.items():
            outcome = observation.requests[name]
            outcome.status = str(request.status.name)
            outcome.num_computed = int(request.num_computed_tokens)
        return observation


def run_trace(geometry: Geometry, trace: Trace,
              options: BuildOptions | None = None) -> LiveObservation | Refused:
    """Build the engine for ``geometry`` and drive ``trace`` through it: the
    observation, or :class:`~kvcontract.live.build.Refused` when vLLM will not build
    the geometry."""
    engine = build(geometry, options)
    if isinstance(engine, Refused):
        return engine
    try:
        return LiveRun(engine, trace).run()
    finally:
        shutdown(engine)


def shutdown(engine: LiveEngine) -> None:
    """Release the engine's connector (its manager's threads, if any)."""
    with contextlib.suppress(Exception):  # a shutdown failure changes no observation
        engine.scheduler.shutdown()
