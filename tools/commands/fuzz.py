"""``kvcontract fuzz``: differential fuzzing of the mocked and tensor-backed managers."""

from __future__ import annotations

import sys

import click
from rich.markup import escape
from rich.table import Table

from kvcontract.errors import UsageError
from kvcontract.tools.commands._common import (
    check_int,
    check_report_outputs,
    check_seed,
    emit_reports,
    fail_on_option,
    geometry_options,
    make_console,
    parse_fail_on,
    print_scope,
    report_options,
    resolve_geometries,
)

MAX_EXAMPLES = 10_000_000
"""The most Hypothesis examples one run accepts (a typo guard, far above any campaign)."""


@click.command()
@click.option("--impl", "impl_name", default="reference", show_default=True,
              help="implementation to fuzz: a registered name (kvcontract list) or "
                   "module:FILE.py (functions of impl/reference.py over the reference)")
@click.option("--matrix", is_flag=True, help="run the full combination matrix")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--examples", type=int, default=200, show_default=True,
              help="Hypothesis state-machine examples")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_path", metavar="FILE", help="write the JSON report here")
@click.option("--quiet", is_flag=True,
              help="no progress and no table, only the differences and the summary line")
@geometry_options  # type: ignore[untyped-decorator]  # mypy sees the package as Any
@fail_on_option  # type: ignore[untyped-decorator]  # mypy sees the package as Any
@report_options  # type: ignore[untyped-decorator]  # mypy sees the package as Any
def fuzz(impl_name: str, matrix: bool, device: str, examples: int, seed: int,
         json_path: str | None, quiet: bool, models: tuple[str, ...],
         geometry_files: tuple[str, ...],
         bpcs: tuple[int, ...], retentions: tuple[str, ...], fail_on: str,
         formats: tuple[str, ...], outputs: tuple[str, ...]) -> None:
    """Differential fuzzing: mocked vs tensor-backed managers, against the spec.

    With --model or --geometry, the seed scenarios' shapes (resend, continuation, stale
    pending, unaligned hit, prefill horizon) run on those geometries instead of the
    built-in ones, at one token past the first multiple of A beyond every window (and
    4k-16k tokens where chunks are large); prompts are capped at 16,384 tokens, so a
    longer window is exercised up to there only. The state machine draws from those
    geometries too, with shared prefixes as long as that prompt (--examples sets how
    many programs; on long prompts each takes longer). Not with --matrix.

    Progress goes to stderr: a bar on a terminal, else one line per finished scenario."""
    from kvcontract.api import register_implementation
    from kvcontract.tools.commands._progress import progress
    from kvcontract.tools.fuzz import run_fuzz
    from kvcontract.tools.reports import pair_outputs

    # Every input is validated before any scenario runs (issue #11).
    impl_name = register_implementation(impl_name)  # a name or module:FILE.py
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
    scope = resolve_geometries(models, geometry_files, bpcs, retentions)
    if scope and matrix:
        raise UsageError("--matrix runs the built-in geometry matrix; drop it to fuzz the "
                         "geometries of --model/--geometry (or drop those)")
    console = make_console(stderr=any(path is None for _, path in pairs))
    if scope and not quiet:
        print_scope(console, scope, notes=False)
    with progress("fuzzing", impl_name, quiet=quiet) as advance:
        report = run_fuzz(impl_name, device=device, examples=examples, matrix=matrix,
                          seed=seed, fail_on=failing, geometries=scope, on_progress=advance)
    data = report.to_json()
    title = f"kvcontract fuzz --impl {impl_name}"
    if scope:
        title += " on " + ", ".join(label for label, _ in scope)
    table = Table(title=title)
    table.add_column("clause", no_wrap=True)
    table.add_column("checks", justify="right", no_wrap=True)
    for clause, count in sorted(data["per_clause"].items(), key=lambda kv: int(kv[0][1:])):
        table.add_row(clause, str(count))
    if not quiet:
        console.print(table)
    for diff in data["differences"]:
        console.print(f"[bold red]{diff['clause']}[/] {diff['kind']} "
                      f"{escape('[' + diff['impact'] + ']')}: {escape(diff['message'])}")
        for line in diff.get("program", [])[:20]:
            console.print(f"    {escape(str(line))}", highlight=False)
    console.print(
        f"{impl_name}: {data['cases']} cases, {data['steps']} steps, "
        f"{len(data['differences'])} differences"
    )
    if json_path:
        pairs.append(("json", json_path))
    emit_reports(data, pairs)
    sys.exit(report.exit_code)
