"""The tensor-backed offloading system: state machine, worker, oracles, end to end.

The system judges nothing: each test attaches a :class:`Monitor` (the judge) and records
the system's events, and asserts on those (never on the decision log's text); fixtures
go through :class:`SystemHarness`.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcontract.errors import GeometryError, KvContractError, UsageError
from kvcontract.impl.system import (
    ChunkBook,
    ChunkNotFoundError,
    ChunkNotReadyError,
    ChunkState,
    Event,
    KVLayout,
    LoadCrashEvent,
    LoadError,
    LookupEvent,
    MockedOffloadManager,
    OffloadSystem,
    RestoreEvent,
    StoreEvent,
    SystemConfig,
    expected_kv,
    window_decode_attention,
)
from kvcontract.impl.system.engine import Phase
from kvcontract.impl.variants import get_implementation
from kvcontract.spec import multigroup
from kvcontract.spec.geometry import Geometry, fa, mamba, swa
from kvcontract.spec.lookup import LookupResult
from kvcontract.spec.reachability import RequestStatus
from kvcontract.tools.harness import SystemHarness
from kvcontract.tools.monitor import Monitor

REFERENCE = get_implementation("reference")


@dataclass
class Rig:
    """A system, the monitor judging it, its fixtures and every event it emitted."""

    system: OffloadSystem
    monitor: Monitor
    harness: SystemHarness
    events: list[Event] = field(default_factory=list)

    def lookups(self, rid: str) -> list[LookupEvent]:
        return [e for e in self.events if isinstance(e, LookupEvent) and e.request == rid]

    def accepted(self, rid: str) -> LookupEvent:
        """The request's first lookup that did not defer."""
        return next(e for e in self.lookups(rid) if e.hit is not None)

    def stores(self, rid: str) -> list[StoreEvent]:
        return [e for e in self.events if isinstance(e, StoreEvent) and e.request == rid]


def rig(config: SystemConfig) -> Rig:
    system = OffloadSystem(config)
    monitored = Rig(system, Monitor.attach(system), SystemHarness(system))
    system.subscribe(monitored.events.append)
    return monitored


def test_state_machine_transitions() -> None:
    book = ChunkBook(2)
    assert book.lookup("a") is LookupResult.MISS
    plan = book.prepare_store(["a", "b"])
    assert plan is not None and plan.keys == ("a", "b")
    assert book.lookup("a") is LookupResult.HIT_PENDING
    with pytest.raises(ChunkNotReadyError, match="is not ready for reading"):
        book.prepare_load(["a"])
    with pytest.raises(ChunkNotFoundError, match="not found in cache"):
        book.prepare_load(["c"])
    book.complete_store(["a"], success=True)
    book.complete_store(["b"], success=False)
    assert book.state("a") is ChunkState.READY and book.state("b") is ChunkState.ABSENT
    book.prepare_load(["a"])
    assert book.ref_count("a") == 1
    assert book.prepare_store(["c", "d"]) is None  # "a" is pinned: no room for two
    book.complete_load(["a"])
    plan = book.prepare_store(["c", "d"])
    assert plan is not None and plan.evicted == ("a",)
    book.reset()
    assert book.keys() == []


def test_lru_eviction_order() -> None:
    book = ChunkBook(2)
    for key in ("a", "b"):
        book.prepare_store([key])
        book.complete_store([key], success=True)
    book.prepare_load(["a"])
    book.complete_load(["a"])  # "a" is now the most recently used
    plan = book.prepare_store(["c"])
    assert plan is not None and plan.evicted == ("b",)


def test_scripted_mock() -> None:
    mock = MockedOffloadManager(4, script={"k": LookupResult.RETRY})
    assert mock.lookup("k") is LookupResult.RETRY
    assert mock.lookup("other") is LookupResult.MISS


@settings(max_examples=25)
@given(st.integers(0, 3), st.integers(0, 200), st.integers(0, 49))
def test_oracle_is_deterministic(group: int, position: int, token: int) -> None:
    layout = KVLayout()
    one = expected_kv(layout, group, torch.tensor([position]), torch.tensor([token]))
    two = expected_kv(layout, group, torch.tensor([position]), torch.tensor([token]))
    assert torch.equal(one, two)
    other = expected_kv(layout, group, torch.tensor([position + 1]), torch.tensor([token]))
    assert not torch.equal(one, other)


def test_attention_oracle_window_mask() -> None:
    keys = torch.randn(6, 1, 4)
    values = torch.randn(6, 1, 4)
    query = torch.randn(1, 4)
    positions = torch.arange(6)
    out = window_decode_attention(query, keys, values, positions, 5, 2)
    changed = keys.clone()
    changed[0] += 10  # position 0 is outside the window [4, 5]
    assert torch.equal(out, window_decode_attention(query, changed, values, positions, 5, 2))


