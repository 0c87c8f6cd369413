"""Lift operational Python arithmetic to Z3 terms by path enumeration.

The reference implementation is written the way upstream writes it: ``if`` statements,
``max``/``min``, floor division. To prove it equal to the spec for *all* inputs, each
function is run on :class:`SymInt` arguments. Every time Python needs the truth value of
a symbolic comparison (``if``, ``and``, ``max``), :class:`PathExplorer` forks: the run
takes one side and the other side is queued, unless the solver shows it infeasible. Each
completed run yields ``(path condition, result)``; the lifted term is the ``If`` chain
over the paths. This is symbolic execution in the style of CrossHair, restricted to
straight-line integer code: a loop over a symbolic bound is refused with
:class:`LiftError` instead of being unrolled forever.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import z3


class LiftError(Exception):
    """The function cannot be lifted (a symbolic loop bound, too many paths, ...)."""


class _Fork(Exception):
    pass


class _Run:
    def __init__(self, explorer: PathExplorer, decisions: list[bool]) -> None:
        self.explorer = explorer
        self.decisions = decisions
        self.position = 0
        self.condition: list[z3.BoolRef] = []
        self.branches: list[z3.BoolRef] = []
        """The condition decided at each position (not negated), for the decision tree."""

    def decide(self, cond: z3.BoolRef) -> bool:
        if self.position < len(self.decisions):
            choice = self.decisions[self.position]
        elif not self.explorer.prune:
            # Explore both sides without asking the solver: an infeasible path only adds
            # a dead branch to the If chain, and saves two solver calls per fork.
            self.explorer.queue.append([*self.decisions[:self.position], False])
            choice = True
            self.decisions.append(choice)
        else:
            can_true = self.explorer.feasible([*self.condition, cond])
            can_false = self.explorer.feasible([*self.condition, z3.Not(cond)])
            if can_true and can_false:
                self.explorer.queue.append([*self.decisions[:self.position], False])
                choice = True
            elif can_true:
                choice = True
            elif can_false:
                choice = False
            else:  # the path itself is infeasible: stop it
                raise _Fork()
            self.decisions.append(choice)
        self.position += 1
        self.condition.append(cond if choice else z3.Not(cond))
        self.branches.append(cond)
        return choice


_current: list[_Run] = []


def _term(value: Any) -> z3.ArithRef:
    if isinstance(value, SymInt):
        return value.term
    if isinstance(value, bool):
        return z3.IntVal(int(value))
    if isinstance(value, int):
        return z3.IntVal(value)
    if isinstance(value, z3.ArithRef):
        return value
    raise LiftError(f"cannot use {type(value).__name__} in symbolic arithmetic")


class SymBool:
    """A symbolic truth value; ``bool()`` of it forks the current run."""

    __slots__ = ("term",)

    def __init__(self, term: z3.BoolRef) -> None:
        self.term = term

    def __bool__(self) -> bool:
        if not _current:
            raise LiftError("a symbolic condition was evaluated outside a lifted run")
        simplified = z3.simplify(self.term)
        if z3.is_true(simplified):
            return True
        if z3.is_false(simplified):
            return False
        return _current[-1].decide(self.term)

    def __invert__(self) -> SymBool:
        return SymBool(z3.Not(self.term))


class SymInt:
    """A symbolic integer with Python's operators (floor semantics for positive divisors)."""

    __slots__ = ("term",)

    def __init__(self, term: z3.ArithRef) -> None:
        self.term = term

    def __add__(self, other: Any) -> SymInt:
        return SymInt(self.term + _term(other))

    def __radd__(self, other: Any) -> SymInt:
        return SymInt(_term(other) + self.term)

    def __sub__(self, other: Any) -> SymInt:
        return SymInt(self.term - _term(other))

    def __rsub__(self, other: Any) -> SymInt:
        return SymInt(_term(other) - self.term)

    def __mul__(self, other: Any) -> SymInt:
        return SymInt(self.term * _term(other))

    def __rmul__(self, other: Any) -> SymInt:
        return SymInt(_term(other) * self.term)

    def __neg__(self) -> SymInt:
        return SymInt(-self.term)

    def __pos__(self) -> SymInt:
        return self

    # Z3's integer division is Euclidean; it equals Python's floor division whenever
    # the divisor is positive, which every lifted function guarantees by its domain.
    def __floordiv__(self, other: Any) -> SymInt:
        return SymInt(self.term / _term(other))

    def __rfloordiv__(self, other: Any) -> SymInt:
        return SymInt(_term(other) / self.term)

    def __mod__(self, other: Any) -> SymInt:
        return SymInt(self.term % _term(other))

    def __rmod__(self, other: Any) -> SymInt:
        return SymInt(_term(other) % self.term)

    def __lt__(self, other: Any) -> SymBool:
        return SymBool(self.term < _term(other))

    def __le__(self, other: Any) -> SymBool:
        return SymBool(self.term <= _term(other))

    def __gt__(self, other: Any) -> SymBool:
        return SymBool(self.term > _term(other))

    def __ge__(self, other: Any) -> SymBool:
        return SymBool(self.term >= _term(other))

    def __eq__(self, other: Any) -> SymBool:  # type: ignore[override]
        return SymBool(self.term == _term(other))

    def __ne__(self, other: Any) -> SymBool:  # type: ignore[override]
        return SymBool(self.term != _term(other))

    def __hash__(self) -> int:
        return hash(self.term)

    def __bool__(self) -> bool:
        return bool(SymBool(self.term != 0))

    def __index__(self) -> int:
        raise LiftError(
            "the function uses a symbolic integer as an index or loop bound "
            "(range/len); it cannot be lifted for all values"
        )

    def __int__(self) -> int:
        raise LiftError("the function converts a symbolic integer with int()")


