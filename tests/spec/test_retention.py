"""kvcontract.spec.retention: skipped tokens, Ret(n), Load(N, L), the FA load range and
the allocation bound, on the worked numbers of docs/CONTRACT.md 3 and brute force.

(Load(3904, 0, ...) and Load(64, 0, 16, 1, 32, 3) are in tests/spec/test_formulas.py.)"""

from __future__ import annotations

import itertools

import z3

from kvcontract.spec.retention import (
    allocation_block_span,
    allocation_bound_holds,
    first_fresh_block,
    full_attention_load_chunk_range,
    load_chunk_range,
    retained_block_range,
    retained_token_range,
    skipped_tokens,
)


def test_worked_numbers() -> None:
    # sw 128, e 0, bs 64, bpc 4, N 3904: skipped 3777, block 59.
    assert skipped_tokens(3904, 128, 0) == 3777
    assert retained_block_range(3904, 64, 128, 0) == (59, 61)
    assert first_fresh_block(3904, 0, 64, 128, 0) == 59
    # sw 32, e 3, bs 16, N 64: skipped 30, block 1.
    assert skipped_tokens(64, 32, 3) == 30
    assert retained_block_range(64, 16, 32, 3) == (1, 4)


def test_nothing_is_skipped_inside_the_window() -> None:
    assert skipped_tokens(0, 8, 0) == 0
    assert skipped_tokens(7, 8, 0) == 0
    assert skipped_tokens(8, 8, 0) == 1
    assert skipped_tokens(10, 8, 3) == 0  # e keeps three more tokens
    assert skipped_tokens(11, 8, 3) == 1
    assert retained_token_range(20, 8, 3) == (10, 20)


def test_retained_blocks_hold_exactly_the_retained_tokens() -> None:
    # Brute force: block i is in Ret(n) iff it holds a token of [skipped(n), n).
    for n, bs, sw, e in itertools.product(range(0, 40), (1, 4, 6), (2, 5, 8), (0, 3)):
        first, end = retained_block_range(n, bs, sw, e)
        kept = range(skipped_tokens(n, sw, e), n)
        blocks = {t // bs for t in kept}
        assert set(range(first, end)) == blocks, (n, bs, sw, e)


def test_load_range_with_a_local_hit() -> None:
    # sw 8, bs 4, N 20: skipped 13, retained blocks [3, 5). A local hit of 16 tokens
    # (4 blocks) leaves only block 4 fresh.
    assert first_fresh_block(20, 0, 4, 8, 0) == 3
    assert first_fresh_block(20, 16, 4, 8, 0) == 4
    assert load_chunk_range(20, 16, 4, 1, 8, 0) == (4, 5)
    assert load_chunk_range(20, 16, 4, 2, 8, 0) == (2, 3)
    # A local hit inside a block counts that block as local (cdiv).
    assert first_fresh_block(20, 13, 4, 8, 0) == 4
    # A local hit below the window changes nothing.
    assert load_chunk_range(20, 4, 4, 1, 8, 0) == (3, 5)


def test_load_range_is_the_chunks_with_a_fresh_block() -> None:
    for hit, local, bs, bpc, sw, e in itertools.product(
        range(1, 36), (0, 4, 8), (2, 4), (1, 2, 3), (2, 7), (0, 2)
    ):
        if local >= hit:
            continue
        first, end = retained_block_range(hit, bs, sw, e)
        fresh = {b // bpc for b in range(max(first, -(-local // bs)), end)}
        lo, hi = load_chunk_range(hit, local, bs, bpc, sw, e)
        assert set(range(lo, hi)) == fresh, (hit, local, bs, bpc, sw, e)


def test_full_attention_loads_everything_past_the_local_hit() -> None:
    assert full_attention_load_chunk_range(13, 0, 4, 1) == (0, 4)
    assert full_attention_load_chunk_range(13, 8, 4, 1) == (2, 4)
    assert full_attention_load_chunk_range(13, 8, 4, 2) == (1, 2)
    assert full_attention_load_chunk_range(13, 6, 4, 1) == (2, 4)  # block 1 is local


def test_allocation_span_and_bound() -> None:
    # N 12, sw 2, e 8, bs 4: retained [3, 12) spans blocks 0-2: 3 fresh blocks.
    assert allocation_block_span(12, 0, 4, 2, 8) == 3
    assert allocation_bound_holds(12, 0, 4, 1, 2, 8, window=2)  # 3 <= 2 * 1 + 1
    assert not allocation_bound_holds(12, 0, 4, 1, 2, 8, window=1)  # 3 > 1 * 1 + 1
    assert allocation_block_span(12, 8, 4, 2, 8) == 1  # blocks 0, 1 are local
    assert allocation_bound_holds(12, 8, 4, 1, 2, 8, window=0)


def test_formulas_evaluate_on_terms() -> None:
    n, local = z3.Ints("n local")
    lo, hi = load_chunk_range(n, local, 4, 2, 8, 3)
    solver = z3.Solver()
    solver.add(n == 50, local == 0)
    # skipped(50) = 40: block 10, chunk 5; cdiv(50, 8) = 7.
    solver.add(z3.Or(lo != 5, hi != 7))
    assert solver.check() == z3.unsat
