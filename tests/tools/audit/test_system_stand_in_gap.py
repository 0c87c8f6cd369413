"""tools/audit/system: a seed scenario that stops on a stand-in gap is UNKNOWN (the
tool's gap, as on every theorem), while any other exception of the bound code stays a
crash finding."""

from __future__ import annotations

from typing import Any

from kvcontract.impl.variants import REFERENCE
from kvcontract.tools.audit.system import _scenario_rows
from kvcontract.tools.audit.upstream_calls import StandInGap
from kvcontract.tools.fuzz import seed_scenarios


def _raising(exc: Exception) -> Any:
    def run(impl: Any, scenario: Any, device: str) -> Any:
        try:
            raise AttributeError("'GroupConfig' object has no attribute 'offloaded'")
        except AttributeError as inner:
            raise exc from inner

    return run


def test_a_stand_in_gap_is_unknown_and_a_crash_is_a_finding() -> None:
    scenario = seed_scenarios()[0]
    gap = StandInGap("_build_store_jobs (x.py:1): the stand-in GroupConfig has no "
                     "attribute 'offloaded'")
    [row] = _scenario_rows(REFERENCE, scenario, _raising(RuntimeError("wrapped")))
    assert row["verdict"] == "COUNTEREXAMPLE" and row["impact"] == "crash"
    [row] = _scenario_rows(REFERENCE, scenario, _raising(gap))
    assert row["verdict"] == "UNKNOWN" and "offloaded" in row["message"]

    def wrapping(impl: Any, scenario: Any, device: str) -> Any:
        try:
            raise gap
        except StandInGap as inner:
            raise RuntimeError("the store path failed") from inner

    [row] = _scenario_rows(REFERENCE, scenario, wrapping)
    assert row["verdict"] == "UNKNOWN"
