"""Bind upstream vLLM functions, by source, to kvcontract's :class:`Implementation`.

vLLM cannot be imported here (it pulls in torch, CUDA extensions and half of PyPI), and
the audited functions moved between files and changed signatures from 0.28 to 0.33.
So each function is *located by AST* under its qualified name in the known files,
its ``def`` is compiled on its own (with postponed annotations, so type hints need not
resolve) and executed in a namespace of small stand-ins: the ``LookupResult`` enum,
``cdiv``/``round_down``, spec dataclasses named like upstream's (the bodies dispatch with
``isinstance`` on those names), ``dataclasses.replace`` and a logger. Methods get a fake
``self`` that carries only what the body reads (``.manager.lookup``, ``.config``...).

Adapters then give every function the signature of the matching
:class:`~kvcontract.impl.bundle.Implementation` field, so the prover's catalogue runs
on upstream code unchanged. An adapter also validates what upstream returns (garbage is
a finding, not a crash of the audit) and, inside a sandbox child, bounds each call in
time (:func:`set_call_timeout`).

Line numbers are preserved: a traceback or a SARIF location points at the upstream file.
"""

from __future__ import annotations
import __future__

import ast
import copy
import dataclasses
import enum
import functools
import inspect
import itertools
import logging
import mmap
import os
import re
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from kvcontract.errors import InputFileError
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import REFERENCE, VARIANTS
from kvcontract.proofs import symbolic
from kvcontract.tools.audit.targets import MANAGER, OFFLOAD_CONFIG, SCHEDULER, Target
from kvcontract.vocabulary import LookupResult

SCHED_CLS = "OffloadingConnectorScheduler"
SWM_CLS = "SlidingWindowManager"


@dataclass(frozen=True)
class RoleSpec:
    """One upstream function the audit looks for."""

    role: str
    qualnames: tuple[str, ...]
    """Qualified names, preferred first (a class method is ``Class.method``)."""
    files: tuple[str, ...]
    """Files relative to the vllm package, in search order (0.33 first where it moved)."""
    what: str


ROLES: tuple[RoleSpec, ...] = (
    RoleSpec("skipped", (f"{SWM_CLS}.get_num_skipped_tokens",), (MANAGER,),
             "tokens skipped below the window (allocation retention)"),
    RoleSpec("window", ("get_sliding_window_size_in_chunks",), (OFFLOAD_CONFIG, SCHEDULER),
             "window size W in chunks"),
    RoleSpec("load_window", ("GroupOffloadConfig.load_window_size_in_chunks",), (SCHEDULER,),
             "load window lw(N) for an unaligned boundary"),
    RoleSpec("sw_scan", (f"{SCHED_CLS}._sliding_window_lookup",), (SCHEDULER,),
             "sliding-window scanner"),
    RoleSpec("prefix_scan", (f"{SCHED_CLS}._maximal_prefix_lookup",), (SCHEDULER,),
             "full-attention prefix scanner"),
    RoleSpec("store_mask", (f"{SCHED_CLS}._reachable_store_block_mask",), (SCHEDULER,),
             "store reachability mask (scheduler side, MTP widening)"),
    RoleSpec("block_mask", (f"{SWM_CLS}.reachable_block_mask",), (MANAGER,),
             "reachability block mask"),
    RoleSpec("contiguous_blocks", (f"{SWM_CLS}._contiguous_blocks_for_hit",), (MANAGER,),
             "blocks a hit needs (used by the block mask)"),
    RoleSpec("store_predicate", ("is_store_reachable_swa_chunk",), (SCHEDULER,),
             "chunk-level store reachability predicate (0.28/0.29 shape)"),
    RoleSpec("multi_group_lookup", (f"{SCHED_CLS}._lookup_complete_chunks",), (SCHEDULER,),
             "multi-group lookup with convergence"),
    RoleSpec("store_jobs", (f"{SCHED_CLS}._build_store_jobs",), (SCHEDULER,),
             "store-job builder (executed by the upstream store path, tools/audit/store.py; "
             "never read for a modelled horizon)"),
    RoleSpec("mamba_align", ("resolve_mamba_align_size",), (SCHEDULER,),
             "the Mamba alignment of the hit window (align cache mode)"),
    # What upstream's store path (_build_store_jobs) calls; executed by tools/audit/store.py.
    RoleSpec("offloadable_tokens", (f"{SCHED_CLS}._calc_num_offloadable_tokens",), (SCHEDULER,),
             "tokens a store job may cover (max_offload_tokens, offload_prompt_only)"),
    RoleSpec("storable_chunks", ("RequestOffloadState.storable_chunks",), (SCHEDULER,),
             "storable chunks of a group (EAGLE volatile chunk, allocated and keyed chunks)"),
    RoleSpec("advance_stored_idx", ("RequestOffloadState.advance_stored_idx",), (SCHEDULER,),
             "stored-chunk index advance of a step that stores nothing"),
    RoleSpec("final_swa_alignment", (f"{SCHED_CLS}._final_swa_alignment_blocks",),
             (SCHEDULER,), "final-tail alignment in blocks of a non-EAGLE SWA group"),
    RoleSpec("base_block_mask", ("SingleTypeKVCacheManager.reachable_block_mask",), (MANAGER,),
             "the default (dense) block mask of the managers that keep every block (FA)"),
)
ROLE_BY_NAME = {r.role: r for r in ROLES}

FIELD_ROLES: dict[str, tuple[str, ...]] = {
    "get_num_skipped_tokens": ("skipped",),
    "retained_block_range": ("skipped",),
    "load_chunk_range": ("skipped",),
    "get_sliding_window_size_in_chunks": ("window",),
    "load_window_size_in_chunks": ("load_window",),
    "sliding_window_lookup": ("sw_scan",),
    "prefix_lookup": ("prefix_scan",),
    "is_block_reachable": ("reachability",),
    "store_final_segment_end": ("store_horizon",),
    "store_replay_boundaries": ("store_jobs",),
}
"""Implementation field -> the binding roles it is built from (pseudo-roles
``reachability`` and ``store_horizon`` are resolved from several upstream shapes)."""


# -- errors the adapters raise (findings, never audit crashes) -------------------------
class UpstreamError(Exception):
    """The upstream function raised, hung or returned garbage for concrete inputs."""


class UpstreamTimeout(UpstreamError):
    """An upstream call exceeded the per-case time limit."""


class StandInGap(UpstreamError):
    """Upstream's code read something a kvcontract stand-in lacks, or kvcontract called
    upstream with a calling convention it does not take (:func:`stand_in_gap`): the
    tool's gap, never the code's defect. The theorem is UNKNOWN, naming the piece."""


class MissingRole(Exception):
    """A role the theorem needs was not bound (the engine skips such theorems)."""


_SIGNATURE_ERROR = re.compile(
    r"(takes \d+ positional arguments? but \d+ (were|was) given|takes from \d+ to \d+ "
    r"positional|missing \d+ required (positional|keyword-only) arguments?|got an unexpected "
    r"keyword argument|got multiple values for argument|takes no arguments|"
    r"got some positional-only arguments passed as keyword)")
_NAMED_TYPE = re.compile(r"^(?:type object )?'(?P<type>[\w.]+)' object|^type object "
                         r"'(?P<cls>[\w.]+)'|^(?P<fn>[\w.]+)\(\) ")


def _is_kvcontract_module(name: object) -> bool:
    return isinstance(name, str) and (name == "kvcontract" or name.startswith("kvcontract."))


def _is_stand_in(obj: Any) -> bool:
    """A kvcontract stand-in: a ``types.SimpleNamespace`` (the fake ``self``, configs,
    request states), an instance of a class kvcontract defines (``GroupConfig``, the spec
    classes, the store path's request, manager and records, ``LookupResult``), or such a
    class itself (the manager classes the audit builds)."""
    if isinstance(obj, types.SimpleNamespace):
        return True
    cls = obj if isinstance(obj, type) else type(obj)
    return cls is not type and _is_kvcontract_module(getattr(cls, "__module__", None))


