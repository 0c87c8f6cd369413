"""``kvcontract fuzz``: differential fuzzing of the mocked and tensor-backed managers."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvcontract.errors import UsageError
from kvcontract.tools.commands._common import (
    check_int,
    check_report_outputs,
    check_seed,
    emit_reports,
    fail_on_option,
    parse_fail_on,
    report_options,
)

MAX_EXAMPLES = 10_000_000
"""The most Hypothesis examples one run accepts (a typo guard, far above any campaign)."""


@click.command()
@click.option("--impl", "impl_name", default="reference", show_default=True)
@click.option("--matrix", is_flag=True, help="run the full combination matrix")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--examples", type=int, default=200, show_default=True,
              help="Hypothesis state-machine examples")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_path", metavar="FILE", help="write the JSON report here")
@fail_on_option  # type: ignore[untyped-decorator]  # mypy sees the package as Any
@report_options  # type: ignore[untyped-decorator]  # mypy sees the package as Any
def fuzz(impl_name: str, matrix: bool, device: str, examples: int, seed: int,
         json_path: str | None, fail_on: str, formats: tuple[str, ...],
         outputs: tuple[str, ...]) -> None:
    """Differential fuzzing: mocked vs tensor-backed managers, against the spec."""
    from kvcontract.impl.variants import get_implementation
    from kvcontract.tools.fuzz import run_fuzz
    from kvcontract.tools.reports import pair_outputs

    # Every input is validated before any scenario runs (issue #11).
    get_implementation(impl_name)
    if examples < 0:
        raise UsageError(f"--examples must be >= 0, not {examples}")
    check_int("--examples", examples, high=MAX_EXAMPLES, what="Hypothesis examples")
    check_seed(seed)
    if device == "cuda":
        from kvcontract.tools.fuzz import _check_device

        _check_device(device)
    failing = parse_fail_on(fail_on)
    pairs = pair_outputs(formats, outputs)
    check_report_outputs(pairs, json_path)
    console = Console(stderr=any(path is None for _, path in pairs))
    report = run_fuzz(impl_name, device=device, examples=examples, matrix=matrix, seed=seed,
                      fail_on=failing)
    data = report.to_json()
    table = Table(title=f"kvcontract fuzz --impl {impl_name}")
    table.add_column("clause")
    table.add_column("checks", justify="right")
    for clause, count in sorted(data["per_clause"].items(), key=lambda kv: int(kv[0][1:])):
        table.add_row(clause, str(count))
    console.print(table)
    for diff in data["differences"]:
        console.print(f"[bold red]{diff['clause']}[/] {diff['kind']} "
                      f"{escape('[' + diff['impact'] + ']')}: {escape(diff['message'])}")
        for line in diff.get("program", [])[:20]:
            console.print(f"    {line}")
    console.print(
        f"{impl_name}: {data['cases']} cases, {data['steps']} steps, "
        f"{len(data['differences'])} differences"
    )
    if json_path:
        pairs.append(("json", json_path))
    emit_reports(data, pairs)
    sys.exit(report.exit_code)