def _producer_consumer(name: str, tensor_backed: bool) -> Rig:
    r = rig(
        SystemConfig(Geometry((fa(64), swa(16, 32, 3))), get_implementation(name), tensor_backed)
    )
    system = r.system
    tokens = [(i * 7) % 50 for i in range(65)]
    system.add_request("p", tokens, 1)
    for _ in range(4):
        system.step(40)
    system.drain()
    r.harness.evict_gpu_cache()  # the consumer must hit the CPU, not the GPU prefix cache
    system.add_request("c", [*tokens, 3], 1)
    for _ in range(4):
        system.step(40)
    system.drain()
    return r


@pytest.mark.parametrize("tensor_backed", [False, True])
def test_reference_end_to_end_is_clean(tensor_backed: bool) -> None:
    r = _producer_consumer("reference", tensor_backed)
    assert r.monitor.violations == []
    lookup = r.accepted("c")
    assert (lookup.local_hit, lookup.hit) == (0, 64)
    assert r.monitor.checks["C2"] == 1 and r.monitor.checks["C1"] > 0
    if tensor_backed:
        assert r.monitor.checks["C11"] > 0
        restores = [e for e in r.events if isinstance(e, RestoreEvent)]
        assert restores and all(e.positions_match for e in restores)
    else:
        assert r.monitor.checks["C11"] == 0  # no bytes without tensors


def test_mtp_variant_crashes_on_real_load() -> None:
    r = _producer_consumer("mtp-extra-retained", True)
    crashes = [e for e in r.events if isinstance(e, LoadCrashEvent)]
    assert [(e.request, e.error) for e in crashes] == [("c", LoadError.NOT_FOUND)]
    judged = [v for v in r.monitor.violations if v.kind == "crash"]
    assert [v.clause for v in judged] == ["C2"]
    assert judged[0].witness["request"] == "c" and judged[0].witness["hit"] == crashes[0].hit


def test_pending_until_acknowledged() -> None:
    system = OffloadSystem(
        SystemConfig(Geometry((fa(4), swa(4, 8))), REFERENCE, True, delay_steps=2)
    )
    tokens = list(range(17))
    system.add_request("p", tokens, 3)
    system.step(64)
    system.step(1)  # store job submitted now; completes two polls later
    key = system.chunk_key(tokens, 0, 0)
    assert system.manager.state(key) is ChunkState.PENDING
    system.step(1)
    system.step(1)
    assert system.manager.state(key) is ChunkState.READY


def test_byte_corruption_is_caught() -> None:
    r = rig(SystemConfig(Geometry((fa(4), swa(4, 8))), REFERENCE, True))
    system = r.system
    tokens = list(range(17))
    for g in (0, 1):
        for k in range(4):
            r.harness.install_chunk(tokens, g, k, ChunkState.READY)
    slot = system.manager.slot(system.chunk_key(tokens, 1, 2))
    assert isinstance(system.manager.chunks, list)
    system.manager.chunks[1][slot].add_(1.0)
    system.add_request("c", tokens, 1)
    system.step(64)
    system.step(64)
    # SWA chunk 2 holds positions 8..11, the first retained ones at hit 16 (Ret(16)).
    bad = [e for e in r.events if isinstance(e, RestoreEvent) and not e.positions_match]
    assert [(e.group, e.hit, e.lo, e.first_bad) for e in bad] == [(1, 16, 8, 8)]
    assert [(v.clause, v.kind, v.witness["position"]) for v in r.monitor.violations] == [
        ("C11", "bytes", 8)
    ]


def _tokens(n: int, salt: int = 0) -> list[int]:
    return [(i * 7 + salt * 13 + (i * i) % 11) % 50 for i in range(n)]


def _run(system: OffloadSystem, rid: str, tokens: list[int], budget: int, steps: int) -> None:
    system.add_request(rid, tokens, 1)
    for _ in range(steps):
        system.step(budget)
    system.drain()