def _stand_in_names() -> set[str]:
    """Names of the stand-in classes and functions an error message may name."""
    names = {"SimpleNamespace", "types.SimpleNamespace", SWM_CLS, "FullAttentionManager"}
    from kvcontract.tools.audit import lookup, store

    for module in (__import__(__name__, fromlist=["_"]), store, lookup):
        for name, value in vars(module).items():
            if isinstance(value, type) and _is_kvcontract_module(value.__module__):
                names.add(name)
                names.add(value.__qualname__)
    return names - {"UpstreamError", "UpstreamTimeout", "StandInGap", "MissingRole"}


def _innermost_frame(exc: BaseException) -> types.FrameType | None:
    tb = exc.__traceback__
    frame = None
    while tb is not None:
        frame, tb = tb.tb_frame, tb.tb_next
    return frame


@functools.lru_cache(maxsize=64)
def _module_definitions(path: str) -> tuple[frozenset[str], dict[str, frozenset[int]]]:
    """A source file's top-level names, and the positional arities (``self`` counted) of
    every function it defines under each name, at any depth; empty when unreadable."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return frozenset(), {}
    top: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            top.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            top.update((a.asname or a.name).split(".", 1)[0] for a in node.names)
    arities: dict[str, set[int]] = {}
    for found in ast.walk(tree):
        if isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                found.args.vararg is None:
            arities.setdefault(found.name, set()).add(
                len(found.args.posonlyargs) + len(found.args.args))
    return frozenset(top), {k: frozenset(v) for k, v in arities.items()}


_TAKES = re.compile(r"takes (\d+) positional arguments?")
_CALLED = re.compile(r"^([\w.<>]+)\(\) ")


def _mixed_release_gap(exc: BaseException, message: str, callee: str | None) -> str | None:
    """A gap of laying a patch over a base release, seen from the innermost frame: a
    name the frame's own module defines at top level but the audit did not compile with
    the function (``NameError``), or a call to a function whose bound version takes
    another number of arguments than the caller's own module defines it with (the patch
    and its base disagree on a signature: the patch was written against another
    release). A call that does not fit the caller's own module's definition stays
    upstream's (a crash finding)."""
    frame = _innermost_frame(exc)
    if frame is None:
        return None
    path = frame.f_code.co_filename
    top, arities = _module_definitions(path)
    if isinstance(exc, NameError):
        name = getattr(exc, "name", None)
        if name and name in top:
            return (f"{frame.f_code.co_name} reads {name!r}, a top-level name of its own "
                    f"module ({path}) that the audit does not compile with it: NameError: "
                    f"{exc}")
        return None
    takes = _TAKES.search(message)
    if callee is None or takes is None:
        return None
    own = arities.get(callee.rsplit(".", 1)[-1])
    if own and int(takes.group(1)) not in own:
        return (f"{callee} as bound here takes {takes.group(1)} positional arguments, but "
                f"its caller {frame.f_code.co_name}'s own module ({path}) defines it with "
                f"{'/'.join(map(str, sorted(own)))}: the patch and its base release disagree "
                f"on its signature (written against another release): TypeError: {exc}")
    return None


def stand_in_gap(exc: BaseException) -> str | None:
    """What kvcontract's stand-ins lack, when ``exc`` is the tool's gap; else None.

    The rule (issue 20): every object upstream's code touches here is a kvcontract
    stand-in or a plain value (an int, a list, None...). So

    * an ``AttributeError`` on a stand-in (:func:`_is_stand_in`: ``exc.obj``, or the type
      its message names) is the stand-in lacking what upstream reads: a gap naming the
      attribute and the object;
    * a ``TypeError`` whose message names a stand-in class or its method (``'GroupConfig'
      object is not subscriptable``, ``_StoreManager.prepare_store() takes 2 positional
      arguments``) is a gap: the stand-in does not answer as upstream's object does;
    * a ``TypeError`` of argument binding (``takes 3 positional arguments but 4 were
      given``, ``unexpected keyword argument``...) raised in a frame of kvcontract's own
      code is kvcontract's calling convention that upstream's function does not take
      (the body never started): a gap naming the function and the message.

    * laying a patch over a base release (:func:`_mixed_release_gap`): a ``NameError`` of
      a top-level name of the function's own module (the audit compiles a function on
      its own), or a signature ``TypeError`` where the bound callee takes another number
      of arguments than the caller's own module defines it with.

    Everything else stays upstream's: an ``assert``, ``IndexError``, ``KeyError``,
    ``ZeroDivisionError``, a ``ValueError`` of its own, an ``AttributeError`` or
    ``TypeError`` on a plain value (``'NoneType' object has no attribute``, ``'int'
    object is not iterable``) or from upstream calling upstream with a signature it does
    not take (the innermost frame is upstream's): a crash finding, as before."""
    if isinstance(exc, AttributeError):
        obj = getattr(exc, "obj", None)
        name = getattr(exc, "name", None)
        if obj is not None and _is_stand_in(obj):
            shown = obj.__name__ if isinstance(obj, type) else type(obj).__name__
            return (f"the stand-in {shown} has no attribute {name!r} (upstream's code reads "
                    f"it; kvcontract does not model it): AttributeError: {exc}")
        match = _NAMED_TYPE.match(str(exc))
        if match and (match.group("type") or match.group("cls")) in _stand_in_names():
            return f"a kvcontract stand-in lacks what upstream's code reads: AttributeError: {exc}"
        return None
    if isinstance(exc, TypeError):
        message = str(exc)
        match = _NAMED_TYPE.match(message)
        named = match and (match.group("type") or match.group("cls") or match.group("fn"))
        if named and (named in _stand_in_names()
                      or named.split(".", 1)[0] in _stand_in_names()):
            return f"a kvcontract stand-in does not answer as upstream's object: TypeError: {exc}"
        frame = _innermost_frame(exc)
        if frame is not None and _SIGNATURE_ERROR.search(message) and \
                _is_kvcontract_module(frame.f_globals.get("__name__")):
            return (f"kvcontract's calling convention does not fit upstream's function "
                    f"(the audit called it as an earlier or later release does): TypeError: {exc}")
        if _SIGNATURE_ERROR.search(message):
            called = _CALLED.match(message)
            return _mixed_release_gap(exc, message, called.group(1) if called else None)
        return None
    if isinstance(exc, NameError):
        return _mixed_release_gap(exc, str(exc), None)
    return None


_CALL_TIMEOUT: list[float | None] = [None]
_IN_CALL: list[bool] = [False]

UPSTREAM_MODULE = "kvcontract_audit_upstream"
"""``__name__`` of the namespace every bound upstream function is compiled in
(:func:`_namespace`): how a frame of upstream code is told from kvcontract's."""

EXIT_CALL_PAST_LIMIT = 86
"""The exit status of a sandbox child whose upstream call went on for twice its CPU-time
limit after the limit's exception was raised into it (upstream code that catches it and
goes on): the child cannot stop the call, so it ends itself and the parent reports the
call named on its :class:`CallBoard`. (C code that never returns to Python is killed by
the parent: ``sandbox.PAST_LIMIT_FACTOR``.)"""

MIN_WATCH_WINDOW = 1.5
"""The shortest wall-clock window (seconds) in which the sandbox's watchdog judges a call
blocked (:func:`watch_window`): a call may wait briefly and still return (a page-in, a
short sleep: a second with a 0.3 s limit returns, tests/tools/audit/
test_audit_robustness.py), so only a longer wait is read as a hang."""


def watch_window(seconds: float) -> float:
    """How long (wall-clock seconds) an upstream call with a CPU-time limit of
    ``seconds`` must stay blocked, using no CPU and not waiting for one, before the
    sandbox's watchdog interrupts it: the limit itself, at least
    :data:`MIN_WATCH_WINDOW`."""
    return max(seconds, MIN_WATCH_WINDOW)


