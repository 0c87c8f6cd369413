"""Run audit checks in child processes, so upstream code can hang or crash safely.

Each check is a zero-argument callable returning a JSON-serializable dict. It runs in a
forked child (the bound functions are inherited, nothing is pickled but the result),
with two limits:

* a per-call limit inside the child (:func:`binding.set_call_timeout`, SIGALRM), so one
  hanging upstream call becomes a finding of that case and the check goes on;
* a per-check wall-clock limit in the parent: a child that overruns it (a hang in C
  code, a livelock between calls) is killed and reported, and the audit finishes.

A child that dies (a segfault, ``os._exit``, a MemoryError) is reported the same way.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from kvcontract.tools.audit import binding as binding_mod

Job = Callable[[], dict[str, Any]]


@dataclass
class Outcome:
    """What came back from one child."""

    key: str
    ok: bool
    value: dict[str, Any] | None
    error: str
    seconds: float


def _child(job: Job, conn: Connection, call_timeout: float | None) -> None:
    binding_mod.set_call_timeout(call_timeout)
    if "torch" in sys.modules:
        # A child forked after the parent used torch's intra-op thread pool deadlocks on
        # its first parallel kernel (measured: the system scenarios hung until the job
        # limit when an earlier test had run torch in the same process); one thread is
        # what the scenarios use anyway.
        sys.modules["torch"].set_num_threads(1)
    try:
        value = job()
        conn.send(("ok", value))
    except BaseException as exc:  # report anything, never hang the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
    finally:
        conn.close()


def run_jobs(
    jobs: Sequence[tuple[str, Job]],
    *,
    workers: int,
    job_timeout: float,
    call_timeout: float | None,
    on_done: Callable[[Outcome], None] | None = None,
) -> dict[str, Outcome]:
    """Run ``jobs`` (key, callable) with at most ``workers`` children at a time."""
    if os.name != "posix":  # pragma: no cover - the audit relies on fork and SIGALRM
        raise RuntimeError("kvcontract audit needs a POSIX system (fork, SIGALRM)")
    context = multiprocessing.get_context("fork")
    pending = list(jobs)
    running: dict[Any, tuple[str, Any, float]] = {}
    results: dict[str, Outcome] = {}

    def finish(outcome: Outcome) -> None:
        results[outcome.key] = outcome
        if on_done:
            on_done(outcome)

    while pending or running:
        while pending and len(running) < max(1, workers):
            key, job = pending.pop(0)
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(job, sender, call_timeout),
                                      daemon=True)
            process.start()
            sender.close()
            running[receiver] = (key, process, time.perf_counter())
        now = time.perf_counter()
        nearest = min(start + job_timeout for _, _, start in running.values())
        ready = wait(list(running), timeout=max(0.0, nearest - now))
        for ready_conn in ready:
            conn: Connection = ready_conn  # type: ignore[assignment]
            key, process, start = running.pop(conn)
            payload: Any
            try:
                status, payload = conn.recv()
            except (EOFError, OSError):
                status, payload = "error", "the check process died without a result"
            conn.close()
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
            if status == "error" and process.exitcode not in (0, None):
                payload = f"{payload} (exit code {process.exitcode})"
            elapsed = time.perf_counter() - start
            if status == "ok" and isinstance(payload, dict):
                finish(Outcome(key, True, payload, "", elapsed))
            else:
                finish(Outcome(key, False, None, str(payload), elapsed))
        now = time.perf_counter()
        for conn, (key, process, start) in list(running.items()):
            if now - start >= job_timeout:
                process.kill()
                process.join()
                running.pop(conn)
                conn.close()
                finish(Outcome(key, False, None,
                               f"timed out after {job_timeout:g}s (killed)", now - start))
    return results
