"""Patched single files: a hang, a raise, garbage, a stubborn hang that ignores the
per-call alarm, and a file that reintroduces a defect. The audit always finishes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from audit_releases import (
    E_IGNORING_WINDOW,
    EXACT_WINDOW,
    FIXED_SCAN,
    GARBAGE_SCAN,
    HANGING_SCAN,
    RAISING_SCAN,
    STALE_PENDING_SCAN,
    STUBBORN_SCAN,
    release_tree,
)

from kvcontract.tools.audit.baseline import compare
from kvcontract.tools.audit.binding import bind
from kvcontract.tools.audit.engine import AuditOptions, AuditRun, run_audit
from kvcontract.tools.audit.targets import resolve_target

FAST = {"budget": 1000, "examples": 20, "jobs": 2}


def _audit(path: Path, clauses: list[str], base: str | None = None,
           **options: float) -> AuditRun:
    """The file alone (no base release) unless ``base`` names one."""
    binding = bind(resolve_target(f"module:{path}", base=base))
    return run_audit(binding, AuditOptions(clauses=clauses, **{**FAST, **options}))


def _only(run: AuditRun, theorem: str) -> dict[str, Any]:
    rows = [r for r in run.rows if r["theorem"] == theorem]
    assert len(rows) == 1, run.rows
    row: dict[str, Any] = rows[0]
    return row


def test_hang_is_unknown_and_names_the_call(write_module: Callable[..., Path]) -> None:
    """A call past the CPU-time limit names itself, and its theorem is UNKNOWN (exit 3:
    never a pass), not a counterexample."""
    path = write_module("hang.py", HANGING_SCAN)
    run = _audit(path, ["C3"], call_timeout=0.3)
    row = _only(run, "scan-defers-only-in-scope")
    assert row["verdict"] == "UNKNOWN"
    assert "did not return within 0.3s of CPU time" in str(row["message"])
    assert "rerun with a larger --timeout" in str(row["message"])
    assert row.get("impact") is None


SLOW_WALL_SCAN = FIXED_SCAN.replace(
    '    """Right-to-left run search; a pending mark belongs to its run only."""\n',
    '    """The fixed scan, after waiting (no CPU used) on its first call."""\n'
    '    import time\n'
    '    if not getattr(time, "_kvc_waited", False):\n'
    '        time._kvc_waited = True\n'
    '        time.sleep(1.0)\n')


def test_a_slow_machine_is_not_a_hang(write_module: Callable[..., Path]) -> None:
    """The per-call limit counts CPU time: a call that waits a second of wall-clock time
    (a stand-in for a loaded machine) with a 0.3 s limit still returns, and the audit's
    verdict is the fixed scan's, not UNKNOWN."""
    assert "time.sleep(1.0)" in SLOW_WALL_SCAN
    run = _audit(write_module("slow.py", SLOW_WALL_SCAN), ["C3"], call_timeout=0.3)
    row = _only(run, "scan-defers-only-in-scope")
    assert row["verdict"] != "UNKNOWN", row
    assert row["verdict"] != "COUNTEREXAMPLE", row


def test_raise_is_a_finding(write_module: Callable[..., Path]) -> None:
    run = _audit(write_module("boom.py", RAISING_SCAN), ["C3"])
    row = _only(run, "scan-defers-only-in-scope")
    assert row["verdict"] == "COUNTEREXAMPLE"
    assert "raised RuntimeError: scanner exploded" in str(row["message"])


def test_garbage_is_a_finding(write_module: Callable[..., Path]) -> None:
    run = _audit(write_module("garbage.py", GARBAGE_SCAN), ["C3"])
    row = _only(run, "scan-defers-only-in-scope")
    assert row["verdict"] == "COUNTEREXAMPLE"
    assert "returned 'seven' (str)" in str(row["message"])


def test_stubborn_hang_is_killed(write_module: Callable[..., Path]) -> None:
    run = _audit(write_module("stubborn.py", STUBBORN_SCAN), ["C3"], theorem_timeout=4.0)
    row = _only(run, "scan-defers-only-in-scope")
    assert row["verdict"] == "UNKNOWN"
    assert "used more than 4s of CPU time (killed)" in str(row["message"])


