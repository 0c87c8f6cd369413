"""The reference and the variants on the worked scenarios of docs/CONTRACT.md (sections 8, 10)."""

from __future__ import annotations

import pytest

from kvcontract.errors import UnknownTargetError
from kvcontract.impl import get_implementation
from kvcontract.impl.scheduler import StoreTracker, lookup_complete_chunks
from kvcontract.spec import HIT, HIT_PENDING, MISS, RETRY, Geometry, LookupResult, fa, swa
from kvcontract.spec import reachability as reach

REFERENCE = get_implementation("reference")


def _scan(
    impl_name: str, states: list[LookupResult], initial: int, window: int
) -> tuple[int | None, int]:
    calls: list[int] = []

    def lookup(k: int) -> LookupResult:
        calls.append(k)
        return states[k]

    found = get_implementation(impl_name).sliding_window_lookup(
        lookup, 0, len(states), initial, window
    )
    return found, len(calls)


@pytest.mark.parametrize(
    ("state", "expected", "lookups"),
    [(HIT, 3, 1), (HIT_PENDING, None, 1), (RETRY, None, 3), (MISS, 0, 3)],
)
def test_single_state_scans_count_lookups(
    state: LookupResult, expected: int | None, lookups: int
) -> None:
    assert _scan("reference", [state] * 3, 1, 1) == (expected, lookups)


def test_stale_pending_variant_defers_forever() -> None:
    states = [HIT, HIT, MISS, HIT_PENDING]
    assert _scan("reference", states, 2, 2)[0] == 2
    assert _scan("stale-pending", states, 2, 2)[0] is None


def test_two_group_load_sets() -> None:
    geometry = Geometry((fa(4), swa(4, 8)))
    outcome = lookup_complete_chunks(REFERENCE, geometry, 13, 0, lambda g, k: HIT)
    assert outcome.hit_tokens == 12
    assert outcome.load_ranges == {0: (0, 3), 1: (1, 3)}


def test_stale_pending_scheduler_form() -> None:
    # FA bs 4 + SWA bs 4, sw 8, 17 tokens; FA chunks 0-3 ready; SWA 0-1 ready, 2 missing, 3 pending
    geometry = Geometry((fa(4), swa(4, 8)))
    states = {0: [HIT] * 4, 1: [HIT, HIT, MISS, HIT_PENDING]}
    outcome = lookup_complete_chunks(REFERENCE, geometry, 17, 0, lambda g, k: states[g][k])
    assert outcome.hit_tokens == 8
    sizes = [hi - lo for lo, hi in outcome.load_ranges.values()]
    assert sizes == [2, 2]


def test_eagle_table() -> None:
    geometry = Geometry((swa(4, 8, eagle=True),))
    assert lookup_complete_chunks(REFERENCE, geometry, 9, 0, lambda g, k: HIT).hit_tokens == 4


