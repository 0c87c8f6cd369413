"""The runtime monitor's pieces that need no vLLM (kvcontract.tools.runtime_monitor): the
states-seen rule, the manager hook on a mock, the report and the reproducer. Its runs on
vLLM's engine are in tests/live/test_monitor_live.py."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from unittest import mock

import pytest

from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.tools.runtime_monitor import (
    Finding,
    MonitorReport,
    hook_manager_method,
    judge_states,
    reproducer_source,
    variant_roles,
)
from kvcontract.vocabulary import LookupResult

H, M, P = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING
FA_SWA = Geometry((fa(4), swa(4, 8)))


def test_states_seen_decide_the_answer_when_the_unseen_chunks_cannot_matter() -> None:
    # The SWA scan found its window at chunks 2-3 and never asked about 0-1; the FA scan
    # asked about every chunk. Whatever chunks 0-1 of the SWA group hold, the answer is 16.
    seen = [[H] * 6, [None, None, H, H, M, P]]
    judged = judge_states(FA_SWA, 25, 0, seen, [6, 6], None)
    assert judged.why_not is None and len(judged.cases) == 1 and judged.unasked == ()
    assert judged.cases[0].states[1][:2] == (M, M)  # the unseen ones, filled MISS


def test_an_answer_that_reads_chunks_vllm_never_asked_about_gives_two_witnesses() -> None:
    # The FA group was never asked about chunks 3-5: a hit at 16 needs chunk 3, 12 does
    # not. vLLM answers the same whatever they hold; the contract does not.
    seen = [[H, H, H, None, None, None], [H, H, H, H, M, M]]
    judged = judge_states(FA_SWA, 25, 0, seen, [6, 6], None)
    assert judged.why_not is None and len(judged.cases) == 2
    assert judged.unasked == ((0, 3), (0, 4), (0, 5))
    low, high = judged.cases
    assert low.states[0][3:] == (M, M, M) and high.states[0][3:] == (H, H, H)


def test_chunks_without_keys_decide_nothing() -> None:
    # vLLM has keys for 3 FA chunks only (its hashes and the geometry's differ): no case.
    seen = [[H, H, H], [H, H, H, H, M, M]]
    judged = judge_states(FA_SWA, 25, 0, seen, [3, 6], None)
    assert judged.cases == ()
    assert judged.why_not is not None and "no offload keys" in judged.why_not


def test_a_budget_caps_the_case() -> None:
    seen = [[H] * 6, [H] * 6]
    judged = judge_states(FA_SWA, 25, 0, seen, [6, 6], 12)
    assert judged.cases[0].max_hit_tokens == 12


def _hook_lookup(manager: object, sink: object) -> bool:
    return hook_manager_method(manager, "lookup",
                               lambda args, kwargs, result: sink(args[0], result))  # type: ignore[operator]


def test_the_mock_hook_keeps_what_the_test_configured_and_records_answers() -> None:
    manager = mock.MagicMock()
    manager.lookup.return_value = H
    seen: list[tuple[object, object]] = []
    assert _hook_lookup(manager, lambda key, result: seen.append((key, result)))
    assert manager.lookup("k1", None) is H
    manager.lookup.side_effect = lambda key, context: M
    assert manager.lookup("k2", None) is M
    assert seen == [("k1", H), ("k2", M)]
    # The test's own records are untouched.
    assert manager.lookup.call_count == 2
    manager.lookup.assert_called_with("k2", None)
    assert isinstance(manager, mock.MagicMock)
    # A second hook replaces the sink, never stacks a second wrapper.
    again: list[object] = []
    assert _hook_lookup(manager, lambda key, result: again.append(key))
    manager.lookup("k3", None)
    assert again == ["k3"] and len(seen) == 2


def test_a_mock_hook_is_confined_to_its_own_mock() -> None:
    hooked, other = mock.MagicMock(), mock.MagicMock()
    seen: list[object] = []
    _hook_lookup(hooked, lambda key, result: seen.append(key))
    other.lookup("x", None)
    hooked.lookup("y", None)
    assert seen == ["y"]


def test_a_real_manager_is_hooked_on_the_instance() -> None:
    class Manager:
        def lookup(self, key: object, context: object) -> LookupResult:
            return H if key == "a" else M

    manager, untouched = Manager(), Manager()
    seen: list[tuple[object, object]] = []
    assert _hook_lookup(manager, lambda key, result: seen.append((key, result)))
    assert manager.lookup("a", None) is H and manager.lookup("b", None) is M
    assert untouched.lookup("a", None) is H
    assert seen == [("a", H), ("b", M)]


def test_a_sink_that_raises_changes_nothing_vllm_sees() -> None:
    manager = mock.MagicMock()
    manager.lookup.return_value = P

    def broken(key: object, result: object) -> None:
        raise RuntimeError("monitor bug")

    _hook_lookup(manager, broken)
    assert manager.lookup("k", None) is P


def _finding(**changes: object) -> Finding:
    values: dict[str, object] = dict(
        test="t.py::test_x", clause="C3", impact="delay", kind="lookup",
        message="request r: vLLM's connector accepted None (local 0), the contract answers 16",
        theorem="C3/lookup-defers-only-in-scope",
        witness={"geometry_name": "vllm", "geometry": FA_SWA.to_dict(), "num_tokens": 25,
                 "local_hit": 0,
                 "states": {"0": ["HIT"] * 6, "1": ["MISS", "MISS", "HIT", "HIT", "MISS",
                                                   "HIT_PENDING"]}})
    values.update(changes)
    return Finding(**values)  # type: ignore[arg-type]


def test_the_report_document_and_summary() -> None:
    report = MonitorReport(vllm="0.34.0", tests=3)
    report.events.update({"lookup": 4, "load": 1})
    report.judged.update({"C10": 2, "C2": 3})
    report.skip("an asynchronous lookup was in flight (RETRY)", "t.py::test_y", "request r")
    report.violations.append(_finding())
    document = report.to_json()
    assert list(document) == ["kvcontract_monitor", "vllm", "variant", "tests", "events",
                              "judged", "not_judged", "not_judged_examples", "violations",
                              "errors", "gaps"]
    assert list(document["judged"]) == ["C2", "C10"]  # clause order, not string order
    assert document["violations"][0]["clause"] == "C3"
    json.dumps(document)
    lines = report.summary_lines()
    assert lines[0].startswith("kvcontract monitor: vLLM 0.34.0: 3 tests, 5 connector events")
    assert any("violations: C3 1" in line for line in lines)
    assert len(lines) <= 24


def test_the_reproducer_is_a_pytest_file_that_replays_on_the_reference(tmp_path: Path) -> None:
    source = reproducer_source(_finding())
    ast.parse(source)
    assert "C3/upstream-lookup-defers-only-in-scope" in source
    path = tmp_path / "test_repro.py"
    path.write_text(source)
    namespace: dict[str, object] = {}
    exec(compile(source, str(path), "exec"), namespace)
    # The contract holds on the reference: the reproducer's first test passes anywhere.
    namespace["test_the_contract_holds_on_the_reference"]()  # type: ignore[operator]


@pytest.mark.parametrize(("name", "roles"), [
    ("stale-pending", ["sliding_lookup"]),
    ("unaligned-hit", ["load_window"]),
    ("mtp-extra-retained", ["window", "load_window"]),
])
def test_variant_roles_carry_the_historic_defects_into_vllm(name: str,
                                                            roles: list[str]) -> None:
    found, _left = variant_roles(name)
    assert found == roles


def test_a_failed_store_published_as_stored_is_a_c14_violation() -> None:
    from types import SimpleNamespace

    from kvcontract.tools.runtime_monitor import RuntimeMonitor

    class Connector:  # a stand-in with what the hook reads
        def __init__(self) -> None:
            self._jobs = {7: SimpleNamespace(is_store=True, keys=("k0", "k1"), req_id="r")}
            self.manager = mock.MagicMock()
            self.config = None

    monitor = RuntimeMonitor()
    connector = Connector()

    def update_connector_output(self: Connector, connector_output: object) -> None:
        # A connector that completes the failed job as stored (vLLM 0.33.0's rule).
        del connector._jobs[7]
        connector.manager.complete_store(("k0", "k1"), None, success=True)

    wrapped = monitor._wrap("update_connector_output", update_connector_output)
    output = SimpleNamespace(kv_connector_worker_meta=SimpleNamespace(failed_jobs={7}))
    wrapped(connector, output)
    assert [(f.clause, f.kind) for f in monitor.report.violations] == [("C14", "failed-store")]
    assert monitor.report.judged["C14"] == 1 and monitor.report.errors == []


def test_a_request_whose_load_failed_offered_a_hit_again_is_a_c15_violation() -> None:
    from types import SimpleNamespace

    from kvcontract.tools.runtime_monitor import RuntimeMonitor

    class Connector:  # a stand-in with what the hooks read
        def __init__(self) -> None:
            self._jobs = {3: SimpleNamespace(is_store=False, keys=("k0",), req_id="r")}
            self._req_status: dict[str, object] = {}
            self.manager = mock.MagicMock()
            self.config = None

    def update_connector_output(self: Connector, connector_output: object) -> None:
        del self._jobs[3]  # the failed load job is done

    def get_num_new_matched_tokens(self: Connector, request: object,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        return 12, True  # a connector that forgot the failure

    monitor = RuntimeMonitor()
    connector = Connector()
    monitor._wrap("update_connector_output", update_connector_output)(
        connector, SimpleNamespace(kv_connector_worker_meta=SimpleNamespace(failed_jobs={3})))
    assert monitor.report.events["failed load"] == 1
    lookup = monitor._wrap("get_num_new_matched_tokens", get_num_new_matched_tokens)
    assert lookup(connector, SimpleNamespace(request_id="r"), 0) == (12, True)
    assert [(f.clause, f.kind) for f in monitor.report.violations] == [("C15", "failed-load")]
    assert monitor.report.judged["C15"] == 1 and monitor.report.errors == []
