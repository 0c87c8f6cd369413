"""The prover's verdicts: the reference proves, every historic variant is caught."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvcontract.errors import UnknownClauseError, UsageError
from kvcontract.impl import get_implementation
from kvcontract.proofs.runner import prove, select
from kvcontract.proofs.theorem import run_property
from kvcontract.proofs.verdicts import Verdict
from kvcontract.spec.properties import get_property
from kvcontract.spec.symbolic import LiftError, PathExplorer

# (variant, clause to check, theorem expected to fail)
CAUGHT = [
    ("unaligned-hit", "C2", "first-run-covers-load"),
    ("mtp-extra-retained", "C2", "first-run-covers-load"),
    ("upstream-current", "C4", "load-window-exact"),
]


@pytest.mark.parametrize(("variant", "clause", "theorem"), CAUGHT)
def test_arith_variants_yield_replayed_counterexamples(
    variant: str, clause: str, theorem: str
) -> None:
    report = prove(variant, [clause], jobs=1)
    by_name = {r.theorem: r for r in report.results}
    result = by_name[theorem]
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.witness is not None and result.witness["values"]
    assert report.exit_code == 1


def test_stale_pending_caught_on_c3() -> None:
    theorem = get_property("C3/scan-defers-only-in-scope")
    result = run_property(theorem, get_implementation("stale-pending"))
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.witness is not None
    assert result.witness["states"] == ["MISS", "HIT_PENDING"]
    assert run_property(theorem, get_implementation("reference")).verdict is \
        Verdict.PROVED_FOR_DOMAIN


def test_prefill_horizon_caught_on_c9() -> None:
    theorem = get_property("C9/store-horizon")
    assert run_property(theorem, get_implementation("prefill-horizon")).verdict is \
        Verdict.COUNTEREXAMPLE
    assert run_property(theorem, get_implementation("reference")).verdict is \
        Verdict.PROVED_FOR_DOMAIN


def test_reference_c1_c2_prove() -> None:
    report = prove("reference", ["C1", "C2"], jobs=2)
    assert report.results
    assert all(r.verdict.passed for r in report.results), [
        (r.theorem, r.verdict, r.message) for r in report.results
    ]
    assert report.exit_code == 0


def test_selection_errors() -> None:
    with pytest.raises(UnknownClauseError):
        select(["C99"])
    with pytest.raises(UsageError, match="fuzz"):
        select(["C11"])


def test_lifting_refuses_symbolic_loops() -> None:
    import z3

    def loops(n: object) -> int:
        return sum(1 for _ in range(n))  # type: ignore[call-overload]

    with pytest.raises(LiftError):
        PathExplorer().lift(loops, [z3.Int("n")])


def test_cli_exit_codes_and_json(tmp_path: object) -> None:
    out = f"{tmp_path}/report.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvcontract",
            "prove",
            "--impl",
            "unaligned-hit",
            "--clause",
            "C2",
            "--json",
            out,
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    with open(out) as handle:
        data = json.load(handle)
    assert data["version"] == 1 and data["command"] == "prove" and data["target"] == "unaligned-hit"
    assert any(r["verdict"] == "COUNTEREXAMPLE" and r["witness"] for r in data["results"])
    bad = subprocess.run(
        [sys.executable, "-m", "kvcontract", "prove", "--clause", "C42"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown clause" in bad.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "kvcontract", "prove", "--impl", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown implementation" in bad.stderr
