"""Generated reproducers: they fail on each historic variant, pass on the reference, run
without the solver, agree with the prover's statements, and are deterministic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from _variant_reports import SLOW_THEOREMS, build_report

from kvcontract.errors import UsageError
from kvcontract.impl.variants import get_implementation
from kvcontract.proofs.runner import catalog
from kvcontract.spec.properties import CaseProperty, FormulaProperty
from kvcontract.tools.gentests import (
    MARKER,
    GeneratedTest,
    boundary_class_tests,
    reproducers,
    write_tests,
)

ROOT = Path(__file__).resolve().parents[2]


def _blocked_z3(tmp_path: Path) -> Path:
    """A directory that shadows ``z3`` with a module whose import fails."""
    stub = tmp_path / "no-z3" / "z3"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'z3\' (blocked by the test)", name="z3")\n'
    )
    return stub.parent


def run_pytest(directory: Path, tmp_path: Path, impl: str | None) -> dict[str, str | None]:
    """Run the generated files without z3; map each test to its failure message (or None)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_blocked_z3(tmp_path / (impl or "own"))), env.get("PYTHONPATH", "")]
    )
    env.pop("KVCONTRACT_IMPL", None)
    if impl is not None:
        env["KVCONTRACT_IMPL"] = impl
    junit = tmp_path / f"junit-{impl or 'own'}.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
         str(directory), "--junitxml", str(junit), str(directory)],
        cwd=directory, env=env, capture_output=True, text=True, timeout=600,
    )
    # 0 or 1: the files were collected and ran; an import of z3 would be a collection
    # error (exit 2) because the stub on PYTHONPATH makes it fail.
    assert done.returncode in (0, 1), done.stdout + done.stderr
    outcome: dict[str, str | None] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        failure = case.find("failure")
        error = case.find("error")
        assert error is None, (case.get("name"), error.get("message"))
        outcome[f"{case.get('classname')}.{case.get('name')}"] = (
            None if failure is None else failure.get("message")
        )
    return outcome


@pytest.fixture(scope="module")
def generated(
    variant_reports: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, list[GeneratedTest]]]:
    out = tmp_path_factory.mktemp("reproducers")
    tests: dict[str, list[GeneratedTest]] = {}
    for name, report in variant_reports.items():
        tests[name], skipped = reproducers(report)
        assert not skipped, skipped
        write_tests(tests[name], out / name)
    return out, tests


def test_one_file_per_counterexample(
    variant_reports: dict[str, dict[str, Any]],
    generated: tuple[Path, dict[str, list[GeneratedTest]]],
) -> None:
    _, tests = generated
    for name, report in variant_reports.items():
        expected = sorted(
            f"{r['clause']}/{r['theorem']}" for r in report["results"]
            if r["verdict"] == "COUNTEREXAMPLE"
        )
        assert expected, name  # every historic variant has a counterexample here
        assert sorted(t.theorem for t in tests[name]) == expected


def test_reproducers_fail_on_the_variant_and_pass_on_the_fix(
    generated: tuple[Path, dict[str, list[GeneratedTest]]], tmp_path: Path
) -> None:
    out, tests = generated
    own = run_pytest(out, tmp_path, None)
    assert len(own) == sum(len(t) for t in tests.values())
    for test_name, message in own.items():
        assert message is not None, f"{test_name} passed on its own variant"
        clause = test_name.split("test_c", 1)[1].split("_", 1)[0]
        assert message.startswith(f"AssertionError: C{clause} violated: "), message
    fixed = run_pytest(out, tmp_path, "reference")
    assert fixed.keys() == own.keys()
    assert all(message is None for message in fixed.values()), fixed


def test_reproducers_need_neither_solver_nor_prover(
    generated: tuple[Path, dict[str, list[GeneratedTest]]],
) -> None:
    _, tests = generated
    for test in (t for group in tests.values() for t in group):
        assert test.source.startswith(MARKER + "\n")
        assert "z3" not in test.source
        assert "kvcontract.proofs" not in test.source
        assert 'os.environ.get("KVCONTRACT_IMPL", ' in test.source
        compile(test.source, test.filename, "exec")


