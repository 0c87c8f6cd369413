"""The ``kvcontract`` command line (the only module that parses arguments).

Exit codes (every verifying command):

    0  every theorem PROVED or PROVED-FOR-DOMAIN / the fuzzer found nothing
    1  a COUNTEREXAMPLE (or a fuzzing difference)
    2  usage or input error (unknown clause or target, bad file, impossible geometry)
    3  UNKNOWN or VACUOUS somewhere, and no counterexample
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from kvcontract.impl.variants import VARIANTS, variant_names
from kvcontract.proofs.verdicts import EXIT_USAGE, TheoremResult, Verdict
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvcontract.errors import KvContractError, UsageError

_STYLE = {
    Verdict.PROVED: "green",
    Verdict.PROVED_FOR_DOMAIN: "green",
    Verdict.COUNTEREXAMPLE: "bold red",
    Verdict.UNKNOWN: "yellow",
    Verdict.VACUOUS: "yellow",
}


def _write_json(path: str, data: dict[str, Any]) -> None:
    try:
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write the JSON report to {path}: {exc.strerror}") from None


def _results_table(results: list[TheoremResult], title: str) -> Table:
    table = Table(title=title, show_lines=False)
    for column in ("clause", "theorem", "verdict", "domain", "rlimit", "seconds"):
        table.add_column(column, overflow="fold", justify="right" if column in ("rlimit", "seconds") else "left")
    for r in results:
        table.add_row(
            r.clause, r.theorem, f"[{_STYLE[r.verdict]}]{r.verdict.value}[/]",
            r.domain, f"{r.rlimit_used:,}", f"{r.seconds:.2f}",
        )
    return table


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvcontract")
def cli() -> None:
    """Prove and test the KV-offloading coverage contract of sliding-window attention."""


@cli.command()
@click.option("--impl", "impl_name", default="reference", show_default=True,
              help=f"implementation to check: {', '.join(variant_names())}")
@click.option("--clause", "clauses", multiple=True, metavar="ID",
              help="only this clause (repeatable), e.g. --clause C2")
@click.option("--json", "json_path", metavar="FILE", help="write the JSON report here")
@click.option("--jobs", type=int, default=None, help="worker processes (default: one per core)")
@click.option("--quiet", is_flag=True, help="no table, only the summary line")
def prove(impl_name: str, clauses: tuple[str, ...], json_path: str | None,
          jobs: int | None, quiet: bool) -> None:
    """Prove every clause for an implementation (the reference by default)."""
    from kvcontract.proofs.runner import prove as run_prove
    from kvcontract.proofs.runner import select

    console = Console(width=None if sys.stdout.isatty() else 200)
    total = len(select(clauses or None))
    with Progress(
        TextColumn("[bold]proving[/] {task.description}"), BarColumn(),
        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
        console=console, transient=True, disable=quiet or not console.is_terminal,
    ) as progress:
        task = progress.add_task(impl_name, total=total)

        def advance(result: TheoremResult, done: int, _total: int) -> None:
            progress.update(task, completed=done, description=f"{result.clause}/{result.theorem}")

        report = run_prove(impl_name, clauses or None, jobs=jobs, on_result=advance)
    if not quiet:
        console.print(_results_table(report.results, f"kvcontract prove --impl {impl_name}"))
        for r in report.results:
            if r.verdict is not Verdict.PROVED and not r.verdict.passed:
                console.print(f"[{_STYLE[r.verdict]}]{r.clause}/{r.theorem}: {r.verdict.value}[/] {r.message}")
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
        _write_json(json_path, report.to_json())
    sys.exit(report.exit_code)


@cli.command()
@click.option("--impl", "impl_name", default="reference", show_default=True)
@click.option("--matrix", is_flag=True, help="run the full combination matrix")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--examples", type=int, default=200, show_default=True,
              help="Hypothesis state-machine examples")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_path", metavar="FILE", help="write the JSON report here")
def fuzz(impl_name: str, matrix: bool, device: str, examples: int, seed: int,
         json_path: str | None) -> None:
    """Differential fuzzing: mocked vs tensor-backed managers, against the spec."""
    from kvcontract.tools.fuzz import run_fuzz

    if examples < 0:
        raise UsageError(f"--examples must be >= 0, not {examples}")
    console = Console()
    report = run_fuzz(impl_name, device=device, examples=examples, matrix=matrix, seed=seed)
    data = report.to_json()
    table = Table(title=f"kvcontract fuzz --impl {impl_name}")
    table.add_column("clause")
    table.add_column("checks", justify="right")
    for clause, count in sorted(data["per_clause"].items(), key=lambda kv: int(kv[0][1:])):
        table.add_row(clause, str(count))
    console.print(table)
    for diff in data["differences"]:
        console.print(f"[bold red]{diff['clause']}[/] {diff['kind']}: {diff['message']}")
        for line in diff.get("program", [])[:20]:
            console.print(f"    {line}")
    console.print(
        f"{impl_name}: {data['cases']} cases, {data['steps']} steps, "
        f"{len(data['differences'])} differences"
    )
    if json_path:
        _write_json(json_path, data)
    sys.exit(report.exit_code)


@cli.command(name="list")
def list_command() -> None:
    """List the clauses, the theorems and the registered implementations."""
    from kvcontract.proofs.runner import catalog
    from kvcontract.spec.clauses import CLAUSES

    console = Console()
    table = Table(title="clauses and theorems")
    table.add_column("clause")
    table.add_column("theorem")
    table.add_column("kind")
    table.add_column("statement", overflow="fold")
    theorems = catalog()
    for clause in CLAUSES:
        own = [t for t in theorems if t.clause == clause.id]
        if not own:
            table.add_row(clause.id, "-", clause.proved_by, clause.statement)
        for t in own:
            table.add_row(clause.id, t.name, t.kind, t.description)
    console.print(table)
    impls = Table(title="implementations (--impl)")
    impls.add_column("name")
    impls.add_column("violates")
    impls.add_column("description", overflow="fold")
    for name, impl in VARIANTS.items():
        impls.add_row(name, ", ".join(impl.violates) or "-", impl.description)
    console.print(impls)


def main(argv: list[str] | None = None) -> None:
    """Entry point: maps kvcontract errors to exit code 2 with a one-line message."""
    try:
        cli.main(args=argv, prog_name="kvcontract", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        sys.exit(EXIT_USAGE)
    except KvContractError as exc:
        click.echo(f"kvcontract: error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    sys.exit(0)


if __name__ == "__main__":
    main()
