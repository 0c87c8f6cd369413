"""The runtime monitor's pieces that need no vLLM (kvcontract.tools.runtime_monitor): the
states-seen rule, the manager hook on a mock, the report and the reproducer. Its runs on
vLLM's engine are in tests/live/test_monitor_live.py."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

from kvcontract.spec.geometry import Geometry, fa, mamba, swa
from kvcontract.spec.properties.lookup import LookupCase
from kvcontract.spec.properties.store import StoreCase
from kvcontract.tools.runtime_monitor import (
    Finding,
    MonitorOptions,
    MonitorReport,
    RuntimeMonitor,
    StoreHistory,
    engine_theorem,
    hook_manager_method,
    judge_states,
    reproducer_source,
    spec_junction_of,
    store_theorem,
    variant_roles,
)
from kvcontract.vocabulary import LookupResult, RequestStatus

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
    report.judge("C13/deferral-has-cause")
    report.judge("C13/deferral-bounded")
    report.skip("an asynchronous lookup was in flight (RETRY)", "t.py::test_y", "request r")
    report.violations.append(_finding())
    document = report.to_json()
    assert list(document) == ["kvcontract_monitor", "vllm", "variant", "tests", "events",
                              "judged", "checks", "not_judged", "not_judged_examples",
                              "violations", "errors", "gaps"]
    assert list(document["judged"]) == ["C2", "C10", "C13"]  # clause order, not string order
    assert document["judged"]["C13"] == 2
    assert list(document["checks"]) == ["C13/deferral-bounded", "C13/deferral-has-cause"]
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


# -- C13: what a deferral waits on; C8, C9: the store step ------------------------------------
# A stand-in connector with what the hooks read, and a geometry given to its watch (no vLLM).
def _watched(connector: object, geometry: Geometry,
             options: MonitorOptions | None = None) -> RuntimeMonitor:
    from kvcontract.tools.runtime_monitor import _ConnectorWatch

    monitor = RuntimeMonitor(options)
    monitor._watches[connector] = _ConnectorWatch(connector, 0, monitor.options, geometry)
    return monitor


def _request(request_id: str, tokens: int, computed: int = 0,
             finished: bool = False) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id, num_tokens=tokens, num_prompt_tokens=tokens,
                           num_computed_tokens=computed, shared_prefix_boundary=0,
                           status=SimpleNamespace(name="FINISHED_STOPPED" if finished
                                                  else "RUNNING"),
                           is_finished=lambda: finished)


def _status(request: SimpleNamespace, keys: list[list[str]], blocks: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        req=request, req_context=object(), transfer_jobs=set(), max_load_tokens=None,
        max_offload_tokens=None,
        group_states=tuple(SimpleNamespace(offload_keys=list(group), block_ids=[1] * count,
                                           next_stored_chunk_idx=0)
                           for group, count in zip(keys, blocks, strict=True)))


class _Connector:
    """An offloading connector's scheduler side, as far as the monitor reads it."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(offload_prompt_only=True)
        self.manager = mock.MagicMock()
        self._req_status: dict[str, SimpleNamespace] = {}
        self._jobs: dict[int, SimpleNamespace] = {}
        self._chunks_being_loaded: set[str] = set()


FA4 = Geometry((fa(4),))
STATES = {"k0": H, "k1": H, "k2": M, "k3": H}
"""A 16-token request over FA4: chunks 0-1 ready, 2 missing, 3 ready: the contract's
answer is 8, its load set chunks 0-1."""


