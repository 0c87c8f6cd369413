"""Mutation operators over Python's ``ast``: enumerate the mutation points of a module's
functions and apply one to a copy of the source (the file on disk is never written).

Every operator is a small, plausible slip in integer code of this kind:

==================  =================================================================
``int-constant``    an integer literal ``c`` becomes ``c + 1`` or ``c - 1``
``comparison``      ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=`` (one operator)
``floor-ceil``      ``a // b`` -> ``-(-a // b)``; ``-(-a // b)`` and ``_cdiv(a, b)`` ->
                    ``a // b``
``drop-term``       ``x + e`` -> ``x`` and ``x - e`` -> ``x`` (the right operand)
``max-min``         ``max(...)`` <-> ``min(...)``
``negate-if``       the condition of an ``if`` statement, a conditional expression or a
                    comprehension filter becomes ``not (...)``
``delete-jump``     ``break`` / ``continue`` becomes ``pass``
``and-or``          ``and`` <-> ``or``
==================  =================================================================

Points are enumerated per function (top-level functions and the methods of top-level
classes; nested functions belong to their enclosing function) in source order, so a
point is identified by ``(function, index)`` and re-found by enumerating the same source
again. Docstrings, annotations, default values, decorators and f-strings are not
mutated (they are not the function's arithmetic).
"""

from __future__ import annotations

import ast
import copy
import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from kvcontract.proofs.sources import functions

OPERATORS: tuple[str, ...] = (
    "int-constant",
    "comparison",
    "floor-ceil",
    "drop-term",
    "max-min",
    "negate-if",
    "delete-jump",
    "and-or",
)
"""Every operator, in the order the tables list them."""

_FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
}

_CEIL_HELPERS = frozenset({"_cdiv", "cdiv"})
"""Calls read as a ceiling division ``cdiv(a, b) = -(-a // b)``."""


@dataclass(frozen=True)
class MutationPoint:
    """One mutant: where it is and what it changes (plain data, JSON-friendly)."""

    module: str
    """The module the source stands for, e.g. ``kvcontract.impl.reference``."""
    path: str
    """The file, as displayed (relative to the repository when inside it)."""
    function: str
    """Qualified name inside the module: ``get_num_skipped_tokens``, ``StoreTracker.step``."""
    index: int
    """Position among the function's points (source order)."""
    operator: str
    line: int
    col: int
    before: str
    """The original source of the changed line(s), whitespace collapsed."""
    after: str
    """The same line(s) with the change applied."""

    @property
    def id(self) -> str:
        short = self.module.rsplit(".", 1)[-1]
        return f"{short}:{self.function}#{self.index}"

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MutationPoint:
        fields = {k: data[k] for k in cls.__dataclass_fields__}
        return cls(**fields)


@dataclass
class _Candidate:
    node: ast.AST
    operator: str
    replacement: Callable[[], ast.AST]
    """Builds the node that replaces ``node`` (a fresh copy each time)."""


# -- enumeration ---------------------------------------------------------------------
def _body_nodes(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """The function body's nodes in source (pre-)order, without its docstring,
    annotations, nested signatures, decorators and f-strings."""
    body = list(fn.body)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        children: list[ast.AST] = []
        for name, value in ast.iter_fields(node):
            if isinstance(node, ast.AnnAssign) and name == "annotation":
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and name in (
                "args", "returns", "decorator_list", "type_params",
            ):
                continue
            items = value if isinstance(value, list) else [value]
            children.extend(v for v in items if isinstance(v, ast.AST))
        children = [c for c in children if not isinstance(c, ast.JoinedStr)]
        stack.extend(reversed(children))


def _is_ceil(node: ast.AST) -> tuple[ast.expr, ast.expr] | None:
    """``(a, b)`` when ``node`` is ``-(-a // b)`` or ``_cdiv(a, b)``."""
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.BinOp)
        and isinstance(node.operand.op, ast.FloorDiv)
        and isinstance(node.operand.left, ast.UnaryOp)
        and isinstance(node.operand.left.op, ast.USub)
    ):
        return node.operand.left.operand, node.operand.right
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _CEIL_HELPERS
        and len(node.args) == 2
        and not node.keywords
    ):
        return node.args[0], node.args[1]
    return None


def _copy(node: ast.AST) -> Any:
    return copy.deepcopy(node)


def _floordiv(a: ast.expr, b: ast.expr) -> ast.expr:
    return ast.BinOp(left=_copy(a), op=ast.FloorDiv(), right=_copy(b))


def _ceildiv(a: ast.expr, b: ast.expr) -> ast.expr:
    inner = ast.BinOp(left=ast.UnaryOp(op=ast.USub(), operand=_copy(a)), op=ast.FloorDiv(),
                      right=_copy(b))
    return ast.UnaryOp(op=ast.USub(), operand=inner)


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


def _constant(node: ast.Constant, delta: int) -> ast.AST:
    assert type(node.value) is int
    return ast.Constant(value=node.value + delta)


def _flip_compare(node: ast.Compare, i: int, new: type[ast.cmpop]) -> ast.AST:
    changed: ast.Compare = _copy(node)
    changed.ops[i] = new()
    return changed


def _left(node: ast.BinOp) -> ast.AST:
    left: ast.AST = _copy(node.left)
    return left


def _swap_extreme(node: ast.Call) -> ast.AST:
    changed: ast.Call = _copy(node)
    assert isinstance(node.func, ast.Name) and isinstance(changed.func, ast.Name)
    changed.func.id = "min" if node.func.id == "max" else "max"
    return changed


def _negate(test: ast.expr) -> ast.AST:
    return ast.UnaryOp(op=ast.Not(), operand=_copy(test))


def _pass() -> ast.AST:
    return ast.Pass()


