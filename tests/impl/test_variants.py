"""kvcontract.impl.variants: the registry, and each historic variant is the reference
with exactly the functions its defect lived in replaced (docs/CONTRACT.md 8, 12), each
replacement behaving differently on the defect's numbers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvcontract.errors import UnknownTargetError
from kvcontract.impl import variants
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import (
    REFERENCE,
    VARIANTS,
    get_implementation,
    variant_names,
)
from kvcontract.spec.clauses import clause_ids
from kvcontract.spec.lookup import HIT, HIT_PENDING, MISS

WINDOW = "get_sliding_window_size_in_chunks"
LOAD_WINDOW = "load_window_size_in_chunks"
MASK = "is_block_reachable"
REPLAY = "store_replay_boundaries"

# The functions each variant's docstring entry (impl/variants.py) describes as defective.
CHANGED: dict[str, set[str]] = {
    "reference": set(),
    "stale-pending": {"sliding_window_lookup"},
    "unaligned-hit": {LOAD_WINDOW},
    "mtp-extra-retained": {WINDOW, LOAD_WINDOW, MASK},
    "prefill-horizon": {"store_final_segment_end"},
    "upstream-current": {WINDOW, LOAD_WINDOW, MASK, REPLAY, "deferral_expired"},
    "abort-unscheduled-crash": {"get_num_offloadable_tokens"},
    "resetting-deadline": {"deferral_clock"},
    "no-deadline": {"deferral_expired"},
    "legacy-drop-lookahead-store": {"lookup_drops_eagle_block"},
    "legacy-mask-lookahead-lookup": {"store_drops_eagle_block"},
    "minus-one-after-clamps": {"initial_lookup_cap"},
    "full-horizon-unfinished-prefill": {"get_num_offloadable_tokens"},
    "publish-failed-store": {"store_job_published"},
    "first-block-null-offset": {"store_block_slot"},
    "no-shared-prefix-junction": {"shared_prefix_junction"},
}
# Clauses the docstring says each variant violates.
DOCUMENTED: dict[str, set[str]] = {
    "stale-pending": {"C3"},
    "unaligned-hit": {"C2"},
    "mtp-extra-retained": {"C2"},
    "prefill-horizon": {"C8", "C9"},
    "upstream-current": {"C3", "C4", "C7", "C9", "C12", "C13"},
    "abort-unscheduled-crash": {"C14"},
    "resetting-deadline": {"C13"},
    "no-deadline": {"C13"},
    "legacy-drop-lookahead-store": {"C5", "C12"},
    "legacy-mask-lookahead-lookup": {"C8"},
    "minus-one-after-clamps": {"C4"},
    "full-horizon-unfinished-prefill": {"C14"},
    "publish-failed-store": {"C14"},
    "first-block-null-offset": {"C10"},
    "no-shared-prefix-junction": {"C12"},
}


def _scan(impl: Implementation) -> Any:
    states = [HIT, HIT, MISS, HIT_PENDING]  # 8.1, W = 2
    return impl.sliding_window_lookup(lambda k: states[k], 0, 4, 2, 2)


# One call per replaced function on which the defect shows (reference answer first).
DISCRIMINATING: dict[tuple[str, str], tuple[Callable[[Implementation], Any], Any, Any]] = {
    ("stale-pending", "sliding_window_lookup"): (_scan, 2, None),
    # 8.2: N 3904, tpc 256, sw 128: lw = 2, the defect checks W = 1.
    ("unaligned-hit", LOAD_WINDOW): (
        lambda i: i.load_window_size_in_chunks(3904, 128, 0, 256), 2, 1),
    # 8.3: tpc 16, sw 32, e 3: W = 3 against 2; block 1 of a 64-token segment (need 3).
    ("mtp-extra-retained", WINDOW): (
        lambda i: i.get_sliding_window_size_in_chunks(32, 3, 16), 3, 2),
    ("mtp-extra-retained", LOAD_WINDOW): (
        lambda i: i.load_window_size_in_chunks(64, 32, 3, 16), 3, 2),
    ("mtp-extra-retained", MASK): (
        lambda i: bool(i.is_block_reachable(1, 64, 16, 32, 3, False, None, None)), True, False),
    # 8.4: the prompt horizon closes the final segment while prefilling.
    ("prefill-horizon", "store_final_segment_end"): (
        lambda i: i.store_final_segment_end("prefilling", 300, 250, None), 300, 250),
    # 12: sw 5, tpc 4: W = 1 against upstream's cdiv(5, 4) = 2; the EAGLE peek block 34.
    ("upstream-current", WINDOW): (lambda i: i.get_sliding_window_size_in_chunks(5, 0, 4), 1, 2),
    ("upstream-current", LOAD_WINDOW): (lambda i: i.load_window_size_in_chunks(8, 5, 0, 4), 1, 2),
    ("upstream-current", MASK): (
        lambda i: bool(i.is_block_reachable(34, 1056, 32, 2, 0, True, None, None, (), 2)),
        True, False),
    # 12: P 33, A 16, retention 0, an EAGLE group: the GPU's EAGLE replay boundary 16 too.
    ("upstream-current", REPLAY): (
        lambda i: i.store_replay_boundaries(33, 16, 0, True), (16, 32), (32,)),
    # #49118: a request aborted before its first schedule (0 computed, prompt 17) stores
    # nothing; the defect stores its prompt.
    ("abort-unscheduled-crash", "get_num_offloadable_tokens"): (
        lambda i: i.get_num_offloadable_tokens("aborted", 0, 0, 17, 17, None, True), 0, 17),
    # #53087: deferred since step 2 and again at step 6: the clock keeps 2, the defect 6.
    ("resetting-deadline", "deferral_clock"): (lambda i: i.deferral_clock(2, 6), 2, 6),
    # #49829: deferred since step 2, bound 4, at step 6: the reference decides.
    ("no-deadline", "deferral_expired"): (lambda i: bool(i.deferral_expired(2, 6, 4)),
                                          True, False),
    # vLLM 0.33.0 has no deadline either (it measures the deferral, enforces nothing).
    ("upstream-current", "deferral_expired"): (
        lambda i: bool(i.deferral_expired(2, 6, 4)), True, False),
    # An EAGLE group under lookahead block hashes (1 token) drops nothing.
    ("legacy-drop-lookahead-store", "lookup_drops_eagle_block"): (
        lambda i: i.lookup_drops_eagle_block(True, 1), False, True),
    ("legacy-mask-lookahead-lookup", "store_drops_eagle_block"): (
        lambda i: i.store_drops_eagle_block(True, 1), False, True),
    # vLLM 0.33.0 subtracts the recomputed last token after the budget: SWA, 17 tokens,
    # a budget of 12: the candidate 12 (0.34.0), 11 (0.33.0).
    ("minus-one-after-clamps", "initial_lookup_cap"): (
        lambda i: i.initial_lookup_cap(17, True, 12), 12, 11),
    # A request finished with an error after 8 of its 17 prompt tokens: it stores the 8
    # (0.34.0); 0.33.0 stores up to its prompt.
    ("full-horizon-unfinished-prefill", "get_num_offloadable_tokens"): (
        lambda i: i.get_num_offloadable_tokens("finished", 8, 0, 17, 17, None, True), 8, 17),
    # vLLM 0.33.0's scheduler completes a failed store job as stored; 0.34.0 drops it.
    ("publish-failed-store", "store_job_published"): (
        lambda i: bool(i.store_job_published(True)), False, True),
    # bpc 2, the job's first chunk live, the second's first page null: its second page
    # (job position 3) keeps slot 3 (0.34.0); 0.33.0 writes it into slot 2.
    ("first-block-null-offset", "store_block_slot"): (
        lambda i: i.store_block_slot(3, 0, 1, 2), 3, 2),
    # A hit cut to 0 below the full-attention boundary 32, retention 0: the reference
    # registers the junction 32 (0.34.0); 0.33.0 none.
    ("no-shared-prefix-junction", "shared_prefix_junction"): (
        lambda i: i.shared_prefix_junction(32, 0, 0, 0), 32, 0),
}


def test_registry() -> None:
    assert variant_names() == list(CHANGED)
    assert list(VARIANTS) == variant_names()
    for name, impl in VARIANTS.items():
        assert impl.name == name
        assert get_implementation(name) is impl
        assert impl.description
    assert get_implementation("reference") is REFERENCE


@pytest.mark.parametrize("name", list(CHANGED))
def test_each_variant_differs_in_exactly_its_defective_functions(name: str) -> None:
    impl = VARIANTS[name]
    functions = [f for f in REFERENCE.__dataclass_fields__
                 if callable(getattr(REFERENCE, f))]
    assert len(functions) == 24
    changed = {f for f in functions if getattr(impl, f) is not getattr(REFERENCE, f)}
    assert changed == CHANGED[name]


@pytest.mark.parametrize(("key", "check"), list(DISCRIMINATING.items()),
                         ids=[f"{v}:{f}" for v, f in DISCRIMINATING])
def test_each_replacement_shows_its_defect(
    key: tuple[str, str], check: tuple[Callable[[Implementation], Any], Any, Any]
) -> None:
    name, _ = key
    call, reference_answer, variant_answer = check
    assert call(REFERENCE) == reference_answer
    assert call(VARIANTS[name]) == variant_answer


def test_every_replacement_is_exercised_above() -> None:
    assert {(v, f) for v, fs in CHANGED.items() for f in fs} == set(DISCRIMINATING)


def test_violated_clauses() -> None:
    assert REFERENCE.violates == ()
    for name, impl in VARIANTS.items():
        if name == "reference":
            continue
        assert impl.violates, name
        assert set(impl.violates) <= set(clause_ids()), name
        assert DOCUMENTED[name] <= set(impl.violates), name
        assert list(impl.violates) == sorted(impl.violates, key=lambda c: int(c[1:]))


def test_docstring_names_every_variant() -> None:
    doc = variants.__doc__ or ""
    for name in VARIANTS:
        if name != "reference":
            assert f"``{name}``" in doc, name


def test_unknown_implementation() -> None:
    with pytest.raises(UnknownTargetError) as info:
        get_implementation("stale_pending")
    assert info.value.target == "stale_pending"
    assert info.value.known == sorted(VARIANTS)
    assert "choose one of: abort-unscheduled-crash, " in str(info.value)
    assert ", ".join(sorted(VARIANTS)) in str(info.value)
