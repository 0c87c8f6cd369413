"""What several commands share: the ``--format``/``--output`` options, emitting the
rendered reports, and the rich table of theorem results."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from kvcontract.errors import UsageError
from kvcontract.options import (
    MAX_CASE_SIZE,
    MAX_WITNESS_DEPTH,
    nesting_depth,
    oversized_value,
    parse_gate_fail_on,
)
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.vocabulary import DEFAULT_FAIL_ON_TEXT, Impact

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
        "--fail-on", "fail_on", default=DEFAULT_FAIL_ON_TEXT, show_default=True,
        metavar="IMPACT,...",
        help="impacts whose findings fail the run (exit 1): crash, corruption, lost-hit, "
             "delay, waste, latent, or all; other findings are reported and pass",
    )(fn)


def gate_fail_on_option(fn: F) -> F:
    """``--fail-on IMPACT,...[,new]`` of ``prove`` and ``audit`` (the pull-request gate)."""
    return click.option(
        "--fail-on", "fail_on", default=DEFAULT_FAIL_ON_TEXT, show_default=True,
        metavar="IMPACT,...",
        help="impacts whose findings fail the run (exit 1): crash, corruption, lost-hit, "
             "delay, waste, latent, or all; other findings are reported and pass. Add new "
             "(alone: any impact) to fail only on findings not in --baseline-file",
    )(fn)


def json_option(help: str = "write the JSON report here") -> Callable[[F], F]:
    """``--json FILE``."""
    return click.option("--json", "json_path", metavar="FILE", help=help)


def jobs_option(help: str = "worker processes (default: one per core)",
                metavar: str | None = None) -> Callable[[F], F]:
    """``--jobs N`` (None: one per core; :func:`kvcontract.options.check_jobs`)."""
    return click.option("--jobs", type=int, default=None, metavar=metavar, help=help)


def quiet_option(help: str = "no table, only the summary line") -> Callable[[F], F]:
    """``--quiet``."""
    return click.option("--quiet", is_flag=True, help=help)


def clause_option(example: str) -> Callable[[F], F]:
    """``--clause ID`` (repeatable; :func:`kvcontract.options.check_clauses`)."""
    return click.option("--clause", "clauses", multiple=True, metavar="ID",
                        help=f"only this clause (repeatable), e.g. --clause {example}")


def shard_option(what: str) -> Callable[[F], F]:
    """``--shard I/N`` (:func:`kvcontract.proofs.shards.parse_shard`): ``what`` says
    what is split."""
    return click.option("--shard", "shard_text", metavar="I/N", default=None,
                        help=f"{what}; join the shards' JSON reports with `kvcontract merge`")


def impl_option(help: str, *, dest: str = "impl_name",
                metavar: str | None = None) -> Callable[[F], F]:
    """``--impl`` (default ``reference``)."""
    return click.option("--impl", dest, default="reference", show_default=True,
                        metavar=metavar, help=help)


IMPL_FORMS = ("module:FILE.py (functions of impl/reference.py over the reference), "
              "package.module:NAME (an Implementation) or an installed entry point's "
              "name (group kvcontract.implementations)")
"""What ``--impl`` of prove and fuzz takes besides a registered name."""


def baseline_file_options(fn: F) -> F:
    """``--baseline-file FILE`` and ``--write-baseline FILE`` (tools/reports/gate.py)."""
    fn = click.option(
        "--write-baseline", "write_baseline", metavar="FILE", default=None,
        help="write this run's findings as a findings baseline (JSON, by fingerprint) to "
             "FILE; commit it and gate later runs with --baseline-file FILE --fail-on new",
    )(fn)
    return click.option(
        "--baseline-file", "baseline_file", metavar="FILE", default=None,
        help="a findings baseline (from --write-baseline): each finding is marked new or "
             "baseline, vanished ones fixed; with --fail-on new only new findings fail",
    )(fn)


def check_gate(only_new: bool, baseline_file: str | None,
               write_baseline: str | None) -> Any:
    """The findings-baseline options, before any work: the baseline read and validated
    (a :class:`~kvcontract.tools.reports.gate.FindingsBaseline`, or None), the
    ``--write-baseline`` file writable, ``--fail-on new`` given something to compare
    with."""
    from kvcontract.tools.reports.gate import load_baseline

    if only_new and baseline_file is None and write_baseline is None:
        raise UsageError("--fail-on new fails only on findings not in a findings baseline; "
                         "give --baseline-file FILE (write one first with --write-baseline "
                         "FILE), or set baseline-file in [tool.kvcontract] of pyproject.toml")
    if write_baseline is not None:
        check_output_file("--write-baseline", write_baseline)
    return load_baseline(baseline_file) if baseline_file is not None else None


def check_gate_outputs(fail_on: str, baseline_file: str | None, write_baseline: str | None,
                       formats: tuple[str, ...], outputs: tuple[str, ...],
                       json_path: str | None,
                       ) -> tuple[frozenset[Impact], bool, Any, list[tuple[str, str | None]]]:
    """``--fail-on``, the findings baseline and the report outputs of ``prove`` and
    ``audit``, before any work: the failing impacts, whether only new findings fail,
    the baseline read (or None) and the ``(format, path)`` pairs."""
    from kvcontract.tools.reports import pair_outputs

    failing, only_new = parse_gate_fail_on(fail_on)
    pairs = pair_outputs(formats, outputs)
    check_report_outputs(pairs, json_path, [("--write-baseline", write_baseline)]
                         if write_baseline else None)
    return failing, only_new, check_gate(only_new, baseline_file, write_baseline), pairs


def finding_line(result: TheoremResult, fail_on: frozenset[Impact], mark: str | None = None,
                 only_new: bool = False) -> str:
    """``C2/x: COUNTEREXAMPLE [crash] message`` (``not failing`` below ``--fail-on``);
    ``mark``: ``new`` or ``baseline`` against a findings baseline."""
    from rich.markup import escape

    impact = escape(f" [{result.impact}]") if result.impact else ""
    passes = result.impact is not None and Impact(result.impact) not in fail_on
    note = " (reported, not failing: outside --fail-on)" if passes else ""
    if mark is not None:
        accepted = mark == "baseline" and only_new and not passes
        note = escape(f" [{mark}]") + (" (in the findings baseline, not failing)"
                                       if accepted else note)
    return (f"[{STYLE[result.verdict]}]{result.clause}/{result.theorem}: "
            f"{result.verdict.value}[/]{impact}{note} {escape(result.message)}")


def report_options(fn: F) -> F:
    """``--format`` / ``--output`` of the verifying commands (see tools/reports)."""
    from kvcontract.tools.reports import FORMATS

    fn = click.option(
        "--output", "outputs", multiple=True, metavar="FILE",
        help="write the report here (repeatable, paired with --format in order; the format "
             "is inferred from .json/.xml/.sarif/.md/.txt/.mypy/.github when --format is "
             "absent; - is standard output)",
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


VERDICT_WIDTH = max(len(v.value) for v in Verdict)
"""The verdict column never wraps: ``COUNTEREXAMPLE`` stays one word at 80 columns."""

WIDE_TABLE = 120
"""From this many columns on, the results table has the clause, theorem, verdict,
domain, Z3 resource and seconds columns; narrower, the full theorem id (``C2/name``,
what ``explain --theorem`` takes), the verdict, the domain and, from
:data:`MEDIUM_TABLE` on, the seconds."""

MEDIUM_TABLE = 100

THEOREM_WIDTH = 30
"""The narrow table's theorem column is at least this wide (most ids fit unbroken)."""


