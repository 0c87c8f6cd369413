"""What several commands share: the ``--format``/``--output`` options, emitting the
rendered reports, and the rich table of theorem results."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.table import Table

from kvcontract.errors import UsageError
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.vocabulary import Impact, parse_impacts

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
        "--fail-on", "fail_on", default="crash,corruption,lost-hit", show_default=True,
        metavar="IMPACT,...",
        help="impacts whose findings fail the run (exit 1): crash, corruption, lost-hit, "
             "delay, waste, latent, or all; other findings are reported and pass",
    )(fn)


def parse_fail_on(text: str) -> frozenset[Impact]:
    """The ``--fail-on`` value, validated (a UsageError names the bad word)."""
    try:
        return parse_impacts(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def finding_line(result: TheoremResult, fail_on: frozenset[Impact]) -> str:
    """``C2/x: COUNTEREXAMPLE [crash] message`` (``not failing`` below ``--fail-on``)."""
    from rich.markup import escape

    impact = escape(f" [{result.impact}]") if result.impact else ""
    passes = result.impact is not None and Impact(result.impact) not in fail_on
    note = " (reported, not failing: outside --fail-on)" if passes else ""
    return (f"[{STYLE[result.verdict]}]{result.clause}/{result.theorem}: "
            f"{result.verdict.value}[/]{impact}{note} {escape(result.message)}")


def report_options(fn: F) -> F:
    """``--format`` / ``--output`` of the verifying commands (see tools/reports)."""
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


def results_table(results: list[TheoremResult], title: str) -> Table:
    """The theorem results as a rich table (clause, theorem, verdict, domain, cost)."""
    table = Table(title=title, show_lines=False)
    for column in ("clause", "theorem", "verdict", "domain", "rlimit", "seconds"):
        if column in ("rlimit", "seconds"):
            table.add_column(column, overflow="fold", justify="right")
        else:
            table.add_column(column, overflow="fold", justify="left")
    for r in results:
        table.add_row(
            r.clause, r.theorem, f"[{STYLE[r.verdict]}]{r.verdict.value}[/]",
            r.domain, f"{r.rlimit_used:,}", f"{r.seconds:.2f}",
        )
    return table


# -- input validation (issue #11): every input is checked before any expensive work -----
MAX_JOBS = 512
"""The most worker processes a command starts (``--jobs``): the prover's fork pool
starts them all at once, so a typo such as ``--jobs 100000`` must not fork-bomb."""

SEED_LIMIT = 2**32
"""``--seed`` is in ``[0, 2**32)``, the range every seeded generator accepts."""


def check_jobs(jobs: int | None, option: str = "--jobs") -> None:
    """``--jobs N``: None (one per core) or 1 to :data:`MAX_JOBS`."""
    if jobs is not None and jobs < 1:
        raise UsageError(f"{option} must be at least 1, not {jobs}; omit it for one worker "
                         "process per core")
    if jobs is not None and jobs > MAX_JOBS:
        raise UsageError(f"{option} must be at most {MAX_JOBS} worker processes, not {jobs}; "
                         "omit it for one per core")


def check_int(option: str, value: int | None, *, low: int | None = None,
              high: int | None = None, what: str = "") -> None:
    """An integer option in ``[low, high]`` (None: not given, nothing to check)."""
    if value is None:
        return
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            bound = f"at least {low}"
        elif low is None:
            bound = f"at most {high}"
        else:
            bound = f"between {low} and {high}"
        raise UsageError(f"{option} must be {bound}{f' ({what})' if what else ''}, "
                         f"not {value}")


def check_seed(seed: int, option: str = "--seed") -> None:
    check_int(option, seed, low=0, high=SEED_LIMIT - 1, what="a seed")


def check_float(option: str, value: float | None, *, low: float = 0.0,
                high: float | None = None, unit: str = "") -> None:
    """A finite float option with ``low < value <= high`` (NaN and infinities rejected)."""
    import math

    if value is None:
        return
    shown = f"{value:g}"
    if not math.isfinite(value):
        raise UsageError(f"{option} must be a finite number{unit and ' of ' + unit}, not "
                         f"{shown}")
    if value <= low:
        bound = "positive" if low == 0 else f"greater than {low:g}"
        raise UsageError(f"{option} must be {bound}, not {shown}")
    if high is not None and value > high:
        raise UsageError(f"{option} must be at most {high:g}{unit and ' ' + unit}, not {shown}")


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
                         json_path: str | None = None) -> None:
    """The ``--output`` files and ``--json`` of a verifying command, before any work."""
    seen: dict[str, str] = {}
    named = [("--output", path) for _, path in pairs if path is not None]
    if json_path is not None:
        named.append(("--json", json_path))
    for option, path in named:
        check_output_file(option, path)
        key = str(Path(path).expanduser().resolve())
        if key in seen:
            raise UsageError(f"{option} {path}: the same file is also given to {seen[key]}; "
                             "give each report its own file")
        seen[key] = option


def check_clauses(clauses: tuple[str, ...], *, prover: bool = False) -> list[str]:
    """The ``--clause`` ids, validated (an UnknownClauseError lists the known ones);
    ``prover``: only clauses the prover decides (C11 is checked by ``fuzz``)."""
    from kvcontract.spec.clauses import get_clause

    ids = []
    for given in clauses:
        clause = get_clause(given)
        if prover and clause.proved_by != "prover":
            raise UsageError(f"--clause {given}: {clause.id} is checked by executing the "
                             "system, not by the prover; run `kvcontract fuzz` for it")
        ids.append(clause.id)
    return ids


MAX_CASE_SIZE = 1_000_000
"""The largest number (and longest list) an exhaustive witness may hold: replay time
grows with the token count (about 7 s per million tokens for a lookup case)."""

MAX_WITNESS_DEPTH = 16
"""Witnesses are shallow (a geometry inside a case: four levels); a deeper one is junk
that would only exhaust the recursion of the code that prints it."""


def _depth(data: Any) -> int:
    """How deeply objects and lists nest in ``data`` (iteratively: any depth is safe)."""
    deepest = 0
    stack: list[tuple[int, Any]] = [(0, data)]
    while stack:
        level, item = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, Mapping):
            stack.extend((level + 1, v) for v in item.values())
        elif isinstance(item, list):
            stack.extend((level + 1, v) for v in item)
    return deepest


def _largest(data: Any) -> str | None:
    """The first number or list of ``data`` beyond :data:`MAX_CASE_SIZE`, as
    ``key=value`` (or ``key (N items)``), or None."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend((f"{where}.{k}" if where else str(k), v)
                         for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            if len(item) > MAX_CASE_SIZE:
                return f"{where} ({len(item):,} items)"
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(item))))
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_CASE_SIZE:
            return f"{where}={item}"
    return None


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
        if _depth(witness) > MAX_WITNESS_DEPTH:
            raise InputFileError(path, f"{theorem_id}: the witness is nested more than "
                                       f"{MAX_WITNESS_DEPTH} levels deep (not a witness)")
        kind = witness.get("kind")
        if kind == "fuzz":
            continue  # a fuzz program (replayed by `kvcontract fuzz`, never here)
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

                large = _largest(witness)
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


# -- errors to one line (tools/cli.py) -------------------------------------------------------
class _Session:
    """Per-invocation state of the command line, set by the group's options."""

    debug: bool = False
    interrupted: bool = False


SESSION = _Session()
"""``--debug`` (tracebacks) and whether SIGINT arrived, for the error handlers."""


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
