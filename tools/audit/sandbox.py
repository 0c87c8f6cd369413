"""Run audit checks in child processes, so upstream code can hang or crash safely.

Each check is a zero-argument callable returning a JSON-serializable dict. It runs in a
forked child (the bound functions are inherited, nothing is pickled but the result).
Every call into upstream code happens in such a child: the bound functions (the
binding's adapters, upstream's lookup loop and store path over stand-ins) and, where the
parent imported the target's vLLM (its engine as the judge), the release's own audited
functions, wrapped in each child (:func:`upstream_calls.limit_loaded_release`). Its limits:

* **a per-call CPU-time limit** (``--timeout``, :func:`upstream_calls.set_call_timeout`,
  ``ITIMER_PROF``): an upstream call that has used that many seconds of CPU time is
  stopped (:class:`~kvcontract.tools.audit.upstream_calls.UpstreamTimeout`, naming the call
  and the limit): the theorem that made it is UNKNOWN, never a verdict. A call that hung
  is not made again in that child (the next call of the same function raises at once),
  so a hang costs one limit per call site, not one per case (a symbolic call that hung
  is the exception: the theorem then searches concretely, so a function that hangs both
  ways costs two limits). A call that catches the limit's exception and goes on is
  interrupted again half a limit later; at twice the limit the child exits with status
  :data:`~kvcontract.tools.audit.upstream_calls.EXIT_CALL_PAST_LIMIT` (86), and a call the
  signal cannot reach (C code that does not return to Python) is killed by the parent
  once the child used :data:`PAST_LIMIT_FACTOR` times the limit in CPU time since the
  call began (read from ``/proc``); either way every theorem of the check is UNKNOWN,
  naming the call;
* **a wall-clock watchdog for a call that blocks without using CPU** (a sleep, a lock, a
  read): the parent watches the call in flight on the child's
  :class:`~kvcontract.tools.audit.upstream_calls.CallBoard`. A call that for
  :func:`~kvcontract.tools.audit.upstream_calls.watch_window` seconds (the per-call limit, at
  least 1.5 s) used less than :data:`BLOCKED_CPU_SHARE` of that time in CPU while its
  thread was mostly not runnable (``/proc/PID/stat`` state other than ``R``) is
  interrupted (``SIGUSR2``: UpstreamTimeout, "blocked ... without using CPU time"); one
  still blocked a window after that is killed (``SIGKILL``), its theorems UNKNOWN, naming
  the call. (Linux; elsewhere only the per-check net below stops a blocked call.)
* **a per-check CPU-time limit** on the child (``RLIMIT_CPU``): a child that overruns it
  (a livelock between calls) is killed by the kernel and reported UNKNOWN;
* **a wall-clock net** of :data:`WALL_NET_FACTOR` times that CPU limit for a child
  blocked outside any upstream call (a deadlock of kvcontract's own code);
* a child dies with the audit's process (Linux), so a killed audit leaves nothing
  running.

The rule: what an audit finds never depends on machine load. The limits that can stop
code that computes count CPU time, never wall-clock time: on a loaded machine a check
gets fewer CPU cycles per second but the same number of them, so the same commit gives
the same report on any machine. The only wall-clock limits stop code that waits: a
computing call is runnable or using CPU however loaded the machine is, so the watchdog
never stops it, and what it stops is a hang made UNKNOWN, never a verdict changed. The
limits are safety nets, far above any measured call (the work itself is bounded by
counted cases).

A child that dies (a segfault, ``os._exit``, a MemoryError, a kill) is reported the same
way: UNKNOWN, "the check did not finish", naming the upstream call in flight if any.
Statuses of a child: 0 with a result; :data:`~kvcontract.tools.audit.upstream_calls.
EXIT_CALL_PAST_LIMIT` (a call past twice its limit); ``-SIGXCPU`` / ``-SIGKILL`` (the
check's CPU limit, the watchdog, or the out-of-memory killer); anything else (a crash).
The audit itself exits 3 (UNKNOWN) for such theorems unless a finding makes it 1.
"""

from __future__ import annotations

import contextlib
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

from kvcontract.tools.audit import upstream_calls

Job = Callable[[], dict[str, Any]]

