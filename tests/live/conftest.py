"""The live tests: vLLM's own scheduler in the loop (kvcontract.live).

They skip, saying why, when the live backend cannot run here (vLLM 0.33.0 or a package
of its scheduler side's closure is missing: ``.ci/install-live`` installs them), as the
CUDA tests skip without a device. The quick slice runs in the default suite; the full
matrix is ``pytest -m slow tests/live``.
"""

from __future__ import annotations

import pytest

from kvcontract.live.env import check


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "live: needs vLLM 0.33.0 installed (skipped without)")


_FOUND = check(import_modules=False)
LIVE_REASON = ("the live backend cannot run: " + "; ".join(_FOUND.lines()[2:])
               if not _FOUND.ok else "")

needs_vllm = pytest.mark.skipif(not _FOUND.ok, reason=LIVE_REASON or "vLLM is installed")
"""Skip a test when vLLM's scheduler side is not installed."""


def _release() -> str:
    return _FOUND.vllm_version or ""


EAGLE_PLANNED = _release() not in ("0.30.0", "0.31.0", "0.32.0")
"""Whether the installed release plans an EAGLE group for a drafter layer with the
target's spec: 0.33 marks drafter layers (``KVCacheSpec.is_draft``); 0.30-0.32 find only
spec-marked and trailing MTP drafters, so an EAGLE(-3) geometry is refused live there
("vLLM plans another geometry")."""

needs_eagle_planning = pytest.mark.skipif(
    not EAGLE_PLANNED, reason=f"vLLM {_release()} plans no EAGLE group for an EAGLE-3 "
    "drafter layer (its geometries are refused live)")
