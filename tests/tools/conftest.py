"""Session fixtures of the report, reproducer and picture tests (see _variant_reports)."""

from __future__ import annotations

from typing import Any

import pytest
from _variant_reports import VARIANT_THEOREMS, build_report


@pytest.fixture(autouse=True)
def _private_proof_cache(tmp_path_factory: pytest.TempPathFactory,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvcontract prove` caches proofs by default: each test gets an empty cache of its
    own, so no result proved by an earlier test (or by the user, in ~/.cache) hides
    the code a test patches (a killed worker, a fake engine)."""
    monkeypatch.setenv("KVCONTRACT_CACHE_DIR", str(tmp_path_factory.mktemp("proof-cache")))


@pytest.fixture(scope="session")
def variant_reports() -> dict[str, dict[str, Any]]:
    return {name: build_report(name, ids) for name, ids in VARIANT_THEOREMS.items()}
