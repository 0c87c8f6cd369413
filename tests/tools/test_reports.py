"""Report formats: JSON, JUnit (schema-valid), SARIF 2.1.0 (official schema), Markdown,
mypy-style lines; the fuzz report folded into the same shape; clear input errors."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import xmlschema

from kvcontract.errors import InputFileError, UsageError
from kvcontract.tools.fuzz import Difference, FuzzReport
from kvcontract.tools.reports import (
    FORMATS,
    MARKDOWN_LIMIT,
    ReportError,
    exit_code,
    load_report,
    normalize,
    pair_outputs,
    render,
)

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = Path(__file__).resolve().parents[2]
MYPY_LINE = re.compile(
    r"^(?P<path>[^:\s]+):(?P<line>\d+): error: \[(?P<clause>C\d+)\] (?P<rest>.+)$"
)


@pytest.fixture(scope="module")
def sarif_validator() -> jsonschema.Draft4Validator:
    schema = json.loads((DATA / "sarif-schema-2.1.0.json").read_text())
    return jsonschema.Draft4Validator(schema)


@pytest.fixture(scope="module")
def junit_schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(DATA / "junit.xsd"))


def fuzz_report() -> dict[str, Any]:
    report = FuzzReport(target="stale-pending", device="cpu", cases=3, steps=40,
                        per_clause={"C2": 10, "C3": 7, "C11": 5})
    report.differences = [
        Difference("C3", "lookup", "[mocked] deferred a ready window", ["arrive(...)", "step(8)"],
                   {"request": "r0"}),
        Difference("C3", "lookup", "[real] deferred a ready window", ["arrive(...)"], {}),
    ]
    return dict(report.to_json())


def counterexamples(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in report["results"] if r["verdict"] == "COUNTEREXAMPLE"]


# -- JSON -------------------------------------------------------------------------------
def test_json_is_versioned_and_locates_the_defect(variant_reports: dict[str, Any]) -> None:
    for name, report in variant_reports.items():
        data = json.loads(render(report, "json"))
        assert data["version"] == 1 and data["command"] == "prove" and data["target"] == name
        # Every variant's counterexample is a finding with an impact; the run fails when
        # one of them is in the default --fail-on (every impact but latent).
        impacts = {r["impact"] for r in counterexamples(data)}
        assert impacts and None not in impacts
        failing = impacts - {"latent"}
        assert data["exit_code"] == (1 if failing else 0), (name, impacts)
        for result in counterexamples(data):
            location = result["location"]
            source = (ROOT / location["path"]).read_text().splitlines()
            assert location["path"] == "impl/variants.py", (name, location)
            assert source[location["line"] - 1].startswith("def _"), (name, location)


def test_location_points_at_the_replaced_function(variant_reports: dict[str, Any]) -> None:
    data = json.loads(render(variant_reports["stale-pending"], "json"))
    line = counterexamples(data)[0]["location"]["line"]
    source = (ROOT / "impl/variants.py").read_text().splitlines()
    assert source[line - 1].startswith("def _stale_pending_lookup(")


def test_supplied_location_wins(variant_reports: dict[str, Any]) -> None:
    report = copy.deepcopy(variant_reports["unaligned-hit"])
    report["results"][0]["location"] = {"path": "vllm/v1/offloading/scheduler.py", "line": 321}
    lines = render(report, "mypy").splitlines()
    assert lines[0].startswith("vllm/v1/offloading/scheduler.py:321: error: [C2] ")
    sarif = json.loads(render(report, "sarif"))
    physical = sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"]["uri"] == "vllm/v1/offloading/scheduler.py"
    assert physical["region"]["startLine"] == 321


# -- JUnit ------------------------------------------------------------------------------
def test_junit_is_schema_valid_one_case_per_theorem(
    variant_reports: dict[str, Any], junit_schema: xmlschema.XMLSchema
) -> None:
    for report in [*variant_reports.values(), fuzz_report()]:
        xml = render(report, "junit")
        junit_schema.validate(xml)
        root = xmlschema.XMLResource(xml).root
        cases = root.findall("./testsuite/testcase")
        normalized = normalize(report)
        assert len(cases) == len(normalized["results"])
        failures = [c for c in cases if c.find("failure") is not None]
        assert len(failures) == sum(r["status"] == "fail" for r in normalized["results"])
        assert root.get("failures") == str(len(failures))
        for case in failures:
            assert case.find("failure").get("type") == "COUNTEREXAMPLE"  # type: ignore[union-attr]


def test_junit_unknown_is_an_error_not_a_pass(junit_schema: xmlschema.XMLSchema) -> None:
    report = {"version": 1, "command": "prove", "target": "reference", "results": [
        {"clause": "C8", "theorem": "stored-blocks-demanded", "verdict": "UNKNOWN",
         "domain": "d", "seconds": 1.5, "message": "Z3 said unknown \x01 for A=33"},
    ]}
    xml = render(report, "junit")
    junit_schema.validate(xml)
    assert "<error " in xml and 'errors="1"' in xml and "\x01" not in xml
    assert exit_code(normalize(report)) == 3


# -- SARIF -----------------------------------------------------------------------------
def test_sarif_matches_the_official_schema(
    variant_reports: dict[str, Any], sarif_validator: jsonschema.Draft4Validator
) -> None:
    for report in [*variant_reports.values(), fuzz_report()]:
        log = json.loads(render(report, "sarif"))
        sarif_validator.validate(log)
        run = log["runs"][0]
        rules = run["tool"]["driver"]["rules"]
        assert [r["id"] for r in rules][:11] == [f"C{i}" for i in range(1, 12)]
        failing = [r for r in normalize(report)["results"] if r["status"] != "pass"]
        assert len(run["results"]) == len(failing)
        for result in run["results"]:
            assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
            assert result["message"]["text"].startswith(f"{result['ruleId']} violated")
            assert result["locations"][0]["physicalLocation"]["region"]["startLine"] >= 1


def test_sarif_of_a_clean_run_has_no_results(sarif_validator: jsonschema.Draft4Validator) -> None:
    report = {"version": 1, "command": "prove", "target": "reference", "results": [
        {"clause": "C1", "theorem": "load-set-exact", "verdict": "PROVED", "domain": "all"},
    ]}
    log = json.loads(render(report, "sarif"))
    sarif_validator.validate(log)
    assert log["runs"][0]["results"] == []


# -- Markdown and mypy lines ----------------------------------------------------------------
def test_markdown_names_findings_and_fits_a_comment(variant_reports: dict[str, Any]) -> None:
    text = render(variant_reports["mtp-extra-retained"], "markdown")
    assert text.startswith("### ❌ `kvcontract prove --impl mtp-extra-retained`")
    assert "| C2 | `lookup-loads-only-hit` | **COUNTEREXAMPLE** | `impl/variants.py:" in text
    huge = copy.deepcopy(variant_reports["mtp-extra-retained"])
    huge["results"] = [dict(huge["results"][0], theorem=f"t{i}") for i in range(3000)]
    big = render(huge, "markdown")
    assert len(big) <= MARKDOWN_LIMIT
    assert "truncated to fit a pull-request comment" in big


def test_mypy_lines_point_at_source(variant_reports: dict[str, Any]) -> None:
    for report in variant_reports.values():
        lines = render(report, "mypy").splitlines()
        errors = [m for m in map(MYPY_LINE.match, lines) if m]
        assert len(errors) == len(counterexamples(report))
        for match in errors:
            assert (ROOT / match["path"]).is_file()
            assert match["rest"].startswith(f"{match['clause']}/")
        assert lines[-1].startswith("Found ")


def test_text_format_lists_every_result(variant_reports: dict[str, Any]) -> None:
    report = variant_reports["unaligned-hit"]
    text = render(report, "text")
    for result in report["results"]:
        assert result["theorem"] in text
    assert "witness:" in text


# -- fuzz normalization ---------------------------------------------------------------------
def test_fuzz_report_becomes_per_clause_results() -> None:
    normalized = normalize(fuzz_report())
    by_theorem = {(r["clause"], r["theorem"]): r for r in normalized["results"]}
    assert by_theorem[("C3", "fuzz-lookup")]["verdict"] == "COUNTEREXAMPLE"
    assert by_theorem[("C3", "fuzz-lookup-2")]["witness"]["program"] == ["arrive(...)"]
    assert by_theorem[("C2", "fuzz")]["verdict"] == "PASSED"
    assert ("C3", "fuzz") not in by_theorem  # a clause with a difference is not passed
    assert [r["clause"] for r in normalized["results"]] == ["C2", "C3", "C3", "C11"]
    assert exit_code(normalized) == 1
    data = json.loads(render(fuzz_report(), "json"))
    assert data["differences"] and len(data["results"]) == 4


# -- errors and options ---------------------------------------------------------------------
def test_unknown_format_is_a_usage_error(variant_reports: dict[str, Any]) -> None:
    with pytest.raises(UsageError, match="unknown report format 'html'"):
        render(variant_reports["unaligned-hit"], "html")


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda r: r.update(version=2), "unsupported report version 2"),
        (lambda r: r.pop("results"), "no 'results'"),
        (lambda r: r["results"][0].pop("clause"), r"results\[0\] has no 'clause'"),
        (lambda r: r["results"][0].update(verdict="MAYBE"), "unknown verdict 'MAYBE'"),
        (lambda r: r["results"][0].update(location={"path": "x.py", "line": 0}), "location"),
    ],
)
def test_malformed_reports_are_rejected(
    variant_reports: dict[str, Any], mutate: Any, problem: str
) -> None:
    report = copy.deepcopy(variant_reports["unaligned-hit"])
    mutate(report)
    with pytest.raises(ReportError, match=problem):
        normalize(report)


def test_audit_verdicts_with_their_own_status() -> None:
    report = {"version": 1, "command": "audit", "target": "vllm@abc", "results": [
        {"clause": "C2", "theorem": "lookup-window", "verdict": "MISMATCH", "status": "fail",
         "message": "upstream checks W chunks",
         "location": {"path": "vllm/scheduler.py", "line": 40}},
    ]}
    assert render(report, "mypy").startswith("vllm/scheduler.py:40: error: [C2] C2/lookup-window")
    assert exit_code(normalize(report)) == 1


def test_a_stated_exit_code_is_believed() -> None:
    report = {"version": 1, "command": "audit", "target": "vllm@0.1", "results": [],
              "exit_code": 3}
    assert exit_code(normalize(report)) == 3
    assert "undecided" in render(report, "markdown").splitlines()[0]
    with pytest.raises(ReportError, match="'exit_code' must be"):
        normalize({**report, "exit_code": 7})


def test_load_report_errors_name_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(InputFileError, match=r"broken\.json.*not valid JSON at line 1"):
        load_report(broken)
    other = tmp_path / "other.json"
    other.write_text('{"version": 1, "command": "prove"}')
    with pytest.raises(InputFileError, match=r"other\.json.*no 'target'"):
        load_report(other)
    with pytest.raises(InputFileError, match=r"missing\.json"):
        load_report(tmp_path / "missing.json")


def test_pair_outputs() -> None:
    assert pair_outputs(("sarif",), ()) == [("sarif", None)]
    assert pair_outputs((), ("a.sarif", "b.xml", "c.md")) == [
        ("sarif", "a.sarif"), ("junit", "b.xml"), ("markdown", "c.md")]
    assert pair_outputs(("mypy", "json"), ("x.txt", "y")) == [("mypy", "x.txt"), ("json", "y")]
    with pytest.raises(UsageError, match="one --output FILE each"):
        pair_outputs(("json", "sarif"), ())
    with pytest.raises(UsageError, match="2 --format options but 1 --output"):
        pair_outputs(("json", "sarif"), ("a.json",))
    with pytest.raises(UsageError, match="cannot tell the format"):
        pair_outputs((), ("report.html",))
    assert set(FORMATS) >= {"json", "junit", "sarif", "markdown", "mypy"}


def _kvcontract(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvcontract", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_prove_cli_formats_and_outputs(
    tmp_path: Path, sarif_validator: jsonschema.Draft4Validator,
    junit_schema: xmlschema.XMLSchema,
) -> None:
    stdout_run = _kvcontract("prove", "--impl", "prefill-horizon", "--clause", "C9",
                             "--jobs", "1", "--format", "sarif", "--fail-on", "all", cwd=ROOT)
    assert stdout_run.returncode == 1, stdout_run.stderr
    sarif_validator.validate(json.loads(stdout_run.stdout))
    files = _kvcontract("prove", "--impl", "prefill-horizon", "--clause", "C9", "--jobs", "1",
                        "--quiet", "--output", str(tmp_path / "r.xml"),
                        "--format", "mypy", "--output", str(tmp_path / "r.txt"),
                        "--json", str(tmp_path / "r.json"), cwd=ROOT)
    assert files.returncode == 2  # one --format for two --output files
    assert "1 --format options but 2 --output options" in files.stderr
    files = _kvcontract("prove", "--impl", "prefill-horizon", "--clause", "C9", "--jobs", "1",
                        "--quiet", "--fail-on", "waste", "--output", str(tmp_path / "r.xml"),
                        "--output", str(tmp_path / "r.md"),
                        "--json", str(tmp_path / "r.json"), cwd=ROOT)
    assert files.returncode == 1, files.stderr
    junit_schema.validate(str(tmp_path / "r.xml"))
    assert (tmp_path / "r.md").read_text().startswith("### ❌")
    assert load_report(tmp_path / "r.json")["results"][0]["location"]["path"] == "impl/variants.py"
