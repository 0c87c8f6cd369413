"""Session fixtures of the report, reproducer and picture tests (see _variant_reports)."""

from __future__ import annotations

from typing import Any

import pytest
from _variant_reports import VARIANT_THEOREMS, build_report


@pytest.fixture(scope="session")
def variant_reports() -> dict[str, dict[str, Any]]:
    return {name: build_report(name, ids) for name, ids in VARIANT_THEOREMS.items()}
