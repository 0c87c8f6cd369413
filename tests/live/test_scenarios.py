"""The named live scenarios: each one's outcome on the installed vLLM and its numbers (the
same on 0.33.0 and 0.34.0 for every scenario tested here)."""

from __future__ import annotations

import pytest

from kvcontract.live.scenarios import (
    FAILURES,
    FINDINGS,
    LIFECYCLE,
    PARTIAL_TAILS,
    SCENARIOS,
    run_scenario,
)
from tests.live.conftest import EAGLE_PLANNED, needs_vllm

pytestmark = [needs_vllm, pytest.mark.live]


@pytest.mark.parametrize("name", LIFECYCLE)
def test_lifecycle_scenario_checks_hold(name: str) -> None:
    result = run_scenario(name)
    assert result.outcome == "clean", result.outcome
    failed = [check for check in result.checks if not check.ok]
    assert failed == []


@pytest.mark.parametrize("name", FINDINGS)
def test_findings_are_confirmed_live(name: str) -> None:
    if name == "eagle-replay" and not EAGLE_PLANNED:
        pytest.skip("this release plans no EAGLE group for the EAGLE-3 drafter")
    result = run_scenario(name)
    assert result.numbers["confirmed"] is True
    assert result.numbers["observed_hit"] < result.numbers["gpu_promise"]


def test_stalled_store_defers_the_consumer_for_the_whole_trace() -> None:
    result = run_scenario("stalled-store")
    assert result.numbers["deferred_steps"] == result.numbers["wait_steps"] == 40
    assert result.numbers["first_compute_step"] is None
    assert result.numbers["stalled_jobs"] > 0


def test_preemption_readmits_and_finishes() -> None:
    result = run_scenario("preemption")
    assert result.numbers["preempted"] >= 1
    assert set(result.numbers["statuses"].values()) == {"FINISHED_LENGTH_CAPPED"}


def test_lru_keeps_the_newest() -> None:
    result = run_scenario("cpu-capacity-lru")
    assert result.numbers["cpu_chunks"] == 30
    assert result.numbers["hit_newest"] >= result.numbers["promised"]
    assert result.numbers["hit_oldest"] < result.numbers["promised"]


def test_every_scenario_is_named() -> None:
    assert set(FINDINGS) | set(LIFECYCLE) | set(FAILURES) | set(PARTIAL_TAILS) == set(SCENARIOS)
