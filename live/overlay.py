"""Lay a patch's Python over the installed vLLM, in the process that drives it.

``audit --live`` of a patch (``module:FILE.py``) or of a source tree must run the
*patched* code on vLLM's own scheduler, not the release's. The patch is laid over the
installed wheel definition by definition, the way the stand-in audit binds it
(:mod:`kvcontract.tools.audit.binding`: the patch first, every function it does not
define the release's own):

* a function or method the patch defines under a qualified name the release's module
  defines (``Class.method``, or a top-level ``function``) replaces the release's: the
  patch's definition is compiled in the release module's namespace (its globals are the
  module's), a method is set on the release's own class (so every instance, every
  subclass that does not override it and every module that imported the class run it),
  and a top-level function is rebound in the module and in every loaded ``vllm``
  module that imported it by name (a reference kept elsewhere, in a table or a
  default argument, keeps the release's);
* a definition the patch nests elsewhere (a bare ``_build_store_jobs`` at top level, or
  in another class) replaces the release's definition of that name when exactly one of
  the candidate files defines it (the binding's ``any_class`` rule);
* what else the patch defines (helpers, classes, imports, constants) is added to the
  module its replacements go to, where the release has no such name: the release's
  names are never overwritten except by the replacements.

:func:`plan_overlay` reads files only (``ast``; no vLLM import), so the audit plans in
its own process and hands the plan to the sandbox child; :func:`install` runs there,
after the live environment is prepared and before any case: it imports the release's
modules and applies the plan. A zero-argument ``super()`` in a replaced method refers to
the release's class (its ``__class__`` cell is set to it).
"""

from __future__ import annotations
import __future__

import ast
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

from kvcontract.errors import InputFileError


@dataclass(frozen=True)
class Layer:
    """One file's definitions laid over one module of the release."""

    module: str
    """The release module (``vllm.distributed...offloading.scheduler``)."""
    source: str
    """The patch file the definitions come from."""
    replaced: tuple[tuple[str, str], ...]
    """``(patch qualname, release qualname)`` of every replaced definition."""
    added: tuple[str, ...] = ()
    """Top-level names of the patch added to the module (the release lacks them)."""


