"""The pull-request gate (issue #11, item 2): stable finding fingerprints, the findings
baseline (``--write-baseline``, ``--baseline-file``, ``--fail-on new``), ``audit
--baseline git:REF``, ``--require-complete``, ``[tool.kvcontract]`` configuration,
``--format github`` and the GitHub Actions workflows.

One real proof (``prove --impl upstream-current --clause C4``: three lost-hit findings)
is the source of findings; the command-line tests replay its results through a stand-in
prover, so each runs in a fraction of a second. The audits bind small patched files
(and, when the release is available, a copy of vLLM 0.33.0) with small budgets.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import kvcontract.proofs.runner as runner
from kvcontract.proofs.verdicts import TheoremResult
from kvcontract.tools.cli import cli
from kvcontract.tools.reports import normalize, render
from kvcontract.tools.reports.fingerprint import fingerprint, witness_shape
from kvcontract.tools.reports.gate import BASELINE_KIND, load_baseline
from kvcontract.tools.reports.github import escape_data, escape_property

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "github-actions"
C4 = ["prove", "--impl", "upstream-current", "--clause", "C4"]
TRACEBACK = "Traceback (most recent call last)"


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, prog_name="kvcontract", terminal_width=200)


def _ok(result: Result, code: int) -> Result:
    assert TRACEBACK not in result.output, result.output
    assert result.exit_code == code, result.output
    return result


def _printed(result: Result) -> str:
    """The terminal output with its line wrapping undone (the console wraps long
    lines at the terminal's width)."""
    return " ".join(result.output.split())


def _fingerprints(report: dict[str, Any]) -> dict[str, str]:
    return {f"{r['clause']}/{r['theorem']}": r["fingerprint"]
            for r in normalize(report)["results"] if r["status"] == "fail"}


# -- the source of findings: one real proof -------------------------------------------------
@pytest.fixture(scope="module")
def c4(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``prove --impl upstream-current --clause C4`` once: its report and the baseline it
    wrote (upstream's window formula: three lost-hit counterexamples)."""
    folder = tmp_path_factory.mktemp("c4")
    result = invoke([*C4, "--quiet", "--json", str(folder / "report.json"),
                     "--write-baseline", str(folder / "baseline.json")])
    _ok(result, 1)  # the default --fail-on names lost-hit
    report = json.loads((folder / "report.json").read_text())
    baseline = json.loads((folder / "baseline.json").read_text())
    assert len(baseline["findings"]) == 3
    return {"folder": folder, "report": report, "baseline": baseline}


@pytest.fixture
def replayed(c4: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The prover replaced by the C4 results (the gate, not the proof, is under test);
    records the arguments it was called with."""
    calls: dict[str, Any] = {}

    def fake(impl_name: str, clauses: Any = None, jobs: int | None = None,
             on_result: Any = None, fail_on: Any = None, **kwargs: Any) -> Any:
        calls.update(impl_name=impl_name, clauses=clauses, jobs=jobs, **kwargs)
        results = [TheoremResult.from_json(r) for r in c4["report"]["results"]]
        return runner.ProveReport(impl_name, results, 0.1, ["C4"], fail_on=fail_on)

    monkeypatch.setattr(runner, "prove", fake)
    return calls


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """No engine may run: a bad input must be rejected before any work."""
    import kvcontract.tools.audit.command
    import kvcontract.tools.fuzz

    def guard(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("engine reached: validation missed the bad input")

    monkeypatch.setattr(runner, "prove", guard)
    monkeypatch.setattr(kvcontract.tools.audit.command, "run_audit_command", guard)
    monkeypatch.setattr(kvcontract.tools.fuzz, "run_fuzz", guard)


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, indent=1) if not isinstance(data, str) else data)
    return path


# -- fingerprints ---------------------------------------------------------------------------
def test_fingerprints_stable_across_runs_and_catalogue_order(
        c4: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A second run, with the catalogue in reverse order, finds the same findings under
    the same fingerprints (and the baseline written by the first run names them)."""
    original = runner.catalog
    monkeypatch.setattr(runner, "catalog", lambda scope=(): list(reversed(original(scope))))
    again = runner.prove("upstream-current", ["C4"], jobs=2).to_json()
    first = [r["theorem"] for r in c4["report"]["results"]]
    assert [r["theorem"] for r in again["results"]] == list(reversed(first))
    assert _fingerprints(again) == _fingerprints(c4["report"])
    assert sorted(_fingerprints(again).values()) == sorted(
        e["fingerprint"] for e in c4["baseline"]["findings"])
    # ... and the written report carries them (JSON), as SARIF does.
    rows = [r for r in c4["report"]["results"] if r["verdict"] == "COUNTEREXAMPLE"]
    assert all(len(r["fingerprint"]) == 16 for r in rows)
    sarif = json.loads(render(c4["report"], "sarif"))
    # One SARIF result per defect (its id the partial fingerprint), listing its findings.
    results = sarif["runs"][0]["results"]
    assert {fp for r in results for fp in r["properties"]["findings"]} == set(
        _fingerprints(again).values())
    assert {r["partialFingerprints"]["kvcontractDefect/v1"] for r in results} == {
        d["id"] for d in c4["report"]["defects"]}


def _row(**changes: Any) -> dict[str, Any]:
    row = {"clause": "C4", "theorem": "load-window-exact", "verdict": "COUNTEREXAMPLE",
           "impact": "lost-hit", "message": "m", "seconds": 1.0,
           "witness": {"kind": "arith", "theorem": "C4/load-window-exact",
                       "values": {"bs": 1, "bpc": 1, "N": 2, "sw": 2, "e": 0}}}
    row.update(changes)
    return row


def test_fingerprint_rule() -> None:
    base = fingerprint(_row())
    # Not part of it: the run, the machine, the place, the message, free variables.
    assert fingerprint(_row(seconds=99.0, message="other words",
                            location={"path": "/elsewhere/x.py", "line": 999})) == base
    free = _row()
    free["witness"]["values"].update(N=7, sw=9, e=3)
    assert fingerprint(free) == base
    assert witness_shape("C4", "load-window-exact", free["witness"]) == {
        "kind": "arith", "config": {"bpc": 1, "bs": 1}}
    # Part of it: the clause, the theorem, the impact, the configuration.
    config = _row()
    config["witness"]["values"]["bs"] = 4
    for other in (_row(clause="C2"), _row(theorem="window-exact"), _row(impact="waste"),
                  config):
        assert fingerprint(other) != base
    # A case witness: its geometry and fields count, the catalogue's label does not.
    case = {"kind": "exhaustive", "theorem": "C4/lookup-is-maximal", "geometry_name": "A",
            "geometry": {"groups": [{"kind": "sliding_window", "block_size": 2}]},
            "num_tokens": 25, "local_hit": 0, "states": {"0": ["MISS", "HIT"]}}
    row = _row(theorem="lookup-is-maximal", witness=case)
    relabelled = _row(theorem="lookup-is-maximal", witness={**case, "geometry_name": "B"})
    assert fingerprint(row) == fingerprint(relabelled)
    assert fingerprint(row) != fingerprint(
        _row(theorem="lookup-is-maximal", witness={**case, "num_tokens": 26}))
    # A fuzz difference: its order number and drawn program do not count.
    fuzz = _row(clause="C3", theorem="fuzz-lookup", witness={"kind": "fuzz", "program": ["a"]})
    assert fingerprint(fuzz) == fingerprint(
        _row(clause="C3", theorem="fuzz-lookup-2", witness={"kind": "fuzz", "program": ["b"]}))


# -- the findings baseline --------------------------------------------------------------------
def test_baseline_file_format(c4: dict[str, Any]) -> None:
    baseline = c4["baseline"]
    assert baseline["version"] == 1 and baseline["kind"] == BASELINE_KIND
    assert baseline["command"] == "prove" and baseline["target"] == "upstream-current"
    assert set(baseline) == {"version", "kind", "fingerprint_rule", "command", "target",
                             "target_description", "findings"}
    for entry in baseline["findings"]:
        # ``defect``: the finding's defect id (prove and audit reports group them).
        assert set(entry) == {"fingerprint", "clause", "theorem", "impact", "message",
                              "defect"}
        assert entry["defect"] in {d["id"] for d in c4["report"]["defects"]}
        assert entry["clause"] == "C4" and entry["impact"] == "lost-hit"
        assert "\n" not in entry["message"]
    assert len(load_baseline(c4["folder"] / "baseline.json").entries) == 3


def test_round_trip_passes_on_nothing_new(c4: dict[str, Any], replayed: dict[str, Any],
                                          tmp_path: Path) -> None:
    base = str(c4["folder"] / "baseline.json")
    result = _ok(invoke([*C4, "--baseline-file", base, "--fail-on", "new",
                         "--json", str(tmp_path / "r.json")]), 0)
    assert "0 new, 3 in the baseline, 0 fixed" in _printed(result)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit_code"] == 0
    assert {r.get("baseline_state") for r in report["results"]
            if r["verdict"] == "COUNTEREXAMPLE"} == {"baseline"}
    assert report["findings_baseline"]["new"] == 0
    # Without --fail-on new the accepted findings still fail the run (they are lost hits).
    _ok(invoke([*C4, "--baseline-file", base, "--quiet"]), 1)
    # new narrowed to impacts none of the findings has: nothing fails either way.
    _ok(invoke([*C4, "--baseline-file", base, "--fail-on", "crash,new", "--quiet"]), 0)
    # --write-baseline alone accepts what it writes.
    _ok(invoke([*C4, "--write-baseline", str(tmp_path / "b.json"), "--fail-on", "new",
                "--quiet"]), 0)
    assert json.loads((tmp_path / "b.json").read_text()) == c4["baseline"]


def _findings_only(data: dict[str, Any]) -> dict[str, Any]:
    """A baseline that accepts findings, not defects (as one written before defects): a
    finding it lacks is new even when another finding of its defect is accepted."""
    for entry in data["findings"]:
        entry.pop("defect", None)
    return data


def test_a_finding_not_in_the_baseline_is_new(c4: dict[str, Any], replayed: dict[str, Any],
                                              tmp_path: Path) -> None:
    data = _findings_only(copy.deepcopy(c4["baseline"]))
    removed = data["findings"].pop(0)
    base = _write(tmp_path / "b.json", data)
    result = _ok(invoke([*C4, "--baseline-file", str(base), "--fail-on", "new",
                         "--json", str(tmp_path / "r.json"),
                         "--format", "markdown", "--output", str(tmp_path / "r.md"),
                         "--format", "text", "--output", str(tmp_path / "r.txt")]), 1)
    name = f"{removed['clause']}/{removed['theorem']}"
    assert f"new: {name} [lost-hit] {removed['fingerprint']}" in _printed(result)
    report = json.loads((tmp_path / "r.json").read_text())
    states = {f"{r['clause']}/{r['theorem']}": r.get("baseline_state")
              for r in report["results"] if r["verdict"] == "COUNTEREXAMPLE"}
    assert [k for k, v in states.items() if v == "new"] == [name]
    assert "**1 new**, 2 in the baseline" in (tmp_path / "r.md").read_text()
    assert f"{name}: COUNTEREXAMPLE [new]" in (tmp_path / "r.txt").read_text()


def test_a_vanished_finding_is_fixed(c4: dict[str, Any], replayed: dict[str, Any],
                                     tmp_path: Path) -> None:
    data = _findings_only(copy.deepcopy(c4["baseline"]))
    gone = {**data["findings"][0], "fingerprint": "0123456789abcdef"}
    unchecked = {"fingerprint": "fedcba9876543210", "clause": "C2",
                 "theorem": "first-run-covers-load", "impact": "crash", "message": "m"}
    data["findings"] += [gone, unchecked]
    base = _write(tmp_path / "b.json", data)
    result = _ok(invoke([*C4, "--baseline-file", str(base), "--fail-on", "new",
                         "--json", str(tmp_path / "r.json"), "--format", "github",
                         "--output", str(tmp_path / "r.github")]), 0)
    assert f"fixed: C4/{gone['theorem']} [lost-hit] 0123456789abcdef" in _printed(result)
    section = json.loads((tmp_path / "r.json").read_text())["findings_baseline"]
    assert [e["fingerprint"] for e in section["fixed"]] == ["0123456789abcdef"]
    # C2 did not run (--clause C4): not rechecked, never called fixed.
    assert [e["fingerprint"] for e in section["not_rechecked"]] == ["fedcba9876543210"]
    lines = (tmp_path / "r.github").read_text().splitlines()
    assert any(line.startswith("::notice title=kvcontract C4 fixed::") for line in lines)


BAD_BASELINES: dict[str, tuple[Any, str]] = {
    "notjson.json": ("{", "not valid JSON"),
    "list.json": ([1], "JSON object"),
    "report.json": ({"version": 1, "command": "prove", "target": "x", "results": []},
                    "a kvcontract report, not a findings baseline"),
    "version.json": ({"version": 7, "findings": []}, "unsupported baseline version 7"),
    "kind.json": ({"version": 1, "kind": "sarif", "findings": []}, "'kind' is 'sarif'"),
    "rule.json": ({"version": 1, "fingerprint_rule": "other/v9", "findings": []},
                  "fingerprint rule 'other/v9'"),
    "findings.json": ({"version": 1, "findings": {"a": 1}}, "'findings' must be a list"),
    "entry.json": ({"version": 1, "findings": ["x"]}, "findings[0] is not an object"),
    "fingerprint.json": ({"version": 1, "findings": [
        {"fingerprint": "XYZ", "clause": "C4", "theorem": "t"}]}, "findings[0].fingerprint"),
    "noclause.json": ({"version": 1, "findings": [
        {"fingerprint": "0123456789abcdef", "theorem": "t"}]}, "findings[0] has no 'clause'"),
    "impact.json": ({"version": 1, "findings": [
        {"fingerprint": "0123456789abcdef", "clause": "C4", "theorem": "t",
         "impact": "doom"}]}, "findings[0].impact"),
}


@pytest.mark.parametrize("name", list(BAD_BASELINES))
@pytest.mark.parametrize("command", ["prove", "audit"])
def test_bad_baseline_files_exit_2_before_any_work(name: str, command: str, tmp_path: Path,
                                                   guarded: None) -> None:
    data, problem = BAD_BASELINES[name]
    path = _write(tmp_path / name, data)
    head = ["prove"] if command == "prove" else ["audit", "--target", "reference"]
    result = _ok(invoke([*head, "--baseline-file", str(path), "--fail-on", "new"]), 2)
    assert result.output.startswith(f"kvcontract: error: cannot use {path}: ")
    assert problem in result.output


@pytest.mark.parametrize(("argv", "needles"), [
    (["--fail-on", "new"], ("--fail-on new", "--baseline-file", "--write-baseline")),
    (["--baseline-file", "{T}/missing.json"], ("missing.json", "no such file",
                                               "--write-baseline")),
    (["--baseline-file", "{T}"], ("a folder",)),
    (["--baseline-file", ""], ("--baseline-file", "empty")),
    (["--write-baseline", "{T}/file/b.json"], ("--write-baseline", "not a folder")),
    (["--write-baseline", "{T}/r.json", "--json", "{T}/r.json"], ("same file",)),
    (["--fail-on", "new,doom"], ("'doom'", "new")),
])
@pytest.mark.parametrize("command", ["prove", "audit"])
def test_bad_gate_options_exit_2(argv: list[str], needles: tuple[str, ...], command: str,
                                 tmp_path: Path, guarded: None) -> None:
    (tmp_path / "file").write_text("")
    head = ["prove"] if command == "prove" else ["audit", "--target", "reference"]
    result = _ok(invoke([*head, *(a.replace("{T}", str(tmp_path)) for a in argv)]), 2)
    for needle in needles:
        assert needle in result.output, result.output


def test_fuzz_rejects_new(guarded: None) -> None:
    result = _ok(invoke(["fuzz", "--fail-on", "new"]), 2)
    assert "--fail-on new" in result.output and "prove" in result.output


# -- [tool.kvcontract] ----------------------------------------------------------------------
def _project(folder: Path, table: str) -> Path:
    (folder / "pyproject.toml").write_text("[project]\nname = 'x'\n\n[tool.kvcontract]\n"
                                           + textwrap.dedent(table))
    return folder


def test_configuration_gives_defaults(c4: dict[str, Any], replayed: dict[str, Any],
                                      tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    project = _project(tmp_path, """
        fail-on = ["new"]
        baseline-file = "gate/baseline.json"
        jobs = 1
        impl = "upstream-current"
    """)
    (project / "gate").mkdir()
    shutil.copy(c4["folder"] / "baseline.json", project / "gate" / "baseline.json")
    nested = project / "src" / "deeper"
    nested.mkdir(parents=True)
    monkeypatch.chdir(nested)  # found walking up; baseline-file relative to the file
    _ok(invoke(["prove", "--clause", "C4", "--quiet"]), 0)
    assert replayed["impl_name"] == "upstream-current" and replayed["jobs"] == 1
    # The command line wins.
    _ok(invoke(["prove", "--clause", "C4", "--quiet", "--fail-on", "lost-hit"]), 1)
    _ok(invoke(["prove", "--clause", "C4", "--quiet", "--jobs", "2"]), 0)
    assert replayed["jobs"] == 2


@pytest.mark.parametrize(("table", "needles"), [
    ('color = "red"\n', ("unknown key 'color'", "fail-on, baseline-file")),
    ('budget = "lots"\n', ("budget must be an integer", "'lots'")),
    ("jobs = 0\n", ("jobs must be between 1 and",)),
    ('fail-on = "doom"\n', ("fail-on", "'doom'")),
    ("model = []\n", ("model must be a string or a non-empty list",)),
    ("require-complete = 1\n", ("require-complete must be true or false",)),
    ("fail-on = \n", ("not valid TOML",)),
])
@pytest.mark.parametrize("command", ["prove", "audit"])
def test_bad_configuration_exits_2(table: str, needles: tuple[str, ...], command: str,
                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   guarded: None) -> None:
    _project(tmp_path, table)
    monkeypatch.chdir(tmp_path)
    head = ["prove"] if command == "prove" else ["audit", "--target", "reference"]
    result = _ok(invoke(head), 2)
    assert f"cannot use {tmp_path / 'pyproject.toml'}" in result.output
    for needle in needles:
        assert needle in result.output, result.output


def test_a_pyproject_without_the_table_is_ignored(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  replayed: dict[str, Any]) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.kvcontract-other]\nx = 1\n[tool.ruff]\n")
    monkeypatch.chdir(tmp_path)
    _ok(invoke([*C4, "--quiet"]), 1)


# -- --format github ------------------------------------------------------------------------
def test_github_escaping() -> None:
    assert escape_data("100% done\r\nnext") == "100%25 done%0D%0Anext"
    assert escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"


def test_github_lines() -> None:
    def finding(theorem: str, impact: str | None, state: str | None = None,
                verdict: str = "COUNTEREXAMPLE") -> dict[str, Any]:
        row = {"clause": "C4", "theorem": theorem, "verdict": verdict, "impact": impact,
               "message": "50% of hits lost:\nsee, here",
               "location": {"path": "vllm/a,b:c.py", "line": 7},
               "witness": {"kind": "arith", "values": {"bs": 1}} if impact else None}
        if state:
            row["baseline_state"] = state
        return row

    report = {"version": 1, "command": "audit", "target": "vllm:.",
              "fail_on": ["crash", "corruption", "lost-hit"],
              "findings_baseline": {"only_new": True, "path": "b.json", "new": 1,
                                    "baseline": 1, "fixed": [
                                        {"fingerprint": "0123456789abcdef", "clause": "C2",
                                         "theorem": "t", "impact": "crash", "message": ""}],
                                    "not_rechecked": []},
              "results": [finding("new-one", "lost-hit", "new"),
                          finding("accepted", "lost-hit", "baseline"),
                          finding("latent-one", "latent", "new"),
                          finding("slow", "delay", "new"),
                          finding("undecided", None, verdict="UNKNOWN"),
                          {"clause": "C1", "theorem": "fine", "verdict": "PROVED"}]}
    lines = render(report, "github").splitlines()
    assert len(lines) == 6 and all(line.startswith("::") for line in lines)
    levels = [line.split(" ", 1)[0] for line in lines]
    assert levels == ["::error", "::warning", "::notice", "::warning", "::error", "::notice"]
    first = lines[0]
    assert first.startswith("::error file=vllm/a%2Cb%3Ac.py,line=7,title=kvcontract C4 "
                            "COUNTEREXAMPLE [lost-hit] (new)::C4/new-one: ")
    assert "50%25 of hits lost: see, here%0Awitness: " in first  # one line, escaped
    assert "%0Afingerprint: " in first
    assert "(baseline)" in lines[1]


def test_github_format_from_the_command_line(c4: dict[str, Any], replayed: dict[str, Any],
                                             tmp_path: Path) -> None:
    result = _ok(invoke([*C4, "--quiet", "--format", "github", "--output", "-",
                         "--format", "sarif", "--output", str(tmp_path / "r.sarif")]), 1)
    annotations = [line for line in result.output.splitlines() if line.startswith("::")]
    # One annotation per defect (the three findings are two defects of upstream-current).
    assert len(annotations) == len(c4["report"]["defects"]) == 2
    assert all(line.startswith("::error file=impl/variants.py,line=") for line in annotations)
    assert json.loads((tmp_path / "r.sarif").read_text())["version"] == "2.1.0"


def test_sarif_with_a_baseline_is_schema_valid(c4: dict[str, Any], replayed: dict[str, Any],
                                               tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
    defect_of = {e["fingerprint"]: e["defect"] for e in c4["baseline"]["findings"]}
    data = _findings_only(copy.deepcopy(c4["baseline"]))
    popped = data["findings"].pop()
    base = _write(tmp_path / "b.json", data)
    _ok(invoke([*C4, "--quiet", "--baseline-file", str(base), "--output",
                str(tmp_path / "r.sarif")]), 1)
    log = json.loads((tmp_path / "r.sarif").read_text())
    jsonschema.Draft4Validator(schema).validate(log)
    # One result per defect: new when one of its findings is.
    states = {r["partialFingerprints"]["kvcontractDefect/v1"]: r["baselineState"]
              for r in log["runs"][0]["results"]}
    assert states[defect_of[popped["fingerprint"]]] == "new"
    assert sorted(states.values()).count("new") == 1


# -- audit: --require-complete and --baseline git:REF ------------------------------------------
WINDOW_IGNORING_E = '''
def get_sliding_window_size_in_chunks(kv_cache_spec, tokens_per_chunk):
    if isinstance(kv_cache_spec, SlidingWindowSpec):
        return cdiv(kv_cache_spec.sliding_window, tokens_per_chunk)
    return None
'''
"""Upstream's first window term alone: C4 (``window-exact``) fails, lost hit."""

WINDOW_EXACT = '''
def get_sliding_window_size_in_chunks(kv_cache_spec, tokens_per_chunk):
    if isinstance(kv_cache_spec, SlidingWindowSpec):
        return cdiv(kv_cache_spec.sliding_window - 1 + kv_cache_spec.extra_retained_tokens,
                    tokens_per_chunk)
    return None
'''
FAST = ["--clause", "C4", "--budget", "1000", "--jobs", "2", "--quiet", "--judge", "stand-ins"]
FAST_AUDIT = [*FAST, "--base", "0.33.0"]
"""A patch laid over the 0.33.0 release: every function it does not define is 0.33.0's."""


def test_require_complete(tmp_path: Path) -> None:
    """A patch that defines one function, alone (``--base none``), checks nothing of C4:
    the other functions its theorems read are not upstream code anyone gave (exit 3).
    Over its base release every C4 theorem runs: the exact window passes, with or
    without --require-complete; upstream's first window term alone fails (exit 1)."""
    exact = tmp_path / "exact.py"
    exact.write_text(WINDOW_EXACT)
    _ok(invoke(["audit", "--target", f"module:{exact}", *FAST, "--base", "none",
                "--json", str(tmp_path / "alone.json")]), 3)
    alone = json.loads((tmp_path / "alone.json").read_text())
    assert alone["results"] == [] and alone["unchecked"]
    _ok(invoke(["audit", "--target", f"module:{exact}", *FAST_AUDIT,
                "--json", str(tmp_path / "r.json")]), 0)
    report = json.loads((tmp_path / "r.json").read_text())
    verdicts = {r["theorem"]: r["verdict"] for r in report["results"]}
    assert verdicts["window-exact"] == verdicts["load-window-exact"] == "PROVED"
    assert report["unchecked"] == []
    _ok(invoke(["audit", "--target", f"module:{exact}", *FAST_AUDIT, "--require-complete"]), 0)
    wrong = tmp_path / "wrong.py"
    wrong.write_text(WINDOW_IGNORING_E)
    _ok(invoke(["audit", "--target", f"module:{wrong}", *FAST_AUDIT, "--require-complete"]), 1)


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=kvcontract", "-c", "user.email=k@example.com",
                           "-c", "commit.gpgsign=false", *args], cwd=repo, check=True,
                          capture_output=True, text=True)
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with two commits of a patched file: the defect, then the fix."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    (root / "patch.py").write_text(WINDOW_IGNORING_E)
    _git(root, "add", "patch.py")
    _git(root, "commit", "-q", "-m", "upstream's window")
    (root / "patch.py").write_text(WINDOW_EXACT)
    _git(root, "commit", "-q", "-am", "exact window")
    return root


def test_baseline_git_ref(repo: Path, tmp_path: Path) -> None:
    before = (repo / "patch.py").read_text()
    _ok(invoke(["audit", "--target", f"module:{repo / 'patch.py'}", "--baseline", "git:HEAD~1",
                *FAST_AUDIT, "--json", str(tmp_path / "r.json")]), 0)
    comparison = json.loads((tmp_path / "r.json").read_text())["comparison"]
    assert comparison["baseline"] == "git:HEAD~1"
    assert comparison["clauses"][0]["clause"] == "C4"
    assert comparison["clauses"][0]["classification"] == "fixed"
    # The other way round: the fix reverted is a regression (exit 1).
    (repo / "patch.py").write_text(WINDOW_IGNORING_E)
    _ok(invoke(["audit", "--target", f"module:{repo / 'patch.py'}", "--baseline", "git:HEAD",
                *FAST_AUDIT]), 1)
    (repo / "patch.py").write_text(before)
    # The checkout was never touched.
    assert _git(repo, "status", "--porcelain") == ""


@pytest.mark.parametrize(("target", "ref", "needles"), [
    ("repo", "git:no-such-branch", ("git:no-such-branch", "no such revision")),
    ("repo", "git:", ("needs a revision",)),
    ("repo", "git:--output=x", ("not a revision",)),
    ("outside", "git:HEAD", ("not inside a git repository",)),
    ("builtin", "git:HEAD", ("git:REF needs --target vllm:PATH or module:FILE.py",)),
    ("new-file", "git:HEAD~1", ("none of the audited files",)),
])
def test_baseline_git_ref_errors(target: str, ref: str, needles: tuple[str, ...], repo: Path,
                                 tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import kvcontract.tools.audit.command

    def guard(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("engine reached")

    monkeypatch.setattr(kvcontract.tools.audit.command, "run_audit_command", guard)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "patch.py").write_text(WINDOW_EXACT)
    (repo / "new.py").write_text(WINDOW_EXACT)
    _git(repo, "add", "new.py")
    _git(repo, "commit", "-q", "-m", "a new file")
    spec = {"repo": f"module:{repo / 'patch.py'}", "outside": f"module:{outside / 'patch.py'}",
            "builtin": "reference", "new-file": f"module:{repo / 'new.py'}"}[target]
    result = _ok(invoke(["audit", "--target", spec, "--baseline", ref, *FAST_AUDIT]), 2)
    assert result.output.startswith("kvcontract: error: ")
    for needle in needles:
        assert needle in result.output, result.output


# -- the "done when" on the released vLLM 0.33.0 ----------------------------------------
SCHEDULER = "distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"
OFF_BY_ONE = ("None if defer_lookup or pending_in_window else idx + required_window\n",
              "None if defer_lookup or pending_in_window else idx + required_window - 1\n")


@pytest.fixture(scope="module")
def vllm_033() -> Path:
    from kvcontract.tools.audit.wheels import FetchError, fetch_release

    try:
        return Path(fetch_release("0.33.0"))
    except FetchError as exc:
        pytest.skip(f"vLLM 0.33.0 is not available (registry unreachable?): {exc}")


def test_vllm_gate_goes_green_on_nothing_new(vllm_033: Path, tmp_path: Path) -> None:
    """On vLLM 0.33.0: write the baseline, then --fail-on new exits 0; a seeded
    off-by-one in upstream's window scan exits 1 and names only the new finding."""
    checkout = tmp_path / "checkout"
    shutil.copytree(vllm_033, checkout)
    budget = ["--clause", "C4", "--budget", "2000", "--jobs", "2", "--quiet", "--judge",
              "stand-ins"]
    target = f"vllm:{checkout}"
    baseline = tmp_path / ".kvcontract-baseline.json"
    _ok(invoke(["audit", "--target", target, *budget, "--write-baseline", str(baseline)]), 1)
    accepted = {e["theorem"] for e in json.loads(baseline.read_text())["findings"]}
    assert accepted >= {"load-window-exact", "window-exact"}
    gate = ["--baseline-file", str(baseline), "--fail-on", "new"]
    _ok(invoke(["audit", "--target", target, *budget, *gate]), 0)
    scheduler = checkout / "vllm" / SCHEDULER
    source = scheduler.read_text()
    assert source.count(OFF_BY_ONE[0]) == 1
    scheduler.write_text(source.replace(*OFF_BY_ONE))
    result = _ok(invoke(["audit", "--target", target, *budget, *gate,
                         "--json", str(tmp_path / "r.json")]), 1)
    report = json.loads((tmp_path / "r.json").read_text())
    new = {r["theorem"] for r in report["results"] if r.get("baseline_state") == "new"}
    assert new and new <= {"scan-is-maximal", "lookup-is-maximal",
                           "upstream-lookup-is-maximal"}
    assert not new & accepted
    assert {r["theorem"] for r in report["results"]
            if r.get("baseline_state") == "baseline"} == accepted
    assert f"{len(new)} new, {len(accepted)} in the baseline, 0 fixed" in _printed(result)


# -- the workflows ----------------------------------------------------------------------------
def _workflow(name: str) -> dict[Any, Any]:
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load((EXAMPLES / name).read_text())
    assert isinstance(data, dict)
    return data


def _steps(data: dict[Any, Any]) -> list[dict[str, Any]]:
    (job,) = data["jobs"].values()
    steps: list[dict[str, Any]] = job["steps"]
    return steps


@pytest.mark.parametrize("name", ["vllm-pr.yml", "kvcontract.yml"])
def test_workflows_are_fork_safe_and_current(name: str) -> None:
    data = _workflow(name)
    on = data.get("on", data.get(True))  # YAML 1.1 reads the key `on` as True
    assert "pull_request" in on and "pull_request_target" not in on
    steps = _steps(data)
    text = (EXAMPLES / name).read_text()
    assert "upload-sarif@v3" not in text
    fork_guard = "github.event.pull_request.head.repo.full_name == github.repository"
    for step in steps:
        uses, run = step.get("uses", ""), step.get("run", "")
        if uses.startswith("github/codeql-action/upload-sarif"):
            assert uses.endswith("@v4")
            assert fork_guard in step["if"]
        if "gh pr comment" in run:
            assert fork_guard in step["if"]
        if "pytest" in run and "kvcontract-out" in run:
            assert "pip install pytest" in run
            assert '!= 1' in run  # pytest must have run and failed, not exited 5
    for step in steps:
        if "run" in step:
            checked = subprocess.run(["bash", "-n"], input=step["run"], text=True,
                                     capture_output=True, check=False)
            assert checked.returncode == 0, (step.get("name"), checked.stderr)


def test_vllm_workflow_gates_on_new_findings() -> None:
    steps = _steps(_workflow("vllm-pr.yml"))
    audit = next(s for s in steps if s.get("id") == "audit")["run"]
    for needle in ("kvcontract audit --target vllm:.", "--fail-on new", "--baseline-file",
                   "--format github --output -", "--format sarif", "--reproducers"):
        assert needle in audit
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "$GITHUB_STEP_SUMMARY" in runs
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") for s in steps)
    assert any(s.get("uses", "").startswith("actions/checkout@") for s in steps)


def test_output_dash_is_stdout() -> None:
    from kvcontract.errors import UsageError
    from kvcontract.tools.reports import pair_outputs

    assert pair_outputs(("github", "sarif"), ("-", "r.sarif")) == [
        ("github", None), ("sarif", "r.sarif")]
    with pytest.raises(UsageError, match="given twice"):
        pair_outputs(("github", "text"), ("-", "-"))
    with pytest.raises(UsageError, match="needs a --format"):
        pair_outputs((), ("-",))
