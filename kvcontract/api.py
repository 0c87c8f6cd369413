"""The public Python API: what the command line does, as functions that return reports.

```python
import kvcontract

report = kvcontract.prove("reference", clauses=["C2"])   # a ProveReport
assert report.exit_code == 0, [r.message for r in report.results if not r.verdict.passed]

impl = kvcontract.load_implementation("module:my_patch.py")  # the reference, patched
kvcontract.assert_contract(impl, clauses=["C4"])              # AssertionError on a finding
```

* :func:`prove`, :func:`fuzz` and :func:`audit` take the arguments of ``kvcontract prove``,
  ``fuzz`` and ``audit`` and validate every one of them before any work, raising the
  errors the command line turns into exit code 2 (:mod:`kvcontract.errors`:
  :class:`UsageError` and its subclasses, :class:`GeometryError`,
  :class:`InputFileError`); they print nothing. Ctrl-C reaches the caller as
  :class:`KeyboardInterrupt` (the prover's worker processes stop quietly).
* An implementation is a registered name (``reference``, ``upstream-current``, ...), an
  :class:`Implementation` object, or ``module:FILE.py``: a file that defines some of the
  bundle's functions (``sliding_window_lookup``, ``load_window_size_in_chunks``, ... the
  names of ``kvcontract/impl/reference.py``) under their names; the rest is the
  reference's (:func:`load_implementation`). The ``KVCONTRACT_IMPL`` variable of generated
  reproducers takes the same forms.
* :func:`replay` re-runs one witness of a report on an implementation, without a solver;
  :func:`replay_fuzz` re-runs a fuzz finding's program on an implementation.
* The pipelines the command line runs too: options validated once
  (:mod:`kvcontract.options`), then :func:`run_prove` and :func:`prove_document` (the
  ``--json`` document of ``kvcontract prove``), the audit's ``produce_report`` (what
  :func:`audit` returns) and the fuzzer's ``run_fuzz``. The API imports no command.

Importing this module (or :mod:`kvcontract`) is cheap: the prover (Z3) and the executable
system (torch) are imported by the calls that need them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvcontract.errors import (
    GeometryError,
    InputFileError,
    KvContractError,
    ProofError,
    UnknownClauseError,
    UnknownPropertyError,
    UnknownTargetError,
    UsageError,
    WitnessError,
)
from kvcontract.vocabulary import Impact, Verdict

if TYPE_CHECKING:
    from kvcontract.impl.bundle import Implementation
    from kvcontract.options import ProveOptions
    from kvcontract.proofs.runner import ProveReport
    from kvcontract.proofs.verdicts import TheoremResult
    from kvcontract.spec.geometry import Geometry
    from kvcontract.tools.fuzz import FuzzReport

__all__ = [
    "IMPL_ENV",
    "ContractViolation",
    "FuzzReport",
    "Geometry",
    "GeometryError",
    "Impact",
    "Implementation",
    "InputFileError",
    "KvContractError",
    "ProofError",
    "ProveReport",
    "TheoremResult",
    "UnknownClauseError",
    "UnknownPropertyError",
    "UnknownTargetError",
    "UsageError",
    "Verdict",
    "WitnessError",
    "assert_contract",
    "audit",
    "fuzz",
    "implementation_names",
    "load_implementation",
    "prove",
    "register_implementation",
    "replay",
    "replay_audit",
    "replay_fuzz",
]

IMPL_ENV = "KVCONTRACT_IMPL"
"""The environment variable generated reproducers (and the pytest plugin) read the
implementation from: a registered name or ``module:FILE.py``."""

MODULE_PREFIX = "module:"

ENTRY_POINT_GROUP = "kvcontract.implementations"
"""The entry-point group third-party packages register implementations in: each entry
point's name is the implementation's name, its object (``package.module:NAME``) an
:class:`Implementation`."""

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
"""``package.module:NAME`` (an attribute path after the colon)."""

_LAZY_TYPES = {
    "Implementation": "kvcontract.impl.bundle",
    "ProveReport": "kvcontract.proofs.runner",
    "TheoremResult": "kvcontract.proofs.verdicts",
    "FuzzReport": "kvcontract.tools.fuzz",
    "Geometry": "kvcontract.spec.geometry",
}
"""Result and input types, imported on first use (the prover's module imports Z3, the
fuzzer's torch)."""


def __getattr__(name: str) -> Any:
    module = _LAZY_TYPES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


class ContractViolation(AssertionError):
    """:func:`assert_contract` found a counterexample (or an undecided theorem): the
    message names each finding, its impact and its witness; ``report`` is the
    :class:`ProveReport`."""

    def __init__(self, message: str, report: ProveReport) -> None:
        super().__init__(message)
        self.report = report


# -- implementations ---------------------------------------------------------------------
def implementation_names() -> list[str]:
    """The registered implementations (``reference`` and the historic variants), then
    those installed packages provide in the ``kvcontract.implementations`` entry-point
    group."""
    from kvcontract.impl.variants import variant_names

    names: list[str] = variant_names()
    names += [name for name in sorted(_entry_points()) if name not in names]
    return names


def _entry_points() -> dict[str, Any]:
    """The installed ``kvcontract.implementations`` entry points, by name."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _checked(spec: str, obj: Any) -> Implementation:
    """``obj`` if it is an :class:`Implementation` (or a function of no arguments that
    returns one), else a usage error naming ``spec``."""
    from kvcontract.impl.bundle import Implementation

    if not isinstance(obj, Implementation) and callable(obj) and not isinstance(obj, type):
        try:
            obj = obj()
        except Exception as exc:
            raise UsageError(f"{spec}: calling it raised {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, Implementation):
        raise UsageError(
            f"{spec} is a {type(obj).__name__}, not a kvcontract Implementation (build one "
            "with dataclasses.replace(kvcontract.load_implementation('reference'), name=..., "
            "<function>=...))")
    return obj


def _imported_implementation(spec: str) -> Implementation:
    """``package.module:NAME``: the attribute ``NAME`` (dotted: an attribute path) of the
    importable module; an :class:`Implementation` or a function returning one."""
    import importlib

    module_name, _, attribute = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise UsageError(f"{spec}: cannot import {module_name} "
                         f"({type(exc).__name__}: {exc})") from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{spec}: {module_name} has no attribute {attribute}")
        obj = getattr(obj, part)
    return _checked(spec, obj)


def _entry_point_implementation(name: str, entry_point: Any) -> Implementation:
    try:
        obj = entry_point.load()
    except Exception as exc:
        raise UsageError(f"the {ENTRY_POINT_GROUP} entry point {name!r} "
                         f"({entry_point.value}) cannot be loaded: "
                         f"{type(exc).__name__}: {exc}") from None
    return _checked(f"{name} ({entry_point.value})", obj)


def load_implementation(spec: str | Implementation) -> Implementation:
    """The implementation ``spec`` names: a registered name (``reference``,
    ``upstream-current``, ...), ``module:FILE.py``, ``package.module:NAME`` (an importable
    module's :class:`Implementation`, or a function of no arguments returning one), the
    name of a ``kvcontract.implementations`` entry point of an installed package, or an
    :class:`Implementation` (returned as it is).

    ``module:FILE.py`` is a Python file that defines some of the bundle's functions under
    their names in ``kvcontract/impl/reference.py`` (``sliding_window_lookup``,
    ``load_window_size_in_chunks``, ``is_block_reachable``, ...; a helper of that module,
    such as ``segment_blocks``, counts too): the reference module runs first and the file
    runs over it, so a function the file does not define is the reference's, and one that
    calls a redefined helper sees the file's. A relative path is taken from the current
    folder. Loading the same unchanged file again returns the same object.

    Raises :class:`UnknownTargetError` for an unknown name, :class:`UsageError` or
    :class:`InputFileError` for a file that is missing, not Python, or defines none of the
    bundle's functions.
    """
    from kvcontract.impl.bundle import Implementation
    from kvcontract.impl.variants import VARIANTS

    if isinstance(spec, Implementation):
        return spec
    if not isinstance(spec, str):
        raise UsageError(f"an implementation is a registered name, module:FILE.py or an "
                         f"Implementation, not {type(spec).__name__}")
    text = spec.strip()
    if text.startswith(MODULE_PREFIX):
        return _module_implementation(text)
    if text in VARIANTS:
        return VARIANTS[text]
    if _IMPORT_PATH.match(text):
        return _imported_implementation(text)
    installed = _entry_points()
    if text in installed:
        return _entry_point_implementation(text, installed[text])
    raise UnknownTargetError(spec, [*VARIANTS, *sorted(installed), "module:FILE.py",
                                    "package.module:NAME"])


def register_implementation(impl: str | Implementation) -> str:
    """Register ``impl`` (anything :func:`load_implementation` takes) so that the prover's
    worker processes and the fuzzer find it by name, and return that name. A name already
    taken by another implementation (a ``dataclasses.replace`` of the reference keeps the
    name ``reference``) is registered as ``custom:NAME``."""
    from kvcontract.impl.variants import VARIANTS

    implementation = load_implementation(impl)
    name: str = implementation.name
    if VARIANTS.get(name) is implementation:
        return name
    if name in VARIANTS or not name.strip():
        base = f"custom:{name.strip() or 'implementation'}"
        name, number = base, 1
        while name in VARIANTS and VARIANTS[name] is not implementation:
            number += 1
            name = f"{base}#{number}"
        implementation = dataclasses.replace(implementation, name=name)
    VARIANTS[name] = implementation
    return name


@contextlib.contextmanager
def _registered(impl: str | Implementation) -> Iterator[str]:
    """:func:`register_implementation` for one call: an object the caller built is
    unregistered afterwards (built-in names and ``module:`` files stay)."""
    from kvcontract.impl.variants import VARIANTS

    new = VARIANTS.get(impl.name if not isinstance(impl, str) else impl.strip()) is None
    name = register_implementation(impl)
    try:
        yield name
    finally:
        if (new or name.startswith("custom:")) and not name.startswith(MODULE_PREFIX):
            VARIANTS.pop(name, None)


_MODULE_CACHE: dict[tuple[str, int, int], Implementation] = {}


def _module_implementation(spec: str) -> Implementation:
    """``module:FILE.py`` over the reference (see :func:`load_implementation`); the file
    is read and checked by :func:`kvcontract.proofs.sources.resolve_sources`, which
    decides which module it stands in for."""
    from kvcontract.impl.bundle import Implementation
    from kvcontract.impl.variants import REFERENCE
    from kvcontract.proofs.sources import (
        REFERENCE_MODULE,
        CallGraph,
        field_functions,
        resolve_sources,
        snapshot,
    )

    raw = spec[len(MODULE_PREFIX):].strip()
    path = Path(raw).expanduser()
    if path.is_dir():
        raise InputFileError(raw, "a folder; module:FILE.py names one Python file")
    try:
        stat = path.stat()
    except OSError:
        raise InputFileError(raw or spec, "no such file") from None
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key in _MODULE_CACHE:
        return _MODULE_CACHE[key]
    target = resolve_sources(f"{MODULE_PREFIX}{raw}")  # UsageError: unreadable, no role
    source = target.modules[0]
    fields = {f: where for f, where in field_functions(REFERENCE).items()}
    if source.name != REFERENCE_MODULE:
        raise UsageError(
            f"{spec}: the file defines functions of impl/scheduler.py; --impl module:FILE.py "
            "takes the implementation's own functions (those of impl/reference.py: "
            f"{', '.join(fields)}); `kvcontract mutate --impl module:FILE.py` takes a "
            "scheduler file")
    defined = _top_level_names(source.source)
    graph = CallGraph([snapshot(REFERENCE_MODULE)], fields)
    changed = [f for f, (_, qualname) in fields.items()
               if {q for _, q in graph.closure({(REFERENCE_MODULE, qualname)})} & defined]
    if not changed:
        raise UsageError(
            f"{spec}: the file defines none of the implementation's functions "
            f"({', '.join(fields)}) nor a helper they call, so it would check the reference")
    digest = hashlib.sha1(key[0].encode()).hexdigest()[:12]
    module = types.ModuleType(f"kvcontract_impl_{digest}")
    module.__file__ = source.path
    sys.modules[module.__name__] = module
    try:
        assert source.base_source is not None and source.base_path is not None
        exec(compile(source.base_source, source.base_path, "exec"), module.__dict__)
        exec(compile(source.source, source.path, "exec"), module.__dict__)
    except Exception as exc:
        raise InputFileError(raw, f"running it raised {type(exc).__name__}: {exc}") from None
    functions: dict[str, Any] = {}
    for name, (_, qualname) in fields.items():
        # A field is named for its role, its function for what it computes (the two
        # EAGLE-drop fields share ``drops_eagle_block``): read the function's own name.
        fn = getattr(module, qualname, None) if name in changed else getattr(REFERENCE, name)
        if not callable(fn):
            raise UsageError(f"{spec}: {qualname} is not a function in the file")
        functions[name] = fn
    implementation = Implementation(
        name=spec, description=f"{path.name}: {', '.join(changed)} over the reference",
        notes={"file": str(path.resolve())}, **functions)
    _MODULE_CACHE[key] = implementation
    return implementation


def _top_level_names(source: str) -> set[str]:
    """Functions, classes and assigned names a file defines at its top level (and the
    methods of its classes, as ``Class.method``)."""
    import ast

    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {f"{node.name}.{item.name}" for item in node.body
                          if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


# -- arguments, validated as the command line validates them ---------------------------
def _strings(option: str, value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    for item in items:
        if not isinstance(item, str):
            raise UsageError(f"{option} takes strings, not {item!r}")
    return tuple(items)


def _fail_on(value: str | Iterable[str | Impact] | None) -> frozenset[Impact]:
    from kvcontract.options import parse_fail_on
    from kvcontract.vocabulary import DEFAULT_FAIL_ON

    if value is None:
        return DEFAULT_FAIL_ON
    text = value if isinstance(value, str) else ",".join(
        _strings("fail_on", [v.value if isinstance(v, Impact) else v for v in value]))
    impacts: frozenset[Impact] = parse_fail_on(text)
    return impacts


def _int(option: str, value: Any, *, low: int | None = None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{option} must be an integer, not {value!r}")
    if low is not None and value < low:
        raise UsageError(f"{option} must be at least {low}, not {value}")
    return value


GeometryLike = Any
"""A :class:`Geometry`, a ``(label, Geometry)`` pair, a ``Geometry.to_dict`` mapping or a
path to a ``--geometry`` JSON file."""


def _scope(model: str | Iterable[str] | None, geometries: Iterable[GeometryLike] | None,
           bpc: int | Iterable[int] | None,
           retention: int | str | Iterable[int | str | None] | None,
           ) -> list[tuple[str, Any]]:
    """``--model``/``--geometry``/``--bpc``/``--retention`` as ``(label, Geometry)`` pairs,
    through :func:`kvcontract.options.resolve_geometries`."""
    from kvcontract.options import distinct_labels, load_geometry_file, resolve_geometries
    from kvcontract.spec.geometry import Geometry

    models = _strings("model", model)
    bpcs = tuple(int(_int("bpc", b) or 0) for b in ([] if bpc is None else
                                                    [bpc] if isinstance(bpc, int) else bpc))
    if retention is _NO_RETENTION:
        retentions: tuple[str, ...] = ()
    else:
        given = retention if isinstance(retention, (list, tuple, set)) else [retention]
        retentions = tuple("none" if r is None else str(r) for r in given)
    found = resolve_geometries(models, (), bpcs, retentions)
    for index, item in enumerate(list(geometries or ())):
        if isinstance(item, Geometry):
            found.append((item.describe(), item))
        elif (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
              and isinstance(item[1], Geometry)):
            found.append((item[0], item[1]))
        elif isinstance(item, Mapping):
            try:
                geometry = Geometry.from_dict(dict(item))
            except GeometryError as exc:
                raise UsageError(f"geometries[{index}]: {exc}") from None
            found.append((geometry.describe(), geometry))
        elif isinstance(item, (str, os.PathLike)):
            found.extend(load_geometry_file(os.fspath(item)))
        else:
            raise UsageError(f"geometries[{index}]: a Geometry, (label, Geometry), a "
                             f"Geometry.to_dict mapping or a JSON file path, not {item!r}")
    unique: list[tuple[str, Any]] = distinct_labels(found)
    return unique


_NO_RETENTION: Any = object()
"""``retention`` not given (``None`` means ``--retention none``)."""


# -- the commands ---------------------------------------------------------------------
def prove(impl: str | Implementation = "reference",
          clauses: str | Iterable[str] | None = None,
          model: str | Iterable[str] | None = None,
          geometries: Iterable[GeometryLike] | None = None,
          jobs: int | None = None, *,
          bpc: int | Iterable[int] | None = None,
          retention: Any = _NO_RETENTION,
          fail_on: str | Iterable[str | Impact] | None = None,
          cache: bool = False, shard: str | tuple[int, int] | None = None,
          fail_fast: bool = False) -> ProveReport:
    """``kvcontract prove``: every clause the prover decides (or ``clauses``) for
    ``impl``, on the built-in catalogues or on the geometries of ``model`` presets (at
    each ``bpc``, default 1, 4 and 16, and ``retention``: 0, None or an interval) and
    ``geometries``. ``jobs`` worker processes (default one per core). The
    :class:`ProveReport` has ``results`` (each a :class:`TheoremResult` with its
    verdict, witness and impact), ``exit_code`` (0, 1 or 3 as the command's, under
    ``fail_on``) and ``to_json()`` (its rows). The command line runs the same pipeline
    (:func:`~kvcontract.options.prove_options`, :func:`run_prove`): its ``--json``
    document is :func:`prove_document` of the report, defects and locations included.

    ``cache=True`` reads and writes the command line's proof cache (off by default: a
    library call leaves the user's cache folder alone); ``shard`` (``"I/N"`` or
    ``(I, N)``) proves one shard, as ``--shard``; ``fail_fast`` stops at the first
    counterexample that fails the run, as ``--fail-fast``."""
    from kvcontract.options import prove_options
    from kvcontract.proofs.shards import parse_shard

    implementation = load_implementation(impl)
    wanted = _strings("clauses", clauses)
    _int("jobs", jobs)
    failing = _fail_on(fail_on)
    scope = _scope(model, geometries, bpc, retention)
    if isinstance(shard, tuple):
        if len(shard) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                      for v in shard):
            raise UsageError(f"shard is 'I/N' or (I, N), not {shard!r}")
        shard = f"{shard[0]}/{shard[1]}"
    if shard is not None and not isinstance(shard, str):
        raise UsageError(f"shard is 'I/N' or (I, N), not {shard!r}")
    which = parse_shard(shard, "shard")
    with _registered(implementation) as name:
        options = prove_options(name, clauses=wanted, jobs=jobs, fail_on=failing,
                                scope=tuple(scope), cache=bool(cache), shard=which,
                                fail_fast=bool(fail_fast))
        return run_prove(options)


ROOT_CAUSE_CPU_SECONDS = 600.0
"""CPU seconds the child that locates the counterexamples' root causes may use (a
safety net: each is a handful of integer replays)."""


def _add_defects(data: dict[str, Any], impl_name: str, report_file: str | None = None) -> None:
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


def run_prove(options: ProveOptions,
              on_result: Callable[[TheoremResult, int, int], None] | None = None,
              ) -> ProveReport:
    """The prover on validated :class:`~kvcontract.options.ProveOptions` (the one run of
    ``kvcontract prove`` and :func:`prove`): ``on_result(result, done, total)`` after each
    theorem. :func:`prove_document` turns the report into the ``--json`` document."""
    from kvcontract.proofs.cache import ProofCache, cache_dir
    from kvcontract.proofs.runner import prove as run_prover
    from kvcontract.tools.interrupts import sigint_guard

    with sigint_guard():
        return run_prover(options.impl, list(options.clauses) or None, jobs=options.jobs,
                          on_result=on_result, fail_on=options.fail_on,
                          geometries=list(options.scope),
                          cache=ProofCache(cache_dir()) if options.cache else None,
                          shard=options.shard, fail_fast=options.fail_fast)


def prove_document(report: ProveReport, options: ProveOptions) -> dict[str, Any]:
    """The ``--json`` document of a prove run, the same for the command line and the
    API: the report's rows, its counterexamples grouped into defects by root cause (with
    the per-clause summary), the findings baseline applied and written as the options
    say, the exit code under that gate, and each row's source location and fingerprint
    (what the ``json`` format writes)."""
    from kvcontract.tools.reports.gate import finish_gate, gate_exit_code
    from kvcontract.tools.reports.json_format import json_document

    data = report.to_json()
    _add_defects(data, options.impl, options.report_file)
    finish_gate(data, options.findings_baseline, only_new=options.only_new,
                write_to=options.write_baseline)
    data["exit_code"] = gate_exit_code(data["results"], options.fail_on, options.only_new)
    return json_document(data)


def assert_contract(impl: str | Implementation = "reference",
                    clauses: str | Iterable[str] | None = None, **options: Any) -> ProveReport:
    """:func:`prove`, then raise :class:`ContractViolation` (an ``AssertionError``, so a
    test fails with it) when the report's exit code is not 0: a counterexample whose
    impact ``fail_on`` names, or an unknown or vacuous theorem. The message names each
    finding with its impact, message and witness (a witness replays with
    :func:`replay`). Returns the report when the contract holds."""
    import json

    __tracebackhide__ = True  # pytest shows the message, not this frame
    report = prove(impl, clauses, **options)
    if report.exit_code == 0:
        return report
    lines = [f"{report.target}: the contract does not hold (exit code {report.exit_code})"]
    for r in report.results:
        if r.verdict.passed:
            continue
        impact = f" [{r.impact}]" if r.impact else ""
        lines.append(f"{r.clause}/{r.theorem}: {r.verdict.value}{impact} {r.message}")
        if r.witness:
            lines.append(f"  witness: {json.dumps(r.witness, sort_keys=True)}")
    raise ContractViolation("\n".join(lines), report)


def fuzz(impl: str | Implementation = "reference", *, examples: int = 200, seed: int = 0,
         matrix: bool = False, device: str = "cpu",
         model: str | Iterable[str] | None = None,
         geometries: Iterable[GeometryLike] | None = None,
         bpc: int | Iterable[int] | None = None, retention: Any = _NO_RETENTION,
         fail_on: str | Iterable[str | Impact] | None = None) -> FuzzReport:
    """``kvcontract fuzz``: the seed scenarios (and the ``matrix``), then ``examples``
    Hypothesis programs, through the mocked and the tensor-backed managers in lockstep.
    The :class:`FuzzReport` has ``differences``, ``cases``, ``steps``, ``per_clause``,
    ``exit_code`` and ``to_json()``."""
    from kvcontract.options import fuzz_options
    from kvcontract.tools.fuzz import run_fuzz
    from kvcontract.tools.interrupts import sigint_guard

    implementation = load_implementation(impl)
    failing = _fail_on(fail_on)
    scope = tuple(_scope(model, geometries, bpc, retention))
    with _registered(implementation) as name, sigint_guard():
        options = fuzz_options(name, examples=examples, seed=seed, matrix=bool(matrix),
                               device=device, fail_on=failing, scope=scope)
        return run_fuzz(options.impl, device=options.device, examples=options.examples,
                        matrix=options.matrix, seed=options.seed, fail_on=options.fail_on,
                        geometries=list(options.scope))


def audit(target: str, *, baseline: str | None = None,
          clauses: str | Iterable[str] | None = None,
          model: str | Iterable[str] | None = None,
          geometries: Iterable[GeometryLike] | None = None,
          bpc: int | Iterable[int] | None = None, retention: Any = _NO_RETENTION,
          budget: int = 250_000, timeout: float = 2.0, jobs: int | None = None,
          fail_on: str | Iterable[str | Impact] | None = None, judge: str = "auto",
          costs: bool = True, live: bool = False, base: str | None = None,
          require_complete: bool = False) -> dict[str, Any]:
    """``kvcontract audit``: real vLLM code (``vllm:PATH``, ``vllm:installed``,
    ``module:FILE.py`` with upstream's function names, or a registered name) against the
    contract, with ``baseline`` a second target to compare with. ``judge``: ``auto``
    (vLLM's own engine where the target's vLLM imports, else kvcontract's stand-ins,
    their findings ``unconfirmed``), ``engine`` or ``stand-ins``; ``costs``: each
    defect measured on the model presets; ``live``: each defect's lost hits replayed on
    vLLM; ``base``: the release a patch is laid over (``--base``, default the installed
    vLLM). Returns the versioned report, the same document as ``--json`` (through the
    one pipeline, :func:`kvcontract.tools.audit.command.produce_report`); prints
    nothing."""
    from kvcontract.options import audit_request
    from kvcontract.tools.audit.command import produce_report
    from kvcontract.tools.audit.targets import AUTO, resolve_target
    from kvcontract.tools.interrupts import sigint_guard

    if not isinstance(target, str):
        raise UsageError(f"target is a string (vllm:PATH, module:FILE.py, ...), not {target!r}")
    _int("jobs", jobs)
    request = audit_request(
        fail_on=_fail_on(fail_on), clauses=_strings("clauses", clauses), timeout=timeout,
        budget=budget, jobs=jobs, scope=tuple(_scope(model, geometries, bpc, retention)),
        judge_mode=judge, costs=bool(costs), live=bool(live),
        require_complete=bool(require_complete))
    resolved = resolve_target(target, base=AUTO if base is None else base)
    resolved_baseline = None
    if baseline is not None:
        resolved_baseline = resolve_target(baseline, base=(
            resolved.base.spec if resolved.base is not None else "none"))
    with sigint_guard():
        report: dict[str, Any] = produce_report(resolved, resolved_baseline, request)
    return report


def replay(theorem_id: str, witness: Mapping[str, Any],
           impl: str | Implementation = "reference") -> str | None:
    """Re-run one witness (a report's ``witness`` object) of theorem ``theorem_id``
    (``C2/first-run-covers-load``) on ``impl``: the violation message, or None when the
    property holds there. No solver runs. Raises :class:`UnknownPropertyError` for an
    unknown id and :class:`WitnessError` for a malformed witness or one outside the
    theorem's domain."""
    from kvcontract.spec.properties import replay as replay_property

    if not isinstance(theorem_id, str):
        raise UsageError(f"a theorem id is a string such as 'C2/first-run-covers-load', not "
                         f"{theorem_id!r}")
    if not isinstance(witness, Mapping):
        raise WitnessError(f"{theorem_id}: a witness is a mapping (a report's 'witness' "
                           f"object), not {type(witness).__name__}")
    violation: str | None = replay_property(theorem_id, witness, load_implementation(impl))
    return violation


def replay_fuzz(witness: Mapping[str, Any],
                impl: str | Implementation = "reference") -> str | None:
    """Re-run the program of one fuzz finding (a fuzz report's ``witness`` object, with
    its ``replay``) on ``impl``, mocked and tensor-backed managers in lockstep with their
    monitors, as ``kvcontract fuzz`` ran it: the first finding of the witness's clause,
    or None when there is none. Raises :class:`WitnessError` for a witness without a
    replayable program (a report written before fuzz witnesses carried one) or a
    malformed one."""
    from kvcontract.tools.fuzz import replay_program

    if not isinstance(witness, Mapping):
        raise WitnessError(f"a fuzz witness is a mapping (a report's 'witness' object), not "
                           f"{type(witness).__name__}")
    replay = witness.get("replay")
    if not isinstance(replay, Mapping) or not isinstance(replay.get("clause"), str):
        raise WitnessError("this fuzz witness has no replayable program ('replay' with its "
                           "'clause'): rerun `kvcontract fuzz` to get one")
    clause = replay["clause"]
    for finding in replay_program(replay, load_implementation(impl)):
        if finding.clause == clause:
            return f"{finding.clause} {finding.kind}: {finding.message}"
    return None


def replay_audit(target: str, theorem_id: str, witness: Mapping[str, Any],
                 call_timeout: float = 10.0) -> str | None:
    """Re-run one witness of an audit report's theorem ``theorem_id`` (``C3/upstream-lookup-
    defers-only-in-scope``, ...) on the audit target ``target`` (``vllm:PATH``,
    ``module:FILE.py``, ...; the environment variable ``KVCONTRACT_AUDIT_TARGET``, when set,
    names another target, so a reproducer re-runs on a fixed release): the violation
    message, or None when the property holds there. The upstream functions are bound as
    the audit binds them, never imported; ``call_timeout`` (seconds) guards each call into
    them. What ``kvcontract audit --reproducers`` writes calls this."""
    from kvcontract.tools.audit.reproduce import replay_witness

    if not isinstance(theorem_id, str) or not isinstance(target, str):
        raise UsageError("replay_audit(target, theorem_id, witness): target and theorem_id "
                         "are strings")
    if not isinstance(witness, Mapping):
        raise WitnessError(f"{theorem_id}: a witness is a mapping (a report's 'witness' "
                           f"object), not {type(witness).__name__}")
    violation: str | None = replay_witness(target, theorem_id, dict(witness), call_timeout)
    return violation
