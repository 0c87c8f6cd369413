"""kvcontract.spec.multigroup: load and read ranges per group kind, the read requirement
of a boundary, and the contract's answer of a multi-group lookup (docs/CONTRACT.md 4.4)
on the scenarios of sections 8.1, 10 and 12."""

from __future__ import annotations

from collections.abc import Sequence

from kvcontract.spec import multigroup as mg
from kvcontract.spec.geometry import Geometry, fa, mamba, swa
from kvcontract.spec.lookup import HIT, HIT_PENDING, MISS, LookupResult

FA_SWA = Geometry((fa(4), swa(4, 8)))
SWA_MAMBA = Geometry((swa(4, 8), mamba(8)))
EAGLE = Geometry((swa(4, 8, eagle=True),))


def _answer(geometry: Geometry, tokens: int, states: Sequence[Sequence[LookupResult]],
            local: int = 0) -> tuple[int | None, bool]:
    answer = mg.contract_answer(geometry, tokens, local, dict(enumerate(states)))
    assert answer.required_hit() == answer.best_present
    return answer.best_present, answer.pending_in_window


def test_initial_max_hit_and_complete_chunks() -> None:
    assert mg.initial_max_hit(FA_SWA, 17) == 16  # the last token is recomputed
    assert mg.initial_max_hit(Geometry((fa(4),)), 17) == 17
    assert mg.complete_chunks(FA_SWA, FA_SWA.groups[0], 17) == 4
    bpc2 = Geometry((fa(4), swa(4, 8)), blocks_per_chunk=2)
    assert mg.complete_chunks(bpc2, bpc2.groups[1], 17) == 2


def test_a_mamba_group_recomputes_the_last_token() -> None:
    """vLLM's offloading lookup gives a Mamba group a window of one chunk, so a geometry
    with one caps the hit at ``P - 1`` like an SWA group (without SWA too); observed
    live on vLLM 0.33.0: FA + Mamba with 64-token chunks, a chunk-aligned resend of 256
    tokens is served 192, not 256."""
    from kvcontract.spec.properties.end_to_end import promised_hit
    from kvcontract.spec.properties.store import StoreCase

    fa_mamba = Geometry((fa(64), mamba(64)), retention_interval=0)
    assert fa_mamba.recomputes_last_token and not fa_mamba.has_swa
    assert not Geometry((fa(64),)).recomputes_last_token
    assert mg.initial_max_hit(fa_mamba, 256) == 255
    producer = StoreCase("FA64+Mamba64", fa_mamba, 256, (256,), "finished", decode=3)
    assert promised_hit(fa_mamba, producer, 256) == 192


def test_load_range_per_kind() -> None:
    fa_group, swa_group = FA_SWA.groups
    assert mg.load_range(FA_SWA, fa_group, 12, 0) == (0, 3)
    assert mg.load_range(FA_SWA, swa_group, 12, 0) == (1, 3)  # 10: FA {0,1,2}, SWA {1,2}
    assert mg.load_range(FA_SWA, fa_group, 12, 4) == (1, 3)
    assert mg.load_range(FA_SWA, swa_group, 13, 0) == (1, 4)
    mamba_group = SWA_MAMBA.groups[1]
    assert mg.load_range(SWA_MAMBA, mamba_group, 24, 0) == (2, 3)  # the chunk ending at 24
    assert mg.load_range(SWA_MAMBA, mamba_group, 24, 16) == (2, 3)
    assert mg.load_range(SWA_MAMBA, mamba_group, 24, 24) == (3, 3)  # nothing to load


def test_first_live_block_per_kind() -> None:
    geometry = Geometry((fa(4), swa(4, 8), mamba(8)))
    fa_group, swa_group, mamba_group = geometry.groups
    assert mg.first_live_block(geometry, fa_group, 40) == 0
    assert mg.first_live_block(geometry, swa_group, 20) == 3  # skipped 13
    assert mg.first_live_block(geometry, swa_group, 7) == 0
    assert mg.first_live_block(geometry, mamba_group, 20) == 1  # chunk [8, 16)
    bpc2 = Geometry((mamba(8),), blocks_per_chunk=2)
    assert mg.first_live_block(bpc2, bpc2.groups[0], 40) == 2  # chunk 1 = blocks 2, 3


def test_read_range_adds_the_eagle_peek() -> None:
    assert mg.read_range(EAGLE, EAGLE.groups[0], 12, 0) == (1, 4)
    assert mg.read_range(FA_SWA, FA_SWA.groups[1], 12, 0) == (1, 3)