class CallBoard:
    """The upstream call a sandbox child is in, shared with its parent: an anonymous
    shared memory page made before the fork. The child writes it (:func:`_time_limit`,
    only when it arms a limit, so every run writes the same at the same points); the
    parent reads it to watch a blocked call (``sandbox``) and to name the call in flight
    of a child that died, and flags the call it found blocked."""

    SIZE = 4096
    _SEQ, _ACTIVE, _FLAGGED, _LENGTH, _ENDED_ITSELF = range(5)
    _NAME_AT = 64

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, self.SIZE)
        self._ints = memoryview(self._map).cast("q")

    def begin(self, name: bytes) -> None:
        """A call starts: its name first, then its number (the parent reads in order)."""
        ints = self._ints
        size = min(len(name), self.SIZE - self._NAME_AT)
        self._map[self._NAME_AT:self._NAME_AT + size] = name[:size]
        ints[self._LENGTH] = size
        ints[self._SEQ] += 1
        ints[self._ACTIVE] = ints[self._SEQ]

    def end(self) -> None:
        self._ints[self._ACTIVE] = 0

    def active(self) -> int:
        """The number of the call in flight, 0 when none."""
        return int(self._ints[self._ACTIVE])

    def name(self) -> str:
        """The last call's name (the call in flight while :meth:`active` is not 0)."""
        size = int(self._ints[self._LENGTH])
        return bytes(self._map[self._NAME_AT:self._NAME_AT + size]).decode(
            "utf-8", "replace")

    def flag(self, call: int) -> None:
        """The parent found call ``call`` blocked (before it signals the child)."""
        self._ints[self._FLAGGED] = call

    def flagged(self) -> int:
        return int(self._ints[self._FLAGGED])

    def ended_itself(self) -> bool:
        """Whether the child exited because its call went on past the limit."""
        return bool(self._ints[self._ENDED_ITSELF])

    def mark_ended_itself(self) -> None:
        self._ints[self._ENDED_ITSELF] = 1

    def close(self) -> None:
        self._ints.release()
        self._map.close()


_BOARD: list[CallBoard | None] = [None]
_ENCODED: dict[str, bytes] = {}

_ARMED: list[Any] = ["", 0.0, 0, False, ""]
"""The armed call: name, limit (CPU seconds), times the CPU-time alarm fired, whether the
watchdog found it blocked, the innermost upstream frame when it was stopped. A list
mutated in place: arming a call allocates nothing the collector counts."""
_NAME, _SECONDS, _FIRED, _BLOCKED, _INNER = range(5)

_HUNG: dict[str, str] = {}
"""Calls (by name) that hung in this process, with what was reported: not called again
(a concrete call; a symbolic one may hang where a concrete one returns)."""


def set_call_timeout(seconds: float | None, board: CallBoard | None = None) -> None:
    """Bound every upstream call in this process (used by the sandbox child): ``seconds``
    of CPU time (user and system) of this process, never wall-clock time, so a call that
    returns on an idle machine returns however loaded the machine is (what the audit
    reports must not depend on load). ``board``: the sandbox's :class:`CallBoard`, whose
    parent interrupts a call blocked without using CPU (``SIGUSR2``)."""
    _CALL_TIMEOUT[0] = seconds
    _HUNG.clear()
    _BOARD[0] = board
    if board is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR2, _on_watchdog)


class _CallAlarm(BaseException):
    """Raised into upstream code when its call is past the limit: a BaseException, so
    upstream's ``except Exception`` does not swallow it; :func:`_time_limit` turns it
    into :class:`UpstreamTimeout`."""


def _innermost_upstream(frame: types.FrameType | None) -> str:
    """``function (file:line)`` of the innermost upstream frame, or ""."""
    while frame is not None:
        if frame.f_globals.get("__name__") == UPSTREAM_MODULE:
            code = frame.f_code
            return f"{code.co_name} ({code.co_filename}:{frame.f_lineno})"
        frame = frame.f_back
    return ""


def _on_alarm(signum: int, frame: types.FrameType | None) -> None:
    """The armed call used its CPU time: stop it. An alarm that upstream swallowed
    fires again half a limit later; at twice the limit the call cannot be stopped, so
    a sandbox child ends (:data:`EXIT_CALL_PAST_LIMIT`), its board naming the call
    (another process, a reproducer's, only keeps raising)."""
    if not _IN_CALL[0]:
        return  # the call returned as the timer fired
    _ARMED[_FIRED] += 1
    board = _BOARD[0]
    if _ARMED[_FIRED] >= 3 and board is not None:
        board.mark_ended_itself()
        os._exit(EXIT_CALL_PAST_LIMIT)
    if not _ARMED[_INNER]:
        _ARMED[_INNER] = _innermost_upstream(frame)
    raise _CallAlarm()


def _on_watchdog(signum: int, frame: types.FrameType | None) -> None:
    """The sandbox's parent found the call in flight blocked without using CPU."""
    board = _BOARD[0]
    if board is None or not _IN_CALL[0] or board.active() == 0 or \
            board.flagged() != board.active():
        return  # the call it found blocked has returned meanwhile
    _ARMED[_BLOCKED] = True
    if not _ARMED[_INNER]:
        _ARMED[_INNER] = _innermost_upstream(frame)
    raise _CallAlarm()


def _stopped(what: str, seconds: float, caught: bool) -> str:
    """What an UNKNOWN row says of a call the limit stopped."""
    if _ARMED[_BLOCKED]:
        text = (f"{what} blocked for {watch_window(seconds):g}s without using CPU time "
                "(stopped by the sandbox's wall-clock watchdog)")
    else:
        text = f"{what} did not return within {seconds:g}s of CPU time (--timeout)"
    inner = str(_ARMED[_INNER])
    if inner:
        function, _, place = inner.partition(" ")
        own = function == what.split(" ", 1)[0].rsplit(".", 1)[-1]
        text += f", at {place.strip('()')}" if own else f", in {inner}"
    if caught:
        text += "; it caught the limit's exception"
    return text


@contextmanager
def _time_limit(what: str) -> Iterator[None]:
    """Bound one upstream call (the outermost; a nested one runs under its caller's).

    In a sandbox child (:func:`set_call_timeout`): ``ITIMER_PROF`` counts this
    process's CPU time, so a busy hang is stopped after ``seconds`` of work on any
    machine; a call blocked without using CPU is stopped by the parent's watchdog
    (:class:`CallBoard`). Either way :class:`UpstreamTimeout` names the call and the
    limit, and a call that hung is not made again in this process (the next one raises
    at once), unless it was a symbolic call (the concrete one may return)."""
    seconds = _CALL_TIMEOUT[0]
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    lifted = bool(symbolic._current)
    hung = None if lifted else _HUNG.get(what)
    if hung is not None:
        _timed_out(f"{hung}; not called again in this check")
    if _IN_CALL[0]:
        yield
        return
    _ARMED[_NAME], _ARMED[_SECONDS], _ARMED[_FIRED] = what, seconds, 0
    _ARMED[_BLOCKED], _ARMED[_INNER] = False, ""
    board = _BOARD[0]
    previous = signal.signal(signal.SIGPROF, _on_alarm)
    # Fires after ``seconds`` of CPU time, then every half limit while the call goes on.
    signal.setitimer(signal.ITIMER_PROF, seconds, seconds / 2)
    if board is not None:
        name = _ENCODED.get(what)
        if name is None:
            name = _ENCODED[what] = what.encode("utf-8", "replace")
        board.begin(name)
    _IN_CALL[0] = True
    returned, caught = True, False
    try:
        yield
    except _CallAlarm:
        returned = False
    except Exception:
        if not (_ARMED[_FIRED] or _ARMED[_BLOCKED]):
            raise  # upstream's own exception: the caller judges it
        # Raised because upstream caught the limit's exception: says nothing.
        returned, caught = False, True
    finally:
        _IN_CALL[0] = False  # first: an alarm handled from here on is ignored
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
        if board is not None:
            board.end()
    if not (_ARMED[_FIRED] or _ARMED[_BLOCKED]):
        return
    # Stopped, or it caught the limit's exception: what it did was shaped by the limit,
    # not by the code.
    message = _stopped(what, seconds, caught=caught or returned or _ARMED[_FIRED] > 1)
    if not lifted:
        _HUNG[what] = message
    _STOPPED[0] = message
    if returned:
        _timed_out(message)  # it returned: no exception is being handled here
    # Else the exception is swallowed here (an exception raised while the call's is
    # handled would carry it as its context) and the caller raises after its ``with``
    # block (:func:`_expired`).


_STOPPED: list[str] = [""]
"""What the last call the limit stopped reports (:func:`_expired`)."""


def _expired() -> NoReturn:
    """After ``with _time_limit(...): return call()``: reached only when the limit
    stopped the call and swallowed its exception; raise its timeout."""
    _timed_out(_STOPPED[0])


