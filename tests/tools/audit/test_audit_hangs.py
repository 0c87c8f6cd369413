"""A target that hangs: every theorem that calls the hanging function is UNKNOWN, naming
the call and the limit, and the audit returns.

Three kinds of hang, each in ``get_sliding_window_size_in_chunks`` laid over vLLM 0.33.0
(so kvcontract's formulas, kvcontract's lookup over the bound functions and upstream's
own lookup loop all call it): a busy loop (the per-call CPU-time limit), a call that
blocks without using CPU (the sandbox's wall-clock watchdog) and a loop Z3's symbolic
lifting would unroll forever (stopped symbolically, then concretely). Then the
sandbox's own nets, each on a tiny job: a call that swallows the limit's exception, C
code the limit's signal cannot reach, a blocked call deaf to the watchdog's signal, the
release's own functions under the limit (vLLM's engine as the judge), and a call that
waits briefly and returns (not a hang).

Each audit runs in a subprocess whose ``timeout`` is only a hang guard (never a
performance assertion); the work is bounded by ``--clause`` and a ``--budget`` of cases.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from audit_releases import release_tree

from kvcontract.tools.audit import stand_ins, upstream_calls
from kvcontract.tools.audit.sandbox import run_jobs
from kvcontract.tools.audit.upstream_calls import UPSTREAM_MODULE, CallBoard, UpstreamTimeout

HANG_GUARD = 900
"""Seconds after which a subprocess counts as hung (a guard, far above any run)."""

WINDOW = "get_sliding_window_size_in_chunks"

HANGS = {
    "busy": '''
        def get_sliding_window_size_in_chunks(kv_cache_spec, tokens_per_chunk):
            while True:
                pass
        ''',
    "blocked": '''
        def get_sliding_window_size_in_chunks(kv_cache_spec, tokens_per_chunk):
            import time

            time.sleep(10**6)
        ''',
    "lifted": '''
        def get_sliding_window_size_in_chunks(kv_cache_spec, tokens_per_chunk):
            x = tokens_per_chunk
            while x >= 0:
                x += 1
            return x
        ''',
}
"""What the audit must stop, and how (the message's limit)."""

LIMIT_TEXT = {"busy": "did not return within 0.5s of CPU time",
              "blocked": "without using CPU time",
              "lifted": "did not return within 0.5s of CPU time"}

CALLERS = {"window-exact", "lookup-is-maximal", "upstream-lookup-is-maximal"}
"""C4 theorems that call the window function: kvcontract's formula, kvcontract's loop
over the bound functions, upstream's own loop (whose runner calls it outside the loop)."""

NON_CALLERS = {"prefix-refines-spec", "scan-is-maximal"}
"""C4 theorems that never call it: decided (as on the release itself), never UNKNOWN."""

RUN_AUDIT = """
import json, sys
from kvcontract.tools.audit.binding import bind
from kvcontract.tools.audit.engine import AuditOptions, run_audit
from kvcontract.tools.audit.targets import resolve_target

path, base, clause, out = sys.argv[1:5]
binding = bind(resolve_target("module:" + path, base="vllm:" + base))
run = run_audit(binding, AuditOptions(clauses=[clause], call_timeout=0.5, budget=100,
                                      examples=10, jobs=2))
with open(out, "w") as handle:
    json.dump(run.rows, handle)
"""
"""The audit of one clause on stand-ins (the judge a binding alone gets), in a child
process so a hang fails the test instead of stalling the suite."""


def _rows(path: Path, clause: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, "-c", RUN_AUDIT, str(path), str(release_tree("0.33.0")), clause,
         str(out)], capture_output=True, text=True, timeout=HANG_GUARD, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return {str(r["theorem"]): r for r in json.loads(out.read_text())}


@pytest.mark.parametrize("kind", sorted(HANGS))
def test_hanging_window_is_unknown_naming_the_call(
        kind: str, write_module: Callable[..., Path], tmp_path: Path) -> None:
    rows = _rows(write_module(f"{kind}.py", HANGS[kind]), "C4", tmp_path)
    for name in CALLERS:
        row = rows[name]
        message = str(row["message"])
        assert row["verdict"] == "UNKNOWN", (name, row)
        assert WINDOW in message and LIMIT_TEXT[kind] in message, (name, message)
        assert row.get("impact") is None
    for name in NON_CALLERS:
        assert rows[name]["verdict"] != "UNKNOWN", rows[name]


def test_a_blocked_method_is_unknown(write_module: Callable[..., Path],
                                     tmp_path: Path) -> None:
    """A method (the sliding-window scanner) that blocks: its theorem is UNKNOWN,
    naming it; the window formula, which never calls it, is decided (0.33.0's own
    counterexample), and no lookup theorem turns the hang into a finding (the first
    cases of the lookup's budget may not reach a sliding-window scan)."""
    path = write_module("scan.py", '''
        class OffloadingConnectorScheduler:
            def _sliding_window_lookup(self, keys, sliding_window_size, req_context,
                                       initial_window_size=None):
                import time

                time.sleep(10**6)
        ''')
    rows = _rows(path, "C4", tmp_path)
    message = str(rows["scan-is-maximal"]["message"])
    assert rows["scan-is-maximal"]["verdict"] == "UNKNOWN", rows["scan-is-maximal"]
    assert "_sliding_window_lookup" in message and "without using CPU time" in message
    for name in ("lookup-is-maximal", "upstream-lookup-is-maximal"):
        assert rows[name]["verdict"] != "COUNTEREXAMPLE", rows[name]
    assert rows["window-exact"]["verdict"] != "UNKNOWN", rows["window-exact"]


def test_the_audit_command_returns(write_module: Callable[..., Path],
                                   tmp_path: Path) -> None:
    """``kvcontract audit`` itself on a busy hang: exit 3 (UNKNOWN: what it decides of
    C4 finds nothing else), the theorems that call the window UNKNOWN, naming it. On
    stand-ins: vLLM's engine as the judge runs the release's functions itself (each
    sandbox child wraps those it imported: ``binding.limit_loaded_release``)."""
    path = write_module("busy.py", HANGS["busy"])
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "kvcontract", "audit", "--target", f"module:{path}",
         "--base", f"vllm:{release_tree('0.33.0')}", "--clause", "C4", "--budget", "50",
         "--timeout", "0.5", "--jobs", "2", "--catalogue-only", "--quiet",
         "--judge", "stand-ins", "--json", str(report)],
        capture_output=True, text=True, timeout=HANG_GUARD, check=False)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {r["theorem"]: r for r in json.loads(report.read_text())["results"]}
    assert rows["window-exact"]["verdict"] == "UNKNOWN"
    assert WINDOW in str(rows["window-exact"]["message"])


