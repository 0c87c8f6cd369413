"""Lemma chains (Env.lemma): each lemma is proved before it is used, a lemma that is not
proved leaves the theorem undecided, and on ints lemmas change nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import get_implementation
from kvcontract.proofs.theorem import run_property
from kvcontract.proofs.verdicts import Verdict
from kvcontract.spec.arith import Bool, floordiv, mod
from kvcontract.spec.properties.base import Config, Env, FormulaProperty

REFERENCE = get_implementation("reference")


def _offset_in_period(lemmas: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """x in [(k-1)*m, k*m) has x mod m == x - (k-1)*m: Z3 does not decide the ``%`` with a
    symbolic m in one query (unknown at 20M), but does after the lemma ``x // m == k - 1``."""

    def statement(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
        del impl
        x, m, k = env["x"], env["m"], env["k"]
        hyps: list[Bool] = [m >= 1, k >= 1, (k - 1) * m <= x, x < k * m]
        for name in lemmas:
            env.lemma({"div": floordiv(x, m) == k - 1, "false": x < 0}[name])
        return hyps, mod(x, m) == x - (k - 1) * m

    return statement


def _prop(*lemmas: str) -> FormulaProperty:
    return FormulaProperty(
        "C1", "offset-in-period", "a block's offset in its period", ("x", "k"),
        _offset_in_period(lemmas), lambda: [Config("m=3", {"m": 3})], "m = 3", uses=(),
        symbolic_sizes=("m",), symbolic_rlimit=2_000_000)


def test_a_lemma_chain_proves_for_all_values() -> None:
    result = run_property(_prop("div"), REFERENCE)
    assert result.verdict is Verdict.PROVED
    assert "through 1 arithmetic lemmas, each proved before it is used" in result.domain
    assert result.queries == 2  # the lemma and the goal


def test_without_the_lemma_only_the_split_decides() -> None:
    result = run_property(_prop(), REFERENCE)
    assert result.verdict is Verdict.PROVED_FOR_DOMAIN
    assert any("symbolic sizes: unknown" in d for d in result.details), result.details


def test_an_unproved_lemma_is_never_a_proof() -> None:
    # x < 0 is false under the hypotheses: the lemma is refuted, which refutes a step of
    # the proof, not the theorem (the goal holds): undecided with symbolic sizes and in
    # the split (the statement asks for the lemma there too), never a pass.
    result = run_property(_prop("false"), REFERENCE)
    assert result.verdict is Verdict.UNKNOWN
    assert "lemma 1 of 1 not proved (refuted): x < 0" in result.message
    assert any("lemma 1 of 1 not proved (refuted)" in d for d in result.details), \
        result.details


@pytest.mark.parametrize("values", [{"x": 4, "m": 3, "k": 2}, {"x": 2, "m": 3, "k": 1}])
def test_lemmas_are_nothing_on_ints(values: Mapping[str, int]) -> None:
    for prop in (_prop("div"), _prop("false")):
        assert prop.violation(values, REFERENCE) is None
    wrong = dataclasses.replace(_prop("div"), statement=lambda env, impl: (
        _offset_in_period(("false",))(env, impl)[0], False))
    assert wrong.violation(values, REFERENCE) is not None
