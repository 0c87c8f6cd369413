"""kvcontract.spec.properties.end_to_end: C12 (no lost hits), the promise on
hand-computed cases, the reference on the whole catalogue, broken implementations.

Notation of the docstrings: FA ``bs 16`` (``A = 16``) + SWA ``bs 4, sw 8`` (``tpc 4``,
``W = cdiv(sw - 1, tpc) = 2``), bpc 1, unless a test says otherwise. A producer of
``P`` tokens finished with ``offload_prompt_only`` stores up to ``P // tpc`` chunks per
group; a consumer of ``N`` tokens has ``maxhit = N - 1``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvcontract.impl import reference as ref
from kvcontract.impl.variants import REFERENCE, get_implementation
from kvcontract.proofs.theorem import run_property
from kvcontract.spec import multigroup
from kvcontract.spec.build import buildable
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lookup import HIT, MISS
from kvcontract.spec.models import list_presets, preset_geometries
from kvcontract.spec.properties import WitnessError, get_property, replay
from kvcontract.spec.properties.end_to_end import (
    END_TO_END_SPACE,
    SIBLING_DIVERGENCE,
    Consumer,
    EndToEndCase,
    consumer_keys,
    consumers,
    contract_supply,
    end_to_end_cases,
    end_to_end_catalog,
    no_lost_hit,
    promised_hit,
    reachable_boundaries,
    run_end_to_end,
)
from kvcontract.spec.properties.store import StoreCase, offered_chunks, run_store
from kvcontract.spec.reachability import gpu_replay_boundaries, store_replay_boundaries
from kvcontract.vocabulary import Verdict

RETENTION_0 = Geometry((fa(16), swa(4, 8)), retention_interval=0)
RETENTION_NONE = Geometry((fa(16), swa(4, 8)))
RETENTION_32 = Geometry((fa(16), swa(4, 8)), retention_interval=32)
EAGLE_0 = Geometry((fa(16), swa(4, 8, eagle=True)), retention_interval=0)
PROPERTY = get_property("C12/no-lost-hits")


def finished(geometry: Geometry, prompt: int) -> StoreCase:
    return StoreCase("test", geometry, prompt, (prompt,), "finished", decode=3)


def test_retention0_resend_gets_the_replay_boundary() -> None:
    """Retention 0, P = 33: the replay boundary is ``(P - 1) // A * A = 32``; its demand
    is SWA chunks ``[cdiv(32, 4) - W, 8) = {6, 7}``; FA stores chunks ``{0, 1}``
    (``33 // 16``). The resend (``N = 33``, ``maxhit 32``) reads FA ``[0, 2)`` and SWA
    ``Load(32) = [skipped(32) // 4, 8) = [25 // 4, 8) = {6, 7}``: promised 32.

    P = 48: the replay boundary is ``47 // 16 * 16 = 32`` again. At ``maxhit 47`` SWA
    reads ``[skipped(47) // 4, 12) = [40 // 4, 12) = {10, 11}``, never stored; so do 44,
    40 and 36 (``{9, 10}``, ``{8, 9}``, ``{7, 8}``); 32 reads ``{6, 7}``: promised 32,
    one segment short of the prompt (vLLM's GPU keeps ``P - 1`` aligned down as well)."""
    producer = finished(RETENTION_0, 33)
    assert reachable_boundaries(RETENTION_0, RETENTION_0.groups[1], producer) == [
        ("replay", 32)]
    assert contract_supply(producer) == (frozenset({0, 1}), frozenset({6, 7}))
    assert promised_hit(RETENTION_0, producer, 33) == 32
    producer = finished(RETENTION_0, 48)
    assert contract_supply(producer) == (frozenset({0, 1, 2}), frozenset({6, 7}))
    assert promised_hit(RETENTION_0, producer, 48) == 32


def test_retention_none_resend_gets_the_last_token_but_one() -> None:
    """Retention None, P = 48: segment boundaries 16, 32, 48 (and the final horizon
    48) demand SWA chunks ``{2, 3}``, ``{6, 7}``, ``{10, 11}``. The resend's
    ``maxhit 47`` reads FA ``[0, cdiv(47, 16)) = [0, 3)`` and SWA
    ``[skipped(47) // 4, cdiv(47, 4)) = [10, 12)``, all owed: promised 47 (the last
    token is recomputed for its logits)."""
    producer = finished(RETENTION_NONE, 48)
    assert [b for _, b in reachable_boundaries(
        RETENTION_NONE, RETENTION_NONE.groups[1], producer)] == [16, 32, 48, 48]
    assert contract_supply(producer)[1] == frozenset({2, 3, 6, 7, 10, 11})
    assert promised_hit(RETENTION_NONE, producer, 48) == 47


def test_sibling_is_limited_to_its_shared_keys() -> None:
    """Retention None, P = 48, a sibling of 36 tokens sharing 33: its keys are FA
    ``33 // 16 = 2`` and SWA ``33 // 4 = 8``. ``maxhit 35`` needs FA chunk 2 (no shared
    key); 32 reads FA ``{0, 1}`` and SWA ``{6, 7}``: promised 32. A resend is promised 47
    (above)."""
    producer = finished(RETENTION_NONE, 48)
    assert consumer_keys(RETENTION_NONE, 36, 33) == {0: 2, 1: 8}
    assert promised_hit(RETENTION_NONE, producer, 36, 33) == 32


def test_eagle_resend_is_promised_the_gpu_replay_boundary() -> None:
    """EAGLE SWA group, retention 0, P = 33: the boundary ``(P - 1) // A * A = 32``
    demands ``[8 - W, 8 + 1) = {6, 7, 8}`` with the peek chunk 8 = tokens [32, 36), past
    the 33 prompt tokens: never complete, so an EAGLE resend cannot be served there.

    vLLM's GPU keeps, for EAGLE, the resend's and the extension's aligned boundaries minus
    one unit: ``32 - 16 = 16`` for both, and so does the contract now
    (``store_replay_boundaries``: ``(16, 32)``). Demand at 16: ``{2, 3}`` plus the peek
    chunk 4 (tokens [16, 20)): promised 16, and the reference stores it. With ``P - 1``
    alone (``replay_rule="p-1"``, upstream's store path) nothing servable is owed: 0.

    P = 48: boundary 32's peek chunk 8 ends at 36 <= 48: promised 32 under both rules."""
    producer = finished(EAGLE_0, 33)
    assert producer.replay_boundaries == (16, 32)
    assert reachable_boundaries(EAGLE_0, EAGLE_0.groups[1], producer) == [("replay", 16)]
    # 32's window chunks {6, 7} are owed too (the mask writes them as they complete), but
    # its peek chunk 8 never completes, so they serve nothing: the promise is 16.
    assert contract_supply(producer) == (frozenset({0, 1}), frozenset({2, 3, 4, 6, 7}))
    assert promised_hit(EAGLE_0, producer, 33) == 16
    # P - 1 alone: boundary 32's window chunks {6, 7} are written as they complete (the
    # mask marks them), but its peek chunk 8 never completes, so they serve nothing.
    assert contract_supply(producer, "p-1") == (frozenset({0, 1}), frozenset({6, 7}))
    assert promised_hit(EAGLE_0, producer, 33, replay_rule="p-1") == 0
    producer = finished(EAGLE_0, 48)
    assert contract_supply(producer)[1] == frozenset({2, 3, 4, 6, 7, 8})
    assert contract_supply(producer, "p-1")[1] == frozenset({6, 7, 8})
    assert promised_hit(EAGLE_0, producer, 48) == 32
    assert promised_hit(EAGLE_0, producer, 48, replay_rule="p-1") == 32
    case = EndToEndCase(finished(EAGLE_0, 33), Consumer("resend", 33, 33))
    observed = run_end_to_end(case, REFERENCE)
    assert observed.hit_tokens == 16 and no_lost_hit(case, observed) is None
    with pytest.raises(ValueError, match="replay_rule"):
        promised_hit(EAGLE_0, producer, 48, replay_rule="store")


def test_gpu_replay_boundaries() -> None:
    """``P = 33, u = 16``: resend ``32 // 16 * 16 = 32``, extension ``33 // 16 * 16 = 32``,
    both minus 16: (16,). ``P = 48``: resend ``47 -> 32``, extension 48: (16, 32).
    ``P = 10``: both align to 0, not below: (0,). Without EAGLE: ``(P - 1,)``.

    The contract's replay boundaries are ``P - 1`` and these (a boundary of 0 is no hit),
    only with a retention interval."""
    assert gpu_replay_boundaries(33, 16, True) == (16,)
    assert gpu_replay_boundaries(48, 16, True) == (16, 32)
    assert gpu_replay_boundaries(10, 16, True) == (0,)
    assert gpu_replay_boundaries(48, 16, False) == (47,)
    assert store_replay_boundaries(EAGLE_0, 33) == (16, 32)
    assert store_replay_boundaries(EAGLE_0, 48) == (16, 32, 47)
    assert store_replay_boundaries(EAGLE_0, 10) == (9,)
    assert store_replay_boundaries(RETENTION_0, 33) == (32,)
    assert store_replay_boundaries(dataclasses.replace(EAGLE_0, retention_interval=None),
                                   33) == ()


def test_aborted_producer_owes_no_freed_final_tail() -> None:
    """Dense retention (segments of ``A = 16``, ``per 4`` blocks, need 2), P = 65 aborted
    after nine 7-token steps: 63 computed, SWA horizon ``63 // 4 = 15`` chunks, final
    horizon 60. Reachable: the segments 16, 32, 48 and the final horizon 60, whose tail
    is ``{13, 14}``. The final horizon is known only at the abort, when blocks below
    ``skipped(63) // 4 = 56 // 4 = 14`` are freed: chunk 13 cannot be written (C10) and is
    not owed; chunk 14 is (the segment tails own it anyway). Promised for the resend: 48
    (FA holds ``63 // 16 = 3`` chunks)."""
    producer = StoreCase("test", RETENTION_NONE, 65, (7,) * 9, "aborted")
    assert reachable_boundaries(RETENTION_NONE, RETENTION_NONE.groups[1], producer) == [
        ("segment", 16), ("segment", 32), ("segment", 48), ("final", 60)]
    assert contract_supply(producer) == (frozenset({0, 1, 2}),
                                         frozenset({2, 3, 6, 7, 10, 11, 14}))
    assert promised_hit(RETENTION_NONE, producer, 65) == 48
    assert 13 not in offered_chunks(run_store(producer, REFERENCE).trackers[1])


def test_no_final_tail_under_a_retention_interval() -> None:
    """Retention 32 (``per 8`` blocks), the same aborted producer: vLLM's GPU cache keeps
    no final partial-segment tail under an interval (``keeps_final_tail``), so the only
    reachable boundary below the horizon is segment 32 (``{6, 7}``); the replay boundary
    ``64 // 16 * 16 = 64`` lies past it and still owes its demanded chunk 14 below the
    horizon. Promised for the resend: 32, where the old final tail promised 48."""
    producer = StoreCase("test", RETENTION_32, 65, (7,) * 9, "aborted")
    assert reachable_boundaries(RETENTION_32, RETENTION_32.groups[1], producer) == [
        ("segment", 32)]
    assert contract_supply(producer) == (frozenset({0, 1, 2}), frozenset({6, 7, 14}))
    assert promised_hit(RETENTION_32, producer, 65) == 32
    assert offered_chunks(run_store(producer, REFERENCE).trackers[1]) == {6, 7, 14}
    # A finished prompt of 48 tokens: the GPU keeps the replay tail at (P - 1) aligned
    # down, 32, and nothing at 48; neither does the contract.
    finished = StoreCase("test", RETENTION_32, 48, (48,), "finished")
    assert 11 not in contract_supply(finished)[1]
    assert promised_hit(RETENTION_32, finished, 52, 52) == 32


def test_promise_equals_the_contract_answer_over_the_supply() -> None:
    """The promise's search (chunk ends and ``maxhit`` only, prefix counts) equals
    :func:`multigroup.contract_answer` over the owed chunks, on every case."""
    for case in end_to_end_cases():
        geometry, consumer = case.geometry, case.consumer
        supply = contract_supply(case.producer)
        keys = consumer_keys(geometry, consumer.num_tokens, consumer.shared_tokens)
        states = {g: [HIT if k < keys[g] and k in supply[g] else MISS
                      for k in range(multigroup.complete_chunks(geometry, group,
                                                                consumer.num_tokens))]
                  for g, group in enumerate(geometry.groups)}
        answer = multigroup.contract_answer(geometry, consumer.num_tokens, 0, states)
        assert promised_hit(geometry, case.producer, consumer.num_tokens,
                            consumer.shared_tokens) == (answer.best_present or 0), case


def test_the_reference_offers_what_it_owes() -> None:
    """The demand side (C7) end to end: every owed chunk is offered by the reference."""
    seen: set[StoreCase] = set()
    for case in end_to_end_cases():
        if case.producer in seen:
            continue
        seen.add(case.producer)
        run = run_store(case.producer, REFERENCE)
        for g, owed in enumerate(contract_supply(case.producer)):
            assert owed <= offered_chunks(run.trackers[g]), (case.producer, g)


def test_catalogue_is_buildable_and_varied() -> None:
    catalog = end_to_end_catalog()
    for name, geometry, _ in catalog:
        assert buildable(geometry)[0], name
    geometries = [g for _, g, _ in catalog]
    assert {g.retention_interval for g in geometries} == {0, None, 32}
    assert {g.blocks_per_chunk for g in geometries} == {1, 2}
    assert any(group.eagle and group.is_swa for g in geometries for group in g.groups)
    assert any(group.eagle and not group.is_swa for g in geometries for group in g.groups)
    assert any(group.kind.value == "mamba" for g in geometries for group in g.groups)
    # An EAGLE resend whose peek chunk past (P - 1) // A * A is incomplete (the gap that
    # vLLM's GPU EAGLE replay boundaries close), for an EAGLE SWA and an EAGLE FA group.
    eagle_gaps = {next(group.is_swa for group in g.groups if group.eagle)
                  for _, g, prompts in catalog
                  if g.retention_interval == 0 and any(group.eagle for group in g.groups)
                  and g.alignment_tokens and any(p % g.alignment_tokens for p in prompts)}
    assert eagle_gaps == {True, False}
    kinds = {c.kind for c in consumers(finished(RETENTION_0, 33))}
    assert kinds == {"resend", "continuation", "sibling", "junction"}


def test_reference_has_no_lost_hit() -> None:
    result = run_property(PROPERTY, REFERENCE)
    assert result.verdict is Verdict.PROVED_FOR_DOMAIN, result.message
    assert result.queries == len(list(end_to_end_cases()))
    assert 1000 <= result.queries <= 10_000


def _without_replay_marks(*args: Any) -> Any:
    """The reference mask with the replay boundaries dropped (a test-only defect)."""
    return ref.is_block_reachable(*args[:8], (), *args[9:])


def test_dropped_replay_marks_lose_hits() -> None:
    """The first case of the catalogue: retention 0, P = 31 prefilled in one shot. The
    replay boundary ``30 // 16 * 16 = 16`` demands SWA ``{2, 3}``; the resend
    (``maxhit 30``, FA keys ``31 // 16 = 1``) is promised 16. Without the replay marks
    the SWA group stores nothing: hit 0, 16 tokens lost."""
    broken = dataclasses.replace(REFERENCE, name="no-replay-marks",
                                 is_block_reachable=_without_replay_marks)
    result = run_property(PROPERTY, broken)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.impact == "lost-hit"
    assert result.message.endswith("accepted hit 0, promised 16: 16 tokens lost")
    assert "producer P=31" in result.message and "resend consumer of 31" in result.message
    assert result.witness is not None
    assert replay("C12/no-lost-hits", result.witness, REFERENCE) is None


def test_upstream_loses_the_eagle_resend() -> None:
    """Upstream's store path passes ``P - 1`` alone. The first case it fails: EAGLE SWA
    group, retention 0, P = 33 in one shot, the resend. Its SWA group stores the tail of
    boundary 32 (``{6, 7}``; the peek chunk 8 is incomplete) but not the GPU's EAGLE
    replay boundary 16 (``{2, 3, 4}``): hit 0 instead of the promised 16."""
    upstream = get_implementation("upstream-current")
    result = run_property(PROPERTY, upstream)
    assert result.verdict is Verdict.COUNTEREXAMPLE and result.impact == "lost-hit"
    assert "SWA(bs=4, sw=8, eagle); bpc=1; retention=0" in result.message
    assert "producer P=33 (prefill [33]" in result.message
    assert "resend consumer of 33" in result.message
    assert result.message.endswith("accepted hit 0, promised 16: 16 tokens lost")
    assert result.witness is not None
    assert replay("no-lost-hits", result.witness, REFERENCE) is None
    picture = PROPERTY.draw(result.witness, upstream)
    assert picture.hit == 16 and picture.offending == {1: {2, 3, 4}}
    # The EAGLE full-attention group of the catalogue loses the same way.
    eagle_fa = Geometry((fa(16, eagle=True), swa(4, 8)), retention_interval=0)
    case = EndToEndCase(finished(eagle_fa, 33), Consumer("resend", 33, 33))
    lost = replay("no-lost-hits", case.to_json(), upstream)
    assert lost is not None and lost.endswith("accepted hit 0, promised 16: 16 tokens lost")
    assert replay("no-lost-hits", case.to_json(), REFERENCE) is None


def test_upstream_window_formula_loses_hits() -> None:
    """Upstream's ``W = max(cdiv(sw, tpc), cdiv(sw - 1, tpc))`` with ``sw 9, tpc 4``: 3
    chunks against the 2 the replay tail holds. Retention 0, P = 33: the replay boundary
    32 demands ``[8 - cdiv(8, 4), 8) = {6, 7}``; upstream also demands chunk 5, never
    stored: hit 0 instead of 32."""
    upstream = get_implementation("upstream-current")
    geometry = Geometry((fa(16), swa(4, 9)), retention_interval=0)
    witness = EndToEndCase(finished(geometry, 33), Consumer("resend", 33, 33)).to_json()
    lost = replay("no-lost-hits", witness, upstream)
    assert lost is not None and "SWA(bs=4, sw=9)" in lost
    assert lost.endswith("accepted hit 0, promised 32: 32 tokens lost")
    assert PROPERTY.impact_of(lost).value == "lost-hit"
    assert replay("no-lost-hits", witness, REFERENCE) is None
    picture = PROPERTY.draw(witness, upstream)
    assert picture.hit == 32 and picture.offending == {1: {5}}


EAGLE_PRESETS = [(label, geometry) for preset in list_presets()
                 for label, geometry in preset_geometries(preset)
                 if any(group.eagle for group in geometry.groups)]
PRESET_PROMPTS = (4097, 5003, 6143, 8192, 9999)


@pytest.mark.parametrize(("label", "geometry"), EAGLE_PRESETS,
                         ids=[label for label, _ in EAGLE_PRESETS])
def test_reference_has_no_lost_hit_on_eagle_presets(label: str, geometry: Geometry) -> None:
    """Every preset with an EAGLE (or MTP) group, at vLLM's default retention 0: a
    one-shot producer, then its resend, its continuation and a sibling sharing
    ``P - 1`` tokens get exactly the promise (vLLM's GPU rule, EAGLE replay boundaries
    included) from the reference."""
    assert geometry.retention_interval == 0
    for prompt in PRESET_PROMPTS:
        producer = StoreCase(label, geometry, prompt, (prompt,), "finished", decode=3)
        sibling = Consumer("sibling", prompt + SIBLING_DIVERGENCE, prompt - 1)
        for consumer in [*consumers(producer)[:2], sibling]:
            case = EndToEndCase(producer, consumer)
            assert no_lost_hit(case, run_end_to_end(case, REFERENCE)) is None, case


def test_eagle_presets_are_covered_and_upstream_loses_there() -> None:
    """The EAGLE presets are all there; at bpc 1 upstream's ``P - 1`` alone loses the
    EAGLE resend of some of the prompt lengths above (GPT-OSS-EAGLE3: ``A = 16``, every
    ``P`` not a multiple of 16; the DeepSeek-V4-like MTP preset: ``A = 256``)."""
    names = {label.split(" ", 1)[0] for label, _ in EAGLE_PRESETS}
    assert {"gpt-oss-120b-eagle3", "gpt-oss-20b-eagle3", "deepseek-v4-like-mtp"} <= names
    upstream = get_implementation("upstream-current")
    for label, geometry in EAGLE_PRESETS:
        if geometry.blocks_per_chunk != 1:
            continue
        lost = []
        for prompt in PRESET_PROMPTS:
            producer = StoreCase(label, geometry, prompt, (prompt,), "finished", decode=3)
            resend = EndToEndCase(producer, Consumer("resend", prompt, prompt))
            found = no_lost_hit(resend, run_end_to_end(resend, upstream))
            if found is not None and "tokens lost" in found:
                lost.append(prompt)
        assert lost, label


def test_crash_and_waste_are_reported_too() -> None:
    """MTP ``e`` ignored (``mtp-extra-retained``): FA 16 + SWA 4 (sw 8, e 3), retention
    0, P = 37: the lookup accepts 32 (the promise) but the allocation loads
    ``[skipped(32) // 4, 8) = [(32 - 8 + 1 - 3) // 4, 8) = {5, 6, 7}`` and chunk 5 was
    never stored: a crash. Intermediate tails (``prefill-horizon``) let a sibling get more
    than promised, every chunk HIT: waste."""
    crash = run_property(PROPERTY, get_implementation("mtp-extra-retained"))
    assert crash.verdict is Verdict.COUNTEREXAMPLE and crash.impact == "crash"
    assert "reads group 1 chunk 5, which is MISS" in crash.message
    waste = run_property(PROPERTY, get_implementation("prefill-horizon"))
    assert waste.verdict is Verdict.COUNTEREXAMPLE and waste.impact == "waste"
    assert "exceeds the promised" in waste.message


def test_judge_on_a_hand_observation() -> None:
    case = EndToEndCase(finished(RETENTION_0, 33), Consumer("resend", 33, 33))
    observation = run_end_to_end(case, REFERENCE)
    assert observation.hit_tokens == 32 and no_lost_hit(case, observation) is None
    lost = no_lost_hit(case, dataclasses.replace(observation, hit_tokens=0))
    assert lost is not None and lost.endswith("accepted hit 0, promised 32: 32 tokens lost")
    assert PROPERTY.impact_of(lost).value == "lost-hit"
    # 16 reads SWA Load(16) = [skipped(16) // 4, 4) = {2, 3}, never stored: a crash first.
    crash = no_lost_hit(case, dataclasses.replace(observation, hit_tokens=16))
    assert crash is not None and "reads group 1 chunk 2, which is MISS" in crash
    assert PROPERTY.impact_of(crash).value == "crash"
    deferred = no_lost_hit(case, dataclasses.replace(observation, hit_tokens=None))
    assert deferred is not None and "deferred" in deferred


def test_witness_round_trip() -> None:
    case = EndToEndCase(finished(RETENTION_0, 33), Consumer("sibling", 20, 17))
    data = case.to_json()
    assert data["consumer"] == {"kind": "sibling", "num_tokens": 20, "shared_tokens": 17}
    assert END_TO_END_SPACE.decode(data) == case


@pytest.mark.parametrize(("change", "problem"), [
    ({"kind": "stranger"}, "consumer kind"),
    ({"shared_tokens": 30, "num_tokens": 20}, "exceeds the consumer"),
    ({"num_tokens": 0}, "integers >= 1"),
    ({"shared_tokens": 40, "num_tokens": 50}, "the producer has 37"),
])
def test_malformed_witness(change: dict[str, Any], problem: str) -> None:
    data = EndToEndCase(finished(RETENTION_0, 33), Consumer("sibling", 20, 17)).to_json()
    data["consumer"].update(change)
    with pytest.raises(WitnessError, match=problem):
        replay("C12/no-lost-hits", data, REFERENCE)