# -- the sandbox's nets, on tiny jobs -------------------------------------------------------
def _upstream(source: str) -> Callable[..., Any]:
    """A function compiled as the binding compiles upstream code (its namespace's name)."""
    namespace: dict[str, Any] = {"__name__": UPSTREAM_MODULE}
    exec(compile(textwrap.dedent(source), "/upstream/hang.py", "exec"), namespace)
    function: Callable[..., Any] = namespace["hang"]
    return function


def _calls(fn: Callable[..., Any], times: int = 2) -> Callable[[], dict[str, Any]]:
    """A job calling ``fn`` under the limit ``times`` times: what each call did, and
    where each timeout was raised from (its innermost line, whether it has a context)."""
    def job() -> dict[str, Any]:
        said, origins = [], []
        for _ in range(times):
            try:
                limited = upstream_calls.limited("hang (/upstream/hang.py:1)", fn)
                said.append(f"returned {limited()}")
            except UpstreamTimeout as exc:
                said.append(str(exc))
                tb = exc.__traceback__
                while tb is not None and tb.tb_next is not None:
                    tb = tb.tb_next
                origins.append([tb.tb_lineno if tb else None, exc.__context__ is None])
        return {"said": said, "origins": origins}

    return job


def _sandboxed(job: Callable[[], dict[str, Any]], call_timeout: float = 0.3) -> Any:
    return run_jobs([("job", job)], workers=1, job_timeout=60, call_timeout=call_timeout)["job"]


def test_a_hung_call_is_not_made_again() -> None:
    """The first call is stopped at its limit (naming where it was); the next call of
    the same function in the same check raises at once."""
    outcome = _sandboxed(_calls(_upstream('''
        def hang():
            x = 0
            while True:
                x += 1
        ''')))
    assert outcome.ok, outcome.error
    first, second = outcome.value["said"]
    assert first.startswith("hang (/upstream/hang.py:1) did not return within 0.3s of CPU "
                            "time (--timeout), at /upstream/hang.py:")
    assert second == f"{first}; not called again in this check"
    # One origin, no context: a search that replays a failing case (Hypothesis) meets
    # the same failure, never a "flaky" one that ends the whole check.
    assert outcome.value["origins"][0] == outcome.value["origins"][1]
    assert outcome.value["origins"][0][1] is True


