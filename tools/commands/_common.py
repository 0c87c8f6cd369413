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
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.vocabulary import DEFAULT_FAIL_ON_TEXT, Impact, parse_impacts

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


def parse_fail_on(text: str) -> frozenset[Impact]:
    """The ``--fail-on`` value, validated (a UsageError names the bad word)."""
    if "new" in [w.strip().lower() for w in text.split(",")]:
        raise UsageError("--fail-on new (only findings not in a findings baseline) is for "
                         "`kvcontract prove` and `kvcontract audit`")
    try:
        return parse_impacts(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


NEW_WORD = "new"
"""The ``--fail-on`` word that restricts failing to findings not in the baseline."""


def parse_gate_fail_on(text: str) -> tuple[frozenset[Impact], bool]:
    """``--fail-on`` of ``prove``/``audit``: the impacts, and whether only new findings
    (not in the findings baseline) fail. ``new`` alone means every impact."""
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    only_new = NEW_WORD in words
    rest = [w for w in words if w != NEW_WORD]
    if only_new and not rest:
        return frozenset(Impact), True
    try:
        return parse_impacts(",".join(rest)), only_new
    except ValueError as exc:
        message = str(exc)
        if "unknown impact" in message:
            message = message.replace("(or all)", "(or all), plus new")
        raise UsageError(message) from None


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


def finish_gate(report: dict[str, Any], baseline: Any, *, only_new: bool,
                write_baseline: str | None) -> dict[str, Any]:
    """After the run: write the baseline (``--write-baseline``), then mark every finding
    against the baseline read before the run, or, without one, the one just written.
    Returns the report's ``findings_baseline`` section."""
    from kvcontract.tools.reports.gate import apply_baseline
    from kvcontract.tools.reports.gate import write_baseline as write

    written = write(write_baseline, report) if write_baseline is not None else None
    section: dict[str, Any] = apply_baseline(
        report, baseline if baseline is not None else written, only_new=only_new,
        written=write_baseline)
    if written is not None:
        section["written_findings"] = len(written.entries)
    return section


def print_gate(console: Any, report: dict[str, Any]) -> None:
    """The findings-baseline lines of a run (each finding new or baseline, the fixed
    ones), and where a baseline was written."""
    from rich.markup import escape

    from kvcontract.tools.reports.gate import summary_lines

    for line in summary_lines(report):
        console.print(escape(line), highlight=False)
    section = report.get("findings_baseline") or {}
    if section.get("written"):
        console.print(escape(f"wrote the findings baseline {section['written']} "
                             f"({section.get('written_findings', 0)} findings)"),
                      highlight=False)


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


PIPE_WIDTH = 100
"""Columns of output that goes to a file or a pipe when ``COLUMNS`` is not set."""


def console_width(stream: Any) -> int | None:
    """The width for output to ``stream``: None on a terminal (rich asks the terminal,
    and honours ``COLUMNS``); piped or redirected, ``COLUMNS`` when it is a positive
    integer, else :data:`PIPE_WIDTH`."""
    import os

    try:
        terminal = bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        terminal = False
    if terminal:
        return None
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


def make_console(stderr: bool = False) -> Console:
    """The rich console of a command (every command makes its own through here), on
    stdout or ``stderr``, at :func:`console_width`."""
    return Console(stderr=stderr, width=console_width(sys.stderr if stderr else sys.stdout))


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
        if _depth(witness) > MAX_WITNESS_DEPTH:
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


# -- the geometries of a scoped run (--model, --geometry) ------------------------------------
MAX_PRESET_BPC = 256
"""The largest ``--bpc`` (vLLM takes any; a chunk of 256 blocks is far beyond any
deployment, and a typo such as ``--bpc 16000`` would only make empty case sets)."""


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


def parse_retention(text: str) -> int | None:
    """``--retention``: ``none``, 0 or a positive token count."""
    word = text.strip().lower()
    if word == "none":
        return None
    if not word.isdigit():
        raise UsageError(f"--retention {text!r}: give 0 (vLLM's default), none (dense "
                         "checkpoints) or a positive number of tokens")
    return int(word)


def _preset_geometries(models: tuple[str, ...], bpcs: tuple[int, ...],
                       retentions: tuple[str, ...]) -> list[tuple[str, Any]]:
    from kvcontract.errors import GeometryError
    from kvcontract.spec.models import PRESET_BLOCKS_PER_CHUNK, get_preset, list_presets

    names: list[str] = []
    for given in models:
        for name in (list_presets() if given.strip() == "all" else [given]):
            try:
                get_preset(name)
            except UsageError as exc:  # it lists the presets
                raise UsageError(f"--model {name!r}: {exc}; `kvcontract list --models` "
                                 "describes them, --model all takes every one") from None
            if name not in names:
                names.append(name)
    for bpc in bpcs:
        check_int("--bpc", bpc, low=1, high=MAX_PRESET_BPC, what="blocks per offload chunk")
    intervals = list(dict.fromkeys(parse_retention(r) for r in retentions)) or [0]
    found = []
    for name in names:
        preset = get_preset(name)
        for bpc in dict.fromkeys(bpcs or PRESET_BLOCKS_PER_CHUNK):
            for interval in intervals:
                label = f"{name} bpc={bpc}"
                if interval != 0:
                    label += f" retention={'none' if interval is None else interval}"
                try:
                    geometry = preset.geometry(blocks_per_chunk=bpc,
                                               retention_interval=interval)
                    if preset.lookahead_block_hashes:
                        # vLLM's default block-hash mode first (docs/CONTRACT.md 2.1),
                        # then the legacy one the preset states.
                        found.append((f"{label} lookahead hashes", preset.geometry(
                            blocks_per_chunk=bpc, retention_interval=interval,
                            lookahead_block_hashes=True)))
                except GeometryError as exc:
                    shown = "none" if interval is None else interval
                    raise UsageError(
                        f"--model {name} --bpc {bpc} --retention {shown}: vLLM would refuse "
                        f"this geometry ({exc}); choose another --retention (0 or none "
                        "always work) or --bpc") from None
                found.append((label, geometry))
    return found


def _geometry_entries(path: str, data: Any) -> list[tuple[str | None, Any]]:
    """``(label or None, geometry data)`` of a --geometry file's JSON."""
    from kvcontract.errors import InputFileError

    items = data if isinstance(data, list) else [data]
    if not items:
        raise InputFileError(path, "the list holds no geometry")
    entries: list[tuple[str | None, Any]] = []
    for index, item in enumerate(items):
        where = f"entry {index}: " if isinstance(data, list) else ""
        if not isinstance(item, Mapping):
            raise InputFileError(path, f"{where}a geometry is a JSON object with a 'groups' "
                                       'list (or {"label": ..., "geometry": {...}})')
        if "groups" in item:
            entries.append((None, item))
            continue
        if "geometry" not in item:
            raise InputFileError(path, f"{where}neither a geometry ('groups') nor a "
                                       '{"label": ..., "geometry": ...} object')
        unknown = sorted(set(item) - {"label", "geometry"})
        if unknown:
            raise InputFileError(path, f"{where}unknown keys {unknown}: a labelled geometry "
                                       "has 'label' and 'geometry'")
        label = item.get("label")
        if label is not None and (not isinstance(label, str) or not label.strip()):
            raise InputFileError(path, f"{where}'label' must be a non-empty string, not "
                                       f"{label!r}")
        entries.append((label, item["geometry"]))
    return entries


def load_geometry_file(path: str) -> list[tuple[str, Any]]:
    """The ``(label, Geometry)`` pairs of a ``--geometry`` file; an unreadable file, bad
    JSON or an impossible geometry is an :class:`InputFileError` naming the file."""
    import json

    from kvcontract.errors import GeometryError, InputFileError
    from kvcontract.spec.geometry import Geometry
    from kvcontract.tools.explain import geometry_problem

    if not path or not path.strip():
        raise UsageError("--geometry needs a file name, not an empty string")
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputFileError(path, "not UTF-8 text (a geometry is JSON)") from None
    except OSError as exc:
        raise InputFileError(path, f"cannot read it ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"not valid JSON: {exc.msg} (line {exc.lineno})") from None
    except (RecursionError, ValueError) as exc:
        raise InputFileError(path, f"not a geometry ({type(exc).__name__})") from None
    if _depth(data) > MAX_WITNESS_DEPTH:
        raise InputFileError(path, "nested too deeply to be a geometry")
    stem = Path(path).stem
    entries = _geometry_entries(path, data)
    found = []
    for index, (label, item) in enumerate(entries):
        where = f"entry {index}: " if len(entries) > 1 or isinstance(data, list) else ""
        problem = geometry_problem(item)
        large = _largest(item)
        if problem is None and large is not None:
            problem = f"{large} is beyond {MAX_CASE_SIZE:,} (no real geometry is that large)"
        if problem is not None:
            raise InputFileError(path, f"{where}{problem}")
        try:
            geometry = Geometry.from_dict(dict(item))
        except GeometryError as exc:
            raise InputFileError(path, f"{where}{exc}") from None
        found.append((label or (stem if len(entries) == 1 else f"{stem}[{index}]"), geometry))
    return found


def resolve_geometries(models: tuple[str, ...], geometry_files: tuple[str, ...],
                       bpcs: tuple[int, ...] = (),
                       retentions: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """The ``(label, Geometry)`` pairs of ``--model``/``--geometry`` (empty: neither
    given, the built-in catalogues), validated before any work: an unknown preset, a
    bad file, an impossible geometry or a retention the preset's geometry rejects is a
    usage error naming it."""
    if (bpcs or retentions) and not models:
        given = "--bpc" if bpcs else "--retention"
        raise UsageError(f"{given} chooses the geometries of --model presets; give --model "
                         f"NAME (see `kvcontract list --models`) or drop {given} (a "
                         "--geometry file states its own)")
    found = _preset_geometries(models, bpcs, retentions)
    for path in geometry_files:
        found.extend(load_geometry_file(path))
    return distinct_labels(found)


def distinct_labels(found: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The pairs in order, a repeated label numbered (``label (2)``) so reports tell the
    geometries apart."""
    labels: dict[str, int] = {}
    unique = []
    for label, geometry in found:
        labels[label] = labels.get(label, 0) + 1
        unique.append((label if labels[label] == 1 else f"{label} ({labels[label]})",
                       geometry))
    return unique


def print_scope(console: Any, scope: list[tuple[str, Any]], notes: bool = True) -> None:
    """The header of a scoped run: each geometry with its label and whether vLLM builds
    it (a geometry it does not build is checked, and its findings are graded latent),
    then (``notes``) what the run leaves out
    (:func:`kvcontract.spec.properties.scoped.scope_notes`)."""
    from rich.markup import escape

    from kvcontract.spec.build import VLLM_VERSION, buildable
    from kvcontract.spec.properties.scoped import scope_notes

    console.print(f"geometries ({len(scope)}):", highlight=False)
    for label, geometry in scope:
        ok, reason = buildable(geometry)
        console.print(f"  {escape(label)}: {escape(geometry.describe())}; buildable: "
                      f"{'yes' if ok else 'no'}", highlight=False)
        if not ok:
            console.print(f"  [yellow]note[/]: vLLM {VLLM_VERSION} does not build "
                          f"{escape(label)} ({escape(reason)}); it is checked, and its "
                          "findings are graded latent", highlight=False)
    for note in scope_notes(scope) if notes else []:
        console.print(f"  scope: {escape(note)}", highlight=False)


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
