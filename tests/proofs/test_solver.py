"""kvcontract.proofs.solver: proving by refuting the negation, vacuity, unknown under a
budget, model extraction and lexicographic minimization."""

from __future__ import annotations

import z3

from kvcontract.proofs.solver import (
    ATTEMPTS,
    DEFAULT_RLIMIT,
    QueryStatus,
    minimize,
    model_values,
    prove,
)

X, Y = z3.Ints("x y")


def _holds(hypotheses: list[z3.BoolRef], goal: z3.BoolRef, values: dict[str, int]) -> bool:
    """Whether ``values`` satisfy the hypotheses and violate the goal."""
    solver = z3.Solver()
    solver.add(*hypotheses, z3.Not(goal), *[z3.Int(k) == v for k, v in values.items()])
    return solver.check() == z3.sat


def test_a_valid_goal_is_proved() -> None:
    outcome = prove([X >= 0], X + 1 > 0, [X])
    assert outcome.status is QueryStatus.PROVED
    assert outcome.model is None
    assert outcome.rlimit_used > 0


def test_an_invalid_goal_is_refuted_with_a_model() -> None:
    hypotheses = [X >= 0, Y >= 0]
    outcome = prove(hypotheses, X + Y < 10, [X, Y])
    assert outcome.status is QueryStatus.REFUTED
    assert outcome.model is not None and set(outcome.model) == {"x", "y"}
    assert _holds(hypotheses, X + Y < 10, outcome.model)


def test_unsatisfiable_hypotheses_are_vacuous() -> None:
    outcome = prove([X >= 0, X < 0], X > 5, [X])
    assert outcome.status is QueryStatus.VACUOUS
    assert outcome.reason == "hypotheses are unsatisfiable"
    # Without the vacuity check the same query "proves": why the check exists.
    assert prove([X >= 0, X < 0], X > 5, [X], check_vacuity=False).status is QueryStatus.PROVED


def test_a_budget_too_small_is_unknown_never_a_pass() -> None:
    a, b, c = z3.Ints("a b c")
    outcome = prove([a > 0, b > 0, c > 0], a * a * a + b * b * b != c * c * c, [a, b, c],
                    rlimit=1000)
    assert outcome.status is QueryStatus.UNKNOWN
    assert outcome.reason != ""
    assert outcome.model is None


def test_attempts_end_with_the_full_budget() -> None:
    shares = [share for _, _, share in ATTEMPTS]
    assert shares == sorted(shares) and shares[-1] == 1.0
    assert {engine for engine, _, _ in ATTEMPTS} == {2, 6}  # both arithmetic engines
    assert DEFAULT_RLIMIT == 20_000_000


def test_minimize_is_lexicographic_in_variable_order() -> None:
    hypotheses = [X >= 0, Y >= 0]
    start = {"x": 7, "y": 5}
    assert _holds(hypotheses, X + Y < 10, start)
    smaller, used = minimize(hypotheses, X + Y < 10, [X, Y], start)
    assert smaller == {"x": 0, "y": 10}
    assert used > 0
    assert minimize(hypotheses, X + Y < 10, [Y, X], start)[0] == {"x": 10, "y": 0}


def test_minimize_keeps_a_model() -> None:
    # x must be at least 3 to violate the goal: the smallest x is 3, then y is free (0).
    hypotheses = [Y >= 0]
    smaller, _ = minimize(hypotheses, X < 3, [X, Y], {"x": 40, "y": 9})
    assert smaller == {"x": 3, "y": 0}
    # A negative value is not pushed towards zero, and the result is still a model.
    negative, _ = minimize([Y >= 0], X > -3, [X, Y], {"x": -7, "y": 2})
    assert negative["x"] == -7
    assert _holds([Y >= 0], X > -3, negative)


def test_model_values_completes_our_variables_only() -> None:
    solver = z3.Solver()
    helper = z3.Int("helper")
    solver.add(X == 4, helper == X + 1)
    assert solver.check() == z3.sat
    assert model_values(solver.model(), [X, Y]) == {"x": 4, "y": 0}
