"""One definition each of "first live block" and "chunk is stored" (issue #10, item 3).

The spec side (``spec.multigroup.first_live_block``, ``spec.reachability.group_*``) and
the impl side (``impl.scheduler.group_first_live_block``, ``StoreTracker``) are written
independently; for the reference they must agree, Mamba included.
"""

from __future__ import annotations

import pytest

from kvcontract.impl.scheduler import StoreTracker, group_first_live_block
from kvcontract.impl.variants import get_implementation
from kvcontract.spec import multigroup
from kvcontract.spec import reachability as reach
from kvcontract.spec.geometry import Geometry, fa, mamba, swa

REFERENCE = get_implementation("reference")

GEOMETRIES = [
    Geometry((fa(8), swa(4, 12, 2), mamba(8)), blocks_per_chunk=2),
    Geometry((fa(16), swa(4, 8, eagle=True)), blocks_per_chunk=4),
    Geometry((fa(16), swa(8, 5)), blocks_per_chunk=1, retention_interval=32),
    Geometry((swa(4, 17, 1), mamba(8)), blocks_per_chunk=2, dcp=2),
    Geometry((fa(12), swa(8, 9)), blocks_per_chunk=1),  # A not a multiple of B: store all
]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: g.describe())
def test_first_live_block_spec_and_impl_agree(geometry: Geometry) -> None:
    for g, group in enumerate(geometry.groups):
        tracker = StoreTracker(REFERENCE, geometry, g, 64)
        for n in range(0, 160):
            impl_first = group_first_live_block(REFERENCE, geometry, group, n)
            assert multigroup.first_live_block(geometry, group, n) == impl_first, (g, n)
            # The store path's C10 filter uses the same definition (Mamba included).
            assert tracker._first_live_block(n) == impl_first, (g, n)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: g.describe())
def test_marked_blocks_spec_and_impl_agree(geometry: Geometry) -> None:
    for g, group in enumerate(geometry.groups):
        replay = (37,) if geometry.retention_interval is not None else ()
        tracker = StoreTracker(REFERENCE, geometry, g, 64, replay_boundaries=replay)
        for final in (None, 3, 5, 8):
            for chunk in range(12):
                spec_marked = reach.group_marked_blocks(geometry, group, chunk, final, replay)
                if final is not None:
                    assert tracker._marked_blocks(chunk, final) == spec_marked
                assert reach.group_chunk_is_stored(
                    geometry, group, chunk, final, replay
                ) == bool(spec_marked)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: g.describe())
def test_stored_chunks_is_the_chunk_rule(geometry: Geometry) -> None:
    # The rebuild the producer checks, explain and the store theorems used to write out.
    bpc = geometry.blocks_per_chunk
    for group in geometry.groups:
        for horizon in range(0, 14):
            stored = reach.group_stored_chunks(geometry, group, horizon)
            if not group.is_swa:
                assert stored == set(range(horizon))
                continue
            assert group.sliding_window is not None
            bt = geometry.block_tokens(group)
            rule = reach.mask_rule(geometry.alignment_tokens, bt, geometry.retention_interval)
            need = reach.store_need_blocks(group.sliding_window, group.extra_retained_tokens,
                                           bt, group.eagle)
            assert stored == {
                c for c in range(horizon)
                if reach.chunk_is_stored(c, bpc, rule, need, group.eagle, horizon * bpc)
            }


def test_mamba_store_path_offers_every_chunk() -> None:
    # The C10 filter now sees Mamba's live chunk; a real schedule never offers a Mamba
    # chunk behind it, so every complete chunk is still offered exactly once.
    geometry = Geometry((fa(8), mamba(8)), blocks_per_chunk=2)
    for prompt, steps in ((64, (64,)), (70, (16, 16, 38)), (48, (5, 27, 16))):
        tracker = StoreTracker(REFERENCE, geometry, 1, prompt, offload_prompt_only=False)
        computed = 0
        for scheduled in steps:
            tracker.step("prefilling", computed, scheduled, prompt)
            computed += scheduled
        for _ in range(20):
            tracker.step("decoding", computed, 1, computed + 1)
            computed += 1
        tracker.step("finished", computed, 0, computed + 1)
        offered = [c for offer in tracker.offers for c in offer]
        assert sorted(offered) == list(range(computed // 16))
        assert not tracker.unstorable
