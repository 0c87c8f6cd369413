"""The runtime monitor on vLLM's own engine (kvcontract.tools.runtime_monitor): vLLM's
scheduler and connector driven by kvcontract's live session, judged online; a historic
defect put into vLLM's scanner (kvcontract.live.judge.rebinding) is caught."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcontract.impl.variants import VARIANTS
from kvcontract.live.judge.rebinding import rebound
from kvcontract.live.trace import prompt_tokens
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.tools.runtime_monitor import RuntimeMonitor
from tests.live.conftest import needs_vllm

pytestmark = [pytest.mark.live, needs_vllm]

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def _monitored() -> Iterator[RuntimeMonitor]:
    monitor = RuntimeMonitor()
    assert monitor.install(), monitor.report.gaps
    try:
        yield monitor
    finally:
        monitor.uninstall()


def _producer_then_consumer(session: Any, tokens: list[int], max_tokens: int, *,
                            consumer_steps: int) -> None:
    """A producer of ``tokens`` for three steps, the GPU prefix cache emptied, then a
    consumer of the same tokens for ``consumer_steps`` steps (64 tokens a step)."""
    session.add_request("producer", tokens, max_tokens)
    for _ in range(3):
        session.step(64)
    session.evict_gpu_cache()
    session.add_request("consumer", tokens, max_tokens)
    for _ in range(consumer_steps):
        session.step(64)


def _drive_stale_pending(variant: str | None) -> list[int | None]:
    """FA4 + SWA4(sw 8), 25 tokens: every FA chunk ready; the SWA group's chunks 0-3
    ready, 4 absent, 5 being stored. The contract's answer is 16 (the window at chunks
    2-3; the pending chunk lies right of a miss, outside it). vLLM's hits, per lookup."""
    from kvcontract.live.session import LiveSession

    context = (rebound(["sliding_lookup"], implementation=VARIANTS[variant]) if variant
               else contextlib.nullcontext())
    with context:
        session = LiveSession.open(Geometry((fa(4), swa(4, 8))))
        tokens = prompt_tokens(25)
        for chunk in range(6):
            session.install_chunk(tokens, 0, chunk, "ready")
        for chunk in range(4):
            session.install_chunk(tokens, 1, chunk, "ready")
        session.install_chunk(tokens, 1, 5, "pending")
        session.add_request("consumer", tokens, 2)
        for _ in range(2):
            session.step(64)
        observation = session.close()
    return [m.external for m in observation.matches]


def _stale_pending_states(variant: str | None) -> tuple[RuntimeMonitor, list[int | None]]:
    with _monitored() as monitor:
        hits = _drive_stale_pending(variant)
    return monitor, hits


def test_vllm_meets_the_contract_on_the_states_it_saw() -> None:
    monitor, hits = _stale_pending_states(None)
    report = monitor.report
    assert hits[0] == 16
    assert report.violations == [] and report.errors == []
    # Lookup (C3, C4), load keys and load set (C2), retention (C1), stores (C8-C10).
    assert {"C1", "C2", "C3", "C4", "C8", "C9", "C10"} <= set(report.judged)
    assert report.checks["C8/store-step"] == report.checks["C9/store-step"] >= 2
    assert report.events["lookup"] >= 1 and report.events["load"] == 1


def test_the_stale_pending_defect_in_vllms_scanner_is_a_c3_violation() -> None:
    monitor, hits = _stale_pending_states("stale-pending")
    assert hits and hits[0] is None  # vLLM, with the defect, defers
    found = monitor.report.violations
    assert [f.clause for f in found] == ["C3"]
    assert "the contract answers 16" in found[0].message
    assert found[0].repeats == len(hits)
    assert found[0].witness is not None and found[0].witness["num_tokens"] == 25
    assert monitor.report.errors == []