def test_missing_functions_are_listed(write_module: Callable[..., Path]) -> None:
    run = _audit(write_module("scan_only.py", FIXED_SCAN), ["C3", "C11"])
    # A budget of 1000 cases covers only a prefix of the scan domain: evidence, not a proof.
    assert _only(run, "scan-defers-only-in-scope")["verdict"] == "TESTED"
    unchecked = {u["theorem"]: u["reason"] for u in run.unchecked}
    assert "lookup-defers-only-in-scope" in unchecked
    assert "get_sliding_window_size_in_chunks" in unchecked["lookup-defers-only-in-scope"]
    assert "_lookup_complete_chunks" in unchecked["upstream-lookup-defers-only-in-scope"]
    assert "every function" in unchecked["system[seed scenarios]"]


def test_patch_reintroducing_stale_pending(write_module: Callable[..., Path]) -> None:
    path = write_module("stale.py", STALE_PENDING_SCAN)
    run = _audit(path, ["C3"])
    row = _only(run, "scan-defers-only-in-scope")
    assert row["verdict"] == "COUNTEREXAMPLE"
    assert row["blame"] == ["sliding_window_lookup"]
    assert row["location"] == {"path": str(path), "line": 1}


def test_window_patch_is_refuted_by_z3(write_module: Callable[..., Path]) -> None:
    # Alone, the file has no GPU manager: C1/allocation-bound (and C4/window-exact) would
    # read the spec's own retention as upstream's, so they are unchecked, named (issue
    # 20). Laid over 0.33.0, the release's get_num_skipped_tokens is what runs.
    window = write_module("window.py", E_IGNORING_WINDOW)
    alone = {u["theorem"]: u["reason"] for u in _audit(window, ["C1", "C4"]).unchecked}
    for name in ("allocation-bound", "window-exact", "load-window-exact"):
        assert "the GPU manager's retention is not bound" in alone[name], name
    base = f"vllm:{release_tree('0.33.0')}"
    run = _audit(window, ["C1"], base=base)
    bound = _only(run, "allocation-bound")
    assert bound["verdict"] == "COUNTEREXAMPLE"
    assert bound["witness"]["values"]["e"] > 0
    exact = _audit(write_module("exact.py", EXACT_WINDOW), ["C1"], base=base)
    assert _only(exact, "allocation-bound")["evidence"] in ("proved", "proved for domain")


def test_baseline_never_claims_equivalence_without_proof(
        write_module: Callable[..., Path]) -> None:
    old_path = write_module("old.py", STALE_PENDING_SCAN, EXACT_WINDOW)
    new_path = write_module("new.py", FIXED_SCAN, EXACT_WINDOW)
    same_path = write_module("same.py", FIXED_SCAN, EXACT_WINDOW)
    options = AuditOptions(clauses=["C3", "C4"], **FAST)
    old, new, same = (bind(resolve_target(f"module:{p}")) for p in (old_path, new_path,
                                                                     same_path))
    old_run, new_run, same_run = (run_audit(b, options) for b in (old, new, same))
    fixed = {e["clause"]: e["classification"]
             for e in compare(old, old_run, new, new_run, options)["clauses"]}
    assert fixed["C3"] == "fixed"
    unchanged = {e["clause"]: e for e in compare(new, new_run, same, same_run,
                                                 options)["clauses"]}
    # The scanner is compared on a bounded domain only: no equivalence claim.
    assert unchanged["C3"]["classification"] == "no difference found (not proved)"
    # C4 also uses the scanner, so it is not proved equivalent either; the window alone is.
    assert unchanged["C4"]["classification"] == "no difference found (not proved)"
    # (C4/window-exact, which proved the window equal here, is unchecked without a GPU
    # manager: issue 20; the scanner's bounded comparison is the evidence left.)
    assert "sliding_window_lookup: no difference" in unchanged["C4"]["evidence"]
