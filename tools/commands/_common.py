"""What several commands share: the ``--format``/``--output`` options, emitting the
rendered reports, and the rich table of theorem results."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from kvcontract.errors import UsageError
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.vocabulary import Impact, parse_impacts
from rich.table import Table

STYLE = {
    Verdict.PROVED: "green",
    Verdict.PROVED_FOR_DOMAIN: "green",
    Verdict.TESTED: "cyan",
    Verdict.PASSED: "cyan",
    Verdict.COUNTEREXAMPLE: "bold red",
    Verdict.UNKNOWN: "yellow",
    Verdict.VACUOUS: "yellow",
}
"""The rich style of each verdict in tables and messages."""

F = TypeVar("F", bound=Callable[..., Any])


def fail_on_option(fn: F) -> F:
    """``--fail-on IMPACT,...``: which findings fail the run (the others are reported)."""
    return click.option(
        "--fail-on", "fail_on", default="crash,corruption,lost-hit", show_default=True,
        metavar="IMPACT,...",
        help="impacts whose findings fail the run (exit 1): crash, corruption, lost-hit, "
             "delay, waste, latent, or all; other findings are reported and pass",
    )(fn)


def parse_fail_on(text: str) -> frozenset[Impact]:
    """The ``--fail-on`` value, validated (a UsageError names the bad word)."""
    try:
        return parse_impacts(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def finding_line(result: TheoremResult, fail_on: frozenset[Impact]) -> str:
    """``C2/x: COUNTEREXAMPLE [crash] message`` (``not failing`` below ``--fail-on``)."""
    from rich.markup import escape

    impact = escape(f" [{result.impact}]") if result.impact else ""
    passes = result.impact is not None and Impact(result.impact) not in fail_on
    note = " (reported, not failing: outside --fail-on)" if passes else ""
    return (f"[{STYLE[result.verdict]}]{result.clause}/{result.theorem}: "
            f"{result.verdict.value}[/]{impact}{note} {escape(result.message)}")


def report_options(fn: F) -> F:
    """``--format`` / ``--output`` of the verifying commands (see tools/reports)."""
    from kvcontract.tools.reports import FORMATS

    fn = click.option(
        "--output", "outputs", multiple=True, metavar="FILE",
        help="write the report here (repeatable, paired with --format in order; the format "
             "is inferred from .json/.xml/.sarif/.md/.txt/.mypy when --format is absent)",
    )(fn)
    return click.option(
        "--format", "formats", multiple=True, type=click.Choice(FORMATS),
        help="report format (repeatable); without --output it goes to stdout",
    )(fn)


def emit_reports(data: dict[str, Any], pairs: list[tuple[str, str | None]]) -> None:
    """Render the versioned report in every requested format (stdout when no file)."""
    from kvcontract.tools.reports import render, write_text

    for fmt, path in pairs:
        text = render(data, fmt)
        if path is None:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            write_text(path, text)


def results_table(results: list[TheoremResult], title: str) -> Table:
    """The theorem results as a rich table (clause, theorem, verdict, domain, cost)."""
    table = Table(title=title, show_lines=False)
    for column in ("clause", "theorem", "verdict", "domain", "rlimit", "seconds"):
        if column in ("rlimit", "seconds"):
            table.add_column(column, overflow="fold", justify="right")
        else:
            table.add_column(column, overflow="fold", justify="left")
    for r in results:
        table.add_row(
            r.clause, r.theorem, f"[{STYLE[r.verdict]}]{r.verdict.value}[/]",
            r.domain, f"{r.rlimit_used:,}", f"{r.seconds:.2f}",
        )
    return table