def _deferral(loading: str | None, job: str = "open",
              own_job: int | None = None) -> RuntimeMonitor:
    """The 16-token request's lookup defers while ``loading`` is counted as being loaded
    by request ``r1``'s load job, or with its own job in flight; the job is ``open``,
    ``ended`` (the worker reported it done, and the count or ``transfer_jobs`` still
    hold it) or ``none`` (a fixture's count: no job the monitor saw)."""
    connector = _Connector()
    monitor = _watched(connector, FA4)
    request = _request("r2", 16)
    status = _status(request, [list(STATES)], [4])
    connector._req_status["r2"] = status
    connector.manager.lookup.side_effect = lambda key, context: STATES[key]
    if loading is not None:
        connector._chunks_being_loaded.add(loading)
        if job != "none":
            connector._jobs[3] = SimpleNamespace(is_store=False, keys=(loading,), req_id="r1")
    if own_job is not None:
        status.transfer_jobs.add(own_job)
        if job != "none":
            connector._jobs[own_job] = SimpleNamespace(is_store=True, keys=("k0",), req_id="r2")
    if job == "ended":
        def update_connector_output(self: _Connector, connector_output: object) -> None:
            self._jobs.clear()  # a connector that forgets to drop the counts

        monitor._wrap("update_connector_output", update_connector_output)(
            connector, SimpleNamespace(kv_connector_worker_meta=None))

    def get_num_new_matched_tokens(self: _Connector, request: object,
                                   num_computed_tokens: int) -> tuple[None, bool]:
        if not status.transfer_jobs:
            for key in STATES:  # a connector that defers on any chunk being loaded
                self.manager.lookup(key, status.req_context)
        return None, False

    lookup = monitor._wrap("get_num_new_matched_tokens", get_num_new_matched_tokens)
    assert lookup(connector, request, 0) == (None, False)
    assert monitor.report.errors == []
    return monitor


def _kinds(monitor: RuntimeMonitor) -> list[tuple[str, str]]:
    return [(f.clause, f.kind) for f in monitor.report.violations]


def test_a_deferral_on_a_chunk_loaded_elsewhere_outside_the_load_set_has_no_cause() -> None:
    # Chunk 3 lies past the MISS: the contract's answer 8 loads chunks 0-1 only.
    monitor = _deferral("k3")
    assert _kinds(monitor) == [("C13", "deferral-has-cause")]
    finding = monitor.report.violations[0]
    assert finding.impact == "delay" and "contract's answer 8" in finding.message
    assert finding.witness is not None and finding.witness["num_tokens"] == 16
    assert monitor.report.checks["C13/deferral-has-cause"] == 1


def test_a_deferral_on_a_chunk_of_the_load_set_another_request_loads_has_its_cause() -> None:
    monitor = _deferral("k1")
    assert _kinds(monitor) == []
    assert monitor.report.checks["C13/deferral-has-cause"] == 1
    assert monitor.report.checks["C13/decides-once-ready"] == 1


def test_a_deferral_on_a_load_that_ended_does_not_decide_once_ready() -> None:
    # Chunk 1 is still counted as being loaded after its load job ended.
    monitor = _deferral("k1", job="ended")
    assert _kinds(monitor) == [("C13", "decides-once-ready")]
    assert monitor.report.violations[0].impact == "delay"


def test_a_loading_count_no_job_the_monitor_saw_holds_is_not_judged() -> None:
    # A test that adds a key to the connector's count by hand (vLLM's
    # test_swa_offload_window_covers_unaligned_hit): nothing is known to have ended.
    monitor = _deferral("k1", job="none")
    assert _kinds(monitor) == []
    assert monitor.report.checks["C13/decides-once-ready"] == 0
    assert any("never saw" in reason for reason in monitor.report.not_judged)


def test_a_deferral_on_the_requests_own_transfers() -> None:
    assert _kinds(_deferral(None, own_job=5)) == []
    stale = _deferral(None, job="ended", own_job=5)
    assert _kinds(stale) == [("C13", "decides-once-ready")]
    assert "transfer_jobs [5]" in stale.report.violations[0].message


def test_a_needless_deferral_in_c3s_scope_is_c3s_finding_not_c13s() -> None:
    # Nothing is being loaded and nothing is pending: C3 reports the deferral.
    monitor = _deferral(None)
    assert _kinds(monitor) == [("C3", "lookup")]
    assert monitor.report.checks["C13/deferral-has-cause"] == 1


FA16_SWA4 = Geometry((fa(16), swa(4, 8)))
"""A = 16 tokens, SWA blocks of 4 with a window of 8 (need 2 of every 4): a 32-token
prompt's SWA chunks 2, 3, 6, 7 are stored, and FA chunks 0-1 (docs/CONTRACT.md 5)."""


