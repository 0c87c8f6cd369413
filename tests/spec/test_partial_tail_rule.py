"""The partial-tail statement (spec/partial_tail.py, docs/CONTRACT.md 9.2): when vLLM
0.33.0 offers a boundary finer than a chunk, which one a producer stores, and what a
consumer is owed through it. vLLM's own runs are held against it in
tests/live/test_partial_tail.py."""

from __future__ import annotations

import pytest

from kvcontract.spec.geometry import Geometry, fa, mamba, swa
from kvcontract.spec.partial_tail import (
    partial_tail_boundary,
    partial_tail_candidates,
    partial_tail_key_position,
    partial_tail_off,
    partial_tail_promise,
)

ON = Geometry((fa(64), mamba(64)), hash_block_size=16)


@pytest.mark.parametrize(("geometry", "why"), [
    (Geometry((fa(64), mamba(64)), hash_block_size=64), "no Mamba group with a block larger"),
    (Geometry((fa(64), mamba(64)), blocks_per_chunk=2, hash_block_size=16),
     "blocks per chunk is 2"),
    (Geometry((fa(32), mamba(64)), hash_block_size=16), "block sizes [32, 64]"),
    (Geometry((fa(64), swa(64, 128), mamba(64)), hash_block_size=16), "sliding-window"),
    (Geometry((fa(64, eagle=True), mamba(64)), hash_block_size=16), "EAGLE"),
    (Geometry((fa(64),), hash_block_size=16), "no Mamba group"),
])
def test_partial_tails_are_off(geometry: Geometry, why: str) -> None:
    reason = partial_tail_off(geometry)
    assert reason is not None and why in reason
    assert partial_tail_boundary(geometry, 230) is None
    assert partial_tail_promise(geometry, 230, 230, 230) == 0


def test_the_boundary_is_the_last_hash_block_before_the_last_token() -> None:
    assert partial_tail_off(ON) is None
    # P - 1 rounded down to the hash block; a chunk multiple is the complete chunks'.
    assert [partial_tail_boundary(ON, p) for p in (230, 240, 241, 256, 257, 200, 1)] == [
        224, 224, 240, 240, None, None, None]


def test_the_promise_needs_the_keyed_tokens_and_room_before_the_last_token() -> None:
    assert partial_tail_promise(ON, 230, 230, 230) == 224  # resend
    assert partial_tail_promise(ON, 230, 237, 234) == 224  # continuation
    assert partial_tail_promise(ON, 230, 232, 224) == 224  # shares exactly b(P) tokens
    assert partial_tail_promise(ON, 230, 232, 223) == 0    # one token short of the key
    assert partial_tail_promise(ON, 230, 224, 224) == 0    # b(P) would be its last token


def test_the_key_position_per_block_hash_mode() -> None:
    legacy = Geometry((fa(64, eagle=True), mamba(64)), hash_block_size=16)
    lookahead = Geometry((fa(64, eagle=True), mamba(64)), hash_block_size=16,
                         hash_lookahead=1)
    # A legacy EAGLE attention group keys its tail one hash block past the boundary;
    # the Mamba group, lookahead hashes and non-EAGLE groups key it at the boundary.
    assert [partial_tail_key_position(legacy, g, 224) for g in (0, 1)] == [240, 224]
    assert [partial_tail_key_position(lookahead, g, 224) for g in (0, 1)] == [224, 224]
    assert [partial_tail_key_position(ON, g, 224) for g in (0, 1)] == [224, 224]
    legacy_off, lookahead_off = partial_tail_off(legacy), partial_tail_off(lookahead)
    assert legacy_off is not None and "legacy hashes" in legacy_off
    assert lookahead_off is not None and "lookahead hashes" in lookahead_off


def test_the_search_is_anchored_at_the_full_attention_hit() -> None:
    # Complete and full-attention hits agree: the block above 192, below N - 1 = 229.
    assert partial_tail_candidates(ON, 192, 192, 229) == [224, 208]
    # The Mamba group cut the complete hit to 0 below a full-attention hit of 256: the
    # search reaches the block above 256 and skips the chunk boundaries it already missed.
    found = partial_tail_candidates(ON, 0, 256, 299)
    assert found[:3] == [288, 272, 240] and found[-1] == 16
    assert not {64, 128, 192, 256} & set(found)
    # vLLM 0.33.0's search (anchored at the complete hit) stops in the first block.
    assert partial_tail_candidates(ON, 0, 0, 299) == [48, 32, 16]
    # A legacy EAGLE tail carries its own proof: one block more is searched.
    legacy = Geometry((fa(64, eagle=True), mamba(64)), hash_block_size=16)
    assert partial_tail_candidates(legacy, 128, 128, 1000)[0] == 240
