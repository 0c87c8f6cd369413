"""``kvcontract mutate``: how tightly the contract pins an implementation's functions.

A mutation campaign (:mod:`kvcontract.tools.mutate`): every small change of every
function (or a seeded sample) is run in a child process against the theorems that
exercise the function and the fuzzer's seed scenarios. The score is information, not
a verdict: exit 0 once it is computed, 1 only under ``--fail-under``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvcontract.errors import KvContractError, UsageError
from kvcontract.impl.variants import variant_names
from kvcontract.options import check_float, check_jobs, check_seed
from kvcontract.tools.commands._common import (
    check_output_file,
    impl_option,
    internal_error,
    jobs_option,
    json_option,
    quiet_option,
    shard_option,
)
from kvcontract.tools.reports.console import make_console
from kvcontract.vocabulary import EXIT_COUNTEREXAMPLE, EXIT_OK

MAX_SAFETY_TIMEOUT = 7 * 24 * 3600.0
"""The longest ``--safety-timeout`` (a week): past it the limit is no limit at all."""

STATUS_STYLE = {"killed": "green", "survived": "bold red", "equivalent": "cyan",
                "timeout": "yellow"}


@click.command()
@impl_option(f"a registered implementation ({', '.join(variant_names())}) or module:FILE.py "
             "(a file standing in for impl/reference.py or impl/scheduler.py)",
             dest="target", metavar="TARGET")
@click.option("--sample", type=int, default=None, metavar="N",
              help="a seeded sample of N mutants (default: every mutation point)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of --sample")
@jobs_option("mutants run in parallel (default: one per core)", metavar="N")
@click.option("--function", "functions", multiple=True, metavar="NAME",
              help="only the mutation points of this function (repeatable), e.g. "
                   "get_num_skipped_tokens or StoreTracker.step")
@json_option("write every mutant here (JSON)")
@click.option("--fail-under", type=float, default=None, metavar="PERCENT",
              help="exit 1 when the score is below this percentage")
@click.option("--no-fuzz", is_flag=True, help="the prover only (no fuzz run for survivors)")
@click.option("--safety-timeout", type=float, default=1800.0, show_default=True,
              metavar="S", help="wall-clock safety limit per mutant: past it the mutant is "
                                "'timeout' (never killed or survived)")
@shard_option("run only shard I of N of the selected mutants (1-based; a static, "
              "deterministic split)")
@click.option("--list", "list_only", is_flag=True,
              help="list the selected mutation points (id, location, change) and exit")
@click.option("--all", "show_all", is_flag=True, help="list killed mutants in the table too")
@quiet_option("no table, only the summary")
def mutate(target: str, sample: int | None, seed: int, jobs: int | None,
           functions: tuple[str, ...], json_path: str | None, fail_under: float | None,
           no_fuzz: bool, safety_timeout: float, shard_text: str | None, list_only: bool,
           show_all: bool, quiet: bool) -> None:
    """Mutation campaign: how tightly the contract pins an implementation."""
    from kvcontract.proofs.shards import parse_shard
    from kvcontract.tools.mutate.campaign import CampaignError, plan, run_campaign

    # Every argument is validated before any work.
    if sample is not None and sample < 1:
        raise UsageError(f"--sample must be a positive integer, not {sample}")
    check_seed(seed)
    check_jobs(jobs)
    if fail_under is not None and not 0 <= fail_under <= 100:
        raise UsageError(f"--fail-under is a percentage in [0, 100], not {fail_under}")
    check_float("--safety-timeout", safety_timeout, low=0.0, high=MAX_SAFETY_TIMEOUT,
                unit="seconds")
    shard = parse_shard(shard_text)
    if json_path is not None:
        check_output_file("--json", json_path)
    # UsageError: unknown target/function
    prepared = plan(target, sample, seed, functions, shard)
    if list_only:
        for point in prepared.points:
            print(f"{point.id}\t{point.location}\t{point.operator}\t{point.before} -> "
                  f"{point.after}")
        sys.exit(EXIT_OK)
    if not prepared.points and shard is None:
        raise UsageError(f"{target}: no mutation point to run")

    console = make_console()
    try:
        with Progress(
            TextColumn("[bold]mutating[/] {task.description}"), BarColumn(),
            TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
            console=console, transient=True, disable=quiet or not console.is_terminal,
        ) as progress:
            task = progress.add_task(target, total=len(prepared.points))

            def advance(result: Any, done: int, total: int) -> None:
                progress.update(task, completed=done,
                                description=f"{result.point.id}: {result.status}")
                if not quiet and not console.is_terminal:
                    # A long campaign in a log is never silent: one line per mutant.
                    print(f"[{done}/{total}] {result.point.id} ({result.point.location}): "
                          f"{result.status}", file=sys.stderr, flush=True)

            report = run_campaign(target, sample=sample, seed=seed, jobs=jobs,
                                  functions=functions, fuzz=not no_fuzz,
                                  safety_timeout=safety_timeout, on_result=advance,
                                  prepared=prepared)
    except (CampaignError, KvContractError) as exc:
        if isinstance(exc, UsageError):
            raise
        # The campaign itself failed (the unmutated target does not run): never a
        # mutant's fate. Any other exception is a bug, reported by tools/cli.py (exit 4).
        sys.exit(internal_error(exc))

    print_report(console, report, show_all, quiet)
    score = report.score
    shown = "n/a" if score is None else f"{100 * score:.1f}%"
    console.print(summary_line(report) + (f"; shard {shard}" if shard is not None else ""))
    if report.baseline.failing:
        console.print(f"not counted (they fail for the unmutated target): "
                      f"{', '.join(report.baseline.failing)}")
    if json_path:
        from kvcontract.tools.reports import write_text

        write_text(json_path, json.dumps(report.to_json(), indent=2) + "\n")
    if fail_under is not None and score is not None and 100 * score < fail_under:
        console.print(f"[bold red]score {shown} is below --fail-under {fail_under:g}%[/]")
        sys.exit(EXIT_COUNTEREXAMPLE)
    sys.exit(EXIT_OK)


def summary_line(report: Any) -> str:
    """The campaign's last line (also ``kvcontract merge``'s for mutate shards)."""
    score = report.score
    shown = "n/a" if score is None else f"{100 * score:.1f}%"
    status = report.by_status()
    if report.shard_seconds:
        timing = (f"in {len(report.shard_seconds)} shards of "
                  + ", ".join(f"{t:.0f}s" for t in report.shard_seconds)
                  + f" ({report.seconds_per_mutant():.1f}s per mutant)")
    else:
        timing = (f"in {report.seconds:.1f}s ({report.seconds_per_mutant():.1f}s per mutant "
                  f"with {report.jobs} jobs)")
    return (f"{report.target}: mutation score {shown} (killed {status['killed']}, survived "
            f"{status['survived']}; {status['equivalent']} equivalent and "
            f"{status['timeout']} timeout excluded) over {len(report.mutants)} of "
            f"{report.total_points} mutants {timing}")


def print_report(console: Any, report: Any, show_all: bool, quiet: bool) -> None:
    """The tables of a campaign (non-killed mutants, per operator)."""
    if quiet:
        return
    if not report.mutants:
        console.print("no mutant to run (an empty shard)")
        return
    if show_all or any(m.status != "killed" for m in report.mutants):
        console.print(_mutant_table(report, show_all))
    else:
        console.print("every mutant was killed")
    console.print(_operator_table(report))


def _mutant_table(report: Any, show_all: bool) -> Table:
    table = Table(title=f"kvcontract mutate --impl {report.target}", show_lines=False)
    table.add_column("status", no_wrap=True)
    for column in ("location", "function", "operator", "change",
                   "killed by / should be caught by"):
        table.add_column(column, overflow="fold")
    for m in report.mutants:
        if m.status == "killed" and not show_all:
            continue
        p = m.point
        change = f"{escape(p.before)}\n[dim]->[/] {escape(p.after)}"
        if m.status == "killed":
            by = m.killed_by or {}
            judged = by.get("theorem") or (f"fuzz {by.get('clause', '')}" if m.reason == "fuzz"
                                           else m.reason)
        elif m.status == "equivalent":
            judged = escape((m.equivalence or {}).get("detail", ""))
        else:
            judged = ", ".join(m.judges.clauses) + ("" if m.judges.mapped else " (unsure)")
            differs = (m.equivalence or {}).get("distinguishing_input")
            if differs:
                shown = ", ".join(f"{k}={v}" for k, v in differs.items())
                judged += f"\n[dim]differs at {escape(shown)}[/]"
        table.add_row(f"[{STATUS_STYLE[m.status]}]{m.status}[/]", p.location, p.function,
                      p.operator, change, judged)
    return table


def _operator_table(report: Any) -> Table:
    table = Table(title="per operator")
    table.add_column("operator")
    for status in ("killed", "survived", "equivalent", "timeout"):
        table.add_column(status, justify="right")
    table.add_column("score", justify="right")
    for op, counts in report.by_operator().items():
        scored = counts["killed"] + counts["survived"]
        score = f"{100 * counts['killed'] / scored:.0f}%" if scored else "-"
        table.add_row(op, *(str(counts[s]) for s in ("killed", "survived", "equivalent",
                                                      "timeout")), score)
    return table