def test_a_deferral_on_a_stalled_store_has_its_cause_on_vllm() -> None:
    """A resend of a producer whose first store never completes: vLLM's real manager
    answers its window's chunks HIT_PENDING, so each deferral has its cause (C3's
    pending chunk in the window) and waits on a store still open."""
    from kvcontract.live.session import LiveSession

    with _monitored() as monitor:
        session = LiveSession.open(Geometry((fa(4), swa(4, 8))))
        tokens = prompt_tokens(25)
        session.stall_next_store()
        _producer_then_consumer(session, tokens, 2, consumer_steps=3)
        observation = session.close()
    report = monitor.report
    assert [m.external for m in observation.matches][1:] == [None, None, None]
    assert report.checks["C13/deferral-has-cause"] == 3
    assert report.checks["C13/decides-once-ready"] == 3
    assert report.violations == [] and report.errors == []


def test_a_failed_store_is_judged_unpublished_on_vllm() -> None:
    from kvcontract.live.session import LiveSession
    from tests.live.conftest import has

    if not has("failed-transfer-jobs"):
        pytest.skip("this vLLM's worker reports no failed transfers")
    with _monitored() as monitor:
        session = LiveSession.open(Geometry((fa(4),)))
        session.fail_next_store()
        session.add_request("producer", prompt_tokens(17), 2)
        for _ in range(3):
            session.step(64)
        session.drain()
        session.close()
    report = monitor.report
    assert report.events["failed store"] == 1
    assert report.judged["C14"] == 1
    assert report.violations == [] and report.errors == []


def test_the_serving_hook_is_vllms_general_plugin(tmp_path: Path) -> None:
    """``KVCONTRACT_MONITOR=1``: vLLM's plugin loader installs the monitor in the
    process; a violation is logged and appended to ``KVCONTRACT_MONITOR_REPORT``."""
    report = tmp_path / "serve.jsonl"
    child = (
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "from kvcontract import monitor\n"
        "assert len(monitor._SERVING) == 1, monitor._SERVING\n"
        "from tests.live.test_monitor_live import _drive_stale_pending\n"
        "_drive_stale_pending('stale-pending')\n"
    )
    env = {**os.environ, "KVCONTRACT_MONITOR": "1", "KVCONTRACT_MONITOR_REPORT": str(report),
           "PYTHONPATH": str(ROOT), "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert lines and {line["clause"] for line in lines} == {"C3"}
    assert "kvcontract monitor: C3" in done.stderr


def _drive_gpu_hit_inside_the_last_chunk() -> list[tuple[int, int | None]]:
    """FA4, 3 blocks a chunk, a 13-token request with a 4-token GPU hit and chunk 0
    ready in the CPU tier: the consumer's ``(local hit, external hit)`` per lookup."""
    from kvcontract.live.session import LiveSession

    session = LiveSession.open(Geometry((fa(4),), blocks_per_chunk=3))
    tokens = prompt_tokens(13)
    session.add_request("warm", tokens[:5], 1)  # puts block 0 in the GPU prefix cache
    for _ in range(3):
        session.step(64)
    session.install_chunk(tokens, 0, 0, "ready")
    session.add_request("consumer", tokens, 1)
    for _ in range(2):
        session.step(64)
    observation = session.close()
    return [(m.local_hit, m.external) for m in observation.matches
            if m.request.startswith("consumer")]


def test_a_gpu_hit_inside_the_last_chunk_loses_its_offloaded_remainder() -> None:
    """Found by the monitor in vLLM's own ``test_offloading_connector``: vLLM's early exit
    (less than one chunk between the local hit and the cap) answers without a lookup; the
    contract's answer is 12 (docs/CONTRACT.md, C4)."""
    with _monitored() as monitor:
        hits = _drive_gpu_hit_inside_the_last_chunk()
    assert hits[0] == (4, 0)
    found = monitor.report.violations
    assert [(f.clause, f.impact) for f in found] == [("C4", "lost-hit")]
    assert "the contract answers 12" in found[0].message
    assert "did not read group 0 chunk 0" in found[0].message
    # The request's ring: its events up to the violation.
    assert found[0].recent is not None
    assert found[0].recent[-1].endswith("lookup at local hit 4: 0 (0 keys asked)")


CHILD_TEST = """
from tests.live.test_monitor_live import _drive_gpu_hit_inside_the_last_chunk


def test_resend():
    assert _drive_gpu_hit_inside_the_last_chunk()[0] == (4, 0)
"""


@pytest.mark.slow  # three child pytests, each importing vLLM: 40 s (the suite's budget)
def test_the_plugin_reports_fails_on_request_and_writes_reproducers(tmp_path: Path) -> None:
    (tmp_path / "test_child.py").write_text(CHILD_TEST)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_TARGET_DEVICE": "cpu"}

    def pytest_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-p", "kvcontract.monitor", *args, "test_child.py"],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300, check=False)

    report = tmp_path / "monitor.json"
    plain = pytest_run("--kvcontract-report", str(report), "--kvcontract-reproducers",
                       str(tmp_path / "repro"))
    assert plain.returncode == 0, plain.stdout[-2000:]  # the test keeps its own outcome
    document = json.loads(report.read_text())
    (violation,) = document["violations"]
    assert violation["test"] == "test_child.py::test_resend"
    assert (violation["clause"], violation["theorem"]) == ("C4", "C4/lookup-is-maximal")
    reproducer = Path(violation["reproducer"])
    assert reproducer.exists()
    # The reproducer runs without vLLM's harness: the reference meets the contract there,
    # vLLM's engine (installed here) does not.
    replayed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               str(reproducer)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300, check=False)
    assert "1 failed, 1 passed" in replayed.stdout, replayed.stdout[-2000:]
    failing = pytest_run("--kvcontract-fail")
    assert failing.returncode == 1 and "kvcontract monitor:" in failing.stdout


