"""``kvcontract prove``: every clause for an implementation (the reference by default)."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kvcontract.impl.variants import variant_names
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.tools.commands._common import (
    check_clauses,
    check_jobs,
    check_report_outputs,
    emit_reports,
    fail_on_option,
    finding_line,
    parse_fail_on,
    report_options,
    results_table,
)


@click.command()
@click.option("--impl", "impl_name", default="reference", show_default=True,
              help=f"implementation to check: {', '.join(variant_names())}")
@click.option("--clause", "clauses", multiple=True, metavar="ID",
              help="only this clause (repeatable), e.g. --clause C2")
@click.option("--json", "json_path", metavar="FILE", help="write the JSON report here")
@click.option("--jobs", type=int, default=None, help="worker processes (default: one per core)")
@click.option("--quiet", is_flag=True, help="no table, only the summary line")
@fail_on_option  # type: ignore[untyped-decorator]  # mypy sees the package as Any
@report_options  # type: ignore[untyped-decorator]  # mypy sees the package as Any
def prove(impl_name: str, clauses: tuple[str, ...], json_path: str | None,
          jobs: int | None, quiet: bool, fail_on: str, formats: tuple[str, ...],
          outputs: tuple[str, ...]) -> None:
    """Prove every clause for an implementation (the reference by default)."""
    from kvcontract.impl.variants import get_implementation
    from kvcontract.proofs.runner import prove as run_prove
    from kvcontract.proofs.runner import select
    from kvcontract.tools.reports import pair_outputs

    # Every input is validated before any proof runs (issue #11).
    get_implementation(impl_name)
    check_clauses(clauses, prover=True)
    check_jobs(jobs)
    failing = parse_fail_on(fail_on)
    pairs = pair_outputs(formats, outputs)
    check_report_outputs(pairs, json_path)
    to_stdout = any(path is None for _, path in pairs)
    console = Console(width=None if sys.stdout.isatty() else 200, stderr=to_stdout)
    total = len(select(clauses or None))
    with Progress(
        TextColumn("[bold]proving[/] {task.description}"), BarColumn(),
        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
        console=console, transient=True, disable=quiet or not console.is_terminal,
    ) as progress:
        task = progress.add_task(impl_name, total=total)

        def advance(result: TheoremResult, done: int, _total: int) -> None:
            progress.update(task, completed=done, description=f"{result.clause}/{result.theorem}")

        report = run_prove(impl_name, clauses or None, jobs=jobs, on_result=advance,
                           fail_on=failing)
    if not quiet:
        console.print(results_table(report.results, f"kvcontract prove --impl {impl_name}"))
        for r in report.results:
            if r.verdict is not Verdict.PROVED and not r.verdict.passed:
                console.print(finding_line(r, failing))
                if r.witness:
                    console.print(f"  witness: {json.dumps(r.witness, sort_keys=True)}")
    counts: dict[str, int] = {}
    for r in report.results:
        counts[r.verdict.value] = counts.get(r.verdict.value, 0) + 1
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    console.print(
        f"{impl_name}: {len(report.results)} theorems over {len(report.clauses)} clauses in "
        f"{report.seconds:.1f}s: {summary}"
    )
    if json_path:
        pairs.append(("json", json_path))
    emit_reports(report.to_json(), pairs)
    sys.exit(report.exit_code)