@pytest.mark.parametrize("tensor_backed", [False, True])
def test_gpu_prefix_hit_then_external_hit(tensor_backed: bool) -> None:
    geometry = Geometry((fa(16), swa(4, 8, 1)), blocks_per_chunk=2)
    r = rig(SystemConfig(geometry, REFERENCE, tensor_backed))
    system = r.system
    tokens = _tokens(97)
    _run(system, "producer", tokens, 35, 6)
    r.harness.evict_gpu_cache()
    _run(system, "warm", tokens[:40], 64, 3)  # leaves a GPU prefix of 32 tokens
    _run(system, "consumer", tokens, 64, 4)
    lookup = r.accepted("consumer")
    # Load(96, 32): the FA group loads chunks 1-2 (chunk 0 is local); the SWA window of
    # 96 starts at token 88 (block 22, chunk 11) - nothing of it is local.
    assert (lookup.local_hit, lookup.hit) == (32, 96)
    assert dict(lookup.load_ranges) == {0: (1, 3), 1: (11, 12)}
    assert r.monitor.violations == []
    if tensor_backed:
        assert r.monitor.checks["C11"] > 0


def test_gpu_prefix_hit_needs_only_the_retained_window() -> None:
    geometry = Geometry((fa(16), swa(4, 8)))
    r = rig(SystemConfig(geometry, REFERENCE, True))
    system = r.system
    tokens = _tokens(65)
    _run(system, "producer", tokens, 64, 3)
    pool = system.pools[1]
    # Drop SWA blocks outside Ret(64) = [14, 16) and Ret(48) = [10, 12) from the GPU
    # cache: still a local hit of 64.
    for block in (*range(10), 12, 13):
        prefix = system.requests["producer"].prefix_hashes[block]
        pool.hash_of.pop(pool.cached.pop(prefix))
    _run(system, "again", tokens, 64, 3)
    again = r.accepted("again")
    assert (again.local_hit, again.hit) == (64, 64)
    # Dropping block 15 (inside the window) loses the local hit at 64; the CPU serves it.
    prefix = system.requests["producer"].prefix_hashes[15]
    pool.hash_of.pop(pool.cached.pop(prefix))
    _run(system, "third", tokens, 64, 3)
    third = r.accepted("third")
    assert (third.local_hit, third.hit) == (48, 64)
    assert r.monitor.violations == []


def test_eagle_local_hit_needs_the_peek_block() -> None:
    geometry = Geometry((fa(4), swa(4, 8, eagle=True)))
    r = rig(SystemConfig(geometry, REFERENCE, False))
    system = r.system
    tokens = _tokens(20)
    _run(system, "producer", tokens[:13], 64, 3)  # caches blocks 0..2 of the prefix
    system.add_request("consumer", tokens, 1)
    system.step(64)
    # L = 12 would need block 3 (the peek) cached; only 0..2 are: L = 8.
    assert r.accepted("consumer").local_hit == 8
    assert r.monitor.violations == []


def test_finish_during_prefill_is_ignored() -> None:
    r = rig(SystemConfig(Geometry((fa(4), swa(4, 8))), REFERENCE, True))
    system = r.system
    system.add_request("r", [13, 21, 31, 43], 1)
    system.step(1)
    system.finish("r")
    # Ignored: still running with one token computed, and no final store step.
    assert system.requests["r"].phase is Phase.RUNNING
    assert system.requests["r"].num_computed == 1
    assert {e.status for e in r.stores("r")} == {RequestStatus.PREFILLING}
    system.abort("r")
    system.drain()
    assert system.requests["r"].phase is Phase.DONE
    assert [e.status for e in r.stores("r")][-2:] == [RequestStatus.ABORTED] * 2
    assert r.monitor.violations == []


def test_finish_of_a_waiting_request_is_ignored() -> None:
    r = rig(SystemConfig(Geometry((fa(4), swa(4, 8))), REFERENCE, True))
    system = r.system
    system.add_request("r", [13, 21, 31, 43], 1)
    system.finish("r")  # never scheduled: only an abort ends it (as in vLLM's engine)
    assert system.requests["r"].phase is Phase.WAITING
    assert system.log[-1] == "finish r ignored (waiting, prompt not computed)"
    system.step(64)
    system.finish("r")
    assert system.requests["r"].phase is Phase.DONE


@pytest.mark.parametrize("tensor_backed", [False, True])
def test_failed_store_loses_nothing_else(tensor_backed: bool) -> None:
    geometry = Geometry((fa(8), swa(4, 8)))
    r = rig(SystemConfig(geometry, REFERENCE, tensor_backed, delay_steps=2))
    system = r.system
    tokens = _tokens(33)
    system.add_request("producer", tokens, 1)
    system.step(16)
    r.harness.fail_next_store()  # the FA job of step 2 (chunks 2 and 3) fails
    for _ in range(4):
        system.step(16)
    system.drain()
    states = [system.manager.state(system.chunk_key(tokens, 0, k)) for k in range(4)]
    # The failed job's chunks are absent again (never half-written and readable); the
    # chunks of other jobs are untouched.
    assert states == [ChunkState.READY] * 2 + [ChunkState.ABSENT] * 2
    r.harness.evict_gpu_cache()
    _run(system, "consumer", tokens, 64, 4)
    assert r.monitor.violations == []
    if tensor_backed:
        assert r.monitor.checks["C11"] > 0


