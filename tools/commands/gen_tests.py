"""``kvcontract gen-tests``: standalone pytest reproducers, one per counterexample."""

from __future__ import annotations

from pathlib import Path

import click

from kvcontract.errors import KvContractError, UsageError
from kvcontract.options import check_clauses, check_int, check_jobs
from kvcontract.tools.commands._common import (
    bind_report_target,
    check_output_folder,
    check_report_witnesses,
    load_replay_report,
    report_implementation,
)
from kvcontract.tools.reports.console import make_console

MAX_CLASSES = 10_000
"""The most boundary classes per theorem (``--max-classes``): each is a Z3 query."""


@click.command(name="gen-tests")
@click.option("--impl", "impl_name", default=None,
              help="implementation to prove and reproduce: a registered name or "
                   "module:FILE.py, package.module:NAME or an installed entry point "
                   "(default: the report's target, else reference)")
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
@click.option("--quiet", is_flag=True, help="no progress, only what was written")
def gen_tests(impl_name: str | None, clauses: tuple[str, ...], report_path: str | None,
              out_dir: str, boundary_classes: bool, max_classes: int,
              jobs: int | None, quiet: bool) -> None:
    """Write standalone pytest reproducers, one per counterexample.

    Each file imports only kvcontract's public modules (kvcontract.api,
    kvcontract.spec.properties) and reads the implementation from KVCONTRACT_IMPL (a
    registered name or module:FILE.py). Progress of the proof goes to stderr."""
    from kvcontract.api import register_implementation
    from kvcontract.tools.commands._progress import progress
    from kvcontract.tools.gentests import (
        audit_reproducers,
        boundary_class_tests,
        index_json,
        reproducers,
        write_tests,
    )
    from kvcontract.tools.reports import write_text

    # Every input is validated before any proof runs (issue #11).
    check_output_folder("--out", out_dir)
    check_int("--max-classes", max_classes, low=1, high=MAX_CLASSES,
              what="boundary classes per theorem")
    check_jobs(jobs)
    if impl_name is not None:
        impl_name = register_implementation(impl_name)  # a name or module:FILE.py
    wanted = set(check_clauses(clauses, prover=not report_path or boundary_classes))
    err = make_console(stderr=True)
    bound = None
    if report_path:
        data = load_replay_report(report_path)
        name, upstream = report_implementation(data)
        if upstream is not None:
            # An audit of upstream code: its reproducers replay the bound upstream file.
            if impl_name is not None:
                raise UsageError(
                    f"--impl {impl_name}: the report audited upstream code ({upstream}); "
                    "its reproducers replay that code (KVCONTRACT_AUDIT_TARGET re-points "
                    "them at another version): omit --impl"
                )
            if boundary_classes:
                raise UsageError(
                    f"--boundary-classes: the report audited upstream code ({upstream}); "
                    "boundary-class tests are proved on a kvcontract implementation: run "
                    "gen-tests --impl NAME --boundary-classes without --report"
                )
            bound = bind_report_target(upstream, report_path)
            target = upstream
        else:
            assert name is not None
            try:
                target = register_implementation(name)
            except KvContractError as exc:
                raise UsageError(
                    f"the report's target {data['target']!r} is not an implementation the "
                    f"reproducers can load by name: {exc}"
                ) from None
            if impl_name is not None and impl_name != target:
                raise UsageError(
                    f"--impl {impl_name} does not match the report's target "
                    f"{data['target']!r}; omit --impl when giving --report"
                )
            check_report_witnesses(data, report_path)
            data = {**data, "target": target}  # builtin:NAME -> NAME, what IMPL loads
    else:
        from kvcontract.proofs.runner import prove as run_prove

        target = impl_name or "reference"
        with progress("proving", target, quiet=quiet) as advance:
            report = run_prove(target, sorted(wanted) or None, jobs=jobs,
                               on_result=lambda r, done, total: advance(
                                   f"{r.clause}/{r.theorem}", done, total))
        data = report.to_json()
        err.print(f"proved {target}: {len(report.results)} theorems, exit code {report.exit_code}")
    if wanted:
        kept = [r for r in data.get("results", []) if r.get("clause") in wanted]
        data = {**data, "results": kept}
    tests, skipped = reproducers(data) if bound is None else audit_reproducers(data, bound)
    if boundary_classes:
        more, more_skipped = boundary_class_tests(target, sorted(wanted) or None, max_classes)
        tests += more
        skipped += more_skipped
    written = write_tests(tests, out_dir)
    write_text(str(Path(out_dir) / "kvcontract-tests.json"), index_json(tests, skipped))
    for item in skipped:
        err.print(f"[yellow]skipped[/] {item.theorem}: {item.reason}")
    click.echo(f"wrote {len(written)} test files to {out_dir}")
