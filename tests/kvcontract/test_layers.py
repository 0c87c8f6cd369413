"""The package's layers: every import (function-local and ``TYPE_CHECKING`` ones too)
points down the order of :data:`LAYERS`, and no set of modules imports itself round.

A function-local import is still a dependency: it only hides the cycle from the
interpreter until the function runs. So the graph here is read from the sources (AST),
never from ``sys.modules``. Within a layer imports may go either way as long as they
form no cycle. ARCHITECTURE.md draws the same order.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvcontract
import kvcontract.impl
import kvcontract.live
import kvcontract.proofs
import kvcontract.spec
import kvcontract.tools

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vocabulary", ("kvcontract.errors", "kvcontract.vocabulary", "kvcontract.releases",
                    "kvcontract.inputs")),
    ("spec", ("kvcontract.spec",)),
    ("impl", ("kvcontract.impl",)),
    ("properties", ("kvcontract.spec.properties",)),
    ("proofs", ("kvcontract.proofs",)),
    ("reports", ("kvcontract.tools.reports",)),
    ("engines", ("kvcontract.tools", "kvcontract.live", "kvcontract.tools.reports.merge")),
    ("api", ("kvcontract", "kvcontract.api", "kvcontract.options", "kvcontract.strategies",
             "kvcontract.pytest_plugin", "kvcontract.monitor")),
    ("commands", ("kvcontract.tools.commands", "kvcontract.tools.cli", "kvcontract.tools.config",
                  "kvcontract.__main__")),
)
"""Bottom first: a module belongs to the layer of its longest matching prefix. The
clause properties judge an :class:`~kvcontract.impl.bundle.Implementation`, so they sit
above ``impl``; the report documents and renderers read finished reports and import no
engine (``reports.merge`` joins shard reports of the engines, so it is one of them)."""

PACKAGES = (kvcontract, kvcontract.spec, kvcontract.impl, kvcontract.proofs, kvcontract.tools,
            kvcontract.live)


def _modules() -> dict[str, Path]:
    """Every module of the distribution, by dotted name (the folders map to subpackages,
    pyproject.toml)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        root = Path(str(package.__file__)).parent
        for path in sorted(root.rglob("*.py")):
            if package is kvcontract and path.parent != root:
                continue  # kvcontract/ holds only the core modules; the rest map in
            parts = [package.__name__, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """``(imported module, line)`` for every import statement of the file, at any depth."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            # ``from pkg import sub`` depends on the submodule, ``from mod import name``
            # on the module.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                yield target, node.lineno


EDGES: dict[str, dict[str, list[int]]] = {}
for _module, _path in MODULES.items():
    for _target, _line in _imports(_module, _path):
        EDGES.setdefault(_module, {}).setdefault(_target, []).append(_line)


def layer_of(module: str) -> int:
    best, rank = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    return rank


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in MODULES:
        if root in index:
            continue
        work = [(root, iter(sorted(EDGES.get(root, {}))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(EDGES.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_has_a_layer() -> None:
    assert len(MODULES) > 100, sorted(MODULES)  # the walk found the distribution
    assert [m for m in MODULES if layer_of(m) < 0] == []


def test_no_import_goes_up_a_layer() -> None:
    upward = [f"{source} ({LAYERS[layer_of(source)][0]}) imports {target} "
              f"({LAYERS[layer_of(target)][0]}) at line {', '.join(map(str, sorted(set(lines))))}"
              for source, targets in sorted(EDGES.items())
              for target, lines in sorted(targets.items())
              if layer_of(target) > layer_of(source)]
    assert upward == []


def test_no_import_cycle() -> None:
    described = []
    for component in _cycles():
        members = set(component)
        described.append("; ".join(
            f"{source} -> {target} (line {', '.join(map(str, sorted(set(lines))))})"
            for source in component
            for target, lines in sorted(EDGES.get(source, {}).items()) if target in members))
    assert described == []


@pytest.mark.parametrize("source, target", [
    ("kvcontract.spec.geometry", "kvcontract.impl.reference"),
    ("kvcontract.proofs.runner", "kvcontract.tools.audit.engine"),
    ("kvcontract.tools.audit.engine", "kvcontract.api"),
    ("kvcontract.api", "kvcontract.tools.commands.prove"),
])
def test_the_order_forbids_what_it_should(source: str, target: str) -> None:
    """The check itself: an import from each of these modules to the other goes up."""
    assert source in MODULES and target in MODULES
    assert layer_of(target) > layer_of(source)


def test_a_function_local_import_counts() -> None:
    """``api.prove`` imports the prover inside the function: the edge is still there."""
    assert "kvcontract.proofs.runner" in EDGES["kvcontract.api"]