def test_eviction_pressure_and_abort_keep_chunks_intact() -> None:
    geometry = Geometry((fa(8), swa(4, 8)), blocks_per_chunk=2)
    r = rig(SystemConfig(geometry, REFERENCE, True, capacity_chunks=12))
    system = r.system
    for i in range(4):
        system.add_request(f"p{i}", _tokens(70, i), 1)
        system.step(30)
        if i % 2:
            system.abort(f"p{i}")
        for _ in range(4):
            system.step(30)
    system.drain()
    assert any(e.evicted > 0 for e in r.events if isinstance(e, StoreEvent))
    r.harness.evict_gpu_cache()
    for i in (3, 2, 1, 0):  # newest first: the LRU kept the latest producers' chunks
        system.add_request(f"c{i}", _tokens(70, i), 1)
        for _ in range(4):
            system.step(64)
    system.drain()
    # Every load that happened was checked byte for byte and by the attention oracle.
    assert r.monitor.violations == []
    assert r.monitor.checks["C11"] > 0


def test_perturbed_left_chunk_states() -> None:
    geometry = Geometry((fa(16), swa(4, 8)))
    outcomes: dict[str, int | None] = {}
    for state in ("absent", "pending", "loading", "stale"):
        r = rig(SystemConfig(geometry, REFERENCE, True))
        tokens = _tokens(65)
        _run(r.system, "producer", tokens, 35, 4)
        r.harness.evict_gpu_cache()
        r.harness.perturb_left_chunk(tokens, state)
        _run(r.system, "consumer", tokens, 64, 3)
        outcomes[state] = r.lookups("consumer")[0].hit
        assert r.monitor.violations == []
        assert r.monitor.checks["C3"] >= 1
    assert outcomes["absent"] == 48  # the next window down
    # Seed 000's shape: the pending last chunk is outside the window of 48 (a MISS lies
    # between them), so it does not defer the hit.
    assert outcomes["stale"] == 48
    assert outcomes["pending"] is None and outcomes["loading"] is None  # deferred


def test_stale_shape_catches_the_stale_pending_variant() -> None:
    r = rig(
        SystemConfig(Geometry((fa(16), swa(4, 8))), get_implementation("stale-pending"), True)
    )
    tokens = _tokens(65)
    _run(r.system, "producer", tokens, 35, 4)
    r.harness.evict_gpu_cache()
    r.harness.perturb_left_chunk(tokens, "stale")
    _run(r.system, "consumer", tokens, 64, 3)
    first = r.lookups("consumer")[0]
    assert (first.local_hit, first.hit) == (0, None)  # deferred
    assert {(v.clause, v.kind) for v in r.monitor.violations} == {("C3", "lookup")}
    # The reference answers 48 on these states (test_perturbed_left_chunk_states).
    assert r.monitor.violations[0].witness["spec"] == 48


def test_system_mamba_geometry_clean() -> None:
    geometry = Geometry((swa(8, 16, 1), mamba(8)), blocks_per_chunk=2)
    r = rig(SystemConfig(geometry, REFERENCE, True))
    tokens = _tokens(81)
    _run(r.system, "producer", tokens, 37, 5)
    r.harness.evict_gpu_cache()
    _run(r.system, "consumer", tokens, 64, 4)
    assert r.monitor.violations == [] and r.monitor.checks["C2"] == 1


def test_the_system_imports_no_spec_formula() -> None:
    # Observer, not self-check: the system may name the geometry and the vocabulary, never
    # a formula it could judge itself with (the monitor in kvcontract.tools does that).
    from kvcontract.impl.system import engine, events, oracle

    for module in (engine, events, oracle):
        imported: set[tuple[str, str]] = set()
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Import):
                imported |= {(a.name, "") for a in node.names if "spec" in a.name}
            elif isinstance(node, ast.ImportFrom) and "spec" in (node.module or ""):
                imported |= {(str(node.module), a.name) for a in node.names}
        # The lifecycle's words (states, causes, job lines, the configured bound D) are
        # vocabulary; its formulas (deferral_age, within_deferral_bound) are not allowed.
        lifecycle_words = {"DEFAULT_DEFERRAL_BOUND", "DeferCause", "JobEvent", "JobKind",
                           "RequestState", "StaleReason"}
        allowed = {("kvcontract.spec.geometry", "Geometry"),
                   ("kvcontract.spec.geometry", "GroupSpec"),
                   *(("kvcontract.spec.lifecycle", name) for name in lifecycle_words)}
        assert imported <= allowed, (module.__name__, imported - allowed)