def _deferred_consumer(monitor: RuntimeMonitor, *, store_delay: int | None) -> None:
    """FA4, 17 tokens: the producer's store job reported ``store_delay`` steps after it is
    submitted (None: never), the GPU prefix cache emptied, a consumer of the same tokens
    asking every step while the producer's chunks are pending."""
    from kvcontract.live.session import LiveSession
    from kvcontract.live.worker import Timing

    timing = (Timing("delayed", delay=store_delay, applies_to="store")
              if store_delay is not None else None)
    session = LiveSession.open(Geometry((fa(4),)), timing=timing)
    tokens = prompt_tokens(17)
    if store_delay is None:
        session.stall_next_store()
    _producer_then_consumer(session, tokens, 1, consumer_steps=12)
    session.close()
    monitor.flush()


def test_a_deferral_past_the_bound_is_c13() -> None:
    """vLLM defers while a store is pending and has no deadline (the audit's C13 stall):
    never decided, it is a stall; decided once the store is reported, past D = 4 steps,
    a delay; within D, nothing."""
    with _monitored() as monitor:
        _deferred_consumer(monitor, store_delay=None)
    found = [f for f in monitor.report.violations if f.clause == "C13"]
    assert [(f.impact, f.theorem) for f in found] == [("stall", "C13/deferral-bounded")]
    assert "never decided" in found[0].message and "bound D = 4" in found[0].message
    with _monitored() as monitor:
        _deferred_consumer(monitor, store_delay=9)
    found = [f for f in monitor.report.violations if f.clause == "C13"]
    assert [f.impact for f in found] == ["delay"], [f.message for f in found]
    assert "was decided at step" in found[0].message
    with _monitored() as monitor:
        _deferred_consumer(monitor, store_delay=3)
    assert [f for f in monitor.report.violations if f.clause == "C13"] == []
    assert monitor.report.judged["C13"] >= 1


