"""Every geometry vLLM builds, built live (live/build.py): ``e > 0`` from an MTP drafter
as vLLM plans it, the refusals with their reasons (another plan, DCP), and what the
build adapts to the installed release, each keyed on the capability it detects."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from kvcontract.live import build as build_module
from kvcontract.live.build import (
    BuildOptions,
    LiveEngine,
    Refused,
    build,
    extra_retained,
    unsupported,
)
from kvcontract.live.capabilities import vllm_names
from kvcontract.live.confirm import confirm
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.reachability import group_stored_chunks
from tests.live.conftest import has, needs_vllm

pytestmark = [needs_vllm, pytest.mark.live]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _engine(geometry: Geometry, options: BuildOptions | None = None) -> LiveEngine:
    engine = build(geometry, options)
    assert isinstance(engine, LiveEngine), getattr(engine, "reason", engine)
    engine.scheduler.shutdown()
    return engine


@pytest.mark.parametrize("e", [1, 3])
def test_extra_retained_tokens_come_from_an_mtp_drafter(e: int) -> None:
    """vLLM tags every sliding-window spec with num_prefill_lookahead_tokens - 1, which
    is k for multi-module MTP: k = e + 1 speculative tokens plan the geometry's e."""
    geometry = Geometry((fa(16), swa(4, 8, e)))
    engine = _engine(geometry)
    config = engine.vllm_config
    assert config.speculative_config.method == "mtp"
    assert config.num_prefill_lookahead_tokens - 1 == e == extra_retained(geometry)
    groups = engine.kv_cache_config.kv_cache_groups
    sliding = [g for v, g in enumerate(groups) if engine.group_of[v] == 1]
    assert [g.kv_cache_spec.extra_retained_tokens for g in sliding] == [e]
    assert not any(g.is_eagle_group for g in groups)  # no draft layer declared
    windows = [c.sliding_window_size_in_chunks
               for c in engine.connector_scheduler.config.kv_group_configs]
    assert windows[1] == max(_cdiv(8, 4), _cdiv(8 - 1 + e, 4))  # the connector reads e


