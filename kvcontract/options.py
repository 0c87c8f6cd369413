"""The arguments of the library API and the command line, validated once, here: each
check raises :class:`~kvcontract.errors.UsageError` naming the option and the value.

Each command's options are one object built by one function that both the command line
(after ``[tool.kvcontract]`` is merged) and :mod:`kvcontract.api` call:
:func:`prove_options` (:class:`ProveOptions`), :func:`fuzz_options`
(:class:`FuzzOptions`) and :func:`audit_request` (the audit's ``AuditRequest``), so a
value the command line refuses the API refuses with the same message, which names the
command line's option. Also the ``--model``/``--geometry``/``--bpc``/``--retention``
scope: preset geometries and geometry files resolved to ``(label, Geometry)`` pairs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcontract.errors import UsageError
from kvcontract.inputs import read_json_file
from kvcontract.vocabulary import DEFAULT_FAIL_ON, Impact, parse_impacts

MAX_EXAMPLES = 10_000_000
"""The most Hypothesis examples one run accepts (a typo guard, far above any campaign)."""


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


MAX_PRESET_BPC = 256
"""The largest ``--bpc`` (vLLM takes any; a chunk of 256 blocks is far beyond any
deployment, and a typo such as ``--bpc 16000`` would only make empty case sets)."""


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

    from kvcontract.errors import GeometryError, InputFileError
    from kvcontract.spec.geometry import Geometry
    from kvcontract.tools.explain import geometry_problem

    if not path or not path.strip():
        raise UsageError("--geometry needs a file name, not an empty string")
    data = read_json_file(path, "a geometry")
    if nesting_depth(data) > MAX_WITNESS_DEPTH:
        raise InputFileError(path, "nested too deeply to be a geometry")
    stem = Path(path).stem
    entries = _geometry_entries(path, data)
    found = []
    for index, (label, item) in enumerate(entries):
        where = f"entry {index}: " if len(entries) > 1 or isinstance(data, list) else ""
        problem = geometry_problem(item)
        large = oversized_value(item)
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


MAX_CASE_SIZE = 1_000_000
"""The largest number (and longest list) an exhaustive witness may hold: replay time
grows with the token count (about 7 s per million tokens for a lookup case)."""

MAX_WITNESS_DEPTH = 16
"""Witnesses are shallow (a geometry inside a case: four levels); a deeper one is junk
that would only exhaust the recursion of the code that prints it."""


def nesting_depth(data: Any) -> int:
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


def oversized_value(data: Any) -> str | None:
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


@dataclass(frozen=True)
class ProveOptions:
    """``kvcontract prove``'s options, validated once by :func:`prove_options`: the
    command line builds them from its arguments merged with ``[tool.kvcontract]``, the
    library API (:func:`kvcontract.api.prove`) from its keyword arguments, and both run
    them through :func:`kvcontract.api.run_prove` and
    :func:`kvcontract.api.prove_document`."""

    impl: str
    """A registered implementation's name (:func:`kvcontract.api.register_implementation`)."""
    clauses: tuple[str, ...] = ()
    """Clause ids the prover decides; empty: every one."""
    jobs: int | None = None
    fail_on: frozenset[Impact] = frozenset()
    scope: tuple[tuple[str, Any], ...] = ()
    """``(label, Geometry)`` pairs (``--model``/``--geometry``); empty: the catalogues."""
    cache: bool = False
    shard: Any = None
    """A :class:`kvcontract.proofs.shards.Shard`, or None for the whole selection."""
    fail_fast: bool = False
    only_new: bool = False
    """``--fail-on new``: only findings not in ``findings_baseline`` fail."""
    findings_baseline: Any = None
    """A :class:`kvcontract.tools.reports.gate.FindingsBaseline` read before the run."""
    write_baseline: str | None = None
    report_file: str | None = None
    """The JSON report's path, which the defects' commands name."""