def test_group_read_requirement() -> None:
    swa_group = FA_SWA.groups[1]
    assert mg.group_read_requirement(FA_SWA, swa_group, 12, 0, 17) == (1, 3)
    # Less than one chunk past the local hit: nothing to gain.
    assert mg.group_read_requirement(FA_SWA, swa_group, 11, 8, 17) is None
    assert mg.group_read_requirement(FA_SWA, swa_group, 12, 8, 17) == (2, 3)
    # The read range ends past the complete chunks (EAGLE peek of 16 with 4 keys).
    assert mg.group_read_requirement(EAGLE, EAGLE.groups[0], 16, 0, 17) is None
    assert mg.group_read_requirement(EAGLE, EAGLE.groups[0], 12, 0, 17) == (1, 4)
    # Mamba serves chunk-aligned boundaries only.
    mamba_group = SWA_MAMBA.groups[1]
    assert mg.group_read_requirement(SWA_MAMBA, mamba_group, 20, 0, 25) is None
    assert mg.group_read_requirement(SWA_MAMBA, mamba_group, 24, 0, 25) == (2, 3)


def test_group_accepts() -> None:
    swa_group = FA_SWA.groups[1]
    asked: list[int] = []

    def present(chunk: int) -> bool:
        asked.append(chunk)
        return chunk != 2

    assert mg.group_accepts(FA_SWA, swa_group, 8, 0, 17, present)
    assert sorted(asked) == [0, 1]
    assert not mg.group_accepts(FA_SWA, swa_group, 12, 0, 17, present)
    assert not mg.group_accepts(FA_SWA, swa_group, 11, 8, 17, lambda chunk: True)


def test_contract_answer_on_the_stale_pending_form() -> None:
    # 8.1: SWA 0, 1 ready, 2 absent, 3 pending: the hit is 8, nothing pending in its window.
    assert _answer(FA_SWA, 17, [[HIT] * 4, [HIT, HIT, MISS, HIT_PENDING]]) == (8, False)
    # 12: FA chunk 3 pending, SWA chunk 2 absent: 8, not deferred.
    assert _answer(FA_SWA, 17, [[HIT, HIT, HIT, HIT_PENDING], [HIT, HIT, MISS, HIT]]) == \
        (8, False)


def test_contract_answer_counts_pending_as_present() -> None:
    assert _answer(FA_SWA, 17, [[HIT] * 4, [HIT, HIT, HIT_PENDING, HIT]]) == (16, True)
    assert _answer(FA_SWA, 17, [[HIT] * 4, [HIT_PENDING, HIT, HIT, HIT]]) == (16, False)
    assert _answer(FA_SWA, 17, [[MISS] * 4, [HIT] * 4]) == (None, False)
    assert _answer(FA_SWA, 13, [[HIT] * 3, [HIT] * 3]) == (12, False)


def test_contract_answer_with_a_local_hit() -> None:
    states = [[MISS, MISS, HIT, HIT], [MISS, MISS, HIT, HIT]]
    assert _answer(FA_SWA, 17, states, local=8) == (16, False)
    assert _answer(FA_SWA, 17, states) == (None, False)


def test_contract_answer_eagle_table() -> None:
    # docs/CONTRACT.md 10: SWA bs 4, sw 8 EAGLE, all HIT: 9 tokens -> 4, 13 tokens -> 8.
    assert _answer(EAGLE, 9, [[HIT] * 2]) == (4, False)
    assert _answer(EAGLE, 13, [[HIT] * 3]) == (8, False)
    assert _answer(EAGLE, 17, [[HIT] * 4]) == (12, False)
    assert _answer(EAGLE, 17, [[HIT] * 3 + [MISS]]) == (8, False)  # the peek of 12 is absent


def test_contract_answer_with_mamba() -> None:
    assert _answer(SWA_MAMBA, 25, [[HIT] * 6, [HIT] * 3]) == (24, False)
    assert _answer(SWA_MAMBA, 25, [[HIT] * 6, [HIT, HIT, MISS]]) == (16, False)


def test_group_visit_order() -> None:
    geometry = Geometry((mamba(8), swa(4, 8), fa(4), swa(8, 24), swa(8, 12)))
    windows = {1: 2, 3: 3, 4: 2}
    assert mg.group_visit_order(geometry, windows) == [2, 3, 1, 4, 0]


def test_the_full_attention_groups_serve_the_largest_boundary_their_present_chunks_allow() -> None:
    """FA bs 16 + SWA bs 4 (sw 8): with FA chunks 0-1 present and chunk 2 missing the full-
    attention groups serve 32 (reading FA 0-1); a pending chunk counts as present; with
    chunk 0 missing they serve none past the local hit."""
    full_attention_served = mg.full_attention_served
    geometry = Geometry((fa(16), swa(4, 8)), retention_interval=0)
    swa_row = [MISS] * 14
    assert full_attention_served(geometry, 59, 0, [[HIT, HIT, MISS], swa_row], 48) == (
        32, frozenset({(0, 0), (0, 1)}))
    assert full_attention_served(geometry, 59, 0, [[HIT, HIT_PENDING, HIT], swa_row],
                                 48)[0] == 48
    assert full_attention_served(geometry, 59, 0, [[MISS, HIT, HIT], swa_row], 48) == (
        0, frozenset())
