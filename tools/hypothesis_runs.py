"""Hypothesis runs whose findings depend only on the commit and the seed.

kvcontract drives Hypothesis itself (``fuzz``'s state machine, the audit's example
search). Two things Hypothesis does by default would make the same commit give different
reports on different machines, and write into the user's folders:

* **Local constants.** Now and then the default provider draws a constant it collected
  from the source of every *local* module loaded (not stdlib, not site-packages). What
  counts as local depends on how kvcontract is installed (an editable install makes
  kvcontract's own files local, a wheel does not), on the current directory and on what
  the user's process imported; collection stops after a wall-clock limit, so on a loaded
  machine fewer modules contribute. The draws, and so the programs a fuzz run tries,
  changed with all of these.
* **The constants cache.** Collected constants are cached under ``.hypothesis/`` in the
  current directory: a folder written into the user's checkout.

:func:`deterministic_hypothesis` turns local constants off for the duration of a run (the
global pool of edge values, the same on every machine, stays) and clears the provider's
cache of permitted constants on entry and exit, so nothing collected before the run
leaks into it and nothing of the run leaks out. Hypothesis offers no setting for this, so
it patches the provider module's collector; a Hypothesis release without that collector
(older or newer) needs nothing patched, and the context manager does nothing there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_LOCK = threading.Lock()
_DEPTH = 0
_ORIGINAL: Any = None


def _providers() -> Any | None:
    """Hypothesis's provider module when it collects local constants, else None."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - Hypothesis is a dependency
        return None
    if not callable(getattr(providers, "_get_local_constants", None)):
        return None
    if not hasattr(providers, "Constants"):
        return None
    return providers


def _clear_constant_pools(providers: Any) -> None:
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    inner = getattr(cache, "cache", None)
    if inner is not None and hasattr(inner, "clear"):
        inner.clear()


@contextmanager
def deterministic_hypothesis() -> Iterator[None]:
    """Run Hypothesis without local constants (see the module docstring). Re-entrant."""
    global _DEPTH, _ORIGINAL
    providers = _providers()
    if providers is None:
        yield
        return
    with _LOCK:
        if _DEPTH == 0:
            _ORIGINAL = providers._get_local_constants
            empty = providers.Constants()
            providers._get_local_constants = lambda: empty
            _clear_constant_pools(providers)
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                providers._get_local_constants = _ORIGINAL
                _ORIGINAL = None
                _clear_constant_pools(providers)


def local_constants_active() -> bool:
    """Whether Hypothesis would draw local constants now (False inside a run)."""
    providers = _providers()
    return providers is not None and _DEPTH == 0
