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
from kvcontract.live.differential import GAP_CLASSES, OUTCOMES, LiveComparisonReport
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
    assert report.exit_code == 0


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
        getattr(session, op[0])(*op[1:])
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


@needs_vllm
def test_vllm_stalls_an_mtp_prefill_on_a_mamba_boundary() -> None:
    """SWA 8 (sw 16, e 2: an MTP drafter of 3 tokens) + Mamba 8 in align mode, a
    25-token prompt in steps of 17: vLLM's scheduler computes 16, then 6 (to 22), then
    clips the last chunk to the partial-tail boundary 24 and its MTP lookahead
    reservation takes that to 0, every step: the prefill never ends (vLLM's own stall;
    the differential's class mtp-mamba-prefill-stall)."""
    geometry = Geometry((swa(8, 16, 2), mamba(8)))
    tokens = list(range(1, 26))
    program = [("add_request", "producer", tokens, 1), *[("step", 17)] * 6]
    session = LiveSession.open(geometry)
    assert isinstance(session, LiveSession)
    for op in program:
        getattr(session, op[0])(*op[1:])
    observation = session.close()
    outcome = observation.requests["producer"]
    assert outcome.status == "RUNNING" and outcome.num_computed < len(tokens)
    assert sum(outcome.scheduled) == outcome.num_computed
    assert len(outcome.scheduled) < 6  # steps scheduled nothing for it
    comparison = run_live_scenario(get_implementation(UPSTREAM),
                                   Scenario("mtp-stall", geometry, program))
    classes = {g.gap_class for g in comparison.gaps if g.request == "producer"}
    assert classes == {"mtp-mamba-prefill-stall"}