def test_reproducer_shows_the_witness(
    generated: tuple[Path, dict[str, list[GeneratedTest]]],
) -> None:
    _, tests = generated
    lookup = next(t for t in tests["stale-pending"] if "lookup" in t.theorem).source
    witness = _witness(lookup)
    assert witness["geometry_name"] == "FA4+SWA4(sw8)"
    assert witness["states"]["1"] == ["HIT", "MISS", "HIT_PENDING", "MISS"]
    assert "THEOREM = 'C3/lookup-defers-only-in-scope'" in lookup
    arith = tests["unaligned-hit"][0].source
    assert _witness(arith)["values"] == {"bs": 1, "bpc": 2, "N": 3, "Lb": 0, "sw": 2, "e": 1}
    assert "replay(THEOREM, WITNESS, load_implementation(IMPL))" in arith


def _witness(source: str) -> dict[str, Any]:
    """The witness a generated test replays, read back from its ``WITNESS`` literal.

    Read back from the file rather than enumerated again: a Z3 model depends on the
    solver's history within one process, so a second enumeration may pick other values
    (files are identical across runs, each run being a fresh process)."""
    namespace: dict[str, Any] = {}
    start = source.index("WITNESS = ")
    end = source.index("\n\n\ndef ", start)
    exec(source[start:end], namespace)
    witness: dict[str, Any] = namespace["WITNESS"]
    return witness


