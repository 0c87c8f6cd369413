"""A host-only stand-in for the offloading connector's worker side.

``CPUOffloadingSpec.get_worker`` refuses anything but CUDA/XPU, so no bytes move: this
worker takes each step's ``OffloadingConnectorMetadata`` (load and store jobs, jobs to
flush) and reports jobs finished the way the real worker does, through
``KVConnectorOutput.kv_connector_worker_meta`` (an ``OffloadingWorkerMetadata`` with
``completed_jobs``) and ``finished_recving`` for a request whose asynchronous load is
done. When it reports is the timing knob (:class:`Timing`): at once (the same step's
output), ``delay`` steps later, never (a stalled job: its chunks stay HIT_PENDING),
``fail`` (a load reported through the scheduler's failure API: its request in
``failed_recving`` and ``finished_recving``, its job completed, and, where the release's
worker metadata has ``failed_jobs`` (capability ``failed-transfer-jobs``), the job
marked failed there, as a worker that supports failed transfers reports one; a store so
timed is reported failed the same way where the release has ``failed_jobs``, and never
finishes where it has not), or ``worker-fail`` (the failed transfer, load or store,
handed to the release's own worker: a worker-role ``OffloadingConnector`` built by the
release's constructor over the engine's config, its transfer handler a stand-in that
returns the failed transfer, read as the model runner reads it
(``get_transfer_results``, ``build_connector_worker_meta``): what the release's worker
does with it is the outcome. 0.33.0 asserts ``transfer_result.success``, so the step
raises; 0.34.0 reports the job in ``failed_jobs`` and a failed load in
``failed_recving``).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

from kvcontract.live.capabilities import has, vllm_names

TIMINGS = ("at-once", "delayed", "never", "fail", "worker-fail")


@dataclass(frozen=True)
class Timing:
    """When the worker reports a job: ``mode`` one of :data:`TIMINGS`; ``delay`` steps
    after the step that submitted it (``delayed``)."""

    mode: str = "at-once"
    delay: int = 0
    applies_to: str = "both"
    """``store``, ``load`` or ``both``: the other kind finishes at once."""
    count: int | None = None
    """The mode applies to the first ``count`` jobs of the kinds it applies to; later
    ones finish at once (None: every one)."""

    def __post_init__(self) -> None:
        if self.mode not in TIMINGS:
            raise ValueError(f"timing mode must be one of {TIMINGS}, not {self.mode!r}")
        if self.applies_to not in ("store", "load", "both"):
            raise ValueError("applies_to must be store, load or both")
        if self.delay < 0:
            raise ValueError("delay must be >= 0")
        if self.count is not None and self.count < 0:
            raise ValueError("count must be >= 0 (or None: every job)")

    def for_kind(self, is_store: bool) -> Timing:
        kind = "store" if is_store else "load"
        if self.applies_to in (kind, "both"):
            return self
        return Timing()


@dataclass
class _Job:
    job_id: int
    req_id: str
    is_store: bool
    sync: bool
    due: int | None
    """Step at which it is reported; None: never."""
    failed: bool = False


@dataclass(frozen=True)
class _Reported:
    """What the release's worker reported for a failed transfer."""

    recving: set[str]
    failed_recving: set[str]
    completed: dict[int, int]
    failed_jobs: set[int]


