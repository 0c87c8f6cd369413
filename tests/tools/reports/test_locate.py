"""kvcontract.tools.reports.locate: a finding points at the function the variant
replaced, else at the first function the theorem exercises, else at its clause."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvcontract
from kvcontract.impl.variants import REFERENCE
from kvcontract.tools.reports.locate import (
    clause_location,
    display_path,
    function_location,
    locate,
    result_location,
)

ROOT = Path(kvcontract.__file__).resolve().parents[1]


def _source_line(location: dict[str, object]) -> str:
    path = Path(str(location["path"]))
    if not path.is_absolute():
        path = path if path.exists() else ROOT / path
    return path.read_text(encoding="utf-8").splitlines()[int(str(location["line"])) - 1]


@pytest.mark.parametrize(
    ("target", "theorem", "path", "function"),
    [
        ("stale-pending", "C3/scan-defers-only-in-scope", "impl/variants.py",
         "_stale_pending_lookup"),
        ("unaligned-hit", "C2/first-run-covers-load", "impl/variants.py",
         "_unaligned_load_window"),
        # The most specific function the theorem uses that the variant replaced.
        ("mtp-extra-retained", "C2/first-run-covers-load", "impl/variants.py",
         "_mtp_load_window"),
        ("mtp-extra-retained", "C7/segment-boundaries-supplied[plain-none]",
         "impl/variants.py", "_mtp_block_reachable"),
        ("prefill-horizon", "C9/store-horizon", "impl/variants.py",
         "_prefill_horizon_final_end"),
        # A fuzz finding names no function: the first the variant replaced.
        ("mtp-extra-retained", "C3/fuzz-lookup", "impl/variants.py", "_mtp_window"),
        # An unknown theorem falls back to the lookup's functions.
        ("upstream-current", "C9/no-such-theorem", "impl/variants.py", "_upstream_window"),
        # The reference: the first function the theorem exercises.
        ("reference", "C2/first-run-covers-load", "impl/reference.py",
         "load_window_size_in_chunks"),
        ("reference", "C1/retained-blocks-exact", "impl/reference.py", "retained_block_range"),
    ],
)
def test_locate(target: str, theorem: str, path: str, function: str) -> None:
    location = locate(target, theorem)
    assert location is not None
    assert location["path"] == path
    assert _source_line(location).startswith(f"def {function}(")


def test_nothing_to_locate() -> None:
    assert locate("no-such-implementation", "C2/first-run-covers-load") is None
    assert locate("reference", "C3/fuzz-lookup") is None  # no function was replaced


def test_function_location() -> None:
    location = function_location(REFERENCE.prefix_lookup)
    assert location is not None and location["path"] == "impl/reference.py"
    assert _source_line(location).startswith("def prefix_lookup(")
    assert function_location(len) is None  # a builtin has no source


def test_display_path(tmp_path: Path) -> None:
    assert display_path(ROOT / "impl" / "reference.py") == "impl/reference.py"
    outside = tmp_path / "x.py"
    assert display_path(outside) == outside.resolve().as_posix()


@pytest.mark.parametrize("clause", ["C1", "C2"])
def test_clause_location(clause: str) -> None:
    location = clause_location(clause)
    assert location["path"] == "spec/clauses.py"
    assert _source_line(location).strip().startswith(f'Clause("{clause}"')


@pytest.mark.parametrize("clause", ["C3", "C11"])
def test_clause_location_of_a_multiline_entry(clause: str) -> None:
    location = clause_location(clause)
    lines = (ROOT / "spec" / "clauses.py").read_text().splitlines()
    entry = lines[int(location["line"]) - 1: int(location["line"]) + 1]
    assert any(f'"{clause}"' in line for line in entry)


def test_result_location() -> None:
    own = {"clause": "C2", "location": {"path": "vllm/x.py", "line": 7}}
    assert result_location(own) == {"path": "vllm/x.py", "line": 7}
    assert result_location({"clause": "C1"}) == clause_location("C1")
