"""``kvcontract prove``: every clause for an implementation (the reference by default)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kvcontract.errors import UsageError
from kvcontract.impl.variants import variant_names
from kvcontract.options import resolve_geometries
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.tools.commands._common import (
    IMPL_FORMS,
    baseline_file_options,
    check_gate_outputs,
    clause_option,
    emit_reports,
    finding_line,
    gate_fail_on_option,
    geometry_options,
    impl_option,
    jobs_option,
    json_option,
    print_scope,
    quiet_option,
    report_options,
    results_table,
    shard_option,
)
from kvcontract.tools.reports.console import make_console
from kvcontract.tools.reports.gate import print_gate

WITNESS_SHOWN = 600
"""Characters of a witness printed under its finding: a lookup witness on a real
geometry lists every chunk's state (thousands of characters); the JSON report and the
other formats keep it whole."""


def shown_witness(witness: dict[str, object]) -> str:
    """The witness as JSON, cut to :data:`WITNESS_SHOWN` characters (saying so)."""
    text = json.dumps(witness, sort_keys=True)
    if len(text) <= WITNESS_SHOWN:
        return text
    return (f"{text[:WITNESS_SHOWN]}... ({len(text):,} characters; --json or --format "
            "json has it whole)")


@click.command()
@impl_option(f"implementation to check: {', '.join(variant_names())}, or {IMPL_FORMS}")
@clause_option("C2")
@json_option()
@jobs_option()
@quiet_option()
@click.option("--no-cache", "no_cache", is_flag=True,
              help="neither read nor write the proof cache (by default a theorem whose "
                   "sources, versions, scope and budgets are unchanged is not proved "
                   "again: $KVCONTRACT_CACHE_DIR, else ~/.cache/kvcontract/proofs)")
@shard_option("prove only shard I of N (1-based; a static, deterministic split of the "
              "selected theorems)")
@click.option("--fail-fast", "fail_fast", is_flag=True,
              help="stop at the first counterexample that fails the run (--fail-on); "
                   "the theorems not yet proved are listed as not run")
@geometry_options
@gate_fail_on_option
@baseline_file_options
@report_options
def prove(impl_name: str, clauses: tuple[str, ...], json_path: str | None,
          jobs: int | None, quiet: bool, no_cache: bool, shard_text: str | None,
          fail_fast: bool, models: tuple[str, ...],
          geometry_files: tuple[str, ...], bpcs: tuple[int, ...], retentions: tuple[str, ...],
          fail_on: str, baseline_file: str | None, write_baseline: str | None,
          formats: tuple[str, ...], outputs: tuple[str, ...]) -> None:
    """Prove every clause for an implementation (the reference by default).

    With --model or --geometry, the clauses are checked on those geometries instead of
    the built-in catalogues: the case families (lookup, store, end to end) on cases
    chosen around the geometries' chunk and window boundaries, the formula properties
    on their SWA groups' sizes (docs/usage.md, "Your model's geometry").

    Results are cached per theorem (docs/usage.md, "Proof cache, shards, fail-fast"): an
    unchanged theorem is read back, marked "cached": true in the JSON report.

    Defaults for --fail-on, --baseline-file, --jobs, --impl and --model come from
    [tool.kvcontract] of the nearest pyproject.toml (the command line wins)."""
    from kvcontract.api import prove_document, register_implementation, run_prove
    from kvcontract.options import prove_options
    from kvcontract.proofs.runner import select
    from kvcontract.proofs.shards import parse_shard
    from kvcontract.tools.config import apply_config
    from kvcontract.tools.reports.gate import gate_summary

    # Every input is validated before any proof runs (issue #11), the project's
    # [tool.kvcontract] defaults included.
    params: dict[str, Any] = {"impl_name": impl_name, "jobs": jobs, "models": models,
                              "geometry_files": geometry_files, "fail_on": fail_on,
                              "baseline_file": baseline_file}
    context = click.get_current_context()
    apply_config(context, params)
    impl_name, jobs, models = params["impl_name"], params["jobs"], params["models"]
    fail_on, baseline_file = params["fail_on"], params["baseline_file"]
    shard = parse_shard(shard_text)
    if shard is not None:
        fail_on, baseline_file = _shard_gate(context, fail_on, baseline_file, write_baseline)
    impl_name = register_implementation(impl_name)  # a name or module:FILE.py
    failing, only_new, baseline, pairs = check_gate_outputs(
        fail_on, baseline_file, write_baseline, formats, outputs, json_path)
    scope = resolve_geometries(models, geometry_files, bpcs, retentions)
    options = prove_options(impl_name, clauses=clauses, jobs=jobs, fail_on=failing,
                            scope=tuple(scope), cache=not no_cache, shard=shard,
                            fail_fast=fail_fast, only_new=only_new,
                            findings_baseline=baseline, write_baseline=write_baseline,
                            report_file=json_path)
    to_stdout = any(path is None for _, path in pairs)
    console = make_console(stderr=to_stdout)
    if scope:
        print_scope(console, scope, notes=not quiet)
    total = len(select(clauses or None, tuple(scope)))
    with Progress(
        TextColumn("[bold]proving[/] {task.description}"), BarColumn(),
        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
        console=console, transient=True, disable=quiet or not console.is_terminal,
    ) as progress:
        task = progress.add_task(impl_name, total=total)

        def advance(result: TheoremResult, done: int, _total: int) -> None:
            progress.update(task, completed=done, total=_total,
                            description=f"{result.clause}/{result.theorem}")

        report = run_prove(options, on_result=advance)
    data = prove_document(report, options)
    if not quiet:
        title = f"kvcontract prove --impl {impl_name}"
        if scope:
            title += " on " + ", ".join(label for label, _ in scope)
        if shard is not None:
            title += f" (shard {shard})"
        if data.get("defects"):
            from kvcontract.tools.reports.summary import summary_lines

            for text, style in summary_lines(data):
                console.print(f"[{style}]{escape(text)}[/]" if style else escape(text),
                              highlight=False, soft_wrap=True)
            console.print()
        console.print(results_table(report.results, title))
        for r, row in zip(report.results, data["results"], strict=True):
            if r.verdict is not Verdict.PROVED and not r.verdict.passed:
                console.print(finding_line(r, failing, row.get("baseline_state"), only_new))
                if r.witness:
                    console.print(f"  witness: {shown_witness(r.witness)}")
        print_gate(console, data)
    counts: dict[str, int] = {}
    for r in report.results:
        counts[r.verdict.value] = counts.get(r.verdict.value, 0) + 1
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    extra = ""
    if report.cached and any(report.cached):
        extra += f"; {sum(report.cached)} from the proof cache"
    if report.not_run:
        extra += f"; {len(report.not_run)} not run (--fail-fast)"
    if shard is not None:
        extra += f"; shard {shard}"
    console.print(
        f"{impl_name}: {len(report.results)} theorems over {len(report.clauses)} clauses in "
        f"{report.seconds:.1f}s: {summary}{gate_summary(data)}{extra}"
    )
    if json_path:
        pairs.append(("json", json_path))
    emit_reports(data, pairs)
    sys.exit(int(data["exit_code"]))


def _shard_gate(context: click.Context, fail_on: str, baseline_file: str | None,
                write_baseline: str | None) -> tuple[str, str | None]:
    """A shard proves part of the selection, so it cannot tell a fixed finding from one
    another shard checks: the findings baseline is applied once, by `kvcontract merge`.
    Given on the command line, the gate options are a usage error; from
    ``[tool.kvcontract]`` they are left to the merge (which reads the same table)."""
    from kvcontract.options import NEW_WORD

    def given(name: str) -> bool:
        return context.get_parameter_source(name) not in (
            click.core.ParameterSource.DEFAULT, click.core.ParameterSource.DEFAULT_MAP, None)

    words = [w.strip().lower() for w in fail_on.split(",") if w.strip()]
    explicit = [option for option, name, used in (
        ("--baseline-file", "baseline_file", baseline_file is not None),
        ("--write-baseline", "write_baseline", write_baseline is not None),
        ("--fail-on new", "fail_on", NEW_WORD in words)) if used and given(name)]
    if explicit:
        raise UsageError(f"{', '.join(explicit)} apply a findings baseline to the whole run, "
                         "not to one --shard: give them to `kvcontract merge` with the "
                         "shards' JSON reports instead")
    rest = [w for w in words if w != NEW_WORD]
    return (",".join(rest) if rest else "all") if NEW_WORD in words else fail_on, None