@dataclass(frozen=True)
class Overlay:
    """What :func:`install` lays over the release (empty: the release as it is)."""

    layers: tuple[Layer, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.layers

    def replaced(self) -> list[str]:
        """``module:qualname`` of every replaced release definition."""
        return [f"{layer.module.rsplit('.', 1)[-1]}.py:{release}"
                for layer in self.layers for _, release in layer.replaced]

    def to_json(self) -> dict[str, Any]:
        return {"layers": [{"module": layer.module, "source": layer.source,
                            "replaced": [list(pair) for pair in layer.replaced],
                            "added": list(layer.added)} for layer in self.layers],
                "notes": list(self.notes)}


@dataclass
class _Definitions:
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    """Qualified name -> definition (methods of nested classes included)."""
    classes: set[str] = field(default_factory=set)
    top: list[ast.stmt] = field(default_factory=list)


def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    except (OSError, SyntaxError, ValueError) as exc:
        raise InputFileError(str(path), f"cannot parse: {exc}") from None


def _definitions(tree: ast.Module) -> _Definitions:
    found = _Definitions(top=list(tree.body))

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.functions.setdefault(prefix + node.name, node)
            elif isinstance(node, ast.ClassDef):
                found.classes.add(prefix + node.name)
                walk(node.body, prefix + node.name + ".")

    walk(tree.body, "")
    return found


def module_name(relative: str, package: str = "vllm") -> str:
    """The dotted module of a file relative to the ``package`` folder."""
    return f"{package}." + relative.removesuffix(".py").replace("/", ".")


def plan_overlay(patch: Path, release_package: Path, candidates: Sequence[str], *,
                 package: str = "vllm") -> Overlay:
    """The overlay of one patch file over the release at ``release_package`` (the
    ``vllm`` folder, imported as ``package``): each definition matched in
    ``candidates`` (files relative to it; a tree's file names its own one)."""
    patch_defs = _definitions(_parse(patch))
    release: dict[str, _Definitions] = {
        rel: _definitions(_parse(release_package / rel)) for rel in candidates
        if (release_package / rel).is_file()}
    by_file: dict[str, list[tuple[str, str]]] = {}
    notes: list[str] = []
    for qualname in patch_defs.functions:
        exact = [rel for rel, defs in release.items() if qualname in defs.functions]
        for rel in exact:  # a name two files define (moved between releases): both
            by_file.setdefault(rel, []).append((qualname, qualname))
        if exact:
            continue
        bare = qualname.rsplit(".", 1)[-1]
        named = [(rel, q) for rel, defs in release.items() for q in defs.functions
                 if q.rsplit(".", 1)[-1] == bare and "." in q]
        if len(named) == 1:
            by_file.setdefault(named[0][0], []).append((qualname, named[0][1]))
        elif len(named) > 1:
            notes.append(f"{patch.name}: {qualname} matches {len(named)} definitions of the "
                         "release (" + ", ".join(q for _, q in named) + "): not laid over")
    for rel, replaced in by_file.items():
        for patch_name, release_name in replaced:
            _require_fitting(patch, patch_defs.functions[patch_name],
                             release[rel].functions[release_name], release_name)
    layers = []
    for rel in candidates:
        pairs = by_file.get(rel)
        if not pairs:
            continue
        defs = release[rel]
        top_names = _bound_names(defs.top)
        added = sorted(_bound_names(patch_defs.top) - top_names
                       - {q.split(".", 1)[0] for q, _ in pairs if "." not in q})
        layers.append(Layer(module_name(rel, package), str(patch), tuple(pairs), tuple(added)))
    if not layers:
        notes.append(f"{patch.name} defines none of the release's functions in "
                     + ", ".join(candidates) + ": nothing laid over")
    return Overlay(tuple(layers), tuple(notes))


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], set[str], bool]:
    """A definition's parameter names, those without a default, and whether it takes
    any further argument (``*args`` or ``**kwargs``)."""
    args = node.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    required = set(positional[:len(positional) - len(args.defaults)])
    required |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                 if d is None}
    names = positional + [a.arg for a in args.kwonlyargs]
    return names, required, args.vararg is not None or args.kwarg is not None


def _require_fitting(patch: Path, ours: ast.FunctionDef | ast.AsyncFunctionDef,
                     theirs: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str) -> None:
    """A patch's definition must take what the release's callers pass to the one it
    replaces: a parameter the release's definition has and the patch's lacks (or one
    the patch requires and the release's callers never pass) means the patch was
    written for another release, and vLLM would fail calling it. :class:`OverlayError`
    naming both signatures (the audit's gap, never a verdict about vLLM)."""
    our_names, our_required, our_rest = _parameters(ours)
    their_names, _, _ = _parameters(theirs)
    lacking = [n for n in their_names if n not in our_names] if not our_rest else []
    unknown = sorted(our_required - set(their_names))
    if lacking or unknown:
        why = (f"lacks {', '.join(lacking)}" if lacking else
               f"requires {', '.join(unknown)}")
        raise OverlayError(
            f"{patch.name}: {qualname}({', '.join(our_names)}) {why}, where the release's "
            f"{qualname}({', '.join(their_names)}) is what its callers call: the patch was "
            "written for another release (audit it with that release as --base)")


def combine(overlays: Sequence[Overlay]) -> Overlay:
    return Overlay(tuple(layer for o in overlays for layer in o.layers),
                   tuple(note for o in overlays for note in o.notes))


