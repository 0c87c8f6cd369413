"""The monitor's pytest plugin (kvcontract.monitor) in a child pytest on a temporary test
file: options, the report document, the summary, outcomes left alone, bad options. Its
runs over vLLM's engine are in tests/live/test_monitor_live.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "kvcontract.monitor",
                           "-p", "no:cacheprovider", "-q", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_a_monitored_session_reports_and_keeps_the_outcomes(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(
        "def test_passes():\n    assert True\n\n"
        "def test_fails():\n    assert False\n")
    report = tmp_path / "out" / "monitor.json"
    run = _pytest(tmp_path, "--kvcontract-report", str(report), "test_plain.py")
    assert run.returncode == 1, run.stdout + run.stderr  # test_fails fails, as without it
    assert "1 failed, 1 passed" in run.stdout
    assert "kvcontract monitor" in run.stdout and f"report: {report}" in run.stdout
    document = json.loads(report.read_text())
    assert document["kvcontract_monitor"] == 1 and document["tests"] == 2
    assert document["violations"] == [] and document["errors"] == []
    assert {"events", "judged", "not_judged", "gaps"} <= set(document)


def test_an_unknown_variant_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text("def test_passes():\n    pass\n")
    run = _pytest(tmp_path, "--kvcontract-vllm-variant", "no-such-variant", "test_plain.py")
    assert run.returncode == 4
    assert "kvcontract monitor: --kvcontract-vllm-variant 'no-such-variant': no such " \
        "variant" in run.stderr


def test_a_report_path_that_is_a_folder_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text("def test_passes():\n    pass\n")
    run = _pytest(tmp_path, "--kvcontract-report", str(tmp_path), "test_plain.py")
    assert run.returncode == 4
    assert "--kvcontract-report" in run.stderr and "not a writable file path" in run.stderr


def test_the_serving_hook_is_off_unless_asked() -> None:
    from kvcontract import monitor

    os.environ.pop(monitor.MONITOR_ENV, None)
    monitor.vllm_plugin()
    assert monitor._SERVING == []
