"""C10 block placement: every live block a store job writes lands in its own CPU chunk at
its own offset (docs/CONTRACT.md 5, "Placement"): the theorem for all values, the
store-family judge, the system's store jobs and upstream's store path laid as vLLM's
worker lays them."""

from __future__ import annotations

import dataclasses
import types

from kvcontract.impl.scheduler import StoreTracker, store_job_placement
from kvcontract.impl.variants import REFERENCE, VARIANTS
from kvcontract.proofs.theorem import prove_formula
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.properties.catalog import get_property
from kvcontract.spec.properties.store import (
    StoreCase,
    simulate_store_case,
    stores_placed,
)
from kvcontract.tools.audit.store import laid_jobs
from kvcontract.vocabulary import Impact, Verdict

PLACED = "C10/store-blocks-placed"
VARIANT = VARIANTS["first-block-null-offset"]
BPC = 4


def _table(nulls: set[int], size: int) -> list[int | None]:
    """Block ids of a group: block ``b`` has id ``b + 1``, the ``nulls`` are null pages."""
    return [None if b in nulls else b + 1 for b in range(size)]


def _laid(impl: object, chunks: list[int], table: list[int | None]
          ) -> list[tuple[int, int, int]]:
    """``(chunk, page, block)`` of each live block the job writes."""
    laid = store_job_placement(impl, chunks, BPC,  # type: ignore[arg-type]
                               lambda b: table[b] if b < len(table) else None)
    return [(chunks[rank], page, block_id - 1) for block_id, rank, page in laid]


def test_the_theorem_is_proved_for_all_values_and_refutes_the_variant() -> None:
    prop = get_property(PLACED)
    proved = prove_formula(prop, REFERENCE)
    assert proved.verdict is Verdict.PROVED
    refuted = prove_formula(prop, VARIANT)
    assert refuted.verdict is Verdict.COUNTEREXAMPLE
    assert refuted.witness is not None
    values = refuted.witness["values"]
    # A null page after a live one, before the block: never the chunk's last page.
    assert values["n"] > values["f"]
    assert prop.replay(refuted.witness, VARIANT)
    assert prop.replay(refuted.witness, REFERENCE) is None


def test_a_job_with_an_interior_null_page() -> None:
    # Chunk 3 of a group with bpc 4: page 0 live (freed, kept), page 1 null (reallocated
    # and zeroed), pages 2 and 3 live: the window's blocks.
    table = _table({13}, 16)
    placed = _laid(REFERENCE, [3], table)
    assert placed == [(3, 0, 12), (3, 2, 14), (3, 3, 15)]
    shifted = _laid(VARIANT, [3], table)
    assert shifted == [(3, 0, 12), (3, 1, 14), (3, 2, 15)]
    # Leading null pages only (blocks freed below the window): both place correctly.
    leading = _table({12, 13}, 16)
    assert _laid(VARIANT, [3], leading) == _laid(REFERENCE, [3], leading) == [
        (3, 2, 14), (3, 3, 15)]


def test_a_null_page_of_a_later_chunk_shifts_it_and_drops_what_overflows() -> None:
    table = _table({8}, 12)  # chunks 1 and 2; chunk 2's first page null
    assert _laid(REFERENCE, [1, 2], table) == [
        (1, 0, 4), (1, 1, 5), (1, 2, 6), (1, 3, 7), (2, 1, 9), (2, 2, 10), (2, 3, 11)]
    assert _laid(VARIANT, [1, 2], table)[4:] == [(2, 0, 9), (2, 1, 10), (2, 2, 11)]


def _run_with(placements: list[list[tuple[int, int, int]]],
              offers: list[list[int]] | None = None) -> types.SimpleNamespace:
    """A run whose SWA group's jobs are ``placements`` (and offered ``offers``: by default
    the chunks the placements name)."""
    if offers is None:
        offers = [sorted({chunk for chunk, _, _ in step}) for step in placements]
    tracker = types.SimpleNamespace(placements=placements, offers=offers)
    idle = types.SimpleNamespace(placements=[[] for _ in placements],
                                 offers=[[] for _ in placements])
    return types.SimpleNamespace(trackers=[idle, tracker])


