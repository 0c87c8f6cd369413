"""Worker processes for the prover: every unit of work in a fresh child of one template.

Why not a plain process pool: Z3's search depends on the history of the process it runs
in (the ids its terms got, recycled ids of terms freed before, its global symbol table),
not only on the query. A theorem proved by a worker that first proved another theorem
can take another path than the same theorem proved first, and a query near its
``rlimit`` is then decided in one run and ``unknown`` in the next, depending only on
which worker the scheduler handed it to: a report that depends on machine load.
Measured on the reference with the executor's pool: one full run reported
``C4/spec-scan-fold-is-declarative`` UNKNOWN ("canceled") where ``prove --clause C4``
proves it. Forking each task from the running parent is not enough either: the parent
frees Z3 objects whenever its garbage collector runs, which depends on how many results
have come back, so ``--jobs 1`` and ``--jobs 2`` gave different resource counts.

So :class:`TaskRunner` forks one *template* process as soon as it is made (before the
parent does any work that depends on ``--jobs``, the cache or the order of results).
The template prepares what every task needs (the catalogue), collects its garbage,
freezes it and never runs the collector or Z3 again; it forks one child per task and
passes the children's pickled results on as bytes, without reading them. Every task
therefore starts from the same process state: a report's verdicts and ``rlimit_used``
figures depend on the command and the commit, not on ``--jobs``, the load or the
machine. Forking costs a few milliseconds per task; the tasks take 0.01 s to 10 s.

Where ``fork`` does not exist, each task runs in a freshly spawned interpreter (as
deterministic, slower).

A child that dies without sending its result (a signal, the OOM killer, a crash in Z3)
ends the run with :class:`~concurrent.futures.process.BrokenProcessPool`, which the
command line reports as an internal error (exit 4).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import pickle
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class WorkerError(RuntimeError):
    """A task raised an exception that could not be sent back as itself (its text)."""


class _Failed:
    """What a child sends when its task raised: the exception, or its text when the
    exception does not pickle."""

    def __init__(self, exc: BaseException) -> None:
        self.text = "".join(traceback.format_exception(exc)).rstrip()
        try:
            pickle.dumps(exc)
            self.exc: BaseException | None = exc
        except Exception:  # an unpicklable exception: its text is still worth having
            self.exc = None

    def reraise(self) -> None:
        if self.exc is not None:
            raise self.exc
        raise WorkerError(self.text)


def _child(function: Callable[[Any], Any], task: Any, conn: Connection) -> None:
    """One task, in its own process: send its result (or its failure) and exit."""
    # A full collection first resets the collector's counters: when the collector runs
    # decides when Z3 terms are freed and so which ids Z3 recycles, and the template's
    # own allocations between forks would otherwise shift it from task to task.
    gc.collect()
    gc.enable()  # the template runs without a collector; the task may allocate a lot
    try:
        outcome: Any = function(task)
    except BaseException as exc:  # every failure goes back to the parent
        outcome = _Failed(exc)
    try:
        conn.send(outcome)
    finally:
        conn.close()


def _context() -> Any:
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


class _Running(Generic[T]):
    def __init__(self, index: int, process: Any, conn: Connection) -> None:
        self.index = index
        self.process = process
        self.conn = conn


def _end(entries: Sequence[_Running[Any]]) -> None:
    for entry in entries:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            entry.process.terminate()
    for entry in entries:
        with contextlib.suppress(OSError, ValueError, AttributeError, AssertionError):
            entry.process.join(timeout=5)
            entry.conn.close()


def _each_in_a_child(
    function: Callable[[Any], Any],
    tasks: Sequence[Any],
    jobs: int,
    stop: Connection | None = None,
) -> Iterator[tuple[int, bytes | None, int | None]]:
    """``(index, pickled outcome, None)`` per finished task, or ``(index, None, exit
    code)`` for a child that ended without one; at most ``jobs`` children at a time,
    started in the order of ``tasks``. Ends when ``stop`` (the parent) closes."""
    context = _context()
    queue = list(enumerate(tasks))
    queue.reverse()
    running: dict[Connection, _Running[Any]] = {}
    try:
        while queue or running:
            while queue and len(running) < max(1, jobs):
                index, task = queue.pop()
                reader, writer = context.Pipe(duplex=False)
                # Not a daemon: a task may start processes of its own.
                process = context.Process(target=_child, args=(function, task, writer))
                process.start()
                writer.close()  # the child holds the writing end now
                running[reader] = _Running(index, process, reader)
            watched: list[Any] = list(running)
            if stop is not None:
                watched.append(stop)
            for ready in wait(watched):
                if ready is stop:
                    return  # the parent is gone or wants no more
                assert isinstance(ready, Connection)
                entry = running.pop(ready)
                try:
                    payload: bytes | None = ready.recv_bytes()
                except (EOFError, OSError):
                    payload = None
                finally:
                    ready.close()
                entry.process.join()
                yield entry.index, payload, None if payload else entry.process.exitcode
    finally:
        _end(list(running.values()))


def _template(conn: Connection, parents: Connection,
              prepare: Callable[[], object] | None) -> None:
    """The template process: prepare, then serve one run (see the module docstring)."""
    parents.close()  # the parent's end, inherited: else its close would never reach us
    if prepare is not None:
        prepare()
    gc.collect()
    gc.freeze()
    gc.disable()  # frees (and so Z3's recycled ids) would differ from task to task
    try:
        request = conn.recv_bytes()
    except (EOFError, OSError):
        return
    function, tasks, jobs = pickle.loads(request)
    try:
        for index, payload, exitcode in _each_in_a_child(function, tasks, jobs, stop=conn):
            conn.send_bytes(pickle.dumps((index, exitcode)))
            conn.send_bytes(payload or b"")
    except (BrokenPipeError, EOFError, OSError):
        return


def _died(index: int, count: int, exitcode: int | None) -> BrokenProcessPool:
    return BrokenProcessPool(
        f"a prover worker process ended without a result (exit code {exitcode}) "
        f"while running task {index + 1} of {count}")


class TaskRunner:
    """Runs tasks each in a fresh child of one template process (see the module
    docstring). Make it first, before work whose Z3 or garbage-collector history may
    vary; :meth:`run` once; :meth:`close` (or ``with``) at the end."""

    def __init__(self, prepare: Callable[[], object] | None = None) -> None:
        self._conn: Connection | None = None
        self._process: Any = None
        context = _context()
        if context.get_start_method() != "fork":
            return  # spawned interpreters per task are fresh already
        self._conn, theirs = context.Pipe(duplex=True)
        self._process = context.Process(target=_template,
                                        args=(theirs, self._conn, prepare))
        self._process.start()
        theirs.close()

    def run(self, function: Callable[[T], R], tasks: Sequence[T],
            jobs: int) -> Iterator[tuple[int, R]]:
        """Yield ``(index, function(tasks[index]))`` as tasks finish, at most ``jobs``
        running at a time. Leaving the iterator early (a ``break``, an exception,
        Ctrl-C) ends the children still running."""
        if not tasks:
            return
        if self._conn is None:
            for index, payload, exitcode in _each_in_a_child(function, tasks, jobs):
                yield index, self._outcome(index, len(tasks), payload, exitcode)
            return
        try:
            self._conn.send_bytes(pickle.dumps((function, list(tasks), jobs)))
        except (BrokenPipeError, OSError):
            raise _died(0, len(tasks), self._process.exitcode) from None
        for _ in range(len(tasks)):
            try:
                head = self._conn.recv_bytes()
                payload = self._conn.recv_bytes()
            except (EOFError, OSError):
                self._process.join(timeout=5)
                raise BrokenProcessPool(
                    "the prover's template process ended "
                    f"(exit code {self._process.exitcode})") from None
            index, exitcode = pickle.loads(head)
            yield index, self._outcome(index, len(tasks), payload, exitcode)

    @staticmethod
    def _outcome(index: int, count: int, payload: bytes | None,
                 exitcode: int | None) -> Any:
        if not payload:
            raise _died(index, count, exitcode)
        outcome = pickle.loads(payload)
        if isinstance(outcome, _Failed):
            outcome.reraise()
        return outcome

    def close(self) -> None:
        """End the template and every task still running (idempotent)."""
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None
        if self._process is not None:
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join(timeout=5)
            self._process = None

    def __enter__(self) -> TaskRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["TaskRunner", "WorkerError"]
