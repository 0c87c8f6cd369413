"""``audit --live``: the request lifecycle (C13-C15) on vLLM's own scheduler.

The stand-ins cannot reach the connector's lifecycle (``update_state_after_alloc``,
``request_finished``, preemption and reset flushes, the worker's job reports), so C13-C15
on upstream code are judged on the live engine only: every scenario of
:data:`kvcontract.live.scenarios.LIFECYCLE_JUDGED` (aborts at every point, preemption
with stores in flight, cache reset with jobs in flight, a stalled store, failed stores
and loads, LRU pressure, the asynchronous scheduler) runs on the installed vLLM, the
target's Python laid over it as the live stage lays it
(:func:`kvcontract.tools.audit.live_stage.live_target`), in one sandbox child, and is
judged by the clauses' own judges (:mod:`kvcontract.spec.properties.lifecycle`).

The report gets ``lifecycle``: the vLLM release, and a row per scenario and clause
(verdict ``TESTED`` / ``COUNTEREXAMPLE`` / ``UNKNOWN``, impact, the scenario's outcome,
its findings and observed numbers, ``confirmed live``). Where the scenarios cannot run
(no live backend, another release than the target's, a built-in target) every clause
gets an ``UNKNOWN`` row naming why; an audit without ``--live`` notes that C13-C15 on
vLLM were not checked. Nothing here changes a verdict or the exit code (as the live
stage): the rows say which upstream lifecycle failures the release has.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

LIFECYCLE_CPU_SECONDS = 900.0
"""CPU seconds the child that runs the lifecycle scenarios may use (a safety net: they
take a few seconds once vLLM is imported)."""

CLAUSES = ("C13", "C14", "C15")

NOT_LIVE_NOTE = ("C13-C15 (request lifecycle) on vLLM's own scheduler not checked: they "
                 "run only on the live engine (audit --live, with the live backend "
                 "installed)")

KEPT_NUMBERS = ("deferred_lookups", "first_deferred_step", "last_deferred_step",
                "trace_steps", "bound_enforced", "deferral_clock_set", "waited_on",
                "jobs", "end", "load_failures", "raised_in", "preempted",
                "flushed_at_preemption", "observed_hit", "gpu_promise", "verdict",
                "reachable")
"""The observed numbers a lifecycle row keeps (the scenario's JSON has them all)."""


def _unknown_rows(why: str) -> list[dict[str, Any]]:
    return [{"scenario": None, "clause": clause, "verdict": "UNKNOWN", "impact": None,
             "outcome": None, "findings": [], "numbers": {}, "why": why}
            for clause in CLAUSES]


def _run_scenarios(overlay: Any) -> dict[str, Any]:
    """Run in the child: the overlay laid over vLLM, then every lifecycle scenario."""
    from kvcontract.live import env
    from kvcontract.live.overlay import install
    from kvcontract.live.scenarios import LIFECYCLE_JUDGED, run_scenario

    env.require()
    installed = install(overlay) if not overlay.empty else list(overlay.notes)
    rows: list[dict[str, Any]] = []
    for name in LIFECYCLE_JUDGED:
        result = run_scenario(name)
        numbers = {k: v for k, v in result.numbers.items() if k in KEPT_NUMBERS}
        for verdict in result.clauses:
            rows.append({"scenario": name, "clause": verdict.clause,
                         "verdict": verdict.verdict.value,
                         "impact": None if verdict.impact is None else verdict.impact.value,
                         "outcome": result.outcome, "findings": list(verdict.findings),
                         "numbers": numbers, "why": verdict.reason or None})
    return {"rows": rows, "overlay": installed}


def lifecycle_section(console: Console, report: dict[str, Any], *, live: bool,
                      quiet: bool) -> None:
    """Add the lifecycle rows to ``report`` (``live``: run the scenarios; else a note
    that they were not checked) and, unless ``quiet``, print them."""
    if not live:
        report.setdefault("notes", []).append(NOT_LIVE_NOTE)
        return
    section = run_lifecycle_rows(report)
    report["lifecycle"] = section
    if not quiet:
        print_lifecycle(console, section)


def run_lifecycle_rows(report: dict[str, Any]) -> dict[str, Any]:
    """The ``lifecycle`` section of ``report``: the scenarios run live, or UNKNOWN rows
    naming why they cannot."""
    from kvcontract.live import env
    from kvcontract.tools.audit.live_stage import live_target

    check = env.check(import_modules=False)
    installed = check.vllm_version
    section: dict[str, Any] = {"vllm": installed}
    if not check.ok:
        why = "vLLM cannot run here: " + "; ".join(check.lines()[2:])
        section.update(why=why, rows=_unknown_rows(why))
        return section
    where = live_target(str(report.get("target", "")), installed)
    if where.why is not None:
        section.update(why=where.why, rows=_unknown_rows(where.why))
        return section
    from kvcontract.tools.audit.sandbox import run_jobs

    outcome = run_jobs([("lifecycle", lambda: _run_scenarios(where.overlay))], workers=1,
                       job_timeout=LIFECYCLE_CPU_SECONDS, call_timeout=None)["lifecycle"]
    if not outcome.ok or outcome.value is None:
        why = "the live run failed: " + (outcome.error or "no result").splitlines()[0]
        section.update(why=why, rows=_unknown_rows(why))
        return section
    if not where.overlay.empty:
        section["laid_over"] = outcome.value["overlay"]
    rows = outcome.value["rows"]
    for row in rows:
        row["live"] = f"confirmed live on vLLM {installed}"
    section["rows"] = rows
    return section


def print_lifecycle(console: Console, section: dict[str, Any]) -> None:
    """One line per scenario with a finding (clause, verdict, impact, the first
    finding), a line for the clean ones, or the reason none ran."""
    rows = section.get("rows") or []
    head = f"lifecycle (C13-C15) on vLLM {section.get('vllm')}"
    if section.get("why"):
        console.print(escape(f"{head}: UNKNOWN: {section['why']}"), highlight=False)
        return
    clean: list[str] = []
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_scenario.setdefault(str(row["scenario"]), []).append(row)
    console.print(escape(f"{head}, live: {len(by_scenario)} scenarios"), highlight=False)
    for name, found in by_scenario.items():
        bad = [r for r in found if r["verdict"] != "TESTED"]
        if not bad:
            clean.append(name)
            continue
        for row in bad:
            first = row["findings"][0] if row["findings"] else row.get("why") or ""
            impact = f" ({row['impact']})" if row["impact"] else ""
            console.print(escape(f"  {name}: {row['clause']} {row['verdict']}{impact}: "
                                 f"{first}"), highlight=False)
    if clean:
        console.print(escape(f"  no C13-C15 finding: {', '.join(clean)}"), highlight=False)


__all__ = ["NOT_LIVE_NOTE", "lifecycle_section", "print_lifecycle", "run_lifecycle_rows"]
