"""kvcontract.spec.properties.unbounded: the scanner theorems by induction over the keys,
and planted bugs that only the unbounded theorems see (issue 12)."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import types
from typing import Any

import pytest

from kvcontract.impl import reference
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import REFERENCE, get_implementation
from kvcontract.proofs.theorem import finish_family, prove_formula, run_family, run_property
from kvcontract.spec.lookup import (
    HIT,
    HIT_PENDING,
    MISS,
    RETRY,
    is_prefix_answer,
    is_sliding_window_answer,
    prefix_answer,
    prefix_fold,
    sliding_window_answer,
    sliding_window_fold,
)
from kvcontract.spec.properties import CaseProperty, FormulaProperty, get_property, properties
from kvcontract.spec.properties.unbounded import (
    PREFIX_DRIVER,
    SLIDING_WINDOW_DRIVER,
    InductiveProperty,
    NotAFold,
    fold_step,
    is_fold_driver,
    unbounded_properties,
)
from kvcontract.vocabulary import Verdict

IDS = [p.theorem_id for p in unbounded_properties() if isinstance(p, InductiveProperty)]


def _with_step(name: str, step_name: str, step: Any, driver: Any) -> Any:
    """The reference's fold driver over another step, as a copied module would have it."""
    return types.FunctionType(driver.__code__, {**vars(reference), step_name: step}, name)


def _planted_w5_step(
    consecutive: Any, required: Any, defer: Any, pending_in_run: Any, result: Any, window: Any
) -> tuple[Any, Any, Any, Any, Any]:
    consecutive, required, defer, pending_in_run, complete = reference.sliding_window_step(
        consecutive, required, defer, pending_in_run, result, window)
    if window == 5 and consecutive == 4:
        complete = True  # the plant: a window of five keys completes at four
    return consecutive, required, defer, pending_in_run, complete


PLANTED_W5 = dataclasses.replace(
    REFERENCE, name="planted-w5",
    sliding_window_lookup=_with_step("sliding_window_lookup", "sliding_window_step",
                                     _planted_w5_step, reference.sliding_window_lookup))
"""A scanner that is wrong only at W = 5 (test-only: not in the variant registry)."""


def _planted_prefix_step(count: Any, defer: Any, result: Any) -> tuple[Any, Any, Any]:
    count, defer, stop = reference.prefix_step(count, defer, result)
    if count == 7 and result == HIT_PENDING:
        defer = False  # the plant: the seventh key's pending state is forgotten
    return count, defer, stop


PLANTED_PREFIX = dataclasses.replace(
    REFERENCE, name="planted-prefix",
    prefix_lookup=_with_step("prefix_lookup", "prefix_step", _planted_prefix_step,
                             reference.prefix_lookup))


def test_the_theorems_are_in_the_catalogue_as_formula_properties() -> None:
    assert len(IDS) == 4
    for theorem_id in IDS:
        prop = get_property(theorem_id)
        assert isinstance(prop, InductiveProperty) and isinstance(prop, FormulaProperty)
        assert prop in properties()


@pytest.mark.parametrize("theorem_id", IDS)
def test_the_reference_is_proved_for_all_values(theorem_id: str) -> None:
    result = run_property(get_property(theorem_id), REFERENCE)
    assert result.verdict is Verdict.PROVED, (result.message, result.details)
    assert result.domain.startswith("all values (")
    assert "by induction over the keys" in result.domain
    if "W" in result.domain:  # the one assumption of the window induction is named
        assert "I in {W, W+1}" in result.domain


def test_a_bug_only_at_w5_is_refuted_by_the_refinement_and_missed_by_the_bounded_scan() -> None:
    result = run_property(get_property("C3/scan-refines-spec"), PLANTED_W5)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.witness is not None and result.witness["values"]["W"] == 5
    # The witness replays by id on ints: the scanner answers wrong on a realized sequence.
    prop = get_property("C3/scan-refines-spec")
    assert prop.replay(result.witness, PLANTED_W5) is not None
    assert prop.replay(result.witness, REFERENCE) is None
    # The old bounded checks (every sequence up to length 6, W <= 3) miss it.
    scans = [p for p in properties() if isinstance(p, CaseProperty) and p.family == "scan"]
    bounded = finish_family(scans, [run_family(scans, PLANTED_W5)])
    assert [r.verdict for r in bounded] == [Verdict.PROVED_FOR_DOMAIN] * len(scans)


