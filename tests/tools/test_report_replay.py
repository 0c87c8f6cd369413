"""``gen-tests --report`` and ``explain --report`` take every report kvcontract writes
(issue 22 item 4): an audit of a built-in target (``"target": "builtin:NAME"``), an audit
of upstream code (``module:FILE.py`` with upstream's names, ``vllm:PATH``), a prove
report; and refuse only what they cannot replay, saying why (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kvcontract.tools.cli import cli


def _audit_snippets() -> Any:
    """The audit tests' upstream-shaped snippets (tests/tools/audit/audit_releases.py),
    loaded under a name of their own (that folder is not on ``sys.path`` here)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_audit_snippets", Path(__file__).parent / "audit" / "audit_releases.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SNIPPETS = _audit_snippets()
STALE_PENDING_SCAN: str = SNIPPETS.STALE_PENDING_SCAN_030
FIXED_SCAN: str = SNIPPETS.FIXED_SCAN


def _invoke(*argv: str) -> Result:
    return CliRunner().invoke(cli, list(argv))


def _pytest(folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("KVCONTRACT_IMPL", "KVCONTRACT_AUDIT_TARGET")}
    environment.update(PYTHONPATH=os.pathsep.join(sys.path), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(folder)], capture_output=True, text=True, env=environment,
                          cwd=folder, check=False)


@pytest.fixture(scope="module")
def builtin_audit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`kvcontract audit --target builtin:upstream-current --clause C4`: its JSON report."""
    path = tmp_path_factory.mktemp("builtin-audit") / "a.json"
    done = _invoke("audit", "--target", "builtin:upstream-current", "--clause", "C4",
                   "--budget", "2000", "--quiet", "--json", str(path))
    assert done.exit_code == 1, done.output  # upstream's window formula: C4 lost hits
    data = json.loads(path.read_text())
    assert data["command"] == "audit" and data["target"] == "builtin:upstream-current"
    assert [r for r in data["results"] if r["verdict"] == "COUNTEREXAMPLE"]
    return path


def _module(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source).strip() + "\n")
    return path


@pytest.fixture(scope="module")
def upstream_audit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An audit of a patched file under upstream's names (the stale-pending scan)."""
    folder = tmp_path_factory.mktemp("upstream-audit")
    stale = _module(folder, "stale.py", STALE_PENDING_SCAN)
    path = folder / "m.json"
    # The default budget: vLLM's engine reaches the patched scanner's deferral (a budget
    # of 1,000 cases stops among lookups a full-attention MISS ends before the scan).
    done = _invoke("audit", "--target", f"module:{stale}", "--clause", "C3", "--fail-on",
                   "delay", "--quiet", "--json", str(path),
                   "--write-baseline", str(folder / "baseline.json"))
    assert done.exit_code == 1, done.output
    return path


def test_gen_tests_replays_an_audit_of_a_builtin_target(builtin_audit: Path,
                                                         tmp_path: Path) -> None:
    out = tmp_path / "repro"
    done = _invoke("gen-tests", "--report", str(builtin_audit), "--out", str(out), "--quiet")
    assert done.exit_code == 0, done.output
    failing = {r["clause"] + "/" + r["theorem"] for r in json.loads(
        builtin_audit.read_text())["results"] if r["verdict"] == "COUNTEREXAMPLE"}
    index = json.loads((out / "kvcontract-tests.json").read_text())
    assert {t["theorem"] for t in index["generated"]} == failing
    tests = sorted(out.glob("test_*.py"))
    assert len(tests) == len(failing)
    # The reproducers load the implementation by the name the registry knows.
    for test in tests:
        assert 'os.environ.get("KVCONTRACT_IMPL", "upstream-current")' in test.read_text()
    on_defect = _pytest(out)
    assert on_defect.returncode == 1 and "C4 violated" in on_defect.stdout, on_defect.stdout
    assert f"{len(failing)} failed" in on_defect.stdout
    on_fix = _pytest(out, KVCONTRACT_IMPL="reference")
    assert on_fix.returncode == 0, on_fix.stdout
    # --impl naming the same implementation is accepted; another one is not.
    again = _invoke("gen-tests", "--report", str(builtin_audit), "--impl", "upstream-current",
                    "--out", str(out), "--quiet")
    assert again.exit_code == 0, again.output
    other = _invoke("gen-tests", "--report", str(builtin_audit), "--impl", "reference",
                    "--out", str(out), "--quiet")
    assert other.exit_code == 2
    assert "--impl reference does not match" in other.output
    assert "'builtin:upstream-current'" in other.output


def test_explain_draws_an_audit_of_a_builtin_target(builtin_audit: Path,
                                                     tmp_path: Path) -> None:
    done = _invoke("explain", "--report", str(builtin_audit), "--quiet", "--out",
                   str(tmp_path / "pictures"))
    assert done.exit_code == 0, done.output
    failing = [r for r in json.loads(builtin_audit.read_text())["results"]
               if r["verdict"] == "COUNTEREXAMPLE"]
    assert len(sorted((tmp_path / "pictures").glob("*.png"))) == len(failing)
    one = _invoke("explain", "--report", str(builtin_audit), "--theorem",
                  "C4/load-window-exact")
    assert one.exit_code == 0, one.output
    assert "C4/load-window-exact (upstream-current)" in one.output


