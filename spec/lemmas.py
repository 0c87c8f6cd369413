"""Division facts as general lemmas: proved once for all values, used by instance.

Z3 decides few nonlinear facts about ``//`` and ``%`` by a symbolic divisor inside a
large query, and how long it takes depends on everything else in the query (measured:
the identity ``a == (a // t) * t + a % t`` for ``a = -k * per * B``, ``t = B * bpc`` took
0.6M to 20M+ resources in the same C7 lemma chain, depending on the process). The same
fact over fresh variables alone is decided at once. So a statement names the fact and
its arguments (:meth:`kvcontract.spec.properties.base.Env.instance`); the prover proves
the general form once (every variable unbounded, the hypotheses in the lemma) and adds
the instance to the query, which needs no proof of its own: it follows by instantiating
a proved universal statement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvcontract.spec.arith import Bool, Num, and_, cdiv, floordiv, implies, mod


@dataclass(frozen=True)
class GeneralLemma:
    """``statement(*args)`` holds for all integer ``args``."""

    name: str
    arity: int
    statement: Callable[..., Bool]
    text: str

    def __call__(self, *args: Num) -> Bool:
        if len(args) != self.arity:
            raise TypeError(f"{self.name} takes {self.arity} arguments, not {len(args)}")
        return self.statement(*args)


def _div_mod(a: Num, t: Num) -> Bool:
    return implies(t >= 1, and_(a == floordiv(a, t) * t + mod(a, t), mod(a, t) >= 0,
                                mod(a, t) < t))


def _cdiv_bounds(a: Num, t: Num) -> Bool:
    return implies(t >= 1, and_(cdiv(a, t) * t >= a, cdiv(a, t) * t < a + t))


def _quotient_in_period(x: Num, m: Num, k: Num) -> Bool:
    return implies(and_(m >= 1, (k - 1) * m <= x, x < k * m), floordiv(x, m) == k - 1)


def _multiple_mod(q: Num, t: Num) -> Bool:
    return implies(t >= 1, mod(q * t, t) == 0)


def _multiples_equal(x: Num, y: Num, t: Num) -> Bool:
    return implies(and_(t >= 1, x * t < y * t + t, y * t < x * t + t), x == y)


def _cancel(x: Num, y: Num, t: Num) -> Bool:
    return implies(t >= 1, and_(implies(x * t < y * t, x < y),
                                implies(x * t <= y * t, x <= y)))


DIV_MOD = GeneralLemma("div-mod", 2, _div_mod,
                       "t >= 1 -> a == (a // t) * t + a % t, 0 <= a % t < t")
CDIV_BOUNDS = GeneralLemma("cdiv-bounds", 2, _cdiv_bounds,
                           "t >= 1 -> a <= cdiv(a, t) * t < a + t")
QUOTIENT_IN_PERIOD = GeneralLemma(
    "quotient-in-period", 3, _quotient_in_period,
    "m >= 1, (k - 1) * m <= x < k * m -> x // m == k - 1")

MULTIPLE_MOD = GeneralLemma("multiple-mod", 2, _multiple_mod, "t >= 1 -> (q * t) % t == 0")
MULTIPLES_EQUAL = GeneralLemma(
    "multiples-equal", 3, _multiples_equal,
    "t >= 1, |x * t - y * t| < t -> x == y")
CANCEL = GeneralLemma("cancel", 3, _cancel,
                      "t >= 1 -> (x * t < y * t -> x < y) and (x * t <= y * t -> x <= y)")

LEMMAS: tuple[GeneralLemma, ...] = (DIV_MOD, CDIV_BOUNDS, QUOTIENT_IN_PERIOD, MULTIPLE_MOD,
                                    MULTIPLES_EQUAL, CANCEL)

__all__ = ["CANCEL", "CDIV_BOUNDS", "DIV_MOD", "LEMMAS", "MULTIPLES_EQUAL", "MULTIPLE_MOD",
           "QUOTIENT_IN_PERIOD", "GeneralLemma"]
