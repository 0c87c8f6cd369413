"""A driver gap is kvcontract's, never vLLM's (live/gaps.py).

An exception raised where kvcontract's live driver calls vLLM with arguments the release
does not take (here: a ``ModelRunnerOutput`` whose signature lacks a field the driver
passes, as 0.34.0 dropped ``req_id_to_index``) is recorded as a ``DriverGap``, not as a
crash, and every consumer reports UNKNOWN / not replayable: run traces, confirmations,
scenarios and their exit code, the differential fuzzer, the lockstep, the lifecycle
judges, the audit's replays. An exception raised on vLLM's side stays a crash.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from kvcontract.impl.variants import get_implementation
from kvcontract.live.confirm import confirm, end_to_end_case
from kvcontract.live.gaps import DriverGapError, driver_gap_of
from kvcontract.live.lifecycle import run_lifecycle
from kvcontract.live.lockstep import lockstep
from kvcontract.live.observation import LiveObservation
from kvcontract.live.overlay import Overlay
from kvcontract.live.run import LiveRun, run_trace
from kvcontract.live.scenarios import LIFECYCLE_GEOMETRY, judge_lifecycle, run_scenario
from kvcontract.live.trace import TraceRequest, producer_consumer, prompt_tokens
from kvcontract.live.worker import _FailingTransfers
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.tools.audit.live_stage import Replay, _replay, status_of
from kvcontract.tools.cli import cli
from kvcontract.tools.fuzz import Scenario, run_live_scenario
from kvcontract.vocabulary import EXIT_UNKNOWN, Verdict
from tests.live.conftest import needs_vllm

GEOMETRY = Geometry((fa(16), swa(4, 8)), retention_interval=0)


class ModelRunnerOutput:
    """A release's ``ModelRunnerOutput`` whose signature the driver does not fit: it
    takes no ``sampled_token_ids`` (as if renamed)."""

    def __init__(self, req_ids: list[str], kv_connector_output: Any = None,
                 req_id_to_index: Any = None, sampled_tokens: Any = None) -> None:
        self.req_ids = req_ids


@pytest.fixture
def reshaped_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import vllm.v1.outputs as outputs

    monkeypatch.setattr(outputs, "ModelRunnerOutput", ModelRunnerOutput)
    yield


def _trace() -> Any:
    producer = TraceRequest("producer", tuple(prompt_tokens(33)), max_tokens=2)
    consumer = TraceRequest("consumer", tuple(prompt_tokens(33)))
    return producer_consumer(producer, consumer)


# -- the rule ----------------------------------------------------------------------------
def test_an_attribute_vllm_reads_from_a_stand_in_of_the_driver_is_a_gap() -> None:
    read = "transfer_stats"  # what a release's worker might read from its handler
    with pytest.raises(AttributeError) as raised:
        getattr(_FailingTransfers(7), read)
    gap = driver_gap_of(raised.value, 3, "step")
    assert gap is not None
    assert gap.api == "transfer_stats (read by vLLM from kvcontract's _FailingTransfers)"
    assert (gap.step, gap.where, gap.type) == (3, "step", "AttributeError")


def test_an_exception_raised_outside_the_driver_is_not_a_gap() -> None:
    with pytest.raises(KeyError) as raised:
        {}.pop("job")
    assert driver_gap_of(raised.value, 0, "step") is None


@needs_vllm
def test_a_signature_the_driver_does_not_fit_is_a_gap_not_a_crash(
        reshaped_vllm: None) -> None:
    observation = run_trace(GEOMETRY, _trace())
    assert isinstance(observation, LiveObservation)
    assert observation.exceptions == [] and not observation.crashed
    gap = observation.driver_gap
    assert gap is not None and gap.type == "TypeError"
    assert gap.api == "ModelRunnerOutput.__init__"
    assert "sampled_token_ids" in gap.message
    assert gap.frame.startswith("kvcontract/live/run.py:")
    assert "not a verdict about vLLM" in gap.text()


@needs_vllm
def test_an_exception_on_vllms_side_stays_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same TypeError raised inside the scheduler's own call (here a stand-in
    defined outside the driver) is vLLM's failure: a crash, no gap."""
    def update_from_output(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("update_from_output() got an unexpected keyword argument 'x'")

    install = LiveRun.__init__

    def patched(self: LiveRun, engine: Any, trace: Any) -> None:
        install(self, engine, trace)
        monkeypatch.setattr(engine.scheduler, "update_from_output", update_from_output)

    monkeypatch.setattr(LiveRun, "__init__", patched)
    observation = run_trace(GEOMETRY, _trace())
    assert isinstance(observation, LiveObservation)
    assert observation.driver_gaps == []
    assert [e.type for e in observation.exceptions] == ["TypeError"]


# -- every consumer ------------------------------------------------------------------------
@needs_vllm
def test_a_confirmation_raises_instead_of_a_verdict(reshaped_vllm: None) -> None:
    with pytest.raises(DriverGapError, match="ModelRunnerOutput"):
        confirm(GEOMETRY, 33, "resend")


@needs_vllm
def test_a_scenario_is_unknown_and_the_command_exits_3(reshaped_vllm: None) -> None:
    for name in ("abort-queued", "window-formula", "partial-tail-resend"):
        result = run_scenario(name)
        assert result.unknown and not result.ok, name
        assert result.checks == []
        assert result.outcome.startswith("driver gap: ")
    judged = run_scenario("abort-queued")
    assert [c.verdict for c in judged.clauses] == [Verdict.UNKNOWN] * 3
    assert all("ModelRunnerOutput" in c.reason for c in judged.clauses)
    out = CliRunner().invoke(cli, ["live", "--scenario", "abort-queued"],
                             prog_name="kvcontract", terminal_width=200)
    assert out.exit_code == EXIT_UNKNOWN, out.output
    assert "UNKNOWN (driver gap)" in out.output


@needs_vllm
def test_the_lifecycle_judges_say_unknown(reshaped_vllm: None) -> None:
    run = run_lifecycle(LIFECYCLE_GEOMETRY, _trace())
    assert isinstance(run, LiveObservation) and run.driver_gap is not None
    verdicts = judge_lifecycle(run, LIFECYCLE_GEOMETRY)
    assert [v.verdict for v in verdicts] == [Verdict.UNKNOWN] * 3


@needs_vllm
def test_the_differential_and_the_lockstep_do_not_compare(reshaped_vllm: None) -> None:
    tokens = list(range(1, 18))
    program = [("add_request", "p", tokens, 1), ("step", 64), ("step", 64)]
    comparison = run_live_scenario(get_implementation("upstream-current"),
                                   Scenario("gap", GEOMETRY, program))
    assert comparison.outcome == "not-replayable"
    assert comparison.gaps == [] and comparison.live_crash is None
    assert "ModelRunnerOutput" in str(comparison.reason)
    report = lockstep([end_to_end_case(GEOMETRY, 33, "resend")])
    assert report.compared == 0 and len(report.not_replayable) == 1


@needs_vllm
def test_the_audit_replays_nothing(reshaped_vllm: None) -> None:
    case = end_to_end_case(GEOMETRY, 33, "resend").to_json()
    replays = _replay([Replay("D0", "end-to-end", "resend", case)], Overlay())["results"]["D0"]
    assert [r["verdict"] for r in replays] == ["error"]
    status, why = status_of("lost-hit", replays)
    assert status == "not replayable"
    assert "DriverGapError" in why
