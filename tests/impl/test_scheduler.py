"""The operational scheduler: EAGLE at chunk granularity, load ranges, store tracking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcontract.impl.scheduler import (
    StoreTracker,
    group_first_live_block,
    group_load_range,
    lookup_complete_chunks,
)
from kvcontract.impl.variants import get_implementation
from kvcontract.spec import multigroup
from kvcontract.spec import retention as spec_ret
from kvcontract.spec.geometry import Geometry, GroupKind, fa, mamba, swa
from kvcontract.spec.lookup import LookupResult

REFERENCE = get_implementation("reference")
HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING

EAGLE_BPC4 = Geometry((fa(16), swa(4, 8, eagle=True)), blocks_per_chunk=4)


def test_eagle_bpc4_pops_one_chunk() -> None:
    # 193 tokens: maxhit 192 = 12 SWA chunks of 16 tokens; there is no 13th key to peek
    # at, so the EAGLE group pops a whole chunk (4 blocks) and verifies 176 with chunk 11
    # as its peek: the hit is 176 and chunk 11 is looked up but not loaded.
    outcome = lookup_complete_chunks(REFERENCE, EAGLE_BPC4, 193, 0, lambda g, k: HIT)
    assert outcome.hit_tokens == 176
    assert outcome.load_ranges[1] == (10, 11)  # skipped(176) = 169: block 42, chunk 10
    assert (1, 11) in outcome.lookups
    assert outcome.hit_tokens == multigroup.contract_answer(
        EAGLE_BPC4, 193, 0, {0: [HIT] * 3, 1: [HIT] * 12}
    ).best_present


def test_eagle_bpc4_missing_peek_chunk_lowers_the_hit() -> None:
    # The chunk after 176 (its peek) is missing: 176 cannot be verified, 160 can.
    states = {0: [HIT] * 3, 1: [HIT] * 11 + [MISS]}
    outcome = lookup_complete_chunks(REFERENCE, EAGLE_BPC4, 193, 0, lambda g, k: states[g][k])
    assert outcome.hit_tokens == 160
    assert multigroup.contract_answer(EAGLE_BPC4, 193, 0, states).best_present == 160


def test_eagle_bpc4_pending_peek_defers() -> None:
    states = {0: [HIT] * 3, 1: [HIT] * 11 + [PENDING]}
    outcome = lookup_complete_chunks(REFERENCE, EAGLE_BPC4, 193, 0, lambda g, k: states[g][k])
    assert outcome.hit_tokens is None
    assert multigroup.contract_answer(EAGLE_BPC4, 193, 0, states).pending_in_window


@pytest.mark.parametrize(("tokens", "hit", "keys_looked_up"), [(9, 4, 2), (17, 12, 3)])
def test_eagle_single_group_table(tokens: int, hit: int, keys_looked_up: int) -> None:
    # docs/CONTRACT.md 10 (W = 2): 9 tokens -> 4. With 4 complete keys (17 tokens) the peek key
    # exists and the hit is 12; a 13-token request has only 3 keys, so 4.4's query end
    # min(maxhit + tpc, #keys * tpc) = 12 leaves no peek key and the hit is 8.
    geometry = Geometry((swa(4, 8, eagle=True),))
    outcome = lookup_complete_chunks(REFERENCE, geometry, tokens, 0, lambda g, k: HIT)
    assert outcome.hit_tokens == hit
    assert len(set(outcome.lookups)) == keys_looked_up
    assert lookup_complete_chunks(REFERENCE, geometry, 13, 0, lambda g, k: HIT).hit_tokens == 8


@settings(max_examples=60)
@given(
    bpc=st.sampled_from([1, 2, 4]),
    extra=st.integers(0, 3),
    prompt=st.integers(20, 120),
    local_blocks=st.integers(0, 6),
    data=st.data(),
)
def test_lookup_matches_contract_with_eagle_and_local_hits(
    bpc: int, extra: int, prompt: int, local_blocks: int, data: st.DataObject
) -> None:
    geometry = Geometry((fa(8), swa(4, 12, extra, eagle=True), swa(8, 16)), blocks_per_chunk=bpc)
    local = min(local_blocks * 8, prompt - 1)
    local -= local % 8
    states = {
        g: data.draw(st.lists(st.sampled_from([HIT, HIT, MISS, PENDING]),
                              min_size=prompt // geometry.chunk_tokens(s),
                              max_size=prompt // geometry.chunk_tokens(s)))
        for g, s in enumerate(geometry.groups)
    }
    outcome = lookup_complete_chunks(REFERENCE, geometry, prompt, local, lambda g, k: states[g][k])
    answer = multigroup.contract_answer(geometry, prompt, local, states)
    if answer.best_present is None:
        assert outcome.hit_tokens == local
    elif answer.pending_in_window:
        assert outcome.hit_tokens is None
    else:
        assert outcome.hit_tokens == answer.best_present
        for g, group in enumerate(geometry.groups):
            assert outcome.load_ranges[g] == multigroup.load_range(
                geometry, group, answer.best_present, local
            )


@pytest.mark.parametrize("bpc", [1, 2, 4])
@pytest.mark.parametrize("local", [0, 8, 24])
def test_load_ranges_agree_with_spec(bpc: int, local: int) -> None:
    geometry = Geometry((fa(8), swa(4, 12, 1), mamba(8)), blocks_per_chunk=bpc)
    for hit in range(local + 1, 200):
        for group in geometry.groups:
            tpc = geometry.chunk_tokens(group)
            if group.kind is GroupKind.MAMBA and (hit % tpc or local % tpc):
                continue  # a Mamba group is loaded at chunk ends only (next test)
            assert group_load_range(REFERENCE, geometry, group, hit, local) == \
                multigroup.load_range(geometry, group, hit, local), (group, hit)


def test_load_ranges_refuse_hits_outside_the_domain() -> None:
    """A local hit that is not whole blocks, or a Mamba hit inside a chunk, is a caller's
    error the load ranges stop on (docs/CONTRACT.md 13), never a silent answer."""
    geometry = Geometry((fa(8), mamba(8)), blocks_per_chunk=2)
    fa_group, mamba_group = geometry.groups
    with pytest.raises(AssertionError, match="whole number of blocks"):
        group_load_range(REFERENCE, geometry, fa_group, 32, 4)
    with pytest.raises(AssertionError, match="chunk ends"):
        group_load_range(REFERENCE, geometry, mamba_group, 24, 0)
    with pytest.raises(AssertionError, match="chunk ends"):
        group_load_range(REFERENCE, geometry, mamba_group, 32, 8)
    assert group_load_range(REFERENCE, geometry, mamba_group, 32, 16) == (1, 2)


def test_first_live_block_is_retention() -> None:
    geometry = Geometry((fa(8), swa(4, 12, 2), mamba(8)), blocks_per_chunk=2)
    fa_group, swa_group, mamba_group = geometry.groups
    for n in range(0, 100):
        assert group_first_live_block(REFERENCE, geometry, fa_group, n) == 0
        first, _ = spec_ret.retained_block_range(n, 4, 12, 2)
        assert group_first_live_block(REFERENCE, geometry, swa_group, n) == first
        # Mamba keeps the chunk that holds the state at the last chunk end.
        assert group_first_live_block(REFERENCE, geometry, mamba_group, n) == \
            max(0, n // 16 - 1) * 2


def test_mark_computed_never_reoffers() -> None:
    geometry = Geometry((fa(16), swa(4, 8)))
    tracker = StoreTracker(REFERENCE, geometry, 0, 64)
    tracker.mark_computed(2)
    assert tracker.next_stored_chunk_idx == 2
    assert tracker.step("prefilling", 32, 32, 64) == [2, 3]
    assert tracker.step("finished", 64, 0, 65) == []
    tracker.mark_computed(1)  # never moves back
    assert tracker.next_stored_chunk_idx == 4


def test_a_junction_registered_after_construction_reaches_the_mask() -> None:
    """docs/CONTRACT.md 9.3: the first consumer's tracker (59 tokens, retention 0) is
    built before its lookup; the junction 32 it registers then adds the window at 32
    (SWA 6-7) to its replay boundary's (58 -> 48: SWA 10-11). A later registration
    replaces it (vLLM's store path passes the request's current junction)."""
    geometry = Geometry((fa(16), swa(4, 8)), retention_interval=0)

    def offers(junction: int | None) -> list[int]:
        tracker = StoreTracker(REFERENCE, geometry, 1, 59)
        if junction is not None:
            tracker.register_junction(junction)
        return tracker.step("prefilling", 0, 59, 59)

    assert offers(None) == [10, 11]
    assert offers(32) == [6, 7, 10, 11]
    assert offers(0) == [10, 11]
    tracker = StoreTracker(REFERENCE, geometry, 1, 59, junction=32)
    assert tracker.mask_boundaries() == (58, 32)
    tracker.register_junction(16)
    assert tracker.mask_boundaries() == (58, 16) and tracker.replay_boundaries == (58,)
    tracker.register_junction(58)  # one of the replay boundaries already
    assert tracker.mask_boundaries() == (58,)


def test_the_full_attention_boundary_is_one_the_full_attention_groups_confirmed() -> None:
    """An EAGLE full-attention group without a key for its peek chunk proposes a chunk
    less unscanned (17 tokens, chunks of 4: 12); the junction's boundary is the one its
    scan then confirms: none when nothing is stored, 12 when its chunks are."""
    geometry = Geometry((fa(4, eagle=True), swa(4, 8)), retention_interval=0)

    def outcome(full_attention: LookupResult) -> tuple[int | None, int | None]:
        found = lookup_complete_chunks(
            REFERENCE, geometry, 17, 0, lambda g, k: full_attention if g == 0 else MISS)
        return found.hit_tokens, found.full_attention_boundary

    assert outcome(MISS) == (0, None)
    assert outcome(HIT) == (0, 12)
    assert outcome(PENDING) == (0, 12)  # the boundary a pending window serves
