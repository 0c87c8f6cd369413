"""vLLM as the third backend of the differential fuzzer (``kvcontract fuzz --live``).

kvcontract's executable system running ``upstream-current`` (its model of vLLM 0.33.0)
and vLLM's own scheduler (the installed release) in lockstep on the fuzzer's programs:
every disagreement is a model gap of a documented class
(``live.differential.GAP_CLASSES``); a model that differs from upstream gives an
unexplained gap, so the check can fail. Every seed geometry is built live (``e > 0``
from an MTP drafter).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kvcontract.impl.system.offload import ChunkState
from kvcontract.impl.variants import get_implementation
from kvcontract.live import env
from kvcontract.live.differential import (
    GAP_CLASSES,
    OUTCOMES,
    LiveComparisonReport,
    ModelGap,
    RequestDecisions,
    classify,
)
from kvcontract.live.session import LiveSession, NotReplayableError
from kvcontract.spec.geometry import Geometry, fa, mamba, swa
from kvcontract.tools.cli import cli
from kvcontract.tools.fuzz import (
    FuzzReport,
    Scenario,
    matrix_scenarios,
    run_fuzz,
    run_live_scenario,
    seed_scenarios,
)
from kvcontract.vocabulary import EXIT_OK, EXIT_UNKNOWN, EXIT_USAGE, LookupResult
from tests.live.conftest import needs_vllm

EXPLAINED = set(GAP_CLASSES) - {"unexplained"}
UPSTREAM = "upstream-current"


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, prog_name="kvcontract", terminal_width=200)


def _compare(scenarios: list[Scenario], impl: str = UPSTREAM) -> LiveComparisonReport:
    report = LiveComparisonReport(impl, "installed")
    implementation = get_implementation(impl)
    for scenario in scenarios:
        report.programs.append(run_live_scenario(implementation, scenario))
    return report


def _unexplained(report: LiveComparisonReport) -> list[str]:
    return [gap.line() for gap in report.gaps if gap.gap_class not in EXPLAINED]


@needs_vllm
def test_seed_scenarios_in_lockstep() -> None:
    report = _compare(seed_scenarios())
    outcomes = {p.scenario: p.outcome for p in report.programs}
    assert set(outcomes.values()) <= set(OUTCOMES)
    # every seed geometry builds live, MTP's e > 0 too (an MTP drafter)
    assert [p.scenario for p in report.programs if p.outcome == "refused"] == []
    assert report.compared == len(report.programs)
    assert outcomes["seed003-mtp"] in ("agreed", "disagreed")
    assert outcomes["seed000-stale-pending"] == "agreed"
    assert outcomes["window-sw9-tpc4"] == "agreed"  # the window bound: hit 0 on both
    assert not _unexplained(report), _unexplained(report)
    classes = report.classes()
    assert classes.get("mamba-checkpoints", 0) >= 1  # vLLM's Mamba align-mode steps
    assert classes.get("hit-chunk-offers", 0) >= 1  # seed 001: the chunk holding N
    print(report.summary(), classes)


@needs_vllm
def test_quick_matrix_agreement_rate_and_every_disagreement_explained() -> None:
    report = _compare(list(matrix_scenarios(quick=True)))
    print(report.summary(), report.classes())
    assert report.compared > 0 and report.agreement is not None
    assert report.count("agreed") > 0
    assert not _unexplained(report), _unexplained(report)
    for program in report.programs:
        if program.outcome == "not-replayable":
            assert "no API" in str(program.reason)  # a stored chunk vLLM cannot drop
        if program.outcome == "refused":
            assert program.reason


@needs_vllm
def test_a_model_that_differs_from_upstream_is_a_model_gap() -> None:
    """The reference stores the window bound's last chunk and hits 48 tokens; vLLM
    0.33.0 (like upstream-current) hits none: kvcontract's model would be wrong."""
    window = [s for s in seed_scenarios() if s.name == "window-sw9-tpc4"]
    wrong = _compare(window, impl="reference")
    gaps = [g for g in wrong.gaps if g.aspect == "hits"]
    assert gaps and gaps[0].gap_class == "unexplained"
    assert (gaps[0].model, gaps[0].live) == ([48], [0])
    assert wrong.gaps[0].kind == "model-gap"
    right = _compare(window)
    assert right.count("agreed") == 1
    # Model gaps change no exit code, unless asked: then an unexplained one is exit 1.
    report = FuzzReport(target="reference", device="cpu", live=wrong)
    assert report.exit_code == EXIT_OK
    report.fail_on_model_gap = True
    assert report.exit_code == 1
    report.live = right
    assert report.exit_code == EXIT_OK


