"""Stand-in for the ``z3`` module where the solver is not installed.

:mod:`kvcontract.spec.arith` evaluates every formula on Python ints or on Z3 terms. Code
that only ever passes ints (the reproducers written by ``kvcontract gen-tests``) must run
without the solver, so when ``import z3`` fails ``arith`` imports this module instead: its
classes are never instantiated, so every "is this a Z3 term?" check answers no. Building
a symbolic term without Z3 raises, as it should.
"""

from __future__ import annotations

from typing import Any, NoReturn


class ExprRef:
    """Nothing is an instance: no Z3 term can exist without Z3."""


class ArithRef(ExprRef):
    pass


class BoolRef(ExprRef):
    pass


def _unavailable(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise ModuleNotFoundError("z3 is not installed: symbolic terms need `pip install z3-solver`")


If = And = Or = Not = Implies = BoolVal = IntVal = Int = _unavailable
