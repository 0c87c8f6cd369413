"""What a campaign mutates and which theorems judge each mutated function.

A target is a set of module sources, read once (a snapshot: the campaign never reads
the files again and never writes them), installed in every child process under their
module names, and the functions of them that are mutated:

* ``--impl reference``: every function of ``impl/reference.py`` and ``impl/scheduler.py``;
* ``--impl VARIANT``: the variant's own functions in ``impl/variants.py`` (and their
  helpers there), the reference functions it still runs, and ``impl/scheduler.py``;
* ``module:FILE.py``: the functions of that file, which stands in for
  ``impl/reference.py`` or ``impl/scheduler.py`` (whichever names it defines): the
  original module runs first and the file's definitions replace its names, so a file
  may hold one patched function or a whole copy.

Which theorems can kill a mutant of a function is read from the static call graph of
the sources: a property exercises the bundle functions it ``uses`` and, for the case
families, the scheduler's drivers its space declares (``CaseSpace.drivers``:
``lookup_complete_chunks`` for the lookup family, ``StoreTracker`` for the store family),
and everything those
call (``impl.f`` / ``self.impl.f`` resolve to the target bundle's function ``f``). A
function no property reaches is judged by every theorem that runs implementation code
("unsure: all clauses").
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcontract.errors import UsageError
from kvcontract.tools.mutate.operators import MutationPoint, enumerate_points, functions

REFERENCE_MODULE = "kvcontract.impl.reference"
SCHEDULER_MODULE = "kvcontract.impl.scheduler"
VARIANTS_MODULE = "kvcontract.impl.variants"



@dataclass(frozen=True)
class ModuleSource:
    """One module of the target, as installed in the child (a snapshot of its text)."""

    name: str
    path: str
    """The file whose text this is (compiled under this name: tracebacks point there)."""
    display: str
    """``path`` relative to the repository (or as given)."""
    source: str
    base_source: str | None = None
    """For a ``module:`` file: the original module, executed first (the file overlays it)."""
    base_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "display": self.display,
                "source": self.source, "base_source": self.base_source,
                "base_path": self.base_path}


@dataclass
class Target:
    """The modules of one campaign and the functions it mutates."""

    label: str
    """What the user named: ``reference``, ``stale-pending``, ``module:patch.py``."""
    impl_name: str
    """The registered implementation the prover and the fuzzer run (built from the
    installed, possibly mutated, modules)."""
    modules: list[ModuleSource]
    mutable: dict[str, set[str] | None]
    """Module name -> the functions mutated there (None: every function)."""
    field_functions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Implementation field -> ``(module, qualname)`` of the function the bundle holds."""

    def module(self, name: str) -> ModuleSource:
        for m in self.modules:
            if m.name == name:
                return m
        raise KeyError(name)

    def points(self, only_functions: Iterable[str] | None = None) -> list[MutationPoint]:
        """Every mutation point, in a deterministic order (module, then source order)."""
        wanted = set(only_functions) if only_functions else None
        points: list[MutationPoint] = []
        for m in self.modules:
            if m.name not in self.mutable:
                continue
            names = self.mutable[m.name]
            only = names if wanted is None else (
                wanted if names is None else names & wanted
            )
            points.extend(enumerate_points(m.source, m.name, m.display, only))
        return points

    def function_names(self) -> set[str]:
        names: set[str] = set()
        for m in self.modules:
            if m.name not in self.mutable:
                continue
            defined = {name for name, _ in functions(ast.parse(m.source))}
            chosen = self.mutable[m.name]
            names |= defined if chosen is None else defined & chosen
        return names


def _repo_root() -> Path:
    import kvcontract.impl

    return Path(kvcontract.impl.__file__).resolve().parents[1]


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(_repo_root()))
    except ValueError:
        return str(path)


