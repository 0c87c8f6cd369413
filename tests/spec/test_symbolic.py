"""kvcontract.spec.symbolic: Python arithmetic on SymInt means what it means on ints
(floor semantics for positive divisors), and path enumeration lifts branching code to
a term equal to the function for every input.

(The decision tree against the path chain and the refusal of symbolic loops are in
tests/proofs/test_engine.py and tests/proofs/test_prover.py.)"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import z3

from kvcontract.impl import reference as ref
from kvcontract.spec.symbolic import (
    LiftError,
    PathExplorer,
    SymBool,
    SymInt,
    call,
    has_symbolic,
)

A, B = z3.Ints("a b")


def _value(term: Any, **values: int) -> Any:
    pairs = [(z3.Int(k), z3.IntVal(v)) for k, v in values.items()]
    folded = z3.simplify(z3.substitute(term, *pairs))
    if z3.is_bool(folded):
        return z3.is_true(folded)
    return folded.as_long()


def _equal_for_all(term: Any, expected: Any, domain: list[z3.BoolRef]) -> bool:
    solver = z3.Solver()
    solver.add(*domain, term != expected)
    return solver.check() == z3.unsat


def test_operators_follow_python_on_positive_divisors() -> None:
    a, b = SymInt(A), SymInt(B)
    expressions = {
        "add": (a + 3, lambda x, y: x + 3),
        "radd": (3 + a, lambda x, y: 3 + x),
        "sub": (a - b, lambda x, y: x - y),
        "mul": (a * b, lambda x, y: x * y),
        "neg": (-a, lambda x, y: -x),
        "floordiv": (a // b, lambda x, y: x // y),
        "mod": (a % b, lambda x, y: x % y),
    }
    for x, y in itertools.product(range(-7, 8), range(1, 5)):
        for name, (term, fn) in expressions.items():
            assert _value(term.term, a=x, b=y) == fn(x, y), (name, x, y)
        assert _value((17 // b).term, b=y) == 17 // y
        assert _value((17 % b).term, b=y) == 17 % y
        assert _value((10 - a).term, a=x) == 10 - x
        assert _value((2 * a).term, a=x) == 2 * x
        assert _value((+a).term, a=x) == x


def test_comparisons_build_symbolic_truth_values() -> None:
    a = SymInt(A)
    for name, cond, fn in [("lt", a < 2, lambda x: x < 2), ("le", a <= 2, lambda x: x <= 2),
                           ("gt", a > 2, lambda x: x > 2), ("ge", a >= 2, lambda x: x >= 2),
                           ("eq", a == 2, lambda x: x == 2), ("ne", a != 2, lambda x: x != 2)]:
        assert isinstance(cond, SymBool)
        for x in range(0, 5):
            assert _value(cond.term, a=x) == fn(x), (name, x)
    assert _value((~(a < 2)).term, a=1) is False


def test_truth_values_outside_a_lifted_run_refuse() -> None:
    with pytest.raises(LiftError, match="outside a lifted run"):
        bool(SymInt(A) > 0)


def test_constant_conditions_do_not_fork() -> None:
    def constant(x: Any) -> Any:
        if x + 1 > x:
            return x
        return 0

    paths = PathExplorer().paths(constant, [A])
    assert len(paths) == 1
    assert z3.is_true(z3.simplify(paths[0][0]))


def test_symbolic_integers_refuse_int_and_index() -> None:
    with pytest.raises(LiftError, match="as an index or loop bound"):
        [0, 1][SymInt(A)]
    with pytest.raises(LiftError, match=r"int\(\)"):
        int(SymInt(A))
    with pytest.raises(LiftError, match="cannot use str"):
        SymInt(A) + "1"  # type: ignore[operator]


def test_paths_of_a_branching_function() -> None:
    def clamp(x: Any) -> Any:
        if x < 0:
            return 0
        if x > 10:
            return 10
        return x

    paths = PathExplorer().paths(clamp, [A])
    assert len(paths) == 3
    for x in range(-3, 14):
        taken = [value for cond, value in paths if _value(cond, a=x)]
        assert len(taken) == 1  # the path conditions partition the domain
        assert _value(taken[0], a=x) == min(max(x, 0), 10)
    lifted = PathExplorer().lift(clamp, [A])
    assert _equal_for_all(lifted, z3.If(A < 0, 0, z3.If(A > 10, 10, A)), [])


def test_assumptions_prune_infeasible_paths() -> None:
    def sign(x: Any) -> Any:
        if x > 0:
            return 1
        if x < 0:
            return -1
        return 0

    assert len(PathExplorer().paths(sign, [A])) == 3
    pruned = PathExplorer([A >= 0], prune=True)
    assert len(pruned.paths(sign, [A])) == 2
    assert pruned.feasibility_queries > 0
    # Without pruning, infeasible branches are explored but never change the term.
    unpruned = PathExplorer([A >= 0]).lift(sign, [A])
    assert _equal_for_all(unpruned, z3.If(A > 0, 1, 0), [A >= 0])


def test_too_many_paths() -> None:
    def staircase(x: Any) -> Any:
        total = 0
        for step in range(6):
            if x > step:
                total += 1
        return total

    with pytest.raises(LiftError, match="more than 4 paths"):
        PathExplorer(max_paths=4).lift(staircase, [A])
    lifted = PathExplorer().lift(staircase, [A])
    for x in range(-2, 9):
        assert _value(lifted, a=x) == min(max(x, 0), 6)


def test_results_must_agree_in_shape() -> None:
    def sometimes_none(x: Any) -> Any:
        if x > 0:
            return None
        return x

    with pytest.raises(LiftError, match="returns None on some paths only"):
        PathExplorer().lift(sometimes_none, [A])

    def text(x: Any) -> Any:
        return "x"

    with pytest.raises(LiftError, match="cannot lift a result of type str"):
        PathExplorer().lift(text, [A])
    assert PathExplorer().lift(lambda x: None, [A]) is None


def test_tuples_are_lifted_elementwise() -> None:
    lo, hi = PathExplorer().lift(ref.retained_block_range, [A, 4, 8, B])
    for n, e in itertools.product(range(0, 30, 3), range(0, 4)):
        assert (_value(lo, a=n, b=e), _value(hi, a=n, b=e)) == \
            ref.retained_block_range(n, 4, 8, e)


def test_lifted_reference_equals_its_ints_for_all_values() -> None:
    # Ret(n)'s skipped tokens: max(0, n - sw + 1 - e), for all n, sw, e.
    n, sw, e = z3.Ints("n sw e")
    lifted = call(ref.get_num_skipped_tokens, n, sw, e)
    expected = z3.If(n - sw + 1 - e < 0, 0, n - sw + 1 - e)
    assert _equal_for_all(lifted, expected, [])
    window = call(ref.get_sliding_window_size_in_chunks, sw, e, 4)
    assert _equal_for_all(window, -((-(sw - 1 + e)) / 4), [])


def test_call_runs_concrete_arguments_directly() -> None:
    assert call(ref.get_num_skipped_tokens, 20, 8, 3) == 10
    assert call(lambda x, y: (x, y), 1, (2, 3)) == (1, (2, 3))


def test_has_symbolic() -> None:
    assert has_symbolic(A)
    assert has_symbolic((1, (2, A)))
    assert not has_symbolic((1, (2, 3)))
    assert not has_symbolic(SymInt(A))  # only Z3 terms count, not their wrappers
    assert has_symbolic(A > 0)
