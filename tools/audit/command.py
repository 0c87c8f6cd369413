"""What ``kvcontract audit`` does, kept out of the CLI module (which only parses options)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kvcontract.errors import UsageError
from kvcontract.proofs.shards import Shard
from kvcontract.spec.clauses import get_clause
from kvcontract.spec.geometry import Geometry
from kvcontract.tools.audit.binding import bind
from kvcontract.tools.audit.engine import AuditOptions, AuditRun, run_audit
from kvcontract.tools.audit.lifecycle_stage import lifecycle_section, print_lifecycle
from kvcontract.tools.audit.on_engine import CONFLICT
from kvcontract.tools.audit.report import build_report, print_bindings, print_report
from kvcontract.tools.audit.roles import Binding
from kvcontract.tools.audit.targets import Target, resolve_target
from kvcontract.tools.reports.gate import FindingsBaseline
from kvcontract.vocabulary import (
    DEFAULT_FAIL_ON,
    EXIT_OK,
    EXIT_UNKNOWN,
    Impact,
    Verdict,
    worst_exit_code,
)

THEOREM_TIMEOUT = 1800.0
"""Seconds of CPU time a theorem's child process may use before the kernel stops it
(reported UNKNOWN, never a verdict; ``sandbox``). A safety net only, set far above any
measured run (the whole `--model all` audit of 0.33.0 uses 221 s across all its checks): what
an audit finds is bounded by counted cases (``--budget``), and CPU time, unlike
wall-clock time, does not grow with the machine's load."""


def audit_options(clauses: Sequence[str], call_timeout: float, budget: int,
                  jobs: int | None, geometries: Sequence[tuple[str, Geometry]] = (),
                  shard: Shard | None = None, judge_mode: str = "auto") -> AuditOptions:
    """The engine's options (validated by :func:`kvcontract.options.audit_request`)."""
    return AuditOptions(clauses=list(clauses) or None, call_timeout=call_timeout,
                        budget=budget, jobs=jobs,
                        theorem_timeout=THEOREM_TIMEOUT,
                        geometries=tuple((str(label), g) for label, g in geometries),
                        shard=shard, judge_mode=judge_mode)


def attach_engine(binding: Binding, options: AuditOptions, *, second: bool = False) -> None:
    """vLLM's own engine as the judge of ``binding``'s target (imported in this process
    before any check forks), or why not; ``--judge engine`` without one raises
    :class:`~kvcontract.errors.EngineUnavailableError` (exit 3). ``second``: a baseline
    target, judged by the engine only when it can run beside the first (one process runs
    one vLLM), else on stand-ins, said so."""
    from kvcontract.errors import EngineUnavailableError
    from kvcontract.tools.audit.on_engine import prepare_engine

    engine, why = prepare_engine(binding.target, options.judge_mode)
    binding.engine, binding.engine_why = engine, why
    binding.engine_fallback = engine is None and options.judge_mode != "stand-ins" and \
        binding.target.kind != "builtin"
    if engine is None and options.judge_mode == "engine" and not second:
        raise EngineUnavailableError(f"--judge engine: vLLM's engine cannot judge "
                                     f"{binding.target.display()}: {why}")


def _run(console: Console | None, binding: Binding, options: AuditOptions,
         quiet: bool) -> AuditRun:
    if console is None:
        return run_audit(binding, options)
    with Progress(
        TextColumn("[bold]auditing[/] {task.description}"), BarColumn(),
        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
        console=console, transient=True, disable=quiet or not console.is_terminal,
    ) as progress:
        task = progress.add_task(binding.target.name, total=None)

        def advance(row: dict[str, Any], done: int, total: int) -> None:
            progress.update(task, completed=done, total=total,
                            description=f"{row['clause']}/{row['theorem']}")

        return run_audit(binding, options, advance)


