"""tools/fuzz and tools/monitor on the request's lifecycle (C13-C15).

The monitor judges every program's lifecycle trace by the catalogue's lifecycle
properties (those declaring ``Observer.MONITOR``) once it drains; an operation that
raises stops the program there and is C14's crash finding (not an internal error of the
fuzzer); a finding keeps its judge's own impact; a fixture's pending chunk is a stalled
write, not a chunk the system left pending.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from kvcontract.impl.system import ChunkState
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.properties.base import Observer
from kvcontract.spec.properties.catalog import observed_by
from kvcontract.tools.cli import cli
from kvcontract.tools.fuzz import Lockstep, Scenario, make_state_machine, run_fuzz
from kvcontract.tools.monitor import monitored_properties
from kvcontract.vocabulary import Impact

GEO = Geometry((fa(4), swa(4, 8)))
TOKENS = [(7 * i + 3) % 50 for i in range(17)]


def test_the_monitor_judges_every_lifecycle_property_of_the_catalogue() -> None:
    lifecycle = [p.theorem_id for p in observed_by(Observer.MONITOR, family="lifecycle")]
    assert "C13/deferral-bounded" in lifecycle and "C14/raises-nothing" in lifecycle
    assert "C15/resumes-on-present-kv" in lifecycle
    _, judged = monitored_properties()
    assert set(lifecycle) <= {p.theorem_id for p in judged}


def test_an_operation_that_raises_is_a_c14_crash_and_stops_the_program() -> None:
    program = [("add_request", "p", TOKENS, 1), ("abort", "p"), ("step", 8),
               ("add_request", "q", TOKENS, 1)]
    lockstep = Lockstep(get_implementation("abort-unscheduled-crash"),
                        Scenario("abort", GEO, program), "cpu")
    for op in program:
        lockstep.apply(op)
    lockstep.apply(("drain",))
    crashes = [d for d in lockstep.findings if d.kind == "crash"]
    assert crashes and crashes[0].clause == "C14"
    assert "C14/raises-nothing" in crashes[0].message and "abort of p raised" in crashes[0].message
    assert crashes[0].impact is Impact.CRASH
    # Nothing after the raising operation ran, as an engine-fatal error ends vLLM's engine.
    assert lockstep.program == ["add_request('p', <17 tokens>, 1)", "abort('p')"]
    assert lockstep.stopped


def test_a_crash_variant_is_a_finding_on_the_command_line() -> None:
    result = CliRunner().invoke(cli, ["fuzz", "--impl", "abort-unscheduled-crash",
                                      "--examples", "0", "--quiet"], prog_name="kvcontract")
    assert result.exit_code == 1, result.output
    assert "internal error" not in result.output
    assert "C14/raises-nothing" in result.output


def test_a_stall_keeps_its_judges_impact_in_the_report() -> None:
    report = run_fuzz("no-deadline", examples=0)
    stalls = [d for d in report.differences if d.clause == "C13"]
    assert stalls and all(d.impact is Impact.STALL for d in stalls)
    assert "never decided" in stalls[0].message
    shown = json.loads(json.dumps(report.to_json()))["differences"]
    assert {d["impact"] for d in shown if d["clause"] == "C13"} == {"stall"}
    assert all("graded" not in d for d in shown)


def test_the_reference_decides_the_stalled_store_seed_by_its_deadline() -> None:
    report = run_fuzz("reference", examples=0)
    assert report.differences == []
    assert report.per_clause["C13"] > 0 and report.per_clause["C14"] > 0


def test_a_fixtures_pending_chunk_is_a_stalled_write() -> None:
    program = [("install_chunk", TOKENS, 1, 3, ChunkState.PENDING),
               ("add_request", "consumer", TOKENS, 1), *[("step", 64)] * 3]
    lockstep = Lockstep(get_implementation("reference"), Scenario("fixture", GEO, program),
                        "cpu")
    for op in program:
        lockstep.apply(op)
    lockstep.apply(("drain",))
    assert lockstep.findings == []
    # The system itself never completes that chunk: it stays pending, and is excused.
    final = lockstep.systems[0].lifecycle_final()
    assert final["pending"] and set(final["pending"]) <= set(final["stalled"])


def test_the_state_machine_has_the_lifecycle_faults_live_has_what_vllm_can_take() -> None:
    impl = get_implementation("reference")
    # A failed load (vLLM's recompute policy) and an error finish reach vLLM through its
    # own API; nothing drops the offload tier's idle chunks there.
    everywhere = ("stall_next_store", "retry_lookups", "fail_next_load", "finish_with_error")
    offline_only = ("reset_prefix_cache",)
    offline = make_state_machine(impl, "cpu", 0)
    live = make_state_machine(impl, "cpu", 0, live=True)
    assert all(hasattr(offline, name) for name in everywhere + offline_only)
    assert all(hasattr(live, name) for name in everywhere)
    assert not any(hasattr(live, name) for name in offline_only)


def test_the_state_machine_finds_the_abort_before_scheduling() -> None:
    report = run_fuzz("abort-unscheduled-crash", examples=40,
                      scenarios=[])  # the state machine alone
    # Its first finding: the abort's store step offers a chunk nothing was computed for
    # (the real manager's crash on it is the same root cause, one step further).
    assert [d.clause for d in report.differences] == ["C14"]
    assert "ended-store-horizon" in report.differences[0].message
