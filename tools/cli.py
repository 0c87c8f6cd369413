"""The ``kvcontract`` command line (the only module that parses arguments).

Exit codes (every verifying command):

    0  every theorem PROVED or PROVED-FOR-DOMAIN / the fuzzer found nothing
    1  a COUNTEREXAMPLE (or a fuzzing difference)
    2  usage or input error (unknown clause or target, bad file, impossible geometry)
    3  UNKNOWN or VACUOUS somewhere, and no counterexample
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from kvcontract.impl.variants import VARIANTS, variant_names
from kvcontract.proofs.verdicts import EXIT_USAGE, TheoremResult, Verdict
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvcontract.errors import KvContractError, UsageError

_STYLE = {
    Verdict.PROVED: "green",
    Verdict.PROVED_FOR_DOMAIN: "green",
    Verdict.TESTED: "cyan",
    Verdict.COUNTEREXAMPLE: "bold red",
    Verdict.UNKNOWN: "yellow",
    Verdict.VACUOUS: "yellow",
}


def _write_json(path: str, data: dict[str, Any]) -> None:
    try:
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write the JSON report to {path}: {exc.strerror}") from None


def _report_options(fn: Any) -> Any:
    """``--format`` / ``--output`` of the verifying commands (see tools/reports.py)."""
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


def _emit_reports(data: dict[str, Any], pairs: list[tuple[str, str | None]]) -> None:
    """Render the versioned report in every requested format (stdout when no file)."""
    from kvcontract.tools.reports import render, write_text

    for fmt, path in pairs:
        text = render(data, fmt)
        if path is None:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            write_text(path, text)


def _results_table(results: list[TheoremResult], title: str) -> Table:
    table = Table(title=title, show_lines=False)
    for column in ("clause", "theorem", "verdict", "domain", "rlimit", "seconds"):
        if column in ("rlimit", "seconds"):
            table.add_column(column, overflow="fold", justify="right")
        else:
            table.add_column(column, overflow="fold", justify="left")
    for r in results:
        table.add_row(
            r.clause, r.theorem, f"[{_STYLE[r.verdict]}]{r.verdict.value}[/]",
            r.domain, f"{r.rlimit_used:,}", f"{r.seconds:.2f}",
        )
    return table


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvcontract")
def cli() -> None:
    """Prove and test the KV-offloading coverage contract of sliding-window attention."""


@cli.command()
@click.option("--impl", "impl_name", default="reference", show_default=True,
              help=f"implementation to check: {', '.join(variant_names())}")
@click.option("--clause", "clauses", multiple=True, metavar="ID",
              help="only this clause (repeatable), e.g. --clause C2")
@click.option("--json", "json_path", metavar="FILE", help="write the JSON report here")
@click.option("--jobs", type=int, default=None, help="worker processes (default: one per core)")
@click.option("--quiet", is_flag=True, help="no table, only the summary line")
@_report_options
def prove(impl_name: str, clauses: tuple[str, ...], json_path: str | None,
          jobs: int | None, quiet: bool, formats: tuple[str, ...],
          outputs: tuple[str, ...]) -> None:
    """Prove every clause for an implementation (the reference by default)."""
    from kvcontract.proofs.runner import prove as run_prove
    from kvcontract.proofs.runner import select
    from kvcontract.tools.reports import pair_outputs

    pairs = pair_outputs(formats, outputs)
    to_stdout = any(path is None for _, path in pairs)
    console = Console(width=None if sys.stdout.isatty() else 200, stderr=to_stdout)
    total = len(select(clauses or None))
    with Progress(
        TextColumn("[bold]proving[/] {task.description}"), BarColumn(),
        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
        console=console, transient=True, disable=quiet or not console.is_terminal,
    ) as progress:
        task = progress.add_task(impl_name, total=total)

        def advance(result: TheoremResult, done: int, _total: int) -> None:
            progress.update(task, completed=done, description=f"{result.clause}/{result.theorem}")

        report = run_prove(impl_name, clauses or None, jobs=jobs, on_result=advance)
    if not quiet:
        console.print(_results_table(report.results, f"kvcontract prove --impl {impl_name}"))
        for r in report.results:
            if r.verdict is not Verdict.PROVED and not r.verdict.passed:
                console.print(
                    f"[{_STYLE[r.verdict]}]{r.clause}/{r.theorem}: {r.verdict.value}[/] "
                    f"{r.message}"
                )
                if r.witness:
                    console.print(f"  witness: {json.dumps(r.witness, sort_keys=True)}")
    counts: dict[str, int] = {}
    for r in report.results:
        counts[r.verdict.value] = counts.get(r.verdict.value, 0) + 1
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    console.print(
        f"{impl_name}: {len(report.results)} theorems over {len(report.clauses)} clauses in "
        f"{report.seconds:.1f}s: {summary}"
    )
    if json_path:
        pairs.append(("json", json_path))
    _emit_reports(report.to_json(), pairs)
    sys.exit(report.exit_code)


@cli.command()
@click.option("--impl", "impl_name", default="reference", show_default=True)
@click.option("--matrix", is_flag=True, help="run the full combination matrix")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--examples", type=int, default=200, show_default=True,
              help="Hypothesis state-machine examples")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_path", metavar="FILE", help="write the JSON report here")
@_report_options
def fuzz(impl_name: str, matrix: bool, device: str, examples: int, seed: int,
         json_path: str | None, formats: tuple[str, ...], outputs: tuple[str, ...]) -> None:
    """Differential fuzzing: mocked vs tensor-backed managers, against the spec."""
    from kvcontract.tools.fuzz import run_fuzz
    from kvcontract.tools.reports import pair_outputs

    if examples < 0:
        raise UsageError(f"--examples must be >= 0, not {examples}")
    pairs = pair_outputs(formats, outputs)
    console = Console(stderr=any(path is None for _, path in pairs))
    report = run_fuzz(impl_name, device=device, examples=examples, matrix=matrix, seed=seed)
    data = report.to_json()
    table = Table(title=f"kvcontract fuzz --impl {impl_name}")
    table.add_column("clause")
    table.add_column("checks", justify="right")
    for clause, count in sorted(data["per_clause"].items(), key=lambda kv: int(kv[0][1:])):
        table.add_row(clause, str(count))
    console.print(table)
    for diff in data["differences"]:
        console.print(f"[bold red]{diff['clause']}[/] {diff['kind']}: {diff['message']}")
        for line in diff.get("program", [])[:20]:
            console.print(f"    {line}")
    console.print(
        f"{impl_name}: {data['cases']} cases, {data['steps']} steps, "
        f"{len(data['differences'])} differences"
    )
    if json_path:
        pairs.append(("json", json_path))
    _emit_reports(data, pairs)
    sys.exit(report.exit_code)


@cli.command(name="gen-tests")
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
    from kvcontract.spec.clauses import get_clause
    from kvcontract.tools.gentests import (
        boundary_class_tests,
        index_json,
        reproducers,
        write_tests,
    )
    from kvcontract.tools.reports import load_report, write_text

    wanted = {get_clause(c).id for c in clauses}
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


@cli.command()
@click.option("--report", "report_path", metavar="FILE",
              help="draw witnesses of this JSON report (prove or audit)")
@click.option("--theorem", "theorems", multiple=True, metavar="ID",
              help="the result to draw, e.g. C2/first-run-covers-load (repeatable)")
@click.option("--all", "draw_all", is_flag=True,
              help="draw every counterexample of the report (the default with --report)")
@click.option("--impl", "impl_name", default=None,
              help="implementation to re-run on a witness (default: the report's target)")
@click.option("--geometry", "geometry_text", metavar="JSON|FILE",
              help="geometry as inline JSON or a JSON file (Geometry.to_dict shape)")
@click.option("--fa-block", type=int, default=None, help="full-attention group block size")
@click.option("--swa-block", type=int, default=None, help="sliding-window group block size")
@click.option("--sliding-window", type=int, default=None, help="sliding window (tokens)")
@click.option("--e", "extra", type=int, default=0, show_default=True,
              help="extra retained tokens (MTP)")
@click.option("--bpc", type=int, default=1, show_default=True, help="GPU blocks per chunk")
@click.option("--eagle", is_flag=True, help="the SWA group is an EAGLE group")
@click.option("--retention", type=int, default=None, help="prefix-cache retention interval")
@click.option("--tokens", type=int, default=None, help="tokens of the request")
@click.option("--hit", type=int, default=None, help="the boundary N (accepted hit, tokens)")
@click.option("--local", "local_hit", type=int, default=0, show_default=True,
              help="local GPU hit L (tokens)")
@click.option("--states", "states", multiple=True, metavar="G=LETTERS",
              help="lookup states of group G, one letter per chunk: H hit, P pending, "
                   "M miss, R retry (repeatable)")
@click.option("--png", "png_path", metavar="FILE", help="write a PNG picture here")
@click.option("--svg", "svg_path", metavar="FILE", help="write an SVG picture here")
@click.option("--out", "out_dir", metavar="DIR",
              help="write NAME.png and NAME.svg per drawn scene into DIR")
@click.option("--quiet", is_flag=True, help="no terminal rendering")
def explain(report_path: str | None, theorems: tuple[str, ...], draw_all: bool,
            impl_name: str | None, geometry_text: str | None, fa_block: int | None,
            swa_block: int | None, sliding_window: int | None, extra: int, bpc: int,
            eagle: bool, retention: int | None, tokens: int | None, hit: int | None,
            local_hit: int, states: tuple[str, ...], png_path: str | None,
            svg_path: str | None, out_dir: str | None, quiet: bool) -> None:
    """Draw a scenario or a counterexample on the token axis (terminal, PNG, SVG)."""
    from kvcontract.impl.variants import get_implementation
    from kvcontract.spec.geometry import Geometry, fa, swa
    from kvcontract.tools.explain import (
        build_scene,
        draw,
        parse_geometry,
        parse_states,
        render_terminal,
        scene_from_result,
        slug,
    )
    from kvcontract.tools.reports import load_report

    from kvcontract.errors import InputFileError

    scenes: list[tuple[str, Any]] = []
    if report_path:
        data = load_report(report_path)
        impl = get_implementation(impl_name or str(data["target"]))
        results = data.get("results", [])
        if theorems:
            for wanted in theorems:
                match = [r for r in results
                         if wanted in (f"{r.get('clause')}/{r.get('theorem')}", r.get("theorem"))]
                if not match:
                    known = [f"{r.get('clause')}/{r.get('theorem')}" for r in results
                             if r.get("witness")]
                    raise InputFileError(
                        report_path,
                        f"no result for theorem {wanted!r}; results with a witness: "
                        + (", ".join(known) or "none"),
                    )
                scenes += [(f"{r['clause']}/{r['theorem']}", scene_from_result(r, impl))
                           for r in match]
        else:
            drawable = [r for r in results
                        if r.get("verdict") == "COUNTEREXAMPLE" and r.get("witness")]
            for r in drawable:
                scenes.append((f"{r['clause']}/{r['theorem']}", scene_from_result(r, impl)))
            if not drawable:
                click.echo(f"{report_path}: no counterexample to draw")
                return
    else:
        if geometry_text:
            geometry = parse_geometry(geometry_text)
        else:
            if swa_block is None or sliding_window is None:
                raise UsageError(
                    "give --geometry, or --swa-block and --sliding-window (and optionally "
                    "--fa-block, --e, --bpc, --eagle, --retention), or --report"
                )
            groups = ([fa(fa_block)] if fa_block is not None else []) + [
                swa(swa_block, sliding_window, extra, eagle=eagle)
            ]
            geometry = Geometry(tuple(groups), blocks_per_chunk=bpc,
                                retention_interval=retention)
        if tokens is None:
            raise UsageError("--tokens N is required with a geometry")
        parsed = parse_states(states)
        for g in parsed:
            if g >= len(geometry.groups):
                raise UsageError(
                    f"--states {g}=...: the geometry has {len(geometry.groups)} groups"
                )
        scenes.append(("scenario", build_scene(geometry, tokens, hit, local_hit,
                                               states=parsed or None)))
    if (png_path or svg_path) and len(scenes) > 1:
        raise UsageError(f"{len(scenes)} scenes to draw: use --out DIR instead of --png/--svg")
    console = Console(width=None if sys.stdout.isatty() else 160)
    for name, scene in scenes:
        paths = [p for p in (png_path, svg_path) if p]
        if out_dir:
            paths += [str(Path(out_dir) / f"{slug(name)}.{ext}") for ext in ("png", "svg")]
        written = draw(scene, paths) if paths else []
        if not quiet:
            console.print(render_terminal(scene))
            console.print()
        for path in written:
            click.echo(f"wrote {path}")


@cli.command()
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
@click.option("--budget", type=float, default=8.0, show_default=True,
              help="seconds of concrete search per theorem (grids, sampled cases)")
@click.option("--jobs", type=int, default=None, help="worker processes (default: one per core)")
@click.option("--reproducers", "reproducer_dir", metavar="DIR", default=None,
              help="write a pytest reproducer per counterexample into DIR")
@click.option("--pictures", "picture_dir", metavar="DIR", default=None,
              help="draw each counterexample into DIR (PNG and SVG)")
@click.option("--quiet", is_flag=True, help="no tables, only the summary line")
@_report_options
def audit(target: str, baseline: str | None, clauses: tuple[str, ...], json_path: str | None,
          timeout: float, budget: float, jobs: int | None, reproducer_dir: str | None,
          picture_dir: str | None, quiet: bool, formats: tuple[str, ...],
          outputs: tuple[str, ...]) -> None:
    """Audit real vLLM code (or a patched file) against the contract."""
    from kvcontract.tools.audit.command import run_audit_command
    from kvcontract.tools.reports import pair_outputs

    pairs = pair_outputs(formats, outputs)
    if json_path:
        pairs.append(("json", json_path))
    data = run_audit_command(
        target, baseline=baseline, clauses=clauses, call_timeout=timeout, budget=budget,
        jobs=jobs, reproducer_dir=reproducer_dir, picture_dir=picture_dir, quiet=quiet,
        to_stderr=any(path is None for _, path in pairs),
    )
    _emit_reports(data, pairs)
    sys.exit(int(data["exit_code"]))


@cli.command(name="list")
def list_command() -> None:
    """List the clauses, the theorems and the registered implementations."""
    from kvcontract.proofs.runner import catalog
    from kvcontract.spec.clauses import CLAUSES

    console = Console()
    table = Table(title="clauses and theorems")
    table.add_column("clause")
    table.add_column("theorem")
    table.add_column("kind")
    table.add_column("statement", overflow="fold")
    theorems = catalog()
    for clause in CLAUSES:
        own = [t for t in theorems if t.clause == clause.id]
        if not own:
            table.add_row(clause.id, "-", clause.proved_by, clause.statement)
        for t in own:
            table.add_row(clause.id, t.name, t.kind, t.description)
    console.print(table)
    impls = Table(title="implementations (--impl)")
    impls.add_column("name")
    impls.add_column("violates")
    impls.add_column("description", overflow="fold")
    for name, impl in VARIANTS.items():
        impls.add_row(name, ", ".join(impl.violates) or "-", impl.description)
    console.print(impls)


def main(argv: list[str] | None = None) -> None:
    """Entry point: maps kvcontract errors to exit code 2 with a one-line message."""
    try:
        cli.main(args=argv, prog_name="kvcontract", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        sys.exit(EXIT_USAGE)
    except KvContractError as exc:
        click.echo(f"kvcontract: error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    sys.exit(0)


if __name__ == "__main__":
    main()
