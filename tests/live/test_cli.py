"""``kvcontract live``: usage errors, the exit codes of --check and the capabilities it
prints (no vLLM needed, but where a test says so)."""

from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner, Result

from kvcontract.live import env
from kvcontract.tools.cli import cli
from kvcontract.vocabulary import EXIT_OK, EXIT_UNKNOWN, EXIT_USAGE
from tests.live.conftest import _FOUND, needs_vllm


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


@needs_vllm
def test_check_prints_the_capabilities_it_found() -> None:
    result = invoke(["live", "--check"])
    assert result.exit_code == EXIT_OK, result.output
    assert "capabilities of the installed vLLM" in result.output
    found = _FOUND.capabilities
    assert found is not None
    for capability in found.found:
        assert f"{capability.name}: " in result.output
    assert "releases known to work" in result.output


def test_check_names_an_api_the_driver_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvcontract.live import capabilities

    monkeypatch.setattr(env, "PURE_PYTHON_CLOSURE", {})
    monkeypatch.setattr(env, "LIVE_MODULES", ())
    monkeypatch.setattr(env, "_version", lambda d: "9.99.0" if d == "vllm" else "2.13.0")
    lacking = capabilities.Capabilities(tuple(
        capabilities.Capability(p.name, p.api, p.name != "connector-output", p.required,
                                p.use) for p in capabilities.PROBES))
    monkeypatch.setattr(capabilities, "capabilities", lambda: lacking)
    result = invoke(["live", "--check"])
    assert result.exit_code == EXIT_UNKNOWN
    assert "KVConnectorOutput" in result.output and "problem:" in result.output


@needs_vllm
def test_the_json_document_carries_the_capabilities(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "live.json"
    result = invoke(["live", "--scenario", "abort-queued", "--json", str(out)])
    assert result.exit_code == EXIT_OK, result.output
    document = json.loads(out.read_text())
    found = _FOUND.capabilities
    assert found is not None
    assert document["capabilities"] == json.loads(json.dumps(found.to_json()))
    row = document["scenarios"][0]
    assert (row["name"], row["unknown"], row["driver_gap"]) == ("abort-queued", False, None)


def test_a_tree_that_is_not_vllm_is_an_input_error(tmp_path: pathlib.Path) -> None:
    result = invoke(["live", "--check", "--vllm", str(tmp_path)])
    assert result.exit_code == EXIT_USAGE
    assert result.output == (f"kvcontract: error: cannot use --vllm {tmp_path}: not a vLLM "
                             "tree (no vllm/__init__.py)\n")


@needs_vllm
def test_check_runs_a_tree_laid_over_the_installed_wheel() -> None:
    """The installed package given as the tree is the installed vLLM itself; the run
    says what it composed before the check's lines."""
    from kvcontract.live.judge.roots import installed_package, version_of

    package = installed_package()
    assert package is not None
    result = invoke(["live", "--check", "--vllm", str(package)])
    assert result.exit_code == EXIT_OK, result.output
    assert result.output.startswith(f"vLLM: vLLM {version_of(package)} (installed)")