# -- C12: the shared-prefix junction; a store finding's StoreCase witness --------------------
def _drive_junction_consumer() -> list[int | None]:
    """FA4 + SWA4(sw 8), retention 0, 25 tokens: every FA chunk ready, no SWA chunk. The
    SWA group cuts the hit to 0 below the 24 tokens the FA group serves: the contract's
    junction is 24 (docs/CONTRACT.md 9.3). The consumer's hits."""
    from kvcontract.live.session import LiveSession

    session = LiveSession.open(Geometry((fa(4), swa(4, 8)), retention_interval=0))
    tokens = prompt_tokens(25)
    for chunk in range(6):
        session.install_chunk(tokens, 0, chunk, "ready")
    session.add_request("consumer", tokens, 2)
    for _ in range(2):
        session.step(64)
    observation = session.close()
    return [m.external for m in observation.matches]


def test_the_junction_a_lookup_leaves_is_judged_on_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.34.0's connector registers the junction (it holds); a release without
    ``_maybe_register_shared_prefix_junction`` (0.33.0) registers none: a lost hit. With
    vLLM's rule made a no-op, any release loses it."""
    from kvcontract.tools.runtime_monitor import _scheduler_class

    cls = _scheduler_class()
    registers = hasattr(cls, "_maybe_register_shared_prefix_junction")
    with _monitored() as monitor:
        assert _drive_junction_consumer()[0] == 0
    report = monitor.report
    assert report.checks["C12/junction-registered"] == 1 and report.errors == []
    found = [(f.clause, f.impact) for f in report.violations]
    assert found == ([] if registers else [("C12", "lost-hit")])
    assert report.events["junction"] == (1 if registers else 0)
    monkeypatch.setattr(cls, "_maybe_register_shared_prefix_junction",
                        lambda *args: None, raising=False)
    with _monitored() as monitor:
        _drive_junction_consumer()
    (finding,) = monitor.report.violations
    assert (finding.clause, finding.impact) == ("C12", "lost-hit")
    assert "junction is 0; the spec's is 24" in finding.message


ABORTED_TAIL = {"geometry": Geometry((fa(16), swa(4, 8)), blocks_per_chunk=8),
                "prompt_len": 136, "steps": (7,) * 6}
"""docs/vllm-findings.md, "the final tail an abort stores from a stale block table": at
the abort (42 tokens computed) both releases offer SWA chunk 0, whose marked blocks the
window freed; the spec's step offers nothing (C8, waste)."""


def _monitored_abort(folder: Path) -> RuntimeMonitor:
    from kvcontract.live.judge.engines import EnginePool
    from kvcontract.live.judge.stores import StoreJudge
    from kvcontract.spec.properties.store import StoreCase
    from kvcontract.tools.runtime_monitor import MonitorOptions

    case = StoreCase("t", ABORTED_TAIL["geometry"], ABORTED_TAIL["prompt_len"],
                     ABORTED_TAIL["steps"], "aborted")
    monitor = RuntimeMonitor(MonitorOptions(reproducers=folder))
    assert monitor.install(), monitor.report.gaps
    pool = EnginePool()
    try:
        StoreJudge(pool).observe(case)
    finally:
        monitor.uninstall()
        pool.close()
    return monitor


def test_a_store_finding_on_vllm_has_its_store_case_witness(tmp_path: Path) -> None:
    from kvcontract.spec.properties.store import StoreCase

    monitor = _monitored_abort(tmp_path)
    assert monitor.report.errors == []
    (finding,) = monitor.report.violations
    assert (finding.clause, finding.kind, finding.impact) == ("C8", "store-step", "waste")
    assert finding.theorem == "C8/stores-only-demanded"
    assert finding.witness == StoreCase("vllm", ABORTED_TAIL["geometry"], 136, (7,) * 6,
                                        "aborted").to_json()
    assert finding.reproducer is not None and Path(finding.reproducer).exists()


