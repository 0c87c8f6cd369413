"""``kvcontract merge REPORT...``: the JSON reports of ``prove --shard I/N`` (or ``fuzz
--shard I/N``, ``audit --shard I/N``) runs joined into the report of the unsharded run
(:mod:`kvcontract.tools.reports.merge`), rendered like the command's own."""

from __future__ import annotations

import sys
from typing import Any

import click

from kvcontract.errors import UsageError
from kvcontract.options import parse_gate_fail_on
from kvcontract.tools.commands._common import (
    baseline_file_options,
    check_gate,
    check_report_outputs,
    emit_reports,
    finding_line,
    json_option,
    quiet_option,
    report_options,
    results_table,
)
from kvcontract.tools.reports.console import make_console
from kvcontract.tools.reports.gate import finish_gate, print_gate


@click.command()
@click.argument("reports", nargs=-1, metavar="REPORT...")
@json_option("write the merged JSON report here")
@quiet_option()
@click.option("--fail-under", type=float, default=None, metavar="PERCENT",
              help="mutate shards: exit 1 when the merged mutation score is below this "
                   "percentage")
@click.option("--fail-on", "fail_on", default=None, metavar="IMPACT,...",
              help="impacts whose findings fail the run (default: the shards' --fail-on); "
                   "add new to fail only on findings not in --baseline-file (prove, "
                   "audit)")
@baseline_file_options
@report_options
def merge(reports: tuple[str, ...], json_path: str | None, quiet: bool,
          fail_under: float | None, fail_on: str | None,
          baseline_file: str | None, write_baseline: str | None,
          formats: tuple[str, ...], outputs: tuple[str, ...]) -> None:
    """Join the JSON reports of every shard of one run (`prove --shard I/N`, `fuzz
    --shard I/N`, `audit --shard I/N`, `mutate --shard I/N --json`) into the report the
    unsharded run writes: the same results in the same order and the same exit code
    (only times differ; a campaign's score is recomputed over every mutant).

    Every shard 1..N must be given exactly once, all from the same kvcontract version,
    implementation or audited target, selection and scope (else exit 2). For prove and
    audit, the findings baseline (--baseline-file, --write-baseline, --fail-on new, or
    their [tool.kvcontract] defaults) is applied here, to the whole run."""
    from kvcontract.tools.config import apply_config
    from kvcontract.tools.reports import load_report, pair_outputs
    from kvcontract.tools.reports.gate import gate_exit_code, gate_summary
    from kvcontract.tools.reports.merge import fuzz_exit_code
    from kvcontract.tools.reports.merge import merge as merge_reports
    from kvcontract.vocabulary import parse_impacts

    if not reports:
        raise UsageError("kvcontract merge needs the JSON report of every shard: "
                         "kvcontract merge shard-1.json shard-2.json ...")
    mutate_shards = _mutate_reports(reports)
    if mutate_shards is not None:
        _merge_mutate(mutate_shards, json_path, quiet, fail_under, fail_on, baseline_file,
                      write_baseline, formats, outputs)
        return
    if fail_under is not None:
        raise UsageError("--fail-under is for the shards of `kvcontract mutate`")
    params: dict[str, Any] = {"fail_on": fail_on, "baseline_file": baseline_file}
    apply_config(click.get_current_context(), params)
    fail_on, baseline_file = params["fail_on"], params["baseline_file"]
    pairs = pair_outputs(formats, outputs)
    check_report_outputs(pairs, json_path, [("--write-baseline", write_baseline)]
                         if write_baseline else None)
    loaded = [(path, load_report(path)) for path in reports]
    data = merge_reports(loaded)
    console = make_console(stderr=any(path is None for _, path in pairs))
    if data["command"] == "fuzz":
        if baseline_file is not None or write_baseline is not None or (
                fail_on is not None and "new" in fail_on.lower()):
            raise UsageError("a findings baseline (--baseline-file, --write-baseline, "
                             "--fail-on new) is for prove and audit reports, not fuzz "
                             "reports")
        if fail_on is not None:
            try:
                data["fail_on"] = sorted(i.value for i in parse_impacts(fail_on))
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        code = fuzz_exit_code(data)
        console.print(f"{data['target']}: {data['cases']} cases, {data['steps']} steps, "
                      f"{len(data['differences'])} differences ({len(loaded)} shards)")
    elif data["command"] == "audit":
        code = _finish_audit(console, data, fail_on, baseline_file, write_baseline, quiet,
                             len(loaded))
    else:
        failing, only_new = parse_gate_fail_on(
            fail_on if fail_on is not None else ",".join(data["fail_on"]) or "all")
        data["fail_on"] = sorted(i.value for i in failing)
        baseline = check_gate(only_new, baseline_file, write_baseline)
        finish_gate(data, baseline, only_new=only_new, write_to=write_baseline)
        data["exit_code"] = code = gate_exit_code(data["results"], failing, only_new)
        _print_prove(console, data, failing, only_new, quiet, len(loaded), gate_summary(data))
    if json_path:
        pairs.append(("json", json_path))
    emit_reports(data, pairs)
    sys.exit(int(code))


