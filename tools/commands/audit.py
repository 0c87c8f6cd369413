"""``kvcontract audit``: real vLLM code (or a patched file) against the contract."""

from __future__ import annotations

import sys

import click
from kvcontract.tools.commands._common import (
    emit_reports,
    fail_on_option,
    parse_fail_on,
    report_options,
)


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
    from kvcontract.tools.audit.command import run_audit_command
    from kvcontract.tools.reports import pair_outputs

    pairs = pair_outputs(formats, outputs)
    if json_path:
        pairs.append(("json", json_path))
    data = run_audit_command(
        target, baseline=baseline, clauses=clauses, call_timeout=timeout, budget=budget,
        fail_on=parse_fail_on(fail_on),
        jobs=jobs, reproducer_dir=reproducer_dir, picture_dir=picture_dir, quiet=quiet,
        to_stderr=any(path is None for _, path in pairs),
    )
    emit_reports(data, pairs)
    sys.exit(int(data["exit_code"]))
