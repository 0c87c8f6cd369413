"""The cost of a defect on the model presets (tools/audit/costs.py)."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from audit_releases import release_tree

from kvcontract.errors import UsageError
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.models import preset_geometries
from kvcontract.spec.properties.end_to_end import (
    prompt_lengths,
    resend_case,
    resend_point,
    resend_promises,
)
from kvcontract.tools.audit.costs import (
    SUMMARY_WIDTH,
    CostBudget,
    _points,
    _Side,
    block_bytes,
    crash_of_row,
    defect_cost,
    delay_of,
)

UPSTREAM = get_implementation("upstream-current")
REFERENCE = get_implementation("reference")


def _window_patched(impl: Implementation) -> Implementation:
    return dataclasses.replace(
        impl, get_sliding_window_size_in_chunks=REFERENCE.get_sliding_window_size_in_chunks,
        load_window_size_in_chunks=REFERENCE.load_window_size_in_chunks)


def _eagle_patched(impl: Implementation) -> Implementation:
    return dataclasses.replace(impl, store_replay_boundaries=REFERENCE.store_replay_boundaries)


def _one_mod_tpc(preset: str) -> bool:
    return any(group.sliding_window is not None
               and group.sliding_window % geometry.chunk_tokens(group) == 1
               for _, geometry in preset_geometries(preset) for group in geometry.groups)


# -- lost hits ----------------------------------------------------------------------------
def test_window_formula_costs_command_r7b_and_nothing_elsewhere() -> None:
    assert _one_mod_tpc("command-r7b") and not _one_mod_tpc("gemma-2-9b")
    cost = defect_cost(UPSTREAM, _window_patched(UPSTREAM), "lost-hit",
                       presets=["command-r7b", "gemma-2-9b"], lengths=6)
    assert cost["impact"] == "lost-hit"
    assert cost["checked"] == 6 and cost["presets_checked"] == 2
    assert {row["geometry"] for row in cost["rows"]} == {
        "command-r7b bpc=1", "command-r7b bpc=4", "command-r7b bpc=16"}
    for row in cost["rows"]:
        assert row["lost_rate"] > 0.5
        assert row["share_of_hit_lost"] > 0.5
        assert row["mean_hit_bound"] < row["mean_hit_patched"]
        assert row["mean_tokens_lost"] == pytest.approx(
            row["mean_hit_patched"] - row["mean_hit_bound"])
        # The patched side gets what the spec promises (the window defect is the only one
        # that touches these geometries' resends).
        assert row["mean_hit_patched"] == row["mean_promised"]
        assert row["retention"] == 0 and row["prompts"] == len(cost["lengths"])
        assert row["excluded"] == 0 and row["excluded_reasons"] == []
    assert cost["unaffected_presets"] == ["gemma-2-9b"]
    assert sorted(cost["unaffected"]) == sorted(label for label, _ in
                                                 preset_geometries("gemma-2-9b"))
    worst = cost["rows"][0]
    assert all(worst["share_of_hit_lost"] >= row["share_of_hit_lost"] for row in cost["rows"])
    assert "command-r7b" in cost["summary"] and "%" in cost["summary"]
    assert len(cost["summary"]) <= SUMMARY_WIDTH


def test_no_defect_no_rows() -> None:
    for patched in (UPSTREAM, dataclasses.replace(UPSTREAM)):
        cost = defect_cost(UPSTREAM, patched, "lost-hit", presets=["command-r7b"], lengths=4)
        assert cost["rows"] == [] and cost["checked"] == 3
        assert cost["unaffected_presets"] == ["command-r7b"]
        assert cost["summary"].startswith("no lost-hit cost on 3 preset geometries")


def test_eagle_replay_boundary_costs_only_eagle_presets() -> None:
    presets = ["gpt-oss-20b", "gpt-oss-20b-eagle3", "deepseek-v4-like-mtp", "command-r7b"]
    cost = defect_cost(UPSTREAM, _eagle_patched(UPSTREAM), "lost-hit", presets=presets,
                       lengths=6)
    affected = {row["preset"] for row in cost["rows"]}
    assert affected == {"gpt-oss-20b-eagle3", "deepseek-v4-like-mtp"}
    assert set(cost["unaffected_presets"]) == {"gpt-oss-20b", "command-r7b"}
    eagle = [row for row in cost["rows"] if row["preset"] == "gpt-oss-20b-eagle3"]
    assert len(eagle) == 3 and all(row["lost_rate"] > 0.5 for row in eagle)


def test_eagle_defect_needs_retention_zero() -> None:
    cost = defect_cost(UPSTREAM, _eagle_patched(UPSTREAM), "lost-hit",
                       presets=["gpt-oss-20b-eagle3"], lengths=4, retention=None)
    # Three bpc in vLLM's default mode (lookahead hashes), then the three as stated.
    assert cost["rows"] == [] and cost["checked"] == 6


def test_eagle_presets_are_costed_in_the_default_hash_mode_first() -> None:
    """docs/CONTRACT.md 2.1: gpt-oss-20b-eagle3 runs with lookahead block hashes by
    default, where the EAGLE replay boundaries of the legacy store path cost nothing; the
    legacy geometries (as the preset states them) still lose their hits."""
    cost = defect_cost(UPSTREAM, _eagle_patched(UPSTREAM), "lost-hit",
                       presets=["gpt-oss-20b-eagle3"], lengths=4)
    assert cost["checked"] == 6
    assert all("lookahead" not in row["geometry"] for row in cost["rows"])
    assert len(cost["rows"]) == 3 and {row["hash_mode"] for row in cost["rows"]} == {"legacy"}
    assert "with legacy hashes only" in cost["summary"]


def test_shared_store_run_changes_nothing() -> None:
    """The store path computed once for both sides (same store functions) gives what two
    runs give."""
    _, geometry = preset_geometries("command-r7b")[1]
    patched = _window_patched(UPSTREAM)
    for prompt in prompt_lengths(4096, 12000, 4):
        case = resend_case("command-r7b bpc=4", geometry, prompt)
        bound, fixed = _Side(UPSTREAM), _Side(patched)
        assert _points(case, bound, fixed, True) == _points(case, bound, fixed, False)


def test_released_window_formula() -> None:
    from kvcontract.tools.audit.binding import bind
    from kvcontract.tools.audit.cost_stage import _cost_job
    from kvcontract.tools.audit.targets import resolve_target

    binding = bind(resolve_target(f"vllm:{release_tree('0.33.0')}"))
    # The audit's costing of the window formula's defect (root cause rebound: upstream's
    # W replaced in its own signature; upstream's store path executed on both sides).
    defect = {"impact": "lost-hit", "root_cause": {"how": "rebound", "functions": [
        {"role": "window", "qualname": "get_sliding_window_size_in_chunks"}]}}
    cost = _cost_job(binding, defect)
    assert {row["preset"] for row in cost["rows"]} == {"command-r7b"}
    assert all(row["lost_rate"] > 0.5 for row in cost["rows"])
    assert "executed on both sides" in cost["notes"][-1]


# -- the measurement the benchmark shares -------------------------------------------------
def test_prompt_lengths_and_resend_on_the_reference() -> None:
    lengths = prompt_lengths(4096, 12000, 24)
    assert lengths[0] == 4096 and lengths[-1] <= 12000 and len(lengths) == 24
    assert len({b - a for a, b in itertools.pairwise(lengths)}) == 1
    assert (lengths[1] - lengths[0]) % 2 == 1
    _, geometry = preset_geometries("command-r7b")[0]
    case = resend_case("command-r7b bpc=1", geometry, lengths[3])
    point = resend_point(case, REFERENCE)
    promised, p1 = resend_promises(case)
    assert point.error is None and point.unread is None
    assert point.hit is not None and point.hit >= promised > 0 and p1 > 0


# -- waste --------------------------------------------------------------------------------
def test_prefill_horizon_wastes_blocks() -> None:
    horizon = get_implementation("prefill-horizon")
    cost = defect_cost(horizon, REFERENCE, "waste", presets=["deepseek-v4-like", "gemma-2-9b"],
                       lengths=4, retention=None)
    assert cost["rows"], cost
    assert {row["preset"] for row in cost["rows"]} == {"deepseek-v4-like"}
    for row in cost["rows"]:
        assert row["mean_wasted_blocks"] > 0 and 0 < row["share_affected"] <= 1
        assert row["mean_wasted_blocks"] == pytest.approx(row["mean_wasted_chunks"] * row["bpc"])
        assert row["mean_wasted_bytes"] is None  # the preset gives no page sizes
    assert "gemma-2-9b" in cost["unaffected_presets"]
    assert any("blocks only" in note for note in cost["notes"])
    assert cost["summary"].startswith("stores ")
    # At vLLM's default retention 0 there is no final partial segment: no waste.
    assert defect_cost(horizon, REFERENCE, "waste", presets=["deepseek-v4-like"], lengths=4,
                       retention=0)["rows"] == []


def test_block_bytes_where_the_preset_gives_page_sizes() -> None:
    # Qwen3-Next: 12 full-attention layers of 2048 bytes per token in a group, blocks of
    # 576 tokens (the Mamba state, 1,097,728 bytes, is padded to that page).
    _, geometry = preset_geometries("qwen3-next-80b")[0]
    assert block_bytes("qwen3-next-80b", geometry) == [12 * 576 * 2048] * len(geometry.groups)
    _, geometry = preset_geometries("command-r7b")[0]
    assert block_bytes("command-r7b", geometry) is None


def test_same_store_path_wastes_nothing() -> None:
    cost = defect_cost(UPSTREAM, _window_patched(UPSTREAM), "waste",
                       presets=["command-r7b"], lengths=4, retention=None)
    assert cost["rows"] == [] and cost["checked"] == 3


# -- delay --------------------------------------------------------------------------------
def _c3_row(states: dict[str, list[str]]) -> dict[str, object]:
    geometry = Geometry((fa(4), swa(4, 8)))
    return {"clause": "C3", "theorem": "lookup-defers-only-in-scope",
            "witness": {"kind": "exhaustive", "theorem": "C3/lookup-defers-only-in-scope",
                        "geometry_name": "FA4+SWA4(sw8)", "geometry": geometry.to_dict(),
                        "num_tokens": 17, "local_hit": 0, "states": states}}


def test_delay_of_names_the_pending_chunk() -> None:
    row = _c3_row({"0": ["HIT", "HIT", "HIT", "MISS"], "1": ["HIT", "MISS", "HIT_PENDING", "MISS"]})
    delay = delay_of(row)
    assert delay["waits_on"] == [{"group": 1, "kind": "sliding_window", "chunk": 2,
                                  "tokens": [8, 12], "state": "HIT_PENDING"}]
    assert delay["bounded_by"] == "store completion"
    assert delay["unbounded_if"] == "the store stalls"
    assert delay["steps"]["at_least"] == 1 and delay["steps"]["at_most"] is None
    assert delay["could_serve"] == 4
    assert "store of group 1 (sliding window) chunk 2 (tokens 8-12)" in delay["text"]
    assert "forever if it stalls" in delay["text"]
    assert delay["text"].endswith("the contract serves 4 tokens now")
    # Narrowed to what the implementation looked at: the stale-pending scan reads it.
    assert delay_of(row, get_implementation("stale-pending"))["waits_on"] == delay["waits_on"]


def test_delay_of_retry_and_scan_witnesses() -> None:
    retry = delay_of(_c3_row({"0": ["HIT", "HIT", "HIT", "MISS"],
                              "1": ["HIT", "MISS", "RETRY", "MISS"]}))
    assert retry["bounded_by"] == "lookup completion"
    assert retry["waits_on"][0]["state"] == "RETRY"
    scan = delay_of({"witness": {"kind": "exhaustive", "states": ["MISS", "HIT_PENDING"],
                                 "initial_window": 2, "window": 1}})
    assert scan["waits_on"] == [{"group": 0, "chunk": 1, "tokens": None,
                                 "state": "HIT_PENDING"}]
    with pytest.raises(ValueError):
        delay_of({"witness": {"kind": "arith", "values": {"W": 1}}})


def test_delay_cost_says_when_the_scenario_shows_none() -> None:
    cost = defect_cost(get_implementation("stale-pending"), REFERENCE, "delay",
                       presets=["gpt-oss-20b"], lengths=3)
    assert cost["rows"] == [] and cost["checked"] == 3
    assert any("delay_of" in note for note in cost["notes"])


# -- crash --------------------------------------------------------------------------------
def test_crash_of_row_reads_the_message() -> None:
    geometry = Geometry((fa(16), swa(4, 8)))
    crash = crash_of_row({
        "message": "producer P=33: accepted hit 32 (promised 16) reads group 1 chunk 3, "
                   "which is MISS: upstream would crash with 'not found in cache'",
        "witness": {"producer": {"geometry": geometry.to_dict()}}})
    assert (crash["group"], crash["chunk"], crash["state"]) == (1, 3, "MISS")
    assert crash["tokens"] == [12, 16] and crash["error"] == "not found in cache"
    assert "group 1 chunk 3 (tokens 12-16)" in crash["condition"]
    pending = crash_of_row({"message": "hit 8 accepted but group 0 must load chunk 1, which "
                                       "is HIT_PENDING: upstream would crash with 'not ready'"})
    assert pending["state"] == "HIT_PENDING" and pending["error"] == "not ready"


def test_crash_cost_of_mtp_extra_retained() -> None:
    cost = defect_cost(get_implementation("mtp-extra-retained"), REFERENCE, "crash",
                       presets=["deepseek-v4-like-mtp", "gemma-2-9b"], lengths=3)
    assert {row["preset"] for row in cost["rows"]} == {"deepseek-v4-like-mtp"}
    assert all(row["crash_rate"] > 0 and "MISS" in row["condition"] for row in cost["rows"])


# -- arguments, budgets, skips ------------------------------------------------------------
def test_budget_and_arguments() -> None:
    cost = defect_cost(UPSTREAM, _window_patched(UPSTREAM), "lost-hit",
                       presets=["command-r7b", "gemma-2-9b"], lengths=50,
                       budget=CostBudget(max_geometries=2, max_lengths=3))
    assert cost["checked"] == 2
    assert cost["lengths"] == prompt_lengths(4096, 12000, 3)  # the odd step: 4096, 8049
    assert any(s.startswith("budget: 4 geometries") for s in cost["skipped"])
    again = defect_cost(UPSTREAM, _window_patched(UPSTREAM), "lost-hit",
                        presets=["command-r7b", "gemma-2-9b"], lengths=50,
                        budget=CostBudget(max_geometries=2, max_lengths=3))
    assert again == cost  # deterministic
    with pytest.raises(UsageError):
        defect_cost(UPSTREAM, REFERENCE, "slow")
    with pytest.raises(UsageError):
        defect_cost(UPSTREAM, REFERENCE, "lost-hit", presets=["no-such-model"])
    with pytest.raises(UsageError):
        CostBudget(max_lengths=0)
    latent = defect_cost(UPSTREAM, REFERENCE, "latent")
    assert latent["rows"] == [] and "not measured" in latent["summary"]


def test_unbuildable_retention_is_skipped_with_the_reason() -> None:
    # 48 is not a multiple of command-r7b's tpc at bpc 4 and 16 (64, 256).
    cost = defect_cost(UPSTREAM, _window_patched(UPSTREAM), "lost-hit",
                       presets=["command-r7b"], lengths=3, retention=48)
    assert cost["checked"] == 1
    assert len(cost["skipped"]) == 2
    assert all("retention=48" in reason for reason in cost["skipped"])


def test_a_release_without_lookahead_hashes_is_costed_as_stated() -> None:
    """On a release without lookahead block hashes (0.33.0) the preset's vLLM default is
    the legacy mode: measured as stated alone, and the summary names no mode."""
    cost = defect_cost(UPSTREAM, _eagle_patched(UPSTREAM), "lost-hit",
                       presets=["gpt-oss-20b-eagle3"], lengths=4, lookahead_hashes=False)
    assert cost["checked"] == 3 and len(cost["rows"]) == 3
    assert {row["hash_mode"] for row in cost["rows"]} == {"default"}
    assert "legacy hashes" not in cost["summary"]


def test_a_defect_is_costed_at_vllms_default_retention_first() -> None:
    """Retention 0 (vLLM's default) is measured first; dense retention only where the
    default costs nothing and the finding needs it (its mode) or is waste, and the notes
    say which was measured."""
    from kvcontract.tools.audit.cost_stage import DENSE_RETENTION_MODE, _default_retention_first

    asked: list[int | None] = []

    def measure(costs_at: set[int | None]) -> Any:
        def run(retention: int | None) -> dict[str, Any]:
            asked.append(retention)
            return {"rows": [{"retention": retention}] if retention in costs_at else [],
                    "notes": []}
        return run

    lost = {"impact": "lost-hit"}
    assert _default_retention_first(lost, measure({0, None}))["rows"] == [{"retention": 0}]
    assert asked == [0]
    asked.clear()
    assert _default_retention_first(lost, measure({None}))["rows"] == [] and asked == [0]
    asked.clear()
    needs = {"impact": "lost-hit", "mode": f"{DENSE_RETENTION_MODE} (gone at 0)"}
    dense = _default_retention_first(needs, measure({None}))
    assert asked == [0, None] and dense["rows"] == [{"retention": None}]
    assert DENSE_RETENTION_MODE in dense["notes"][-1]
    asked.clear()
    assert _default_retention_first({"impact": "waste"}, measure({None}))["rows"]
    assert asked == [0, None]
