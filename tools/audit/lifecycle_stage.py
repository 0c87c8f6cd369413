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
vLLM were not checked. The rows are the audit's check of C13-C15 on upstream
(:func:`merge_into_report`): theorem rows ``Cn/live-SCENARIO`` whose counterexamples are
findings, grouped into defects, in the clause summary and the exit code; a path the
release's own worker does not reach is ``latent``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from rich.console import Console
from rich.markup import escape

from kvcontract.vocabulary import Impact

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
    from kvcontract.tools.audit.upstream_calls import limit_loaded_release

    limit_loaded_release()  # a hanging audited function is stopped, named
    site = _deferral_site()
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
    return {"rows": rows, "overlay": installed, "deferral_site": site}


def _deferral_site() -> dict[str, Any] | None:
    """Where vLLM decides a deferred lookup (the connector's
    ``get_num_new_matched_tokens``, laid over as installed): a C13 stall's location."""
    import inspect

    from kvcontract.live.capabilities import vllm_names

    try:
        cls = vllm_names("vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler",
                         "OffloadingConnectorScheduler")
        fn = cls.get_num_new_matched_tokens
        return {"qualname": "OffloadingConnectorScheduler.get_num_new_matched_tokens",
                "path": inspect.getsourcefile(fn), "line": inspect.getsourcelines(fn)[1],
                "what": "deferral of a lookup without a deadline"}
    except (AttributeError, ImportError, OSError, TypeError):
        return None


def lifecycle_section(report: dict[str, Any], *, live: bool,
                      report_file: str | None = None,
                      clauses: Collection[str] = (), engine: Any = None,
                      call_timeout: float | None = None) -> None:
    """Add the lifecycle rows of the ``clauses`` asked for (all of C13-C15 by default)
    to ``report`` (``live``: run the scenarios, its findings merged into the results and
    defects; else a note that they were not checked). Run before the gate, so the exit
    code counts them; :func:`print_lifecycle` prints."""
    wanted = set(CLAUSES) & set(clauses) if clauses else set(CLAUSES)
    if not wanted:
        return  # --clause names none of C13-C15
    if not live:
        report.setdefault("notes", []).append(NOT_LIVE_NOTE)
        return
    section = run_lifecycle_rows(report, engine, call_timeout)
    section["rows"] = [r for r in section.get("rows") or [] if r["clause"] in wanted]
    report["lifecycle"] = section
    merge_into_report(report, section, report_file)


def run_lifecycle_rows(report: dict[str, Any], engine: Any = None,
                       call_timeout: float | None = None) -> dict[str, Any]:
    """The ``lifecycle`` section of ``report``: the scenarios run live, or UNKNOWN rows
    naming why they cannot. ``engine`` (the audit's
    :class:`~kvcontract.tools.audit.on_engine.EngineJudge`): the target's vLLM is
    already imported in this process, any patch laid over it, so the scenarios run on
    it as it is."""
    from kvcontract.live import env
    from kvcontract.live.overlay import Overlay
    from kvcontract.tools.audit.live_stage import LiveTarget, live_target

    if engine is not None:
        installed = str(engine.root.version or engine.release)
        section: dict[str, Any] = {"vllm": installed}
        where = LiveTarget(engine.overlay or Overlay(), release=installed)
    else:
        check = env.check(import_modules=False)
        installed = str(check.vllm_version)
        section = {"vllm": installed}
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
                       job_timeout=LIFECYCLE_CPU_SECONDS,
                       call_timeout=call_timeout)["lifecycle"]
    if not outcome.ok or outcome.value is None:
        why = "the live run failed: " + (outcome.error or "no result").splitlines()[0]
        section.update(why=why, rows=_unknown_rows(why))
        return section
    if not where.overlay.empty:
        section["laid_over"] = outcome.value["overlay"]
    rows = outcome.value["rows"]
    for row in rows:
        row["live"] = f"run on {engine.release}" if engine is not None else \
            f"confirmed live on vLLM {installed}"
    section["rows"] = rows
    section["deferral_site"] = outcome.value.get("deferral_site")
    return section