def _store_step(swa_offers: list[int], swa_index: int = 8, sampled: int = 0,
                manager: object | None = None,
                options: MonitorOptions | None = None) -> RuntimeMonitor:
    """A 32-token prompt prefilled in one step; the connector offers FA chunks 0-1 and
    the SWA chunks given, and moves its stored indices to 2 and ``swa_index``. With
    ``sampled`` output tokens the request holds them before its prompt is computed;
    ``manager``: the connector's (a test's mock by default)."""
    connector = _Connector()
    if manager is not None:
        connector.manager = manager  # type: ignore[assignment]
    monitor = _watched(connector, FA16_SWA4, options)
    request = _request("r", 32)
    request.num_tokens += sampled
    status = _status(request, [["f0", "f1"], [f"s{k}" for k in range(8)]], [2, 8])
    connector._req_status["r"] = status

    def build_connector_meta(self: _Connector, scheduler_output: object) -> None:
        fa_state, swa_state = status.group_states
        keys = fa_state.offload_keys[:2] + [swa_state.offload_keys[k] for k in swa_offers]
        self.manager.prepare_store(keys, status.req_context)
        fa_state.next_stored_chunk_idx, swa_state.next_stored_chunk_idx = 2, swa_index

    build = monitor._wrap("build_connector_meta", build_connector_meta)
    build(connector, SimpleNamespace(num_scheduled_tokens={"r": 32}, finished_req_ids=set()))
    assert monitor.report.errors == []
    return monitor


def test_a_store_step_that_offers_the_spec_steps_chunks_holds() -> None:
    monitor = _store_step([2, 3, 6, 7])
    assert _kinds(monitor) == []
    assert monitor.report.checks["C8/store-step"] == 2  # one judgement per group
    assert monitor.report.checks["C9/store-step"] == 2


def test_a_store_step_that_offers_an_undemanded_chunk_is_c8_waste() -> None:
    monitor = _store_step([2, 3, 5, 6, 7])
    assert _kinds(monitor) == [("C8", "store-step")]
    finding = monitor.report.violations[0]
    assert finding.impact == "waste" and "offered chunks [5]" in finding.message
    assert "[5] no reachable boundary demands it" in finding.message
    assert finding.witness is not None and finding.witness["spec_offers"] == [2, 3, 6, 7]


def test_a_store_step_that_misses_a_demanded_chunk_is_a_c9_lost_store() -> None:
    monitor = _store_step([2, 3, 6])
    assert _kinds(monitor) == [("C9", "store-step")]
    assert monitor.report.violations[0].impact == "lost-hit"
    assert "never offered chunks [7]" in monitor.report.violations[0].message


def test_a_stored_index_past_the_spec_steps_is_c9() -> None:
    # The index moves past a chunk the step could not store yet (the spec's is 8).
    monitor = _store_step([2, 3, 6, 7], swa_index=9)
    assert _kinds(monitor) == [("C9", "store-index")]


def test_a_step_of_a_request_sampled_mid_prefill_is_not_judged() -> None:
    # vLLM's model runner samples no token for a partial prefill; a stand-in that does
    # makes a step both prefill and decode, which no spec status describes.
    monitor = _store_step([2, 3, 5, 6, 7], sampled=1)
    assert _kinds(monitor) == [] and monitor.report.checks["C8/store-step"] == 0
    assert any("partial prefill" in reason for reason in monitor.report.not_judged)


# -- C12: the shared-prefix junction a lookup leaves on its request ---------------------------
FA4_SWA_R0 = Geometry((fa(4), swa(4, 8)), retention_interval=0)
"""25 tokens: the lookup's cap is 24, six chunks of 4 tokens in each group."""


def _lookup_case(fa_row: str, swa_row: str, geometry: Geometry = FA4_SWA_R0,
                 local: int = 0, cap: int | None = None) -> LookupCase:
    letters = {"H": H, "M": M, "P": P}
    return LookupCase("t", geometry, 25, local,
                      (tuple(letters[c] for c in fa_row), tuple(letters[c] for c in swa_row)),
                      cap)


