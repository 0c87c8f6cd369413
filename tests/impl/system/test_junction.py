"""Shared-prefix junctions in the executable system (docs/CONTRACT.md 9.3).

vLLM 0.34.0's numbers (FA bs 16 + SWA bs 4, sw 8, retention 0): a 53-token producer
stores FA chunks 0-2 and SWA 10-11; a first consumer of 59 tokens sharing 40 is served
FA 0-1 (boundary 32) but not the window at 32, so its hit is 0 and it registers the
junction 32 and stores SWA 6-7; a second consumer of 43 tokens sharing 40 hits 32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from kvcontract.impl.scheduler import StoreTracker
from kvcontract.impl.system import Event, LookupEvent, OffloadSystem, StoreEvent, SystemConfig
from kvcontract.impl.system.engine import GroupStorePath, JunctionStorePath
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.tools.harness import FIXTURE_OPERATIONS, SystemHarness
from kvcontract.tools.monitor import Monitor

REFERENCE = get_implementation("reference")
GEOMETRY = Geometry((fa(16), swa(4, 8)), retention_interval=0)


def _tokens(length: int, salt: int) -> list[int]:
    return [(i * 7 + salt * 13 + (i * i) % 11) % 50 for i in range(length)]


PRODUCER = _tokens(53, 0)
FIRST = PRODUCER[:40] + _tokens(19, 7)
SECOND = PRODUCER[:40] + _tokens(3, 9)


class Run:
    """The producer, the first and the second consumer on one system, every event kept."""

    def __init__(self, impl: Any = REFERENCE, geometry: Geometry = GEOMETRY,
                 tensor_backed: bool = False, store_path: Any = None) -> None:
        self.system = OffloadSystem(SystemConfig(geometry, impl, tensor_backed=tensor_backed,
                                                 store_path=store_path))
        self.monitor = Monitor.attach(self.system)
        self.harness = SystemHarness(self.system)
        self.events: list[Event] = []
        self.system.subscribe(self.events.append)

    def op(self, name: str, *args: Any) -> None:
        target = self.harness if name in FIXTURE_OPERATIONS else self.system
        getattr(target, name)(*args)

    def request(self, rid: str, tokens: list[int], steps: int = 3) -> None:
        self.op("add_request", rid, tokens, 1)
        for _ in range(steps):
            self.op("step", 64)
        self.op("drain")
        self.op("evict_gpu_cache")

    def all_three(self) -> Run:
        self.request("producer", PRODUCER)
        self.request("first", FIRST)
        self.request("second", SECOND)
        return self

    def lookup(self, rid: str) -> LookupEvent:
        return next(e for e in self.events
                    if isinstance(e, LookupEvent) and e.request == rid and e.hit is not None)

    def offered(self, rid: str, group: int) -> set[int]:
        return {c for e in self.events if isinstance(e, StoreEvent) and e.request == rid
                and e.group == group for c in e.offered}

    def store_junctions(self, rid: str) -> set[int]:
        return {e.junction for e in self.events
                if isinstance(e, StoreEvent) and e.request == rid}


@pytest.mark.parametrize("tensor_backed", [False, True])
def test_a_cut_hit_registers_the_junction_and_the_next_request_reads_at_it(
        tensor_backed: bool) -> None:
    run = Run(tensor_backed=tensor_backed).all_three()
    first = run.lookup("first")
    assert (first.hit, first.full_attention_boundary, first.junction) == (0, 32, 32)
    assert run.system.requests["first"].junction == 32
    # Its store path was handed the junction and stored the window at 32 (SWA 6-7)
    # besides its own replay boundary's (58 -> 48: SWA 10-11).
    assert run.store_junctions("first") == {32}
    assert run.offered("first", 1) == {6, 7, 10, 11}
    assert run.offered("producer", 1) == {10, 11}
    second = run.lookup("second")
    assert second.hit == 32 and dict(second.load_ranges) == {0: (0, 2), 1: (6, 8)}
    assert run.monitor.violations == []
    assert run.monitor.checks["C12"] >= 3
    if tensor_backed:
        assert run.monitor.checks["C11"] > 0  # the bytes loaded at the junction


def test_without_a_junction_the_next_request_is_cut_again() -> None:
    """vLLM 0.33.0's connector registers none: the window at 32 is never stored."""
    run = Run(get_implementation("no-shared-prefix-junction")).all_three()
    assert run.lookup("first").junction == 0
    assert run.offered("first", 1) == {10, 11}
    assert run.lookup("second").hit == 0
    found = [(v.clause, v.kind, v.witness["request"]) for v in run.monitor.violations]
    assert ("C12", "junction", "first") in found
    assert {clause for clause, _, _ in found} == {"C12"}


def test_the_implementation_decides_from_the_lookup_s_inputs() -> None:
    """The system calls the implementation's rule with the full-attention boundary the
    lookup saw, the local hit, the external hit past it and the retention interval."""
    calls: list[tuple[Any, ...]] = []

    def spy(*args: Any) -> int:
        calls.append(args)
        return int(REFERENCE.shared_prefix_junction(*args))

    impl = dataclasses.replace(REFERENCE, name="spy", shared_prefix_junction=spy)
    Run(impl).all_three()
    assert (32, 0, 0, 0) in calls  # the first consumer
    assert (32, 0, 32, 0) in calls  # the second: its hit reaches the boundary


def test_without_a_retention_interval_nothing_is_registered() -> None:
    run = Run(geometry=Geometry((fa(16), swa(4, 8)))).all_three()
    assert all(e.junction == 0 for e in run.events
               if isinstance(e, LookupEvent) and e.hit is not None)
    assert run.store_junctions("first") == {0}
    assert run.monitor.violations == []