@needs_vllm
def test_the_state_machine_programs_replay_live() -> None:
    report = run_fuzz(UPSTREAM, examples=4, scenarios=[], live=True)
    assert report.live is not None
    programs = report.live.programs
    assert len(programs) == 4
    assert all(p.scenario.startswith("state machine program") for p in programs)
    # The live run draws geometries the live backend declares: every program compares.
    assert report.live.compared == 4
    assert not _unexplained(report.live), _unexplained(report.live)
    # Model gaps change no exit code: only a contract finding of the state machine does,
    # and it is one kvcontract's model of vLLM is known to violate (its deferral has no
    # deadline, as 0.33.0: a RETRY window past the bound is C13).
    known = set(get_implementation(UPSTREAM).violates)
    assert {d.clause for d in report.differences} <= known, report.differences
    assert report.exit_code == (1 if report.differences else 0)


@needs_vllm
def test_fixtures_reach_vllms_manager_through_its_api() -> None:
    geometry = Geometry((fa(4), swa(4, 8)))
    session = LiveSession.open(geometry)
    assert isinstance(session, LiveSession)
    try:
        tokens = list(range(1, 14))
        session.install_chunk(tokens, 0, 0, ChunkState.READY)
        session.install_chunk(tokens, 1, 2, ChunkState.PENDING)
        keys, context = session.offload_keys(tokens)
        states = {gk: str(session.manager.lookup(k[0], context).name)
                  for gk, k in keys.items()}
        assert states[(0, 0)] == LookupResult.HIT.name
        assert states[(1, 2)] == LookupResult.HIT_PENDING.name
        assert states[(0, 1)] == LookupResult.MISS.name
        with pytest.raises(NotReplayableError, match="no API to drop"):
            session.install_chunk(tokens, 0, 0, ChunkState.ABSENT)
        with pytest.raises(NotReplayableError, match="no API"):
            session.perturb_left_chunk(tokens, "absent")
        session.mark_loading(tokens, 0, 0)
        assert set(keys[(0, 0)]) <= session.engine.connector_scheduler._chunks_being_loaded
    finally:
        session.close()


