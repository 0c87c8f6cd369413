"""Arithmetic that means the same thing on Python ints and on Z3 terms.

Every formula of the spec is written once with these helpers. Called with ints they
compute a number; called with Z3 integer terms they build a formula. Divisors must be
positive: for a positive divisor Z3's Euclidean ``/`` and ``%`` coincide with Python's
floor ``//`` and ``%`` even for negative dividends, so the two readings agree (the
theorems carry ``divisor > 0`` in their hypotheses).

While :func:`recording_branches` is active, every symbolic case distinction built by
``ite``/``max_``/``min_`` is recorded (the case distinctions a formula makes, for its
tests).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TypeAlias

try:
    import z3
except ModuleNotFoundError:  # pragma: no cover - exercised by the reproducer tests
    # Int-only use without the solver (reproducers from `kvcontract gen-tests`): no value
    # can be a Z3 term, so the isinstance checks below only need classes nothing is.
    from kvcontract.spec import _without_z3 as z3

Num: TypeAlias = int | z3.ArithRef
Bool: TypeAlias = bool | z3.BoolRef

_branch_log: list[list[z3.BoolRef]] = []


@contextlib.contextmanager
def recording_branches() -> Iterator[list[z3.BoolRef]]:
    """Collect the symbolic conditions of every case distinction built inside."""
    log: list[z3.BoolRef] = []
    _branch_log.append(log)
    try:
        yield log
    finally:
        _branch_log.pop()


def _record(cond: z3.BoolRef) -> None:
    if _branch_log:
        log = _branch_log[-1]
        if not any(cond.eq(seen) for seen in log):
            log.append(cond)


def is_symbolic(*values: object) -> bool:
    return any(isinstance(v, z3.ExprRef) for v in values)


# The exhaustive theorems evaluate the spec on plain ints hundreds of thousands of
# times: every helper below tests ``type(...) is int`` first (a fast path measured at
# about 4x the generic isinstance scan) before it considers Z3 terms.


def ite(cond: Bool, then: Num, other: Num) -> Num:
    if isinstance(cond, bool):
        return then if cond else other
    _record(cond)
    return z3.If(cond, then, other)


def ite_bool(cond: Bool, then: Bool, other: Bool) -> Bool:
    if isinstance(cond, bool):
        return then if cond else other
    _record(cond)
    return z3.If(cond, then, other)


def max_(a: Num, b: Num) -> Num:
    if type(a) is int and type(b) is int:
        return a if a >= b else b
    if not is_symbolic(a, b):
        return max(int(a), int(b))
    return ite(a >= b, a, b)


def min_(a: Num, b: Num) -> Num:
    if type(a) is int and type(b) is int:
        return a if a <= b else b
    if not is_symbolic(a, b):
        return min(int(a), int(b))
    return ite(a <= b, a, b)


def floordiv(a: Num, b: Num) -> Num:
    """``floor(a / b)`` for ``b > 0``."""
    if type(a) is int and type(b) is int:
        return a // b
    if not is_symbolic(a, b):
        return int(a) // int(b)
    return a / b  # Euclidean division == floor division for b > 0


def mod(a: Num, b: Num) -> Num:
    """``a mod b`` in ``[0, b)`` for ``b > 0`` (Python's ``%``)."""
    if type(a) is int and type(b) is int:
        return a % b
    if not is_symbolic(a, b):
        return int(a) % int(b)
    return a % b


def cdiv(a: Num, b: Num) -> Num:
    """``ceil(a / b)`` for ``b > 0``."""
    if type(a) is int and type(b) is int:
        return -(-a // b)
    return -floordiv(-a, b)


def _all_bool(terms: Sequence[object]) -> bool:
    return all(type(term) is bool for term in terms)


def and_(*terms: Bool) -> Bool:
    if _all_bool(terms):
        return False not in terms
    if not is_symbolic(*terms):
        return all(bool(t) for t in terms)
    return z3.And(*[z3.BoolVal(t) if isinstance(t, bool) else t for t in terms])


def or_(*terms: Bool) -> Bool:
    if _all_bool(terms):
        return True in terms
    if not is_symbolic(*terms):
        return any(bool(t) for t in terms)
    return z3.Or(*[z3.BoolVal(t) if isinstance(t, bool) else t for t in terms])


def not_(term: Bool) -> Bool:
    if isinstance(term, bool):
        return not term
    return z3.Not(term)


def implies(a: Bool, b: Bool) -> Bool:
    if not is_symbolic(a, b):
        return (not a) or bool(b)
    return z3.Implies(
        z3.BoolVal(a) if isinstance(a, bool) else a, z3.BoolVal(b) if isinstance(b, bool) else b
    )


def eq(a: Num | Bool, b: Num | Bool) -> Bool:
    if not is_symbolic(a, b):
        return a == b
    return a == b


def all_of(terms: Sequence[Bool]) -> Bool:
    return and_(*terms) if terms else True


def any_of(terms: Sequence[Bool]) -> Bool:
    return or_(*terms) if terms else False


def in_range(x: Num, lo: Num, hi: Num) -> Bool:
    """``lo <= x < hi``."""
    if type(x) is int and type(lo) is int and type(hi) is int:
        return lo <= x < hi
    return and_(lo <= x, x < hi)


# -- quantified ranges: finite on ints, a quantifier on Z3 terms --------------------
# The declarative scanners quantify over key indices. On a list of ints the range is
# finite and the quantifier is a conjunction; over a symbolic sequence (an uninterpreted
# function of the key index) and symbolic bounds it is a Z3 quantifier, so the same
# definition states the answer for every sequence length (the induction theorems of
# :mod:`kvcontract.spec.properties.unbounded`).
_bound_indices = itertools.count()


def _fresh_index() -> z3.ArithRef:
    # A bound variable: its name is for printing only (Z3 binds by position).
    return z3.Int(f"key{next(_bound_indices)}")


def all_in(lo: Num, hi: Num, pred: Callable[[Num], Bool]) -> Bool:
    """``pred(k)`` for every ``lo <= k < hi``."""
    if type(lo) is int and type(hi) is int:
        return all_of([pred(k) for k in range(lo, hi)])
    k = _fresh_index()
    body = pred(k)
    return z3.ForAll([k], z3.Implies(z3.And(lo <= k, k < hi),
                                      z3.BoolVal(body) if isinstance(body, bool) else body))


def any_in(lo: Num, hi: Num, pred: Callable[[Num], Bool]) -> Bool:
    """``pred(k)`` for some ``lo <= k < hi``."""
    if type(lo) is int and type(hi) is int:
        return any_of([pred(k) for k in range(lo, hi)])
    k = _fresh_index()
    body = pred(k)
    return z3.Exists([k], z3.And(lo <= k, k < hi,
                                 z3.BoolVal(body) if isinstance(body, bool) else body))


def symbolic_sequence(name: str) -> Callable[[Num], Num]:
    """A sequence of every length: an uninterpreted function from key index to value."""
    function = z3.Function(name, z3.IntSort(), z3.IntSort())

    def at(index: Num) -> Num:
        value: Num = function(index)
        return value

    return at
