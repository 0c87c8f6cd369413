"""The differential fuzzer: variants are caught, the reference is clean, bad input errors."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.tools.fuzz import Scenario, matrix_scenarios, run_fuzz, seed_scenarios

from kvcontract.errors import GeometryError, UnknownTargetError, UsageError

VARIANTS = [
    "stale-pending", "unaligned-hit", "mtp-extra-retained", "prefill-horizon",
    "upstream-current",
]
ROOT = Path(__file__).resolve().parents[2]


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
    with pytest.raises(GeometryError):
        run_fuzz("reference", examples=0,
                 scenarios=[Scenario("bad", Geometry((fa(4), swa(4, 8))), [], capacity_chunks=0)])
    unknown_op = Scenario("bad", Geometry((fa(4), swa(4, 8))), [("teleport", "r")])
    with pytest.raises(UsageError, match="teleport"):
        run_fuzz("reference", examples=0, scenarios=[unknown_op])
    bad_args = Scenario("bad", Geometry((fa(4), swa(4, 8))), [("step", 0)])
    with pytest.raises(UsageError, match="budget"):
        run_fuzz("reference", examples=0, scenarios=[bad_args])
    with pytest.raises(UsageError):
        run_fuzz("reference", examples=-1)


def test_quick_matrix_slice_is_clean_on_the_reference() -> None:
    scenarios = list(matrix_scenarios(quick=True))
    names = " ".join(s.name for s in scenarios)
    # The slice still spans the axes of the matrix.
    for needle in ("unaligned", "eagle=True", "bpc=4", "local=True", "left=loading",
                   "left=pending", "left=missing", "Mamba", "SWA4(sw12)+SWA8", "retention"):
        assert needle in names, needle
    report = run_fuzz("reference", examples=0, scenarios=scenarios)
    assert report.differences == [], report.differences[:1]
    assert report.cases == len(scenarios) and report.steps > 0
    for clause in ("C1", "C2", "C3", "C4", "C5", "C8", "C9", "C10", "C11"):
        assert report.per_clause.get(clause, 0) > 0, clause


def test_json_report(tmp_path: Path) -> None:
    report = run_fuzz("stale-pending", examples=0, scenarios=seed_scenarios()[:1])
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(report.to_json()))
    data = json.loads(path.read_text())
    assert data["cases"] == 1 and data["differences"][0]["clause"] == "C3"
    assert data["differences"][0]["program"]


def test_gpu_check_dry_run_exercises_the_copy_paths(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The GPU script's CPU paths (worker batching, bandwidth bookkeeping, the round-trip
    # integrity check, the summary) run in-process with tiny sizes.
    path = ROOT / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("kvcontract_gpu_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look modules up
    spec.loader.exec_module(module)
    assert module.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "llama-8b" in out and "gpt-oss" in out and "DRY RUN PASS" in out
    if not torch.cuda.is_available():
        assert module.main([]) == 0  # no CUDA: nothing to check, and it says so
        assert "no CUDA device" in capsys.readouterr().out


# -- long campaigns (pytest -m slow; `kvcontract fuzz --matrix` runs the same) ----------
@pytest.mark.slow
def test_full_matrix_is_clean_on_the_reference() -> None:
    report = run_fuzz("reference", examples=200, matrix=True)
    assert report.differences == [], report.differences[:3]
    assert report.cases > 4000


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_matrix_catches_every_variant(variant: str) -> None:
    report = run_fuzz(variant, examples=0, scenarios=list(matrix_scenarios()))
    assert report.differences, variant
