"""``kvcontract live``: usage errors and the exit codes of --check (no vLLM needed)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result

from kvcontract.live import env
from kvcontract.tools.cli import cli
from kvcontract.vocabulary import EXIT_OK, EXIT_UNKNOWN, EXIT_USAGE


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, prog_name="kvcontract", terminal_width=200)


def test_live_needs_an_action() -> None:
    result = invoke(["live"])
    assert result.exit_code == EXIT_USAGE
    assert "--check" in result.output


def test_an_unknown_scenario_is_a_usage_error() -> None:
    result = invoke(["live", "--scenario", "no-such-scenario"])
    assert result.exit_code == EXIT_USAGE
    assert "window-formula" in result.output


def test_check_exits_3_saying_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(env.PURE_PYTHON_CLOSURE, "kvcontract_no_such_module",
                        "no-such-distribution")
    result = invoke(["live", "--check"])
    assert result.exit_code == EXIT_UNKNOWN
    assert "no-such-distribution" in result.output
    assert "install:" in result.output


def test_scenarios_without_vllm_exit_3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(env.PURE_PYTHON_CLOSURE, "kvcontract_no_such_module",
                        "no-such-distribution")
    result = invoke(["live", "--scenario", "abort-queued"])
    assert result.exit_code == EXIT_UNKNOWN


def test_list_scenarios() -> None:
    result = invoke(["live", "--list-scenarios"])
    assert result.exit_code == EXIT_OK
    for name in ("window-formula", "eagle-replay", "stalled-store", "cpu-capacity-lru"):
        assert name in result.output