def _timed_out(message: str) -> NoReturn:
    """Raise the timeout of a call, from one place and with no exception as its context,
    whether the call was stopped or not made again: a search that replays a failing case
    (Hypothesis) meets the same failure each time, never a flaky one."""
    raise UpstreamTimeout(message)


def limited(what: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (upstream code) called under the per-call limit named ``what``
    (:func:`_time_limit`), its own exceptions unchanged: for a call site that judges
    upstream's exceptions itself."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _time_limit(what):
            return fn(*args, **kwargs)
        _expired()

    return call


def limit_loaded_release(package: str = "vllm") -> list[str]:
    """Every audited function (:data:`ROLES`) of a release this process has imported
    (vLLM's engine as the judge, imported before the sandbox forks) called under the
    per-call limit, as the bound functions are: its definition in its module or class
    replaced by a :func:`limited` wrapper, and every loaded module of ``package`` that
    imported it by name given the wrapper. Meant for a sandbox child (the parent's
    release is left as it is): each calls it at its start, and a child that lays a
    patch over the release afterwards must call it again (the patch's definitions
    replace the wrappers). What was wrapped, ``qualname (file:line)`` each."""
    wrapped: list[str] = []
    replaced: dict[int, Callable[..., Any]] = {}
    for spec in ROLES:
        for relative in spec.files:
            module = sys.modules.get(f"{package}." + relative[:-3].replace("/", "."))
            if module is None:
                continue
            for qualname in spec.qualnames:
                *path, name = qualname.split(".")
                owner: Any = module
                for part in path:
                    owner = getattr(owner, part, None)
                raw = vars(owner).get(name) if owner is not None else None
                function = getattr(raw, "__func__", raw)
                if not isinstance(function, types.FunctionType) or \
                        hasattr(function, "__wrapped__"):
                    continue  # absent from this release, or wrapped already
                code = function.__code__
                what = f"{qualname} ({code.co_filename}:{code.co_firstlineno})"
                new = limited(what, function)
                setattr(owner, name, classmethod(new) if isinstance(raw, classmethod)
                        else staticmethod(new) if isinstance(raw, staticmethod) else new)
                replaced[id(function)] = new
                wrapped.append(what)
    if replaced:
        for loaded_name, loaded in list(sys.modules.items()):
            if loaded is None or not (loaded_name == package
                                      or loaded_name.startswith(package + ".")):
                continue
            for attribute, value in list(vars(loaded).items()):
                if isinstance(value, types.FunctionType) and id(value) in replaced:
                    setattr(loaded, attribute, replaced[id(value)])
    return wrapped


def _passthrough(exc: BaseException) -> bool:
    """Exceptions of the symbolic executor must reach it unchanged."""
    return type(exc).__module__ == symbolic.__name__ or isinstance(exc, (MissingRole,
                                                                         UpstreamError))


# -- stand-ins for upstream's collaborators -------------------------------------------
def cdiv(a: Any, b: Any) -> Any:
    """``ceil(a / b)`` for b > 0, written so Z3's Euclidean division agrees with it."""
    return -(-a // b)


def round_down(x: Any, multiple: Any) -> Any:
    return (x // multiple) * multiple


class KVCacheSpec:
    """Stand-in base of upstream's spec classes (only ``isinstance`` is used)."""


@dataclass
class FullAttentionSpec(KVCacheSpec):
    block_size: Any = 16


@dataclass
class SlidingWindowSpec(KVCacheSpec):
    block_size: Any = 16
    sliding_window: Any = 0
    extra_retained_tokens: Any = 0


@dataclass
class ChunkedLocalAttentionSpec(KVCacheSpec):
    block_size: Any = 16
    attention_chunk_size: Any = 0


@dataclass
class MambaSpec(KVCacheSpec):
    block_size: Any = 16
    mamba_cache_mode: str = "align"
    """Offloading needs prefix caching, and Mamba prefix caching needs ``align`` mode
    (``MambaManager.__init__``, vLLM 0.30-0.33)."""


class UpstreamRequestStatus(enum.IntEnum):
    """Stand-in of ``vllm.v1.request.RequestStatus`` (the store path compares a request's
    status with ``FINISHED_ABORTED`` and asks ``is_finished``: every status past
    ``PREEMPTED`` is a finished one)."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: UpstreamRequestStatus) -> bool:
        return status > UpstreamRequestStatus.PREEMPTED


class _Record:
    """A plain record of what upstream builds (transfer jobs, block specs): the store
    path only creates them and reads back the fields it set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.__dict__.update(kwargs)


class GPULoadStoreSpec(_Record):
    """Stand-in of the GPU side of a transfer (block ids, group sizes, block indices)."""


class TransferJob(_Record):
    """Stand-in of a transfer job (request, source and destination specs)."""


class TransferJobStatus(_Record):
    """Stand-in of the scheduler's record of a transfer job."""

    is_store = False
    is_sync_load = False
    deferred_fence_block_ids: Any = None
    fenced_block_ids: Any = None


class ConnectorMetricName(enum.Enum):
    """Stand-in of the connector's metric names (an allocation failure is counted)."""

    ALLOCATION_FAILURE = "allocation_failure"


def spec_stand_in(geometry: Any, group: Any) -> KVCacheSpec:
    """The stand-in KV-cache spec upstream's code reads for one group of ``geometry``
    (its block size in tokens; a sliding window with its ``e``; Mamba in align mode)."""
    from kvcontract.vocabulary import GroupKind

    bs = geometry.block_tokens(group)
    if group.kind is GroupKind.SLIDING_WINDOW:
        return SlidingWindowSpec(block_size=bs, sliding_window=group.sliding_window,
                                 extra_retained_tokens=group.extra_retained_tokens)
    if group.kind is GroupKind.MAMBA:
        return MambaSpec(block_size=bs)
    return FullAttentionSpec(block_size=bs)


class _AssertFailed(AssertionError):
    pass


def _kvc_assert(condition: Any, message: Any = None) -> None:
    """Replacement of upstream ``assert`` statements.

    On concrete values it raises like ``assert``. During symbolic execution a failing
    assertion ends the path instead (its condition is one of upstream's stated
    preconditions, e.g. ``sliding_window > 0``, which every theorem's hypotheses
    imply); concrete replays and the grids still execute every assertion for real.
    """
    if symbolic._current:
        if not condition:
            raise symbolic._Fork()
        return
    if not condition:
        raise _AssertFailed(message if message is not None else "assertion failed")


def _namespace() -> dict[str, Any]:
    from collections.abc import Iterable, Mapping
    from typing import ClassVar

    return {
        "__name__": "kvcontract_audit_upstream",
        "__builtins__": __builtins__,
        "LookupResult": LookupResult,
        "cdiv": cdiv,
        "round_down": round_down,
        "KVCacheSpec": KVCacheSpec,
        "AttentionSpec": KVCacheSpec,
        "FullAttentionSpec": FullAttentionSpec,
        "SlidingWindowSpec": SlidingWindowSpec,
        "ChunkedLocalAttentionSpec": ChunkedLocalAttentionSpec,
        "MambaSpec": MambaSpec,
        "replace": dataclasses.replace,
        "chain": itertools.chain,
        "islice": itertools.islice,
        "RequestStatus": UpstreamRequestStatus,
        "GPULoadStoreSpec": GPULoadStoreSpec,
        "TransferJob": TransferJob,
        "TransferJobStatus": TransferJobStatus,
        "_ConnectorMetricName": ConnectorMetricName,
        "logger": logging.getLogger("kvcontract.audit.upstream"),
        "Sequence": Sequence,
        "Iterable": Iterable,
        "Mapping": Mapping,
        "ClassVar": ClassVar,
        "Any": Any,
        "__kvc_assert__": _kvc_assert,
    }


class _AssertToCall(ast.NodeTransformer):
    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        args: list[ast.expr] = [node.test]
        if node.msg is not None:
            args.append(node.msg)
        call = ast.Expr(ast.Call(ast.Name("__kvc_assert__", ast.Load()), args, []))
        return ast.copy_location(call, node)


# -- locating ---------------------------------------------------------------------------
@dataclass
class Located:
    qualname: str
    path: Path
    line: int
    node: ast.FunctionDef


def _index(path: Path) -> dict[str, Located]:
    """Every function of a file by qualified name (``Class.method``) and bare name."""
    try:
        source = path.read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(source, filename=str(path))
    except (OSError, SyntaxError, ValueError) as exc:
        raise InputFileError(str(path), f"cannot parse: {exc}") from None
    found: dict[str, Located] = {}
    _collect_functions(tree.body, "", path, found)
    return found


def _collect_functions(body: list[ast.stmt], prefix: str, path: Path,
                       found: dict[str, Located]) -> None:
    """Add the functions of ``body``, and of its classes (nested), to ``found`` under
    their qualified names; the first definition of a name wins."""
    for node in body:
        if isinstance(node, ast.FunctionDef):
            qual = prefix + node.name
            found.setdefault(qual, Located(qual, path, node.lineno, node))
        elif isinstance(node, ast.ClassDef):
            _collect_functions(node.body, prefix + node.name + ".", path, found)


class _FunctionIndex:
    """The functions of every file searched so far (each file is parsed once)."""

    def __init__(self) -> None:
        self._files: dict[Path, dict[str, Located]] = {}

    def find(self, path: Path, qualname: str, *, any_class: bool) -> Located | None:
        """``qualname`` in ``path``; with ``any_class`` also a function of that name in
        any class (a patched file may nest the function in any class)."""
        if path not in self._files:
            self._files[path] = _index(path)
        functions = self._files[path]
        hit = functions.get(qualname)
        if hit is None and any_class:
            hit = next((loc for q, loc in functions.items()
                        if q.rsplit(".", 1)[-1] == qualname), None)
        return hit


def _compile(located: Located) -> Callable[..., Any]:
    node = copy.deepcopy(located.node)
    node.decorator_list = []
    node = _AssertToCall().visit(node)
    module = ast.Module(body=[node], type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(module, str(located.path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace = _namespace()
    exec(code, namespace)
    fn = namespace[node.name]
    if not callable(fn):
        raise TypeError(f"{located.qualname} is not a function")
    return fn  # type: ignore[no-any-return]


@dataclass
class RoleBinding:
    """What the audit found for one role (printed, and in the report's ``bindings``)."""

    role: str
    status: str
    """``found``, ``missing``, ``derived`` (composed from found functions) or ``error``.
    Nothing is ``inferred``: no behaviour of upstream is modelled from its source text."""
    what: str
    qualname: str | None = None
    path: str | None = None
    line: int | None = None
    signature: str | None = None
    shape: str | None = None
    note: str = ""
    source: str | None = None
    """Where a found role's definition came from: ``patch`` (the ``module:`` file),
    ``base`` (the base release it is laid over) or ``target`` (the tree's own file)."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def where(self) -> str:
        return f"{self.path}:{self.line}" if self.path else "-"


@dataclass
class Binding:
    """The bound target: role records, compiled functions and the adapted bundle."""

    target: Target
    roles: dict[str, RoleBinding] = field(default_factory=dict)
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)
    nodes: dict[str, ast.FunctionDef] = field(default_factory=dict)
    """The located definition of each found role (inspected, e.g. the store builder)."""
    implementation: Implementation | None = None
    missing_fields: dict[str, str] = field(default_factory=dict)
    """Implementation field -> why it could not be bound."""
    engine: Any = None
    """The target's vLLM as the judge (:class:`kvcontract.tools.audit.on_engine.
    EngineJudge`), set by :func:`~kvcontract.tools.audit.on_engine.prepare_engine`'s
    caller; None: the ``upstream-*`` theorems run on stand-ins."""
    engine_why: str = ""
    """Why there is no engine (empty when there is one, or for a built-in target)."""
    engine_fallback: bool = False
    """The engine was wanted (``--judge auto``) and could not run: the stand-ins'
    findings are ``unconfirmed`` (exit 3), never a defect of the release. False when
    stand-ins were chosen (``--judge stand-ins``, or a binding no engine was offered)."""

    def location(self, role: str) -> tuple[str, int] | None:
        rb = self.roles.get(role)
        if rb is None or rb.path is None or rb.line is None:
            return None
        return rb.path, rb.line

    def field_location(self, field_name: str) -> tuple[str, int] | None:
        for role in FIELD_ROLES.get(field_name, ()):
            for candidate in _pseudo_sources(self, role):
                loc = self.location(candidate)
                if loc:
                    return loc
        return None

    def to_json(self) -> list[dict[str, Any]]:
        return [rb.to_json() for rb in self.roles.values()]


def _pseudo_sources(binding: Binding, role: str) -> list[str]:
    if role == "reachability":
        return ["store_mask", "store_predicate", "block_mask"]
    if role == "store_horizon":
        return ["store_jobs", "store_predicate"]
    return [role]


# -- adapters ------------------------------------------------------------------------------
def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, symbolic.SymInt)) and not isinstance(value, bool)) or \
        type(value).__name__ == "ArithRef"


def _guarded(what: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            with _time_limit(what):
                return fn(*args, **kwargs)
            _expired()
        except BaseException as exc:
            if _passthrough(exc) or not isinstance(exc, Exception):
                raise
            gap = stand_in_gap(exc)
            if gap is not None:
                raise StandInGap(f"{what}: {gap}") from exc
            raise UpstreamError(f"{what} raised {type(exc).__name__}: {exc}") from exc

    return call


def _garbage(what: str, value: Any, expected: str) -> UpstreamError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return UpstreamError(f"{what} returned {shown} ({type(value).__name__}), expected {expected}")


class _Manager:
    def __init__(self, lookup: Callable[[int], LookupResult]) -> None:
        self._lookup = lookup
        self.calls = 0

    def lookup(self, key: Any, req_context: Any = None) -> LookupResult:
        self.calls += 1
        result = self._lookup(key)
        return result


class _EventsTracker:
    def record_lookup(self, *args: Any, **kwargs: Any) -> None:
        return None

    def record_store(self, *args: Any, **kwargs: Any) -> None:
        return None


class GroupConfig:
    """Stand-in for upstream's ``GroupOffloadConfig`` (attributes the bodies read)."""

    def __init__(self, **fields: Any) -> None:
        self.group_idx = 0
        self.tokens_per_block = 16
        self.tokens_per_chunk = 16
        self.hashes_per_chunk = 1
        self.sliding_window_size_in_chunks: Any = None
        self.kv_cache_spec: Any = None
        self.manager_cls: Any = None
        self.requires_cow_source = False
        self.alignment_chunk_count: Any = None
        self.is_eagle_group = False
        for key, value in fields.items():
            setattr(self, key, value)


def _param_names(fn: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(fn).parameters)


Fields = dict[str, Callable[..., Any]]
"""Implementation field -> its adapter, filled role by role by :func:`_build_adapters`."""


def _build_adapters(binding: Binding) -> None:
    """Give every bound role an adapter with the matching Implementation signature; a
    field whose roles are missing raises :class:`MissingRole` (the engine skips it)."""
    fields: Fields = {}
    _adapt_skipped(binding, fields)
    _adapt_window(binding, fields)
    _adapt_load_window(binding, fields)
    _adapt_sw_scan(binding, fields)
    _adapt_prefix_scan(binding, fields)
    _adapt_reachability(binding, fields)
    # No store horizon: never inferred from the builder's text (_no_store_horizon).
    binding.missing_fields["store_final_segment_end"] = _no_store_horizon(binding)
    _adapt_replay_boundaries(binding, fields)
    binding.implementation = _assemble_implementation(binding, fields)


def _where(binding: Binding, role: str) -> str:
    """A bound role as error messages name it: ``qualname (path:line)``."""
    rb = binding.roles[role]
    return f"{rb.qualname} ({rb.path}:{rb.line})"


def _scan_has_initial(binding: Binding) -> bool:
    """Whether the bound sliding-window scanner takes ``initial_window_size`` (0.30+)."""
    f = binding.functions
    scan_params = _param_names(f["sw_scan"]) if "sw_scan" in f else []
    return "initial_window_size" in scan_params


def _adapt_skipped(binding: Binding, fields: Fields) -> None:
    """``get_num_skipped_tokens``, and ``Ret(n)`` / ``Load(N, L)`` derived from it."""
    if "skipped" not in binding.functions:
        return
    skipped_fn = _guarded(_where(binding, "skipped"), binding.functions["skipped"])

    def get_num_skipped_tokens(n: Any, sliding_window: Any, extra_retained: Any) -> Any:
        manager = types.SimpleNamespace(sliding_window=sliding_window,
                                        extra_retained_tokens=extra_retained)
        value = skipped_fn(manager, n)
        if not _is_number(value):
            raise _garbage(_where(binding, "skipped"), value, "an int")
        return value

    def retained_block_range(n: Any, bs: Any, sw: Any, e: Any) -> tuple[Any, Any]:
        return get_num_skipped_tokens(n, sw, e) // bs, cdiv(n, bs)

    def load_chunk_range(hit: Any, local: Any, bs: Any, bpc: Any, sw: Any,
                         e: Any) -> tuple[Any, Any]:
        first = get_num_skipped_tokens(hit, sw, e) // bs
        local_blocks = cdiv(local, bs)
        if local_blocks > first:
            first = local_blocks
        return first // bpc, cdiv(hit, bs * bpc)

    fields["get_num_skipped_tokens"] = get_num_skipped_tokens
    fields["retained_block_range"] = retained_block_range
    fields["load_chunk_range"] = load_chunk_range
    binding.roles["retained_range"] = RoleBinding(
        "retained_range", "derived", "retained blocks Ret(n) and load set Load(N, L)",
        note="[skipped(n) // bs, cdiv(n, bs)) from the bound get_num_skipped_tokens "
             "(the allocation path itself is not executed)")


def _adapt_window(binding: Binding, fields: Fields) -> None:
    """The window ``W`` in chunks, for a sliding-window spec stand-in."""
    if "window" not in binding.functions:
        return
    window_fn = _guarded(_where(binding, "window"), binding.functions["window"])

    def get_sliding_window_size_in_chunks(sw: Any, e: Any, tpc: Any) -> Any:
        spec = SlidingWindowSpec(block_size=tpc, sliding_window=sw, extra_retained_tokens=e)
        value = window_fn(spec, tpc)
        if not _is_number(value):
            raise _garbage(_where(binding, "window"), value, "an int for a sliding-window spec")
        return value

    fields["get_sliding_window_size_in_chunks"] = get_sliding_window_size_in_chunks


def _adapt_load_window(binding: Binding, fields: Fields) -> None:
    """The load window ``lw(N)``: the bound function (it needs the window adapter), or
    ``W`` itself where the scanner has no initial window (0.28/0.29)."""
    f = binding.functions
    roles = binding.roles
    if "load_window" in f and "get_sliding_window_size_in_chunks" in fields:
        lw_fn = _guarded(_where(binding, "load_window"), f["load_window"])
        window_adapter = fields["get_sliding_window_size_in_chunks"]

        def load_window_size_in_chunks(boundary: Any, sw: Any, e: Any, tpc: Any) -> Any:
            spec = SlidingWindowSpec(block_size=tpc, sliding_window=sw, extra_retained_tokens=e)
            config = GroupConfig(sliding_window_size_in_chunks=window_adapter(sw, e, tpc),
                                 kv_cache_spec=spec, tokens_per_chunk=tpc, tokens_per_block=tpc)
            value = lw_fn(config, boundary)
            if not _is_number(value):
                raise _garbage(_where(binding, "load_window"), value,
                               "an int for a sliding-window spec")
            return value

        fields["load_window_size_in_chunks"] = load_window_size_in_chunks
    elif "load_window" not in f and "sw_scan" in f and not _scan_has_initial(binding) and \
            "get_sliding_window_size_in_chunks" in fields:
        window_only = fields["get_sliding_window_size_in_chunks"]

        def load_window_is_w(boundary: Any, sw: Any, e: Any, tpc: Any) -> Any:
            return window_only(sw, e, tpc)

        fields["load_window_size_in_chunks"] = load_window_is_w
        roles["load_window"].status = "derived"
        anchor = roles.get("multi_group_lookup") or roles["sw_scan"]
        roles["load_window"].path, roles["load_window"].line = anchor.path, anchor.line
        roles["load_window"].note = (
            "absent; this scanner has no initial_window_size, so the lookup requires W chunks "
            "ending at cdiv(N, tpc) for every boundary: lw(N) = W")
    elif "load_window" in f:
        binding.missing_fields["load_window_size_in_chunks"] = "needs the window function"


def _adapt_sw_scan(binding: Binding, fields: Fields) -> None:
    """The sliding-window scanner over a lookup callback (a manager stand-in)."""
    if "sw_scan" not in binding.functions:
        return
    scan_fn = _guarded(_where(binding, "sw_scan"), binding.functions["sw_scan"])
    scan_has_initial = _scan_has_initial(binding)

    def sliding_window_lookup(lookup: Callable[[int], LookupResult], start: int, end: int,
                              initial_window: int, window: int) -> int | None:
        keys = list(range(start, end))
        sched = types.SimpleNamespace(manager=_Manager(lookup),
                                      _events_tracker=_EventsTracker())
        if scan_has_initial:
            value = scan_fn(sched, keys, window, None, initial_window_size=initial_window)
        else:
            value = scan_fn(sched, keys, window, None)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or \
                not 0 <= value <= len(keys):
            raise _garbage(_where(binding, "sw_scan"), value,
                           f"None or an index in [0, {len(keys)}]")
        return start + value

    fields["sliding_window_lookup"] = sliding_window_lookup


def _adapt_prefix_scan(binding: Binding, fields: Fields) -> None:
    """The full-attention prefix scanner; required parameters it does not know (a later
    release's recompute budget) are passed as 0."""
    if "prefix_scan" not in binding.functions:
        return
    prefix_raw = binding.functions["prefix_scan"]
    prefix_fn = _guarded(_where(binding, "prefix_scan"), prefix_raw)
    params = _param_names(prefix_raw)
    known = {"self", "keys", "req_context", "req", "group_config", "start_chunk_idx"}
    extra = [p for p in params if p not in known
             and inspect.signature(prefix_raw).parameters[p].default is inspect.Parameter.empty]

    def prefix_lookup(lookup: Callable[[int], LookupResult], start: int,
                      end: int) -> int | None:
        keys = list(range(start, end))
        sched = types.SimpleNamespace(manager=_Manager(lookup),
                                      _events_tracker=_EventsTracker())
        request = types.SimpleNamespace(request_id="audit", num_tokens=end)
        kwargs: dict[str, Any] = {"keys": keys, "req_context": None, "req": request,
                                  "group_config": GroupConfig(),
                                  "start_chunk_idx": start}
        for name in extra:
            kwargs[name] = 0  # e.g. a later recompute budget: none
        value = prefix_fn(sched, **{k: v for k, v in kwargs.items() if k in params})
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or \
                not 0 <= value <= len(keys):
            raise _garbage(_where(binding, "prefix_scan"), value,
                           f"None or a count in [0, {len(keys)}]")
        return start + value

    if extra:
        binding.roles["prefix_scan"].note = f"extra parameters {extra} passed as 0"
    fields["prefix_lookup"] = prefix_lookup


# -- store reachability ----------------------------------------------------------------
def _adapt_reachability(binding: Binding, fields: Fields) -> None:
    """``is_block_reachable`` from the first store-reachability shape the target has:
    the scheduler's store mask over the manager's block mask (0.30+), the chunk-level
    predicate (0.28/0.29), or the manager's block mask alone."""
    f = binding.functions
    manager_cls = _manager_class(binding)
    reach: Callable[..., Any] | None = None
    note = ""
    if "store_mask" in f and manager_cls is not None:
        reach = _reach_via_store_mask(binding, manager_cls)
        note = ("_reachable_store_block_mask over one block (bpc = 1 view), driving "
                "reachable_block_mask through a SlidingWindowManager stand-in")
    elif "store_predicate" in f and "get_sliding_window_size_in_chunks" in fields:
        reach = _reach_via_predicate(binding, fields["get_sliding_window_size_in_chunks"])
        note = ("is_store_reachable_swa_chunk at block granularity (bpc = 1 view); "
                "alignment_chunk_count = A // B when A > B and W < A // B (upstream's rule), "
                "storable count = the horizon passed to the mask; no retention interval")
    elif manager_cls is not None:
        reach = _reach_via_block_mask(binding, manager_cls)
        note = "reachable_block_mask alone (no scheduler-side widening found)"
    if reach is not None:
        binding.roles["reachability"] = RoleBinding(
            "reachability", "derived", "per-block store reachability", note=note)
        fields["is_block_reachable"] = reach


def _assumed_contiguous_blocks(cls: Any, window_size: Any, block_size: Any,
                               use_eagle: bool) -> Any:
    """Upstream's blocks-per-hit rule, used where ``_contiguous_blocks_for_hit`` is absent."""
    return cdiv(window_size - 1, block_size) + (1 if use_eagle else 0)


def _manager_class(binding: Binding) -> Any:
    """A ``SlidingWindowManager`` stand-in class carrying the bound block mask and
    contiguous-blocks rule (the assumed rule, recorded as derived, when that is absent);
    None without a block mask."""
    f = binding.functions
    if "block_mask" not in f:
        return None
    contiguous = f.get("contiguous_blocks")
    if contiguous is None:
        contiguous = _assumed_contiguous_blocks
        binding.roles["contiguous_blocks"].status = "derived"
        binding.roles["contiguous_blocks"].note = "absent; cdiv(window - 1, block) + eagle assumed"
    return type(SWM_CLS, (), {
        "reachable_block_mask": classmethod(f["block_mask"]),
        "_contiguous_blocks_for_hit": classmethod(contiguous),
    })


def _mask_value(mask: Any, what: str) -> bool:
    """The one block's entry of a one-block mask (None marks every block reachable)."""
    if mask is None:
        return True
    if not isinstance(mask, list) or len(mask) != 1 or not isinstance(mask[0], bool):
        raise _garbage(what, mask, "None or a list of one bool per block")
    return mask[0]


def _reach_via_store_mask(binding: Binding, manager_cls: Any) -> Callable[..., Any]:
    """Per-block reachability through the scheduler's ``_reachable_store_block_mask``
    over one block, driving the manager stand-in's block mask (0.30+)."""
    store_fn = _guarded(_where(binding, "store_mask"), binding.functions["store_mask"])
    mask_where = _where(binding, "store_mask")

    def reach_store_mask(block: Any, alignment: int | None, block_tokens: int, sw: Any,
                         e: Any, eagle: bool, retention: int | None,
                         final_end_block: Any | None, replay_blocks: tuple[Any, ...] = (),
                         blocks_per_chunk: int = 1) -> Any:
        spec = SlidingWindowSpec(block_size=block_tokens, sliding_window=sw,
                                 extra_retained_tokens=e)
        config = GroupConfig(kv_cache_spec=spec, manager_cls=manager_cls,
                             is_eagle_group=bool(eagle), tokens_per_block=block_tokens,
                             tokens_per_chunk=block_tokens)
        # use_lookahead_block_hashes: off, as ``eagle`` already says whether the mask
        # drops (the caller passes the hash mode's drop, docs/CONTRACT.md 2.1).
        sched = types.SimpleNamespace(config=types.SimpleNamespace(
            blocks_per_chunk=1, alignment_tokens=alignment, retention_interval=retention,
            dcp_world_size=1), use_lookahead_block_hashes=False)
        mask = store_fn(sched, config, block, block + 1, final_end_block,
                        tuple(b * block_tokens for b in replay_blocks))
        return _mask_value(mask, mask_where)

    return reach_store_mask


def _reach_via_predicate(binding: Binding,
                         window_adapter: Callable[..., Any]) -> Callable[..., Any]:
    """Per-block reachability through ``is_store_reachable_swa_chunk`` (0.28/0.29), with
    upstream's alignment rule and the horizon as the storable count."""
    predicate = _guarded(_where(binding, "store_predicate"), binding.functions["store_predicate"])
    mask_where = _where(binding, "store_predicate")

    def reach_predicate(block: Any, alignment: int | None, block_tokens: int, sw: Any,
                        e: Any, eagle: bool, retention: int | None,
                        final_end_block: Any | None, replay_blocks: tuple[Any, ...] = (),
                        blocks_per_chunk: int = 1) -> Any:
        window = window_adapter(sw, e, block_tokens)
        per: int | None = None
        if alignment is not None and alignment > block_tokens:
            per = alignment // block_tokens
            if window >= per:
                per = None
        storable = final_end_block if final_end_block is not None else block + (per or 1)
        value = predicate(block, storable, per, window, bool(eagle))
        if not isinstance(value, bool):
            raise _garbage(mask_where, value, "a bool")
        return value

    return reach_predicate


def _reach_via_block_mask(binding: Binding, manager_cls: Any) -> Callable[..., Any]:
    """Per-block reachability through the manager's ``reachable_block_mask`` alone."""
    mask_params = _param_names(binding.functions["block_mask"])
    mask_where = _where(binding, "block_mask")

    def reach_block_mask(block: Any, alignment: int | None, block_tokens: int, sw: Any,
                         e: Any, eagle: bool, retention: int | None,
                         final_end_block: Any | None, replay_blocks: tuple[Any, ...] = (),
                         blocks_per_chunk: int = 1) -> Any:
        spec = SlidingWindowSpec(block_size=block_tokens, sliding_window=sw,
                                 extra_retained_tokens=e)
        kwargs: dict[str, Any] = {
            "start_block": block, "end_block": block + 1, "alignment_tokens": alignment,
            "kv_cache_spec": spec, "use_eagle": bool(eagle),
            "retention_interval": retention,
            "reachable_boundaries": tuple(b * block_tokens for b in replay_blocks),
        }
        if "final_segment_end_block" in mask_params:
            kwargs["final_segment_end_block"] = final_end_block
        with _time_limit(mask_where):
            try:
                mask = manager_cls.reachable_block_mask(**kwargs)
            except Exception as exc:
                if _passthrough(exc):
                    raise
                gap = stand_in_gap(exc)
                if gap is not None:
                    raise StandInGap(f"{mask_where}: {gap}") from exc
                raise UpstreamError(f"{mask_where} raised {type(exc).__name__}: {exc}") \
                    from exc
            return _mask_value(mask, mask_where)
        _expired()

    return reach_block_mask


# -- the bundle ---------------------------------------------------------------------------
def _assemble_implementation(binding: Binding, fields: Fields) -> Implementation:
    """The Implementation of the adapted fields; a field that could not be bound raises
    :class:`MissingRole` with the reason recorded in ``binding.missing_fields``."""
    for name in FIELD_ROLES:
        if name not in fields and name not in binding.missing_fields:
            binding.missing_fields[name] = "missing " + ", ".join(
                _role_display(binding, r) for r in FIELD_ROLES[name])
    filled: dict[str, Any] = {
        name: fields.get(name, _missing_field(name, binding.missing_fields.get(name, "")))
        for name in FIELD_ROLES}
    return Implementation(
        name=binding.target.name, description=binding.target.display(), **filled)


def _role_display(binding: Binding, role: str) -> str:
    if role == "reachability":
        return ("store reachability (_reachable_store_block_mask + reachable_block_mask, "
                "or is_store_reachable_swa_chunk)")
    if role == "store_horizon":
        return "the store horizon (executed only as part of _build_store_jobs)"
    spec = ROLE_BY_NAME.get(role)
    return spec.qualnames[0] if spec else role


def _missing_field(name: str, reason: str) -> Callable[..., Any]:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise MissingRole(f"{name}: {reason}")

    missing.__name__ = f"missing_{name}"
    return missing


def _adapt_replay_boundaries(binding: Binding, fields: Fields) -> None:
    """``store_replay_boundaries``: what upstream's ``_build_store_jobs`` passes to its
    mask, observed by executing it (:func:`kvcontract.tools.audit.store.
    executed_replay_boundaries`), never restated from its text. Where the builder
    cannot run (a function it calls is missing), the field is missing and its theorems
    are unchecked, naming what is absent. The built-in targets keep their own field."""
    from kvcontract.tools.audit import store

    absent = store.missing(binding)
    if absent:
        binding.missing_fields["store_replay_boundaries"] = (
            "the replay boundaries are observed only by executing upstream's store path, "
            "which cannot run (it needs " + ", ".join(absent) + ")")
        return
    fields["store_replay_boundaries"] = store.executed_replay_boundaries(binding)


STORE_HORIZON_EXECUTED = (
    "the store horizon is not modelled from _build_store_jobs' source text; upstream's "
    "store path is checked as executed by the Cn/upstream-store-* theorems (and "
    "C12/upstream-no-lost-hits)")


def _no_store_horizon(binding: Binding) -> str:
    """Why ``store_final_segment_end`` is not bound: kvcontract's StoreTracker over a
    horizon read off the builder's text would be a model of upstream presented as
    upstream's. Where the builder can run, its theorems are the executed ones."""
    from kvcontract.tools.audit.store import missing

    absent = missing(binding) if binding.target.kind != "builtin" else []
    binding.roles["store_horizon"] = RoleBinding(
        "store_horizon", "missing", "final-segment horizon of a store job",
        note=STORE_HORIZON_EXECUTED if not absent else
        "not modelled from source text, and upstream's store path cannot run: it needs "
        + ", ".join(absent))
    if absent:
        return ("the store horizon is not modelled from source text, and upstream's store "
                "path cannot run (it needs " + ", ".join(absent) + ")")
    return STORE_HORIZON_EXECUTED


# -- entry point ----------------------------------------------------------------------------
def _candidates(target: Target, spec: RoleSpec) -> list[tuple[Path, str]]:
    """Where the role may be defined, in search order: the patch (any class), else the
    base release's own files; a tree's files, else the base's for a file it lacks."""
    if target.kind == "module":
        path = target.files[0]
        own = [(path, q) for q in spec.qualnames] + \
            [(path, q.rsplit(".", 1)[-1]) for q in spec.qualnames]
    else:
        assert target.package_dir is not None
        own = [(target.package_dir / rel, q) for rel in spec.files for q in spec.qualnames]
    if target.base is None:
        return own
    base_dir = target.base.package_dir
    assert base_dir is not None
    if target.kind == "module":
        return own + [(base_dir / rel, q) for rel in spec.files for q in spec.qualnames]
    # A partial tree: a file it has is its own (a function it lacks there is its
    # release's shape); a file it lacks is the base's.
    assert target.package_dir is not None
    return [(target.package_dir / rel if (target.package_dir / rel).is_file()
             else base_dir / rel, q) for rel in spec.files for q in spec.qualnames]


def _source_of(target: Target, path: Path) -> str:
    """``patch`` (a ``module:`` file), ``target`` (a tree's own file) or ``base``."""
    if target.kind == "module" and path == target.files[0]:
        return "patch"
    base_dir = target.base.package_dir if target.base is not None else None
    if base_dir is not None and path.is_relative_to(base_dir) and not (
            target.package_dir is not None and path.is_relative_to(target.package_dir)):
        return "base"
    return "target"


def bind(target: Target) -> Binding:
    """Locate, compile and adapt every role of ``target`` (builtins bind to themselves)."""
    if target.kind == "builtin":
        return _bind_builtin(target)
    binding = Binding(target)
    index = _FunctionIndex()
    for spec in ROLES:
        located = _locate(target, spec, index)
        if located is None:
            binding.roles[spec.role] = _not_found(target, spec)
        else:
            _bind_located(binding, spec, located)
    _check_patch_binds_something(binding)
    _describe_shapes(binding)
    _build_adapters(binding)
    return binding


def _check_patch_binds_something(binding: Binding) -> None:
    """A ``module:`` patch laid over a base release must define at least one audited
    function: else every finding would be the base release's, reported as the file's."""
    target = binding.target
    if target.kind != "module" or target.base is None:
        return
    if any(rb.source == "patch" for rb in binding.roles.values()):
        return
    names = sorted({spec.qualnames[0].rsplit(".", 1)[-1] for spec in ROLES})
    raise InputFileError(str(target.files[0]), (
        "defines none of the audited functions, so its audit would be the base release's "
        f"(none of {', '.join(names)}); audit the base itself (--target vllm:installed) or a "
        "file that defines one"))


def _bind_builtin(target: Target) -> Binding:
    """A built-in implementation, bound to itself with every role found."""
    binding = Binding(target)
    assert target.builtin is not None
    binding.implementation = VARIANTS[target.builtin]
    for spec in ROLES:
        binding.roles[spec.role] = RoleBinding(
            spec.role, "found", spec.what, qualname=f"kvcontract.impl ({target.builtin})",
            note="built-in implementation")
    return binding


def _locate(target: Target, spec: RoleSpec, index: _FunctionIndex) -> Located | None:
    """The role's definition: the first candidate (file, qualified name) that exists."""
    for path, qualname in _candidates(target, spec):
        if not path.is_file():
            continue
        patch = target.kind == "module" and path == target.files[0]
        hit = index.find(path, qualname, any_class=patch)
        if hit is not None:
            return hit
    return None


def _not_found(target: Target, spec: RoleSpec) -> RoleBinding:
    """The record of a role none of whose candidates exists (it names the files searched)."""
    note = "not found in " + ", ".join(sorted({str(p) for p, _ in _candidates(target, spec)}))
    if target.base is None and target.kind == "module":
        note += ("; no base release (--base): a function the patch does not define is "
                 "not bound")
        if target.notes:
            note += f" ({target.notes[-1]})"
    return RoleBinding(spec.role, "missing", spec.what, note=note)


def _bind_located(binding: Binding, spec: RoleSpec, located: Located) -> None:
    """Compile a located definition among the stand-ins and record the role; a definition
    that cannot even be created is recorded with status ``error`` (a finding)."""
    rb = RoleBinding(spec.role, "found", spec.what, qualname=located.qualname,
                     path=str(located.path), line=located.line,
                     source=_source_of(binding.target, located.path))
    try:
        fn = _compile(located)
        rb.signature = f"{located.node.name}{inspect.signature(fn)}"
    except Exception as exc:  # a definition that cannot even be created is a finding
        rb.status = "error"
        rb.note = f"cannot define it with stand-ins: {type(exc).__name__}: {exc}"
        binding.roles[spec.role] = rb
        return
    binding.functions[spec.role] = fn
    binding.nodes[spec.role] = located.node
    binding.roles[spec.role] = rb


def _describe_shapes(binding: Binding) -> None:
    """A one-phrase shape per role: which release family its signature belongs to."""
    f = binding.functions
    if "sw_scan" in f:
        has = "initial_window_size" in _param_names(f["sw_scan"])
        binding.roles["sw_scan"].shape = (
            "with initial_window_size (0.30+)" if has else "W only, no initial window (0.28/0.29)")
    if "window" in f:
        rb = binding.roles["window"]
        rb.shape = "offloading/config.py (0.33+)" if rb.path and rb.path.endswith(
            OFFLOAD_CONFIG) else "module function"
    if "block_mask" in f:
        params = _param_names(f["block_mask"])
        binding.roles["block_mask"].shape = (
            "with dcp_world_size and final_segment_end_block (0.30+)"
            if "final_segment_end_block" in params else "without final segment (0.28/0.29)")
    if "store_predicate" in f:
        binding.roles["store_predicate"].shape = "chunk-level predicate (0.28/0.29)"
    if "multi_group_lookup" in f:
        params = _param_names(f["multi_group_lookup"])
        binding.roles["multi_group_lookup"].shape = (
            "with max_num_new_tokens (0.30+)" if "max_num_new_tokens" in params
            else "req_status only (0.28/0.29)")


def reference_binding() -> Binding:
    """The built-in reference as a binding (for baselines against it)."""
    from kvcontract.tools.audit.targets import resolve_target

    binding = bind(resolve_target("builtin:reference"))
    assert binding.implementation is REFERENCE
    return binding


def has_lookahead_hashes(binding: Binding) -> bool:
    """Whether the bound release's offloading code has the lookahead block-hash mode
    (docs/CONTRACT.md 2.1: a bound function reads ``use_lookahead_block_hashes``): a
    capability found in the code, not by version."""
    return any("use_lookahead_block_hashes" in getattr(getattr(fn, "__code__", None),
                                                        "co_names", ())
               for fn in binding.functions.values())
