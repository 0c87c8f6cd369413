"""An implementation's functions, read statically: its module sources (a snapshot of
their text) and the call graph between their functions.

Two users need the same reading, so it sits below both: the proof cache
(:mod:`kvcontract.proofs.cache`) keys a theorem's verdict by the text of the functions
the theorem reaches, and a mutation campaign (:mod:`kvcontract.tools.mutate`) mutates an
implementation's own functions and asks which theorems reach each one.

* ``reference``: every function of ``impl/reference.py`` and ``impl/scheduler.py``;
* a registered variant: its own functions in ``impl/variants.py`` (and their helpers
  there), the reference functions it still runs, and ``impl/scheduler.py``;
* ``module:FILE.py``: the functions of that file, which stands in for
  ``impl/reference.py`` or ``impl/scheduler.py`` (whichever names it defines): the
  original module runs first and the file's definitions replace its names, so a file
  may hold one patched function or a whole copy.

The call graph resolves ``impl.f`` / ``self.impl.f`` to the bundle's function ``f``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcontract.errors import UsageError

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
class ImplementationSources:
    """The modules of one implementation (a snapshot of their text) and the functions of
    them that are its own: what a mutation campaign mutates, what the proof cache keys on."""

    label: str
    """What the user named: ``reference``, ``stale-pending``, ``module:patch.py``."""
    impl_name: str
    """The registered implementation the prover and the fuzzer run (built from the
    installed, possibly mutated, modules)."""
    modules: list[ModuleSource]
    mutable: dict[str, set[str] | None]
    """Module name -> the functions of its own there (None: every function): a campaign
    mutates them."""
    field_functions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Implementation field -> ``(module, qualname)`` of the function the bundle holds."""

    def module(self, name: str) -> ModuleSource:
        for m in self.modules:
            if m.name == name:
                return m
        raise KeyError(name)

    def function_names(self) -> set[str]:
        names: set[str] = set()
        for m in self.modules:
            if m.name not in self.mutable:
                continue
            defined = {name for name, _ in functions(ast.parse(m.source))}
            chosen = self.mutable[m.name]
            names |= defined if chosen is None else defined & chosen
        return names


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Top-level functions and methods of top-level classes, in source order."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item



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


def snapshot(name: str) -> ModuleSource:
    path = _module_file(name)
    return ModuleSource(name=name, path=str(path), display=_display(path),
                        source=path.read_text(encoding="utf-8"))


def field_functions(impl: Any) -> dict[str, tuple[str, str]]:
    from kvcontract.impl.bundle import Implementation

    fields: dict[str, tuple[str, str]] = {}
    for name in Implementation.__dataclass_fields__:
        fn = getattr(impl, name)
        if callable(fn) and hasattr(fn, "__module__") and hasattr(fn, "__qualname__"):
            fields[name] = (fn.__module__, fn.__qualname__)
    return fields


def resolve_sources(spec: str) -> ImplementationSources:
    """``NAME`` (a registered implementation) or ``module:FILE.py``; raises UsageError."""
    from kvcontract.impl.variants import REFERENCE, get_implementation

    if spec.startswith("module:"):
        return _module_sources(spec)
    impl = get_implementation(spec)  # UnknownTargetError (a usage error) if unknown
    fields = field_functions(impl)
    reference = snapshot(REFERENCE_MODULE)
    scheduler = snapshot(SCHEDULER_MODULE)
    if impl is REFERENCE:
        return ImplementationSources(label=spec, impl_name=spec, modules=[reference, scheduler],
                      mutable={REFERENCE_MODULE: None, SCHEDULER_MODULE: None},
                      field_functions=fields)
    variants = snapshot(VARIANTS_MODULE)
    modules = [reference, scheduler, variants]
    graph = CallGraph(modules, fields)
    ref_fields = field_functions(REFERENCE)
    own = {qual for mod, qual in fields.values() if mod == VARIANTS_MODULE}
    roots = {(VARIANTS_MODULE, q) for q in own}
    roots |= {(mod, q) for mod, q in fields.values() if mod == REFERENCE_MODULE}
    roots |= {(SCHEDULER_MODULE, name) for name in graph.defined[SCHEDULER_MODULE]}
    live = graph.closure(roots)
    replaced = {ref_fields[f][1] for f, where in fields.items() if where != ref_fields.get(f)}
    ref_live = {q for m, q in live if m == REFERENCE_MODULE}
    ref_mutable = {q for q in graph.defined[REFERENCE_MODULE] if q not in replaced} | ref_live
    return ImplementationSources(
        label=spec, impl_name=spec, modules=modules,
        mutable={
            REFERENCE_MODULE: ref_mutable,
            SCHEDULER_MODULE: None,
            VARIANTS_MODULE: {q for m, q in live if m == VARIANTS_MODULE},
        },
        field_functions=fields,
    )


def _module_sources(spec: str) -> ImplementationSources:
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
        original = snapshot(role)
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
    base = snapshot(role)
    module = ModuleSource(name=role, path=str(path.resolve()), display=_display(path),
                          source=text, base_source=base.source, base_path=base.path)
    return ImplementationSources(label=spec, impl_name="reference", modules=[module],
                  mutable={role: defined}, field_functions=field_functions(REFERENCE))


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
                    if sub.attr in self.fields and is_impl_reference(value):
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


def is_impl_reference(value: ast.expr) -> bool:
    """``impl`` or ``self.impl`` (the bundle under test)."""
    if isinstance(value, ast.Name):
        return value.id == "impl"
    return (isinstance(value, ast.Attribute) and value.attr == "impl"
            and isinstance(value.value, ast.Name) and value.value.id == "self")