def _bound_names(body: list[ast.stmt]) -> set[str]:
    """Top-level names a module body binds (definitions, imports, assignments)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names
                         if a.name != "*")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


_FLAGS = __future__.annotations.compiler_flag


def _compile(nodes: list[ast.stmt], source: str) -> Any:
    module = ast.Module(body=nodes, type_ignores=[])
    ast.fix_missing_locations(module)
    return compile(module, source, "exec", flags=_FLAGS, dont_inherit=True)


def _resolve(module: ModuleType, qualname: str) -> tuple[Any, str]:
    """The object holding ``qualname``'s last part (the module or a class), and it."""
    *path, name = qualname.split(".")
    owner: Any = module
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def _add_names(module: ModuleType, body: list[ast.stmt], names: set[str], source: str,
               notes: list[str]) -> None:
    """Run the patch's top-level statements that bind ``names`` in a copy of the
    module's namespace; copy those names into the module."""
    for node in body:
        bound = _bound_names([node]) & names
        if not bound:
            continue
        scratch = dict(vars(module))
        try:
            exec(_compile([node], source), scratch)
        except Exception as exc:
            notes.append(f"{source}:{node.lineno}: {type(exc).__name__}: {exc} (not added)")
            continue
        for name in bound:
            if name in scratch:
                setattr(module, name, scratch[name])


def _method(owner: type, node: ast.FunctionDef | ast.AsyncFunctionDef, module: ModuleType,
            source: str) -> Any:
    """``node`` compiled as a method of a stand-in class in the module's namespace, its
    ``__class__`` cell pointed at ``owner`` (what zero-argument ``super()`` reads)."""
    holder = ast.ClassDef(name=owner.__name__, bases=[], keywords=[], body=[node],
                          decorator_list=[])
    scope: dict[str, Any] = {}
    exec(_compile([holder], source), vars(module), scope)
    raw = vars(scope[owner.__name__])[node.name]
    function = getattr(raw, "__func__", getattr(raw, "fget", raw))
    if isinstance(function, FunctionType) and function.__closure__:
        for name, cell in zip(function.__code__.co_freevars, function.__closure__,
                              strict=True):
            if name == "__class__":
                cell.cell_contents = owner
    return raw


def _rebind(package: str, old: Any, new: Any) -> int:
    """Every loaded module of ``package`` that imported ``old`` by name gets ``new``."""
    count = 0
    for name, loaded in list(sys.modules.items()):
        if loaded is None or not (name == package or name.startswith(package + ".")):
            continue
        for attribute, value in list(vars(loaded).items()):
            if value is old:
                setattr(loaded, attribute, new)
                count += 1
    return count


class OverlayError(RuntimeError):
    """A patch's definition could not be laid over the release (it does not compile or
    its decorators do not run in the release module): the live run would not be the
    patch's, so nothing runs."""


def install(overlay: Overlay) -> list[str]:
    """Apply ``overlay`` to the release in this process (the live child); what it did,
    one line per replaced definition, and any note. Raises :class:`OverlayError` naming
    the definition that cannot be laid over."""
    lines = list(overlay.notes)
    for layer in overlay.layers:
        try:
            lines += _install_layer(layer, lines)
        except OverlayError:
            raise
        except Exception as exc:
            raise OverlayError(f"laying {layer.source} over {layer.module} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
    return lines


def _install_layer(layer: Layer, notes: list[str]) -> list[str]:
    """One layer laid over its module; a helper that cannot run is a line of ``notes``."""
    lines: list[str] = []
    module = importlib.import_module(layer.module)
    tree = _parse(Path(layer.source))
    defs = _definitions(tree)
    _add_names(module, tree.body, set(layer.added) - set(vars(module)), layer.source,
               notes)
    for patch_qualname, release_qualname in layer.replaced:
        node = defs.functions[patch_qualname]
        owner, name = _resolve(module, release_qualname)
        old = vars(owner).get(name)
        if isinstance(owner, type):
            setattr(owner, name, _method(owner, node, module, layer.source))
            lines.append(f"{layer.module}: {release_qualname} <- {layer.source}:"
                         f"{node.lineno}")
            continue
        scope: dict[str, Any] = {}
        exec(_compile([node], layer.source), vars(module), scope)
        new = scope[node.name]
        setattr(module, name, new)
        rebound = _rebind(layer.module.split(".")[0], old, new) if old is not None else 0
        lines.append(f"{layer.module}: {release_qualname} <- {layer.source}:{node.lineno}"
                     + (f" (rebound in {rebound} places)" if rebound > 1 else ""))
    return lines


__all__ = ["Layer", "Overlay", "OverlayError", "combine", "install", "module_name",
           "plan_overlay"]