class _ResultsTable:
    """The results table, laid out for the width it is printed at (rich asks for it)."""

    def __init__(self, results: list[TheoremResult], title: str) -> None:
        self.results = results
        self.title = title

    def table(self, width: int) -> Table:
        table = Table(title=self.title, show_lines=False)
        wide, seconds = width >= WIDE_TABLE, width >= MEDIUM_TABLE
        ids = [f"{r.clause}/{r.theorem}" for r in self.results]
        if wide:
            table.add_column("clause", no_wrap=True)
            table.add_column("theorem", overflow="fold")
        else:
            # Fixed widths (rich overflows a table whose min_width columns do not fit):
            # the id as wide as it needs up to THEOREM_WIDTH, the domain takes the rest.
            longest = max(len(i) for i in [*ids, "theorem"])
            room = width - 10 - VERDICT_WIDTH - (10 if seconds else 0) - 16  # domain >= 16
            table.add_column("theorem", overflow="fold",
                             width=max(12, min(longest, THEOREM_WIDTH, room)))
        table.add_column("verdict", no_wrap=True, width=VERDICT_WIDTH)
        table.add_column("domain", overflow="fold")
        if wide:
            table.add_column("rlimit", no_wrap=True, justify="right")
        if seconds:
            table.add_column("seconds", no_wrap=True, justify="right")
        for r, theorem_id in zip(self.results, ids, strict=True):
            row = [r.clause, r.theorem] if wide else [theorem_id]
            row += [f"[{STYLE[r.verdict]}]{r.verdict.value}[/]", r.domain]
            if wide:
                row.append(f"{r.rlimit_used:,}")
            if seconds:
                row.append(f"{r.seconds:.2f}")
            table.add_row(*row)
        return table

    def __rich_console__(self, console: Console, options: Any) -> Any:
        yield self.table(options.max_width)


