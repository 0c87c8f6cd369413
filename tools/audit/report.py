"""The audit report: the versioned dict, its exit code and the human rendering.

The dict has the shape every verifying command shares (``tools/reports.py`` renders it
as JSON, JUnit, SARIF, Markdown...): ``{"version": 1, "command": "audit", "target",
"results": [...]}``, each result with an upstream ``location`` when it failed. The audit
adds ``bindings`` (what was found where), ``unchecked`` (theorems that could not run
and why), ``summary`` (per clause) and, with a baseline, ``comparison``; a ``--shard
I/N`` run adds ``shard`` (:mod:`kvcontract.tools.reports.merge` joins the shards).
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvcontract.tools.audit.engine import AuditRun, clause_summary
from kvcontract.tools.audit.roles import Binding
from kvcontract.vocabulary import (
    DEFAULT_FAIL_ON,
    EXIT_UNKNOWN,
    Impact,
    Verdict,
    finding_exit_code,
    worst_exit_code,
)

WITNESS_SHOWN = 600
"""Characters of a witness printed under its finding (the JSON report keeps it whole)."""


def exit_code(report: dict[str, Any],
              fail_on: frozenset[Impact] = DEFAULT_FAIL_ON) -> int:
    """0 every checked theorem holds (or fails only with an impact outside ``fail_on``);
    1 a counterexample whose impact is in ``fail_on``; 3 unknown, a counterexample judged
    on stand-ins where vLLM's engine could not run (``unconfirmed``), or nothing checked
    (:func:`kvcontract.vocabulary.finding_exit_code`, an empty audit undecided)."""
    return finding_exit_code(
        ((Verdict.UNKNOWN, None) if r.get("unconfirmed") else (r["verdict"], r.get("impact"))
         for r in report["results"]), fail_on, empty=EXIT_UNKNOWN)


def engine_section(binding: Binding) -> dict[str, Any] | None:
    """The report's ``engine``: whether vLLM's own engine judged the target (its
    release and root), or why not (None for a built-in target)."""
    if binding.target.kind == "builtin":
        return None
    engine = binding.engine
    if engine is None:
        return {"ran": False, "why": binding.engine_why or "stand-ins chosen",
                "fallback": binding.engine_fallback}
    return {"ran": True, **engine.to_json()}


def build_report(binding: Binding, run: AuditRun,
                 comparison: dict[str, Any] | None = None,
                 fail_on: frozenset[Impact] = DEFAULT_FAIL_ON,
                 report_file: str | None = None) -> dict[str, Any]:
    target = binding.target
    report: dict[str, Any] = {
        "version": 1,
        "command": "audit",
        "target": target.spec,
        "target_kind": target.kind,
        "target_description": target.display(),
        "vllm_version": target.version,
        "seconds": round(run.seconds, 3),
        "results": run.rows,
        "summary": clause_summary(run.rows, run.unchecked),
        "unchecked": run.unchecked,
        "bindings": binding.to_json(),
        "notes": [
            "C11 (data integrity) is checked by executing the tensor-backed system "
            "(kvcontract fuzz), not by an audit",
            "the spec-only sequence theorems (spec-scan-*) do not read the implementation "
            "and are not re-run",
            *run.notes,
        ],
    }
    engine = engine_section(binding)
    if engine is not None:
        report["engine"] = engine
        if run.shard is None:
            # A shard sees part of the engine's findings: kvcontract merge grades all.
            from kvcontract.tools.audit.on_engine import grade

            grade(report["results"], engine)
            report["summary"] = clause_summary(report["results"], run.unchecked)
    from kvcontract.tools.audit.defects import attach_defects

    attach_defects(report, report_file)  # the defects' commands name the JSON file
    if comparison is not None:
        report["comparison"] = comparison
    if run.shard is not None:
        report["shard"] = run.shard  # --shard I/N: what kvcontract merge reads
    report["fail_on"] = sorted(i.value for i in fail_on)
    report["exit_code"] = exit_code(report, fail_on)
    if comparison is not None:
        # A regression (the comparison's exit 1) is a finding; findings beat undecided.
        report["exit_code"] = worst_exit_code([report["exit_code"],
                                               comparison.get("exit_code", 0)])
    return report


_STYLE: dict[str, str] = {
    Verdict.COUNTEREXAMPLE: "bold red", Verdict.UNKNOWN: "yellow", Verdict.VACUOUS: "yellow",
    Verdict.PROVED: "green", Verdict.PROVED_FOR_DOMAIN: "green", Verdict.TESTED: "cyan",
}
_STATUS_STYLE = {"found": "green", "derived": "cyan", "inferred": "cyan", "missing": "yellow",
                 "error": "bold red"}
_CLAUSE_STYLE = {"holds": "green", "violated": "bold red", "unknown": "yellow",
                 "not checked": "yellow", "latent": "cyan", "unconfirmed": "yellow"}


def print_bindings(console: Console, report: dict[str, Any]) -> None:
    table = Table(title=f"bindings: {report['target_description']}")
    for column in ("role", "status", "upstream", "where", "shape / note"):
        table.add_column(column, overflow="fold")
    for rb in report["bindings"]:
        where = f"{rb['path']}:{rb['line']}" if rb.get("path") else "-"
        detail = "; ".join(x for x in (rb.get("shape"), rb.get("note")) if x)
        style = _STATUS_STYLE.get(rb["status"], "")
        table.add_row(rb["role"], f"[{style}]{rb['status']}[/]",
                      escape(rb.get("qualname") or "-"), escape(where), escape(detail))
    console.print(table)


def _plain(console: Console, text: str, style: str = "") -> None:
    """One line as it is: never wrapped (a path or a command is copied from it)."""
    console.print(f"[{style}]{escape(text)}[/]" if style else escape(text),
                  highlight=False, soft_wrap=True)


def print_summary(console: Console, report: dict[str, Any]) -> None:
    """The one-screen summary (:func:`kvcontract.tools.reports.summary.summary_lines`)."""
    from kvcontract.tools.reports.summary import summary_lines

    for text, style in summary_lines(report):
        _plain(console, text, style)


def print_report(console: Console, report: dict[str, Any], *, show_bindings: bool = True,
                 verbose: bool = True) -> None:
    """The human report: the one-screen summary; with ``verbose``, then the bindings,
    the theorem table, failures, clauses and the comparison."""
    if "defects" in report:
        print_summary(console, report)
        comparison = report.get("comparison")
        if not verbose:
            if comparison:
                print_defect_comparison(console, comparison)
            return
        console.print()
    if show_bindings:
        print_bindings(console, report)
    table = Table(title=f"kvcontract audit --target {report['target']}")
    for column in ("clause", "theorem", "verdict", "evidence", "cases", "seconds"):
        table.add_column(column, overflow="fold", no_wrap=column == "verdict",
                         justify="right" if column in ("cases", "seconds") else "left")
    for row in report["results"]:
        style = _STYLE.get(row["verdict"], "")
        table.add_row(row["clause"], escape(row["theorem"]), f"[{style}]{row['verdict']}[/]",
                      row.get("evidence") or "-", f"{row.get('examples') or 0:,}",
                      f"{row['seconds']:.2f}")
    console.print(table)
    for row in report["results"]:
        if not Verdict(row["verdict"]).passed:
            style = _STYLE.get(row["verdict"], "")
            console.print(f"[{style}]{escape(row['clause'] + '/' + row['theorem'])}: "
                          f"{row['verdict']}[/] {escape(str(row.get('message', '')))}",
                          highlight=False)
            if row.get("witness"):
                shown = json.dumps(row["witness"], sort_keys=True)
                if len(shown) > WITNESS_SHOWN:  # a lookup witness on a real geometry
                    shown = (f"{shown[:WITNESS_SHOWN]}... ({len(shown):,} characters; the "
                             "JSON report has it whole)")
                console.print("  witness: " + escape(shown), highlight=False)
            if row.get("location"):
                blamed = ", ".join(row.get("blame") or []) or "-"
                console.print(escape(f"  at {row['location']['path']}:{row['location']['line']} "
                                     f"(bound as {blamed})"), highlight=False)
            if row.get("via"):
                console.print(escape(f"  checked through {row['via']}"), highlight=False)
    for item in report["unchecked"]:
        console.print("[yellow]not checked[/] "
                      + escape(f"{item['clause']}/{item['theorem']}: {item['reason']}"),
                      highlight=False)
    parts = []
    for entry in report["summary"]:
        style = _CLAUSE_STYLE.get(entry["status"], "")
        detail = entry["status"]
        if entry["status"] == "holds":
            detail += f" ({entry['evidence']})"
        parts.append(f"{entry['clause']} [{style}]{detail}[/]")
    console.print("clauses: " + ", ".join(parts))
    comparison = report.get("comparison")
    if comparison:
        print_comparison(console, comparison)
    counts: dict[str, int] = {}
    for row in report["results"]:
        counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "nothing checked"
    console.print(f"{report['target']}: {len(report['results'])} theorems in "
                  f"{report['seconds']:.1f}s: {summary}")


def print_defect_comparison(console: Console, comparison: dict[str, Any]) -> None:
    """Per defect: fixed, still present, new or changed against the baseline target."""
    from kvcontract.tools.reports.summary import fit

    defects = comparison.get("defects")
    if not defects:
        print_comparison(console, comparison)
        return
    console.print()
    _plain(console, f"baseline {comparison['baseline']} -> target {comparison['target']}",
           "bold")
    for entry in defects:
        style = {"fixed": "green", "new": "bold red", "changed": "yellow"}.get(
            entry["classification"], "")
        _plain(console, fit(f"  {entry['classification']:13} {entry['impact']:9} "
                            f"{entry['title']} [{entry['id']}]"), style)


def print_comparison(console: Console, comparison: dict[str, Any]) -> None:
    table = Table(title=f"baseline {comparison['baseline']} -> target {comparison['target']}")
    for column in ("clause", "baseline", "target", "classification", "evidence"):
        table.add_column(column, overflow="fold")
    for entry in comparison["clauses"]:
        table.add_row(entry["clause"], entry["baseline_status"], entry["target_status"],
                      entry["classification"], escape(entry.get("evidence", "")))
    console.print(table)
    for change in comparison.get("theorems", []):
        if change["classification"] != "same verdict":
            console.print(escape(f"  {change['clause']}/{change['theorem']}: "
                                 f"{change['classification']} ({change['baseline']} -> "
                                 f"{change['target']})"), highlight=False)
