"""Ctrl-C with worker processes (the prover's pool, the audit's sandbox, mutation
workers): SIGINT stops the children quietly and is reported once, by the parent.

Below the library API and the command line, which both install it (:func:`sigint_guard`
for a call through :mod:`kvcontract.api`; ``kvcontract.tools.cli`` for a command), so
neither imports the other for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import Any


class _Signals:
    """Whether SIGINT arrived during the current run (a worker killed by the same Ctrl-C
    is then an interruption, not an internal error)."""

    interrupted: bool = False


SIGNALS = _Signals()
"""The process's one SIGINT record: a signal handler cannot be passed arguments."""


def _sigint(_signum: int, _frame: Any) -> None:
    SIGNALS.interrupted = True
    _stop_children()
    raise KeyboardInterrupt


def _stop_children() -> None:
    """Pass the interrupt on to the worker processes (prover pool, audit sandbox): a
    SIGINT sent to this process alone (``kill -INT``, a CI runner cancelling a job) must
    not leave the pool running the rest of its queue while the parent waits for it. The
    workers die of it quietly (:func:`_quiet_child_sigint`)."""
    try:
        import multiprocessing

        children = multiprocessing.active_children()
    except Exception:  # never let the handler itself fail
        return
    for child in children:
        with contextlib.suppress(OSError, TypeError, ValueError):
            if child.pid is not None:
                os.kill(child.pid, signal.SIGINT)


def _quiet_child_sigint() -> None:
    """In a forked worker (prover pool, audit sandbox): Ctrl-C reaches the whole process
    group, and the parent reports it; the child dies of the signal without a traceback."""
    if signal.getsignal(signal.SIGINT) is _sigint:
        signal.signal(signal.SIGINT, signal.SIG_DFL)


_FORK_HOOK: list[bool] = []


def install_signal_handling() -> Any:
    """SIGINT sets :data:`SIGNALS.interrupted` (a worker killed by the same Ctrl-C is then
    an interruption, not an internal error); returns the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return None  # ignored (a background job) or handled by an embedding program
    if not _FORK_HOOK and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_quiet_child_sigint)
        _FORK_HOOK.append(True)
    return signal.signal(signal.SIGINT, _sigint)


@contextlib.contextmanager
def sigint_guard() -> Iterator[None]:
    """Ctrl-C during a run through the Python API (:mod:`kvcontract.api`): the worker
    processes stop quietly and the caller gets :class:`KeyboardInterrupt`, never a
    ``BrokenProcessPool`` of the workers that died of the same signal. A handler the
    embedding program installed is left alone (and so is any thread but the main one)."""
    SIGNALS.interrupted = False
    previous = install_signal_handling()
    try:
        yield
    except BrokenProcessPool:
        if SIGNALS.interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
