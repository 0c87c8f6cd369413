"""kvcontract.spec.properties.store: StoreCase, the producer simulation and the judges
of C8-C10 on the prefill-horizon numbers of docs/CONTRACT.md 8.4 (FA bs 36 + SWA bs 4,
sw 16: per 9, need 4; a 1200-token prompt in steps of 1000 and 200)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from kvcontract.impl.variants import REFERENCE, get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.properties import WitnessError, get_property
from kvcontract.spec.properties.store import (
    STORE_FUNCTIONS,
    STORE_SPACE,
    StoreCase,
    StoreRun,
    offered_at_most_once,
    run_store,
    simulate_store_case,
    spec_offers,
    store_cases,
    store_catalog,
    store_expected_offers,
    store_horizon,
    store_properties,
    store_variation_catalog,
    stores_only_demanded,
    stores_well_formed,
)

GEOMETRY = Geometry((fa(36), swa(4, 16)))
FINISHED = StoreCase("FA36+SWA4(sw16)", GEOMETRY, 1200, (1000, 200), "finished")
ABORTED = StoreCase("FA36+SWA4(sw16)", GEOMETRY, 1200, (1000,), "aborted")


def _kept(horizon: int, below: int | None = None) -> set[int]:
    """8.4: chunk c is kept iff c mod 9 >= min(9, H - seg_start) - 4 (chunks below H)."""
    end = horizon if below is None else below
    return {c for c in range(end) if c % 9 >= min(9, horizon - (c - c % 9)) - 4}


def test_hand_formula() -> None:
    assert len(_kept(300)) == 135
    assert sorted(_kept(300))[-7:] == [293, 294, 295, 296, 297, 298, 299]
    assert {246, 247, 248, 249} <= _kept(250)
    assert not {246, 247} & _kept(300)


def test_json_round_trip() -> None:
    data = FINISHED.to_json()
    assert data["steps"] == [1000, 200] and data["ending"] == "finished" and data["decode"] == 0
    assert StoreCase.from_json(data) == FINISHED
    assert STORE_SPACE.decode(data) == FINISHED
    del data["decode"]
    assert StoreCase.from_json(data).decode == 0


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"prompt_len": -1}, "prompt_len must hold integers >= 0, not -1"),
        ({"decode": True}, "decode must hold integers >= 0, not True"),
        ({"steps": [1000, -200]}, "steps must hold integers >= 0, not -200"),
        ({"steps": [1000, "200"]}, "steps must hold integers >= 0, not '200'"),
        ({"steps": [1000, 300]}, "the prefill steps [1000, 300] exceed the prompt of 1200"),
        ({"ending": "crashed"},
         "ending must be one of ('finished', 'aborted'), not 'crashed'"),
    ],
)
def test_decode_rejects_malformed_cases(change: dict[str, Any], problem: str) -> None:
    with pytest.raises(WitnessError, match="a store witness cannot be read") as info:
        STORE_SPACE.decode({**FINISHED.to_json(), **change})
    assert problem in str(info.value)


def test_decode_rejects_a_missing_ending() -> None:
    data = FINISHED.to_json()
    del data["ending"]
    with pytest.raises(WitnessError, match="KeyError: 'ending'"):
        STORE_SPACE.decode(data)


def test_expected_offers_over_the_whole_prompt() -> None:
    expected = store_expected_offers(FINISHED, 1)
    assert expected == _kept(300)
    assert len(expected) == 135
    # One shot, the same horizon: the same chunks.
    assert store_expected_offers(StoreCase("x", GEOMETRY, 1200, (1200,), "finished"), 1) \
        == expected


def test_expected_offers_after_an_abort() -> None:
    # Aborted after 1000 tokens: the true final tail {246, 247} (H = 250) plus what the
    # prompt horizon had already made stored below the frontier ({248, 249}).
    assert store_expected_offers(ABORTED, 1) == _kept(250) | _kept(300, below=250)


def test_expected_offers_count_decode_tokens_only_when_finished() -> None:
    # Decode tokens past the prompt are never stored (offload_prompt_only).
    decoded = StoreCase("x", GEOMETRY, 1200, (1000, 200), "finished", decode=40)
    assert store_expected_offers(decoded, 1) == _kept(300)


def test_reference_producer() -> None:
    run = simulate_store_case(FINISHED, REFERENCE)
    assert run.frontiers == [0, 1000]
    assert run.computed == 1200
    assert run.trackers[1].offered == _kept(300)
    assert run.trackers[1].offers[0][-2:] == [248, 249]  # no tail at the frontier 1000
    assert run.trackers[0].offered == set(range(1200 // 36))  # FA stores every chunk
    for prop in store_properties():
        assert prop.check(FINISHED, REFERENCE) is None, prop.name
    aborted = simulate_store_case(ABORTED, REFERENCE)
    assert aborted.computed == 1000
    assert aborted.trackers[1].offers[-1] == [246, 247]
    for prop in store_properties():
        assert prop.check(ABORTED, REFERENCE) is None, prop.name


def test_finished_run_counts_its_decode_steps() -> None:
    case = StoreCase("x", GEOMETRY, 1200, (1000, 200), "finished", decode=3)
    run = simulate_store_case(case, REFERENCE)
    assert run.computed == 1203 and run.frontiers == [0, 1000]


def test_prefill_horizon_variant_stores_two_chunks_too_many() -> None:
    impl = get_implementation("prefill-horizon")
    run = simulate_store_case(FINISHED, impl)
    assert len(run.trackers[1].offered) == 137
    assert run.trackers[1].offered - _kept(300) == {246, 247}
    message = "group 1 offered chunks [246, 247] that no reachable boundary demands"
    assert stores_only_demanded(FINISHED, run) == message
    assert store_horizon(FINISHED, run) == message
    assert offered_at_most_once(FINISHED, run) is None
    assert stores_well_formed(FINISHED, run) is None
    picture = get_property("C9/store-horizon").draw(FINISHED.to_json(), impl)
    assert picture.offending == {1: {246, 247}}
    assert picture.stored is not None and picture.stored[1] == _kept(300)


EAGLE_0 = Geometry((fa(16), swa(4, 8, eagle=True)), retention_interval=0)


def test_the_producer_passes_its_own_replay_boundaries() -> None:
    """FA 16 + SWA 4 (sw 8, EAGLE), retention 0, P = 35 in steps of 7: the spec's replay
    boundaries are vLLM's GPU rule, ``(16, 34)`` (``32 - 16`` for the EAGLE resend and the
    extension, and ``P - 1``); the judges expect SWA ``{2, 3, 4}`` for 16 and ``{6, 7}``
    for 34 -> 32. The producer runs with the implementation's own: upstream's ``(34,)``
    never offers ``{2, 3, 4}`` (C9: the spec's step 1 offers chunk 2), the reference's
    equal the spec's."""
    case = StoreCase("FA16+SWA4(sw8,eagle),retention0", EAGLE_0, 35, (7,) * 5, "finished",
                     decode=3)
    assert case.replay_boundaries == (16, 34)
    assert store_expected_offers(case, 1) == {2, 3, 4, 6, 7}
    reference = simulate_store_case(case, REFERENCE)
    assert reference.trackers[1].replay_boundaries == (16, 34)
    assert store_horizon(case, reference) is None
    upstream = simulate_store_case(case, get_implementation("upstream-current"))
    assert upstream.trackers[1].replay_boundaries == (34,)
    found_horizon = store_horizon(case, upstream)
    assert found_horizon == "group 1 never offered chunks [2, 3, 4] the real horizon demands"
    assert get_property("C9/store-horizon").impact_of(found_horizon).value == "lost-hit"
    assert stores_only_demanded(case, upstream) is None
    steps = get_property("C9/store-steps")
    found = steps.check(case, get_implementation("upstream-current"))
    assert found is not None and "the spec's step offers [2]" in found
    assert steps.impact_of(found).value == "lost-hit"


def _run(offers: list[list[int]], computed: int, case: StoreCase = FINISHED) -> StoreRun:
    """The reference's run of ``case`` with the SWA group's (group 1) offers replaced."""
    reference = simulate_store_case(case, REFERENCE)
    swa_tracker = SimpleNamespace(offers=offers, offered={c for o in offers for c in o},
                                  unstorable=set())
    return StoreRun([reference.trackers[0], swa_tracker],  # type: ignore[list-item]
                    reference.next_indices, reference.frontiers, computed)


def test_store_horizon_reports_a_missing_chunk() -> None:
    expected = sorted(_kept(300))
    run = _run([expected[:-1]], 1200)
    assert store_horizon(FINISHED, run) == (
        "group 1 never offered chunks [299] the real horizon demands")
    assert stores_only_demanded(FINISHED, run) is None  # C8 does not ask for completeness
    assert store_horizon(FINISHED, _run([expected], 1200)) is None


def test_spec_offers_step_by_step() -> None:
    # After the 1000-token step the correct producer ends with {..., 248, 249}; the
    # last 200 tokens bring the rest; finishing adds nothing (no tail at 300 is missing).
    first, second, finish = spec_offers(FINISHED, 1)
    assert first[-2:] == [248, 249] and 246 not in first and 247 not in first
    assert set(first) == _kept(300, below=250)
    assert set(second) == _kept(300) - _kept(300, below=250)
    assert finish == []
    # Aborted after the first step: the true final tail is owed, once.
    first, abort = spec_offers(ABORTED, 1)
    assert abort == [246, 247]


def test_offered_at_most_once() -> None:
    assert offered_at_most_once(FINISHED, _run([[2, 3], [4], [3, 5]], 1200)) == (
        "group 1 offered chunks [3] again at step 2")
    assert offered_at_most_once(FINISHED, _run([[2, 3], [4], [5]], 1200)) is None


def test_stores_well_formed() -> None:
    # 1000 committed tokens: chunk 249 ends at 1000, chunk 250 at 1004.
    assert stores_well_formed(ABORTED, _run([[249]], 1000, ABORTED)) is None
    assert stores_well_formed(ABORTED, _run([[249, 250]], 1000, ABORTED)) == (
        "group 1 offered chunk 250 ending at token 1004, past the 1000 committed tokens")
    # Decode tokens are never committed for storing: the prompt caps the horizon.
    assert stores_well_formed(FINISHED, _run([[300]], 1203)) is not None


def test_run_store_is_the_shared_memo() -> None:
    first = run_store(FINISHED, REFERENCE)
    assert run_store(FINISHED, REFERENCE) is first
    assert run_store(FINISHED, get_implementation("prefill-horizon")) is not first


def test_catalog_and_cases() -> None:
    names = [name for name, *_ in store_catalog()]
    assert names[0] == "FA36+SWA4(sw16)" and len(set(names)) == len(names)
    cases = list(store_cases())
    first = [c for c in cases if c.geometry_name == names[0] and c.prompt_len == 40]
    # Steps of 7: 5 x 7 + 5, finished after 3 decode steps, aborted after steps 1 .. 5.
    sevens = [c for c in first if c.steps[:1] == (7,)]
    assert sevens[0] == StoreCase(names[0], GEOMETRY, 40, (7,) * 5 + (5,), "finished", 3)
    assert [len(c.steps) for c in sevens[1:]] == [1, 2, 3, 4, 5]
    assert all(c.ending == "aborted" and c.decode == 0 for c in sevens[1:])
    assert StoreCase(names[0], GEOMETRY, 40, (40,), "finished", 3) in first
    for case in cases:
        assert sum(case.steps) <= case.prompt_len
        assert case.ending == "finished" or sum(case.steps) < case.prompt_len


def test_properties() -> None:
    # None may vanish or move; a new clause's property follows (nothing here to edit).
    assert [p.theorem_id for p in store_properties()][:6] == [
        "C8/offered-at-most-once", "C8/stores-only-demanded", "C9/store-horizon",
        "C9/store-steps",
        "C10/stores-well-formed", "C10/stores-placed"]
    # The placement judge also runs the implementation's store_block_slot (first: a
    # variant of it is located there).
    assert all(p.uses == (("store_block_slot", *STORE_FUNCTIONS)
                          if p.name == "stores-placed" else STORE_FUNCTIONS)
               and p.family == "store" for p in store_properties())


OFFLOAD = StoreCase("FA16+SWA4(sw8),offload41", Geometry((fa(16), swa(4, 8))), 64, (64,),
                    "finished", decode=3, max_offload_tokens=41)


def test_max_offload_tokens_round_trip() -> None:
    data = OFFLOAD.to_json()
    assert data["max_offload_tokens"] == 41 and StoreCase.from_json(data) == OFFLOAD
    assert "max_offload_tokens" not in FINISHED.to_json()
    for bad in (-1, True, "41"):
        with pytest.raises(WitnessError, match="max_offload_tokens must be None or an integer"):
            STORE_SPACE.decode({**data, "max_offload_tokens": bad})


def test_max_offload_tokens_caps_the_stores_and_ends_the_final_segment() -> None:
    """Nothing past token 41 is stored (FA chunks 0-1 of 16 tokens, SWA chunks below
    10), and the final segment ends at the cap: the SWA window before 40 (chunks 8, 9)
    is its tail, where the prompt's horizon would have stored 10, 11, 14, 15."""
    assert spec_offers(OFFLOAD, 0)[0] == [0, 1]
    assert spec_offers(OFFLOAD, 1)[0] == [2, 3, 6, 7, 8, 9]
    run = simulate_store_case(OFFLOAD, REFERENCE)
    assert [tracker.offers[0] for tracker in run.trackers] == [[0, 1], [2, 3, 6, 7, 8, 9]]
    for prop in store_properties():
        assert prop.check(OFFLOAD, REFERENCE) is None, prop.name
    # A producer that ignores the cap stores past it and misses the tail at the cap.
    uncapped = simulate_store_case(dataclasses.replace(OFFLOAD, max_offload_tokens=None),
                                   REFERENCE)
    assert store_horizon(OFFLOAD, uncapped) == (
        "group 1 never offered chunks [8, 9] the real horizon demands (and offered "
        "[10, 11, 14, 15], which none demands)")
    assert stores_well_formed(OFFLOAD, uncapped) == (
        "group 0 offered chunk 2 ending at token 48, past the 41 tokens max_offload_tokens "
        "allows")


def test_eagle_decode_withholds_exactly_the_last_chunk() -> None:
    """A full-attention EAGLE group with decoded tokens stored, 17 prompt tokens and 10
    decode steps: chunk 4 is offered at the step that completes chunk 5 (24 tokens), not
    when it completes itself (20) and not one chunk later (28: the request finishes at
    27 and chunk 5 goes with the finish)."""
    geometry = Geometry((fa(4, eagle=True), swa(4, 8)))
    case = StoreCase("x", geometry, 17, (17,), "finished", decode=10, prompt_only=False)
    want = [[0, 1, 2, 3]] + [[]] * 6 + [[4]] + [[]] * 3 + [[5]]
    assert spec_offers(case, 0) == want
    assert simulate_store_case(case, REFERENCE).trackers[0].offers == want
    # Withholding two chunks while decoding offers chunk 4 only at the finish.
    late = simulate_store_case(case, REFERENCE)
    late.trackers[0].offers[7:] = [[]] * 4 + [[4, 5]]
    message = get_property("C9/store-steps").judge(case, late)
    assert message is not None and message.startswith(
        "group 0 offered [] at step 7 (decoding, 23+1 tokens); the spec's step offers [4]")


def test_a_chunk_straddling_the_first_live_block_is_never_stored() -> None:
    """SWA bs 2, sw 3, e 1, chunks of two blocks, aborted after 14 tokens: the final tail
    marks chunk 2 (blocks 4 and 5), whose block 4 was freed while block 5 is live (blocks
    are live from 5): the chunk is refused (C10) by the spec and by the producer, which
    must look at its first marked block, not its last."""
    geometry = Geometry((fa(8), swa(2, 3, 1)), blocks_per_chunk=2)
    case = StoreCase("x", geometry, 21, (7, 7), "aborted")
    run = simulate_store_case(case, REFERENCE)
    assert spec_offers(case, 1) == [[], [], []] == run.trackers[1].offers
    assert run.trackers[1].unstorable == {2}
    run.trackers[1].offers[-1] = [2]
    assert stores_well_formed(case, run) == (
        "group 1 offered chunk 2 at step 2 with block 4 already freed (blocks are live "
        "from 5)")


def test_variation_catalog() -> None:
    """The variations use what the plain catalogue leaves at its default, and their
    schedules follow the catalogue's."""
    variations = store_variation_catalog()
    assert any(v.max_offload_tokens is not None for v in variations)
    assert any(not v.prompt_only and v.decode >= 8 for v in variations)
    cases = [c for c in store_cases() if c.geometry_name == variations[0].name]
    assert cases and all(c.max_offload_tokens == variations[0].max_offload_tokens
                         for c in cases)