def test_gen_tests_and_explain_replay_an_audit_of_upstream_code(upstream_audit: Path,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "repro"
    done = _invoke("gen-tests", "--report", str(upstream_audit), "--out", str(out), "--quiet")
    assert done.exit_code == 0, done.output
    tests = sorted(out.glob("test_audit_*.py"))
    assert tests
    for test in tests:  # the audit's reproducer: the public API only
        text = test.read_text()
        assert "replay_audit" in text and "kvcontract.tools" not in text
    on_defect = _pytest(out)
    assert on_defect.returncode == 1 and "C3 violated" in on_defect.stdout, on_defect.stdout
    fixed = _module(tmp_path, "fixed.py", FIXED_SCAN)
    on_fix = _pytest(out, KVCONTRACT_AUDIT_TARGET=f"module:{fixed}")
    assert on_fix.returncode == 0, on_fix.stdout
    # Generated again into the same folder: its own files are replaced.
    again = _invoke("gen-tests", "--report", str(upstream_audit), "--out", str(out), "--quiet")
    assert again.exit_code == 0, again.output
    assert sorted(out.glob("test_audit_*.py")) == tests
    drawn = _invoke("explain", "--report", str(upstream_audit), "--quiet", "--out",
                    str(tmp_path / "pictures"))
    assert drawn.exit_code == 0, drawn.output
    assert sorted((tmp_path / "pictures").glob("*.svg"))


def test_an_audit_of_upstream_code_refuses_what_it_cannot_replay(upstream_audit: Path,
                                                                  tmp_path: Path) -> None:
    data: dict[str, Any] = json.loads(upstream_audit.read_text())
    target = data["target"]
    out = str(tmp_path / "repro")
    impl = _invoke("gen-tests", "--report", str(upstream_audit), "--impl", "reference",
                   "--out", out)
    assert impl.exit_code == 2
    assert "--impl reference" in impl.output and target in impl.output
    assert "omit --impl" in impl.output
    classes = _invoke("gen-tests", "--report", str(upstream_audit), "--boundary-classes",
                      "--out", out)
    assert classes.exit_code == 2
    assert "--boundary-classes" in classes.output and "without --report" in classes.output
    # The audited file is gone: nothing to bind the witnesses to.
    gone = tmp_path / "gone.json"
    gone.write_text(json.dumps({**data, "target": "module:" + str(tmp_path / "nope.py")}))
    for argv in (["gen-tests", "--report", str(gone), "--out", out],
                 ["explain", "--report", str(gone), "--quiet"]):
        done = _invoke(*argv)
        assert done.exit_code == 2, (argv, done.output)
        assert "gone.json" in done.output and "cannot be replayed here" in done.output
        assert "nope.py" in done.output and "Traceback" not in done.output


def test_system_scenarios_are_skipped_with_a_reason(builtin_audit: Path,
                                                    tmp_path: Path) -> None:
    """An audit's system rows (a program of the executable system) are no unit test and
    no picture: gen-tests skips them, saying so, and writes the rest; explain draws the
    rest, and refuses (exit 2) a report that has nothing else."""
    data: dict[str, Any] = json.loads(builtin_audit.read_text())
    system = {"clause": "C11", "theorem": "system[resend]", "verdict": "COUNTEREXAMPLE",
              "message": "the system crashed", "impact": "crash",
              "witness": {"kind": "system", "scenario": "resend"}}
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps({**data, "results": [*data["results"], system]}))
    out = tmp_path / "repro"
    done = _invoke("gen-tests", "--report", str(mixed), "--out", str(out), "--quiet")
    assert done.exit_code == 0, done.output
    index = json.loads((out / "kvcontract-tests.json").read_text())
    assert [s["theorem"] for s in index["skipped"]] == ["C11/system[resend]"]
    assert "program of the executable system" in index["skipped"][0]["reason"]
    drawn = _invoke("explain", "--report", str(mixed), "--quiet", "--out", str(tmp_path / "p"))
    assert drawn.exit_code == 0, drawn.output
    assert "C11/system[resend]: not drawn" in drawn.output
    only = tmp_path / "only.json"
    only.write_text(json.dumps({**data, "results": [system]}))
    refused = _invoke("explain", "--report", str(only), "--quiet")
    assert refused.exit_code == 2
    assert "C11/system[resend]" in refused.output and "no token-axis picture" in refused.output


def test_the_other_json_files_kvcontract_writes_are_refused_with_what_they_are(
        upstream_audit: Path, tmp_path: Path) -> None:
    """A findings baseline, the catalogue, gen-tests' own index, a mutation campaign's
    report: kvcontract writes them, they hold no witness; the error says what the file
    is and what to give instead."""
    listed = _invoke("list", "--json")
    assert listed.exit_code == 0
    (tmp_path / "list.json").write_text(listed.output)
    out = tmp_path / "repro"
    assert _invoke("gen-tests", "--report", str(upstream_audit), "--out", str(out),
                   "--quiet").exit_code == 0
    (tmp_path / "mutate.json").write_text(json.dumps(
        {"version": 1, "command": "mutate", "target": "reference", "score": 0.9,
         "killed": 9, "survived": 1, "mutants": []}))
    files = {
        upstream_audit.parent / "baseline.json": "a findings baseline",
        tmp_path / "list.json": "the catalogue",
        out / "kvcontract-tests.json": "gen-tests' index",
        tmp_path / "mutate.json": "a mutation campaign's report",
    }
    for path, what in files.items():
        assert path.is_file(), path
        for argv in (["gen-tests", "--report", str(path), "--out", str(tmp_path / "x")],
                     ["explain", "--report", str(path), "--quiet"]):
            done = _invoke(*argv)
            assert done.exit_code == 2, (argv, done.output)
            assert path.name in done.output and what in done.output, done.output
            assert "prove, fuzz, merge or audit" in done.output