@pytest.mark.parametrize("boundary", [3840, 3904, 3968])
@pytest.mark.parametrize("left", ["present", "missing", "pending"])
def test_unaligned_hit_matrix(boundary: int, left: str) -> None:
    # The bs-64 group of the upstream matrix on its own (the FA group of the upstream
    # test clamps to its 1024-token chunks, which the upstream fixture sidesteps).
    geometry = Geometry((swa(64, 128),), blocks_per_chunk=4)
    end = -(-boundary // 256)
    needs_left = ((boundary - 128 + 1) // 64) // 4 < end - 1
    left_state = {"present": HIT, "missing": MISS, "pending": HIT_PENDING}[left]

    def lookup(group: int, chunk: int) -> LookupResult:
        if group == 0 and chunk == end - 2:
            return left_state
        return HIT

    # Prompt 4353 as upstream; a budget makes `boundary` the largest candidate.
    outcome = lookup_complete_chunks(REFERENCE, geometry, 4353, 0, lookup, max_hit_tokens=boundary)
    if not needs_left or left == "present":
        assert outcome.hit_tokens == boundary
    elif left == "missing":
        assert outcome.hit_tokens is not None and outcome.hit_tokens < boundary
    else:
        assert outcome.hit_tokens is None


def test_prefill_horizon_numbers() -> None:
    geometry = Geometry((fa(36), swa(4, 16)))
    for name, total in (("reference", 135), ("prefill-horizon", 137)):
        tracker = StoreTracker(get_implementation(name), geometry, 1, 1200)
        first = tracker.step("prefilling", 0, 1000, 1000)
        assert first[-2:] == [248, 249]
        if name == "prefill-horizon":
            assert first[-4:] == [246, 247, 248, 249]
        tracker.step("prefilling", 1000, 200, 1200)
        assert len(tracker.offered) == total
    tracker = StoreTracker(REFERENCE, geometry, 1, 1200)
    tracker.step("prefilling", 0, 1000, 1000)
    assert tracker.step("aborted", 1000, 0, 1000) == [246, 247]


def test_unknown_variant() -> None:
    with pytest.raises(UnknownTargetError, match="choose one of"):
        get_implementation("nope")


# docs/CONTRACT.md section 10, upstream's EAGLE lookup tests (keys derived from the tokens).
@pytest.mark.parametrize(
    ("group", "num_tokens", "expected"),
    [
        ("swa", 9, 4),  # W + 1 = 3 needed, 2 keys: the prefix run of 2, popped to 1 chunk
        ("swa", 13, 8),  # 3 keys: widening capped, run of 3, popped to 2 chunks
        ("fa", 12, 8),  # no SWA group: no -1; prefix of 3 popped to 2
        ("fa", 4, 0),
    ],
)
def test_upstream_eagle_table(group: str, num_tokens: int, expected: int) -> None:
    spec = swa(4, 8, eagle=True) if group == "swa" else fa(4, eagle=True)
    outcome = lookup_complete_chunks(REFERENCE, Geometry((spec,)), num_tokens, 0, lambda g, k: HIT)
    assert outcome.hit_tokens == expected


def test_upstream_eagle_thirteen_tokens_four_keys() -> None:
    # Upstream's test gives the 13-token request 4 keys: the EAGLE group widens its query
    # to the 4th key, needs W + 1 = 3 present chunks, finds keys 1-3, pops one: 12 tokens.
    geometry = Geometry((swa(4, 8, eagle=True),))
    outcome = lookup_complete_chunks(
        REFERENCE, geometry, 13, 0, lambda g, k: HIT, num_keys={0: 4}
    )
    assert outcome.hit_tokens == 12
    assert len(outcome.lookups) == 3  # keys 3, 2, 1: the run completes before key 0
    assert sorted({k for _, k in outcome.lookups}) == [1, 2, 3]


# -- the replay boundaries the store path passes (docs/CONTRACT.md 5, 12) -----------------
REPLAY_GEOMETRIES = [
    Geometry((fa(16), swa(4, 8)), retention_interval=0),
    Geometry((fa(16), swa(4, 8, eagle=True)), retention_interval=0),
    Geometry((fa(16, eagle=True), swa(4, 8)), retention_interval=32),
    Geometry((fa(4), swa(8, 8, eagle=True)), blocks_per_chunk=2, retention_interval=0),
    Geometry((fa(16), swa(4, 8, eagle=True))),  # retention None: no replay boundary
    Geometry((fa(4), fa(8), swa(4, 8, eagle=True)), retention_interval=0),  # no A
    Geometry((swa(16, 128), fa(16, eagle=True)), blocks_per_chunk=4, retention_interval=0),
]


@pytest.mark.parametrize("geometry", REPLAY_GEOMETRIES, ids=lambda g: g.describe())
def test_store_replay_boundaries_are_the_spec_s(geometry: Geometry) -> None:
    """The reference's own rule (it imports no spec formula) equals the spec's vLLM GPU
    replay rule on every prompt length up to 300."""
    eagle = any(group.eagle for group in geometry.groups)
    for prompt in range(0, 300):
        assert REFERENCE.store_replay_boundaries(
            prompt, geometry.alignment_tokens, geometry.retention_interval, eagle,
        ) == reach.store_replay_boundaries(geometry, prompt), prompt


def test_store_replay_boundaries_on_every_small_alignment() -> None:
    """``A`` from 1 to 12 (FA ``bs A`` + SWA ``bs 1``), EAGLE or not, retention None, 0
    and ``4 A``, every ``P`` below 120 (``P = A`` included: both EAGLE boundaries are 0
    or below, only ``P - 1`` is passed)."""
    for align in range(1, 13):
        for eagle in (False, True):
            for retention in (None, 0, 4 * align):
                geometry = Geometry((fa(align), swa(1, 4, eagle=eagle)),
                                    retention_interval=retention)
                assert geometry.alignment_tokens == align
                for prompt in range(0, 120):
                    assert REFERENCE.store_replay_boundaries(
                        prompt, align, retention, eagle,
                    ) == reach.store_replay_boundaries(geometry, prompt), (geometry, prompt)


def test_store_tracker_passes_the_implementation_s_boundaries() -> None:
    """FA 16 + SWA 4 (sw 8, EAGLE), retention 0, P = 33: the reference passes
    ``(16, 32)`` (the GPU's EAGLE boundary ``32 - 16`` and ``P - 1``) and stores SWA chunks
    ``{2, 3, 4}`` for boundary 16 and ``{6, 7}`` of boundary 32's tail (its peek chunk 8
    is incomplete); upstream's ``_build_store_jobs`` passes ``(32,)``: ``{6, 7}`` only."""
    geometry = Geometry((fa(16), swa(4, 8, eagle=True)), retention_interval=0)
    offered = {}
    for name in ("reference", "upstream-current"):
        tracker = StoreTracker(get_implementation(name), geometry, 1, 33)
        tracker.step("prefilling", 0, 33, 33)
        tracker.step("finished", 33, 0, 34)
        offered[name] = (tracker.replay_boundaries, sorted(tracker.offered))
    assert offered == {"reference": ((16, 32), [2, 3, 4, 6, 7]),
                       "upstream-current": ((32,), [6, 7])}
    pinned = StoreTracker(REFERENCE, geometry, 1, 33, replay_boundaries=())
    assert pinned.replay_boundaries == ()
