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
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.tools.commands._common import (
    baseline_file_options,
    check_clauses,
    check_gate,
    check_jobs,
    check_report_outputs,
    emit_reports,
    finding_line,
    finish_gate,
    gate_fail_on_option,
    geometry_options,
    make_console,
    parse_gate_fail_on,
    print_gate,
    print_scope,
    report_options,
    resolve_geometries,
    results_table,
)

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
@click.option("--impl", "impl_name", default="reference", show_default=True,
              help=f"implementation to check: {', '.join(variant_names())}, or "
                   "module:FILE.py (functions of impl/reference.py over the reference), "
                   "package.module:NAME (an Implementation) or an installed entry point's "
                   "name (group kvcontract.implementations)")
@click.option("--clause", "clauses", multiple=True, metavar="ID",
              help="only this clause (repeatable), e.g. --clause C2")
@click.option("--json", "json_path", metavar="FILE", help="write the JSON report here")
@click.option("--jobs", type=int, default=None, help="worker processes (default: one per core)")
@click.option("--quiet", is_flag=True, help="no table, only the summary line")
@click.option("--no-cache", "no_cache", is_flag=True,
              help="neither read nor write the proof cache (by default a theorem whose "
                   "sources, versions, scope and budgets are unchanged is not proved "
                   "again: $KVCONTRACT_CACHE_DIR, else ~/.cache/kvcontract/proofs)")
@click.option("--shard", "shard_text", metavar="I/N", default=None,
              help="prove only shard I of N (1-based; a static, deterministic split of "
                   "the selected theorems); join the shards' JSON reports with "
                   "`kvcontract merge`")
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
    from kvcontract.api import register_implementation
    from kvcontract.proofs.cache import ProofCache, cache_dir
    from kvcontract.proofs.runner import prove as run_prove
    from kvcontract.proofs.runner import select
    from kvcontract.proofs.shards import parse_shard
    from kvcontract.tools.config import apply_config
    from kvcontract.tools.reports import pair_outputs
    from kvcontract.tools.reports.gate import gate_exit_code, gate_summary

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
    check_clauses(clauses, prover=True)
    check_jobs(jobs)
    failing, only_new = parse_gate_fail_on(fail_on)
    pairs = pair_outputs(formats, outputs)
    check_report_outputs(pairs, json_path, [("--write-baseline", write_baseline)]
                         if write_baseline else None)
    baseline = check_gate(only_new, baseline_file, write_baseline)
    scope = resolve_geometries(models, geometry_files, bpcs, retentions)
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

        report = run_prove(impl_name, clauses or None, jobs=jobs, on_result=advance,
                           fail_on=failing, geometries=scope,
                           cache=None if no_cache else ProofCache(cache_dir()),
                           shard=shard, fail_fast=fail_fast)
    data = report.to_json()
    add_defects(data, impl_name, json_path)
    finish_gate(data, baseline, only_new=only_new, write_baseline=write_baseline)
    data["exit_code"] = gate_exit_code(data["results"], failing, only_new)
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


ROOT_CAUSE_CPU_SECONDS = 600.0
"""CPU seconds the child that locates the counterexamples' root causes may use (a
safety net: each is a handful of integer replays)."""


def add_defects(data: dict[str, Any], impl_name: str, report_file: str | None = None) -> None:
    """A prove report's counterexamples grouped into defects by root cause (the fields
    whose replacement by the reference removes each: ``tools/audit/root_cause``), and
    its per-clause summary; located in a sandbox child (the implementation's code runs
    again), nothing when every theorem holds."""
    from kvcontract.impl.variants import get_implementation
    from kvcontract.tools.audit.defects import attach_defects
    from kvcontract.tools.audit.root_cause import replay_root_cause
    from kvcontract.tools.audit.sandbox import run_jobs

    rows = [r for r in data["results"] if r["verdict"] == Verdict.COUNTEREXAMPLE.value
            and r.get("witness")]
    if not rows:
        return
    impl = get_implementation(impl_name)

    def job() -> dict[str, Any]:
        return {"causes": [replay_root_cause(f"{r['clause']}/{r['theorem']}", r["witness"],
                                             impl) for r in rows]}

    outcome = run_jobs([("root causes", job)], workers=1, job_timeout=ROOT_CAUSE_CPU_SECONDS,
                       call_timeout=None)["root causes"]
    if outcome.ok and outcome.value is not None:
        for row, cause in zip(rows, outcome.value["causes"], strict=True):
            if cause is not None:
                row["root_cause"] = cause
    attach_defects(data, report_file)


def _shard_gate(context: click.Context, fail_on: str, baseline_file: str | None,
                write_baseline: str | None) -> tuple[str, str | None]:
    """A shard proves part of the selection, so it cannot tell a fixed finding from one
    another shard checks: the findings baseline is applied once, by `kvcontract merge`.
    Given on the command line, the gate options are a usage error; from
    ``[tool.kvcontract]`` they are left to the merge (which reads the same table)."""
    from kvcontract.tools.commands._common import NEW_WORD

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
