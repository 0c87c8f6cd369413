"""kvcontract.tools.reports.model: normalize (validation, statuses, locations, the fuzz
report folded into per-clause results) and exit codes.

(Malformed versions, results and files are in tests/tools/test_reports.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from kvcontract.tools.reports.model import (
    ERROR,
    FAIL,
    PASS,
    ReportError,
    exit_code,
    normalize,
)

VERDICT_STATUS = {"PROVED": PASS, "PROVED-FOR-DOMAIN": PASS, "TESTED": PASS, "PASSED": PASS,
                  "COUNTEREXAMPLE": FAIL, "UNKNOWN": ERROR, "VACUOUS": ERROR}


def _report(*results: dict[str, Any], target: str = "reference", **extra: Any) -> dict[str, Any]:
    return {"version": 1, "command": "prove", "target": target, "results": list(results),
            **extra}


def _result(verdict: str, **extra: Any) -> dict[str, Any]:
    return {"clause": "C2", "theorem": "first-run-covers-load", "verdict": verdict, **extra}


@pytest.mark.parametrize(("verdict", "status"), list(VERDICT_STATUS.items()))
def test_status_of_each_verdict(verdict: str, status: str) -> None:
    normalized = normalize(_report(_result(verdict)))
    row = normalized["results"][0]
    assert row["status"] == status
    assert exit_code(normalized) == {PASS: 0, FAIL: 1, ERROR: 3}[status]


def test_normalized_row_shape() -> None:
    row = normalize(_report(_result("PROVED", seconds=2, domain=7, message=None)))["results"][0]
    assert row == {"clause": "C2", "theorem": "first-run-covers-load",
                   "id": "C2/first-run-covers-load", "verdict": "PROVED", "status": PASS,
                   "domain": "7", "seconds": 2.0, "witness": None, "message": "None",
                   "description": "", "impact": None}


def test_a_finding_carries_its_impact() -> None:
    """Its own impact, else its clause's; an unknown impact is a report error."""
    own = normalize(_report(_result("COUNTEREXAMPLE", impact="waste")))["results"][0]
    assert own["impact"] == "waste"
    default = normalize(_report(_result("COUNTEREXAMPLE")))["results"][0]
    assert default["impact"] == "crash"  # C2's findings crash the load
    with pytest.raises(ReportError, match="impact must be one of"):
        normalize(_report(_result("COUNTEREXAMPLE", impact="meh")))


def test_input_is_not_changed() -> None:
    report = _report(_result("COUNTEREXAMPLE", witness={"values": {"N": 5}}),
                     target="unaligned-hit")
    before = repr(report)
    normalized = normalize(report)
    assert repr(report) == before
    normalized["results"][0]["witness"]["values"] = {}
    assert report["results"][0]["witness"] == {"values": {"N": 5}}


def test_failures_are_located_passes_are_not() -> None:
    failing = normalize(_report(_result("COUNTEREXAMPLE"), target="unaligned-hit"))
    assert failing["results"][0]["location"]["path"] == "impl/variants.py"
    passing = normalize(_report(_result("PROVED"), target="unaligned-hit"))
    assert "location" not in passing["results"][0]
    unknown_target = normalize(_report(_result("COUNTEREXAMPLE"), target="vllm:/src"))
    assert "location" not in unknown_target["results"][0]


def test_worst_status_wins() -> None:
    assert exit_code(normalize(_report(_result("UNKNOWN"), _result("COUNTEREXAMPLE")))) == 1
    assert exit_code(normalize(_report(_result("VACUOUS"), _result("PROVED")))) == 3
    assert exit_code(normalize(_report())) == 0


def test_own_status_for_other_verdicts() -> None:
    row = normalize(_report(_result("FIXED", status=PASS)))["results"][0]
    assert row["status"] == PASS
    with pytest.raises(ReportError, match=r"results\[0\] has the unknown verdict 'FIXED'"):
        normalize(_report(_result("FIXED")))
    with pytest.raises(ReportError, match="unknown verdict"):
        normalize(_report(_result("PROVED", status="maybe")))


@pytest.mark.parametrize(
    ("report", "problem"),
    [
        ([], "a report is a JSON object, not list"),
        ({"version": 1, "target": "x", "results": []}, "no 'command'"),
        ({"version": 1, "command": "prove", "target": 3, "results": []}, "no 'target'"),
        ({"version": 1, "command": "prove", "target": "x", "results": {}},
         "'results' must be a list"),
        (_report("row"), r"results\[0\] is not an object"),
        (_report(_result("PROVED", seconds=True)), r"results\[0\]\.seconds is not a number"),
        (_report(_result("PROVED", witness=[1])), r"results\[0\]\.witness is not an object"),
        (_report(_result("PROVED", location={"path": "x.py", "line": True})), "location"),
        (_report(exit_code=True), "'exit_code' must be 0, 1, 2 or 3, not True"),
        ({"version": 1, "command": "fuzz", "target": "x", "differences": {}},
         r"a fuzz report needs 'differences' \(list\)"),
        ({"version": 1, "command": "fuzz", "target": "x", "differences": [{"kind": "x"}]},
         r"differences\[0\] has no 'clause'"),
    ],
)
def test_malformed(report: Any, problem: str) -> None:
    with pytest.raises(ReportError, match=problem):
        normalize(report)


def test_stated_exit_code_wins() -> None:
    assert exit_code(normalize(_report(_result("PROVED"), exit_code=2))) == 2
    assert exit_code(normalize(_report(_result("COUNTEREXAMPLE"), exit_code=0))) == 0


def test_fuzz_differences_become_results() -> None:
    report = {"version": 1, "command": "fuzz", "target": "stale-pending", "cases": 4,
              "per_clause": {"C11": 3, "C3": 5, "C2": 2},
              "differences": [
                  {"clause": "C3", "kind": "lookup", "message": "deferred", "program": ["a"],
                   "witness": {"kind": "ignored", "program": ["ignored"], "request": "r0"}},
                  {"clause": "C3", "kind": "lookup", "program": ["b"]},
                  {"clause": "C3", "kind": "lookup"},
              ]}
    rows = normalize(report)["results"]
    assert [(r["clause"], r["theorem"], r["verdict"]) for r in rows] == [
        ("C2", "fuzz", "PASSED"),
        ("C3", "fuzz-lookup", "COUNTEREXAMPLE"),
        ("C3", "fuzz-lookup-2", "COUNTEREXAMPLE"),
        ("C3", "fuzz-lookup-3", "COUNTEREXAMPLE"),
        ("C11", "fuzz", "PASSED"),
    ]
    assert rows[1]["witness"] == {"kind": "fuzz", "program": ["a"], "request": "r0"}
    assert rows[1]["domain"] == "differential fuzzing, 4 cases"
    assert rows[0]["domain"] == "2 checks over 4 cases, no difference"
    assert exit_code(normalize(report)) == 1
