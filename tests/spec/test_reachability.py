"""kvcontract.spec.reachability: the store mask (rules (a)-(e) of docs/CONTRACT.md 5), the
store rule of a geometry's group, horizons and demand, on the upstream matrices of
section 10 and the numbers of sections 8.3, 8.4 and 12."""

from __future__ import annotations

import itertools

import pytest
import z3

from kvcontract.impl.reference import is_block_reachable as reference_is_block_reachable
from kvcontract.spec import reachability as reach
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.reachability import MaskRule, RequestStatus

PREFILLING, DECODING = RequestStatus.PREFILLING, RequestStatus.DECODING
FINISHED, ABORTED = RequestStatus.FINISHED, RequestStatus.ABORTED


def _stored(geometry: Geometry, horizon: int, replay: tuple[int, ...] = (),
            final: int | None = None) -> set[int]:
    return reach.group_stored_chunks(geometry, geometry.groups[1], horizon, final, replay)


def test_retention_interval_matrix() -> None:
    # Section 10: FA 16, SWA bs 4, sw 8, 64 tokens; replay boundary 63 -> 48 -> block 12.
    interval = Geometry((fa(16), swa(4, 8)), retention_interval=32)
    assert _stored(interval, 16, replay=(63,)) == {6, 7, 10, 11, 14, 15}
    assert _stored(interval, 16) == {6, 7, 14, 15}  # the segment tails alone
    zero = Geometry((fa(16), swa(4, 8)), retention_interval=0)
    assert _stored(zero, 16, replay=(63,)) == {10, 11}
    assert _stored(zero, 16) == set()  # no segments, no replay boundary: nothing


@pytest.mark.parametrize(("extra", "blocks"), [(0, {2, 3, 6, 7}), (1, {2, 3, 6, 7}),
                                               (3, {1, 2, 3, 5, 6, 7})])
