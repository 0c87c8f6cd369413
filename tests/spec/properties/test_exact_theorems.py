"""Issue 30: theorems that pin what the one-sided ones left open, each killing a mutant
that survived `kvcontract mutate` (docs/MUTANTS.md): the final partial segment's tail
block by block (C7 supplied, C8 exact), the replay boundaries the store path passes
(C7, vLLM 0.33.0's legacy EAGLE rule) and the EAGLE peek's size (C5)."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import textwrap
from typing import Any

import pytest

from kvcontract.impl import reference
from kvcontract.impl.variants import get_implementation, variant_names
from kvcontract.proofs.theorem import run_property
from kvcontract.proofs.verdicts import Verdict
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lookup import HIT
from kvcontract.spec.properties import get_property, properties
from kvcontract.spec.properties.lookup import LookupCase, LookupObservation, peeks_one_chunk
from kvcontract.spec.reachability import (
    owed_replay_boundary,
    replay_boundaries_owed,
    store_replay_boundaries,
)

REFERENCE = get_implementation("reference")
FINAL_TAIL = ("C7/final-tail-supplied", "C8/final-tail-exact")
REPLAY_TAIL = (*(f"C7/replay-tail-supplied[{kind}-{retention}]" for kind in ("plain", "eagle")
                 for retention in ("zero", "interval")),
               "C8/replay-tail-exact[plain-zero]", "C8/replay-tail-exact[eagle-zero]")
REPLAY = "C7/replay-boundaries-exact"
PEEK = "C5/eagle-peeks-one-chunk"


def _with(field: str, fn: Any, name: str) -> Any:
    return dataclasses.replace(REFERENCE, name=name, **{field: fn})


def _mask(adjust: Any) -> Any:
    def mask(block: Any, alignment_tokens: Any, block_tokens: Any, sliding_window: Any,
             extra_retained: Any, use_eagle: bool, retention_interval: Any,
             final_segment_end_block: Any, replay_boundary_blocks: tuple[Any, ...] = (),
             blocks_per_chunk: Any = 1) -> Any:
        marked = reference.is_block_reachable(
            block, alignment_tokens, block_tokens, sliding_window, extra_retained,
            use_eagle, retention_interval, final_segment_end_block, replay_boundary_blocks,
            blocks_per_chunk)
        per = None if alignment_tokens is None else alignment_tokens // block_tokens
        return adjust(marked, block, final_segment_end_block, per)

    return mask


def test_the_new_theorems_are_in_the_catalogue() -> None:
    ids = {p.theorem_id for p in properties()}
    assert {*FINAL_TAIL, *REPLAY_TAIL, REPLAY, PEEK} <= ids
    assert get_property(REPLAY).uses == ("store_replay_boundaries",)
    assert get_property(PEEK).family == "lookup"


@pytest.mark.parametrize("theorem_id", FINAL_TAIL)
def test_the_final_tail_is_proved_for_every_size(theorem_id: str) -> None:
    result = run_property(get_property(theorem_id), REFERENCE)
    assert result.verdict is Verdict.PROVED, result.message
    assert "all values" in result.domain


def test_a_final_tail_that_takes_the_horizon_block_is_waste() -> None:
    """The survivor reference:is_block_reachable#54 (`tail_start <= block <= F`): block
    F starts the chunk at the horizon, which no boundary up to it demands."""
    takes_f = _with("is_block_reachable", _mask(
        lambda marked, block, end, per: marked or (end is not None and block == end)),
        "takes-F")
    exact = run_property(get_property("C8/final-tail-exact"), takes_f)
    assert exact.verdict is Verdict.COUNTEREXAMPLE
    values = get_property("C8/final-tail-exact").decode(exact.witness or {})
    assert values["i"] == values["F"]
    assert get_property("C8/final-tail-exact").violation(values, takes_f) is not None
    assert get_property("C8/final-tail-exact").violation(values, REFERENCE) is None
    # Marking more supplies everything: only C8 sees it.
    assert run_property(get_property("C7/final-tail-supplied"), takes_f).verdict.passed


def test_a_final_tail_short_of_one_block_is_a_lost_block() -> None:
    """Dropping the first block of the final tail, even where another block of the same
    chunk keeps it stored (what C7's chunk-level theorem cannot see)."""
    def drop_first(marked: Any, block: Any, end: Any, per: Any) -> Any:
        if end is None or per is None:
            return marked
        return marked and not (end % per != 0 and block == end - end % per)

    short = _with("is_block_reachable", _mask(drop_first), "short-tail")
    supplied = run_property(get_property("C7/final-tail-supplied"), short)
    assert supplied.verdict is Verdict.COUNTEREXAMPLE
    assert run_property(get_property("C8/final-tail-exact"), short).verdict.passed


def test_mtp_extra_retained_loses_final_tail_blocks_and_wastes_none() -> None:
    """Seed 003's mask (e ignored) is short: C7's block theorem refutes it (its clause
    already), C8's does not (a shorter tail marks a subset)."""
    mtp = get_implementation("mtp-extra-retained")
    assert run_property(get_property("C7/final-tail-supplied"), mtp).verdict is (
        Verdict.COUNTEREXAMPLE)
    assert run_property(get_property("C8/final-tail-exact"), mtp).verdict.passed


@pytest.mark.parametrize("theorem_id", REPLAY_TAIL)
def test_the_replay_tail_is_proved_for_every_size(theorem_id: str) -> None:
    result = run_property(get_property(theorem_id), REFERENCE)
    assert result.verdict is Verdict.PROVED, result.message


def test_an_eagle_replay_window_without_its_peek_block_is_refuted() -> None:
    """A survivor of seed 101 (reference:is_block_reachable, `< boundary + shift` turned
    `< boundary`): the peek block of an EAGLE replay window is dropped; its chunk stays
    stored through the block before it, so only the block-level theorem sees it."""
    source = textwrap.dedent(inspect.getsource(reference.is_block_reachable))
    before = "if boundary + shift - need <= block < boundary + shift:"
    assert before in source
    namespace = dict(vars(reference))
    exec(source.replace(before, "if boundary + shift - need <= block < boundary:"), namespace)
    short = _with("is_block_reachable", namespace["is_block_reachable"], "no-peek-block")
    eagle = get_property("C7/replay-tail-supplied[eagle-zero]")
    result = run_property(eagle, short)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    values = eagle.decode(result.witness or {})
    per = values["A"] // values["B"]
    assert values["i"] == values["k"] * per  # the peek block is the replay block itself
    assert run_property(get_property("C7/replay-tail-supplied[plain-zero]"), short).verdict.passed


def test_upstream_s_mask_misses_the_peek_chunk_of_a_replay_boundary() -> None:
    """Upstream's block mask marks the block after the boundary, not the first block of
    the chunk the EAGLE lookup peeks at (its C7 defect, docs/CONTRACT.md 12): refuted block
    by block too; it marks nothing extra (C8 holds)."""
    upstream = get_implementation("upstream-current")
    result = run_property(get_property("C7/replay-tail-supplied[eagle-zero]"), upstream)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert run_property(get_property("C8/replay-tail-exact[eagle-zero]"), upstream).verdict.passed


def test_the_spec_states_the_owed_replay_boundaries_once() -> None:
    """The membership form the theorem proves against and the set form the store
    properties and C12 use are the same rule (every prompt, unit and mode up to 40)."""
    for prompt, unit, retention, eagle in itertools.product(
            range(0, 41), (None, 1, 3, 8, 16), (None, 0, 32), (False, True)):
        owed = replay_boundaries_owed(prompt, unit, retention, eagle)
        assert owed == tuple(sorted(set(owed)))
        members = {x for x in range(1, 50)
                   if owed_replay_boundary(x, prompt, unit, retention, eagle)}
        assert members == set(owed), (prompt, unit, retention, eagle)
    geometry = Geometry((fa(16, eagle=True), swa(4, 8)), retention_interval=0)
    # A = 16 divides 32: the resend's EAGLE boundary is 16 - 16 = 0 (no hit), the
    # extension's 32 - 16 = 16, and P - 1 = 31 stays.
    assert store_replay_boundaries(geometry, 32) == (16, 31)
    assert store_replay_boundaries(geometry, 37) == (16, 36)  # both EAGLE ones are 16


def test_the_replay_boundaries_are_pinned() -> None:
    result = run_property(get_property(REPLAY), REFERENCE)
    assert result.verdict is Verdict.PROVED_FOR_DOMAIN, result.message
    assert len(get_property(REPLAY).configs()) == 12


def _replay(transform: str) -> Any:
    source = textwrap.dedent(inspect.getsource(reference.store_replay_boundaries))
    before, after = transform.split(" => ")
    assert before in source
    namespace = dict(vars(reference))
    exec(source.replace(before, after), namespace)
    return namespace["store_replay_boundaries"]


@pytest.mark.parametrize("change, expected", [
    # The survivors of the issue: the extension's P aligned up; boundary 1 left out.
    ("extension = prompt_len // unit * unit => extension = -(-prompt_len // unit) * unit",
     {"eagle": 1}),
    ("if boundary > 0 => if boundary > 1", {"P": 2, "x": 1}),
])
def test_a_changed_replay_rule_is_refuted(change: str, expected: dict[str, int]) -> None:
    changed = _with("store_replay_boundaries", _replay(change), "changed-replay")
    result = run_property(get_property(REPLAY), changed)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    values = get_property(REPLAY).decode(result.witness or {})
    assert expected.items() <= values.items()
    assert get_property(REPLAY).violation(values, changed) is not None


def test_upstream_s_p_minus_one_misses_the_eagle_boundaries() -> None:
    result = run_property(get_property(REPLAY), get_implementation("upstream-current"))
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert get_property(REPLAY).decode(result.witness or {})["eagle"] == 1


@pytest.mark.parametrize("name", [n for n in variant_names()
                                  if n not in ("upstream-current", "mtp-extra-retained")])
def test_the_other_variants_keep_their_refuted_clauses(name: str) -> None:
    """Only upstream-current (C7 already) and mtp-extra-retained (C7 already) fail a new
    formula theorem; the new C5 judge refutes no variant (a variant's refuted set is
    pinned by tests/impl/test_variants.py)."""
    impl = get_implementation(name)
    for theorem_id in (*FINAL_TAIL, *REPLAY_TAIL, REPLAY):
        assert run_property(get_property(theorem_id), impl).verdict.passed, theorem_id


EAGLE = Geometry((swa(4, 8, eagle=True),))


def test_the_peek_is_one_chunk_past_the_first_candidate() -> None:
    # 29 tokens, 7 keys: the first candidate is 28 (the last token is recomputed), whose
    # last chunk is 6; an EAGLE group may look up one chunk more (7), never chunk 8.
    case = LookupCase("x", EAGLE, 29, 0, ((HIT,) * 7,))
    assert peeks_one_chunk(case, LookupObservation(24, lookups=[(0, 6), (0, 5)])) is None
    assert peeks_one_chunk(case, LookupObservation(24, lookups=[(0, 7)])) is None
    message = peeks_one_chunk(case, LookupObservation(24, lookups=[(0, 6), (0, 8)]))
    assert message is not None and "chunk 8" in message and "peek chunk 7" in message


def test_a_group_without_eagle_never_peeks() -> None:
    case = LookupCase("x", Geometry((fa(4), swa(4, 8))), 17, 0, ((HIT,) * 4, (HIT,) * 4))
    # A budget of 8 tokens: the first candidate ends in chunk 1, and the FA group (no
    # EAGLE) may look up no chunk past it.
    budget = dataclasses.replace(case, max_hit_tokens=8)
    assert peeks_one_chunk(budget, LookupObservation(8, lookups=[(0, 0), (0, 1)])) is None
    message = peeks_one_chunk(budget, LookupObservation(8, lookups=[(0, 0), (0, 2)]))
    assert message is not None and "first candidate" in message


def test_a_turn_that_peeks_two_chunks_is_refuted() -> None:
    source = textwrap.dedent(inspect.getsource(reference.multigroup_lookup_step))
    namespace = dict(vars(reference))
    exec(source.replace("peek = 1 if eagle else 0", "peek = 2 if eagle else 0"), namespace)
    two = _with("multigroup_lookup_step", namespace["multigroup_lookup_step"], "peek-two")
    assert run_property(get_property(PEEK), two).verdict is Verdict.COUNTEREXAMPLE
    assert run_property(get_property(PEEK), REFERENCE).verdict is Verdict.PROVED_FOR_DOMAIN


def test_a_store_path_with_state_is_decided_on_plain_ints_only() -> None:
    """A replay rule that keeps state between calls (the audit's executed probe of
    upstream's builder memoizes, and its stand-ins take plain ints) is not lifted: the
    prover says why (the audit then searches concretely), and on ints the statement
    compares the whole set, so a defect shows at any prompt, whatever ``x``."""
    memo: dict[tuple[Any, ...], tuple[int, ...]] = {}

    def remembered(prompt_len: Any, alignment_tokens: Any, retention_interval: Any,
                   use_eagle: bool) -> tuple[int, ...]:
        key = (prompt_len, alignment_tokens, retention_interval, use_eagle)
        if key not in memo:
            memo[key] = reference.store_replay_boundaries(*key)[:1]  # the first alone
        return memo[key]

    stateful = _with("store_replay_boundaries", remembered, "stateful")
    result = run_property(get_property(REPLAY), stateful)
    assert result.verdict is Verdict.UNKNOWN and "could not be lifted" in result.message
    prop = get_property(REPLAY)
    eagle = {"eagle": 1, "Ak": 1, "Rk": 0, "R": 0, "A": 16}
    assert prop.violation({**eagle, "P": 33, "x": 999}, stateful) is not None  # 32 missing
    assert prop.violation({**eagle, "P": 33, "x": 999}, REFERENCE) is None