def test_the_w5_bug_shows_in_what_the_scanner_answers() -> None:
    keys = [MISS, HIT, HIT, HIT, HIT]
    assert PLANTED_W5.sliding_window_lookup(keys.__getitem__, 0, 5, 5, 5) == 5
    assert sliding_window_answer(keys, 5, 5).concrete() == 0
    assert REFERENCE.sliding_window_lookup(keys.__getitem__, 0, 5, 5, 5) == 0


def test_a_prefix_bug_past_the_bounded_lengths_is_refuted() -> None:
    result = run_property(get_property("C4/prefix-refines-spec"), PLANTED_PREFIX)
    assert result.verdict is Verdict.COUNTEREXAMPLE, result.message
    assert result.witness is not None
    assert get_property("C4/prefix-refines-spec").replay(result.witness, REFERENCE) is None


def test_a_scanner_without_a_step_is_checked_on_the_grid() -> None:
    # stale-pending replaces the whole scanner with one loop: no step to lift.
    stale = get_implementation("stale-pending")
    with pytest.raises(NotAFold):
        fold_step(stale.sliding_window_lookup, SLIDING_WINDOW_DRIVER, "sliding_window_step")
    result = run_property(get_property("C3/scan-refines-spec"), stale)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert "is not the reference's fold driver" in result.domain
    # A correct scanner written as one loop is PROVED-FOR-DOMAIN on the grid, never PROVED.
    monolithic = dataclasses.replace(
        REFERENCE, sliding_window_lookup=_monolithic_scanner)
    result = run_property(get_property("C3/scan-refines-spec"), monolithic)
    assert result.verdict is Verdict.PROVED_FOR_DOMAIN
    assert "the induction over the keys does not apply" in result.domain


def _monolithic_scanner(
    lookup: Any, start: int, end: int, initial_window: int, window: int
) -> int | None:
    answer = sliding_window_answer([lookup(k) for k in range(start, end)], initial_window,
                                   window)
    found = answer.concrete()
    return None if found is None else start + found


def test_the_step_is_found_in_a_copied_module() -> None:
    step = fold_step(PLANTED_W5.sliding_window_lookup, SLIDING_WINDOW_DRIVER,
                     "sliding_window_step")
    assert step is _planted_w5_step
    assert fold_step(REFERENCE.prefix_lookup, PREFIX_DRIVER, "prefix_step") is (
        reference.prefix_step)


def test_the_trusted_loops_are_the_reference_drivers() -> None:
    """If the reference's loop changes, the induction stops applying (this fails first)."""
    assert is_fold_driver(reference.sliding_window_lookup, SLIDING_WINDOW_DRIVER)
    assert is_fold_driver(reference.prefix_lookup, PREFIX_DRIVER)
    assert not is_fold_driver(reference.prefix_lookup, SLIDING_WINDOW_DRIVER)
    assert not is_fold_driver(len, SLIDING_WINDOW_DRIVER)


def _driver_mutant() -> Any:
    """The reference's module with its driver changed (as ``kvcontract mutate`` would):
    answering one key short of the window's end."""
    source = inspect.getsource(reference.sliding_window_lookup)
    changed = source.replace("found: int = idx + consecutive", "found: int = idx + consecutive - 1")
    assert changed != source
    namespace = dict(vars(reference))
    exec(compile(changed, "<mutant>", "exec"), namespace)
    return namespace["sliding_window_lookup"]


def test_a_changed_driver_is_not_trusted() -> None:
    mutant = dataclasses.replace(REFERENCE, sliding_window_lookup=_driver_mutant())
    assert not is_fold_driver(mutant.sliding_window_lookup, SLIDING_WINDOW_DRIVER)
    result = run_property(get_property("C3/scan-refines-spec"), mutant)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.witness is not None
    assert "the scanner answers" in result.message