@dataclass
class HostWorker:
    """Reports the connector's jobs finished according to ``timing``."""

    timing: Timing = field(default_factory=Timing)
    step: int = 0
    pending: dict[int, _Job] = field(default_factory=dict)
    completed: list[tuple[int, int, bool]] = field(default_factory=list)
    """``(step, job id, is_store)`` of every job reported."""
    flushed: list[tuple[int, int]] = field(default_factory=list)
    """``(step, job id)`` of every job the scheduler asked to flush."""
    timed: int = 0
    """Jobs the timing's mode has applied to so far (for ``Timing.count``)."""
    raised_in: list[str] = field(default_factory=list)
    """``file:line function`` where the release's worker raised on a failed transfer
    (``worker-fail``); the exception itself propagates."""
    release: tuple[Any, Any] | None = None
    """The engine's ``(vllm_config, kv_cache_config)``: what the release's own worker is
    built over for ``worker-fail`` (:class:`~kvcontract.live.run.LiveRun` sets it)."""
    _connector: Any = None

    def _due(self, is_store: bool) -> tuple[int | None, bool]:
        timing = self.timing.for_kind(is_store)
        if timing.mode != "at-once" and timing.count is not None:
            if self.timed >= timing.count:
                return self.step, False
            self.timed += 1
        if timing.mode == "at-once":
            return self.step, False
        if timing.mode == "delayed":
            return self.step + timing.delay, False
        if timing.mode == "fail" and (not is_store or has("failed-transfer-jobs")):
            return self.step, True
        if timing.mode == "worker-fail":
            return self.step, True
        return None, False

    def submit(self, metadata: Any) -> None:
        """Take the jobs of this step's connector metadata."""
        if metadata is None:
            return
        for job_id, job in getattr(metadata, "load_jobs", {}).items():
            due, failed = self._due(False)
            sync = bool(getattr(job, "sync", False))  # 0.31 has no synchronous loads
            self.pending[job_id] = _Job(job_id, job.req_id, False, sync, due, failed)
        for job_id, job in getattr(metadata, "store_jobs", {}).items():
            due, failed = self._due(True)
            self.pending[job_id] = _Job(job_id, job.req_id, True, False, due, failed)
        for job_id in getattr(metadata, "jobs_to_flush", None) or ():
            # A flushed job is finished (or abandoned) by the worker and reported.
            self.flushed.append((self.step, job_id))
            if job_id in self.pending:
                self.pending[job_id].due = self.step

    def output(self) -> Any:
        """This step's ``KVConnectorOutput``; then the step advances."""
        worker_metadata = vllm_names(
            "vllm.distributed.kv_transfer.kv_connector.v1.offloading.common",
            "OffloadingWorkerMetadata")
        KVConnectorOutput = vllm_names("vllm.v1.outputs", "KVConnectorOutput")

        done: dict[int, int] = {}
        failed_jobs: set[int] = set()
        recving: set[str] = set()
        failed: set[str] = set()
        for job_id, job in list(self.pending.items()):
            if job.due is None or job.due > self.step:
                continue
            del self.pending[job_id]
            self.completed.append((self.step, job_id, job.is_store))
            if job.failed and self.timing.for_kind(job.is_store).mode == "worker-fail":
                try:
                    reported = self._release_worker_reports_failure(job)
                except Exception as exc:
                    self.raised_in.append(_where(exc))
                    raise
                recving |= reported.recving
                failed |= reported.failed_recving
                done.update(reported.completed)
                failed_jobs |= reported.failed_jobs
                continue
            if job.failed:
                if not job.is_store:
                    failed.add(job.req_id)
                failed_jobs.add(job_id)
            done[job_id] = 1
            if not job.is_store and not job.sync:
                recving.add(job.req_id)
        self.step += 1
        meta: dict[str, Any] = {"completed_jobs": done}
        if has("failed-transfer-jobs"):
            meta["failed_jobs"] = failed_jobs
        output: dict[str, Any] = {"finished_recving": recving or None}
        if has("failed-recving"):
            output["failed_recving"] = failed
        elif failed:
            raise RuntimeError("the installed vLLM's KVConnectorOutput has no "
                               "failed_recving: a failed load cannot be reported (a driver "
                               "gap: Timing fail needs it)")
        return KVConnectorOutput(kv_connector_worker_meta=worker_metadata(**meta), **output)

    def _release_worker(self) -> Any:
        """The release's own worker-role ``OffloadingConnector`` over the engine's
        config (its constructor builds the offloading spec; no GPU set-up runs)."""
        if self._connector is None:
            if self.release is None:
                raise RuntimeError("worker-fail needs the engine's config "
                                   "(HostWorker.release), which LiveRun sets")
            connector_cls = vllm_names(
                "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector",
                "OffloadingConnector")
            role = vllm_names("vllm.distributed.kv_transfer.kv_connector.v1.base",
                              "KVConnectorRole")
            vllm_config, kv_cache_config = self.release
            self._connector = connector_cls(vllm_config, role.WORKER, kv_cache_config)
        return self._connector

    def _release_worker_reports_failure(self, job: _Job) -> _Reported:
        """Hand ``job``'s failed transfer to the release's worker (its transfer handler a
        stand-in that returns it) and read what it reports, as the model runner reads it:
        ``get_transfer_results`` (``get_finished`` where the release has no such call) and
        ``build_connector_worker_meta``. Whatever the release's code raises propagates:
        that is the observed outcome of a failed transfer."""
        metadata_cls = vllm_names(
            "vllm.distributed.kv_transfer.kv_connector.v1.offloading.common",
            "OffloadingConnectorMetadata")
        connector = self._release_worker()
        worker = connector.connector_worker
        worker.worker = _FailingTransfers(job.job_id)
        if not job.is_store:
            worker._load_jobs[job.job_id] = None if job.sync else job.req_id
        connector.bind_connector_metadata(metadata_cls(load_jobs={}, store_jobs={}))
        try:
            if hasattr(connector, "get_transfer_results"):
                results = connector.get_transfer_results(set())
                recving = set(results.finished_recving or ())
                failed_recving = set(getattr(results, "failed_recving", None) or ())
            else:
                recving = set(connector.get_finished(set())[1] or ())
                failed_recving = set()
            meta = connector.build_connector_worker_meta()
        finally:
            connector.clear_connector_metadata()
        completed = dict(getattr(meta, "completed_jobs", None) or {})
        return _Reported({str(r) for r in recving}, {str(r) for r in failed_recving},
                         {int(j): int(c) for j, c in completed.items()},
                         {int(j) for j in getattr(meta, "failed_jobs", None) or ()})

    @property
    def stalled(self) -> list[int]:
        """Jobs that will never be reported."""
        return sorted(j.job_id for j in self.pending.values() if j.due is None)


def _where(exc: BaseException) -> str:
    """The innermost frame of ``exc``'s traceback, as ``vllm/...py:line function``."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    last = frames[-1]
    path = last.filename
    if "/vllm/" in path:
        path = "vllm/" + path.rsplit("/vllm/", 1)[1]
    return f"{path}:{last.lineno} {last.name}"


class _FailingTransfers:
    """The release worker's transfer handler, as far as ``get_finished`` reads it: one
    finished transfer, unsuccessful."""

    def __init__(self, job_id: int) -> None:
        self._job_id = job_id

    def get_finished(self) -> list[Any]:
        TransferResult = vllm_names("vllm.v1.kv_offload.base", "TransferResult")
        return [TransferResult(job_id=self._job_id, success=False)]