@needs_vllm
def test_cli_fuzz_live_reports_model_gaps(tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    result = invoke(["fuzz", "--impl", "reference", "--live", "--examples", "0", "--quiet",
                     "--fail-on-model-gap", "--json", str(out)])
    # The reference's contract checks pass; its unexplained model gap is exit 1 here.
    assert result.exit_code == 1, result.output
    data = json.loads(out.read_text())
    assert not data["differences"]
    live = data["live"]
    assert live["compared"] == live["agreed"] + live["disagreed"]
    assert Counter(g["class"] for g in live["gaps"])["unexplained"] >= 1
    assert live["refused_programs"] == []  # e > 0 is built from an MTP drafter
    assert "programs agree" in result.output
    assert "model-gap [unexplained] window-sw9-tpc4" in result.output


def test_fail_on_model_gap_needs_live() -> None:
    result = invoke(["fuzz", "--fail-on-model-gap", "--examples", "0"])
    assert result.exit_code == EXIT_USAGE
    assert "--live" in result.output


def test_fuzz_live_without_vllm_exits_3_with_the_recipe(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(env.PURE_PYTHON_CLOSURE, "kvcontract_no_such_module",
                        "no-such-distribution")
    result = invoke(["fuzz", "--live", "--examples", "0"])
    assert result.exit_code == EXIT_UNKNOWN
    assert "no-such-distribution" in result.output
    assert "install:" in result.output


@needs_vllm
@pytest.mark.slow
def test_full_matrix_every_disagreement_explained() -> None:
    report = _compare(list(matrix_scenarios()))
    print(report.summary(), report.classes())
    assert report.compared > 0
    unexplained = _unexplained(report)
    print("\n".join(unexplained))
    assert not unexplained


@needs_vllm
def test_a_buildable_disagreement_is_a_model_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where spec.build.buildable rejects a geometry vLLM builds, the comparison says so
    (here buildable is made to reject the seed-000 geometry, which vLLM builds)."""
    from kvcontract.live import differential

    monkeypatch.setattr(differential, "buildable",
                        lambda geometry: (False, "rejected for the test"))
    report = _compare([s for s in seed_scenarios() if s.name == "seed000-stale-pending"])
    gaps = [g for g in report.gaps if g.aspect == "buildable"]
    assert [g.gap_class for g in gaps] == ["buildable"]
    assert "rejected for the test" in str(gaps[0].model)


@needs_vllm
def test_a_retry_window_defers_vllm_as_it_defers_the_model() -> None:
    """``retry_lookups`` on the live session: vLLM's connector defers on the wrapped
    manager's RETRY for the window's six program steps, then decides the stored hit, as
    kvcontract's model of it does (the program agrees)."""
    geometry = Geometry((fa(4), swa(4, 8)))
    tokens = [(7 * i + 3) % 50 for i in range(17)]
    program = [("add_request", "p", tokens, 1), *[("step", 8)] * 4, ("drain",),
               ("evict_gpu_cache",), ("retry_lookups",), ("add_request", "c", tokens, 1),
               *[("step", 64)] * 9]
    session = LiveSession.open(geometry)
    assert isinstance(session, LiveSession)
    for op in program:
        getattr(session, str(op[0]))(*op[1:])
    observation = session.close()
    answers = [m.external for m in observation.matches if m.request == "c"]
    assert answers == [None] * 6 + [16]
    comparison = run_live_scenario(get_implementation(UPSTREAM),
                                   Scenario("retry", geometry, program))
    assert comparison.outcome == "agreed", comparison.gaps


@needs_vllm
def test_an_eagle_group_whose_history_fills_a_segment_is_stored_whole_by_vllm() -> None:
    """FA 16 + SWA 4 (sw 8, e 2, EAGLE): need = cdiv(9, 4) + 1 = 4 blocks = the segment
    (A = 16): vLLM's reachable_block_mask stores every block, chunk 0 too; kvcontract's
    model leaves chunk 0 out: a gap of the model, class eagle-store-all."""
    geometry = Geometry((fa(16), swa(4, 8, 2, eagle=True)))
    tokens = [(7 * i + 3) % 50 for i in range(17)]
    program = [("add_request", "producer", tokens, 1), *[("step", 64)] * 4]
    comparison = run_live_scenario(get_implementation(UPSTREAM),
                                   Scenario("eagle-store-all", geometry, program))
    offers = [g for g in comparison.gaps if g.request == "producer" and g.aspect == "offers"]
    assert [g.gap_class for g in offers] == ["eagle-store-all"]
    live, model = set(offers[0].live[1]), set(offers[0].model[1])
    assert live - model == {0} and live == set(range(16 // 4))
    # e 1: need = cdiv(8, 4) + 1 = 3 < the segment: vLLM leaves block 0 out too
    geometry = Geometry((fa(16), swa(4, 8, 1, eagle=True)))
    comparison = run_live_scenario(get_implementation(UPSTREAM),
                                   Scenario("eagle-e1", geometry, program))
    assert comparison.outcome == "agreed", comparison.gaps


STALL_GEOMETRY = Geometry((swa(8, 16, 2), mamba(8)))
"""SWA 8 (sw 16, e 2: an MTP drafter of k = 3 lookahead tokens) + Mamba 8 in align
mode."""


def _stall_run(geometry: Geometry, prompt: int, budgets: list[int]) -> tuple[str, int, list[int]]:
    session = LiveSession.open(geometry)
    assert isinstance(session, LiveSession), session
    session.add_request("r", list(range(1, prompt + 1)), 1)
    for budget in budgets:
        session.step(budget)
    observation = session.close()
    outcome = observation.requests["r"]
    assert not observation.exceptions, observation.exceptions
    return str(outcome.status), int(outcome.num_computed or 0), list(outcome.scheduled)


@needs_vllm
def test_vllm_stalls_an_mtp_prefill_on_a_mamba_boundary() -> None:
    """A 25-token prompt in steps of 17: vLLM's scheduler computes 16, then clips the
    chunk to the last Mamba block boundary B = 24 (_mamba_block_aligned_split) and its
    MTP lookahead reservation (_reserve_prefill_lookahead: no chunk may end within k = 3
    tokens of the prompt end) cuts it to 6 (to P - k = 22); from 22 the split's only end
    is 24 and the reservation cuts it to 0, every step: the prefill never ends (vLLM's
    own stall; the differential's class mtp-mamba-prefill-stall)."""
    tokens = list(range(1, 26))
    program = [("add_request", "producer", tokens, 1), *[("step", 17)] * 6]
    status, computed, scheduled = _stall_run(STALL_GEOMETRY, 25, [17] * 6)
    assert (status, computed, scheduled) == ("RUNNING", 22, [16, 6])
    # any budget: one step of 64 tokens is clipped to 24, then cut to 22
    assert _stall_run(STALL_GEOMETRY, 25, [64] * 4) == ("RUNNING", 22, [22])
    # every prompt with 1 <= P mod 8 <= e stalls at P - k; the others finish
    for prompt in (17, 18, 26, 33, 34):
        assert _stall_run(STALL_GEOMETRY, prompt, [64] * 4)[:2] == ("RUNNING", prompt - 3)
    for prompt in (19, 24, 27, 32):
        assert _stall_run(STALL_GEOMETRY, prompt, [64] * 4)[0] == "FINISHED_LENGTH_CAPPED"
    comparison = run_live_scenario(get_implementation(UPSTREAM),
                                   Scenario("mtp-stall", STALL_GEOMETRY, program))
    classes = {g.gap_class for g in comparison.gaps if g.request == "producer"}
    assert classes == {"mtp-mamba-prefill-stall"}


@needs_vllm
def test_vllm_stalls_an_mtp_prefill_with_its_eagle_block_drop_too() -> None:
    """With an EAGLE group (vLLM's default for an MTP drafter: the trailing block is
    dropped, so the last cacheable Mamba position is 16, not 24) a 25-token prompt
    finishes when a step can take it to the end, and stalls at 22 when a step's budget
    ends the chunk on the block boundary 24, inside the lookahead window: a budget of 8
    after the first 16 tokens."""
    geometry = Geometry((swa(8, 16, 2, eagle=True), mamba(8)))
    assert _stall_run(geometry, 25, [64] * 4) == ("FINISHED_LENGTH_CAPPED", 26, [16, 9, 1])
    assert _stall_run(geometry, 25, [16, 8, 64, 64]) == ("RUNNING", 22, [16, 6])
    program = [("add_request", "producer", list(range(1, 26)), 1), ("step", 16),
               ("step", 8), ("step", 64), ("step", 64)]
    comparison = run_live_scenario(get_implementation(UPSTREAM),
                                   Scenario("mtp-stall-eagle", geometry, program))
    assert {g.gap_class for g in comparison.gaps if g.request == "producer"} == {
        "mtp-mamba-prefill-stall"}


def _decisions(offers: dict[int, set[int]], *, hit: int = 0, computed: int | None = None,
               finished: bool = True) -> RequestDecisions:
    return RequestDecisions(hits=[hit], offers=offers, local_hits=[0], lookups=1,
                            computed=computed, finished=finished)


def _offers_gap(model: RequestDecisions, live: RequestDecisions,
                request: str = "producer") -> ModelGap:
    return ModelGap("unit", request, "offers", model.aspect("offers"), live.aspect("offers"))


def _class_of_stall(geometry: Geometry, prompt: int, computed: int,
                    finished: bool = False) -> str:
    program = [("add_request", "producer", list(range(1, prompt + 1)), 1), ("step", 64)]
    model = _decisions({0: {0, 1, 2}})
    live = _decisions({0: {0, 1}}, computed=computed, finished=finished)
    return str(classify(_offers_gap(model, live), geometry, program, model, live, False))


def test_the_stall_class_is_the_request_left_at_p_minus_k_before_a_mamba_boundary() -> None:
    """mtp-mamba-prefill-stall: a Mamba group, e > 0, the request unfinished at exactly
    P - (e + 1) computed, a Mamba block boundary strictly between P - (e + 1) and P."""
    assert _class_of_stall(STALL_GEOMETRY, 25, 22) == "mtp-mamba-prefill-stall"
    assert _class_of_stall(STALL_GEOMETRY, 26, 23) == "mtp-mamba-prefill-stall"
    # not where vLLM stalls: another token count, a finished request, no boundary in
    # (P - k, P) (27: the boundary 24 is P - k itself), no e, no Mamba group
    assert _class_of_stall(STALL_GEOMETRY, 25, 21) == "unexplained"
    assert _class_of_stall(STALL_GEOMETRY, 25, 22, finished=True) == "unexplained"
    assert _class_of_stall(STALL_GEOMETRY, 27, 24) == "unexplained"
    assert _class_of_stall(Geometry((swa(8, 16), mamba(8))), 25, 24) == "unexplained"
    assert _class_of_stall(Geometry((fa(8), swa(8, 16, 2))), 25, 22) == "unexplained"


def _class_of_store_all(geometry: Geometry, model_offers: set[int], live_offers: set[int],
                        *, model_hit: int = 0, live_hit: int = 0) -> str:
    program = [("add_request", "producer", list(range(1, 18)), 1), ("step", 64)]
    model = _decisions({0: {0}, 1: model_offers}, hit=model_hit)
    live = _decisions({0: {0}, 1: live_offers}, hit=live_hit)
    return str(classify(_offers_gap(model, live), geometry, program, model, live, False))


def test_the_store_all_class_is_chunk_0_of_an_eagle_group_that_fills_its_segment() -> None:
    """eagle-store-all: an EAGLE group with need = period (FA 16 + SWA 4, sw 8, e 2:
    need = cdiv(9, 4) + 1 = 4 = 16 / 4) at bpc 1, the same hits on both sides, and vLLM
    offering chunk 0 besides what the model offered."""
    geometry = Geometry((fa(16), swa(4, 8, 2, eagle=True)))
    assert _class_of_store_all(geometry, {1, 2, 3}, {0, 1, 2, 3}) == "eagle-store-all"
    # a difference past chunk 0, another hit, no EAGLE group, need < period (e 1),
    # bpc 4 (the model's mask marks blocks 1-3 of chunk 0, so stores chunk 0 too)
    assert _class_of_store_all(geometry, {1, 2}, {0, 1, 2, 3}) == "unexplained"
    assert _class_of_store_all(geometry, {1, 2, 3}, {0, 1, 2, 3},
                               live_hit=16) != "eagle-store-all"
    for other in (Geometry((fa(16), swa(4, 8, 2))), Geometry((fa(16), swa(4, 8, 1, eagle=True))),
                  Geometry((fa(16), swa(4, 8, 2, eagle=True)), blocks_per_chunk=4)):
        assert _class_of_store_all(other, {1, 2, 3}, {0, 1, 2, 3}) == "unexplained", other


# -- shared-prefix junctions (docs/CONTRACT.md 9.3) ----------------------------------------
@needs_vllm
def test_vllm_registers_the_junction_the_model_registers() -> None:
    """The junction seed on vLLM's engine: its connector registers the junction 32 for
    the first consumer (cut to 0 by the window) and stores SWA 6-7 for it, and the second
    consumer hits 32, as kvcontract's model does; a model registering none (vLLM
    0.33.0's connector) differs from vLLM there, unexplained."""
    seed = [s for s in seed_scenarios() if s.name == "c12-shared-prefix-junction"]
    agreed = _compare(seed)
    assert [p.outcome for p in agreed.programs] == ["agreed"], agreed.gaps
    wrong = _compare(seed, impl="no-shared-prefix-junction")
    offers = next(g for g in wrong.gaps if g.request == "first" and g.aspect == "offers")
    assert offers.gap_class == "unexplained"
    assert (offers.model[1], offers.live[1]) == ([10, 11], [6, 7, 10, 11])
    hits = next(g for g in wrong.gaps if g.request == "second" and g.aspect == "hits")
    assert (hits.model, hits.live) == ([0], [32])


@needs_vllm
@pytest.mark.slow
def test_the_junction_matrix_agrees_with_vllm() -> None:
    """The matrix's junction programs (retention 0, 4A and None; chunks of 1, 2 and 4
    blocks; sw 8 and 17) agree with vLLM 0.34.0 request by request."""
    scenarios = [s for s in matrix_scenarios() if s.name.startswith("junction ")]
    assert len(scenarios) == 18
    report = _compare(scenarios)
    assert report.count("agreed") == len(scenarios), [g.line() for g in report.gaps]


def test_a_junction_only_vllm_registered_explains_sliding_window_offers() -> None:
    """vLLM's KV-cache manager registers a junction from the GPU prefix cache, which the
    model does not: the sliding-window offers stored for it are class
    junction-registration; with equal junctions, a full-attention group differing, or a
    junction vLLM's connector registered and the model's did not, they stay
    unexplained."""
    geometry = Geometry((fa(16), swa(4, 8)), retention_interval=0)
    program = [("add_request", "producer", list(range(1, 70)), 1), ("step", 64)]

    def class_of(model_offers: dict[int, set[int]], junctions: set[int],
                 by_connector: set[int] | None = None) -> str:
        model = _decisions(model_offers)
        live = _decisions({0: {0, 1, 2, 3}, 1: {2, 3, 10, 11}})
        live.junctions = junctions
        live.connector_junctions = set() if by_connector is None else by_connector
        return str(classify(_offers_gap(model, live), geometry, program, model, live, False))

    assert class_of({0: {0, 1, 2, 3}, 1: {10, 11}}, {16}) == "junction-registration"
    assert class_of({0: {0, 1, 2, 3}, 1: {10, 11}}, set()) == "unexplained"
    assert class_of({0: {0, 1, 2}, 1: {10, 11}}, {16}) == "unexplained"
    # vLLM's connector registered it and the model's did not: the connector's rule
    # differs, never explained by the manager's junction
    assert class_of({0: {0, 1, 2, 3}, 1: {10, 11}}, {16}, by_connector={16}) == "unexplained"


def test_a_filled_tier_explains_what_nothing_else_does() -> None:
    """A gap in a program whose CPU tier the model filled (it refused or evicted) is
    class tier-capacity, unless a more specific class explains it."""
    geometry = Geometry((fa(4), swa(4, 8)))
    program = [("add_request", "producer", list(range(1, 20)), 1), ("step", 64)]
    model, live = _decisions({0: {0, 1}}), _decisions({0: {0, 1, 2}})
    gap = _offers_gap(model, live)
    assert classify(gap, geometry, program, model, live, False) == "unexplained"
    assert classify(gap, geometry, program, model, live, False,
                    tier_filled=True) == "tier-capacity"
    assert classify(gap, geometry, program, model, live, False, deadlined=True,
                    tier_filled=True) == "deferral-deadline"


@needs_vllm
def test_a_failed_load_and_an_error_finish_replay_live() -> None:
    """The live session fails the next load (vLLM's recompute policy, as the model
    recovers) and finishes a request with an error mid-prefill: both programs agree with
    the model, request by request (the failed-load consumer is looked up again, gets 0
    and recomputes on both sides)."""
    geometry = Geometry((fa(4), swa(4, 8)))
    tokens = [(7 * i + 3) % 50 for i in range(17)]
    longer = tokens + [(11 * i + 5) % 50 for i in range(20)]
    failed = [("add_request", "p", tokens, 1), *[("step", 8)] * 4, ("drain",),
              ("evict_gpu_cache",), ("fail_next_load",), ("add_request", "c", longer, 1),
              *[("step", 64)] * 6]
    error = [("add_request", "p", tokens, 1), ("step", 5), ("step", 5),
             ("finish_with_error", "p"), *[("step", 8)] * 3, ("drain",), ("evict_gpu_cache",),
             ("add_request", "c", tokens, 1), *[("step", 64)] * 4]
    report = _compare([Scenario("failed-load", geometry, failed),
                       Scenario("error-finish", geometry, error)], impl="reference")
    assert [p.outcome for p in report.programs] == ["agreed", "agreed"], \
        [g.line() for g in report.gaps]
    session = LiveSession.open(geometry)
    assert isinstance(session, LiveSession)
    for op in failed:
        getattr(session, str(op[0]))(*op[1:])
    observation = session.close()
    assert [m.external for m in observation.matches if m.request == "c"] == [16, 0]


def test_a_partial_tail_violation_on_vllm_fails_the_run() -> None:
    """The partial-tail campaign is judged on vLLM's engine: a failed C12 check is a
    contract violation (exit 1), a check that states no clause a model gap (exit 1 only
    with fail_on_model_gap), and a campaign that could not run changes nothing."""
    from kvcontract.live.partial_tail import PartialTailCampaign

    def report_with(failed: list[dict[str, object]] | str, gaps: bool = False) -> FuzzReport:
        report = FuzzReport(target="reference", device="cpu", fail_on_model_gap=gaps)
        report.live = LiveComparisonReport("reference", "x")
        if isinstance(failed, str):
            report.live.partial_tails = failed
        else:
            report.live.partial_tails = PartialTailCampaign(0, runs=1, violations=[
                {"case": "c", "numbers": {}, "failed": failed}] if failed else [])
        return report

    lost = {"check": "C12: the consumer's hit is at least the partial-tail promise",
            "clause": "C12", "expected": ">= 224", "observed": "192"}
    on = {"check": "vLLM turns partial tails on where the contract says", "clause": None,
          "expected": "on", "observed": "off"}
    assert report_with([]).exit_code == EXIT_OK
    assert report_with([lost]).exit_code == 1
    assert report_with([on]).exit_code == EXIT_OK
    assert report_with([on], gaps=True).exit_code == 1
    assert report_with("no partial-tail path").exit_code == EXIT_OK
    assert "not run (no partial-tail path)" in report_with("no partial-tail path").live.summary()
