"""The store-mask theorems of C7 for every block size, bpc and alignment (symbolic sizes
through a lemma chain), and a planted mask defect that only shows at a bpc outside the
case split's grid and the presets (issue 12)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvcontract.impl import reference
from kvcontract.impl.variants import get_implementation
from kvcontract.proofs.theorem import run_property
from kvcontract.proofs.verdicts import Verdict
from kvcontract.spec.properties import get_property, properties
from kvcontract.spec.properties.formulas import SYMBOLIC_MASK_SIZES, mask_geometry

REFERENCE = get_implementation("reference")
ALL_SIZES = (
    "C7/segment-boundaries-supplied[plain-none]",
    "C7/segment-boundaries-supplied[plain-interval]",
    "C7/segment-boundaries-supplied[eagle-none]",
    "C7/segment-boundaries-supplied[eagle-interval]",
    "C7/final-boundary-supplied[none]",
    "C7/replay-boundary-supplied[plain-zero]",
    "C7/replay-boundary-supplied[plain-interval]",
    "C7/replay-boundary-supplied[eagle-zero]",
    "C7/replay-boundary-supplied[eagle-interval]",
)
PLANTED_BPC = 8
"""Not in the grid's bpc (1, 2, 4) nor any preset's (1, 4, 16); vLLM builds it."""


def _forgets_e_at_bpc8(block: Any, alignment_tokens: Any, block_tokens: Any,
                       sliding_window: Any, extra_retained: Any, use_eagle: bool,
                       retention_interval: Any, final_segment_end_block: Any,
                       replay_boundary_blocks: tuple[Any, ...] = (),
                       blocks_per_chunk: Any = 1) -> Any:
    if blocks_per_chunk == PLANTED_BPC:
        extra_retained = 0  # the MTP defect, at one bpc only
    return reference.is_block_reachable(
        block, alignment_tokens, block_tokens, sliding_window, extra_retained, use_eagle,
        retention_interval, final_segment_end_block, replay_boundary_blocks,
        blocks_per_chunk)


PLANTED = dataclasses.replace(REFERENCE, name="planted-bpc8",
                              is_block_reachable=_forgets_e_at_bpc8)


@pytest.mark.parametrize("theorem_id", ALL_SIZES)
def test_the_sizes_are_symbolic_first(theorem_id: str) -> None:
    # The C7 theorems over a boundary's demanded chunks (a witness block each); the
    # block-exact final tail and the replay boundaries (issue 30) are stated otherwise.
    issue_30 = {"C7/final-tail-supplied", "C7/replay-boundaries-exact",
                *(f"C7/replay-tail-supplied[{kind}-{retention}]" for kind in ("plain", "eagle")
                  for retention in ("zero", "interval"))}
    assert {p.theorem_id for p in properties() if p.clause == "C7"} == {*ALL_SIZES, *issue_30}
    prop = get_property(theorem_id)
    assert prop.symbolic_sizes[:len(SYMBOLIC_MASK_SIZES)] == SYMBOLIC_MASK_SIZES
    assert ("rho" in prop.symbolic_sizes) == theorem_id.endswith("interval]")
    assert prop.refine_sizes == ("bpc",) and prop.probe_configs > 0
    assert all(c.values["bpc"] != PLANTED_BPC for c in prop.configs())


@pytest.mark.parametrize("theorem_id", [
    "C7/replay-boundary-supplied[plain-zero]", "C7/replay-boundary-supplied[eagle-zero]",
    "C7/final-boundary-supplied[none]"])
def test_the_reference_is_proved_for_every_size(theorem_id: str) -> None:
    result = run_property(get_property(theorem_id), REFERENCE)
    assert result.verdict is Verdict.PROVED, result
    assert result.domain.startswith("all values (per, B, bpc, a, ")
    assert "alignment A = per * B = a * bpc" in result.domain
    assert "arithmetic lemmas, each proved before it is used" in result.domain


def test_upstreams_eagle_defect_keeps_its_grid_witness() -> None:
    """upstream-current's EAGLE peek-chunk defect: replay boundary 8 inside the chunk of
    blocks 0-1 (bpc 2) demands chunk 1, which upstream never marks (a probe finds it)."""
    prop = get_property("C7/replay-boundary-supplied[eagle-zero]")
    result = run_property(prop, get_implementation("upstream-current"))
    assert result.verdict is Verdict.COUNTEREXAMPLE and result.witness is not None
    assert result.witness["values"] == {"A": 8, "B": 8, "bpc": 2, "eagle": 1, "R": 0,
                                        "L": 2, "j": 1, "r": 1, "Hc": 2, "c": 1, "sw": 2,
                                        "e": 0, "q": 0}
    assert result.impact == "lost-hit"


def test_a_defect_at_bpc8_is_refuted_for_all_sizes_and_missed_by_the_grid() -> None:
    prop = get_property("C7/replay-boundary-supplied[plain-zero]")
    bounded = dataclasses.replace(prop, symbolic_sizes=(), probe_configs=0)
    assert run_property(bounded, PLANTED).verdict is Verdict.PROVED_FOR_DOMAIN
    result = run_property(prop, PLANTED)
    assert result.verdict is Verdict.COUNTEREXAMPLE, result
    assert result.witness is not None
    values = result.witness["values"]
    assert values["bpc"] == PLANTED_BPC
    # Graded by the geometry of the model Z3 returns: lost-hit, or latent when its FA and
    # SWA blocks are not multiples of one another (in a long-lived process another model
    # may come back; the command line forks every theorem from one template).
    assert result.impact == ("latent" if result.latent else "lost-hit")
    # The witness replays on plain ints.
    assert prop.violation(values, PLANTED) is not None
    assert prop.violation(values, REFERENCE) is None
    assert mask_geometry(values).blocks_per_chunk == PLANTED_BPC


def test_a_defect_in_the_grid_is_found_by_the_probe_with_the_grid_witness() -> None:
    """The historic MTP mask defect: the same smallest witness as the case split, found
    among the first configurations before any symbolic query."""
    prop = get_property("C7/segment-boundaries-supplied[plain-none]")
    result = run_property(prop, get_implementation("mtp-extra-retained"))
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.witness is not None
    assert result.witness["values"]["A"] == 8 and result.witness["values"]["B"] == 4
    assert result.queries <= prop.probe_configs


def _marks_everything_at_b24(block: Any, alignment_tokens: Any, block_tokens: Any,
                             sliding_window: Any, extra_retained: Any, use_eagle: bool,
                             retention_interval: Any, final_segment_end_block: Any,
                             replay_boundary_blocks: tuple[Any, ...] = (),
                             blocks_per_chunk: Any = 1) -> Any:
    if block_tokens == 24:
        return True  # stores every block at one block size only: CPU memory wasted
    return reference.is_block_reachable(
        block, alignment_tokens, block_tokens, sliding_window, extra_retained, use_eagle,
        retention_interval, final_segment_end_block, replay_boundary_blocks,
        blocks_per_chunk)


OVER_STORES = dataclasses.replace(REFERENCE, name="planted-b24",
                                  is_block_reachable=_marks_everything_at_b24)


def test_c8_demand_is_proved_for_every_size() -> None:
    prop = get_property("C8/stored-blocks-demanded")
    assert prop.symbolic_sizes[:len(SYMBOLIC_MASK_SIZES)] == SYMBOLIC_MASK_SIZES
    result = run_property(prop, REFERENCE)
    assert result.verdict is Verdict.PROVED, result
    assert all(c.values["B"] != 24 for c in prop.configs())
    bounded = dataclasses.replace(prop, symbolic_sizes=(), probe_configs=0)
    assert run_property(bounded, OVER_STORES).verdict is Verdict.PROVED_FOR_DOMAIN
    found = run_property(prop, OVER_STORES)
    assert found.verdict is Verdict.COUNTEREXAMPLE, found
    assert found.witness is not None and found.witness["values"]["B"] == 24
    assert found.impact == "waste"
    assert prop.violation(found.witness["values"], OVER_STORES) is not None
    assert prop.violation(found.witness["values"], REFERENCE) is None
