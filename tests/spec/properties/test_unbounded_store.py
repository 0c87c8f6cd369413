"""kvcontract.spec.properties.unbounded_store: C8-C10 for every store schedule by
induction over the steps, and planted bugs that only the unbounded theorems see (they
show past the longest schedule of the bounded store family)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvcontract.impl import reference
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.scheduler import StoreTracker
from kvcontract.impl.variants import REFERENCE, VARIANTS
from kvcontract.proofs.theorem import finish_family, prove_formula, run_family
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.properties import CaseProperty, WitnessError, get_property, properties
from kvcontract.spec.properties.store import store_cases
from kvcontract.spec.properties.unbounded import InductiveProperty
from kvcontract.spec.properties.unbounded_store import STATUSES, unbounded_store_properties
from kvcontract.vocabulary import ENDED_STATUSES, RequestStatus, Verdict

IDS = [p.theorem_id for p in unbounded_store_properties()]
ONCE, REFINES, FORMED = IDS


def _bounds_planted(kind: str, past: int) -> Implementation:
    """The reference with a store step that goes wrong only once the stored index is past
    ``past`` chunks (test-only: not in the variant registry)."""

    def bounds(status: Any, tokens: Any, prompt_len: Any, cap: Any, tpc: Any, eagle: Any,
               next_index: Any) -> tuple[Any, Any, Any, Any]:
        first, end, after, horizon = reference.store_step_bounds(
            status, tokens, prompt_len, cap, tpc, eagle, next_index)
        if next_index > past and status not in ENDED_STATUSES:
            if kind == "reoffer":
                first = next_index - 1  # the chunk before the index once more
            else:
                after = end  # no max: the index follows the end, down too
        return first, end, after, horizon

    return dataclasses.replace(REFERENCE, name=f"planted-{kind}", store_step_bounds=bounds)


LONGEST = max(case.prompt_len for case in store_cases())
"""The longest prompt of the bounded store family (tokens): every index stays below it."""
PLANTED_REOFFER = _bounds_planted("reoffer", 40)
PLANTED_INDEX_BACK = _bounds_planted("index-back", 64)


def _bounded_store_verdicts(impl: Implementation) -> list[Verdict]:
    family = [p for p in properties() if isinstance(p, CaseProperty) and p.family == "store"]
    return [r.verdict for r in finish_family(family, [run_family(family, impl)])]


def test_the_theorems_are_in_the_catalogue() -> None:
    assert IDS == ["C8/store-steps-offer-once", "C9/store-steps-refine-spec",
                   "C10/store-steps-well-formed"]
    for theorem_id in IDS:
        prop = get_property(theorem_id)
        assert isinstance(prop, InductiveProperty) and prop in properties()
        assert prop.symbolic_sizes == ("T",) and prop.symbolic_rlimit <= 2_000_000


@pytest.mark.parametrize("theorem_id", IDS)
def test_the_reference_is_proved_for_every_schedule(theorem_id: str) -> None:
    result = prove_formula(get_property(theorem_id), REFERENCE)
    assert result.verdict is Verdict.PROVED, (result.message, result.details)
    assert result.domain.startswith("all values (T, st, eagle")
    assert "every block size, window and mask" in result.domain
    assert result.rlimit_used < 1_000_000  # cheap: one query each
    if theorem_id != FORMED:
        assert "induction over store steps" in result.domain
    if theorem_id == ONCE:  # demand is the mask lemma, named
        assert "C8/stored-blocks-demanded" in result.domain


def test_the_bounded_family_cannot_reach_the_planted_bugs() -> None:
    # The smallest chunk of any group of the family has 4 tokens.
    assert LONGEST // 4 < 40


def test_a_chunk_offered_twice_past_the_bounded_schedules_is_refuted() -> None:
    result = prove_formula(get_property(ONCE), PLANTED_REOFFER)
    assert result.verdict is Verdict.COUNTEREXAMPLE, result.message
    assert result.witness is not None
    values = result.witness["values"]
    assert values["n"] > 40 and values["oc"] == 1 and values["c"] == values["n"] - 1
    assert "offered before) is offered" in result.message
    prop = get_property(ONCE)
    assert prop.replay(result.witness, PLANTED_REOFFER) is not None
    assert prop.replay(result.witness, REFERENCE) is None
    # The bounded store family never gets that far and proves it for its domain.
    assert _bounded_store_verdicts(PLANTED_REOFFER) == [Verdict.PROVED_FOR_DOMAIN] * 6


def test_the_planted_reoffer_is_real_on_a_long_schedule() -> None:
    """The running code offers a chunk twice once the index passes 40 (a 200-token
    prompt in steps of 16, a full-attention group of 4-token chunks, every chunk marked):
    the symbolic witness is what StoreTracker.step does."""
    geometry = Geometry((fa(4), swa(4, 8)))
    tracker = StoreTracker(PLANTED_REOFFER, geometry, 0, 200)
    computed, seen, again = 0, set(), set()
    for _ in range(12):
        offer = tracker.step(RequestStatus.PREFILLING, computed, 16, 200)
        again |= seen & set(offer)
        seen |= set(offer)
        computed += 16
    assert again == {43}
    reference_tracker = StoreTracker(REFERENCE, geometry, 0, 200)
    offers = [reference_tracker.step(RequestStatus.PREFILLING, 16 * k, 16, 200)
              for k in range(12)]
    assert sum(len(o) for o in offers) == len({c for o in offers for c in o})


def test_an_index_that_moves_back_past_64_chunks_is_refuted() -> None:
    result = prove_formula(get_property(ONCE), PLANTED_INDEX_BACK)
    assert result.verdict is Verdict.COUNTEREXAMPLE, result.message
    assert result.witness is not None and result.witness["values"]["n"] > 64
    assert get_property(ONCE).replay(result.witness, REFERENCE) is None
    assert _bounded_store_verdicts(PLANTED_INDEX_BACK) == [Verdict.PROVED_FOR_DOMAIN] * 6


def _offered(change: str) -> Implementation:
    """The reference with one rule of the per-chunk decision dropped."""

    def offered(status: Any, before: Any, has_marked: Any, first_marked: Any,
                first_live: Any) -> tuple[Any, Any]:
        if change == "ended-reoffers":
            before = False
        if change == "freed-block":
            first_live = first_marked
        if change == "unmarked":
            has_marked = True
        return reference.store_chunk_offered(status, before, has_marked, first_marked,
                                             first_live)

    return dataclasses.replace(REFERENCE, store_chunk_offered=offered)


@pytest.mark.parametrize(("change", "theorem_id"), [
    ("ended-reoffers", ONCE), ("freed-block", FORMED), ("unmarked", ONCE),
])
def test_each_rule_of_the_chunk_decision_is_needed(change: str, theorem_id: str) -> None:
    result = prove_formula(get_property(theorem_id), _offered(change))
    assert result.verdict is Verdict.COUNTEREXAMPLE, result.message
    assert result.witness is not None
    if change == "ended-reoffers":  # only finish and abort reconsider offered chunks
        assert STATUSES[result.witness["values"]["st"]] in ENDED_STATUSES
    # The spec's step keeps every rule: the refinement sees each change too.
    assert prove_formula(get_property(REFINES), _offered(change)).verdict is \
        Verdict.COUNTEREXAMPLE


def test_storing_the_final_sampled_slot_is_refuted_for_every_schedule() -> None:
    def tokens(status: Any, computed: Any, scheduled: Any, num_tokens: Any, prompt_len: Any,
               cap: Any, prompt_only: Any) -> Any:
        if status == RequestStatus.FINISHED and not prompt_only:
            return num_tokens  # the final sampled slot too
        return reference.get_num_offloadable_tokens(status, computed, scheduled, num_tokens,
                                                    prompt_len, cap, prompt_only)

    planted = dataclasses.replace(REFERENCE, get_num_offloadable_tokens=tokens)
    result = prove_formula(get_property(FORMED), planted)
    assert result.verdict is Verdict.COUNTEREXAMPLE, result.message
    assert result.witness is not None
    values = result.witness["values"]
    assert STATUSES[values["st"]] is RequestStatus.FINISHED and values["po"] == 0


def test_the_eagle_volatile_chunk_is_part_of_the_spec_step() -> None:
    def bounds(status: Any, tokens: Any, prompt_len: Any, cap: Any, tpc: Any, eagle: Any,
               next_index: Any) -> tuple[Any, Any, Any, Any]:
        return reference.store_step_bounds(status, tokens, prompt_len, cap, tpc, False,
                                           next_index)

    planted = dataclasses.replace(REFERENCE, store_step_bounds=bounds)
    result = prove_formula(get_property(REFINES), planted)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.witness is not None
    values = result.witness["values"]
    assert STATUSES[values["st"]] is RequestStatus.DECODING and values["eagle"] == 1


def test_the_variants_keep_their_store_verdicts() -> None:
    """prefill-horizon (an intermediate frontier closes the final segment) is refuted by
    the refinement, with a witness that replays; abort-unscheduled-crash (an aborted
    request stored up to its prompt) by well-formedness; no other variant changes the
    store step."""
    for name, impl in VARIANTS.items():
        verdicts = {tid: prove_formula(get_property(tid), impl) for tid in IDS}
        failed = {tid for tid, r in verdicts.items() if r.verdict is Verdict.COUNTEREXAMPLE}
        # abort-unscheduled-crash stores an aborted request up to its prompt: uncommitted;
        # full-horizon-unfinished-prefill the same of one finished mid-prefill (an error).
        expected = {"prefill-horizon": {REFINES}, "abort-unscheduled-crash": {FORMED},
                    "full-horizon-unfinished-prefill": {FORMED}}
        assert failed == expected.get(name, set()), name
        assert all(r.verdict.passed for tid, r in verdicts.items() if tid not in failed)
    result = prove_formula(get_property(REFINES), VARIANTS["prefill-horizon"])
    assert result.witness is not None
    assert "final segment end 0, the spec's 1" in result.message
    assert get_property(REFINES).replay(result.witness, VARIANTS["prefill-horizon"])
    assert get_property(REFINES).replay(result.witness, REFERENCE) is None
    picture = get_property(REFINES).draw(result.witness, VARIANTS["prefill-horizon"])
    assert picture.offending == {0: {0}} and "the spec's 1" in picture.notes[0]


def test_a_witness_outside_the_invariant_is_rejected() -> None:
    values = {"T": 4, "st": 0, "eagle": 0, "capped": 0, "n": 3, "c": 5, "oc": 1, "hm": 1,
              "fm": 20, "fl": 0, "tokens": 40, "P": 40, "M": 0}
    witness = {"kind": "arith", "theorem": ONCE, "values": values}
    # Chunk 5 offered before but at or past the index 3: no reachable state.
    with pytest.raises(WitnessError):
        get_property(ONCE).replay(witness, REFERENCE)
    assert get_property(ONCE).replay(
        {**witness, "values": {**values, "c": 2}}, REFERENCE) is None