def _exec_test(source: str, impl: str, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """Run a generated test in-process; its assertion message, or None when it passes."""
    monkeypatch.setenv("KVCONTRACT_IMPL", impl)
    namespace: dict[str, Any] = {"__name__": "generated"}
    exec(compile(source, "generated.py", "exec"), namespace)
    test = next(v for k, v in namespace.items() if k.startswith("test_") and callable(v))
    try:
        test()
    except AssertionError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("clause", ["C1", "C2", "C4", "C7"])
def test_templates_agree_with_the_prover(clause: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On every boundary-class witness, a generated test fails exactly when the theorem's
    own replay finds a violation, for the reference and for the variants."""
    theorems = {t.theorem_id: t for t in catalog() if isinstance(t, FormulaProperty)}
    tests, _ = boundary_class_tests("reference", [clause], max_classes=6)
    assert tests
    names = ["reference", "mtp-extra-retained", "upstream-current", "unaligned-hit"]
    for test in tests:
        theorem = theorems[test.theorem]
        values = _witness(test.source)["values"]
        for name in names:
            expected = theorem.violation(values, get_implementation(name))
            got = _exec_test(test.source, name, monkeypatch)
            assert (got is None) == (expected is None), (test.filename, name, got, expected)
            if got is not None:
                assert got.startswith(f"{clause} violated: ")


@pytest.mark.parametrize("kind", ["scan", "lookup", "store"])
def test_exhaustive_templates_agree_with_the_checks(
    kind: str, monkeypatch: pytest.MonkeyPatch, variant_reports: dict[str, dict[str, Any]]
) -> None:
    """A reproducer written for any case (not only a counterexample) fails exactly when the
    theorem's own check reports a violation, for the reference and for the variants."""
    theorems = [t for t in catalog() if isinstance(t, CaseProperty)]
    prefixes = {"scan": ("scan-",), "lookup": ("lookup-", "eagle-"),
                "store": ("offered-", "store-", "stores-")}[kind]
    names = ["reference", "stale-pending", "prefill-horizon", "upstream-current",
             "mtp-extra-retained"]
    checked = failed = 0
    for theorem in (t for t in theorems if t.name.startswith(prefixes)):
        every = list(theorem.space.cases())
        known = [  # the variants' own counterexamples of this kind, checked by every theorem
            theorem.space.decode(r["witness"]) for report in variant_reports.values()
            for r in report["results"]
            if r["witness"] and r["witness"]["kind"] == "exhaustive"
            and r["witness"]["theorem"].split("/")[1].startswith(prefixes)
        ]
        for case in [*every[:: max(1, len(every) // 8)], *known]:
            result = {"clause": theorem.clause, "theorem": theorem.name,
                      "verdict": "COUNTEREXAMPLE", "domain": "", "message": "",
                      "witness": theorem.witness(case)}
            report = {"version": 1, "command": "prove", "target": "reference",
                      "results": [result]}
            (test,), skipped = reproducers(report)
            assert not skipped
            for name in names:
                expected = theorem.check(case, get_implementation(name))
                got = _exec_test(test.source, name, monkeypatch)
                assert (got is None) == (expected is None), (theorem.name, name, got, expected)
                failed += got is not None
            checked += 1
    assert checked >= 10
    assert failed, "no sampled case fails on any variant: the comparison would be vacuous"


def test_boundary_classes_pin_the_upstream_window(monkeypatch: pytest.MonkeyPatch) -> None:
    tests, skipped = boundary_class_tests("reference", ["C4"], max_classes=8)
    assert {t.kind for t in tests} == {"boundary-class"}
    assert any(s.theorem == "C4/spec-scan-rightmost" for s in skipped)
    outcomes = {t.filename: _exec_test(t.source, "upstream-current", monkeypatch) for t in tests}
    assert any(message is not None for message in outcomes.values()), outcomes
    assert all(_exec_test(t.source, "reference", monkeypatch) is None for t in tests)


def test_every_property_round_trips_its_witness() -> None:
    """Any property's witness becomes a reproducer: no per-theorem template exists, so a
    new property is covered the day it enters the catalogue."""
    from kvcontract.impl.variants import REFERENCE

    for prop in catalog():
        if isinstance(prop, FormulaProperty):
            config = prop.configs()[0].values
            values = {**config, **{v: 0 for v in prop.variables}}
            assert prop.decode(prop.witness(values)) == values
        else:
            case = next(iter(prop.space.cases()))
            witness = prop.witness(case)
            assert prop.space.decode(witness) == case
            assert prop.replay(witness, REFERENCE) is None


def test_cli_output_is_deterministic(
    variant_reports: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    report.write_text(json.dumps(variant_reports["mtp-extra-retained"]))
    contents = []
    for attempt in ("first", "second"):
        out = tmp_path / attempt
        done = subprocess.run(
            [sys.executable, "-m", "kvcontract", "gen-tests", "--report", str(report),
             "--out", str(out), "--boundary-classes", "--clause", "C2", "--max-classes", "3"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, done.stderr
        contents.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert contents[0] == contents[1]
    assert "kvcontract-tests.json" in contents[0]
    assert len([n for n in contents[0] if n.startswith("test_")]) >= 4


def test_cli_errors(tmp_path: Path, variant_reports: dict[str, dict[str, Any]]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    done = subprocess.run(
        [sys.executable, "-m", "kvcontract", "gen-tests", "--report", str(bad),
         "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert "bad.json" in done.stderr and "not valid JSON" in done.stderr
    good = tmp_path / "good.json"
    good.write_text(json.dumps(variant_reports["unaligned-hit"]))
    done = subprocess.run(
        [sys.executable, "-m", "kvcontract", "gen-tests", "--report", str(good), "--impl",
         "reference", "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2 and "does not match the report's target" in done.stderr


def test_write_tests_keeps_hand_written_files(tmp_path: Path) -> None:
    mine = tmp_path / "test_mine.py"
    mine.write_text("def test_mine() -> None:\n    pass\n")
    stale = tmp_path / "test_stale.py"
    stale.write_text(MARKER + "\n")
    fresh = GeneratedTest("test_fresh.py", MARKER + "\nX = 1\n", "C2/x", "counterexample")
    write_tests([fresh], tmp_path)
    assert mine.exists() and not stale.exists() and (tmp_path / "test_fresh.py").exists()
    with pytest.raises(UsageError, match="refusing to overwrite"):
        write_tests([GeneratedTest("test_mine.py", MARKER + "\n", "C2/x", "counterexample")],
                    tmp_path)


@pytest.mark.slow
def test_slow_counterexamples_reproduce(tmp_path: Path) -> None:
    for name, ids in SLOW_THEOREMS.items():
        tests, skipped = reproducers(build_report(name, ids))
        assert tests and not skipped
        write_tests(tests, tmp_path / name)
    own = run_pytest(tmp_path, tmp_path / "runs", None)
    assert own and all(message is not None for message in own.values())
    assert all(m is None for m in run_pytest(tmp_path, tmp_path / "runs", "reference").values())
