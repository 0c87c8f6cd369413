"""Run audit checks in child processes, so upstream code can hang or crash safely.

Each check is a zero-argument callable returning a JSON-serializable dict. It runs in a
forked child (the bound functions are inherited, nothing is pickled but the result),
with two limits:

* a per-call limit inside the child (:func:`binding.set_call_timeout`, CPU time,
  SIGPROF), so one hanging upstream call becomes a finding of that case and the check
  goes on;
* a per-check CPU-time limit on the child (``RLIMIT_CPU``): a child that overruns it (a
  livelock between calls, a hang that ignores the per-call signal) is killed by the
  kernel and reported UNKNOWN, and the audit finishes.

Both count CPU time, never wall-clock time: on a loaded machine a check gets fewer CPU
cycles per second but the same number of them, so the same commit gives the same report
on any machine. The limits are safety nets, far above any measured check (the work
itself is bounded by counted cases). Only a child that blocks without using CPU (a
deadlock) is left to a wall-clock net of :data:`WALL_NET_FACTOR` times the CPU limit.

A child that dies (a segfault, ``os._exit``, a MemoryError) is reported the same way.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from kvcontract.tools.audit import binding as binding_mod

Job = Callable[[], dict[str, Any]]

WALL_NET_FACTOR = 20.0
"""A child that has not finished after this many times its CPU limit in wall-clock time
is blocked (it cannot have used its CPU limit: that kills it first), so it is killed."""


@dataclass
class Outcome:
    """What came back from one child."""

    key: str
    ok: bool
    value: dict[str, Any] | None
    error: str
    seconds: float


def _limit_cpu(seconds: float) -> None:
    """Have the kernel stop this process after ``seconds`` of CPU time (SIGXCPU, then
    SIGKILL a second later for a process that ignores it)."""
    soft = max(1, int(seconds + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))


def _child(job: Job, conn: Connection, call_timeout: float | None,
           cpu_limit: float) -> None:
    # A full collection first resets the collector's counters: when it runs decides
    # when Z3 terms are freed and so which ids Z3 recycles (its search depends on
    # them), and the parent's allocations between forks would otherwise shift it from
    # child to child (kvcontract.proofs.pool).
    gc.collect()
    _limit_cpu(cpu_limit)
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
    """Run ``jobs`` (key, callable) with at most ``workers`` children at a time, each
    with ``job_timeout`` seconds of CPU time and ``call_timeout`` seconds of CPU time per
    upstream call."""
    if os.name != "posix":  # pragma: no cover - the audit relies on fork and setitimer
        raise RuntimeError("kvcontract audit needs a POSIX system (fork, setitimer)")
    context = multiprocessing.get_context("fork")
    # Free the cyclic garbage (Z3 terms among it) now, not at a moment that depends on
    # how many results have come back: every child then forks from the same Z3 state.
    gc.collect()
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
            process = context.Process(target=_child,
                                      args=(job, sender, call_timeout, job_timeout),
                                      daemon=True)
            process.start()
            sender.close()
            running[receiver] = (key, process, time.perf_counter())
        now = time.perf_counter()
        wall_net = job_timeout * WALL_NET_FACTOR
        nearest = min(start + wall_net for _, _, start in running.values())
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
            if process.exitcode == -signal.SIGXCPU and status == "error":
                payload = (f"used more than {job_timeout:g}s of CPU time (killed): a "
                           "livelock, or a hang that ignores the per-call limit")
            elif process.exitcode == -signal.SIGKILL and status == "error":
                payload = (f"killed (SIGKILL): past its {job_timeout:g}s CPU-time limit "
                           "while ignoring SIGXCPU, or by the system's out-of-memory killer")
            elif status == "error" and process.exitcode not in (0, None):
                payload = f"{payload} (exit code {process.exitcode})"
            elapsed = time.perf_counter() - start
            if status == "ok" and isinstance(payload, dict):
                finish(Outcome(key, True, payload, "", elapsed))
            else:
                finish(Outcome(key, False, None, str(payload), elapsed))
        now = time.perf_counter()
        for conn, (key, process, start) in list(running.items()):
            if now - start >= wall_net:
                process.kill()
                process.join()
                running.pop(conn)
                conn.close()
                finish(Outcome(key, False, None,
                               f"blocked for {wall_net:g}s without finishing (killed)",
                               now - start))
    return results