def test_bad_configuration_and_input() -> None:
    geometry = Geometry((fa(4), swa(4, 8)))
    with pytest.raises(GeometryError):
        SystemConfig(geometry, REFERENCE, capacity_chunks=0)
    with pytest.raises(GeometryError):
        SystemConfig(geometry, REFERENCE, delay_steps=-1)
    with pytest.raises(UsageError):
        SystemConfig(geometry, REFERENCE, device="tpu")
    with pytest.raises(UsageError):
        SystemConfig(cast(Any, "FA4"), REFERENCE)
    system = OffloadSystem(SystemConfig(geometry, REFERENCE, False))
    for bad in ([], [1, 2, 500], ["a"]):
        with pytest.raises(UsageError):
            system.add_request("r", cast(Any, bad))
    with pytest.raises(UsageError):
        system.add_request("r", [1, 2], max_new_tokens=0)
    system.add_request("r", [1, 2, 3])
    with pytest.raises(UsageError):
        system.add_request("r", [1, 2, 3])
    with pytest.raises(UsageError):
        system.step(0)
    with pytest.raises(KvContractError):
        SystemHarness(system).perturb_left_chunk([1, 2, 3], "broken")
    assert multigroup.initial_max_hit(geometry, 3) == 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_store_held_back_is_hit_pending() -> None:
    # A GPU-side delay on the compute stream holds the store job (its side stream waits
    # for the compute stream): the chunk must read HIT_PENDING until the job's event has
    # completed and the scheduler has acknowledged it.
    geometry = Geometry((fa(4), swa(4, 8)))
    r = rig(SystemConfig(geometry, REFERENCE, True, device="cuda", delay_steps=1))
    system = r.system
    tokens = _tokens(17)
    system.add_request("p", tokens, 3)
    system.step(64)  # builds the store jobs of the prompt
    torch.cuda._sleep(200_000_000)  # type: ignore[no-untyped-call]  # GPU-side delay
    system.step(1)  # submits the jobs behind the sleep
    jobs = list(system.worker.queues["store"])
    events = [cast(Any, job.event) for job in jobs if job.event is not None]
    assert events and any(not event.query() for event in events)
    key = system.chunk_key(tokens, 0, 0)
    assert system.manager.lookup(key) is LookupResult.HIT_PENDING
    system.drain()
    assert system.manager.lookup(key) is LookupResult.HIT
    assert r.monitor.violations == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_end_to_end() -> None:
    r = rig(SystemConfig(Geometry((fa(64), swa(16, 32, 3))), REFERENCE, True, device="cuda"))
    system = r.system
    tokens = [(i * 7) % 50 for i in range(65)]
    system.add_request("p", tokens, 1)
    for _ in range(4):
        system.step(40)
    system.drain()
    r.harness.evict_gpu_cache()
    system.add_request("c", [*tokens, 3], 1)
    for _ in range(4):
        system.step(40)
    system.drain()
    checks = r.monitor.checks
    assert r.monitor.violations == [] and checks["C11"] > 0 and checks["C2"] == 1


@pytest.mark.parametrize(("name", "hit"), [("reference", 16), ("upstream-current", 0)])
def test_eagle_resend_gets_the_gpu_replay_boundary(name: str, hit: int) -> None:
    """FA 16 + SWA 4 (sw 8, EAGLE), retention 0, P = 33: the engine's store path passes
    the implementation's replay boundaries. The reference's (vLLM's GPU rule) store SWA
    chunks ``{2, 3, 4}`` for the EAGLE boundary 16, and the resend hits 16; upstream's
    ``P - 1`` alone stores ``{6, 7}``, whose peek chunk 8 never completes: no hit, and
    the monitor reports the chunks the spec's mask stores and upstream did not."""
    geometry = Geometry((fa(16), swa(4, 8, eagle=True)), retention_interval=0)
    r = rig(SystemConfig(geometry, get_implementation(name), False))
    tokens = [(i * 7) % 50 for i in range(33)]
    for rid in ("p", "c"):
        r.system.add_request(rid, tokens, 1)
        for _ in range(4):
            r.system.step(40)
        r.system.drain()
        r.harness.evict_gpu_cache()  # the resend must hit the CPU
    assert r.accepted("c").hit == hit
    missing = [v for v in r.monitor.violations if "missing [2, 3, 4]" in v.message]
    assert bool(missing) == (name != "reference")
    if name == "reference":
        assert r.monitor.violations == []