def test_mtp_matrix(extra: int, blocks: set[int]) -> None:
    # Section 10: a 33-token request (8 complete blocks), FA 16 + SWA bs 4, sw 8.
    geometry = Geometry((fa(16), swa(4, 8, extra)))
    assert _stored(geometry, 33 // 4) == blocks
    assert reach.group_stored_chunks(geometry, geometry.groups[0], 2) == {0, 1}


def test_mtp_defect_numbers() -> None:
    # 8.3: FA 64 (per 4) + SWA bs 16, sw 32, e 3: need cdiv(34, 16) = 3 stores {1, 2, 3}
    # of each segment; the attention window alone (need 2) only {2, 3}.
    geometry = Geometry((fa(64), swa(16, 32, 3)))
    assert reach.group_mask(geometry, geometry.groups[1]) == (MaskRule(False, 4, 4), 3)
    assert _stored(geometry, 8) == {1, 2, 3, 5, 6, 7}
    assert _stored(Geometry((fa(64), swa(16, 32))), 8) == {2, 3, 6, 7}


def test_prefill_horizon_numbers() -> None:
    # 8.4: FA 36 + SWA bs 4, sw 16: per 9, need 4; horizon 300 chunks: 135 stored.
    geometry = Geometry((fa(36), swa(4, 16)))
    stored = _stored(geometry, 300)
    assert stored == {c for c in range(300) if c % 9 >= min(9, 300 - (c - c % 9)) - 4}
    assert len(stored) == 135
    # Closing the final segment at the frontier 250 stores the tail {246, .., 249}.
    assert {246, 247, 248, 249} <= _stored(geometry, 250)
    assert {246, 247} & _stored(geometry, 250, final=300) == set()


def test_store_need_blocks() -> None:
    assert reach.store_need_blocks(8, 0, 4, False) == 2
    assert reach.store_need_blocks(8, 3, 4, False) == 3  # the MTP-widened window sw + e
    assert reach.store_need_blocks(8, 0, 4, True) == 3  # the EAGLE peek block
    assert reach.store_need_blocks(9, 0, 4, False) == 2
    assert reach.store_need_blocks(10, 0, 4, False) == 3


def test_mask_rule() -> None:
    assert reach.mask_rule(None, 4, None) == MaskRule(True, None, None)
    assert reach.mask_rule(36, 8, None) == MaskRule(True, None, None)  # A not a multiple of B
    assert reach.mask_rule(16, 4, None) == MaskRule(False, 4, 4)
    assert reach.mask_rule(16, 4, 0) == MaskRule(False, None, 4)
    assert reach.mask_rule(16, 4, 64) == MaskRule(False, 16, 4)


def test_store_everything_without_alignment() -> None:
    geometry = Geometry((fa(12), swa(8, 9)))  # A 12 is not a multiple of B 8
    assert _stored(geometry, 10) == set(range(10))
    assert reach.group_replay_blocks(geometry, geometry.groups[1], (63,)) == ()
    rule = reach.mask_rule(16, 4, None)
    assert all(reach.block_is_reachable(b, rule, 4, False, None) for b in range(12))  # need 4


def test_final_partial_segment() -> None:
    rule = reach.mask_rule(16, 4, None)  # period 4

    def marked(need: int, eagle: bool, final: int) -> set[int]:
        return {b for b in range(final) if reach.block_is_reachable(b, rule, need, eagle, final)}

    # Tails {2, 3}; the final segment [4, 7) ends in blocks 5 and 6.
    assert marked(2, False, 7) == {2, 3, 5, 6}
    assert marked(2, False, 8) == {2, 3, 6, 7}  # a complete last segment: no extra tail
    assert marked(3, False, 5) == {1, 2, 3, 4}  # max(F - F mod per, F - need) = 4
    # EAGLE has no final tail (its peek block would not exist), only shifted tails.
    assert marked(2, True, 7) == {3, 4}


def test_eagle_peek_chunk_after_an_unaligned_boundary() -> None:
    # Section 12: FA 528 + SWA 32, bpc 2 (A 1056 = 33 blocks, tpc 64), sw 2, e 0: the
    # boundary 1056 demands chunks {16, 17}; the reference marks block 34 (chunk 17).
    geometry = Geometry((fa(528), swa(32, 2, eagle=True)), blocks_per_chunk=2)
    group = geometry.groups[1]
    assert reach.demanded_chunk_range(1056, 2, 0, 64, True) == (16, 18)
    assert reach.group_marked_blocks(geometry, group, 16, None) == [32, 33]
    assert reach.group_marked_blocks(geometry, group, 17, None) == [34]
    assert reach.group_chunk_is_stored(geometry, group, 17, None)


def test_eagle_replay_boundary_stores_the_peek_chunk() -> None:
    # Section 12: FA 4 + SWA 8 EAGLE, bpc 2, retention 0, replay boundary at 8 tokens.
    geometry = Geometry((fa(4), swa(8, 2, eagle=True)), blocks_per_chunk=2,
                        retention_interval=0)
    assert reach.group_replay_blocks(geometry, geometry.groups[1], (8,)) == (1,)
    assert _stored(geometry, 4, replay=(8,)) == {0, 1}
    assert reach.peek_chunk_first_block(1, 2) == 2
    assert reach.peek_chunk_first_block(4, 2) == 4
    assert reach.peek_chunk_first_block(5, 4) == 8


@pytest.mark.parametrize("eagle", [False, True])
@pytest.mark.parametrize("retention", [None, 0, 32])
@pytest.mark.parametrize("bpc", [1, 2])
def test_mask_matches_the_reference_mask(eagle: bool, retention: int | None, bpc: int) -> None:
    # The spec's predicate and the reference's operational mask agree block by block,
    # replay boundaries (rule (d), shifted by one block for EAGLE) included.
    align = 16 * bpc
    rule = reach.mask_rule(align, 4, retention)
    for sw, e, final, replay in itertools.product(
        (2, 8, 13), (0, 3), (None, 6, 9, 12), ((), (12,), (5, 17))
    ):
        if retention is None and replay:
            continue  # no replay boundaries without a retention interval
        need = reach.store_need_blocks(sw, e, 4, eagle)
        for block in range(24):
            spec = reach.block_is_reachable(block, rule, need, eagle, final, replay, bpc)
            ref = reference_is_block_reachable(block, align, 4, sw, e, eagle, retention,
                                               final, replay, bpc)
            assert bool(spec) == bool(ref), (sw, e, final, replay, block)


def test_block_is_reachable_on_a_symbolic_block() -> None:
    block = z3.Int("block")
    rule = reach.mask_rule(16, 4, 32)
    term = reach.block_is_reachable(block, rule, 2, False, 14, (12,))
    for b in range(20):
        folded = z3.simplify(z3.substitute(term, (block, z3.IntVal(b))))
        assert z3.is_true(folded) == reach.block_is_reachable(b, rule, 2, False, 14, (12,))


def test_replay_boundary_block() -> None:
    assert reach.replay_boundary_block(63, 16, 4) == 12
    assert reach.replay_boundary_block(64, 16, 4) == 16
    assert reach.replay_boundary_block(15, 16, 4) == 0


def test_marked_blocks_of_a_full_attention_group() -> None:
    geometry = Geometry((fa(16), swa(4, 8)), blocks_per_chunk=2)
    assert reach.group_marked_blocks(geometry, geometry.groups[0], 3, 4) == [6, 7]
    assert reach.group_chunk_is_stored(geometry, geometry.groups[0], 3, 4)
    # A = 32, period 8, need 2: the tail is blocks 6 and 7, chunk 3.
    assert reach.group_marked_blocks(geometry, geometry.groups[1], 1, 4) == []
    assert reach.group_marked_blocks(geometry, geometry.groups[1], 3, 4) == [6, 7]


def test_stored_token_count() -> None:
    count = reach.stored_token_count
    assert count(ABORTED, 700, 300, 1000, 1200) == 700
    assert count(FINISHED, 1203, 0, 1204, 1200) == 1200  # prompt only (the default)
    assert count(FINISHED, 1203, 0, 1204, 1200, prompt_only=False) == 1203  # not 1204
    # An error finish mid-prefill (FINISHED_ERROR): only what it computed (C14).
    assert count(FINISHED, 1000, 0, 1001, 1200, prompt_only=False) == 1000
    assert count(PREFILLING, 1000, 200, 1200, 1200) == 1200
    assert count(PREFILLING, 1000, 200, 1200, 1200, max_offload_tokens=1100) == 1100
    assert count(DECODING, 1200, 1, 1201, 1200) == 1200
    assert count(DECODING, 1200, 1, 1201, 1200, prompt_only=False) == 1201


def test_storable_chunks() -> None:
    assert reach.storable_chunks(33, 4, False, DECODING) == 8
    assert reach.storable_chunks(33, 4, True, DECODING) == 7  # the volatile last chunk
    assert reach.storable_chunks(33, 4, True, PREFILLING) == 8
    assert reach.storable_chunks(33, 4, True, FINISHED) == 8
    assert reach.storable_chunks(3, 4, True, DECODING) == 0  # never negative


def test_final_segment_end_chunk() -> None:
    # C9: while running, the prompt horizon; on finish or abort, the actual one.
    assert reach.final_segment_end_chunk(PREFILLING, 300, 250, None) == 300
    assert reach.final_segment_end_chunk(DECODING, 300, 301, None) == 300
    assert reach.final_segment_end_chunk(FINISHED, 300, 301, None) == 301
    assert reach.final_segment_end_chunk(ABORTED, 300, 250, None) == 250
    # Under a retention interval (0 included) no final tail: keeps_final_tail.
    for retention in (0, 32):
        for status in (PREFILLING, DECODING, FINISHED, ABORTED):
            assert reach.final_segment_end_chunk(status, 300, 250, retention) is None


def test_demanded_chunk_range() -> None:
    assert reach.demanded_chunk_range(16, 8, 3, 4, False) == (1, 4)
    assert reach.demanded_chunk_range(16, 8, 3, 4, True) == (1, 5)
    assert reach.demanded_chunk_range(3904, 128, 0, 256, False) == (14, 16)
    assert reach.demanded_chunk_range(4, 8, 0, 4, False) == (0, 1)  # clamped at chunk 0
