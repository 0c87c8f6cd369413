"""The partial-tail statement (spec/partial_tail.py, docs/CONTRACT.md 9.2): when vLLM
0.33.0 offers a boundary finer than a chunk, which one a producer stores, and what a
consumer is owed through it. vLLM's own runs are held against it in
tests/live/test_partial_tail.py."""

from __future__ import annotations

import pytest

from kvcontract.spec.geometry import Geometry, fa, mamba, swa
from kvcontract.spec.partial_tail import (
    partial_tail_boundary,
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
