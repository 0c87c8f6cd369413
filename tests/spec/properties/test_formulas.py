"""kvcontract.spec.properties.formulas: each formula property on a witness computed by
hand, failing for the defective implementation, holding for the reference, and the
picture of the witness (the offending chunks computed by hand)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import REFERENCE, get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.properties import FormulaProperty, get_property
from kvcontract.spec.properties.formulas import formula_properties


def _ignores_extra(n: int, bs: int, sw: int, e: int) -> tuple[int, int]:
    return max(0, n - sw + 1) // bs, -(-n // bs)  # the defect: e is not retained


def _ignores_local(n: int, local: int, bs: int, bpc: int, sw: int, e: int) -> tuple[int, int]:
    return REFERENCE.load_chunk_range(n, 0, bs, bpc, sw, e)  # the defect: L is reloaded


def _marks_everything(*args: Any) -> bool:
    return True


IGNORES_EXTRA = dataclasses.replace(REFERENCE, name="ignores-e",
                                    retained_block_range=_ignores_extra)
IGNORES_LOCAL = dataclasses.replace(REFERENCE, name="ignores-local",
                                    load_chunk_range=_ignores_local)
MARKS_EVERYTHING = dataclasses.replace(REFERENCE, name="marks-everything",
                                       is_block_reachable=_marks_everything)

MTP, UNALIGNED, UPSTREAM = "mtp-extra-retained", "unaligned-hit", "upstream-current"
# Keys for every whole hash block, the lookahead ignored (docs/CONTRACT.md 2.1).
IGNORES_LOOKAHEAD = dataclasses.replace(REFERENCE, name="ignores-lookahead",
                                        keyed_tokens=lambda n, tph, t: n // tph * tph)
# The state's chunk rounded up: mid-chunk, the chunk still being computed, not the last
# chunk end's (the state a hit there loads is freed).
MAMBA_CEIL = dataclasses.replace(
    REFERENCE, name="mamba-ceil",
    mamba_first_live_block=lambda n, tpc, bpc: max(-(-n // tpc) - 1, 0) * bpc)
PLAIN_NONE = {"A": 16, "B": 4, "bpc": 1, "eagle": 0, "R": -1}
PLAIN_INTERVAL = {"A": 16, "B": 4, "bpc": 1, "eagle": 0, "R": 32}
# FA 528 + SWA 32, bpc 2: A = 1056 falls inside SWA chunk 16 (tpc 64): docs/CONTRACT.md 12.
ODD_EAGLE = {"A": 1056, "B": 32, "bpc": 2, "eagle": 1, "L": 2, "j": 1, "q": 0,
             "sw": 2, "e": 0, "Hc": 18, "c": 17}

# (theorem, values, implementation that violates it, offending chunks per picture row)
WITNESSES: list[tuple[str, dict[str, int], Implementation | str, dict[int, set[int]]]] = [
    # Ret(16) for sw 4, e 4 is tokens [9, 16): blocks [2, 4); without e only [3, 4).
    ("C1/retained-blocks-exact", {"bs": 4, "n": 16, "i": 2, "sw": 4, "e": 4},
     IGNORES_EXTRA, {0: {2}}),
    # N 20, L 12: retained blocks [1, 5), fresh [3, 5); chunk 1 is local, not loaded.
    ("C1/load-set-exact", {"bs": 4, "bpc": 1, "N": 20, "Lb": 3, "c": 1, "sw": 16, "e": 0},
     IGNORES_LOCAL, {0: {1}}),
    # sw 2, e 8: W is cdiv(9, 4) = 3, the MTP window 1; N 12 allocates blocks [0, 3).
    ("C1/allocation-bound", {"bs": 4, "bpc": 1, "N": 12, "Lb": 0, "sw": 2, "e": 8},
     MTP, {0: {0, 1, 2}}),
    # N 5, sw 2, e 1: lw(5) = cdiv(1 + 1 + 3, 4) = 2, the defect checks W = 1 chunk,
    # chunk [1, 2); Load(5, 0) = [0, 2) (skipped 3, block 0).
    ("C2/first-run-covers-load", {"bs": 4, "bpc": 1, "N": 5, "Lb": 0, "sw": 2, "e": 1},
     UNALIGNED, {0: {0}}),
    # j 3 (N 12), sw 2, e 4: skipped 7, Load = [1, 3); W ignoring e is 1: checks [2, 3).
    ("C2/later-run-covers-load", {"bs": 4, "bpc": 1, "j": 3, "Lb": 0, "sw": 2, "e": 4},
     MTP, {0: {1}}),
    # sw 5, e 0, tpc 4: upstream W = cdiv(5, 4) = 2; Load(8, 0) = [1, 2) holds one chunk.
    ("C4/load-window-exact", {"bs": 4, "bpc": 1, "N": 8, "sw": 5, "e": 0}, UPSTREAM, {0: {0}}),
    ("C4/window-exact", {"bs": 4, "bpc": 1, "j": 2, "sw": 5, "e": 0}, UPSTREAM, {0: {0}}),
    # FA 16 + SWA 4 (sw 8, e 3): boundary 16 demands [1, 4); need 3 marks block 1, the
    # MTP mask (need 2) only blocks 2 and 3.
    ("C7/segment-boundaries-supplied[plain-none]",
     {**PLAIN_NONE, "L": 1, "j": 0, "k": 1, "q": 1, "Hc": 4, "c": 1, "sw": 8, "e": 3},
     MTP, {1: {1}}),
    # Segments of 32 tokens (8 blocks): boundary 32 demands [5, 8); need 2 marks 6, 7.
    ("C7/segment-boundaries-supplied[plain-interval]",
     {**PLAIN_INTERVAL, "L": 1, "j": 0, "k": 1, "q": 1, "Hc": 8, "c": 5, "sw": 8, "e": 3},
     MTP, {1: {5}}),
    # Boundary 1056 demands [16, 18) (the peek chunk 17); upstream marks blocks 32, 33.
    ("C7/segment-boundaries-supplied[eagle-none]", {**ODD_EAGLE, "R": -1, "k": 1},
     UPSTREAM, {1: {17}}),
    # EAGLE, segments of 32: boundary 32 demands [5, 9); the shifted tail of need 3 (MTP)
    # is blocks 6-8, of need 4 blocks 5-8.
    ("C7/segment-boundaries-supplied[eagle-interval]",
     {**PLAIN_INTERVAL, "eagle": 1, "L": 1, "j": 0, "k": 1, "q": 1, "Hc": 9, "c": 5,
      "sw": 8, "e": 3}, MTP, {1: {5}}),
    # Horizon 7 blocks: demands [4, 7); the final tail of need 2 is [5, 7).
    ("C7/final-boundary-supplied[none]", {**PLAIN_NONE, "Hc": 7, "c": 4, "sw": 8, "e": 3},
     MTP, {1: {4}}),
    # Retention 0: replay boundary 32 (block 8) demands [5, 8); need 2 marks [6, 8).
    ("C7/replay-boundary-supplied[plain-zero]",
     {**PLAIN_NONE, "R": 0, "L": 1, "j": 0, "r": 2, "q": 2, "Hc": 8, "c": 5, "sw": 8, "e": 3},
     MTP, {1: {5}}),
    ("C7/replay-boundary-supplied[plain-interval]",
     {**PLAIN_INTERVAL, "L": 1, "j": 0, "r": 1, "q": 1, "Hc": 4, "c": 1, "sw": 8, "e": 3},
     MTP, {1: {1}}),
    # FA 4 + SWA 8 EAGLE, bpc 2, retention 0, replay boundary 8: demands chunks {0, 1};
    # upstream marks blocks 0 and 1 only (chunk 0): docs/CONTRACT.md 12.
    ("C7/replay-boundary-supplied[eagle-zero]",
     {"A": 8, "B": 8, "bpc": 2, "eagle": 1, "R": 0, "L": 2, "j": 1, "r": 1, "q": 0,
      "Hc": 2, "c": 1, "sw": 2, "e": 0}, UPSTREAM, {1: {1}}),
    ("C7/replay-boundary-supplied[eagle-interval]", {**ODD_EAGLE, "R": 2112, "r": 1},
     UPSTREAM, {1: {17}}),
    # Block 0 of a 32-token horizon: boundaries 16 and 32 demand [2, 4) and [6, 8).
    ("C8/stored-blocks-demanded", {**PLAIN_NONE, "i": 0, "Hc": 8, "sw": 8, "e": 0},
     MARKS_EVERYTHING, {1: {0}}),
    # Issue 30, block-exact tails. A final segment ending at block 7 (per 4, partial 3):
    # need 3 (sw 8, e 3) marks the final tail [4, 7), the MTP mask (need 2) [5, 7).
    ("C7/final-tail-supplied", {**PLAIN_NONE, "i": 4, "F": 7, "sw": 8, "e": 3}, MTP,
     {1: {4}}),
    # Ending at block 5 (partial 1), need 2: the tail is [4, 5); block 5 is no segment
    # tail (5 mod 4 = 1 < 2), so marking it is waste.
    ("C8/final-tail-exact", {**PLAIN_NONE, "i": 5, "F": 5, "sw": 8, "e": 0},
     MARKS_EVERYTHING, {1: {5}}),
    # Replay block 8 (k 2, per 4), need 3: the window [5, 8); the MTP mask marks [6, 8).
    ("C7/replay-tail-supplied[plain-zero]",
     {**PLAIN_NONE, "R": 0, "i": 5, "k": 2, "sw": 8, "e": 3}, MTP, {1: {5}}),
    # The same with segments of 8 blocks: block 5 is no segment tail of need 2 either.
    ("C7/replay-tail-supplied[plain-interval]",
     {**PLAIN_INTERVAL, "i": 5, "k": 2, "sw": 8, "e": 3}, MTP, {1: {5}}),
    # FA 4 + SWA 8 EAGLE, bpc 2: replay block 1 peeks at chunk 1, whose first block 2
    # upstream's mask (blocks, not chunks) never marks: docs/CONTRACT.md 12.
    ("C7/replay-tail-supplied[eagle-zero]",
     {"A": 8, "B": 8, "bpc": 2, "eagle": 1, "R": 0, "i": 2, "k": 1, "sw": 2, "e": 0},
     UPSTREAM, {1: {1}}),
    # FA 528 + SWA 32, bpc 2: replay block 33 peeks at chunk 17 (blocks 34, 35).
    ("C7/replay-tail-supplied[eagle-interval]",
     {"A": 1056, "B": 32, "bpc": 2, "eagle": 1, "R": 2112, "i": 34, "k": 1, "sw": 2,
      "e": 0}, UPSTREAM, {1: {17}}),
    # Retention 0, replay block 8, need 2: only [6, 8) is marked, never block 0.
    ("C8/replay-tail-exact[plain-zero]",
     {**PLAIN_NONE, "R": 0, "i": 0, "k": 2, "sw": 8, "e": 0}, MARKS_EVERYTHING, {1: {0}}),
    # EAGLE, replay block 1, bpc 2: the window [0, 2) and the peek block 2, never 5.
    ("C8/replay-tail-exact[eagle-zero]",
     {"A": 8, "B": 8, "bpc": 2, "eagle": 1, "R": 0, "i": 5, "k": 1, "sw": 2, "e": 0},
     MARKS_EVERYTHING, {1: {2}}),
    # P 3, A 1, EAGLE, retention 0: owed P - 1 = 2 and 2 - 1 = 1, 3 - 1 = 2; upstream
    # passes 2 alone.
    ("C7/replay-boundaries-exact",
     {"eagle": 1, "Ak": 1, "Rk": 0, "R": 0, "P": 3, "x": 1, "A": 1}, UPSTREAM, {}),
    # A one-token request with a window and a budget of 0: the cap is 0; 0.33.0's order
    # (the budget, then the recomputed token) gives -1.
    ("C4/lookup-cap-exact", {"r": 1, "k": 1, "N": 1, "B": 0}, "minus-one-after-clamps", {}),
    # 16 tokens, hash block 4, lookahead 1: the fourth block is not hashed yet (12).
    ("C4/keys-cover-hashed-tokens", {"h": 1, "n": 16, "tph": 4, "T": 1}, IGNORES_LOOKAHEAD,
     {}),
    # An EAGLE group under lookahead hashes drops nothing; the mixed lookup still does.
    ("C5/eagle-drop-per-hash-mode", {"x": 1, "h": 1, "T": 1}, "legacy-drop-lookahead-store",
     {}),
    # Mamba, 4-token chunks, 5 tokens computed: the state of the chunk end at 4 lives in
    # chunk 0; rounding up keeps only chunk 1.
    ("C1/mamba-retention-exact", {"n": 5, "bs": 4, "bpc": 1}, MAMBA_CEIL, {0: {0, 1}}),
    # FA boundary 16 over a hit of 0, retention 0: the junction is 16; 0.33.0's connector
    # registers none.
    ("C12/junction-rule-exact", {"q": 1, "F": 16, "L": 0, "h": 0, "R": 0},
     "no-shared-prefix-junction", {}),
    # bpc 2, one interior null page before job position 3: 0.33.0 writes it one slot early.
    ("C10/store-blocks-placed", {"bpc": 2, "p": 3, "f": 0, "n": 1}, "first-block-null-offset",
     {}),
]


def _impl(impl: Implementation | str) -> Implementation:
    return get_implementation(impl) if isinstance(impl, str) else impl


def test_every_formula_property_has_a_witness_here() -> None:
    assert {p.theorem_id for p in formula_properties()} == {row[0] for row in WITNESSES}


@pytest.mark.parametrize(("theorem", "values", "impl", "offending"), WITNESSES,
                         ids=[row[0] for row in WITNESSES])
def test_witness_fails_the_defect_and_holds_for_the_reference(
    theorem: str, values: dict[str, int], impl: Implementation | str,
    offending: dict[int, set[int]],
) -> None:
    prop = get_property(theorem)
    assert isinstance(prop, FormulaProperty)
    assert prop.admissible(values)
    defective = _impl(impl)
    message = prop.violation(values, defective)
    assert message == f"{prop.description} fails for " + ", ".join(
        f"{k}={v}" for k, v in values.items())
    assert prop.violation(values, REFERENCE) is None
    witness = prop.witness(values)
    assert prop.replay(witness, defective) == message
    assert prop.replay(witness, REFERENCE) is None
    # The defect lives in a function the property names (reports locate it there).
    changed = {name for name in prop.uses
               if getattr(defective, name) is not getattr(REFERENCE, name)}
    assert changed, (theorem, prop.uses)


@pytest.mark.parametrize(("theorem", "values", "impl", "offending"), WITNESSES,
                         ids=[row[0] for row in WITNESSES])
def test_picture_shows_the_offending_chunks(
    theorem: str, values: dict[str, int], impl: Implementation | str,
    offending: dict[int, set[int]],
) -> None:
    prop = get_property(theorem)
    picture = prop.draw(prop.witness(values), _impl(impl))
    assert picture.offending == offending
    assert picture.notes


def test_covers_picture_numbers() -> None:
    values = {"bs": 4, "bpc": 1, "N": 5, "Lb": 0, "sw": 2, "e": 1}
    picture = get_property("C2/first-run-covers-load").draw(
        {"values": values}, get_implementation(UNALIGNED))
    assert picture.geometry == Geometry((swa(4, 2, 1),), blocks_per_chunk=1)
    assert (picture.num_tokens, picture.hit, picture.local_hit) == (5, 5, 0)
    assert picture.notes == ["the implementation checks chunks [1, 2) (window 1) but loads [0, 2)"]


def test_load_set_picture_keeps_the_local_hit() -> None:
    values = {"bs": 4, "bpc": 1, "N": 20, "Lb": 3, "c": 1, "sw": 16, "e": 0}
    picture = get_property("C1/load-set-exact").draw({"values": values}, IGNORES_LOCAL)
    assert (picture.num_tokens, picture.hit, picture.local_hit) == (20, 20, 12)
    assert picture.notes == ["the implementation loads chunks [1, 5)"]


def test_window_picture_note() -> None:
    values = {"bs": 4, "bpc": 1, "N": 8, "sw": 5, "e": 0}
    picture = get_property("C4/load-window-exact").draw(
        {"values": values}, get_implementation(UPSTREAM))
    assert picture.notes == ["the implementation demands 2 chunks ending at chunk 2; "
                             "the load set is only [1, 2)"]


def test_mask_picture_geometry_and_boundary() -> None:
    values = {**ODD_EAGLE, "R": -1, "k": 1}
    picture = get_property("C7/segment-boundaries-supplied[eagle-none]").draw(
        {"values": values}, get_implementation(UPSTREAM))
    assert picture.geometry == Geometry((fa(528), swa(32, 2, 0, eagle=True)),
                                        blocks_per_chunk=2)
    assert (picture.num_tokens, picture.hit, picture.local_hit) == (18 * 64, 1056, 0)
    assert picture.notes == ["chunk 17 is demanded by boundary 1056 and never stored"]
    replay = {**PLAIN_NONE, "R": 0, "L": 1, "j": 0, "r": 2, "q": 2, "Hc": 8, "c": 5,
              "sw": 8, "e": 3}
    picture = get_property("C7/replay-boundary-supplied[plain-zero]").draw(
        {"values": replay}, get_implementation(MTP))
    assert picture.geometry.retention_interval == 0 and picture.hit == 32
    final = {**PLAIN_NONE, "Hc": 7, "c": 4, "sw": 8, "e": 3}
    assert get_property("C7/final-boundary-supplied[none]").draw(
        {"values": final}, get_implementation(MTP)).hit == 28
    stored = {**PLAIN_NONE, "i": 0, "Hc": 8, "sw": 8, "e": 0}
    assert get_property("C8/stored-blocks-demanded").draw(
        {"values": stored}, MARKS_EVERYTHING).notes == [
        "block 0 is stored but no reachable boundary demands it"]


@pytest.mark.parametrize(
    ("theorem", "values"),
    [
        # N must exceed the local hit.
        ("C2/first-run-covers-load", {"bs": 4, "bpc": 1, "N": 4, "Lb": 1, "sw": 2, "e": 0}),
        ("C1/load-set-exact", {"bs": 4, "bpc": 1, "N": 8, "Lb": 0, "c": -1, "sw": 2, "e": 0}),
        ("C1/retained-blocks-exact", {"bs": 4, "n": 8, "i": 0, "sw": 1, "e": 0}),
        ("C4/window-exact", {"bs": 4, "bpc": 1, "j": 0, "sw": 5, "e": 0}),
        # c outside the demanded range [1, 4) of boundary 16.
        ("C7/segment-boundaries-supplied[plain-none]",
         {**PLAIN_NONE, "L": 1, "j": 0, "k": 1, "q": 1, "Hc": 4, "c": 0, "sw": 8, "e": 3}),
        # k = L * q + j fails (q 0 with L 1, j 0 gives k 0).
        ("C7/segment-boundaries-supplied[plain-none]",
         {**PLAIN_NONE, "L": 1, "j": 0, "k": 1, "q": 0, "Hc": 4, "c": 1, "sw": 8, "e": 3}),
        # the boundary lies past the horizon.
        ("C7/segment-boundaries-supplied[plain-none]",
         {**PLAIN_NONE, "L": 1, "j": 0, "k": 2, "q": 2, "Hc": 4, "c": 5, "sw": 8, "e": 3}),
        # no segment boundaries with retention 0, no final boundary for EAGLE,
        # no replay boundary without a retention interval, C8 only non-EAGLE, retention None.
        ("C7/segment-boundaries-supplied[plain-interval]",
         {**PLAIN_NONE, "R": 0, "L": 1, "j": 0, "k": 1, "q": 1, "Hc": 8, "c": 5, "sw": 8,
          "e": 3}),
        ("C7/final-boundary-supplied[none]",
         {**PLAIN_NONE, "eagle": 1, "Hc": 7, "c": 4, "sw": 8, "e": 3}),
        ("C7/replay-boundary-supplied[plain-zero]",
         {**PLAIN_NONE, "L": 1, "j": 0, "r": 2, "q": 2, "Hc": 8, "c": 5, "sw": 8, "e": 3}),
        ("C8/stored-blocks-demanded", {**PLAIN_NONE, "eagle": 1, "i": 0, "Hc": 8, "sw": 8,
                                       "e": 0}),
        ("C8/stored-blocks-demanded", {**PLAIN_INTERVAL, "i": 0, "Hc": 8, "sw": 8, "e": 0}),
        ("C8/stored-blocks-demanded", {**PLAIN_NONE, "i": 8, "Hc": 2, "sw": 8, "e": 0}),
    ],
)
def test_outside_the_domain(theorem: str, values: dict[str, int]) -> None:
    prop = get_property(theorem)
    assert not prop.admissible(values)
    assert prop.violation(values, MARKS_EVERYTHING) is None


def test_stored_blocks_demanded_tries_every_boundary_on_ints() -> None:
    # Block 2 (chunk 2) of an 8-block horizon is demanded by boundary 16 ([2, 4)), not by
    # the final horizon 32 ([6, 8)); every marked block of the reference is demanded.
    prop = get_property("C8/stored-blocks-demanded")
    for i in range(8):
        assert prop.violation({**PLAIN_NONE, "i": i, "Hc": 8, "sw": 8, "e": 0},
                              MARKS_EVERYTHING) == (
            None if i in {2, 3, 6, 7} else
            f"{prop.description} fails for A=16, B=4, bpc=1, eagle=0, R=-1, i={i}, Hc=8, "
            "sw=8, e=0")
        assert prop.violation({**PLAIN_NONE, "i": i, "Hc": 8, "sw": 8, "e": 0}, REFERENCE) \
            is None


def test_configs_and_domains() -> None:
    by_id = {p.theorem_id: p for p in formula_properties()}
    first_run = by_id["C2/first-run-covers-load"]
    assert len(first_run.configs()) == 9 * 5
    assert first_run.uses == ("load_window_size_in_chunks", "load_chunk_range")
    retained = by_id["C1/retained-blocks-exact"]
    assert [c.values for c in retained.configs()][:2] == [{"bs": 4}, {"bs": 8}]
    assert retained.symbolic_sizes == ("bs",)
    segment = by_id["C7/segment-boundaries-supplied[eagle-none]"]
    assert segment.domain.endswith("eagle=True, retention=none")
    for config in segment.configs():
        values = config.values
        assert values["eagle"] == 1 and values["R"] == -1
        assert 0 <= values["j"] < values["L"]
    replay = by_id["C7/replay-boundary-supplied[plain-interval]"]
    assert all(c.values["R"] == 2 * c.values["A"] and c.values["eagle"] == 0
               for c in replay.configs())
    final = by_id["C7/final-boundary-supplied[none]"]
    assert all("L" not in c.values for c in final.configs())  # no residue split
    # Under a retention interval the contract owes no final tail (keeps_final_tail).
    assert "C7/final-boundary-supplied[interval]" not in by_id
