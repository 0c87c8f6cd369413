"""kvcontract.spec.lookup: W, lw(N), the declarative scanners (docs/CONTRACT.md 4.2, 4.3).

(The historic scanner table, the single-state scans and the 8.1 example are in
tests/spec/test_formulas.py.)"""

from __future__ import annotations

import itertools

import pytest
import z3

from kvcontract.spec.lookup import (
    HIT,
    HIT_PENDING,
    MISS,
    RETRY,
    LookupResult,
    ScanAnswer,
    answer_is_all_hit,
    eagle_query_end,
    is_present,
    load_window_chunks,
    prefix_answer,
    sliding_window_answer,
    window_chunks,
)
from kvcontract.spec.retention import load_chunk_range, skipped_tokens


def test_window_chunks() -> None:
    assert window_chunks(5, 0, 4) == 1  # upstream's cdiv(sw, tpc) would ask for 2
    assert window_chunks(6, 0, 4) == 2
    assert window_chunks(4, 1, 4) == 1  # e = 1 adds no chunk on its own
    assert window_chunks(32, 3, 16) == 3
    assert window_chunks(2, 0, 1024) == 1


def test_load_window_is_w_or_w_plus_one_and_exact() -> None:
    for boundary, sw, e, tpc in itertools.product(range(1, 50), (2, 5, 9), (0, 1, 3),
                                                  (1, 4, 6)):
        w = window_chunks(sw, e, tpc)
        lw = load_window_chunks(boundary, sw, e, tpc)
        assert lw in (w, w + 1)
        if boundary % tpc == 0:
            assert lw == w
        if skipped_tokens(boundary, sw, e) > 0:
            # lw(N) is the size of Load(N, 0) once history is skipped (4.2).
            for bs, bpc in ((tpc, 1), (1, tpc)):
                lo, hi = load_chunk_range(boundary, 0, bs, bpc, sw, e)
                assert hi - lo == lw, (boundary, sw, e, tpc, bs)


def test_load_window_of_the_unaligned_hit() -> None:
    # 8.2: N 3904, tpc 256, sw 128: p = 192, lw = cdiv(127 + 192, 256) = 2.
    assert load_window_chunks(3904, 128, 0, 256) == 2
    assert load_window_chunks(3840, 128, 0, 256) == 1  # p = 0
    assert load_window_chunks(3968, 128, 0, 256) == 1  # p = 128: cdiv(255, 256)


def test_is_present() -> None:
    assert [is_present(r) for r in LookupResult] == [False, True, True, False]


def _answer(states: list[LookupResult], initial: int, window: int) -> tuple[object, ...]:
    answer = sliding_window_answer(states, initial, window)
    return answer.concrete(), answer.window_start, answer.end


@pytest.mark.parametrize(
    ("states", "initial", "window", "expected"),
    [
        # A RETRY left of the complete window was never scanned: no deferral.
        ([RETRY, HIT, HIT], 2, 2, (3, 1, 3)),
        # A RETRY right of the window was scanned before it completed: defer.
        ([HIT, HIT, RETRY], 2, 2, (None, 0, 2)),
        # A pending key inside the window defers; left of it, it does not.
        ([HIT, HIT_PENDING, HIT], 2, 2, (None, 1, 3)),
        ([HIT_PENDING, MISS, HIT, HIT], 2, 2, (4, 2, 4)),
        # No complete window: the longest present prefix is the answer.
        ([HIT, MISS, HIT], 2, 2, (1, 0, 1)),
        ([HIT_PENDING, MISS, HIT], 2, 2, (None, 0, 1)),
        ([MISS, HIT, HIT], 3, 3, (0, 0, 0)),
        # The run at the right end needs I keys; a later run only W.
        ([HIT, HIT, MISS, HIT, HIT], 3, 2, (2, 0, 2)),
        ([HIT, HIT, MISS, HIT, HIT, HIT], 3, 2, (6, 3, 6)),
        ([], 1, 1, (0, 0, 0)),
    ],
)
def test_sliding_window_answer(
    states: list[LookupResult], initial: int, window: int, expected: tuple[object, ...]
) -> None:
    assert _answer(states, initial, window) == expected


def test_concrete_refuses_a_symbolic_answer() -> None:
    answer = sliding_window_answer(list(z3.Ints("s0 s1")), 1, 1)
    with pytest.raises(TypeError, match="needs a scan evaluated on Python ints"):
        answer.concrete()
    assert ScanAnswer(True, 3, 1).concrete() is None
    assert ScanAnswer(False, 3, 1).concrete() == 3


def test_symbolic_scanner_agrees_with_the_int_scanner() -> None:
    variables = list(z3.Ints("s0 s1 s2"))
    for window, extra in itertools.product((1, 2), (0, 1)):
        symbolic = sliding_window_answer(variables, window + extra, window)
        for states in itertools.product(list(LookupResult), repeat=3):
            concrete = sliding_window_answer(list(states), window + extra, window)
            pairs = [(v, z3.IntVal(int(s))) for v, s in zip(variables, states, strict=True)]

            def value(term: object, pairs: list[tuple[z3.ArithRef, z3.IntNumRef]] = pairs
                      ) -> object:
                folded = z3.simplify(z3.substitute(term, *pairs))
                return z3.is_true(folded) if z3.is_bool(folded) else folded.as_long()

            assert value(symbolic.deferred) == concrete.deferred, states
            assert value(symbolic.end) == concrete.end, states
            assert value(symbolic.window_start) == concrete.window_start, states


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([HIT, HIT, MISS, HIT], (2, False)),
        ([HIT, RETRY, HIT, MISS, HIT], (3, True)),  # scanned past the RETRY, deferred
        ([HIT, HIT, MISS, HIT_PENDING], (2, False)),  # pending after the MISS: not read
        ([HIT_PENDING, HIT], (2, True)),
        ([RETRY], (1, True)),
        ([MISS, RETRY], (0, False)),
        ([], (0, False)),
    ],
)
def test_prefix_answer(states: list[LookupResult], expected: tuple[int, bool]) -> None:
    answer = prefix_answer(states)
    assert (answer.end, answer.deferred) == expected
    assert answer.window_start == 0
    assert answer.concrete() == (None if expected[1] else expected[0])


def test_eagle_query_end() -> None:
    assert eagle_query_end(3, 5) == 4
    assert eagle_query_end(5, 5) == 5  # no key past the last one
    c, n = z3.Ints("c n")
    solver = z3.Solver()
    solver.add(c == 4, n == 4, eagle_query_end(c, n) != 4)
    assert solver.check() == z3.unsat


def test_answer_is_all_hit() -> None:
    states = [HIT, HIT_PENDING, HIT]
    assert answer_is_all_hit(states, ScanAnswer(False, 3, 1)) is False
    assert answer_is_all_hit(states, ScanAnswer(True, 3, 1)) is True  # deferred: no load
    assert answer_is_all_hit(states, ScanAnswer(False, 3, 2)) is True
    assert answer_is_all_hit(states, ScanAnswer(False, 1, 0)) is True
    assert answer_is_all_hit([MISS], ScanAnswer(False, 0, 0)) is True