def results_table(results: list[TheoremResult], title: str) -> Any:
    """The theorem results as a rich renderable: a table of clause, theorem, verdict,
    domain and cost, narrower terminals get the full theorem id, the verdict (never
    broken), the domain and the seconds."""
    return _ResultsTable(results, title)


# -- input validation (issue #11): every input is checked before any expensive work -----
def _creatable_folder(option: str, given: str, folder: Path) -> None:
    """``folder`` exists as a writable folder, or its nearest existing ancestor is one."""
    import os

    probe = folder
    while not probe.exists():
        if probe.is_symlink():
            raise UsageError(f"{option} {given}: {probe} is a broken symbolic link")
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{option} {given}: {probe} is a file, not a folder; choose a path "
                         "in a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {given}: the folder {probe} is not writable; choose "
                         "another path")


def check_output_file(option: str, path: str) -> None:
    """An output file can be written: not a folder, and its folder exists (writable) or
    can be created. Checked before any work, so no proof is thrown away at the end."""
    import os

    if not path or not path.strip():
        raise UsageError(f"{option} needs a file name, not an empty string")
    target = Path(path).expanduser()
    if target.is_dir():
        raise UsageError(f"{option} {path} is a folder; give a file name inside it")
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"{option} {path}: the file exists and is not writable")
    _creatable_folder(option, path, target.parent if str(target.parent) else Path("."))


def check_output_folder(option: str, path: str) -> None:
    """An output folder exists (writable) or can be created."""
    if not path or not path.strip():
        raise UsageError(f"{option} needs a folder name, not an empty string")
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise UsageError(f"{option} {path} is a file, not a folder; give a folder")
    _creatable_folder(option, path, target)


def check_report_outputs(pairs: list[tuple[str, str | None]],
                         json_path: str | None = None,
                         others: list[tuple[str, str]] | None = None) -> None:
    """The ``--output`` files and ``--json`` (and ``others``: ``(option, path)``) of a
    verifying command, before any work."""
    seen: dict[str, str] = {}
    named = [("--output", path) for _, path in pairs if path is not None]
    if json_path is not None:
        named.append(("--json", json_path))
    named.extend(others or [])
    for option, path in named:
        check_output_file(option, path)
        key = str(Path(path).expanduser().resolve())
        if key in seen:
            raise UsageError(f"{option} {path}: the same file is also given to {seen[key]}; "
                             "give each report its own file")
        seen[key] = option


def _nested(data: Any, key: str) -> list[Any]:
    """Every value stored under ``key`` in nested objects and lists."""
    found: list[Any] = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            if key in item:
                found.append(item[key])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


UPSTREAM_TARGET_KINDS = ("vllm", "module")
"""The audit targets that are upstream code (``vllm:PATH``, ``module:FILE.py`` with
functions under upstream's names), replayed through the audit's binding."""

SCENARIO_WITNESSES = ("fuzz", "system")
"""Witness kinds that are programs of the executable system (a fuzz difference, an
audit's system scenario): replayed by ``kvcontract fuzz`` or ``audit``, never by id."""


NOT_REPLAYABLE = {
    "mutate": "a mutation campaign's report (`kvcontract mutate`): mutants and their "
              "scores, no counterexample witness to replay",
    "list": "the catalogue (`kvcontract list --json`): theorems, no results to replay",
}
"""What the JSON files kvcontract writes that are not findings reports hold, by
``command`` (or ``kind``), for the error that refuses them."""