WALL_NET_FACTOR = 20.0
"""A child that has not finished after this many times its CPU limit in wall-clock time
is blocked (it cannot have used its CPU limit: that kills it first), so it is killed."""

BLOCKED_CPU_SHARE = 0.1
"""A call in flight that used less than this share of a watch window in CPU time, its
thread mostly not runnable, is blocked (the watchdog; module docstring)."""

PAST_LIMIT_FACTOR = 3.0
"""A call in flight whose child used this many times the per-call limit in CPU time since
the parent first saw the call is killed: the limit's signal cannot reach it (C code that
does not return to Python); the child's own handler ends a Python call at twice."""

POLLS_PER_WINDOW = 5
"""How often the parent looks at a child's call in flight per watch window."""


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


def _die_with_parent() -> None:
    """Have the kernel kill this process when the audit's process dies (Linux's
    ``PR_SET_PDEATHSIG``): a killed audit leaves no check running on its own."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return


def _child(job: Job, conn: Connection, call_timeout: float | None,
           cpu_limit: float, board: upstream_calls.CallBoard, parent: int) -> None:
    _die_with_parent()
    if os.getppid() != parent:
        os._exit(1)  # the parent died before the line above took effect
    # A full collection first resets the collector's counters: when it runs decides
    # when Z3 terms are freed and so which ids Z3 recycles (its search depends on
    # them), and the parent's allocations between forks would otherwise shift it from
    # child to child (kvcontract.proofs.pool).
    gc.collect()
    _limit_cpu(cpu_limit)
    upstream_calls.set_call_timeout(call_timeout, board)
    if call_timeout is not None:
        # vLLM imported by the parent (its engine as the judge) calls the audited
        # functions itself: under the same per-call limit as the bound ones.
        upstream_calls.limit_loaded_release()
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


_CLOCK_TICKS = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _proc_sample(pid: int) -> tuple[float, bool] | None:
    """``(CPU seconds, runnable)`` of the main thread of process ``pid`` (the one that
    runs the check, so a helper thread of a library does not hide a blocked call): its
    user and system time and whether it is running or waiting for a CPU (state ``R``),
    from ``/proc``; None where that cannot be read (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat", "rb") as handle:
            data = handle.read()
        # The command name may hold spaces and parentheses: the fields follow its last ")".
        fields = data[data.rindex(b")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS, fields[0] == b"R"
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class _Watch:
    """The parent's watch over one child's upstream call in flight (module docstring)."""

    board: upstream_calls.CallBoard
    limit: float | None
    """The per-call CPU-time limit; None: calls are not limited."""
    call: int = 0
    first_cpu: float = 0.0
    since: float = 0.0
    cpu: float = 0.0
    samples: int = 0
    runnable: int = 0
    signalled: int = 0

    def poll(self, pid: int, now: float) -> str | None:
        """Look at the call in flight: interrupt it if it is blocked; a message when it
        must be killed (blocked again a window after it was interrupted, or past
        :data:`PAST_LIMIT_FACTOR` times its CPU-time limit: C code the limit's signal
        cannot stop)."""
        call = self.board.active()
        if self.limit is None or call == 0:
            self.call = 0
            return None
        sample = _proc_sample(pid)
        if sample is None:
            return None
        cpu, runnable = sample
        if call != self.call:
            self.call, self.first_cpu = call, cpu
            self.since, self.cpu, self.samples, self.runnable = now, cpu, 0, 0
            return None
        if cpu - self.first_cpu > PAST_LIMIT_FACTOR * self.limit:
            return (f"{self.board.name()} did not return within {self.limit:g}s of CPU time "
                    f"(--timeout) and went on past {PAST_LIMIT_FACTOR:g} times that, "
                    "unstopped by the limit's signal (killed)")
        window = upstream_calls.watch_window(self.limit)
        self.samples += 1
        self.runnable += runnable
        elapsed = now - self.since
        if elapsed < window:
            return None
        blocked = (cpu - self.cpu < BLOCKED_CPU_SHARE * elapsed
                   and 2 * self.runnable < self.samples)
        self.since, self.cpu, self.samples, self.runnable = now, cpu, 0, 0
        if not blocked:
            return None
        if self.signalled != call:
            self.signalled = call
            self.board.flag(call)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR2)
            return None
        return (f"{self.board.name()} blocked for {window:g}s without using CPU time "
                "and went on blocking after the watchdog interrupted it (killed)")


def _died(payload: str, exitcode: int | None, board: upstream_calls.CallBoard,
          job_timeout: float, call_timeout: float | None) -> str:
    """Why a child ended without a result, naming the upstream call in flight."""
    if exitcode == upstream_calls.EXIT_CALL_PAST_LIMIT and board.ended_itself():
        return (f"{board.name()} did not return within {call_timeout or 0:g}s of CPU time "
                "(--timeout) and went on for twice that after the limit's exception "
                f"(the check ended itself, status {exitcode})")
    if exitcode == -signal.SIGXCPU:
        text = (f"used more than {job_timeout:g}s of CPU time (killed): a livelock, or a "
                "hang that ignores the per-call limit")
    elif exitcode == -signal.SIGKILL:
        text = (f"killed (SIGKILL): past its {job_timeout:g}s CPU-time limit while "
                "ignoring SIGXCPU, or by the system's out-of-memory killer")
    elif exitcode not in (0, None):
        text = f"{payload} (exit code {exitcode})"
    else:
        text = payload
    if board.active():
        first, _, rest = text.partition("\n")
        text = f"{first} (the upstream call in flight: {board.name()})" + (
            f"\n{rest}" if rest else "")
    return text


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
    upstream call (a blocked call: the watchdog of the module docstring)."""
    if os.name != "posix":  # pragma: no cover - the audit relies on fork and setitimer
        raise RuntimeError("kvcontract audit needs a POSIX system (fork, setitimer)")
    context = multiprocessing.get_context("fork")
    # Free the cyclic garbage (Z3 terms among it) now, not at a moment that depends on
    # how many results have come back: every child then forks from the same Z3 state.
    gc.collect()
    pending = list(jobs)
    running: dict[Any, tuple[str, Any, float, _Watch]] = {}
    results: dict[str, Outcome] = {}
    window = None if call_timeout is None else upstream_calls.watch_window(call_timeout)
    poll = 1.0 if window is None else min(1.0, max(0.01, window / POLLS_PER_WINDOW))
    wall_net = job_timeout * WALL_NET_FACTOR

    def finish(outcome: Outcome) -> None:
        results[outcome.key] = outcome
        if on_done:
            on_done(outcome)

    def stop(conn: Connection, message: str, now: float) -> None:
        key, process, start, watch = running.pop(conn)
        process.kill()
        process.join()
        conn.close()
        watch.board.close()
        finish(Outcome(key, False, None, message, now - start))

    while pending or running:
        while pending and len(running) < max(1, workers):
            key, job = pending.pop(0)
            receiver, sender = context.Pipe(duplex=False)
            board = upstream_calls.CallBoard()
            process = context.Process(target=_child,
                                      args=(job, sender, call_timeout, job_timeout, board,
                                            os.getpid()),
                                      daemon=True)
            process.start()
            sender.close()
            running[receiver] = (key, process, time.perf_counter(), _Watch(board, call_timeout))
        now = time.perf_counter()
        nearest = min(start + wall_net for _, _, start, _ in running.values())
        ready = wait(list(running), timeout=max(0.0, min(nearest - now, poll)))
        for ready_conn in ready:
            conn: Connection = ready_conn  # type: ignore[assignment]
            key, process, start, watch = running.pop(conn)
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
            elapsed = time.perf_counter() - start
            if status == "ok" and isinstance(payload, dict):
                finish(Outcome(key, True, payload, "", elapsed))
            else:
                finish(Outcome(key, False, None,
                               _died(str(payload), process.exitcode, watch.board,
                                     job_timeout, call_timeout), elapsed))
            watch.board.close()
        now = time.perf_counter()
        for conn, (_, process, start, watch) in list(running.items()):
            if now - start >= wall_net:
                stop(conn, f"blocked for {wall_net:g}s without finishing (killed)"
                     + (f" (the upstream call in flight: {watch.board.name()})"
                        if watch.board.active() else ""), now)
                continue
            blocked = watch.poll(process.pid, now)
            if blocked is not None:
                stop(conn, blocked, now)
    return results