def test_a_swallowed_limit_still_stops_the_call() -> None:
    """Upstream code that catches the limit's exception: a call that then returns is
    still UNKNOWN; one that goes on is ended at twice the limit, naming the call."""
    returning = _sandboxed(_calls(_upstream('''
        def spin():
            while True:
                pass

        def hang():
            try:
                spin()
            except BaseException:
                return 7
        ''')))
    assert returning.ok, returning.error
    assert "it caught the limit's exception" in returning.value["said"][0]
    going_on = _sandboxed(_calls(_upstream('''
        def spin():
            while True:
                pass

        def hang():
            while True:
                try:
                    spin()
                except BaseException:
                    pass
        ''')))
    assert not going_on.ok
    assert going_on.error.startswith("hang (/upstream/hang.py:1) did not return within 0.3s")
    assert f"status {upstream_calls.EXIT_CALL_PAST_LIMIT}" in going_on.error


def test_c_code_past_the_limit_is_killed() -> None:
    """A busy call inside C code never returns to Python, so the limit's signal cannot
    stop it: the parent kills it once it used three times the limit in CPU time."""
    outcome = _sandboxed(_calls(_upstream('''
        def hang():
            return sum(range(10**15))
        ''')))
    assert not outcome.ok
    assert outcome.error.startswith("hang (/upstream/hang.py:1) did not return within 0.3s")
    assert "(killed)" in outcome.error


def test_a_blocked_call_deaf_to_the_watchdog_is_killed() -> None:
    outcome = _sandboxed(_calls(_upstream('''
        def hang():
            import signal, time

            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
            time.sleep(10**6)
        ''')))
    assert not outcome.ok
    assert outcome.error.startswith("hang (/upstream/hang.py:1) blocked for ")
    assert "went on blocking after the watchdog interrupted it (killed)" in outcome.error


def test_a_brief_wait_is_not_a_hang() -> None:
    """A call that waits a little longer than its CPU-time limit (no CPU used) returns
    what it returns: the watchdog reads only a long wait as a hang."""
    outcome = _sandboxed(_calls(_upstream('''
        def hang():
            import time

            time.sleep(0.6)
            return 7
        '''), times=1))
    assert outcome.ok, outcome.error
    assert outcome.value["said"] == ["returned 7"]


def test_a_loaded_release_is_called_under_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM imported by the audit's parent (its engine as the judge): in a sandbox child,
    an audited function of the release is called under the per-call limit, in its
    module and wherever a module imported it by name."""
    config = types.ModuleType("fakevllm.distributed.kv_transfer.kv_connector.v1."
                              "offloading.config")
    user = types.ModuleType("fakevllm.user")
    exec(compile("def get_sliding_window_size_in_chunks(spec, tpc):\n    while True:\n"
                 "        pass\n", "/fakevllm/config.py", "exec"), vars(config))
    user.get_sliding_window_size_in_chunks = config.get_sliding_window_size_in_chunks
    for module in (config, user):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(sys.modules, "fakevllm", types.ModuleType("fakevllm"))

    def job() -> dict[str, Any]:
        wrapped = upstream_calls.limit_loaded_release("fakevllm")
        try:
            user.get_sliding_window_size_in_chunks(None, 4)
        except UpstreamTimeout as exc:
            return {"wrapped": wrapped, "said": str(exc)}
        return {"wrapped": wrapped, "said": "returned"}

    outcome = _sandboxed(job)
    assert outcome.ok, outcome.error
    assert outcome.value["wrapped"] == [f"{WINDOW} (/fakevllm/config.py:1)"]
    assert outcome.value["said"].startswith(f"{WINDOW} (/fakevllm/config.py:1) did not "
                                            "return within 0.3s of CPU time")
    # The parent's own release is left as it is.
    assert not hasattr(config.get_sliding_window_size_in_chunks, "__wrapped__")


def test_the_call_board_names_the_call_in_flight() -> None:
    board = CallBoard()
    try:
        assert board.active() == 0
        board.begin(b"f (x.py:1)")
        assert board.active() == 1 and board.name() == "f (x.py:1)"
        board.end()
        board.begin(b"g (y.py:2)")
        assert board.active() == 2 and board.name() == "g (y.py:2)"
    finally:
        board.close()


def test_compiled_upstream_code_is_recognised() -> None:
    """The binding compiles upstream functions in a namespace named
    :data:`UPSTREAM_MODULE`: how a timeout names the upstream frame it stopped."""
    assert stand_ins._namespace()["__name__"] == UPSTREAM_MODULE
