"""Telling kvcontract's driver gaps from vLLM's failures.

The live backend records what vLLM raises during a step as the run's outcome (a crash:
C2's "not found" / "not ready", a failed assertion). An exception can also come from
kvcontract's own driver not fitting the installed vLLM: a call with arguments the
release no longer takes (``TypeError`` while binding them), an attribute of a vLLM
object the driver expected (``AttributeError``), an attribute vLLM read from one of the
driver's stand-ins. That is kvcontract's gap, never a verdict about vLLM.

The rule (:func:`driver_gap_of`): an exception is a driver gap when the innermost frame
that raised it is kvcontract's live package (argument binding fails in the caller's
frame, before the callee runs), or when it is an ``AttributeError`` on an object of
kvcontract's (vLLM read something the driver's stand-in lacks). Otherwise it is vLLM's.
A gap is recorded as a :class:`~kvcontract.live.observation.DriverGap` and every
consumer treats the run as UNKNOWN / not replayable (:class:`DriverGapError` where a
consumer has no observation to return).
"""

from __future__ import annotations

import os
import re
import traceback

from kvcontract.live.observation import DriverGap

LIVE_PACKAGE = os.path.dirname(os.path.abspath(__file__))
"""The live backend's own source folder: a frame there is kvcontract's driver."""

_CALLED = re.compile(r"^([A-Za-z_][\w.]*)\(\)")


class DriverGapError(RuntimeError):
    """A live run stopped on a gap of kvcontract's driver (:class:`DriverGap`): it says
    nothing about vLLM, so it cannot confirm, refute or replay anything."""

    def __init__(self, gap: DriverGap) -> None:
        super().__init__(gap.text())
        self.gap = gap


def _ours(path: str) -> bool:
    return os.path.abspath(path).startswith(LIVE_PACKAGE + os.sep)


def _frame_text(frame: traceback.FrameSummary) -> str:
    path = frame.filename
    if _ours(path):
        path = "kvcontract/live/" + os.path.relpath(path, LIVE_PACKAGE)
    elif "/vllm/" in path:
        path = "vllm/" + path.rsplit("/vllm/", 1)[1]
    return f"{path}:{frame.lineno} {frame.name}"


def _api(exc: BaseException, frame: traceback.FrameSummary | None) -> str:
    """The vLLM API the driver called or read, as far as the exception tells."""
    if isinstance(exc, AttributeError) and getattr(exc, "obj", None) is not None:
        owner = type(exc.obj)
        name = f"{owner.__module__}.{owner.__qualname__}.{exc.name}"
        if owner.__module__.startswith("kvcontract."):
            return f"{exc.name} (read by vLLM from kvcontract's {owner.__qualname__})"
        return name
    called = _CALLED.match(str(exc))
    if isinstance(exc, TypeError) and called is not None:
        return called.group(1)
    if frame is not None and frame.line:
        return frame.line.strip()
    return type(exc).__name__


def driver_gap_of(exc: BaseException, step: int, where: str) -> DriverGap | None:
    """The :class:`DriverGap` ``exc`` is, None when vLLM raised it (see the module
    docstring)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<")]
    innermost = frames[-1] if frames else None
    ours = innermost is not None and _ours(innermost.filename)
    stand_in = isinstance(exc, AttributeError) and type(
        getattr(exc, "obj", None)).__module__.startswith("kvcontract.")
    if not ours and not stand_in:
        return None
    return DriverGap(step, where, _api(exc, innermost), type(exc).__name__, str(exc),
                     _frame_text(innermost) if innermost is not None else "unknown")
