"""``kvcontract vllm-tests`` (kvcontract.live.vllm_tests): a release's offloading tests
fetched from its sdist, the offline Hugging Face cache, the error without an sdist and
the printed command. pip is replaced by a stand-in that leaves an sdist behind as pip
does (no network, no vLLM needed); ``-m slow`` fetches 0.34.0 for real."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kvcontract.errors import InputFileError, UsageError
from kvcontract.live import vllm_tests
from kvcontract.live.vllm_tests import (
    CPU_PLUGIN,
    OFFLOADING_FOLDER,
    OPT_125M_CONFIG,
    SUPPORT_FILES,
    FetchedTests,
    fetch_tests,
)
from kvcontract.tools.cli import cli
from kvcontract.tools.commands import vllm_tests as command_module
from kvcontract.vocabulary import EXIT_OK, EXIT_USAGE

OFFLOADING_FILES = ("__init__.py", "conftest.py", "utils.py", "test_scheduler.py",
                    "test_worker.py")


def fake_pip(release: str = "0.34.0", *, lacking: Sequence[str] = (),
             offloading: bool = True, version_written: str | None = None,
             output: str = "ERROR: Failed to build 'vllm' when getting requirements",
             returncode: int = 1, unpack: bool = True,
             calls: list[dict[str, Any]] | None = None) -> Callable[..., Any]:
    """A ``subprocess.run`` that does what pip does here: unpack the sdist into
    ``$TMPDIR/pip-download-*/vllm_*`` (with a few files besides the tests, and a stray
    build folder), then fail preparing the metadata."""

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if calls is not None:
            calls.append({"argv": argv, **kwargs})
        if unpack:
            tmp = Path(kwargs["env"]["TMPDIR"])
            sdist = tmp / "pip-download-x1y2z3" / "vllm_0123456789abcdef"
            sdist.mkdir(parents=True)
            (sdist / "PKG-INFO").write_text(
                f"Metadata-Version: 2.4\nName: vllm\nVersion: {version_written or release}\n"
                "\nDescription with Version: 9.9.9\n")
            (tmp / "pip-build-env-abc").mkdir()
            for name in SUPPORT_FILES:
                if name not in lacking:
                    (sdist / name).parent.mkdir(parents=True, exist_ok=True)
                    (sdist / name).write_text(f"# {name}\n")
            for other in ("tests/v1/core/test_scheduler.py", "tests/test_config.py",
                          "vllm/__init__.py", "setup.py"):
                (sdist / other).parent.mkdir(parents=True, exist_ok=True)
                (sdist / other).write_text("# not copied\n")
            if offloading:
                folder = sdist / OFFLOADING_FOLDER
                folder.mkdir(parents=True, exist_ok=True)
                for name in OFFLOADING_FILES:
                    (folder / name).write_text(f"# {name}\n")
                (folder / "__pycache__").mkdir()
                (folder / "__pycache__" / "utils.cpython-311.pyc").write_bytes(b"\0")
        return subprocess.CompletedProcess(argv, returncode, stdout=output + "\n")

    return run


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private temporary folder for the fetch's own scratch folder."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(vllm_tests.tempfile, "tempdir", str(folder))
    return folder


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_fetch_copies_exactly_the_listed_files(tmp_path: Path, scratch: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(vllm_tests.subprocess, "run", fake_pip(calls=calls))
    fetched = fetch_tests("0.34.0", tmp_path / "out")
    assert fetched.root == tmp_path / "out" / "vllm-0.34.0"
    assert fetched.release == "0.34.0" and fetched.missing == ()
    expected = set(SUPPORT_FILES) | {f"{OFFLOADING_FOLDER}/{n}" for n in OFFLOADING_FILES}
    assert files_under(fetched.root) == expected | {f"{CPU_PLUGIN}.py"}
    # pip ran as asked, in its own scratch folder, which is gone afterwards
    [call] = calls
    argv = call["argv"]
    assert argv[:3] == [sys.executable, "-m", "pip"]
    for word in ("download", "--no-deps", "--no-clean", "vllm==0.34.0"):
        assert word in argv
    assert argv[argv.index("--no-binary") + 1] == ":all:"
    assert Path(call["env"]["TMPDIR"]) == Path(call["cwd"])
    assert Path(call["cwd"]).parent == scratch
    assert list(scratch.iterdir()) == []


def test_a_support_file_the_release_lacks_is_named_not_an_error(
        tmp_path: Path, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lacking = ("tests/v1/spec_decode/utils.py", "tests/v1/kv_connector/conftest.py")
    monkeypatch.setattr(vllm_tests.subprocess, "run",
                        fake_pip("0.33.0", lacking=lacking))
    fetched = fetch_tests("0.33.0", tmp_path)
    assert set(fetched.missing) == set(lacking)
    assert not any((fetched.root / name).exists() for name in lacking)
    assert (fetched.root / OFFLOADING_FOLDER / "test_scheduler.py").is_file()


def test_a_release_without_the_offloading_folder_is_refused(
        tmp_path: Path, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_tests.subprocess, "run", fake_pip("0.11.0", offloading=False))
    with pytest.raises(UsageError, match="offloading_connector"):
        fetch_tests("0.11.0", tmp_path)
    assert list(scratch.iterdir()) == []


def test_a_second_fetch_replaces_the_tests(tmp_path: Path, scratch: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_tests.subprocess, "run", fake_pip())
    stale = tmp_path / "vllm-0.34.0" / "tests" / "stale.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("# from an earlier fetch\n")
    fetch_tests("0.34.0", tmp_path)
    assert not stale.exists()
    assert (tmp_path / "vllm-0.34.0" / OFFLOADING_FOLDER / "conftest.py").is_file()


def test_the_offline_hugging_face_cache(tmp_path: Path, scratch: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_tests.subprocess, "run", fake_pip())
    fetched = fetch_tests("0.34.0", tmp_path)
    assert fetched.hf_home == tmp_path / "hf-home"
    repo = fetched.hf_home / "hub" / "models--facebook--opt-125m"
    snapshot = (repo / "refs" / "main").read_text()
    assert re.fullmatch(r"[0-9a-f]{40}", snapshot)
    assert files_under(repo) == {"refs/main", f"snapshots/{snapshot}/config.json"}
    config = json.loads((repo / "snapshots" / snapshot / "config.json").read_text())
    assert config == OPT_125M_CONFIG
    assert config["architectures"] == ["OPTForCausalLM"] and config["model_type"] == "opt"
    assert (config["hidden_size"], config["num_hidden_layers"],
            config["num_attention_heads"], config["vocab_size"],
            config["max_position_embeddings"], config["ffn_dim"]) == (
        768, 12, 12, 50272, 2048, 3072)
    # the same snapshot again for a second release (one cache for all)
    monkeypatch.setattr(vllm_tests.subprocess, "run", fake_pip("0.33.0"))
    fetch_tests("0.33.0", tmp_path)
    assert (repo / "refs" / "main").read_text() == snapshot
    assert len(list((repo / "snapshots").iterdir())) == 1


def test_no_sdist_left_behind_is_a_usage_error_with_pips_reason(
        tmp_path: Path, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reason = ("ERROR: Could not find a version that satisfies the requirement "
              "vllm==9.9.9 (from versions: 0.33.0, 0.34.0)\n"
              "ERROR: No matching distribution found for vllm==9.9.9")
    monkeypatch.setattr(vllm_tests.subprocess, "run",
                        fake_pip("9.9.9", unpack=False, output=reason))
    with pytest.raises(UsageError, match=r"9\.9\.9") as caught:
        fetch_tests("9.9.9", tmp_path)
    message = str(caught.value)
    assert "No matching distribution found for vllm==9.9.9" in message
    assert "exit 1" in message
    assert not (tmp_path / "vllm-9.9.9").exists()
    assert list(scratch.iterdir()) == []


def test_an_sdist_of_another_version_is_refused(tmp_path: Path, scratch: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_tests.subprocess, "run",
                        fake_pip("0.34.0", version_written="0.34.1"))
    with pytest.raises(UsageError, match=r"0\.34\.1, not 0\.34\.0"):
        fetch_tests("0.34.0", tmp_path)


def test_a_destination_that_is_a_file_is_refused(tmp_path: Path, scratch: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_tests.subprocess, "run", fake_pip())
    target = tmp_path / "a-file"
    target.write_text("")
    with pytest.raises(InputFileError):
        fetch_tests("0.34.0", target)


def test_without_pip_fetching_is_a_usage_error(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_tests, "pip_available", lambda: False)
    with pytest.raises(UsageError, match="pip"):
        fetch_tests("0.34.0", tmp_path)


def test_environment_and_command(tmp_path: Path) -> None:
    fetched = FetchedTests("0.34.0", tmp_path / "my dir" / "vllm-0.34.0",
                           tmp_path / "my dir" / "hf-home")
    assert fetched.environment() == {
        "VLLM_TARGET_DEVICE": "cpu", "HF_HOME": str(tmp_path / "my dir" / "hf-home"),
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    assert fetched.command() == [
        "python", "-m", "pytest", "-p", CPU_PLUGIN,
        "tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py"]
    assert fetched.command("test_worker.py", ["-q", "-x"], python="/usr/bin/python3")[-3:] == [
        f"{OFFLOADING_FOLDER}/test_worker.py", "-q", "-x"]
    line = fetched.shell_line()
    assert line.startswith(f"cd '{fetched.root}' && VLLM_TARGET_DEVICE=cpu HF_HOME='")
    assert line.endswith(f"python -m pytest -p {CPU_PLUGIN} {OFFLOADING_FOLDER}/"
                         "test_scheduler.py")


def test_the_cpu_plugin_source_is_valid_python() -> None:
    compile(vllm_tests.CPU_PLUGIN_SOURCE, f"{CPU_PLUGIN}.py", "exec")
    assert "check_and_update_config" in vllm_tests.CPU_PLUGIN_SOURCE


# the command ------------------------------------------------------------------------


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, prog_name="kvcontract", terminal_width=200)


def _recording_fetch(seen: list[tuple[str, Path]],
                     missing: tuple[str, ...] = ()) -> Callable[[str, Path], FetchedTests]:
    def fetch(release: str, dest: Path) -> FetchedTests:
        seen.append((release, dest))
        root = dest / f"vllm-{release}"
        (root / OFFLOADING_FOLDER).mkdir(parents=True)
        (root / OFFLOADING_FOLDER / "test_scheduler.py").write_text("")
        return FetchedTests(release, root, dest / "hf-home", missing)

    return fetch


def test_the_command_prints_how_to_run_them(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, Path]] = []
    monkeypatch.setattr(vllm_tests, "fetch_tests",
                        _recording_fetch(seen, ("tests/v1/spec_decode/utils.py",)))
    result = invoke(["vllm-tests", "--release", "0.33.0", "--dest", str(tmp_path / "vt")])
    assert result.exit_code == EXIT_OK, result.output
    assert seen == [("0.33.0", (tmp_path / "vt").resolve())]
    lines = result.stdout.splitlines()
    root = (tmp_path / "vt").resolve() / "vllm-0.33.0"
    assert f"vLLM 0.33.0's offloading tests: {root}" in lines
    assert "not in this release: tests/v1/spec_decode/utils.py" in lines
    expected = FetchedTests("0.33.0", root, (tmp_path / "vt").resolve() / "hf-home")
    assert lines[-1] in (expected.shell_line(), expected.shell_line(python=sys.executable))
    assert "HF_HUB_OFFLINE=1" in lines[-1] and f"cd {root} &&" in lines[-1]


def test_the_command_defaults_to_the_installed_release(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, Path]] = []
    monkeypatch.setattr(vllm_tests, "fetch_tests", _recording_fetch(seen))
    result = invoke(["vllm-tests", "--dest", str(tmp_path)])
    try:
        installed = version("vllm")
    except PackageNotFoundError:
        assert result.exit_code == EXIT_USAGE
        assert "--release" in result.output
        return
    assert result.exit_code == EXIT_OK, result.output
    assert seen[0][0] == installed
    assert sys.executable in result.stdout.splitlines()[-1]  # this Python has it


def test_no_installed_vllm_and_no_release_is_a_usage_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr("importlib.metadata.version", absent)
    result = invoke(["vllm-tests", "--dest", str(tmp_path)])
    assert result.exit_code == EXIT_USAGE
    assert "--release" in result.output


@pytest.mark.parametrize("dest", ["file", "under-file/x", ""])
def test_an_invalid_destination_is_a_usage_error(tmp_path: Path, dest: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_tests, "fetch_tests", _recording_fetch([]))
    (tmp_path / "file").write_text("")
    (tmp_path / "under-file").write_text("")
    result = invoke(["vllm-tests", "--release", "0.34.0",
                     "--dest", str(tmp_path / dest) if dest else ""])
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--dest" in result.output


def test_missing_pip_is_a_usage_error(tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_tests, "pip_available", lambda: False)
    result = invoke(["vllm-tests", "--release", "0.34.0", "--dest", str(tmp_path)])
    assert result.exit_code == EXIT_USAGE
    assert "pip" in result.output


def test_a_release_pip_cannot_fetch_exits_2(tmp_path: Path, scratch: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_tests.subprocess, "run", fake_pip(
        "9.9.9", unpack=False, output="ERROR: No matching distribution found for vllm==9.9.9"))
    result = invoke(["vllm-tests", "--release", "9.9.9", "--dest", str(tmp_path)])
    assert result.exit_code == EXIT_USAGE
    assert "kvcontract: error: pip could not fetch vLLM 9.9.9" in result.output


def test_the_command_is_registered() -> None:
    from kvcontract.tools.cli import COMMANDS

    assert command_module.vllm_tests in COMMANDS
    result = invoke(["--help"])
    assert "vllm-tests" in result.output


# the real thing ------------------------------------------------------------------------


@pytest.mark.slow
def test_fetch_0_34_0_for_real_and_run_a_few(tmp_path: Path) -> None:
    """pip fetches 0.34.0's sdist (through the configured index); where 0.34.0 is the
    installed vLLM, a few of its scheduler tests then pass offline on CPU."""
    fetched = fetch_tests("0.34.0", tmp_path)
    assert fetched.missing == ()
    assert set(SUPPORT_FILES) <= files_under(fetched.root)
    assert (fetched.root / OFFLOADING_FOLDER / "test_scheduler.py").is_file()
    assert (fetched.root / f"{CPU_PLUGIN}.py").is_file()
    try:
        installed = version("vllm")
    except PackageNotFoundError:
        installed = None
    if installed != "0.34.0":
        return
    env = {**os.environ, **fetched.environment()}
    selection = ["-k", "test_offloading_connector or test_request_preemption"]

    def run_slice(*options: str) -> str:
        done = subprocess.run(
            fetched.command(extra=["-q", "-p", "no:cacheprovider", *options, *selection],
                            python=sys.executable),
            cwd=fetched.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, check=False, timeout=900)
        assert done.returncode == 0, done.stdout[-4000:]
        assert re.search(r"\b6 passed\b", done.stdout), done.stdout[-2000:]
        return done.stdout

    run_slice()
    # The same slice monitored: the same outcome, and the one finding of these tests
    # (docs/vllm-findings.md, 2026-12-06 evening: a GPU hit inside the last chunk).
    report = tmp_path / "monitor.json"
    run_slice("-p", "kvcontract.monitor", "--kvcontract-report", str(report))
    document = json.loads(report.read_text())
    assert document["errors"] == []
    assert {(v["clause"], v["test"].split("::")[-1]) for v in document["violations"]} == {
        ("C4", "test_offloading_connector[True]"), ("C4", "test_offloading_connector[False]")}