def test_a_later_lookup_replaces_the_junction() -> None:
    """vLLM sets the request's junction again at every admission: a preempted request
    whose next lookup is served its whole boundary registers none."""
    run = Run()
    run.request("producer", PRODUCER)
    run.op("add_request", "first", FIRST, 4)
    run.op("step", 64)
    assert run.system.requests["first"].trackers[1].junction == 32
    run.op("drain")
    run.op("preempt", "first")
    run.op("evict_gpu_cache")
    run.op("step", 64)
    again = [e for e in run.events if isinstance(e, LookupEvent) and e.request == "first"]
    assert again[-1].hit == 48 and again[-1].junction == 0
    tracker = run.system.requests["first"].trackers[1]
    assert isinstance(tracker, StoreTracker) and tracker.junction == 0
    assert run.monitor.violations == []


class _NoJunction:
    """A plugged store path that cannot take a junction (the audit's adapter of
    upstream's builder is one)."""

    def __init__(self, tracker: StoreTracker) -> None:
        self._tracker = tracker

    @property
    def offered(self) -> set[int]:
        return self._tracker.offered

    @property
    def next_stored_chunk_idx(self) -> int:
        return self._tracker.next_stored_chunk_idx

    def step(self, status: Any, num_computed: int, num_scheduled: int,
             num_tokens: int) -> list[int]:
        return self._tracker.step(status, num_computed, num_scheduled, num_tokens)

    def mark_computed(self, num_chunks: int) -> None:
        self._tracker.mark_computed(num_chunks)


def _plugged(geometry: Geometry, prompt_len: int, prompt_only: bool) -> Sequence[GroupStorePath]:
    return [_NoJunction(StoreTracker(REFERENCE, geometry, g, prompt_len,
                                     offload_prompt_only=prompt_only))
            for g in range(len(geometry.groups))]


def test_a_plugged_path_without_junctions_is_handed_none() -> None:
    """The lookup still registers (and reports) the junction; the path is handed none,
    its events say so, and its stores are judged without one."""
    assert isinstance(StoreTracker(REFERENCE, GEOMETRY, 1, 8), JunctionStorePath)
    assert not isinstance(_plugged(GEOMETRY, 8, True)[1], JunctionStorePath)
    run = Run(store_path=_plugged).all_three()
    assert run.lookup("first").junction == 32
    assert run.store_junctions("first") == {0}
    assert run.offered("first", 1) == {10, 11}
    assert run.lookup("second").hit == 0
    assert run.monitor.violations == []


def test_a_recovered_request_keeps_its_junction_until_it_looks_up_again() -> None:
    """A failed load restarts the request's store paths (C15): the new ones are handed
    the junction the request holds, and its next lookup decides again."""
    from kvcontract.impl.system import ChunkState

    run = Run()
    for group, chunks in ((0, (0, 1, 2)), (1, (2, 3))):
        for chunk in chunks:
            run.op("install_chunk", FIRST, group, chunk, ChunkState.READY)
    run.op("fail_next_load")
    run.op("add_request", "first", FIRST, 1)
    run.op("step", 64)
    first = run.lookup("first")
    assert (first.hit, first.junction) == (16, 48)
    before = run.system.requests["first"].trackers[1]
    run.op("drain")  # the load fails: recovery
    request = run.system.requests["first"]
    assert request.trackers[1] is not before and request.junction == 48
    assert all(isinstance(t, StoreTracker) and t.junction == 48
               for t in request.trackers.values())
    run.op("step", 64)
    assert run.monitor.violations == []


def test_a_gpu_prefix_hit_counts_toward_the_cut_hit() -> None:
    """With a local GPU hit ``L`` the rule gets the external hit past ``L``: FA is
    served to 32 from the offload tier after ``L = 16``, the window at 32 is missing, so
    the accepted hit is ``L`` and the junction 32 (``32 > 16 + 0``)."""
    from kvcontract.impl.system import ChunkState

    calls: list[tuple[Any, ...]] = []

    def spy(*args: Any) -> int:
        calls.append(args)
        return int(REFERENCE.shared_prefix_junction(*args))

    run = Run(dataclasses.replace(REFERENCE, name="spy", shared_prefix_junction=spy))
    run.op("add_request", "warm", FIRST[:20], 1)
    for _ in range(3):
        run.op("step", 64)
    run.op("drain")
    for chunk in (0, 1):
        run.op("install_chunk", FIRST, 0, chunk, ChunkState.READY)
    run.op("add_request", "first", FIRST, 1)
    run.op("step", 64)
    first = run.lookup("first")
    assert (first.local_hit, first.hit, first.full_attention_boundary) == (16, 16, 32)
    assert first.junction == 32 and calls[-1] == (32, 16, 0, 0)
    assert run.monitor.violations == []


def test_an_eagle_proposal_no_scan_confirmed_registers_no_junction() -> None:
    """A full-attention EAGLE group (legacy hashes) proposes a chunk less unscanned when
    its peek chunk has no key: nothing stored serves that proposal, so the first
    request registers nothing (the spec's full-attention boundary is 0)."""
    run = Run(geometry=Geometry((fa(4, eagle=True), swa(4, 8)), retention_interval=0))
    run.request("producer", PRODUCER[:17])
    first = run.lookup("producer")
    assert (first.hit, first.full_attention_boundary, first.junction) == (0, None, 0)
    assert run.monitor.violations == [] and run.monitor.checks["C12"] == 1