@pytest.mark.slow
def test_the_store_reproducer_fails_on_vllm_and_holds_on_the_reference(tmp_path: Path) -> None:
    monitor = _monitored_abort(tmp_path)
    (finding,) = monitor.report.violations
    assert finding.reproducer is not None
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_TARGET_DEVICE": "cpu"}
    replayed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               finding.reproducer], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
    assert "1 failed, 1 passed" in replayed.stdout, replayed.stdout[-2000:]
    assert "no reachable boundary demands" in replayed.stdout


# -- partial tails (docs/CONTRACT.md 9.2): C2 at the boundary and the load -------------------
def _monitored_partial_tail(being_loaded: bool = False) -> tuple[RuntimeMonitor, Any]:
    """live.partial_tail's producer/consumer trace (FA64 + Mamba64 hashed in 16, P = 230,
    b(P) = 224), or its being-loaded trace, under the monitor."""
    from kvcontract.live.partial_tail import run_partial_tail, run_partial_tail_being_loaded

    with _monitored() as monitor:
        run = run_partial_tail_being_loaded() if being_loaded else run_partial_tail()
    return monitor, run


@pytest.mark.slow
def test_a_partial_tail_trace_is_judged_and_holds_on_vllm() -> None:
    monitor, run = _monitored_partial_tail()
    assert run.hit == 224 and run.ok  # vLLM serves the tail at b(P)
    report = monitor.report
    assert report.events["partial-tail hit"] == 1
    assert report.checks["C12/partial-tail-on"] == 1  # vLLM's decision is the contract's
    assert report.checks["C2/partial-tail-boundary"] == 1
    assert report.checks["C2/partial-tail-loads"] == 1
    assert report.checks["C4/partial-tail-maximal"] == 1
    assert report.violations == [] and report.errors == []
    assert not any("partial-tail hit" in reason for reason in report.not_judged)


@pytest.mark.slow
def test_a_partial_tail_claimed_where_no_key_is_stored_is_c2(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's ``_lookup_partial_tail`` made to claim every boundary: the producer's own
    first lookup accepts a tail at 48 whose keys it never asked about (C2, a crash:
    vLLM's load then raises upstream's "not found")."""
    from kvcontract.tools.runtime_monitor import _scheduler_class

    monkeypatch.setattr(_scheduler_class(), "_lookup_partial_tail",
                        lambda self, req_status, boundary, bridge_pending: (True, False))
    monitor, run = _monitored_partial_tail()
    assert not run.ok
    found = [(f.clause, f.kind, f.impact) for f in monitor.report.violations]
    assert ("C2", "partial-tail-boundary", "crash") in found
    assert ("C2", "crash", "crash") in found  # the load's "not found"
    boundary = next(f for f in monitor.report.violations if f.kind == "partial-tail-boundary")
    assert "group 0 at 48: never asked, group 1 at 48: never asked" in boundary.message
    assert monitor.report.errors == []


@pytest.mark.slow
def test_a_partial_tail_key_loaded_twice_is_c2_where_vllm_does_not_defer() -> None:
    """run_partial_tail_being_loaded: a second resend looks the tail up while the first's
    load of it is in flight. A release whose ``_lookup_partial_tail`` tests the keys being
    loaded (0.34.0) defers it (C13: each deferral has that cause); one that does not
    (0.33.0) loads both keys again: C2, ``partial-tail-in-flight`` (docs/CONTRACT.md 9.2)."""
    import inspect

    from kvcontract.tools.runtime_monitor import _scheduler_class

    defers = "_chunks_being_loaded" in inspect.getsource(
        _scheduler_class()._lookup_partial_tail)  # type: ignore[union-attr]
    monitor, run = _monitored_partial_tail(being_loaded=True)
    report = monitor.report
    assert report.checks["C2/partial-tail-loads"] >= 1 and report.errors == []
    found = [(f.clause, f.kind, f.impact) for f in report.violations]
    if defers:
        assert run.ok and found == []
        assert report.checks["C13/deferral-has-cause"] >= 1
    else:
        assert found == [("C2", "partial-tail-in-flight", "waste")]
        assert "group 0 at 224, group 1 at 224" in report.violations[0].message