@pytest.mark.parametrize(("fa_row", "swa_row", "hit", "retention", "keys", "junction",
                          "boundary"), [
    ("HHHHHH", "MMMMMM", 0, 0, 6, 24, 24),    # the SWA group cut the hit to 0: pin 24
    ("HHHHHH", "MMMMMM", 0, None, 6, 0, 24),  # no retention interval: never
    ("HHHHHH", "MMMMMM", 0, 32, 6, 24, 24),   # any interval
    ("HHHMHH", "MMMMMM", 0, 0, 6, 12, 12),    # the full-attention prefix ends at chunk 3
    ("HHHHHH", "MMMMMM", 0, 0, 5, 20, 20),    # clamped to the sparse group's keys
    ("HHHHHH", "MMHHMM", 16, 0, 6, 24, 24),   # cut at 16 below 24
    ("HHHHHH", "HHHHHH", 24, 0, 6, 0, 24),    # not cut: none
    ("MHHHHH", "MMMMMM", 0, 0, 6, 0, None),   # the full-attention groups serve nothing
])
def test_the_spec_junction_is_the_full_attention_boundary_a_sparse_group_cut(
        fa_row: str, swa_row: str, hit: int, retention: int | None, keys: int,
        junction: int, boundary: int | None) -> None:
    judged = spec_junction_of(_lookup_case(fa_row, swa_row), hit, retention, 1, keys)
    assert (judged.junction, judged.full_attention_boundary, judged.why_not) == (
        junction, boundary, None)


def test_a_junction_outside_the_contracts_cases_is_not_judged() -> None:
    mamba_geometry = Geometry((fa(4), mamba(4)), retention_interval=0)
    eagle_geometry = Geometry((fa(4, eagle=True), swa(4, 8)), retention_interval=0)
    for case, why in [
        (_lookup_case("HHHHHH", "MMMMMM", mamba_geometry), "a Mamba group"),
        (_lookup_case("HHHHHH", "MMMMMM", eagle_geometry), "EAGLE"),
        (_lookup_case("HHPHHH", "MMMMMM"), "a pending chunk"),
    ]:
        judged = spec_junction_of(case, 0, 0, 1, 6)
        assert judged.junction is None and why in str(judged.why_not)
    # A max_load_tokens cap at 22 (off a chunk end): vLLM rounds the boundary to 20.
    capped = spec_junction_of(_lookup_case("HHHHHH", "MMMMMM", cap=22), 0, 0, 1, 6, True)
    assert capped.junction is None and "max_load_tokens" in str(capped.why_not)
    assert spec_junction_of(_lookup_case("HHHHHH", "MMMMMM", cap=20), 0, 0, 1, 6,
                            True).junction == 20