def test_e_changes_what_vllm_stores_and_loads_as_the_spec_says() -> None:
    """docs/CONTRACT.md 10's matrix: FA 16 + SWA bs 4, sw 8, a 32-token producer: the SWA
    tails {2, 3, 6, 7}, and {1, 5} more with e = 3; the resend loads W chunks."""
    stored = {}
    for e in (0, 3):
        geometry = Geometry((fa(16), swa(4, 8, e)))
        found = confirm(geometry, 32, "resend")
        assert found.verdict == "as-promised", found.summary()
        observation = found.observation
        assert observation is not None
        stored[e] = observation.stored_chunks(1, "producer")
        assert stored[e] == group_stored_chunks(geometry, geometry.groups[1], 32 // 4)
        low, high = observation.load_ranges("consumer")[1]
        assert high - low == max(_cdiv(8, 4), _cdiv(8 - 1 + e, 4))
    assert stored[3] > stored[0]


def test_e_with_an_eagle_group() -> None:
    geometry = Geometry((fa(8), swa(4, 12, 1, eagle=True)), blocks_per_chunk=2)
    engine = _engine(geometry)
    groups = engine.kv_cache_config.kv_cache_groups
    assert [bool(g.is_eagle_group) for g in groups] == [g.eagle for g in geometry.groups]
    assert groups[engine.group_of.index(1)].kv_cache_spec.extra_retained_tokens == 1
    assert engine.notes == ()


def test_e_without_an_eagle_group_needs_the_drop_switch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the release has no SpeculativeConfig.disable_eagle_block_drop, an MTP
    drafter makes every group drop its trailing block: refused, saying so."""
    fields = build_module.field_names
    monkeypatch.setattr(build_module, "field_names",
                        lambda cls: fields(cls) - {"disable_eagle_block_drop"})
    refused = build(Geometry((fa(16), swa(4, 8, 3))))
    assert isinstance(refused, Refused) and not refused.by_vllm
    assert "disable_eagle_block_drop" in refused.reason


def test_sliding_windows_with_different_e_are_another_plan() -> None:
    refused = build(Geometry((swa(4, 8), swa(8, 16, 2))))
    assert isinstance(refused, Refused) and refused.by_vllm
    assert "retains e = 2 extra tokens, the geometry 0" in refused.reason


def test_dcp_is_refused_saying_which_vllm_rule() -> None:
    geometry = Geometry((fa(16), swa(4, 8)), dcp=2)
    reason = unsupported(geometry)
    assert reason is not None
    assert "tensor_parallel_size % decode_context_parallel_size == 0" in reason
    refused = build(geometry)
    assert isinstance(refused, Refused) and not refused.by_vllm
    parallel = vllm_names("vllm.config", "ParallelConfig")
    with pytest.raises(Exception, match="tp_size=1 must be divisible by dcp_size=2"):
        parallel(tensor_parallel_size=1, decode_context_parallel_size=2)


def test_the_triton_check_is_met_around_the_config_alone() -> None:
    """Where the CPU platform refuses a config without Triton, the build sets
    HAS_TRITON around the config and restores it; without the adaptation the release
    refuses."""
    triton_utils = vllm_names("vllm", "triton_utils")
    before = triton_utils.HAS_TRITON
    engine = _engine(Geometry((fa(4), swa(4, 8))))
    assert before == triton_utils.HAS_TRITON
    adapted = any("HAS_TRITON" in a for a in engine.adaptations)
    assert adapted == has("cpu-requires-triton")


@pytest.fixture
def no_triton_adaptation(monkeypatch: pytest.MonkeyPatch) -> None:
    @contextlib.contextmanager
    def untouched() -> Iterator[list[str]]:
        yield []

    monkeypatch.setattr(build_module, "_triton_for_config", untouched)


@pytest.mark.skipif(not has("cpu-requires-triton"),
                    reason="the installed vLLM's CPU platform builds a config without Triton")
def test_without_the_adaptation_the_release_refuses_the_config(
        no_triton_adaptation: None) -> None:
    triton_utils = vllm_names("vllm", "triton_utils")
    if triton_utils.HAS_TRITON:
        pytest.skip("Triton is installed here")
    with pytest.raises(RuntimeError, match="requires Triton"):
        build(Geometry((fa(4), swa(4, 8))))


def test_lookahead_block_hashes_are_the_release_default_where_it_has_them() -> None:
    """0.34.0's connector hashes a drafter's blocks with its lookahead tokens: then no
    EAGLE block is dropped (another plan than an EAGLE geometry), and a resend the
    legacy hashes lose (the EAGLE replay boundary) is served. The default build asks
    for the legacy hashes, which the geometry states."""
    geometry = Geometry((fa(16), swa(4, 8, eagle=True)), retention_interval=0)
    legacy = _engine(geometry)
    assert legacy.hash_lookahead_tokens == 0 and legacy.notes == ()
    lookahead = BuildOptions(lookahead_block_hashes=True)
    found = build(geometry, lookahead)
    if has("lookahead-block-hashes"):
        assert isinstance(found, Refused) and found.by_vllm
        assert "lookahead token(s): no block is dropped" in found.reason
        engine = _engine(geometry, BuildOptions(lookahead_block_hashes=True,
                                                accept_other_plan=True))
        assert engine.hash_lookahead_tokens == engine.vllm_config.num_prefill_lookahead_tokens
    else:
        assert isinstance(found, LiveEngine) and found.hash_lookahead_tokens == 0
        found.scheduler.shutdown()
    served = confirm(geometry, 33, "resend", options=BuildOptions(
        lookahead_block_hashes=True, accept_other_plan=True))
    dropped = confirm(geometry, 33, "resend")
    assert dropped.verdict == "lost-hit"  # the EAGLE replay finding, legacy hashes
    plain = confirm(Geometry((fa(16), swa(4, 8)), retention_interval=0), 33, "resend")
    expected = plain.observed_hit if has("lookahead-block-hashes") else dropped.observed_hit
    assert served.observed_hit == expected


def test_a_geometry_with_lookahead_hashes_is_built_in_that_mode() -> None:
    """A geometry that states lookahead block hashes (docs/CONTRACT.md 2.1) is vLLM's
    default plan where the release has them: built without another-plan notes, its
    hashes reaching the drafter's lookahead; the EAGLE replay boundary the legacy hashes
    lose is served on it (the geometry's own promise, confirmed on vLLM)."""
    geometry = Geometry((fa(16), swa(4, 8, eagle=True)), retention_interval=0,
                        hash_lookahead=1)
    found = build(geometry)
    if not has("lookahead-block-hashes"):
        assert isinstance(found, Refused) and found.by_vllm  # the release has no such mode
        assert "lookahead block hashes" in found.reason
        return
    assert isinstance(found, LiveEngine), found
    try:
        assert found.notes == () and found.hash_lookahead_tokens == 1
    finally:
        found.scheduler.shutdown()
    served = confirm(geometry, 33, "resend")
    assert served.verdict != "lost-hit", served