def draw_pictures(binding: Binding, report: dict[str, Any], out_dir: str,
                  options: AuditOptions) -> list[str]:
    """A PNG and an SVG per counterexample (``tools/explain.py``), drawn in a sandbox
    child because the scene re-runs the bound upstream functions on the witness."""
    from pathlib import Path

    from kvcontract.tools.audit.engine import UPSTREAM_LOOKUP
    from kvcontract.tools.audit.sandbox import run_jobs

    directory = Path(out_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {directory}: {exc.strerror}") from None
    rows = [r for r in report["results"]
            if r["verdict"] == Verdict.COUNTEREXAMPLE and r.get("witness")]
    notes = report.setdefault("picture_notes", [])

    def job() -> dict[str, Any]:
        from kvcontract.tools.explain import draw, scene_from_result, slug

        written: list[str] = []
        skipped: list[str] = []
        impl = binding.implementation
        assert impl is not None
        for row in rows:
            name = f"{row['clause']}/{row['theorem']}"
            if row["theorem"].startswith(UPSTREAM_LOOKUP):
                skipped.append(f"{name}: upstream's own loop (the scene would redraw "
                               "kvcontract's lookup over the bound primitives)")
                continue
            try:
                scene = scene_from_result(row, impl)
                paths = [directory / f"{slug(name)}.{ext}" for ext in ("png", "svg")]
                written += [str(p) for p in draw(scene, paths)]
            except Exception as exc:
                skipped.append(f"{name}: {type(exc).__name__}: {exc}")
        return {"written": written, "skipped": skipped}

    outcome = run_jobs([("pictures", job)], workers=1, job_timeout=options.theorem_timeout,
                       call_timeout=options.call_timeout)["pictures"]
    if not outcome.ok or outcome.value is None:
        notes.append(f"pictures: {outcome.error.splitlines()[0]}")
        return []
    notes.extend(outcome.value["skipped"])
    return list(outcome.value["written"])


def run_audit_command(target: str, request: AuditRequest, *,
                      baseline: str | Target | None = None, quiet: bool = False,
                      to_stderr: bool = False, verbose: bool = False) -> dict[str, Any]:
    """Bind, check, compare and print; returns the versioned report (with ``exit_code``).
    ``request``: the options, validated once (:func:`kvcontract.options.audit_request`;
    its ``scope``, the ``--model``/``--geometry`` pairs, scopes the checks).

    ``baseline`` is a target string, ``git:REF`` (the target's files at that revision,
    :func:`~kvcontract.tools.audit.baseline.git_baseline_target`) or a resolved
    :class:`Target`. A shard (``request.options.shard``) checks part of the run, so a
    findings baseline and ``--baseline``, which compare a whole run, are refused with it.
    ``verbose`` prints the bindings and the theorem table after the summary."""
    if request.options.shard is not None:
        _check_shard_options(baseline, request.only_new, request.findings_baseline,
                             request.write_baseline)
    from kvcontract.tools.reports.console import make_console

    console = make_console(stderr=to_stderr)
    with contextlib.ExitStack() as stack:
        resolved = resolve_target(target)
        resolved_baseline = _baseline_target(baseline, resolved, stack)
        return _audit(console, resolved, resolved_baseline, request, quiet=quiet,
                      verbose=verbose)


def _check_shard_options(baseline: str | Target | None, only_new: bool,
                         findings_baseline: FindingsBaseline | None,
                         write_baseline: str | None) -> None:
    """A shard checks part of the run: it can neither classify clauses against another
    target nor tell a fixed finding from one another shard checks."""
    if baseline is not None and baseline != "":
        raise UsageError("--baseline compares whole audits clause by clause, not one "
                         "--shard: run the baseline comparison unsharded")
    if only_new or findings_baseline is not None or write_baseline is not None:
        raise UsageError("--baseline-file, --write-baseline and --fail-on new apply a "
                         "findings baseline to the whole run, not to one --shard: give "
                         "them to `kvcontract merge` with the shards' JSON reports instead")


def _baseline_target(baseline: str | Target | None, resolved: Target,
                     stack: contextlib.ExitStack) -> Target | None:
    """The ``--baseline`` as a target (``git:REF`` read into a temporary tree that
    ``stack`` removes)."""
    if baseline is None or isinstance(baseline, Target):
        return baseline
    if not baseline:
        return None
    from kvcontract.tools.audit.baseline import git_baseline_target, is_git_baseline

    if is_git_baseline(baseline):
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvcontract-git-")))
        return git_baseline_target(baseline, resolved, folder)
    return resolve_target(baseline)


@dataclass(frozen=True)
class AuditRequest:
    """Everything one audit does besides printing, validated once (the CLI's options,
    ``kvcontract.api.audit``'s arguments): :func:`produce_report` builds the same JSON
    document from it whoever asks."""

    options: AuditOptions
    fail_on: frozenset[Impact] = DEFAULT_FAIL_ON
    reproducer_dir: str | None = None
    picture_dir: str | None = None
    only_new: bool = False
    findings_baseline: FindingsBaseline | None = None
    write_baseline: str | None = None
    require_complete: bool = False
    costs: bool = True
    report_file: str | None = None
    live: bool = False


def produce_report(resolved: Target, resolved_baseline: Target | None,
                   request: AuditRequest, *, console: Console | None = None,
                   quiet: bool = True, verbose: bool = False) -> dict[str, Any]:
    """The audit's report: bind, the engine as judge where it runs, the checks, the
    baseline comparison, costs, ``--live``, the lifecycle, the gate, reproducers and
    pictures. ``console`` (the CLI's) shows progress and, ``verbose``, the bindings;
    nothing is printed without one."""
    options = request.options
    show = console is not None and not quiet
    binding = bind(resolved)
    attach_engine(binding, options)
    if binding.engine is None and binding.engine_why.startswith(CONFLICT):
        # One process runs one vLLM: the target's runs in a fresh interpreter.
        return _in_fresh_process(resolved, resolved_baseline, request)
    if show and verbose:
        assert console is not None
        print_bindings(console, build_report(binding, AuditRun([], [], 0.0)))
    run = _run(console, binding, options, quiet)
    comparison = None
    if resolved_baseline is not None:
        from kvcontract.tools.audit.baseline import compare

        base_binding = bind(resolved_baseline)
        attach_engine(base_binding, options, second=True)
        if show and verbose:
            assert console is not None
            print_bindings(console, build_report(base_binding, AuditRun([], [], 0.0)))
        base_run = _run(console, base_binding, options, quiet)
        comparison = compare(base_binding, base_run, binding, run, options)
        from kvcontract.tools.audit.defects import compare_defects, group_defects

        comparison["defects"] = compare_defects(group_defects(base_run.rows),
                                                group_defects(run.rows))
    report: dict[str, Any] = build_report(binding, run, comparison, request.fail_on,
                                          request.report_file)
    if request.costs and options.shard is None and resolved.kind != "builtin":
        from kvcontract.tools.audit.cost_stage import cost_defects

        cost_defects(binding, report, options)
    elif not request.costs:
        report["notes"].append("defects not costed on the model presets (--catalogue-only)")
    elif resolved.kind == "builtin":
        # As `prove` on the same implementation: the costs are upstream code's, on the
        # presets (`benchmarks/lost_hits.py` measures the built-in ones).
        report["notes"].append("defects of a built-in implementation are not costed on "
                               "the model presets (benchmarks/lost_hits.py measures them)")
    if request.live:
        from kvcontract.tools.audit.live_stage import confirm_defects

        confirm_defects(report, options)
    # The lifecycle on vLLM itself, before the gate: its findings count.
    lifecycle_section(report, live=request.live or binding.engine is not None,
                      report_file=request.report_file,
                      clauses=[get_clause(c).id for c in options.clauses or ()],
                      engine=binding.engine, call_timeout=options.call_timeout)
    apply_gate(report, request.fail_on, request.only_new, request.findings_baseline,
               request.write_baseline, request.require_complete)
    if options.geometries:
        from kvcontract.spec.properties.scoped import describe_scope

        report["geometries"] = describe_scope(options.geometries)
    if request.reproducer_dir:
        from kvcontract.tools.audit.reproduce import write_reproducers

        written = write_reproducers(report, request.reproducer_dir)
        report["reproducers"] = [str(p) for p in written]
    if request.picture_dir:
        report["pictures"] = draw_pictures(binding, report, request.picture_dir, options)
    return report


def fresh_audit_main() -> None:
    """The fresh interpreter's side of :func:`_in_fresh_process`: the pickled request on
    stdin, the pickled ``("ok", report)`` or ``("error", exception)`` into the file
    named by the first argument."""
    import pickle
    import sys

    resolved, resolved_baseline, request = pickle.loads(sys.stdin.buffer.read())
    try:
        result: tuple[str, Any] = ("ok", produce_report(resolved, resolved_baseline,
                                                        request))
    except BaseException as exc:  # the parent re-raises it as the audit's own failure
        result = ("error", exc)
    with open(sys.argv[1], "wb") as handle:
        pickle.dump(result, handle)


def _in_fresh_process(resolved: Target, resolved_baseline: Target | None,
                      request: AuditRequest) -> dict[str, Any]:
    """:func:`produce_report` in a fresh interpreter (no vLLM imported yet there): its
    report, or its error raised here."""
    import pickle
    import subprocess
    import sys

    with tempfile.TemporaryDirectory(prefix="kvcontract-audit-") as folder:
        out = Path(folder) / "report.pickle"
        done = subprocess.run(
            [sys.executable, "-c", "from kvcontract.tools.audit.command import "
             "fresh_audit_main; fresh_audit_main()", str(out)],
            input=pickle.dumps((resolved, resolved_baseline, request)), check=False)
        if not out.exists():
            raise RuntimeError(f"the audit's fresh process ended without a report (exit "
                               f"code {done.returncode})")
        status, payload = pickle.loads(out.read_bytes())
    if status == "error":
        raise payload
    report: dict[str, Any] = payload
    return report


def _audit(console: Console, resolved: Target, resolved_baseline: Target | None,
           request: AuditRequest, *, quiet: bool, verbose: bool = False) -> dict[str, Any]:
    report = produce_report(resolved, resolved_baseline, request, console=console,
                            quiet=quiet, verbose=verbose)
    if quiet:
        from kvcontract.tools.reports.gate import gate_summary

        shard = report.get("shard")
        defects = report.get("defects") or []
        # One line, never wrapped: the target's path is copied from it.
        console.print(escape(
            f"{report['target']}: exit code {report['exit_code']} "
            f"({len(defects)} defects, {len(report['results'])} theorems, "
            f"{report['seconds']:.1f}s{gate_summary(report)}"
            + (f"; shard {shard['index']}/{shard['count']}" if shard else "") + ")"),
            highlight=False, soft_wrap=True)
    else:
        print_report(console, report, show_bindings=False, verbose=verbose)
        for path in [*report.get("reproducers", []), *report.get("pictures", [])]:
            console.print(f"wrote {path}", highlight=False)
        for line in report.get("picture_notes", []):
            console.print("[yellow]no picture[/] " + escape(line), highlight=False)
        from kvcontract.tools.reports.gate import print_gate

        print_gate(console, report)
        if report.get("require_complete") and report["unchecked"]:
            console.print(escape(f"--require-complete: {len(report['unchecked'])} theorems "
                                 "were not checked (listed above): exit 3 unless a finding "
                                 "fails the run"), highlight=False)
    if not quiet and "lifecycle" in report:
        print_lifecycle(console, report["lifecycle"])
    return report


def apply_gate(report: dict[str, Any], fail_on: frozenset[Impact], only_new: bool,
               findings_baseline: FindingsBaseline | None, write_baseline: str | None,
               require_complete: bool) -> None:
    """The findings baseline and ``--require-complete`` applied to a built report: its
    findings marked, the baseline written, and its ``exit_code`` recomputed (as
    :func:`~kvcontract.tools.audit.report.build_report` does, with the gate). Also what
    ``kvcontract merge`` applies to merged audit shards."""
    from kvcontract.tools.reports.gate import finish_gate, gate_exit_code

    finish_gate(report, findings_baseline, only_new=only_new, write_to=write_baseline)
    # An audit that checked nothing is undecided (3), but a shard given no units of
    # work (more shards than units) decides nothing by design: the merge's code counts.
    idle_shard = (report.get("shard") or {}).get("positions") == []
    codes = [gate_exit_code(report["results"], fail_on, only_new,
                            empty=EXIT_OK if idle_shard else EXIT_UNKNOWN)]
    comparison = report.get("comparison")
    if comparison is not None:
        codes.append(int(comparison.get("exit_code", EXIT_OK)))
    if require_complete:
        report["require_complete"] = True
        if report["unchecked"]:
            codes.append(EXIT_UNKNOWN)
    report["exit_code"] = worst_exit_code(codes)
