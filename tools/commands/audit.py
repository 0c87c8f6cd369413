"""``kvcontract audit``: real vLLM code (or a patched file) against the contract."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import click

from kvcontract.errors import UsageError
from kvcontract.options import (
    resolve_geometries,
)
from kvcontract.tools.commands._common import (
    baseline_file_options,
    check_gate_outputs,
    check_output_folder,
    clause_option,
    emit_reports,
    gate_fail_on_option,
    geometry_options,
    jobs_option,
    json_option,
    print_scope,
    quiet_option,
    report_options,
    shard_option,
)


@click.command()
@click.option("--target", required=True, metavar="TARGET",
              help="vllm:PATH (checkout, unpacked wheel, site-packages), vllm:installed, "
                   "module:FILE.py, or builtin:NAME / a registered implementation")
@click.option("--base", "base_release", metavar="vllm:PATH|vllm:installed|VERSION|none",
              default=None,
              help="the release a module:FILE.py patch (or a tree lacking some audited "
                   "files) is laid over: every function it does not define is the base's "
                   "own code [default: the installed vLLM, else the newest release "
                   "fetched, else none]")
@click.option("--baseline", metavar="TARGET|git:REF", default=None,
              help="a second target, or git:REF (the target's own files at git revision "
                   "REF of the repository that holds them); classify each clause as fixed, "
                   "regressed or changed")
@clause_option("C3")
@json_option()
@click.option("--timeout", type=float, default=10.0, show_default=True,
              help="seconds of CPU time one upstream call may use (CPU time, so machine "
                   "load never changes a finding); a call past it, or one blocked without "
                   "using CPU for as long (at least 1.5 s of wall-clock time: the "
                   "watchdog), is stopped and not made again in that check: every theorem "
                   "that makes it is UNKNOWN, naming the call and the limit (exit 3, "
                   "unless a finding makes it 1)")
@click.option("--budget", type=int, default=250_000, show_default=True,
              help="cases of concrete search per theorem (enumeration, sampled cases): a "
                   "count, so the same audit finds the same things on any machine")
@jobs_option()
@click.option("--reproducers", "reproducer_dir", metavar="DIR", default=None,
              help="write a pytest reproducer per counterexample into DIR")
@click.option("--pictures", "picture_dir", metavar="DIR", default=None,
              help="draw each counterexample into DIR (PNG and SVG)")
@quiet_option("no tables, only the summary line")
@click.option("--verbose", "-v", is_flag=True,
              help="after the summary, the bindings, the theorem table and every witness")
@click.option("--live", is_flag=True,
              help="replay each defect's lost hits on the installed vLLM's own scheduler "
                   "and connector (confirmed / not reproduced / not replayable; needs the "
                   "[live] extra and vLLM: `kvcontract live --check`)")
@click.option("--judge", "judge_mode", type=click.Choice(["auto", "engine", "stand-ins"]),
              default="auto", show_default=True,
              help="who judges upstream's behaviour: vLLM's own engine (the target's vLLM "
                   "imported and run: its scheduler, managers and connector), or "
                   "kvcontract's stand-ins; auto: the engine where the target's vLLM "
                   "imports, else stand-ins, each of their findings marked unconfirmed; "
                   "engine: exit 3 when it cannot run")
@click.option("--catalogue-only", "catalogue_only", is_flag=True,
              help="do not measure each defect's cost on the model presets (the fast path: "
                   "the catalogue's theorems only)")
@click.option("--require-complete", "require_complete", is_flag=True,
              help="exit 3 when any theorem could not be checked (a function the target "
                   "lacks), even if every checked one holds")
@shard_option("check only shard I of N (1-based; a static, deterministic split of the "
              "theorems, family walks and system scenarios)")
@geometry_options
@gate_fail_on_option
@baseline_file_options
@report_options
def audit(target: str, base_release: str | None, baseline: str | None,
          clauses: tuple[str, ...], json_path: str | None,
          timeout: float, budget: int, jobs: int | None, reproducer_dir: str | None,
          picture_dir: str | None, quiet: bool, verbose: bool, live: bool,
          judge_mode: str, catalogue_only: bool,
          require_complete: bool,
          shard_text: str | None, models: tuple[str, ...],
          geometry_files: tuple[str, ...], bpcs: tuple[int, ...],
          retentions: tuple[str, ...], fail_on: str, baseline_file: str | None,
          write_baseline: str | None, formats: tuple[str, ...],
          outputs: tuple[str, ...]) -> None:
    """Audit real vLLM code (or a patched file) against the contract.

    With --model or --geometry, the clauses are checked on those geometries (the same
    scoped properties as `kvcontract prove --model`, upstream's own lookup loop and the
    executable system's seed scenarios included) instead of the built-in catalogues.

    With --shard I/N, only shard I of a deterministic split (README, "Proof cache,
    shards, fail-fast"); `kvcontract merge` joins the shards' JSON reports into the
    unsharded audit's report and applies the findings baseline there.

    Defaults for --fail-on, --baseline-file, --budget, --jobs, --model and
    --require-complete come from [tool.kvcontract] of the nearest pyproject.toml (the
    command line wins)."""
    from kvcontract.options import audit_request
    from kvcontract.proofs.shards import parse_shard
    from kvcontract.tools.audit.baseline import git_baseline_target, is_git_baseline
    from kvcontract.tools.audit.command import run_audit_command
    from kvcontract.tools.audit.targets import AUTO, resolve_target
    from kvcontract.tools.commands.prove import _shard_gate
    from kvcontract.tools.config import apply_config

    # Every input is validated before any binding or check (issue #11), the project's
    # [tool.kvcontract] defaults included.
    params: dict[str, Any] = {"budget": budget, "jobs": jobs, "models": models,
                              "geometry_files": geometry_files, "fail_on": fail_on,
                              "baseline_file": baseline_file,
                              "require_complete": require_complete}
    context = click.get_current_context()
    apply_config(context, params)
    budget, jobs, models = params["budget"], params["jobs"], params["models"]
    fail_on, baseline_file = params["fail_on"], params["baseline_file"]
    require_complete = params["require_complete"]
    shard = parse_shard(shard_text)
    if shard is not None:
        # As prove's shards: the findings baseline is the merge's (a configured one is
        # left to it), and a shard cannot be compared clause by clause with --baseline.
        fail_on, baseline_file = _shard_gate(context, fail_on, baseline_file, write_baseline)
        if baseline is not None:
            raise UsageError("--baseline compares whole audits clause by clause, not one "
                             "--shard: run the baseline comparison unsharded")
    resolved = resolve_target(target, base=AUTO if base_release is None else base_release)
    target = resolved.spec  # names the base it is laid over (``...@base=vllm:ROOT``)
    if baseline is not None and not is_git_baseline(baseline):
        # A baseline patch is laid over the same base as the target.
        baseline = resolve_target(baseline, base=(
            resolved.base.spec if resolved.base is not None else "none")).spec
    failing, only_new, findings_baseline, pairs = check_gate_outputs(
        fail_on, baseline_file, write_baseline, formats, outputs, json_path)
    for option, folder in (("--reproducers", reproducer_dir), ("--pictures", picture_dir)):
        if folder is not None:
            check_output_folder(option, folder)
    scope = resolve_geometries(models, geometry_files, bpcs, retentions)
    request = audit_request(
        fail_on=failing, clauses=clauses, timeout=timeout, budget=budget, jobs=jobs,
        scope=tuple(scope), shard=shard, judge_mode=judge_mode, costs=not catalogue_only,
        live=live, require_complete=require_complete, only_new=only_new,
        findings_baseline=findings_baseline, write_baseline=write_baseline,
        reproducer_dir=reproducer_dir, picture_dir=picture_dir, report_file=json_path)
    with contextlib.ExitStack() as stack:
        base: Any = baseline
        if baseline is not None and is_git_baseline(baseline):
            # git:REF: the target's files at that revision, read into a temporary tree
            # now (a bad revision, or a target outside a repository, is exit 2 before
            # any work); the checkout is not touched.
            import tempfile
            from pathlib import Path

            tree = Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="kvcontract-git-")))
            base = git_baseline_target(baseline, resolved, tree)
        # Every input is valid: what the target is laid over (a usage error stays one line).
        for note in resolved.notes:
            click.echo(f"note: {note}", err=True)
        to_stderr = any(path is None for _, path in pairs)
        if scope and not quiet:
            from kvcontract.tools.reports.console import make_console

            print_scope(make_console(stderr=to_stderr),
                        scope)
        if json_path:
            pairs.append(("json", json_path))
        data = run_audit_command(target, request, baseline=base, quiet=quiet,
                                 to_stderr=to_stderr, verbose=verbose)
    emit_reports(data, pairs)
    sys.exit(int(data["exit_code"]))
