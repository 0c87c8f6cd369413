"""``kvcontract gen-tests``: standalone pytest reproducers, one per counterexample."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from kvcontract.errors import UsageError
from kvcontract.impl.variants import VARIANTS
from kvcontract.tools.commands._common import (
    check_clauses,
    check_int,
    check_jobs,
    check_output_folder,
    check_report_witnesses,
)

MAX_CLASSES = 10_000
"""The most boundary classes per theorem (``--max-classes``): each is a Z3 query."""


@click.command(name="gen-tests")
@click.option("--impl", "impl_name", default=None,
              help="implementation to prove and reproduce (default: the report's target, "
                   "else reference)")
@click.option("--clause", "clauses", multiple=True, metavar="ID",
              help="only this clause (repeatable), e.g. --clause C2")
@click.option("--report", "report_path", metavar="FILE",
              help="take the counterexamples from this JSON report instead of proving")
@click.option("--out", "out_dir", required=True, metavar="DIR",
              help="directory for the generated test_*.py files")
@click.option("--boundary-classes", is_flag=True,
              help="also write one test per boundary class of the clauses' arithmetic theorems")
@click.option("--max-classes", type=int, default=16, show_default=True,
              help="at most this many boundary classes per theorem")
@click.option("--jobs", type=int, default=None, help="worker processes for proving")
def gen_tests(impl_name: str | None, clauses: tuple[str, ...], report_path: str | None,
              out_dir: str, boundary_classes: bool, max_classes: int,
              jobs: int | None) -> None:
    """Write standalone pytest reproducers, one per counterexample."""
    from kvcontract.impl.variants import get_implementation
    from kvcontract.tools.gentests import (
        boundary_class_tests,
        index_json,
        reproducers,
        write_tests,
    )
    from kvcontract.tools.reports import load_report, write_text

    # Every input is validated before any proof runs (issue #11).
    check_output_folder("--out", out_dir)
    check_int("--max-classes", max_classes, low=1, high=MAX_CLASSES,
              what="boundary classes per theorem")
    check_jobs(jobs)
    if impl_name is not None:
        get_implementation(impl_name)
    wanted = set(check_clauses(clauses, prover=not report_path or boundary_classes))
    err = Console(stderr=True)
    if report_path:
        data = load_report(report_path)
        if impl_name is not None and impl_name != data["target"]:
            raise UsageError(
                f"--impl {impl_name} does not match the report's target {data['target']!r}; "
                "omit --impl when giving --report"
            )
        target = str(data["target"])
        if target not in VARIANTS:
            raise UsageError(
                f"the report's target {target!r} is not a registered implementation "
                f"({', '.join(VARIANTS)}): the reproducers call it by name"
            )
        check_report_witnesses(data, report_path)
    else:
        from kvcontract.proofs.runner import prove as run_prove

        target = impl_name or "reference"
        report = run_prove(target, sorted(wanted) or None, jobs=jobs)
        data = report.to_json()
        err.print(f"proved {target}: {len(report.results)} theorems, exit code {report.exit_code}")
    if wanted:
        kept = [r for r in data.get("results", []) if r.get("clause") in wanted]
        data = {**data, "results": kept}
    tests, skipped = reproducers(data)
    if boundary_classes:
        more, more_skipped = boundary_class_tests(target, sorted(wanted) or None, max_classes)
        tests += more
        skipped += more_skipped
    written = write_tests(tests, out_dir)
    write_text(str(Path(out_dir) / "kvcontract-tests.json"), index_json(tests, skipped))
    for item in skipped:
        err.print(f"[yellow]skipped[/] {item.theorem}: {item.reason}")
    click.echo(f"wrote {len(written)} test files to {out_dir}")
