"""SymbolicEnv.call with truth-valued arguments: the scan states' flags (issue 12)."""

from __future__ import annotations

from typing import Any

import z3

from kvcontract.proofs.theorem import SymbolicEnv


def _step(count: Any, flag: Any) -> tuple[Any, Any]:
    if flag:
        return count + 1, False
    return count, True


def test_a_flag_is_lifted_as_a_bool_placeholder() -> None:
    env = SymbolicEnv({})
    count, flag = z3.Int("count"), z3.Bool("flag")
    next_count, next_flag = env.call(_step, count, flag)
    assert z3.is_bool(next_flag)
    solver = z3.Solver()
    solver.add(z3.Not(z3.And(next_count == z3.If(flag, count + 1, count),
                             next_flag == z3.Not(flag))))
    assert solver.check() == z3.unsat
    # The lift is cached by shape and substituted: another flag term reuses it.
    other = z3.Bool("other")
    again, _ = env.call(_step, count, other)
    solver = z3.Solver()
    solver.add(other, again != count + 1)
    assert solver.check() == z3.unsat