def _unwrap(value: Any) -> Any:
    if isinstance(value, SymInt):
        return value.term
    if isinstance(value, SymBool):
        return value.term
    if isinstance(value, bool):
        return z3.BoolVal(value)
    if isinstance(value, int):
        return z3.IntVal(value)
    if isinstance(value, tuple):
        return tuple(_unwrap(v) for v in value)
    if value is None:
        return None
    raise LiftError(f"cannot lift a result of type {type(value).__name__}")


def _wrap(value: Any) -> Any:
    if isinstance(value, z3.BoolRef):
        return SymBool(value)
    if isinstance(value, z3.ArithRef):
        return SymInt(value)
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    return value


def has_symbolic(value: Any) -> bool:
    """Whether a (possibly nested tuple) argument holds a Z3 term."""
    if isinstance(value, tuple):
        return any(has_symbolic(v) for v in value)
    return isinstance(value, z3.ExprRef)


def _merge(cond: z3.BoolRef, then: Any, other: Any) -> Any:
    if isinstance(then, tuple):
        return tuple(_merge(cond, a, b) for a, b in zip(then, other, strict=True))
    if then is None or other is None:
        if then is None and other is None:
            return None
        raise LiftError("a lifted function returns None on some paths only")
    return z3.If(cond, then, other)


class PathExplorer:
    """Runs a function on symbolic arguments over every feasible path."""

    def __init__(
        self, assumptions: Sequence[z3.BoolRef] = (), max_paths: int = 512, prune: bool = False
    ) -> None:
        self.assumptions = list(assumptions)
        self.prune = prune
        self.max_paths = max_paths
        self.queue: list[list[bool]] = []
        self.solver = z3.Solver()
        self.solver.set("rlimit", 2_000_000)
        self.solver.add(*self.assumptions)
        self.feasibility_queries = 0

    def feasible(self, conditions: list[z3.BoolRef]) -> bool:
        self.feasibility_queries += 1
        verdict = self.solver.check(*conditions)
        # unknown counts as feasible: exploring a dead path is sound, skipping a live one is not
        return bool(verdict != z3.unsat)

    def _runs(self, fn: Callable[..., Any], args: Sequence[Any]) -> list[tuple[_Run, Any]]:
        self.queue = [[]]
        runs: list[tuple[_Run, Any]] = []
        wrapped = [_wrap(a) for a in args]
        while self.queue:
            if len(runs) >= self.max_paths:
                raise LiftError(f"more than {self.max_paths} paths")
            run = _Run(self, self.queue.pop())
            _current.append(run)
            try:
                value = fn(*wrapped)
            except _Fork:
                continue
            finally:
                _current.pop()
            runs.append((run, _unwrap(value)))
        return runs

    def paths(self, fn: Callable[..., Any], args: Sequence[Any]) -> list[tuple[z3.BoolRef, Any]]:
        """Every feasible path as ``(path condition, result)``."""
        return [
            (z3.And(*run.condition) if run.condition else z3.BoolVal(True), value)
            for run, value in self._runs(fn, args)
        ]

    def lift(self, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        """The function's result as one term: an ``If`` tree over its decisions.

        Paths share prefixes, so the term is built as the decision tree the runs
        explored (each branch condition appears once) rather than as a chain of whole
        path conditions, which repeats every prefix and grows quadratically; the
        solver decides the tree form much faster (measured: C7 mask theorems).
        """
        runs = self._runs(fn, args)
        if not runs:
            raise LiftError("no feasible path")
        return _tree(runs, 0)


def _tree(runs: list[tuple[_Run, Any]], depth: int) -> Any:
    """The term for the runs that agree on their first ``depth`` decisions."""
    if len(runs) == 1 and len(runs[0][0].decisions) <= depth:
        return runs[0][1]
    deciding = [r for r in runs if len(r[0].decisions) > depth]
    if len(deciding) != len(runs):
        raise LiftError("the runs of a lifted function diverge without a decision")
    cond = deciding[0][0].branches[depth]
    taken = [r for r in runs if r[0].decisions[depth]]
    other = [r for r in runs if not r[0].decisions[depth]]
    if not taken:  # the other side was infeasible (pruned): the term holds under it
        return _tree(other, depth + 1)
    if not other:
        return _tree(taken, depth + 1)
    return _merge(cond, _tree(taken, depth + 1), _tree(other, depth + 1))


def call(fn: Callable[..., Any], *args: Any, assumptions: Sequence[z3.BoolRef] = ()) -> Any:
    """Call ``fn`` directly on concrete arguments, or lift it when any is a Z3 term."""
    if not any(has_symbolic(a) for a in args):
        return fn(*args)
    return PathExplorer(assumptions).lift(fn, args)
