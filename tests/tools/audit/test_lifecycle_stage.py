"""tools/audit/lifecycle_stage: the live lifecycle rows become the report's findings.

A section as the live child returns it (no vLLM needed here): its counterexamples are
theorem rows (``Cn/live-SCENARIO``) grouped into defects located where vLLM raised or,
for a stall, at the connector's lookup entry point; a path the release's own worker does
not reach is ``latent``; a clause checked live leaves ``unchecked``; the exit code counts
them through the gate.
"""

from __future__ import annotations

from typing import Any

from kvcontract.spec.properties.lifecycle import LIFECYCLE_SPACE
from kvcontract.tools.audit.lifecycle_stage import merge_into_report, result_rows
from kvcontract.tools.reports.gate import gate_exit_code
from kvcontract.vocabulary import DEFAULT_FAIL_ON, EXIT_FINDING

WORKER = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py"
SITE = {"qualname": "OffloadingConnectorScheduler.get_num_new_matched_tokens",
        "path": "/x/vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py",
        "line": 1210, "what": "deferral of a lookup without a deadline"}


def _row(scenario: str, clause: str, verdict: str, impact: str | None = None,
         **numbers: Any) -> dict[str, Any]:
    return {"scenario": scenario, "clause": clause, "verdict": verdict, "impact": impact,
            "outcome": "clean", "findings": [f"{scenario} finding"] if impact else [],
            "numbers": numbers, "why": None, "live": "confirmed live on vLLM 0.33.0"}


def _section() -> dict[str, Any]:
    return {"vllm": "0.33.0", "deferral_site": SITE, "rows": [
        _row("stalled-store", "C13", "COUNTEREXAMPLE", "stall"),
        _row("failed-load", "C14", "COUNTEREXAMPLE", "crash",
             raised_in=[f"{WORKER}:301 get_finished"]),
        _row("failed-load", "C15", "COUNTEREXAMPLE", "crash",
             raised_in=[f"{WORKER}:301 get_finished"]),
        _row("failed-load-fail-policy", "C15", "COUNTEREXAMPLE", "crash",
             reachable="the scheduler's failure API: reached only by a worker that reports "
                       "failed transfers"),
        _row("abort-queued", "C14", "TESTED"),
        _row("failed-load-fail-policy", "C14", "TESTED", note="failed as the policy says"),
        {**_row("x", "C13", "UNKNOWN"), "scenario": None},
    ]}


def test_rows_carry_verdicts_locations_and_latency() -> None:
    rows = {f"{r['clause']}/{r['theorem']}": r for r in result_rows(_section())}
    assert set(rows) == {"C13/live-stalled-store", "C14/live-failed-load",
                         "C15/live-failed-load", "C15/live-failed-load-fail-policy",
                         "C14/live-abort-queued",
                         "C14/live-failed-load-fail-policy"}  # UNKNOWN rows stay behind
    stall = rows["C13/live-stalled-store"]
    assert stall["impact"] == "stall" and stall["root_cause"]["functions"] == [SITE]
    crash = rows["C14/live-failed-load"]["root_cause"]["functions"][0]
    assert (crash["path"], crash["line"], crash["qualname"]) == (WORKER, 301, "get_finished")
    unreached = rows["C15/live-failed-load-fail-policy"]
    assert unreached["impact"] == "latent" and "reached only by" in unreached["message"]
    assert rows["C14/live-abort-queued"]["verdict"] == "TESTED"
    # a scenario that holds says what it saw where it has a note
    assert rows["C14/live-failed-load-fail-policy"]["message"] == \
        "scenario failed-load-fail-policy: failed as the policy says"
    assert rows["C14/live-abort-queued"]["message"] == "scenario abort-queued: clean"


def test_merged_findings_are_defects_and_fail_the_run() -> None:
    report: dict[str, Any] = {
        "target": "vllm:installed", "results": [], "defects": [],
        "unchecked": [{"clause": c, "theorem": "deferral-bounded",
                       "reason": LIFECYCLE_SPACE.not_on_bound_code} for c in ("C13", "C14", "C15")]}
    merge_into_report(report, _section(), "audit.json")
    assert report["unchecked"] == []  # every clause was checked live
    status = {s["clause"]: s["status"] for s in report["summary"]}
    assert status == {"C13": "violated", "C14": "violated", "C15": "violated"}
    defects = report["defects"]
    # The worker's assertion is one defect across C14 and C15; the stall its own; the
    # unreached path latent (last).
    assert [d["impact"] for d in defects] == ["crash", "stall", "latent"]
    assert defects[0]["clauses"] == ["C14", "C15"]
    assert all(d["live"]["status"] == "confirmed" for d in defects)
    assert "--json audit.json" in defects[0]["reproduce"]
    assert gate_exit_code(report["results"], DEFAULT_FAIL_ON, False) == EXIT_FINDING
