"""One vLLM engine per geometry, kept for every case of that geometry, and what the
running release offers the judge.

An engine is :func:`kvcontract.live.build.build`'s (vLLM's own planning of the geometry,
its real ``Scheduler`` with the ``OffloadingConnector``) wrapped in a
:class:`~kvcontract.live.session.LiveSession` (one recorder of the connector's manager
calls and lookup answers). Building takes about 50 ms once vLLM is imported, so each
geometry is built once per process and every case of it runs on that engine, each case
on tokens no other case uses (so the chunks, GPU blocks and hashes of two cases never
meet) and torn down before the next (its request aborted, its jobs reported).

A geometry vLLM refuses to build is :class:`NotBuilt` with vLLM's message
(``by_vllm``); one the live backend cannot declare is kvcontract's gap, said so
(``by_vllm=False``): cases on it are left out of the engine's judgement, never judged
otherwise in its name.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kvcontract.live.build import BuildOptions, LiveEngine, Refused, build
from kvcontract.live.capabilities import vllm_names
from kvcontract.live.run import vllm_version
from kvcontract.live.session import LiveSession
from kvcontract.spec.geometry import Geometry

TOKEN_BASE = 1 << 16
"""Token ids the judge's requests start from (below it: the traces' own ids)."""
TOKEN_SPAN = 1 << 19
"""Distinct leading tokens before the judge's counter wraps (the vocabulary holds
``TOKEN_BASE + TOKEN_SPAN`` ids: :data:`kvcontract.live.build.VOCAB_SIZE`)."""


@dataclass(frozen=True)
class NotBuilt:
    """A geometry the judge cannot run: vLLM refused it, or the live backend cannot
    declare it (kvcontract's gap)."""

    geometry: Geometry
    reason: str
    by_vllm: bool

    def describe(self) -> str:
        who = "vLLM does not build it" if self.by_vllm else \
            "the live backend cannot declare it (kvcontract's gap)"
        return f"{who}: {self.reason}"


@dataclass(frozen=True)
class Capabilities:
    """What the running release's connector does, read off its objects."""

    version: str
    lookahead_hashes: bool
    """``OffloadingConnectorScheduler.use_lookahead_block_hashes``: an EAGLE group's
    trailing chunk is hashed with its lookahead and kept (0.34.0's default), so the
    legacy peek-and-pop (C5) does not run."""
    budget_hook: bool
    """The connector bounds a lookup by ``_max_loadable_tokens`` (groups it does not
    offload), the only way vLLM's scheduler passes a budget."""
    max_offload_tokens: bool
    """A request's ``kv_transfer_params`` may cap what it stores
    (``max_offload_tokens``)."""


def capabilities(engine: LiveEngine) -> Capabilities:
    connector = engine.scheduler.connector
    scheduler = engine.connector_scheduler
    RequestOffloadState = vllm_names(
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler",
        "RequestOffloadState")
    fields = getattr(RequestOffloadState, "__dataclass_fields__", {}) or {}
    slots = getattr(RequestOffloadState, "__slots__", ()) or ()
    return Capabilities(
        version=vllm_version(),
        lookahead_hashes=bool(getattr(scheduler, "use_lookahead_block_hashes", False)),
        budget_hook=callable(getattr(connector, "_max_loadable_tokens", None)),
        max_offload_tokens="max_offload_tokens" in fields or "max_offload_tokens" in slots)


@dataclass
class JudgeEngine:
    """A built engine and its session, reused for every case of its geometry."""

    geometry: Geometry
    session: LiveSession
    capabilities: Capabilities
    cases: int = 0

    @property
    def engine(self) -> LiveEngine:
        return self.session.engine


@dataclass
class EnginePool:
    """The engines of this process, one per geometry (and build options)."""

    options: BuildOptions = field(default_factory=BuildOptions)
    _engines: dict[tuple[str, BuildOptions], JudgeEngine | NotBuilt] = field(
        default_factory=dict)
    _tokens: Iterator[int] = field(default_factory=lambda: itertools.count())

    def get(self, geometry: Geometry, options: BuildOptions | None = None,
            ) -> JudgeEngine | NotBuilt:
        """The engine of ``geometry`` (built on first use), or why there is none."""
        options = options or self.options
        key = (repr(geometry.to_dict()), options)
        found = self._engines.get(key)
        if found is None:
            found = self._build(geometry, options)
            self._engines[key] = found
        return found

    def _build(self, geometry: Geometry, options: BuildOptions) -> JudgeEngine | NotBuilt:
        built = build(geometry, options)
        if isinstance(built, Refused):
            return NotBuilt(geometry, built.reason, built.by_vllm)
        session = LiveSession(built)
        return JudgeEngine(geometry, session, capabilities(built))

    def why_not(self, geometry: Geometry) -> NotBuilt | None:
        found = self.get(geometry)
        return found if isinstance(found, NotBuilt) else None

    def tokens(self, count: int, prefix: tuple[int, ...] = ()) -> list[int]:
        """``count`` tokens no other request of this process starts with: a fresh
        leading token, then a fixed pattern; ``prefix`` (a case's shared tokens) first
        when given."""
        lead = TOKEN_BASE + next(self._tokens) % TOKEN_SPAN
        fresh = [lead] + [TOKEN_BASE + (lead * 31 + 7 * i) % TOKEN_SPAN
                          for i in range(1, count)]
        return list(prefix[:count]) + fresh[:max(0, count - len(prefix))]

    def close(self) -> None:
        for found in self._engines.values():
            if isinstance(found, JudgeEngine):
                found.session.close()
        self._engines.clear()


def check_gaps(session: LiveSession) -> None:
    """Raise :class:`~kvcontract.live.gaps.DriverGapError` when the last operation met a
    gap of kvcontract's driver (the case says nothing about vLLM: UNKNOWN, never a
    verdict); the session is made usable for the next case."""
    from kvcontract.live.gaps import DriverGapError

    gaps = session.observation.driver_gaps
    if gaps:
        gap = gaps[0]
        gaps.clear()
        session.stopped = False
        raise DriverGapError(gap)


def driven(where: str, step: int, action: Callable[[], Any]) -> Any:
    """``action()`` (a step of vLLM driven directly), an exception that is a gap of
    kvcontract's driver raised as :class:`~kvcontract.live.gaps.DriverGapError`."""
    from kvcontract.live.gaps import DriverGapError, driver_gap_of

    try:
        return action()
    except DriverGapError:
        raise
    except Exception as exc:
        gap = driver_gap_of(exc, step, where)
        if gap is not None:
            raise DriverGapError(gap) from exc
        raise


def release_request(judge: JudgeEngine, request: Any) -> None:
    """End ``request`` whatever its state (vLLM's own abort: ``finish_requests`` with
    ``FINISHED_ABORTED``), then report every job the worker holds until the scheduler
    has no request and no job left: the next case meets a clean engine."""
    session = judge.session
    scheduler = judge.engine.scheduler
    RequestStatus = vllm_names("vllm.v1.request", "RequestStatus")
    if request is not None and not request.is_finished():
        scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)
    for _ in range(8):
        for job in session.worker.pending.values():
            job.due = session.worker.step
        session.engine.scheduler.max_num_scheduled_tokens = 0
        driven("release", session.run.step, session.run.step_once)
        if not scheduler.has_unfinished_requests() and not session.worker.pending:
            _forget(session)
            return
    raise RuntimeError("the engine kept a request or a job after eight draining steps")


def _forget(session: LiveSession) -> None:
    """Drop what the session recorded of the finished cases: a case's observation is
    read before its request is released, and the recorder's per-step work must not grow
    with the cases already judged."""
    observation = session.observation
    for records in (observation.lookups, observation.matches, observation.loads,
                    observation.stores, observation.exceptions, observation.driver_gaps):
        records.clear()
    observation.requests.clear()
    session.run.live.clear()
    session.run.recorder.names.clear()
    session.worker.completed.clear()
    session.worker.flushed.clear()
