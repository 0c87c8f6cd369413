"""Calling upstream code: the audit's exceptions, the per-call limit, the stand-in gap.

Every call into bound upstream code goes through here: :func:`_guarded` (upstream's
exceptions become :class:`UpstreamError` findings, or :class:`StandInGap` where
:func:`stand_in_gap` finds kvcontract's stand-ins or calling convention at fault) or
:func:`limited` (its exceptions unchanged), each bounded in CPU time inside a sandbox
child (:func:`set_call_timeout`, :class:`CallBoard`, :func:`limit_loaded_release`). Its
own module below :mod:`.binding`, :mod:`.lookup`, :mod:`.store` and :mod:`.sandbox`, which
all call upstream code this way.
"""

from __future__ import annotations

import ast
import functools
import mmap
import os
import re
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from kvcontract.spec import symbolic
from kvcontract.tools.audit.roles import ROLES, SWM_CLS


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


STAND_IN_MODULES = tuple(f"kvcontract.tools.audit.{name}" for name in (
    "roles", "upstream_calls", "stand_ins", "binding", "lookup", "store"))
"""The modules that build what upstream's code touches: the classes each defines, or
imports from kvcontract, are the stand-ins an error message may name
(:func:`stand_in_gap`). Read from ``sys.modules`` when an error is classified (a module
not imported yet has built nothing upstream's code could meet), so this module, below
them all, imports none of them."""


def _stand_in_names() -> set[str]:
    """Names of the stand-in classes and functions an error message may name."""
    names = {"SimpleNamespace", "types.SimpleNamespace", SWM_CLS, "FullAttentionManager"}
    for module in filter(None, map(sys.modules.get, STAND_IN_MODULES)):
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
