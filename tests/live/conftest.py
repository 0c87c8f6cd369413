"""The live tests: vLLM's own scheduler in the loop (kvcontract.live).

They skip, saying why, when the live backend cannot run here (vLLM, a package of its
scheduler side's closure, or an API the driver needs is missing: ``.ci/install-live``
installs them), as the CUDA tests skip without a device. Whatever differs between the
releases the tests run on is keyed on the capability the driver detects
(:mod:`kvcontract.live.capabilities`), never on the version string. The quick slice runs
in the default suite; the full matrix is ``pytest -m slow tests/live``.
"""

from __future__ import annotations

import pytest

from kvcontract.live.env import LiveCheck, check


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "live: needs vLLM installed (skipped without)")


def _found() -> LiveCheck:
    """The full check (it imports vLLM and reads its capabilities) where the packages
    are installed; the cheap one otherwise."""
    cheap = check(import_modules=False)
    return check(import_modules=True) if cheap.ok else cheap


_FOUND = _found()
LIVE_REASON = ("the live backend cannot run: " + "; ".join(_FOUND.lines()[2:])
               if not _FOUND.ok else "")

needs_vllm = pytest.mark.skipif(not _FOUND.ok, reason=LIVE_REASON or "vLLM is installed")
"""Skip a test when vLLM's scheduler side is not installed."""


def has(name: str) -> bool:
    """Whether the installed vLLM offers the capability ``name`` (False without vLLM)."""
    return _FOUND.capabilities is not None and _FOUND.capabilities.has(name)


def capability(name: str) -> bool | None:
    """The capability's detected value (None: unknown or no vLLM)."""
    if _FOUND.capabilities is None:
        return None
    return _FOUND.capabilities.get(name).present


EAGLE_PLANNED = has("draft-specs")
"""Whether the installed release plans an EAGLE group for a drafter layer with the
target's spec: it marks drafter layers (``KVCacheSpec.is_draft``); releases without the
field find only spec-marked and trailing MTP drafters, so an EAGLE(-3) geometry is
refused live there ("vLLM plans another geometry")."""

needs_eagle_planning = pytest.mark.skipif(
    not EAGLE_PLANNED, reason="the installed vLLM has no KVCacheSpec.is_draft: it plans no "
    "EAGLE group for an EAGLE-3 drafter layer (its geometries are refused live)")
