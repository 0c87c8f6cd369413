"""``kvcontract audit``: real vLLM code (or a patched file) against the contract."""

from __future__ import annotations

import sys

import click

from kvcontract.errors import UsageError
from kvcontract.tools.commands._common import (
    check_clauses,
    check_float,
    check_jobs,
    check_output_folder,
    check_report_outputs,
    emit_reports,
    fail_on_option,
    parse_fail_on,
    report_options,
)

MIN_TIMEOUT = 0.001
"""The shortest ``--timeout`` (seconds): a shorter interval timer does not fire reliably."""


@click.command()
@click.option("--target", required=True, metavar="TARGET",
              help="vllm:PATH (checkout, unpacked wheel, site-packages), vllm:installed, "
                   "module:FILE.py, or builtin:NAME / a registered implementation")
@click.option("--baseline", metavar="TARGET", default=None,
              help="a second target; classify each clause as fixed, regressed or changed")
@click.option("--clause", "clauses", multiple=True, metavar="ID",
              help="only this clause (repeatable), e.g. --clause C3")
@click.option("--json", "json_path", metavar="FILE", help="write the JSON report here")
@click.option("--timeout", type=float, default=2.0, show_default=True,
              help="seconds one upstream call may take (a hang is reported as a finding)")
@click.option("--budget", type=int, default=50_000, show_default=True,
              help="cases of concrete search per theorem (enumeration, sampled cases): a "
                   "count, so the same audit finds the same things on any machine")
@click.option("--jobs", type=int, default=None, help="worker processes (default: one per core)")
@click.option("--reproducers", "reproducer_dir", metavar="DIR", default=None,
              help="write a pytest reproducer per counterexample into DIR")
@click.option("--pictures", "picture_dir", metavar="DIR", default=None,
              help="draw each counterexample into DIR (PNG and SVG)")
@click.option("--quiet", is_flag=True, help="no tables, only the summary line")
@fail_on_option  # type: ignore[untyped-decorator]  # mypy sees the package as Any
@report_options  # type: ignore[untyped-decorator]  # mypy sees the package as Any
def audit(target: str, baseline: str | None, clauses: tuple[str, ...], json_path: str | None,
          timeout: float, budget: int, jobs: int | None, reproducer_dir: str | None,
          picture_dir: str | None, quiet: bool, fail_on: str, formats: tuple[str, ...],
          outputs: tuple[str, ...]) -> None:
    """Audit real vLLM code (or a patched file) against the contract."""
    from kvcontract.tools.audit.command import THEOREM_TIMEOUT, run_audit_command
    from kvcontract.tools.audit.targets import resolve_target
    from kvcontract.tools.reports import pair_outputs

    # Every input is validated before any binding or check (issue #11).
    resolve_target(target)
    if baseline is not None:
        resolve_target(baseline)
    check_clauses(clauses)
    check_float("--timeout", timeout, low=0.0, high=THEOREM_TIMEOUT, unit="seconds")
    if timeout < MIN_TIMEOUT:
        raise UsageError(f"--timeout must be at least {MIN_TIMEOUT:g} seconds, not {timeout:g}")
    if budget < 1:
        raise UsageError(f"--budget must be a positive number of cases, not {budget}")
    check_jobs(jobs)
    failing = parse_fail_on(fail_on)
    pairs = pair_outputs(formats, outputs)
    check_report_outputs(pairs, json_path)
    for option, folder in (("--reproducers", reproducer_dir), ("--pictures", picture_dir)):
        if folder is not None:
            check_output_folder(option, folder)
    if json_path:
        pairs.append(("json", json_path))
    data = run_audit_command(
        target, baseline=baseline, clauses=clauses, call_timeout=timeout, budget=budget,
        fail_on=failing,
        jobs=jobs, reproducer_dir=reproducer_dir, picture_dir=picture_dir, quiet=quiet,
        to_stderr=any(path is None for _, path in pairs),
    )
    emit_reports(data, pairs)
    sys.exit(int(data["exit_code"]))
