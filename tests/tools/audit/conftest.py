"""Fixtures of the audit tests: released vLLM trees (fetched at test time) and small
patched files written in ``tmp_path``.

Released trees come from :func:`kvcontract.tools.audit.wheels.fetch_release`: an unpacked
tree in ``$KVCONTRACT_VLLM_CACHE`` (or ``~/.cache/kvcontract/vllm``) is reused, otherwise
``pip download --no-deps vllm==X`` fetches the wheel once and only the audited ``.py``
files are unpacked. Without a reachable registry those tests are skipped, with the
reason. The default suite uses 0.29.0 and 0.33.0; the other releases are ``slow``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

# Re-exported for tests that still import them from here.
from audit_releases import (  # noqa: F401
    DEFAULT_RELEASES,
    E_IGNORING_WINDOW,
    EXACT_WINDOW,
    FIXED_SCAN,
    GARBAGE_SCAN,
    HANGING_SCAN,
    RAISING_SCAN,
    SLOW_RELEASES,
    STALE_PENDING_SCAN,
    STUBBORN_SCAN,
    release_params,
    release_tree,
)


@pytest.fixture
def write_module(tmp_path: Path) -> Callable[..., Path]:
    """Write a patched file from source snippets; returns its path."""

    def write(name: str, *snippets: str) -> Path:
        path = tmp_path / name
        path.write_text("\n\n".join(textwrap.dedent(s).strip() + "\n" for s in snippets))
        return path

    return write