CASE = StoreCase("FA16+SWA4(sw8),bpc4", Geometry((fa(16), swa(4, 8)), blocks_per_chunk=BPC),
                 64, (55, 8), "finished", decode=1)


def test_the_judge_fires_on_a_misplaced_block_only() -> None:
    right = _run_with([[], [(3, 0, 12), (3, 2, 14), (3, 3, 15)]])
    assert stores_placed(CASE, right) is None  # type: ignore[arg-type]
    wrong = _run_with([[], [(3, 0, 12), (3, 1, 14), (3, 2, 15)]])
    found = stores_placed(CASE, wrong)  # type: ignore[arg-type]
    assert found is not None
    assert "writes block 14 (chunk 3, offset 2) into chunk 3 at offset 1" in found
    assert getattr(found, "impact", None) is Impact.CORRUPTION
    # A block of no known position (a stale id on the engine) is the data trace's.
    unknown = _run_with([[(3, 1, -1)]], offers=[[]])
    assert stores_placed(CASE, unknown) is None  # type: ignore[arg-type]


def test_the_judge_fires_on_a_marked_block_left_out() -> None:
    """Chunk 3 stored at step 1 (55 tokens computed, 8 scheduled): the mask marks blocks
    14 and 15 (the window of the boundary at 63); a job without block 14 leaves the slot a
    load reads unwritten. Blocks 12 and 13, unmarked, may be left out."""
    unmarked_out = _run_with([[], [(3, 2, 14), (3, 3, 15)]])
    assert stores_placed(CASE, unmarked_out) is None  # type: ignore[arg-type]
    found = stores_placed(CASE, _run_with([[], [(3, 0, 12), (3, 3, 15)]]))  # type: ignore[arg-type]
    assert found is not None and "without block 14, which its mask marks" in found
    assert getattr(found, "impact", None) is Impact.CORRUPTION


def test_the_model_records_its_placement_per_step() -> None:
    run = simulate_store_case(CASE, REFERENCE)
    swa_tracker: StoreTracker = run.trackers[1]
    assert len(swa_tracker.placements) == len(swa_tracker.offers)
    placed = [p for step in swa_tracker.placements for p in step]
    assert placed and all(block == chunk * BPC + page for chunk, page, block in placed)
    assert {chunk for chunk, _, _ in placed} == {c for o in swa_tracker.offers for c in o}
    assert stores_placed(CASE, run) is None
    # A placement that writes every block one slot late is caught on the same run.
    late = dataclasses.replace(
        REFERENCE, store_block_slot=lambda p, f, n, bpc: p + 1 if p % bpc == 2 else p)
    assert stores_placed(CASE, simulate_store_case(CASE, late)) is not None


def test_upstream_jobs_are_laid_as_the_worker_lays_them() -> None:
    """vLLM's job: per group its block ids (0: a placeholder), group sizes and the first
    block's index; the worker skips ``index mod bpc`` pages of the group's first chunk."""

    def job(ids: list[int], sizes: list[int], starts: list[int],
            keys: list[tuple[int, int]]) -> types.SimpleNamespace:
        spec = types.SimpleNamespace(args=(ids,), group_sizes=sizes, block_indices=starts)
        return types.SimpleNamespace(src_spec=spec, dst_spec=types.SimpleNamespace(
            args=(keys,)))

    def position(g: int, block_id: int) -> int:
        return block_id - 1

    # 0.34.0: chunk 3's null page kept in place.
    kept = {0: job([13, 0, 15, 16], [0, 4], [0, 12], [(1, 3)])}
    assert laid_jobs(kept, 2, BPC, position) == [[], [(3, 0, 12), (3, 2, 14), (3, 3, 15)]]
    # 0.33.0: the null page dropped, the first block's index kept.
    dropped = {0: job([13, 15, 16], [0, 3], [0, 12], [(1, 3)])}
    assert laid_jobs(dropped, 2, BPC, position)[1] == [(3, 0, 12), (3, 1, 14), (3, 2, 15)]
