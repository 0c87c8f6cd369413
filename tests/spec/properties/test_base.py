"""kvcontract.spec.properties.base: Env, FormulaProperty, CaseSpace, CaseProperty and
the LastCase memo, on toy properties whose every answer is computed by hand."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from kvcontract.errors import KvContractError
from kvcontract.impl.variants import REFERENCE
from kvcontract.spec.arith import Bool, max_
from kvcontract.spec.properties import (
    CaseProperty,
    CaseSpace,
    Config,
    Env,
    FormulaProperty,
    Picture,
    WitnessError,
    get_property,
)
from kvcontract.spec.properties.base import HYPOTHESES_ONLY, LastCase

# -- a formula property: skipped tokens for sw 2, e 0 --------------------------------------
CALLS: list[tuple[Any, ...]] = []


def _skipped_statement(env: Env, impl: Any) -> tuple[list[Bool], Bool]:
    x = env["x"]
    hyps: list[Bool] = [x >= 0]
    got = env.call(impl.get_num_skipped_tokens, x, 2, 0)
    return hyps, got == max_(0, x - 1)


def _recording_skipped(n: int, sw: int, e: int) -> int:
    CALLS.append((n, sw, e))
    return int(REFERENCE.get_num_skipped_tokens(n, sw, e))


TOY = FormulaProperty(
    "C1", "toy-skipped", "toy skipped tokens", ("x",), _skipped_statement,
    lambda: [Config("sw=2", {})], "x >= 0", uses=("get_num_skipped_tokens",),
)
# The defect: the window is ignored (everything below n is skipped).
BROKEN = dataclasses.replace(REFERENCE, name="broken",
                             get_num_skipped_tokens=lambda n, sw, e: n)
RECORDING = dataclasses.replace(REFERENCE, name="recording",
                                get_num_skipped_tokens=_recording_skipped)


def test_env_reads_values_and_calls_through() -> None:
    env = Env({"a": 3, "b": -2})
    assert env["a"] == 3 and env["b"] == -2
    assert env.symbolic is False
    with pytest.raises(KeyError):
        env["c"]
    env.assume([False])  # nothing to prune on ints: no effect, no error
    assert env.call(lambda p, q: p * 10 + q, 4, 2, generalize=(0, 1)) == 42


def test_env_copies_its_values() -> None:
    values = {"a": 1}
    env = Env(values)
    values["a"] = 99
    assert env["a"] == 1


def test_theorem_id_and_kind() -> None:
    assert TOY.theorem_id == "C1/toy-skipped"
    assert TOY.kind == "arith"


def test_admissible_reads_only_the_hypotheses() -> None:
    CALLS.clear()
    assert TOY.admissible({"x": 0})
    assert TOY.admissible({"x": 7})
    assert not TOY.admissible({"x": -1})
    assert CALLS == []  # admissibility never runs the implementation


def test_hypotheses_only_stand_ins_are_constants() -> None:
    assert HYPOTHESES_ONLY.get_num_skipped_tokens(100, 2, 0) == 0
    assert HYPOTHESES_ONLY.load_chunk_range(1, 2, 3, 4, 5, 6) == (0, 0)
    assert HYPOTHESES_ONLY.sliding_window_lookup(None, 0, 3, 1, 1) is None


def test_violation_runs_the_implementation() -> None:
    CALLS.clear()
    assert TOY.violation({"x": 5}, RECORDING) is None
    assert CALLS == [(5, 2, 0)]
    assert TOY.violation({"x": 5}, REFERENCE) is None
    assert TOY.violation({"x": 5}, BROKEN) == "toy skipped tokens fails for x=5"
    # x = 0: broken returns 0 = max(0, -1): the goal holds there.
    assert TOY.violation({"x": 0}, BROKEN) is None


def test_violation_outside_the_domain_is_none() -> None:
    # x = -3: BROKEN answers -3, the spec 0, but the hypothesis x >= 0 fails.
    assert TOY.violation({"x": -3}, BROKEN) is None


def test_witness_shape() -> None:
    assert TOY.witness({"x": 5}) == {
        "kind": "arith", "theorem": "C1/toy-skipped", "values": {"x": 5}}


def test_decode_validates() -> None:
    assert TOY.decode({"values": {"x": 4, "extra": 1}}) == {"x": 4, "extra": 1}
    with pytest.raises(WitnessError, match="C1/toy-skipped: the witness has no 'values'"):
        TOY.decode({})
    with pytest.raises(WitnessError, match="no 'values' object"):
        TOY.decode({"values": [4]})
    with pytest.raises(WitnessError, match=r"witness value x='4' is not an integer"):
        TOY.decode({"values": {"x": "4"}})
    with pytest.raises(WitnessError, match="x=True is not an integer"):
        TOY.decode({"values": {"x": True}})
    with pytest.raises(WitnessError, match=r"x=1\.5 is not an integer"):
        TOY.decode({"values": {"x": 1.5}})
    with pytest.raises(WitnessError, match="the witness lacks x"):
        TOY.decode({"values": {"y": 1}})


def test_replay_round_trips_the_witness() -> None:
    witness = TOY.witness({"x": 5})
    assert TOY.replay(witness, REFERENCE) is None
    assert TOY.replay(witness, BROKEN) == "toy skipped tokens fails for x=5"


def test_replay_refuses_a_witness_outside_the_domain() -> None:
    with pytest.raises(WitnessError, match="C1/toy-skipped: the witness lies outside the domain"):
        TOY.replay({"values": {"x": -3}}, BROKEN)


def test_replay_names_a_missing_configuration_value() -> None:
    # The statement also reads the case split's sizes (bs, bpc): without them the
    # witness is malformed, not a KeyError.
    prop = get_property("C2/first-run-covers-load")
    witness = {"values": {"N": 5, "Lb": 0, "sw": 2, "e": 1, "bpc": 1}}
    with pytest.raises(WitnessError, match="C2/first-run-covers-load: the witness lacks 'bs'"):
        prop.replay(witness, REFERENCE)


def test_witness_error_is_a_kvcontract_error() -> None:
    assert issubclass(WitnessError, KvContractError)


def test_draw_without_a_picture() -> None:
    with pytest.raises(WitnessError, match="C1/toy-skipped has no picture"):
        TOY.draw({"values": {"x": 1}}, REFERENCE)


def test_draw_decodes_and_calls_the_picture() -> None:
    seen: list[Mapping[str, int]] = []

    def picture(values: Mapping[str, int], impl: Any) -> Picture:
        seen.append(values)
        return Picture(geometry=None, num_tokens=values["x"], hit=None)  # type: ignore[arg-type]

    prop = dataclasses.replace(TOY, picture=picture)
    drawn = prop.draw({"values": {"x": 9}}, REFERENCE)
    assert drawn.num_tokens == 9 and seen == [{"x": 9}]
    assert drawn.offending == {} and drawn.notes == [] and drawn.windows == {}
    with pytest.raises(WitnessError, match="lacks x"):
        prop.draw({"values": {}}, REFERENCE)


# -- a case property over the integers 0..5: "the implementation doubles" --------------------
def _from_json(data: Mapping[str, Any]) -> int:
    value = data["n"]
    if not isinstance(value, int):
        raise TypeError(f"n must be an integer, not {value!r}")
    if value < 0:
        raise WitnessError("n must be >= 0")
    return value


SPACE: CaseSpace[int, int] = CaseSpace(
    family="toy", cases=lambda: range(6), describe=lambda: "n in [0, 6)",
    to_json=lambda n: {"n": n}, from_json=_from_json,
    observe=lambda n, impl: impl(n),
)


def _judge(case: int, observation: int) -> str | None:
    return None if observation == 2 * case else f"{case} -> {observation}"


DOUBLES = CaseProperty("C4", "toy-doubles", "doubles", SPACE, _judge, ("f",))


def test_case_property_identity() -> None:
    assert DOUBLES.theorem_id == "C4/toy-doubles"
    assert DOUBLES.kind == "exhaustive"
    assert DOUBLES.family == "toy"
    assert DOUBLES.domain == "n in [0, 6)"


def test_case_property_check_observes_then_judges() -> None:
    assert DOUBLES.check(3, lambda n: 2 * n) is None
    assert DOUBLES.check(3, lambda n: n + 2) == "3 -> 5"
    assert DOUBLES.check(2, lambda n: n + 2) is None


def test_case_property_witness_and_replay() -> None:
    witness = DOUBLES.witness(3)
    assert witness == {"kind": "exhaustive", "theorem": "C4/toy-doubles", "n": 3}
    assert DOUBLES.replay(witness, lambda n: n + 2) == "3 -> 5"
    assert DOUBLES.replay(witness, lambda n: 2 * n) is None


def test_case_space_decode_wraps_reading_errors() -> None:
    assert SPACE.decode({"n": 4}) == 4
    with pytest.raises(WitnessError, match="a toy witness cannot be read: KeyError"):
        SPACE.decode({})
    with pytest.raises(WitnessError, match="a toy witness cannot be read: TypeError: n must"):
        SPACE.decode({"n": "4"})


def test_case_space_decode_keeps_a_witness_error() -> None:
    with pytest.raises(WitnessError) as info:
        SPACE.decode({"n": -1})
    assert str(info.value) == "n must be >= 0"


def test_case_property_draw() -> None:
    with pytest.raises(WitnessError, match="C4/toy-doubles has no picture"):
        DOUBLES.draw({"n": 1}, REFERENCE)
    drawn = dataclasses.replace(
        DOUBLES, picture=lambda case, impl: Picture(None, case, None)  # type: ignore[arg-type]
    ).draw({"n": 5}, REFERENCE)
    assert drawn.num_tokens == 5


# -- LastCase ---------------------------------------------------------------------------------
def test_last_case_computes_once_per_case_and_impl() -> None:
    calls: list[tuple[Any, Any]] = []

    def compute(case: tuple[int, ...], impl: Any) -> int:
        calls.append((case, impl))
        return sum(case)

    memo: LastCase[tuple[int, ...], int] = LastCase(compute)
    case, other = (1, 2), (3, 4)
    impl_a, impl_b = object(), object()
    assert memo(case, impl_a) == 3
    assert memo(case, impl_a) == 3
    assert len(calls) == 1
    assert memo(case, impl_b) == 3  # another implementation: computed again
    assert memo(other, impl_b) == 7  # another case: computed again, not the stale value
    assert len(calls) == 3
    assert memo(other) == 7  # impl defaults to None: another key than impl_b
    assert len(calls) == 4


def test_last_case_remembers_and_reraises_an_error() -> None:
    calls: list[int] = []

    def compute(case: int, impl: Any) -> int:
        calls.append(case)
        if case < 0:
            raise ValueError(f"negative {case}")
        return case

    memo: LastCase[int, int] = LastCase(compute)
    for _ in range(2):
        with pytest.raises(ValueError, match="negative -5"):
            memo(-5, None)
    assert calls == [-5]  # the failure was remembered, not recomputed
    assert memo(4, None) == 4  # a new case clears the error
    assert memo(4, None) == 4
    assert calls == [-5, 4]