UNREACHED_MARK = "reached only"


def result_rows(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The lifecycle rows as the report's theorem rows (``Cn/live-SCENARIO``), so the
    clauses' summary, the defects and the exit code count them as every other check: a
    counterexample on vLLM itself is a finding. A counterexample on a path the release's
    own worker does not reach (the scheduler's failure API fed by kvcontract's worker:
    the release asserts first) is ``latent``, with the reason."""
    found: list[dict[str, Any]] = []
    site = section.get("deferral_site")
    release = section.get("vllm")
    for row in section.get("rows") or []:
        if row.get("scenario") is None or row["verdict"] not in ("TESTED", "COUNTEREXAMPLE"):
            continue
        numbers = row.get("numbers") or {}
        # A scenario that holds may say what it saw (live/scenarios: numbers["note"]).
        message = (row["findings"][0] if row["findings"] else
                   f"scenario {row['scenario']}: {numbers.get('note') or row['outcome']}")
        result: dict[str, Any] = {
            "clause": row["clause"], "theorem": f"live-{row['scenario']}",
            "verdict": row["verdict"], "evidence": "examples", "cases": 1, "seconds": 0.0,
            "domain": f"the live scenario {row['scenario']} on vLLM {release}",
            "impact": row.get("impact"), "message": message,
            "witness": {"kind": "live-lifecycle", "scenario": row["scenario"],
                        "outcome": row["outcome"], "findings": list(row["findings"])},
            "live": row.get("live"), "judge": "engine",
        }
        if row["verdict"] == "COUNTEREXAMPLE":
            # A scenario on a path the release's own worker does not reach says so in
            # its `reachable` number (live/scenarios: "... reached only by a worker ...").
            reachable = str(numbers.get("reachable") or "")
            if UNREACHED_MARK in reachable:
                result["impact"] = Impact.LATENT.value
                result["message"] = f"{message} [latent: {reachable}]"
            cause = _root_cause(row, numbers, site)
            if cause is not None:
                result["root_cause"] = cause
        found.append(result)
    return found


def _root_cause(row: dict[str, Any], numbers: dict[str, Any],
                site: dict[str, Any] | None) -> dict[str, Any] | None:
    """The vLLM function a live lifecycle finding happens in: where vLLM raised, or for a
    deferral never decided the connector's lookup entry point."""
    raised = numbers.get("raised_in") or []
    if raised:
        where, _, qualname = str(raised[0]).partition(" ")
        path, _, line = where.rpartition(":")
        # One root cause across clauses (C14's exception, C15's failed recovery).
        return {"how": "live", "functions": [{
            "qualname": qualname or where, "path": path, "line": int(line) if
            line.isdigit() else None, "what": "raises on a failed transfer"}]}
    if row["clause"] == "C13" and site is not None:
        return {"how": "loop", "functions": [dict(site)]}
    return None


def merge_into_report(report: dict[str, Any], section: dict[str, Any],
                      report_file: str | None) -> None:
    """The live lifecycle rows added to ``report``'s results, its clause summary
    recomputed (a clause checked live drops its stand-in lines from ``unchecked``) and
    their defects added; :func:`~kvcontract.tools.audit.command.apply_gate` then counts
    them in the exit code."""
    from kvcontract.tools.audit.defects import add_commands, group_defects, sort_defects
    from kvcontract.tools.audit.engine import clause_summary

    rows = result_rows(section)
    if not rows:
        return
    checked = {r["clause"] for r in rows}
    report["results"] = [*report["results"], *rows]
    report["unchecked"] = [u for u in report["unchecked"] if u["clause"] not in checked]
    report["summary"] = clause_summary(report["results"], report["unchecked"])
    defects = group_defects(rows)
    add_commands(defects, str(report["target"]), report_file)
    for defect in defects:
        defect["live"] = {"status": "confirmed", "reason": f"run on vLLM {section['vllm']}"}
    report["defects"] = sort_defects([*report.get("defects", []), *defects])


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
