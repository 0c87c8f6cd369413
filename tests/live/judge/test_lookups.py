"""Lookup cases judged on vLLM's own engine: the chunk states installed in its offload
manager, the request scheduled, the connector's answer and load set observed."""

from __future__ import annotations

import pytest

from kvcontract.live.judge.engines import EnginePool
from kvcontract.live.judge.lookups import LookupJudge, NotRealized, _insert, _Node, _Run, _walk
from kvcontract.live.judge.rebinding import rebound
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.properties.lookup import (
    LookupCase,
    defers_only_in_scope,
    is_maximal,
    loads_only_hit,
)
from kvcontract.vocabulary import LookupResult
from tests.live.conftest import needs_vllm

M, H, P, R = (LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING,
              LookupResult.RETRY)


def _case(geometry: Geometry, tokens: int, *states: tuple[LookupResult, ...],
          local: int = 0, budget: int | None = None) -> LookupCase:
    return LookupCase("test", geometry, tokens, local, tuple(states), budget)


FA4_SWA4 = Geometry((fa(4), swa(4, 8)))
SWA2_SW5 = Geometry((swa(2, 5),), blocks_per_chunk=2)


@needs_vllm
@pytest.mark.live
def test_the_stale_pending_scene_is_served_by_vllm() -> None:
    judge = LookupJudge(EnginePool())
    # FA chunks 0-3 ready, SWA chunks 0-1 ready, 2 missing, 3 pending (seed 000's scene)
    case = _case(FA4_SWA4, 17, (H, H, H, H), (H, H, M, P))
    observation = judge.observe(case)
    assert observation.hit_tokens == 8
    assert observation.load_ranges == {0: (0, 2), 1: (0, 2)}
    assert loads_only_hit(case, observation) is None
    assert (1, 3) in observation.lookups  # the pending chunk was looked up
    assert judge.stats.runs == 1


@needs_vllm
@pytest.mark.live
def test_a_needless_deferral_is_vllms_own() -> None:
    judge = LookupJudge(EnginePool())
    case = _case(FA4_SWA4, 17, (H, H, P, M), (M, M, H, H))
    observation = judge.observe(case)
    assert observation.hit_tokens is None
    assert defers_only_in_scope(case, observation) is not None


@needs_vllm
@pytest.mark.live
def test_the_window_formula_loses_a_hit_and_the_reference_window_serves_it() -> None:
    case = _case(SWA2_SW5, 25, (M, M, M, M, M, H))
    assert is_maximal(case, LookupJudge(EnginePool()).observe(case)) is not None
    with rebound(["window"]):
        fixed = LookupJudge(EnginePool()).observe(case)
    assert fixed.hit_tokens == 24 and is_maximal(case, fixed) is None


@needs_vllm
@pytest.mark.live
def test_cases_that_agree_on_what_vllm_looked_up_share_its_run() -> None:
    judge = LookupJudge(EnginePool())
    first = judge.observe(_case(FA4_SWA4, 17, (M, H, H, H), (H, H, H, H)))
    # The FA scan stops at chunk 0 (MISS): nothing else is looked up or loaded.
    second = judge.observe(_case(FA4_SWA4, 17, (M, P, M, P), (M, M, M, M)))
    assert first == second
    assert (judge.stats.runs, judge.stats.shared) == (1, 1)


@needs_vllm
@pytest.mark.live
def test_retry_and_budget_and_local_hit() -> None:
    judge = LookupJudge(EnginePool())
    assert judge.observe(_case(FA4_SWA4, 17, (H, H, R, H), (H, H, H, H))).hit_tokens is None
    budget = _case(FA4_SWA4, 17, (H, H, H, H), (H, H, H, H), budget=6)
    served = judge.observe(budget)
    assert served.hit_tokens is not None and served.hit_tokens <= 6
    local = _case(FA4_SWA4, 17, (H, H, H, H), (H, H, H, H), local=4)
    try:
        observation = judge.observe(local)
    except NotRealized as exc:  # a release without max_offload_tokens cannot serve it
        assert "local hit" in str(exc) or "max_offload_tokens" in str(exc)
    else:
        assert observation.hit_tokens is not None and observation.hit_tokens >= 4


def test_the_decision_tree_refuses_a_connector_that_is_not_a_function_of_its_answers() -> None:
    root = _Node()
    _insert(root, _Run(((0, 0, "HIT"), (1, 2, "MISS")), 4, {}, None, (), ()))
    with pytest.raises(RuntimeError, match="another order"):
        _insert(root, _Run(((0, 0, "HIT"), (1, 3, "MISS")), 4, {}, None, (), ()))
    with pytest.raises(RuntimeError, match="went on"):
        _insert(root, _Run(((0, 0, "HIT"),), 4, {}, None, (), ()))


def test_a_walk_needs_the_same_states_of_the_loaded_chunks() -> None:
    class _Engine:
        group_of = (0, 1)

    class _Judge:
        engine = _Engine()

    root = _Node()
    run = _Run(((0, 0, "HIT"),), 4, {0: (0,)}, None, ("HIT",), ((0, 0),))
    _insert(root, run)
    hit = _case(FA4_SWA4, 17, (H, M, M, M), (M, M, M, M))
    pending = _case(FA4_SWA4, 17, (P, M, M, M), (M, M, M, M))
    assert _walk(root, hit, _Judge()) is run  # type: ignore[arg-type]
    assert _walk(root, pending, _Judge()) is None  # type: ignore[arg-type]
