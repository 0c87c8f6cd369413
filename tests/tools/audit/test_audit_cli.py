"""``kvcontract audit`` end to end: exit codes, JSON/SARIF/JUnit/Markdown, reproducers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from audit_releases import FIXED_SCAN, STALE_PENDING_SCAN

from kvcontract.tools.cli import main


def _run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return int(info.value.code or 0)


FAST = ["--clause", "C3", "--budget", "1000", "--jobs", "2", "--quiet", "--base", "none",
        "--judge", "stand-ins"]
"""``--base none``: these tests audit a patched file alone (by default a patch is laid over
the installed vLLM, else a fetched release: tests/tools/audit/test_audit_patches.py)."""


def test_counterexample_report_formats(write_module: Callable[..., Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_module("stale.py", STALE_PENDING_SCAN)
    # The summary line is checked whole, wherever pytest's temporary folder lies (its
    # path is part of the target): output is as wide as COLUMNS says, here wider than
    # the line (how a long path is laid out at 80 or 100 columns is not this test's).
    monkeypatch.setenv("COLUMNS", str(len(f"module:{path}") + 100))
    out = tmp_path / "out"
    # A needless deferral is a delay: it fails the run by default (every impact but
    # latent), and passes when --fail-on leaves delay out.
    assert _run(["audit", "--target", f"module:{path}", *FAST]) == 1
    assert _run(["audit", "--target", f"module:{path}", *FAST, "--fail-on",
                 "crash,corruption,lost-hit"]) == 0
    code = _run(["audit", "--target", f"module:{path}", *FAST, "--fail-on", "delay,crash",
                 "--json", str(tmp_path / "r.json"),
                 "--output", str(tmp_path / "r.sarif"), "--output", str(tmp_path / "r.xml"),
                 "--output", str(tmp_path / "r.md"), "--reproducers", str(out)])
    assert code == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["command"] == "audit"
    assert report["exit_code"] == 1 and report["fail_on"] == ["crash", "delay"]
    assert {r["impact"] for r in report["results"] if r["verdict"] == "COUNTEREXAMPLE"} == \
        {"delay"}
    assert {b["role"] for b in report["bindings"]} >= {"sw_scan", "window", "store_mask"}
    assert any(u["theorem"] == "lookup-defers-only-in-scope" for u in report["unchecked"])
    failing = [r for r in report["results"] if r["verdict"] == "COUNTEREXAMPLE"]
    assert failing and failing[0]["location"] == {"path": str(path), "line": 1}
    sarif = json.loads((tmp_path / "r.sarif").read_text())
    uris = json.dumps(sarif)
    assert "stale.py" in uris
    assert "<testsuite" in (tmp_path / "r.xml").read_text()
    assert "C3" in (tmp_path / "r.md").read_text()
    # --quiet: only the summary line (the unchecked theorems are in the report above).
    printed = capsys.readouterr().out
    assert f"{report['target']}: exit code 1 (" in printed
    assert "not checked" not in printed
    # The reproducer imports the upstream (patched) file and fails; on the fix it passes.
    tests = sorted(out.glob("test_audit_*.py"))
    assert tests
    for test in tests:  # the public API only (kvcontract.api), never kvcontract's internals
        imported = re.findall(r"^(?:from|import) (\S+)", test.read_text(), re.MULTILINE)
        assert set(imported) <= {"json", "kvcontract.api"}, imported
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    failing_run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                  str(tests[0])], capture_output=True, text=True, env=env,
                                 cwd=tmp_path, check=False)
    assert failing_run.returncode == 1, failing_run.stdout
    assert "C3 violated" in failing_run.stdout
    fixed = write_module("fixed.py", FIXED_SCAN)
    env["KVCONTRACT_AUDIT_TARGET"] = f"module:{fixed}"
    passing_run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                  str(tests[0])], capture_output=True, text=True, env=env,
                                 cwd=tmp_path, check=False)
    assert passing_run.returncode == 0, passing_run.stdout


def test_conforming_patch_exits_zero(write_module: Callable[..., Path]) -> None:
    path = write_module("fixed.py", FIXED_SCAN)
    assert _run(["audit", "--target", f"module:{path}", *FAST]) == 0


def test_baseline_on_the_command_line(write_module: Callable[..., Path], tmp_path: Path) -> None:
    old = write_module("old.py", STALE_PENDING_SCAN)
    new = write_module("new.py", FIXED_SCAN)
    code = _run(["audit", "--target", f"module:{new}", "--baseline", f"module:{old}", *FAST,
                 "--json", str(tmp_path / "r.json")])
    assert code == 0
    comparison = json.loads((tmp_path / "r.json").read_text())["comparison"]
    assert comparison["clauses"][0] == {**comparison["clauses"][0], "clause": "C3",
                                        "classification": "fixed"}


def test_nothing_checkable_is_exit_3(tmp_path: Path) -> None:
    path = tmp_path / "empty.py"
    path.write_text("def unrelated():\n    return 1\n")
    assert _run(["audit", "--target", f"module:{path}", *FAST]) == 3


@pytest.mark.parametrize("argv, message", [
    (["--target", "vllm:/definitely/not/here"], "no such file or directory"),
    (["--target", "nonsense"], "unknown implementation"),
    (["--target", "reference", "--budget", "0"], "--budget must be a positive number of cases"),
    (["--target", "reference", "--clause", "C99"], "unknown clause"),
    (["--target", "reference", "--timeout", "0"], "--timeout must be positive"),
    (["--target", "reference", "--jobs", "0"], "--jobs must be at least 1"),
])
def test_usage_errors(argv: list[str], message: str,
                      capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["audit", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
