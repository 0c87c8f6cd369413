"""The differential fuzzer: variants are caught, the reference is clean, bad input errors."""

from __future__ import annotations

import pytest
import torch
from kvcontract.tools.fuzz import Scenario, run_fuzz, seed_scenarios

from kvcontract.errors import GeometryError, UnknownTargetError, UsageError

VARIANTS = ["stale-pending", "unaligned-hit", "mtp-extra-retained", "prefill-horizon"]


def test_reference_is_clean() -> None:
    report = run_fuzz("reference", examples=15)
    assert report.differences == []
    assert report.exit_code == 0
    data = report.to_json()
    assert data["version"] == 1 and data["command"] == "fuzz" and data["target"] == "reference"
    assert data["per_clause"]["C11"] > 0 and data["cases"] > 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_is_caught(variant: str) -> None:
    report = run_fuzz(variant, examples=0)
    assert report.differences, variant
    assert report.exit_code == 1
    assert all(d.program for d in report.differences)


@pytest.mark.parametrize("variant", ["unaligned-hit", "mtp-extra-retained"])
def test_real_manager_crashes_for_load_safety_variants(variant: str) -> None:
    report = run_fuzz(variant, examples=0)
    assert any(
        (d.kind == "crash" and "not found in cache" in d.message) or d.clause == "C11"
        for d in report.differences
    )


def test_state_machine_finds_prefill_horizon() -> None:
    report = run_fuzz("prefill-horizon", examples=20, scenarios=[])
    assert report.differences
    assert report.differences[0].program


def test_unknown_implementation() -> None:
    with pytest.raises(UnknownTargetError):
        run_fuzz("no-such-impl", examples=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
def test_cuda_without_cuda() -> None:
    with pytest.raises(UsageError, match="CUDA"):
        run_fuzz("reference", device="cuda", examples=0)


def test_invalid_scenario() -> None:
    bad = Scenario("bad", seed_scenarios()[0].geometry, [], delay_steps=-1)
    with pytest.raises(GeometryError):
        run_fuzz("reference", examples=0, scenarios=[bad])