def _module_file(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise UsageError(f"cannot locate module {name}")
    return Path(spec.origin)


def _snapshot(name: str) -> ModuleSource:
    path = _module_file(name)
    return ModuleSource(name=name, path=str(path), display=_display(path),
                        source=path.read_text(encoding="utf-8"))


def _field_functions(impl: Any) -> dict[str, tuple[str, str]]:
    from kvcontract.impl.bundle import Implementation

    fields: dict[str, tuple[str, str]] = {}
    for name in Implementation.__dataclass_fields__:
        fn = getattr(impl, name)
        if callable(fn) and hasattr(fn, "__module__") and hasattr(fn, "__qualname__"):
            fields[name] = (fn.__module__, fn.__qualname__)
    return fields


def resolve_target(spec: str) -> Target:
    """``NAME`` (a registered implementation) or ``module:FILE.py``; raises UsageError."""
    from kvcontract.impl.variants import REFERENCE, get_implementation

    if spec.startswith("module:"):
        return _module_target(spec)
    impl = get_implementation(spec)  # UnknownTargetError (a usage error) if unknown
    fields = _field_functions(impl)
    reference = _snapshot(REFERENCE_MODULE)
    scheduler = _snapshot(SCHEDULER_MODULE)
    if impl is REFERENCE:
        return Target(label=spec, impl_name=spec, modules=[reference, scheduler],
                      mutable={REFERENCE_MODULE: None, SCHEDULER_MODULE: None},
                      field_functions=fields)
    variants = _snapshot(VARIANTS_MODULE)
    modules = [reference, scheduler, variants]
    graph = CallGraph(modules, fields)
    ref_fields = _field_functions(REFERENCE)
    own = {qual for mod, qual in fields.values() if mod == VARIANTS_MODULE}
    roots = {(VARIANTS_MODULE, q) for q in own}
    roots |= {(mod, q) for mod, q in fields.values() if mod == REFERENCE_MODULE}
    roots |= {(SCHEDULER_MODULE, name) for name in graph.defined[SCHEDULER_MODULE]}
    live = graph.closure(roots)
    replaced = {ref_fields[f][1] for f, where in fields.items() if where != ref_fields.get(f)}
    ref_live = {q for m, q in live if m == REFERENCE_MODULE}
    ref_mutable = {q for q in graph.defined[REFERENCE_MODULE] if q not in replaced} | ref_live
    return Target(
        label=spec, impl_name=spec, modules=modules,
        mutable={
            REFERENCE_MODULE: ref_mutable,
            SCHEDULER_MODULE: None,
            VARIANTS_MODULE: {q for m, q in live if m == VARIANTS_MODULE},
        },
        field_functions=fields,
    )


def _module_target(spec: str) -> Target:
    from kvcontract.impl.variants import REFERENCE

    raw = spec[len("module:"):]
    path = Path(raw).expanduser()
    if not raw or path.suffix != ".py":
        raise UsageError(f"{spec}: expected module:FILE.py")
    if not path.is_file():
        raise UsageError(f"{spec}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        raise UsageError(f"{spec}: cannot read the file: {exc}") from None
    defined = {name for name, _ in functions(tree)}
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    overlap: dict[str, int] = {}
    for role in (REFERENCE_MODULE, SCHEDULER_MODULE):
        original = _snapshot(role)
        names = {n for n, _ in functions(ast.parse(original.source))}
        names |= {n.name for n in ast.parse(original.source).body if isinstance(n, ast.ClassDef)}
        overlap[role] = len((defined | classes) & names)
    role = max(overlap, key=lambda r: overlap[r])
    if overlap[role] == 0 or len(set(overlap.values())) == 1:
        raise UsageError(
            f"{spec}: the file must define functions of impl/reference.py or of "
            "impl/scheduler.py under their names (it stands in for that module)"
        )
    if not defined:
        raise UsageError(f"{spec}: the file defines no function to mutate")
    base = _snapshot(role)
    module = ModuleSource(name=role, path=str(path.resolve()), display=_display(path),
                          source=text, base_source=base.source, base_path=base.path)
    return Target(label=spec, impl_name="reference", modules=[module],
                  mutable={role: defined}, field_functions=_field_functions(REFERENCE))


# -- the call graph ------------------------------------------------------------------
Node = tuple[str, str]
"""``(module, qualname)``."""


class CallGraph:
    """Which functions each function of the sources refers to (statically)."""

    def __init__(self, modules: Iterable[ModuleSource],
                 field_functions: dict[str, tuple[str, str]]) -> None:
        self.fields = field_functions
        self.defined: dict[str, set[str]] = {}
        self.edges: dict[Node, set[Node]] = {}
        trees: dict[str, ast.Module] = {}
        for m in modules:
            tree = ast.parse(m.source)
            if m.base_source is not None:  # an overlay: the base's names remain
                base = ast.parse(m.base_source)
                own = {n for n, _ in functions(tree)}
                tree.body = [
                    n for n in base.body
                    if not (isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in own)
                ] + tree.body
            trees[m.name] = tree
            self.defined[m.name] = {name for name, _ in functions(tree)}
        for name, tree in trees.items():
            self._scan(name, tree)

    def _scan(self, module: str, tree: ast.Module) -> None:
        aliases: dict[str, str] = {}  # local name -> module
        imported: dict[str, Node] = {}  # local name -> (module, name)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if full in self.defined:
                        aliases[a.asname or a.name] = full
                    elif node.module in self.defined:
                        imported[a.asname or a.name] = (node.module, a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in self.defined:
                        aliases[a.asname or a.name] = a.name
        for qualname, fn in functions(tree):
            cls = qualname.split(".")[0] if "." in qualname else None
            refs: set[Node] = set()
            for sub in ast.walk(fn):
                if isinstance(sub, ast.Name):
                    if sub.id in self.defined[module]:
                        refs.add((module, sub.id))
                    elif sub.id in imported:
                        refs.add(imported[sub.id])
                elif isinstance(sub, ast.Attribute):
                    value = sub.value
                    if isinstance(value, ast.Name) and value.id in aliases:
                        if sub.attr in self.defined[aliases[value.id]]:
                            refs.add((aliases[value.id], sub.attr))
                    elif (isinstance(value, ast.Name) and value.id == "self" and cls
                          and f"{cls}.{sub.attr}" in self.defined[module]):
                        refs.add((module, f"{cls}.{sub.attr}"))
                    if sub.attr in self.fields and _is_impl(value):
                        refs.add(self.fields[sub.attr])
            self.edges[(module, qualname)] = refs

    def expand(self, module: str, pattern: str) -> set[Node]:
        if pattern.endswith(".*"):
            prefix = pattern[:-1]
            return {(module, q) for q in self.defined.get(module, ()) if q.startswith(prefix)}
        return {(module, pattern)} if pattern in self.defined.get(module, ()) else set()

    def closure(self, roots: Iterable[Node]) -> set[Node]:
        seen: set[Node] = set()
        stack = list(roots)
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            stack.extend(self.edges.get(node, ()))
        return seen


def _is_impl(value: ast.expr) -> bool:
    """``impl`` or ``self.impl`` (the bundle under test)."""
    if isinstance(value, ast.Name):
        return value.id == "impl"
    return (isinstance(value, ast.Attribute) and value.attr == "impl"
            and isinstance(value.value, ast.Name) and value.value.id == "self")


@dataclass(frozen=True)
class Judges:
    """The theorems that can kill mutants of one function."""

    theorems: tuple[str, ...]
    clauses: tuple[str, ...]
    mapped: bool
    """False when no property reaches the function (every theorem runs)."""


def theorem_map(target: Target) -> dict[str, Judges]:
    """Function qualname (per mutated module: ``module:qualname``) -> its judges."""
    from kvcontract.proofs.runner import catalog
    from kvcontract.spec.properties import CaseProperty

    modules = list(target.modules)
    names = {m.name for m in modules}
    for extra in (REFERENCE_MODULE, SCHEDULER_MODULE):
        if extra not in names:  # a module: file stands for one; the other is read too
            modules.append(_snapshot(extra))
    graph = CallGraph(modules, target.field_functions)
    theorems = catalog()
    reach: list[set[Node]] = []
    runs_code: list[bool] = []
    for prop in theorems:
        roots: set[Node] = {target.field_functions[u] for u in prop.uses
                            if u in target.field_functions}
        if isinstance(prop, CaseProperty):
            # The scheduler functions the space's observe calls (``CaseSpace.drivers``).
            for pattern in prop.space.drivers:
                roots |= graph.expand(SCHEDULER_MODULE, pattern)
        reach.append(graph.closure(roots))
        runs_code.append(bool(roots))
    every = tuple(t.theorem_id for t, runs in zip(theorems, runs_code, strict=True) if runs)
    mapping: dict[str, Judges] = {}
    for module, chosen in target.mutable.items():
        for qualname in (graph.defined.get(module, set()) if chosen is None else chosen):
            node = (module, qualname)
            ids = tuple(t.theorem_id for t, r in zip(theorems, reach, strict=True) if node in r)
            mapped = bool(ids)
            ids = ids or every
            clauses = sorted({i.split("/", 1)[0] for i in ids}, key=lambda c: int(c[1:]))
            mapping[f"{module}:{qualname}"] = Judges(ids, tuple(clauses), mapped)
    return mapping