def prove_options(impl: str, *, clauses: tuple[str, ...] = (), jobs: int | None = None,
                  fail_on: frozenset[Impact], scope: tuple[tuple[str, Any], ...] = (),
                  cache: bool = False, shard: Any = None, fail_fast: bool = False,
                  only_new: bool = False, findings_baseline: Any = None,
                  write_baseline: str | None = None,
                  report_file: str | None = None) -> ProveOptions:
    """Validated :class:`ProveOptions` (a :class:`UsageError` names what is wrong): the
    clauses are the prover's, ``jobs`` a worker count."""
    check_jobs(jobs)
    return ProveOptions(impl, tuple(check_clauses(tuple(clauses), prover=True)), jobs,
                        fail_on, tuple(scope), bool(cache), shard, bool(fail_fast),
                        bool(only_new), findings_baseline, write_baseline, report_file)


MIN_TIMEOUT = 0.001
"""The shortest ``--timeout`` (seconds of CPU time per upstream call) the audit takes."""


def audit_request(*, fail_on: frozenset[Impact] = DEFAULT_FAIL_ON, clauses: tuple[str, ...] = (),
                  timeout: float = 10.0, budget: int = 250_000, jobs: int | None = None,
                  scope: tuple[tuple[str, Any], ...] = (), shard: Any = None,
                  judge_mode: str = "auto", costs: bool = True, live: bool = False,
                  require_complete: bool = False, only_new: bool = False,
                  findings_baseline: Any = None, write_baseline: str | None = None,
                  reproducer_dir: str | None = None, picture_dir: str | None = None,
                  report_file: str | None = None) -> Any:
    """``kvcontract audit``'s options, validated once (a :class:`UsageError` names what is
    wrong): the :class:`~kvcontract.tools.audit.command.AuditRequest` that both the
    command line and :func:`kvcontract.api.audit` hand to the audit's one pipeline
    (:func:`~kvcontract.tools.audit.command.produce_report`)."""
    from kvcontract.tools.audit.command import THEOREM_TIMEOUT, AuditRequest, audit_options
    from kvcontract.tools.audit.on_engine import MODES

    if judge_mode not in MODES:
        raise UsageError(f"--judge must be one of {', '.join(MODES)}, not {judge_mode!r}")
    wanted = check_clauses(tuple(clauses))
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise UsageError(f"--timeout must be a number of seconds, not {timeout!r}")
    check_float("--timeout", float(timeout), low=0.0, high=THEOREM_TIMEOUT, unit="seconds")
    if timeout < MIN_TIMEOUT:
        raise UsageError(f"--timeout must be at least {MIN_TIMEOUT:g} seconds, not {timeout:g}")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise UsageError(f"--budget must be a positive number of cases, not {budget!r}")
    check_jobs(jobs)
    options = audit_options(wanted, float(timeout), budget, jobs, scope, shard, judge_mode)
    return AuditRequest(options, fail_on, reproducer_dir, picture_dir, only_new,
                        findings_baseline, write_baseline, require_complete, costs,
                        report_file, live)


@dataclass(frozen=True)
class FuzzOptions:
    """``kvcontract fuzz``'s options, validated once by :func:`fuzz_options` (the command
    line's and :func:`kvcontract.api.fuzz`'s)."""

    impl: str
    """A registered implementation's name."""
    examples: int = 200
    seed: int = 0
    matrix: bool = False
    device: str = "cpu"
    fail_on: frozenset[Impact] = DEFAULT_FAIL_ON
    scope: tuple[tuple[str, Any], ...] = ()


def fuzz_options(impl: str, *, examples: int = 200, seed: int = 0, matrix: bool = False,
                 device: str = "cpu", fail_on: frozenset[Impact] = DEFAULT_FAIL_ON,
                 scope: tuple[tuple[str, Any], ...] = ()) -> FuzzOptions:
    """Validated :class:`FuzzOptions` (a :class:`UsageError` names what is wrong; a
    ``cuda`` device is checked to exist)."""
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 0:
        raise UsageError(f"--examples must be at least 0, not {examples!r}")
    check_int("--examples", examples, high=MAX_EXAMPLES, what="Hypothesis examples")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"--seed must be an integer, not {seed!r}")
    check_seed(seed)
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu or cuda, not {device!r}")
    if device == "cuda":
        from kvcontract.tools.fuzz import _check_device

        _check_device(device)
    if scope and matrix:
        raise UsageError("--matrix runs the built-in geometry matrix; drop it to fuzz the "
                         "geometries of --model/--geometry (or drop those)")
    return FuzzOptions(impl, examples, seed, bool(matrix), device, fail_on, tuple(scope))