def _mutate_reports(reports: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]] | None:
    """The reports read back when they are all `kvcontract mutate` reports (their own
    shape: a campaign, not theorem results); None when none is. A mix is a usage error
    (shards of one run share the command)."""
    import json
    from pathlib import Path

    from kvcontract.errors import InputFileError
    from kvcontract.tools.reports.merge import load_mutate_report

    raw: list[tuple[str, Any]] = []
    for path in reports:
        try:
            raw.append((path, json.loads(Path(path).read_text(encoding="utf-8"))))
        except (OSError, UnicodeDecodeError, ValueError):
            raw.append((path, None))  # load_report names the problem
    kinds = [isinstance(d, dict) and d.get("command") == "mutate" for _, d in raw]
    if not any(kinds):
        return None
    if not all(kinds):
        other = next(path for (path, _), is_mutate in zip(raw, kinds, strict=True)
                     if not is_mutate)
        raise InputFileError(other, "not a kvcontract mutate report, unlike the other "
                                    "shards: shards of one run share the command")
    return [(path, load_mutate_report(path, data)) for path, data in raw]


def _merge_mutate(shards: list[tuple[str, dict[str, Any]]], json_path: str | None,
                  quiet: bool, fail_under: float | None, fail_on: str | None,
                  baseline_file: str | None, write_baseline: str | None,
                  formats: tuple[str, ...], outputs: tuple[str, ...]) -> None:
    """The campaign of every mutate shard: its tables and summary line (as `kvcontract
    mutate` prints them), the merged JSON (--json), exit 1 under --fail-under."""
    import json

    from kvcontract.tools.commands._common import check_output_file
    from kvcontract.tools.commands.mutate import print_report, summary_line
    from kvcontract.tools.mutate.campaign import MutationReport
    from kvcontract.tools.reports import write_text
    from kvcontract.tools.reports.merge import merge_mutate
    from kvcontract.vocabulary import EXIT_COUNTEREXAMPLE, EXIT_OK

    if formats or outputs or fail_on is not None or baseline_file or write_baseline:
        raise UsageError("mutate shards merge into a campaign report: use --json FILE (and "
                         "--fail-under); --format/--output, --fail-on and findings "
                         "baselines are for prove, fuzz and audit reports")
    if fail_under is not None and not 0 <= fail_under <= 100:
        raise UsageError(f"--fail-under is a percentage in [0, 100], not {fail_under}")
    if json_path is not None:
        check_output_file("--json", json_path)
    data = merge_mutate(shards)
    report = MutationReport.from_json(data)
    console = make_console()
    print_report(console, report, show_all=False, quiet=quiet)
    console.print(summary_line(report))
    if json_path:
        write_text(json_path, json.dumps(data, indent=2) + "\n")
    score = report.score
    if fail_under is not None and score is not None and 100 * score < fail_under:
        console.print(f"[bold red]score {100 * score:.1f}% is below --fail-under "
                      f"{fail_under:g}%[/]")
        sys.exit(EXIT_COUNTEREXAMPLE)
    sys.exit(EXIT_OK)


def _finish_audit(console: Any, data: dict[str, Any], fail_on: str | None,
                  baseline_file: str | None, write_baseline: str | None, quiet: bool,
                  shards: int) -> int:
    """The merged audit's gate, as the audit applies it to a whole run
    (:func:`kvcontract.tools.audit.command.apply_gate`: the findings baseline, and
    ``--require-complete`` when the shards ran with it), and its printout."""
    from kvcontract.tools.audit.command import apply_gate
    from kvcontract.tools.audit.report import print_report
    from kvcontract.tools.reports.gate import gate_summary

    failing, only_new = parse_gate_fail_on(
        fail_on if fail_on is not None else ",".join(data["fail_on"]) or "all")
    data["fail_on"] = sorted(i.value for i in failing)
    baseline = check_gate(only_new, baseline_file, write_baseline)
    apply_gate(data, failing, only_new, baseline, write_baseline,
               bool(data.pop("require_complete", False)))
    if not quiet:
        print_report(console, data, show_bindings=False)
        print_gate(console, data)
    console.print(f"{data['target']}: exit code {data['exit_code']} "
                  f"({len(data['results'])} theorems from {shards} shards"
                  f"{gate_summary(data)})")
    return int(data["exit_code"])


def _print_prove(console: Any, data: dict[str, Any], failing: frozenset[Any],
                 only_new: bool, quiet: bool, shards: int, gate: str) -> None:
    from kvcontract.proofs.verdicts import TheoremResult, Verdict

    results = [TheoremResult.from_json(row) for row in data["results"]]
    if not quiet:
        console.print(results_table(results, f"kvcontract merge: prove --impl "
                                             f"{data['target']} ({shards} shards)"))
        for r, row in zip(results, data["results"], strict=True):
            if r.verdict is not Verdict.PROVED and not r.verdict.passed:
                console.print(finding_line(r, failing, row.get("baseline_state"), only_new))
        print_gate(console, data)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.verdict.value] = counts.get(r.verdict.value, 0) + 1
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    not_run = data.get("not_run") or []
    console.print(
        f"{data['target']}: {len(results)} theorems over {len(data['clauses'])} clauses "
        f"from {shards} shards: {summary}{gate}"
        + (f"; {len(not_run)} not run (--fail-fast)" if not_run else ""))