def _junction_lookup(registered: int, before: int = 0, fa_row: str = "HHHHHH",
                     retention: int | None = 0) -> RuntimeMonitor:
    """A 25-token request over FA4 + SWA4(sw8): the connector asks every chunk (FA
    ``fa_row``, SWA all MISS), answers 0 and leaves the junction ``registered`` on the
    request, which held ``before`` (the local prefix cache's) when the lookup began."""
    connector = _Connector()
    connector.config = SimpleNamespace(offload_prompt_only=True, retention_interval=retention)
    monitor = _watched(connector, FA4_SWA_R0)
    request = _request("r", 25)
    request.shared_prefix_boundary = before
    keys = [[f"f{k}" for k in range(6)], [f"s{k}" for k in range(6)]]
    status = _status(request, keys, [6, 6])
    connector._req_status["r"] = status
    states = {f"f{k}": {"H": H, "M": M}[c] for k, c in enumerate(fa_row)}
    states.update({f"s{k}": M for k in range(6)})
    connector.manager.lookup.side_effect = lambda key, context: states[key]

    def get_num_new_matched_tokens(self: _Connector, request: SimpleNamespace,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        for group in keys:
            for key in group:
                self.manager.lookup(key, status.req_context)
        request.shared_prefix_boundary = registered
        return 0, False

    lookup = monitor._wrap("get_num_new_matched_tokens", get_num_new_matched_tokens)
    assert lookup(connector, request, 0) == (0, False)
    assert monitor.report.errors == []
    return monitor


def test_the_junction_vllm_registers_is_judged_against_the_spec() -> None:
    held = _junction_lookup(24)
    assert _kinds(held) == [] and held.report.checks["C12/junction-registered"] == 1
    lost = _junction_lookup(0)
    assert [(f.clause, f.impact) for f in lost.report.violations] == [("C12", "lost-hit")]
    finding = lost.report.violations[0]
    assert "the spec's is 24" in finding.message and finding.theorem is None
    assert finding.witness is not None and finding.witness["spec_junction"] == 24
    wasted = _junction_lookup(24, fa_row="MHHHHH")  # the full-attention groups serve none
    assert [(f.clause, f.impact) for f in wasted.report.violations] == [("C12", "waste")]
    assert _kinds(_junction_lookup(0, retention=None)) == []


def test_a_local_prefix_cache_junction_is_raised_never_lowered() -> None:
    # Below the spec's: the connector must raise it to 24.
    kept_low = _junction_lookup(8, before=8)
    assert [(f.clause, f.impact) for f in kept_low.report.violations] == [("C12", "lost-hit")]
    assert "the local prefix cache's 8" in kept_low.report.violations[0].message
    assert _kinds(_junction_lookup(24, before=8)) == []
    # At or past the spec's: vLLM keeps it; the contract says nothing of which one wins.
    kept_high = _junction_lookup(24, before=24)
    assert _kinds(kept_high) == [] and kept_high.report.checks["C12/junction-registered"] == 0
    assert any("local prefix cache's junction" in r for r in kept_high.report.not_judged)
    # No spec junction (FA serves nothing): the local one stays.
    assert _kinds(_junction_lookup(16, before=16, fa_row="MHHHHH")) == []
    assert _kinds(_junction_lookup(0, before=16, fa_row="MHHHHH")) == [
        ("C12", "junction-registered")]


# -- a store-step finding's witness: the request's store steps as a StoreCase -----------------
def _history(*steps: tuple[RequestStatus, int, int, int], prompt: int = 32,
             start_index: tuple[int, ...] = (0, 0)) -> StoreHistory:
    history = StoreHistory(start_index)
    for status, computed, scheduled, total in steps:
        history.advance(status, computed, scheduled, total, prompt, True, None)
    return history


PRE, DEC = RequestStatus.PREFILLING, RequestStatus.DECODING
FIN, ABO = RequestStatus.FINISHED, RequestStatus.ABORTED


def test_a_requests_store_steps_map_onto_a_store_case() -> None:
    prefill = _history((PRE, 0, 16, 32), (PRE, 16, 16, 32), (DEC, 32, 1, 33))
    case = prefill.case(FA16_SWA4)
    assert isinstance(case, StoreCase)
    assert (case.steps, case.decode, case.ending, case.start_hit) == ((16, 16), 1, "finished", 0)
    partial = _history((PRE, 0, 7, 32), (PRE, 7, 9, 32)).case(FA16_SWA4)
    assert isinstance(partial, StoreCase) and partial.ending == "aborted"  # its prompt is not done
    aborted = _history((PRE, 0, 7, 32), (ABO, 7, 0, 32)).case(FA16_SWA4)
    assert isinstance(aborted, StoreCase) and (aborted.steps, aborted.ending) == ((7,), "aborted")
    cached = _history((PRE, 16, 16, 32), start_index=(1, 4)).case(FA16_SWA4)
    assert isinstance(cached, StoreCase) and cached.start_hit == 16


@pytest.mark.parametrize(("steps", "start_index", "why"), [
    (((PRE, 0, 16, 32), (PRE, 20, 12, 32)), (0, 0), "a step the monitor did not see"),
    (((PRE, 0, 32, 32), (DEC, 32, 2, 34)), (0, 0), "a decode step of 2 tokens"),
    (((PRE, 0, 32, 32), (DEC, 32, 1, 33), (ABO, 33, 0, 33)), (0, 0), "an abort after decode"),
    (((PRE, 8, 24, 32),), (0, 2), "not a multiple"),
    (((PRE, 16, 16, 32),), (1, 3), "is not its hit's 4 chunks"),
])
def test_a_history_no_store_case_holds_says_why(
        steps: tuple[tuple[RequestStatus, int, int, int], ...], start_index: tuple[int, ...],
        why: str) -> None:
    found = _history(*steps, start_index=start_index).case(FA16_SWA4)
    assert isinstance(found, str) and why in found


def test_the_store_theorem_of_a_finding() -> None:
    case = StoreCase("t", FA16_SWA4, 32, (16, 16), "finished")
    assert store_theorem(case, "store-step", 1, [5], set()) == "C8/stores-only-demanded"
    assert store_theorem(case, "store-step", 1, [2], {2}) == "C8/offered-at-most-once"
    assert store_theorem(case, "store-step", 1, [2], set()) == "C9/store-steps"  # early
    assert store_theorem(case, "store-step", 1, [], set()) == "C9/store-steps"  # missing
    assert store_theorem(case, "store-index", 1, [], set()) == "C9/store-steps"
    assert engine_theorem("C8/stores-only-demanded") == "C8/upstream-store-stores-only-demanded"
    assert engine_theorem("C4/lookup-is-maximal") == "C4/upstream-lookup-is-maximal"


class _Manager:
    """A manager that is no mock: it takes every offer, or refuses every one."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse

    def prepare_store(self, keys: list[str], req_context: object) -> object:
        return None if self.refuse else SimpleNamespace(keys_to_store=list(keys))


def test_a_store_finding_gets_a_store_case_witness_and_a_reproducer(tmp_path: Path) -> None:
    monitor = _store_step([2, 3, 5, 6, 7], manager=_Manager(),
                          options=MonitorOptions(reproducers=tmp_path))
    (finding,) = monitor.report.violations
    assert finding.theorem == "C8/stores-only-demanded" and "no reproducer" not in finding.message
    assert finding.witness == StoreCase("vllm", FA16_SWA4, 32, (32,), "finished").to_json()
    assert finding.reproducer is not None
    source = Path(finding.reproducer).read_text()
    assert "C8/upstream-store-stores-only-demanded" in source
    namespace: dict[str, object] = {}
    exec(compile(source, finding.reproducer, "exec"), namespace)
    namespace["test_the_contract_holds_on_the_reference"]()  # type: ignore[operator]
    index = _store_step([2, 3, 6, 7], swa_index=9, manager=_Manager())
    assert [f.theorem for f in index.report.violations] == ["C9/store-steps"]


def test_a_store_finding_without_a_store_case_says_why() -> None:
    mocked = _store_step([2, 3, 5, 6, 7])  # the test's own MagicMock manager
    (finding,) = mocked.report.violations
    assert finding.theorem is None and finding.reproducer is None
    assert "(no reproducer: the test's manager is a mock" in finding.message
    refused = _store_step([2, 3, 5, 6, 7], manager=_Manager(refuse=True))
    (finding,) = refused.report.violations
    assert finding.theorem is None
    assert "(no reproducer: the manager refused an offer" in finding.message


# -- partial tails (docs/CONTRACT.md 9.2): C2 at the boundary and the load, on/off ---------
TAIL = Geometry((fa(64), mamba(64)), hash_block_size=16)
"""live.partial_tail's geometry: partial tails on (FA64 + Mamba64 hashed in 16)."""


class _TailConnector:
    """A stand-in with what the partial-tail hooks read: one request ``r`` whose last
    load job (1) holds ``keys``; ``being_loaded`` another request's loads."""

    def __init__(self, keys: tuple[str, ...] = (), supports: object = True) -> None:
        self.config = SimpleNamespace(supports_partial_tail=supports, kv_group_configs=(
            SimpleNamespace(group_idx=0), SimpleNamespace(group_idx=1)))
        self._jobs = {1: SimpleNamespace(is_store=False, keys=keys, req_id="r")}
        self._req_status = {"r": SimpleNamespace(transfer_jobs={1}, partial_tail_boundary=None,
                                                 max_load_tokens=None)}
        self.manager = mock.MagicMock()


PLACES = {"fa0": (0, 64), "fa1": (0, 128), "fa2": (0, 192), "fa224": (0, 224),
          "mb224": (1, 224), "fa208": (0, 208), "mb208": (1, 208)}
"""Where vLLM keyed each stand-in key (group, token position)."""


@pytest.fixture
def placed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Key positions as vLLM's ``ReqContext`` records them (no vLLM needed)."""
    monkeypatch.setattr("kvcontract.tools.runtime_monitor.key_places",
                        lambda connector, status, keys: {k: PLACES[k] for k in keys
                                                         if k in PLACES})


def _tail_load(answers: dict[str, LookupResult], loaded: tuple[str, ...],
               being_loaded: frozenset[str] = frozenset()) -> RuntimeMonitor:
    from kvcontract.tools.runtime_monitor import PartialTailLookup

    connector = _TailConnector(loaded)
    monitor = _watched(connector, TAIL)
    watch = monitor._watches[connector]
    watch.partial_tails["r"] = PartialTailLookup(224, 0, 192, dict(answers))
    monitor._judge_partial_tail_load(watch, connector, SimpleNamespace(request_id="r"),
                                     {"boundary": 224, "being_loaded": being_loaded}, 224)
    return monitor


def test_a_partial_tail_load_of_keys_answered_hit_holds(placed: None) -> None:
    keys = ("fa0", "fa1", "fa2", "fa224", "mb224")
    monitor = _tail_load(dict.fromkeys(keys, H), keys)
    assert monitor.report.checks["C2/partial-tail-loads"] == 1
    assert monitor.report.violations == [] and monitor.report.errors == []


def test_a_partial_tail_load_of_a_key_not_answered_hit_is_a_c2_crash(placed: None) -> None:
    keys = ("fa0", "fa1", "fa2", "fa224", "mb224")
    monitor = _tail_load({**dict.fromkeys(keys, H), "mb224": M, "fa2": P}, keys)
    (found,) = monitor.report.violations
    assert (found.clause, found.kind, found.impact) == ("C2", "partial-tail-loads", "crash")
    assert "group 1 at 224 (MISS)" in found.message and "group 0 at 192 (HIT_PENDING)" \
        in found.message and "'not ready'" in found.message
    assert "(no reproducer:" in found.message and found.reproducer is None
    assert found.witness is not None and "group 1 at 224: MISS" in found.witness["answers"]


def test_a_partial_tail_load_of_a_key_in_flight_elsewhere_is_c2(placed: None) -> None:
    keys = ("fa2", "fa224", "mb224")
    monitor = _tail_load(dict.fromkeys(keys, H), keys, frozenset({"fa224", "mb224"}))
    (found,) = monitor.report.violations
    assert (found.clause, found.kind, found.impact) == ("C2", "partial-tail-in-flight", "waste")
    assert "group 0 at 224, group 1 at 224" in found.message


def test_a_partial_tail_load_whose_lookup_was_not_seen_is_not_judged(placed: None) -> None:
    connector = _TailConnector(("fa224",))
    monitor = _watched(connector, TAIL)
    monitor._judge_partial_tail_load(monitor._watches[connector], connector,
                                     SimpleNamespace(request_id="r"),
                                     {"boundary": 224, "being_loaded": frozenset()}, 32)
    assert not monitor.report.checks and monitor.report.violations == []
    assert any("partial-tail load: the lookup that accepted it was not judged" in reason
               for reason in monitor.report.not_judged)


def _tail_lookup(boundary: int, answers: dict[str, LookupResult], *, local: int = 192,
                 complete: int = 0, full: int | None = None,
                 being_loaded: frozenset[str] = frozenset()) -> RuntimeMonitor:
    connector = _TailConnector()
    connector._req_status["r"].partial_tail_boundary = boundary
    monitor = _watched(connector, TAIL)
    watch = monitor._watches[connector]
    watch.complete_hit, watch.complete_boundary = [complete], [full]
    request = SimpleNamespace(request_id="r", num_tokens=230, num_prompt_tokens=230,
                              block_hashes=[None] * 14)
    monitor._judge_partial_tail_lookup(watch, connector, request, connector._req_status["r"],
                                       {"answers": answers, "being_loaded": being_loaded},
                                       {}, local, boundary - local)
    return monitor


def test_a_partial_tail_at_a_served_boundary_holds(placed: None) -> None:
    monitor = _tail_lookup(224, {"fa224": H, "mb224": H})
    report = monitor.report
    assert report.checks["C2/partial-tail-boundary"] == 1
    assert report.checks["C4/partial-tail-maximal"] == 1
    assert report.violations == [] and report.events["partial-tail hit"] == 1
    # C12's promise needs the producer's prompt: not judged, with the reason.
    assert any(reason.startswith("C12 partial tail:") for reason in report.not_judged)


@pytest.mark.parametrize(("boundary", "answers", "words"), [
    (224, {"fa224": H, "mb224": M}, "group 1 at 224: MISS"),
    (224, {"fa224": H}, "group 1 at 224: never asked"),
    (216, {"fa224": H}, "not a multiple of the 16-token hash block"),
    (272, {"fa224": H}, "not a boundary the search covers"),
])
def test_a_partial_tail_off_its_boundary_or_unserved_is_c2(placed: None, boundary: int,
                                                           answers: dict[str, LookupResult],
                                                           words: str) -> None:
    found = _tail_lookup(boundary, answers).report.violations
    assert [f.clause for f in found][:1] == ["C2"] and found[0].kind == "partial-tail-boundary"
    assert words in found[0].message and "(no reproducer:" in found[0].message


def test_a_tail_below_a_boundary_every_group_served_is_a_c4_lost_hit(placed: None) -> None:
    answers = {"fa224": H, "mb224": H, "fa208": H, "mb208": H}
    (found,) = _tail_lookup(208, answers).report.violations
    assert (found.clause, found.kind, found.impact) == ("C4", "partial-tail-maximal",
                                                        "lost-hit")
    assert "at 224 was answered HIT" in found.message
    # Being loaded elsewhere, 224 is not served: the tail at 208 is the largest.
    monitor = _tail_lookup(208, answers, being_loaded=frozenset({"mb224"}))
    assert monitor.report.violations == []
    assert monitor.report.checks["C4/partial-tail-maximal"] == 1


def test_an_anchor_past_the_complete_hit_leaves_maximality_unjudged(placed: None) -> None:
    monitor = _tail_lookup(224, {"fa224": H, "mb224": H}, local=128, complete=0, full=192)
    assert monitor.report.checks["C2/partial-tail-boundary"] == 1
    assert "C4/partial-tail-maximal" not in monitor.report.checks
    assert any(reason.startswith("C4 partial tail: a sparse group cut")
               for reason in monitor.report.not_judged)


@pytest.mark.parametrize(("geometry", "supports", "found"), [
    (TAIL, True, []),
    (TAIL, False, [("C12", "lost-hit")]),
    (Geometry((fa(64), mamba(64)), hash_block_size=16, blocks_per_chunk=2), False, []),
    (Geometry((fa(64), mamba(64)), hash_block_size=16, blocks_per_chunk=2), True,
     [("C2", "corruption")]),
])
def test_vllms_partial_tail_decision_is_the_contracts(geometry: Geometry, supports: bool,
                                                       found: list[tuple[str, str]]) -> None:
    connector = _TailConnector(supports=supports)
    monitor = _watched(connector, geometry)
    monitor._judge_partial_tail_on(monitor._watches[connector], connector)
    assert monitor.report.checks["C12/partial-tail-on"] == 1
    assert [(f.clause, f.impact) for f in monitor.report.violations] == found


def test_an_eagle_geometry_or_a_release_without_the_flag_is_not_judged_on_or_off() -> None:
    eagle = Geometry((fa(64, eagle=True), mamba(64)), hash_block_size=16)
    for geometry, supports in ((eagle, True), (TAIL, None)):
        connector = _TailConnector(supports=supports)
        monitor = _watched(connector, geometry)
        monitor._judge_partial_tail_on(monitor._watches[connector], connector)
        assert not monitor.report.checks and monitor.report.violations == []
        (reason,) = monitor.report.not_judged
        assert reason.startswith("partial tails on/off:")
    assert "not checked" in reason or "supports_partial_tail" in reason
