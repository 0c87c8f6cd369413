"""kvcontract.spec.arith: every helper means the same on Python ints and on Z3 terms
(floor division and ``mod`` for positive divisors, negative dividends included, as
the module documents), and symbolic case distinctions are recorded."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import z3

from kvcontract.spec import arith
from kvcontract.spec.arith import (
    all_of,
    and_,
    any_of,
    cdiv,
    eq,
    floordiv,
    implies,
    in_range,
    is_symbolic,
    ite,
    ite_bool,
    max_,
    min_,
    mod,
    not_,
    or_,
    recording_branches,
)

A, B, C = z3.Ints("a b c")
P, Q = z3.Bools("p q")
DIVIDENDS = range(-9, 10)
DIVISORS = range(1, 6)


def _evaluate(term: Any, **values: int | bool) -> int | bool:
    """A Z3 term with its variables replaced by concrete values, folded to a Python value."""
    pairs = []
    for name, value in values.items():
        if isinstance(value, bool):
            pairs.append((z3.Bool(name), z3.BoolVal(value)))
        else:
            pairs.append((z3.Int(name), z3.IntVal(value)))
    folded = z3.simplify(z3.substitute(term, *pairs))
    if z3.is_true(folded):
        return True
    if z3.is_false(folded):
        return False
    assert z3.is_int_value(folded), folded
    return int(folded.as_long())


@pytest.mark.parametrize("fn", [floordiv, mod, cdiv], ids=["floordiv", "mod", "cdiv"])
def test_division_agrees_on_ints_and_terms(fn: Any) -> None:
    both = fn(A, B)
    left = fn(A, 4)  # a symbolic dividend, a concrete divisor
    assert is_symbolic(both) and is_symbolic(left)
    for a, b in itertools.product(DIVIDENDS, DIVISORS):
        concrete = fn(a, b)
        assert type(concrete) is int
        assert _evaluate(both, a=a, b=b) == concrete, (a, b)
        if b == 4:
            assert _evaluate(left, a=a) == concrete, a


def test_division_is_floor_division() -> None:
    for a, b in itertools.product(DIVIDENDS, DIVISORS):
        assert floordiv(a, b) == a // b
        assert mod(a, b) == a % b and 0 <= mod(a, b) < b
        assert cdiv(a, b) * b >= a > (cdiv(a, b) - 1) * b
    assert (floordiv(-7, 2), mod(-7, 2), cdiv(-7, 2)) == (-4, 1, -3)
    assert (cdiv(8, 4), cdiv(9, 4), cdiv(0, 4)) == (2, 3, 0)


@pytest.mark.parametrize("fn", [max_, min_], ids=["max", "min"])
def test_max_min_agree(fn: Any) -> None:
    term = fn(A, B)
    half = fn(A, 3)
    builtin = max if fn is max_ else min
    for a, b in itertools.product(range(-4, 5), repeat=2):
        assert fn(a, b) == builtin(a, b)
        assert _evaluate(term, a=a, b=b) == builtin(a, b)
        assert _evaluate(half, a=a) == builtin(a, 3)


def test_non_int_numbers_are_converted() -> None:
    # A bool (or another int-like) that is not a Z3 term takes the slow int path.
    assert max_(True, 0) == 1 and type(max_(True, 0)) is int
    assert min_(False, 3) == 0
    assert floordiv(True, 1) == 1 and mod(7, True) == 0


def test_ite() -> None:
    assert ite(True, 1, 2) == 1 and ite(False, 1, 2) == 2
    term = ite(A > B, A - B, C)
    for a, b, c in itertools.product(range(-2, 3), repeat=3):
        assert _evaluate(term, a=a, b=b, c=c) == (a - b if a > b else c)
    assert ite_bool(True, False, True) is False
    boolean = ite_bool(A > 0, P, Q)
    assert _evaluate(boolean, a=1, p=True, q=False) is True
    assert _evaluate(boolean, a=0, p=True, q=False) is False


@pytest.mark.parametrize(("x", "y"), list(itertools.product([False, True], repeat=2)))
def test_boolean_connectives(x: bool, y: bool) -> None:
    assert and_(x, y) is (x and y)
    assert or_(x, y) is (x or y)
    assert not_(x) is (not x)
    assert implies(x, y) is ((not x) or y)
    values = {"p": x, "q": y}
    assert _evaluate(and_(P, Q), **values) == (x and y)
    assert _evaluate(and_(P, True, Q), **values) == (x and y)
    assert _evaluate(or_(P, False, Q), **values) == (x or y)
    assert _evaluate(not_(P), **values) == (not x)
    assert _evaluate(implies(P, Q), **values) == ((not x) or y)
    assert _evaluate(implies(x, Q), **values) == ((not x) or y)
    assert _evaluate(implies(P, y), **values) == ((not x) or y)


def test_empty_and_mixed_connectives() -> None:
    assert and_() is True and or_() is False
    assert all_of([]) is True and any_of([]) is False
    assert all_of([True, False]) is False and any_of([False, True]) is True
    assert and_(True, False, True) is False
    assert or_(False, False) is False
    # A false constant next to a term still decides the conjunction.
    assert _evaluate(and_(A > 0, False), a=5) is False
    assert _evaluate(or_(A > 0, True), a=-5) is True
    # Python truthy values that are not bools are read as truth values.
    assert and_(1, 2) is True and or_(0, 0) is False


def test_eq_and_in_range() -> None:
    assert eq(3, 3) is True and eq(3, 4) is False
    assert _evaluate(eq(A, 3), a=3) is True
    for x in range(-1, 6):
        assert in_range(x, 1, 4) == (1 <= x < 4)
        assert _evaluate(in_range(A, 1, 4), a=x) == (1 <= x < 4)
        assert _evaluate(in_range(2, A, 4), a=x) == (x <= 2 < 4)


def test_is_symbolic() -> None:
    assert not is_symbolic()
    assert not is_symbolic(1, True, 2.5, None)
    assert is_symbolic(1, A)
    assert is_symbolic(P)
    assert not is_symbolic((A, 1))  # only direct terms count


def test_recording_branches() -> None:
    with recording_branches() as log:
        ite(True, 1, 2)  # a concrete condition is no case distinction
        max_(3, 4)
        ite(A > 0, 1, 2)
        ite(A > 0, 3, 4)  # the same condition once
        max_(A, B)
        min_(A, 7)
        ite_bool(B < 2, P, Q)
    assert [str(c) for c in log] == ["a > 0", "a >= b", "a <= 7", "b < 2"]


def test_recording_nests_and_stops() -> None:
    with recording_branches() as outer:
        ite(A > 0, 1, 2)
        with recording_branches() as inner:
            ite(B > 0, 1, 2)
        ite(C > 0, 1, 2)
    ite(A > 1, 1, 2)  # nothing records outside
    assert [str(c) for c in inner] == ["b > 0"]
    assert [str(c) for c in outer] == ["a > 0", "c > 0"]
    assert arith._branch_log == []
