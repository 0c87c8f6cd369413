"""The tensor-backed offloading system: state machine, worker, oracles, end to end."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kvcontract.impl.system import (
    ChunkBook,
    ChunkNotFoundError,
    ChunkNotReadyError,
    ChunkState,
    KVLayout,
    MockedOffloadManager,
    OffloadSystem,
    SystemConfig,
    expected_kv,
    window_decode_attention,
)
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lookup import LookupResult

REFERENCE = get_implementation("reference")


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


def _producer_consumer(name: str, tensor_backed: bool) -> OffloadSystem:
    system = OffloadSystem(
        SystemConfig(Geometry((fa(64), swa(16, 32, 3))), get_implementation(name), tensor_backed)
    )
    tokens = [(i * 7) % 50 for i in range(65)]
    system.add_request("p", tokens, 1)
    for _ in range(4):
        system.step(40)
    system.drain()
    system.add_request("c", [*tokens, 3], 1)
    for _ in range(4):
        system.step(40)
    system.drain()
    return system


@pytest.mark.parametrize("tensor_backed", [False, True])
def test_reference_end_to_end_is_clean(tensor_backed: bool) -> None:
    system = _producer_consumer("reference", tensor_backed)
    assert system.violations == []
    assert any(line.startswith("lookup c hit=64") for line in system.log)
    if tensor_backed:
        assert system.checks["C11"] > 0


def test_mtp_variant_crashes_on_real_load() -> None:
    system = _producer_consumer("mtp-extra-retained", True)
    crashes = [v for v in system.violations if v.kind == "crash"]
    assert crashes and "not found in cache" in crashes[0].message


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
    system = OffloadSystem(SystemConfig(Geometry((fa(4), swa(4, 8))), REFERENCE, True))
    tokens = list(range(17))
    for g in (0, 1):
        for k in range(4):
            system.install_chunk(tokens, g, k, ChunkState.READY)
    slot = system.manager.slot(system.chunk_key(tokens, 1, 2))
    assert isinstance(system.manager.chunks, list)
    system.manager.chunks[1][slot].add_(1.0)
    system.add_request("c", tokens, 1)
    system.step(64)
    system.step(64)
    assert any(v.clause == "C11" for v in system.violations)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_end_to_end() -> None:
    system = OffloadSystem(
        SystemConfig(Geometry((fa(64), swa(16, 32, 3))), REFERENCE, True, device="cuda")
    )
    tokens = [(i * 7) % 50 for i in range(65)]
    system.add_request("p", tokens, 1)
    for _ in range(4):
        system.step(40)
    system.drain()
    system.add_request("c", [*tokens, 3], 1)
    for _ in range(4):
        system.step(40)
    system.drain()
    assert system.violations == [] and system.checks["C11"] > 0