def load_replay_report(path: str) -> dict[str, Any]:
    """A report whose witnesses ``gen-tests`` and ``explain`` replay: any report of
    ``prove``, ``fuzz``, ``merge`` or ``audit``; the other JSON files kvcontract writes
    (a mutation campaign, the catalogue, a findings baseline, gen-tests' index) are
    refused with what they are, and anything else as :func:`load_report` refuses it."""
    import json

    from kvcontract.errors import InputFileError
    from kvcontract.tools.reports import load_report

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        data = None  # load_report says what is wrong with it
    if isinstance(data, dict):
        what = NOT_REPLAYABLE.get(str(data.get("command")))
        if data.get("kind") == "kvcontract-findings-baseline":
            what = ("a findings baseline (`--write-baseline`): fingerprints of accepted "
                    "findings, no witnesses")
        elif "generated" in data and "skipped" in data and "command" not in data:
            what = "gen-tests' index of the reproducers it wrote (kvcontract-tests.json)"
        if what is not None:
            raise InputFileError(path, f"{what}; give the JSON report of prove, fuzz, "
                                       "merge or audit (--json FILE)")
    return load_report(path)


def report_implementation(data: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """What a report's witnesses replay on: ``(name, None)``, a name
    :func:`kvcontract.api.load_implementation` takes (a prove, fuzz or merge report's
    target; an audit report's ``builtin:NAME`` or registered name), or ``(None, target)``
    for an audit of upstream code (``vllm:PATH``, ``module:FILE.py`` with upstream's
    function names), whose witnesses replay on the bound upstream functions
    (:func:`bind_report_target`)."""
    target = str(data.get("target", ""))
    if data.get("command") == "audit":
        kind, sep, rest = target.partition(":")
        if sep and kind == "builtin":
            return rest, None
        if sep and kind in UPSTREAM_TARGET_KINDS:
            return None, target
    return target, None


def bind_report_target(target: str, path: str) -> Any:
    """The audit's binding of an audit report's upstream target (a ``Binding`` with its
    ``implementation``), or an :class:`InputFileError` saying why it cannot be replayed
    here (the audited code is gone, or binds no function)."""
    from kvcontract.errors import InputFileError, KvContractError
    from kvcontract.tools.audit import binding
    from kvcontract.tools.audit.targets import resolve_target

    try:
        bound = binding.bind(resolve_target(target))
    except KvContractError as exc:
        raise InputFileError(path, f"the report audited {target}, which cannot be replayed "
                                   f"here: {one_line(str(exc))}") from None
    if bound.implementation is None:
        raise InputFileError(path, f"the report audited {target}, where no upstream "
                                   "function binds now: nothing to replay its witnesses on")
    return bound


def check_report_witnesses(data: Mapping[str, Any], path: str,
                           results: list[Mapping[str, Any]] | None = None) -> None:
    """Every witness of a report (or of ``results``) can be replayed: its theorem is in
    the catalogue, its kind matches, its contents decode and (for an arithmetic theorem)
    satisfy the hypotheses. Fuzz programs are not replayed here and are skipped.

    Raises :class:`InputFileError` naming the file and the theorem.
    """
    from kvcontract.errors import InputFileError, UnknownPropertyError, WitnessError
    from kvcontract.spec.properties import FormulaProperty, get_property

    rows = results if results is not None else data.get("results", [])
    for row in rows:
        witness = row.get("witness")
        if not witness:
            continue
        theorem_id = f"{row.get('clause')}/{row.get('theorem')}"
        if not isinstance(witness, Mapping):
            raise InputFileError(path, f"{theorem_id}: the witness is not an object")
        if nesting_depth(witness) > MAX_WITNESS_DEPTH:
            raise InputFileError(path, f"{theorem_id}: the witness is nested more than "
                                       f"{MAX_WITNESS_DEPTH} levels deep (not a witness)")
        kind = witness.get("kind")
        if kind in SCENARIO_WITNESSES:
            continue  # a system program (replayed by `kvcontract fuzz`/`audit`, never here)
        try:
            prop = get_property(theorem_id)
        except UnknownPropertyError:
            raise InputFileError(
                path, f"{theorem_id}: no such theorem in this version of kvcontract (see "
                      "`kvcontract list`); regenerate the report"
            ) from None
        if kind != prop.kind:
            raise InputFileError(path, f"{theorem_id}: the witness has kind {kind!r}, but "
                                       f"this theorem's witnesses are {prop.kind!r}")
        try:
            if isinstance(prop, FormulaProperty):
                values = prop.decode(witness)
                try:
                    inside = prop.admissible(values)
                except KeyError as exc:
                    raise WitnessError(f"{theorem_id}: the witness lacks {exc}") from None
                except (ArithmeticError, TypeError, ValueError) as exc:
                    raise WitnessError(f"{theorem_id}: the witness lies outside the "
                                       "theorem's domain (its hypotheses raise "
                                       f"{type(exc).__name__}: {exc})") from None
                if not inside:
                    raise WitnessError(f"{theorem_id}: the witness lies outside the "
                                       "theorem's domain (its hypotheses fail)")
            else:
                from kvcontract.tools.explain import geometry_problem

                large = oversized_value(witness)
                if large is not None:
                    raise WitnessError(
                        f"{theorem_id}: the witness's {large} is beyond "
                        f"{MAX_CASE_SIZE:,}: kvcontract's exhaustive cases are far smaller, "
                        "and replaying it would take minutes"
                    )
                for geometry in _nested(witness, "geometry"):
                    problem = geometry_problem(geometry)
                    if problem is not None:
                        raise WitnessError(f"{theorem_id}: the witness's geometry: {problem}")
                prop.space.decode(witness)
        except (WitnessError, UnknownPropertyError) as exc:
            message = str(exc)
            if theorem_id not in message:
                message = f"{theorem_id}: {message}"
            raise InputFileError(path, message) from None


# -- the geometries of a scoped run (--model, --geometry) ------------------------------------
def geometry_options(fn: F) -> F:
    """``--model``, ``--geometry``, ``--bpc``, ``--retention``: check the contract on
    given geometries instead of the built-in catalogues (:func:`resolve_geometries`)."""
    fn = click.option(
        "--retention", "retentions", multiple=True, metavar="{0,none,K}",
        help="prefix_cache_retention_interval of the --model geometries (repeatable; "
             "default 0, vLLM's default; none: dense checkpoints; K: an interval)",
    )(fn)
    fn = click.option(
        "--bpc", "bpcs", multiple=True, type=int, metavar="N",
        help="offload blocks_per_chunk of the --model geometries (repeatable; default 1, "
             "4 and 16)",
    )(fn)
    fn = click.option(
        "--geometry", "geometry_files", multiple=True, metavar="FILE.json",
        help="check on this geometry (repeatable): Geometry.to_dict's JSON, a list of "
             'them, or {"label": ..., "geometry": ...} objects',
    )(fn)
    return click.option(
        "--model", "models", multiple=True, metavar="NAME",
        help="check on this model preset's geometries (repeatable; `kvcontract list "
             "--models` names them; all: every preset)",
    )(fn)


def print_scope(console: Any, scope: list[tuple[str, Any]], notes: bool = True) -> None:
    """The header of a scoped run: each geometry with its label and whether vLLM builds
    it (a geometry it does not build is checked, and its findings are graded latent),
    then (``notes``) what the run leaves out
    (:func:`kvcontract.spec.properties.scoped.scope_notes`)."""
    from rich.markup import escape

    from kvcontract.releases import PLANNING_RELEASE
    from kvcontract.spec.build import buildable
    from kvcontract.spec.properties.scoped import scope_notes

    console.print(f"geometries ({len(scope)}):", highlight=False)
    for label, geometry in scope:
        ok, reason = buildable(geometry)
        console.print(f"  {escape(label)}: {escape(geometry.describe())}; buildable: "
                      f"{'yes' if ok else 'no'}", highlight=False)
        if not ok:
            console.print(f"  [yellow]note[/]: vLLM {PLANNING_RELEASE} does not build "
                          f"{escape(label)} ({escape(reason)}); it is checked, and its "
                          "findings are graded latent", highlight=False)
    for note in scope_notes(scope) if notes else []:
        console.print(f"  scope: {escape(note)}", highlight=False)


# -- errors to one line (tools/cli.py) -------------------------------------------------------
class _Session:
    """Per-invocation state of the command line, set by the group's options."""

    debug: bool = False


SESSION = _Session()
"""``--debug`` (tracebacks), for the error handlers."""


def one_line(text: str) -> str:
    """A message on one line (a multi-line exception text joined by ``; ``)."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def internal_error(exc: BaseException) -> int:
    """Print the one-line internal-error message (the traceback first under ``--debug``)
    and return :data:`~kvcontract.vocabulary.EXIT_INTERNAL`."""
    import traceback

    from kvcontract.vocabulary import EXIT_INTERNAL

    if SESSION.debug:
        click.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
    message = one_line(str(exc))
    shown = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    hint = "" if SESSION.debug else " (run with --debug for the traceback)"
    click.echo(f"kvcontract: internal error: {shown}{hint}", err=True)
    return EXIT_INTERNAL
