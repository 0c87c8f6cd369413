"""Regression cases of issue 13: mutants of the reference that a property used to
prove, although a concrete case of its printed domain breaks the clause. Each property
now judges what the implementation itself returns, against the spec."""

from __future__ import annotations

import dataclasses

import pytest

from kvcontract.impl import reference, scheduler
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import REFERENCE
from kvcontract.proofs.theorem import run_property
from kvcontract.spec.geometry import Geometry, fa, mamba, swa
from kvcontract.spec.lookup import LookupResult
from kvcontract.spec.properties import get_property
from kvcontract.spec.properties.lookup import (
    LookupCase,
    LookupObservation,
    eagle_peek,
    loads_only_hit,
    run_lookup,
)
from kvcontract.spec.properties.store import StoreCase, run_store, store_horizon, stores_well_formed
from kvcontract.vocabulary import Verdict

M, H = LookupResult.MISS, LookupResult.HIT


def test_mamba_load_range_min_for_max_is_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """``max`` -> ``min`` in the Mamba load range: the scheduler then loads Mamba chunks
    [0, 3), two of them MISS; the spec's load set alone was judged before."""
    case = LookupCase("SWA4(sw8)+Mamba8", Geometry((swa(4, 8), mamba(8))), 25, 0,
                      ((M, M, M, M, H, H), (M, M, H)))
    assert loads_only_hit(case, run_lookup(case, REFERENCE)) is None

    def mutant(hit: int, local_hit: int, chunk_tokens: int) -> tuple[int, int]:
        return min(local_hit // chunk_tokens, hit // chunk_tokens - 1), hit // chunk_tokens

    monkeypatch.setattr(scheduler, "mamba_load_range", mutant)
    observation = scheduler.lookup_complete_chunks(
        REFERENCE, case.geometry, case.num_tokens, case.local_hit,
        lambda g, k: case.states[g][k])
    judged = LookupObservation(observation.hit_tokens, dict(observation.load_ranges))
    violation = loads_only_hit(case, judged)
    assert violation is not None and "not found in cache" in violation, violation


def _store_case(steps: tuple[int, ...], ending: str) -> StoreCase:
    return StoreCase("FA36+SWA4(sw16)", Geometry((fa(36), swa(4, 16))), 40, steps, ending)


def test_first_live_block_ceil_for_floor_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Floor -> ceil division in the tracker's first live block: a live, demanded chunk
    is called unstorable and never offered. C9 used to subtract the tracker's own
    ``unstorable`` set from its expectation, so the mutant passed."""
    case = _store_case((7, 7, 7), "aborted")
    assert store_horizon(case, run_store(case, REFERENCE)) is None

    def mutant(self: scheduler.StoreTracker, num_computed: int) -> int:
        group = self.group
        if group.sliding_window is None:
            return 0
        skipped = self.impl.get_num_skipped_tokens(num_computed, group.sliding_window,
                                                   group.extra_retained_tokens)
        return -(-int(skipped) // self.geometry.block_tokens(group))

    monkeypatch.setattr(scheduler.StoreTracker, "_first_live_block", mutant)
    result = run_property(get_property("C9/store-horizon"), REFERENCE)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert "never offered" in result.message


def test_full_attention_stores_are_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    """First live block 0 -> 1 for every group: FA chunk 0 is never offered, so every
    later lookup misses. The store properties compared SWA groups only."""
    def mutant(self: scheduler.StoreTracker, num_computed: int) -> int:
        return 1

    monkeypatch.setattr(scheduler.StoreTracker, "_first_live_block", mutant)
    case = _store_case((40,), "finished")
    violation = store_horizon(case, run_store.compute(case, REFERENCE))
    assert violation is not None and violation.startswith("group 0 never offered chunks [0]")
    assert stores_well_formed(case, run_store.compute(case, REFERENCE)) is None


def test_two_pops_per_peek_are_caught() -> None:
    case = LookupCase("SWA4(sw8,eagle)", Geometry((swa(4, 8, eagle=True),)), 25, 0,
                      ((H,) * 6,))
    honest = run_lookup(case, REFERENCE)
    assert honest.popped_at and eagle_peek(case, honest) is None
    twice = LookupObservation(honest.hit_tokens, honest.load_ranges, honest.lookups,
                              {0: 2 * len(honest.popped_at)}, honest.popped_at * 2,
                              honest.max_hit_trace)
    violation = eagle_peek(case, twice)
    assert violation is not None and "popped twice" in violation
    miscounted = LookupObservation(honest.hit_tokens, honest.load_ranges, honest.lookups,
                                   {0: 2 * len(honest.popped_at)}, honest.popped_at,
                                   honest.max_hit_trace)
    assert "popped" in (eagle_peek(case, miscounted) or "")


def test_storing_the_final_sampled_slot_is_caught() -> None:
    """A finished request must never store its final sampled slot (its KV was never
    written). Only ``offload_prompt_only=True`` was in the catalogue, which caps the
    stored tokens at the prompt and hides the mutant."""
    original = reference.get_num_offloadable_tokens

    def mutant(status: object, computed: int, scheduled: int, num_tokens: int,
               prompt_len: int, max_offload: int | None, prompt_only: bool) -> int:
        tokens = original(status, computed, scheduled, num_tokens, prompt_len, max_offload,
                          prompt_only)
        if str(getattr(status, "value", status)) == "finished" and not prompt_only:
            return num_tokens  # the final sampled slot too
        return tokens

    # The store path calls the bundle's function (StoreTracker.step).
    planted = dataclasses.replace(REFERENCE, get_num_offloadable_tokens=mutant)
    result = run_property(get_property("C10/stores-well-formed"), planted)
    assert result.verdict is Verdict.COUNTEREXAMPLE, result.message
    assert result.witness is not None and result.witness.get("prompt_only") is False


def _step_bounds_with(change: str) -> Implementation:
    """The reference with its store step bounds changed (``StoreTracker.step`` takes its
    candidate range and stored index from the bundle's ``store_step_bounds``)."""

    def bounds(status: object, tokens: int, prompt_len: int, cap: int | None, tpc: int,
               eagle: bool, next_index: int) -> tuple[int, int, int, int]:
        if change == "no-volatile-chunk":  # end_chunk -= 1 became -= 0
            eagle = False
        first, end, after, horizon = reference.store_step_bounds(
            status, tokens, prompt_len, cap, tpc, eagle, next_index)
        if change == "min-index":  # max(next, end) became min(next, end)
            after = min(next_index, end)
        return first, end, after, horizon

    return dataclasses.replace(REFERENCE, store_step_bounds=bounds)


def test_offering_the_volatile_eagle_chunk_is_caught() -> None:
    """An EAGLE group's last chunk is volatile while decoding; offering it early passed
    every union-of-offers property (the spec offers it at finish anyway)."""
    planted = _step_bounds_with("no-volatile-chunk")
    result = run_property(get_property("C9/store-steps"), planted)
    assert result.verdict is Verdict.COUNTEREXAMPLE and result.impact == "corruption"
    assert run_property(get_property("C9/store-horizon"), planted).verdict.passed


def test_a_stored_index_that_never_advances_is_caught() -> None:
    result = run_property(get_property("C9/store-steps"), _step_bounds_with("min-index"))
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert "next_stored_chunk_idx" in result.message


def test_store_all_geometries_are_in_the_catalogue() -> None:
    """A mask that applies where vLLM stores everything (A not a multiple of the SWA
    block) wastes nothing but loses hits: the store catalogue holds such a geometry."""
    from kvcontract.impl.reference import is_block_reachable
    from kvcontract.spec.properties.store import store_catalog

    names = [name for name, *_ in store_catalog()]
    assert "FA4+SWA8(sw9),store-all" in names and "FA4+FA8+SWA4(sw8),no-alignment" in names
    # The geometry tells the two rules apart: the reference stores every block there
    # (A = 4 is not a multiple of the SWA block 8; vLLM builds it: 8 = 2 x 4).
    assert all(is_block_reachable(b, 4, 8, 9, 0, False, None, None) for b in range(8))


def test_a_retained_range_below_block_zero_is_caught() -> None:
    """``get_num_skipped_tokens`` returning -1 for a short request made the retained range
    start at block -1; the membership test alone looks at blocks >= 0 and passed it
    (a survivor of ``kvcontract mutate``)."""
    import dataclasses

    from kvcontract.proofs.theorem import prove_formula

    def skipped(num_tokens: int, sliding_window: int, extra: int) -> int:
        return max(-1, num_tokens - sliding_window + 1 - extra) if num_tokens else -1

    def retained(n: int, block_size: int, sliding_window: int, extra: int) -> tuple[int, int]:
        return skipped(n, sliding_window, extra) // block_size, -(-n // block_size)

    mutant = dataclasses.replace(REFERENCE, get_num_skipped_tokens=skipped,
                                 retained_block_range=retained)
    result = prove_formula(get_property("C1/retained-blocks-exact"), mutant)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert prove_formula(get_property("C1/retained-blocks-exact"), REFERENCE).verdict.passed