def _flip_boolop(node: ast.BoolOp) -> ast.AST:
    changed: ast.BoolOp = _copy(node)
    changed.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    return changed


def _candidates(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[_Candidate]:
    found: list[_Candidate] = []
    ceil_inner: set[int] = set()

    def add(node: ast.AST, operator: str, build: Callable[..., ast.AST], *args: Any) -> None:
        found.append(_Candidate(node, operator, functools.partial(build, *args)))

    for node in _body_nodes(fn):
        pair = _is_ceil(node)
        if pair is not None:
            if isinstance(node, ast.UnaryOp):
                ceil_inner.add(id(node.operand))
            add(node, "floor-ceil", _floordiv, *pair)
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv)
              and id(node) not in ceil_inner):
            add(node, "floor-ceil", _ceildiv, node.left, node.right)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            for delta in (1, -1):
                add(node, "int-constant", _constant, node, delta)
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                flipped = _FLIP.get(type(op))
                if flipped is not None:
                    add(node, "comparison", _flip_compare, node, i, flipped)
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, (ast.Add, ast.Sub))
            and not (_is_text(node.left) or _is_text(node.right))
        ):
            add(node, "drop-term", _left, node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("max", "min")
        ):
            add(node, "max-min", _swap_extreme, node)
        elif isinstance(node, (ast.If, ast.IfExp)):
            add(node.test, "negate-if", _negate, node.test)
        elif isinstance(node, ast.comprehension):
            for cond in node.ifs:
                add(cond, "negate-if", _negate, cond)
        elif isinstance(node, (ast.Break, ast.Continue)):
            add(node, "delete-jump", _pass)
        elif isinstance(node, ast.BoolOp):
            add(node, "and-or", _flip_boolop, node)
    # Source order (line, column), stable for several mutants of one node.
    order = sorted(range(len(found)), key=lambda k: (
        getattr(found[k].node, "lineno", 0), getattr(found[k].node, "col_offset", 0), k,
    ))
    return [found[k] for k in order]


def _collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _describe(lines: list[str], node: ast.AST, replacement: ast.AST) -> tuple[str, str]:
    """The changed line(s) before and after, whitespace collapsed."""
    first, last = node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]
    col, end_col = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
    before_lines = lines[first - 1:last]
    text = "\n".join(before_lines)
    offset_start = col
    offset_end = sum(len(x) + 1 for x in before_lines[:-1]) + (end_col or 0)
    new = ast.unparse(replacement)
    after = text[:offset_start] + new + text[offset_end:]
    return _collapse(text), _collapse(after)


def enumerate_points(
    source: str, module: str, path: str, only: set[str] | None = None
) -> list[MutationPoint]:
    """Every mutation point of every function of ``source`` (deterministic order), or of
    the functions named in ``only``."""
    tree = ast.parse(source)
    lines = source.splitlines()
    points: list[MutationPoint] = []
    for name, fn in functions(tree):
        if only is not None and name not in only:
            continue
        for index, cand in enumerate(_candidates(fn)):
            before, after = _describe(lines, cand.node, cand.replacement())
            points.append(MutationPoint(
                module=module, path=path, function=name, index=index,
                operator=cand.operator, line=cand.node.lineno,  # type: ignore[attr-defined]
                col=cand.node.col_offset, before=before, after=after,  # type: ignore[attr-defined]
            ))
    return points


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, replacement: ast.AST) -> None:
        self.target = target
        self.replacement = replacement

    def visit(self, node: ast.AST) -> Any:
        if node is self.target:
            return ast.copy_location(self.replacement, node)
        return self.generic_visit(node)


@dataclass
class Located:
    """A mutation point found in a fresh tree of its source (nothing applied yet)."""

    tree: ast.Module
    function: ast.FunctionDef | ast.AsyncFunctionDef
    node: ast.AST
    """The node the point changes (in :attr:`tree`)."""
    replacement: ast.AST
    """What replaces it (a fresh node, not in the tree)."""
    qualname: str = ""
    """The function's qualified name (``StoreTracker.step``: a method of its class)."""


def locate(source: str, point: MutationPoint) -> Located:
    """``point`` in a fresh tree of ``source``: the function, the node it changes and
    its replacement (what :func:`mutate_tree` applies; the equivalence rules that read
    the source, :mod:`kvcontract.tools.mutate.equivalence`, inspect it).

    Raises ValueError when the point does not match the source (it changed since the
    points were enumerated).
    """
    tree = ast.parse(source)
    fns = dict(functions(tree))
    if point.function not in fns:
        raise ValueError(f"no function {point.function} in {point.path}")
    candidates = _candidates(fns[point.function])
    if point.index >= len(candidates):
        raise ValueError(f"{point.id}: the source has changed since enumeration")
    cand = candidates[point.index]
    if (cand.operator, getattr(cand.node, "lineno", None)) != (point.operator, point.line):
        raise ValueError(f"{point.id}: the source has changed since enumeration")
    return Located(tree, fns[point.function], cand.node, cand.replacement(), point.function)


def mutate_tree(source: str, point: MutationPoint) -> ast.Module:
    """A fresh tree of ``source`` with ``point`` applied (line numbers kept).

    Raises ValueError when the point does not match the source (it changed since the
    points were enumerated).
    """
    found = locate(source, point)
    _Replace(found.node, found.replacement).visit(found.tree)
    return ast.fix_missing_locations(found.tree)


def mutated_source(source: str, point: MutationPoint) -> str:
    """The mutated module as text (for display and tests; the campaign compiles the tree
    so that line numbers match the original file)."""
    return ast.unparse(mutate_tree(source, point))


def function_source(source: str, point: MutationPoint) -> str:
    """The mutated function alone, as text."""
    tree = mutate_tree(source, point)
    return ast.unparse(dict(functions(tree))[point.function])