def test_the_spec_induction_fails_without_its_assumption() -> None:
    """With I = W + 2 the right-end run can hold a W-window the fold skips: the
    induction's stated assumption is needed, so the query is not vacuously proved."""
    prop = get_property("C4/spec-scan-fold-is-declarative")
    assert isinstance(prop, InductiveProperty)

    def widened(env: Any, impl: Implementation) -> Any:
        hyps, goal = prop.statement(env, impl)
        # Drop I <= W + 1 (the third hypothesis) and allow I = W + 2 instead.
        return [hyps[0], hyps[1], env["I"] <= env["W"] + 2, *hyps[3:]], goal

    result = prove_formula(dataclasses.replace(prop, statement=widened,
                                               configs=lambda: []), REFERENCE)
    assert result.verdict is not Verdict.PROVED


SEQUENCES = [list(s) for n in range(6) for s in itertools.product(range(4), repeat=n)]


def test_the_folds_equal_the_declarative_answers_on_every_short_sequence() -> None:
    """The second, bounded line of evidence for the spec's step forms."""
    for keys in SEQUENCES:
        declarative, fold = prefix_answer(keys), prefix_fold(keys)
        assert (declarative.deferred, declarative.end) == (fold.deferred, fold.end)
        assert is_prefix_answer(keys.__getitem__, len(keys), fold)
        for window in (1, 2, 3):
            for initial in (window, window + 1):
                declarative = sliding_window_answer(keys, initial, window)
                fold = sliding_window_fold(keys, initial, window)
                assert (declarative.deferred, declarative.end, declarative.window_start) == (
                    fold.deferred, fold.end, fold.window_start), (keys, window, initial)
                assert is_sliding_window_answer(keys.__getitem__, len(keys), initial, window,
                                                fold)


def test_the_characterization_rejects_a_wrong_answer() -> None:
    keys = [HIT, HIT, MISS, HIT, HIT]
    right = sliding_window_answer(keys, 2, 2)
    assert is_sliding_window_answer(keys.__getitem__, 5, 2, 2, right)
    wrong = dataclasses.replace(right, end=2, window_start=0)  # a complete, not rightmost
    assert not is_sliding_window_answer(keys.__getitem__, 5, 2, 2, wrong)
    retry = [HIT, RETRY]
    assert not is_prefix_answer(retry.__getitem__, 2, dataclasses.replace(
        prefix_answer(retry), deferred=False))


@pytest.mark.parametrize("theorem_id", ["C3/scan-refines-spec", "C4/prefix-refines-spec"])
def test_refinement_witnesses_replay_on_ints(theorem_id: str) -> None:
    prop = get_property(theorem_id)
    assert isinstance(prop, InductiveProperty)
    grid = prop.grid()
    admissible = [v for v in grid if prop.admissible(v)]
    assert admissible and len(admissible) < len(grid)  # the reachability hypotheses bite
    for values in admissible:
        assert prop.violation(values, REFERENCE) is None


# -- block sizes outside the grid (item 4) ------------------------------------------------------
def _planted_retained_range(
    num_computed_tokens: Any, block_size: Any, sliding_window: Any, extra_retained: Any
) -> tuple[Any, Any]:
    first, end = reference.retained_block_range(num_computed_tokens, block_size,
                                                sliding_window, extra_retained)
    if block_size == 12:
        first = first + 1  # the plant: blocks of 12 tokens free one live block too many
    return first, end


PLANTED_BS12 = dataclasses.replace(REFERENCE, name="planted-bs12",
                                   retained_block_range=_planted_retained_range)


def test_a_bug_at_an_unlisted_block_size_is_refuted_by_the_symbolic_sizes() -> None:
    prop = get_property("C1/retained-blocks-exact")
    assert isinstance(prop, FormulaProperty)
    result = prove_formula(prop, PLANTED_BS12)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.witness is not None and result.witness["values"]["bs"] == 12
    assert result.domain == "all values"
    # The block-size grid alone (today's bounded domain) does not contain 12.
    grid_only = prove_formula(dataclasses.replace(prop, symbolic_sizes=()), PLANTED_BS12)
    assert grid_only.verdict is Verdict.PROVED_FOR_DOMAIN


