"""The spec's formulas on the worked numbers of docs/CONTRACT.md sections 8 and 10."""

from __future__ import annotations

import pytest
import z3

from kvcontract.errors import GeometryError
from kvcontract.spec import (
    HIT,
    HIT_PENDING,
    MISS,
    RETRY,
    Geometry,
    fa,
    load_window_chunks,
    sliding_window_answer,
    swa,
    window_chunks,
)
from kvcontract.spec.reachability import chunk_is_stored, mask_rule, store_need_blocks
from kvcontract.spec.retention import load_chunk_range, skipped_tokens


def test_unaligned_hit_numbers() -> None:
    # seed 001: bs 64, bpc 4 (tpc 256), sw 128, N 3904: p = 192, lw = 2, chunks {14, 15}
    assert window_chunks(128, 0, 256) == 1
    assert load_window_chunks(3904, 128, 0, 256) == 2
    assert load_chunk_range(3904, 0, 64, 4, 128, 0) == (14, 16)


def test_mtp_numbers() -> None:
    # seed 003: bs = tpc = 16, sw 32, e 3, N 64: needed chunks {1, 2, 3}, W = 3
    assert load_chunk_range(64, 0, 16, 1, 32, 3) == (1, 4)
    assert window_chunks(32, 3, 16) == 3


def test_upstream_matrix_windows() -> None:
    # FA 16, SWA bs 4, sw 8: W = 2 for e in {0, 1}, 3 for e = 3
    assert [window_chunks(8, e, 4) for e in (0, 1, 3)] == [2, 2, 3]


@pytest.mark.parametrize(
    ("key3", "expected"), [(MISS, 2), (RETRY, None), (HIT_PENDING, None), (HIT, 5)]
)
def test_scanner_table(key3: object, expected: int | None) -> None:
    states = [HIT, HIT, key3, HIT, HIT]
    assert sliding_window_answer(states, 3, 2).concrete() == expected


def test_stale_pending_example() -> None:
    assert sliding_window_answer([HIT, HIT, MISS, HIT_PENDING], 2, 2).concrete() == 2


@pytest.mark.parametrize(
    ("state", "expected"), [(HIT, 3), (HIT_PENDING, None), (RETRY, None), (MISS, 0)]
)
def test_single_state_scans(state: object, expected: int | None) -> None:
    assert sliding_window_answer([state] * 3, 1, 1).concrete() == expected


def _stored_blocks(geometry: Geometry, tokens: int, e_group: int = 1) -> set[int]:
    group = geometry.groups[e_group]
    assert group.sliding_window is not None
    rule = mask_rule(geometry.alignment_tokens, group.block_size, geometry.retention_interval)
    need = store_need_blocks(
        group.sliding_window, group.extra_retained_tokens, group.block_size, False
    )
    blocks = tokens // group.block_size
    return {b for b in range(blocks) if chunk_is_stored(b, 1, rule, need, False, blocks)}


def test_store_masks_and_retention_intervals() -> None:
    assert _stored_blocks(Geometry((fa(16), swa(4, 8))), 32) == {2, 3, 6, 7}
    assert _stored_blocks(Geometry((fa(16), swa(4, 8, 3))), 32) == {1, 2, 3, 5, 6, 7}
    geometry = Geometry((fa(16), swa(4, 8)), retention_interval=32)
    group = geometry.groups[1]
    assert group.sliding_window is not None
    rule = mask_rule(geometry.alignment_tokens, group.block_size, geometry.retention_interval)
    need = store_need_blocks(group.sliding_window, 0, group.block_size, False)
    assert need == 2
    replay = ((64 - 1) // 16 * 16 // 4,)
    stored = {b for b in range(16) if chunk_is_stored(b, 1, rule, need, False, None, replay)}
    assert stored == {6, 7, 10, 11, 14, 15}
    rule0 = mask_rule(16, 4, 0)
    assert {b for b in range(16) if chunk_is_stored(b, 1, rule0, need, False, None, replay)} == {
        10,
        11,
    }


def test_formulas_build_z3_terms() -> None:
    n, sw, e = z3.Ints("n sw e")
    term = skipped_tokens(n, sw, e)
    assert isinstance(term, z3.ArithRef)
    solver = z3.Solver()
    solver.add(n == 100, sw == 8, e == 3, term != 100 - 8 + 1 - 3)
    assert solver.check() == z3.unsat


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: swa(4, 0), "sliding_window"),
        (lambda: Geometry((fa(6), swa(4, 8)), hash_block_size=4), "groups[0].block_size"),
        (lambda: Geometry((swa(4, 8),), blocks_per_chunk=0), "blocks_per_chunk"),
        (lambda: swa(4, 8, -1), "extra_retained_tokens"),
        (lambda: Geometry(()), "groups"),
        (lambda: Geometry((fa(16), swa(4, 8)), retention_interval=24), "retention_interval"),
    ],
)
def test_impossible_geometry_names_the_field(build: object, field: str) -> None:
    with pytest.raises(GeometryError) as info:
        build()  # type: ignore[operator]
    assert info.value.field == field
    assert field in str(info.value)


def test_alignment() -> None:
    assert (
        Geometry((fa(256), swa(64, 128), swa(8, 128)), blocks_per_chunk=4).alignment_tokens == 1024
    )
    assert Geometry((fa(16), fa(32), swa(4, 8))).alignment_tokens is None
    assert Geometry((swa(4, 8), swa(8, 8))).alignment_tokens == 8