def _planted_mask(
    block: Any, alignment_tokens: Any, block_tokens: Any, sliding_window: Any,
    extra_retained: Any, use_eagle: bool, retention_interval: Any,
    final_segment_end_block: Any, replay_boundary_blocks: tuple[Any, ...] = (),
    blocks_per_chunk: int = 1,
) -> Any:
    if blocks_per_chunk == 16 and (block // 16) % 2 == 1:
        return False  # the plant: with 16 blocks a chunk, odd chunks are never stored
    return reference.is_block_reachable(
        block, alignment_tokens, block_tokens, sliding_window, extra_retained, use_eagle,
        retention_interval, final_segment_end_block, replay_boundary_blocks, blocks_per_chunk)


PLANTED_BPC16 = dataclasses.replace(REFERENCE, name="planted-bpc16",
                                    is_block_reachable=_planted_mask)


def test_a_mask_bug_at_a_preset_size_outside_the_grid_is_refuted() -> None:
    """The mask theorems' case split (the fallback of their symbolic-size query) holds
    the presets' sizes (bpc 16), so a bug that only shows at 16 blocks a chunk is found
    there; the symbolic query finds it too (docs/CONTRACT.md 5.2)."""
    prop = get_property("C7/final-boundary-supplied[none]")
    assert isinstance(prop, FormulaProperty)
    presets = [c for c in prop.configs() if c.label.startswith("preset")]
    grid = [c for c in prop.configs() if not c.label.startswith("preset")]
    assert presets and {c.values["bpc"] for c in presets} == {16}
    assert "every model preset" in prop.domain
    split_only = dataclasses.replace(prop, symbolic_sizes=(), probe_configs=0)
    found = prove_formula(dataclasses.replace(split_only, configs=lambda: presets),
                          PLANTED_BPC16)
    assert found.verdict is Verdict.COUNTEREXAMPLE
    assert found.witness is not None and found.witness["values"]["bpc"] == 16
    assert prop.replay(found.witness, REFERENCE) is None
    missed = prove_formula(dataclasses.replace(split_only, configs=lambda: grid),
                           PLANTED_BPC16)
    assert missed.verdict is Verdict.PROVED_FOR_DOMAIN
    symbolic = prove_formula(dataclasses.replace(prop, configs=lambda: grid), PLANTED_BPC16)
    assert symbolic.verdict is Verdict.COUNTEREXAMPLE, symbolic
    assert symbolic.witness is not None and symbolic.witness["values"]["bpc"] == 16
    assert prop.replay(symbolic.witness, REFERENCE) is None


def _planted_load_window(boundary: Any, sliding_window: Any, extra_retained: Any,
                         tokens_per_chunk: Any) -> Any:
    window = reference.load_window_size_in_chunks(boundary, sliding_window, extra_retained,
                                                  tokens_per_chunk)
    if tokens_per_chunk == 24:
        return window + 1  # the plant: chunks of 24 tokens ask for one chunk too many
    return window


def test_the_window_assumption_is_discharged_for_every_chunk_size() -> None:
    prop = get_property("C3/initial-window-in-range")
    assert isinstance(prop, FormulaProperty)
    assert run_property(prop, REFERENCE).verdict is Verdict.PROVED
    planted = dataclasses.replace(REFERENCE, load_window_size_in_chunks=_planted_load_window)
    found = run_property(prop, planted)
    assert found.verdict is Verdict.COUNTEREXAMPLE
    assert found.witness is not None
    values = found.witness["values"]
    assert values["bs"] * values["bpc"] == 24  # no (bs, bpc) of the grid makes 24
    grid_only = prove_formula(dataclasses.replace(prop, symbolic_sizes=()), planted)
    assert grid_only.verdict is Verdict.PROVED_FOR_DOMAIN
