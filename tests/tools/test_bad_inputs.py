"""Exit codes CI can trust (issue #11 item 1): a scripted sweep of bad inputs.

Every command validates its inputs before any expensive work, and every outcome maps to
one exit code: 0 pass, 1 finding, 2 usage or input error, 3 unknown or nothing checked,
4 internal error, 130 interrupted. Each bad input below must exit with its exact code,
print no traceback, and name the offending input.

The sweep runs in-process through ``click.testing.CliRunner`` (the group's ``main`` maps
errors to exit codes, as the ``kvcontract`` script does); the engines (prover, fuzzer,
audit, mutation campaign, drawing) are replaced by a guard that fails the test if a bad
input ever reaches them, so no proof runs. A few checks run the real script in a
subprocess for the real exit status, including Ctrl-C sent to a running proof.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import kvcontract.proofs.runner
from kvcontract import errors
from kvcontract.spec.clauses import clause_ids
from kvcontract.tools.cli import cli

TRACEBACK = "Traceback (most recent call last)"
ENGINE_GUARD = "engine reached: validation missed the bad input"
_REAL_PROVE = kvcontract.proofs.runner.prove
"""The prover itself (the guard below replaces it in every test)."""

# -- files the sweep reads (created once per module) ----------------------------------------
WITNESS = {"kind": "arith", "theorem": "C2/first-run-covers-load",
           "values": {"bs": 4, "bpc": 1, "N": 5, "Lb": 0, "sw": 2, "e": 1}}
"""The README's witness: unaligned-hit violates C2 there (a valid, replayable witness)."""


def _result(witness: Any = WITNESS, theorem: str = "first-run-covers-load",
            clause: str = "C2", **extra: Any) -> dict[str, Any]:
    return {"clause": clause, "theorem": theorem, "verdict": "COUNTEREXAMPLE",
            "witness": witness, "message": "the window misses a loaded chunk", **extra}


def _report(results: Any, target: str = "unaligned-hit", **extra: Any) -> dict[str, Any]:
    return {"version": 1, "command": "prove", "target": target, "results": results, **extra}


def _values(**changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = dict(WITNESS["values"])  # type: ignore[call-overload]
    for key, value in changes.items():
        if value is None:
            values.pop(key)
        else:
            values[key] = value
    return {**WITNESS, "values": values}


def _lookup_witness(**changes: Any) -> dict[str, Any]:
    """A real witness of the multi-group lookup family, with ``changes`` applied."""
    from kvcontract.spec.properties import get_property

    prop = get_property("C2/lookup-loads-only-hit")
    witness: dict[str, Any] = json.loads(json.dumps(
        prop.witness(next(iter(prop.space.cases())))))  # type: ignore[union-attr]
    for key, value in changes.items():
        if key == "eagle":
            witness["geometry"]["groups"][0]["eagle"] = value
        elif key == "state":
            witness["states"]["0"][0] = value
        else:
            witness[key] = value
    return witness


REPORTS: dict[str, Any] = {
    "good.json": _report([_result()]),
    "version2.json": {**_report([_result()]), "version": 2},
    "nocommand.json": {"version": 1, "target": "unaligned-hit", "results": []},
    "noresults.json": {"version": 1, "command": "prove", "target": "unaligned-hit"},
    "resultsdict.json": _report({"C2": "x"}),
    "toplist.json": [1, 2, 3],
    "noverdict.json": _report([{"clause": "C2", "theorem": "first-run-covers-load"}]),
    "badverdict.json": _report([_result(verdict="MAYBE")]),
    "badseconds.json": _report([_result(seconds="fast")]),
    "badexit.json": _report([_result()], exit_code=7),
    "badimpact.json": _report([_result(impact="catastrophe")]),
    "witnesslist.json": _report([_result(witness=[1, 2])]),
    "nonint.json": _report([_result(_values(bs=4.5))]),
    "strval.json": _report([_result(_values(sw="2"))]),
    "boolval.json": _report([_result(_values(e=True))]),
    "nullval.json": _report([_result(_values(N="null"))]),
    "novalues.json": _report([_result({"kind": "arith"})]),
    "valueslist.json": _report([_result({"kind": "arith", "values": [4, 1, 5]})]),
    "missingvar.json": _report([_result(_values(sw=None))]),
    "unknowntheorem.json": _report([_result(theorem="no-such-theorem")]),
    "unknownclause.json": _report([_result(clause="C99", theorem="first-run-covers-load")]),
    "outside.json": _report([_result(_values(bs=0))]),
    "negative.json": _report([_result(_values(sw=-3))]),
    "wrongkind.json": _report([_result({**WITNESS, "kind": "exhaustive"})]),
    "nokind.json": _report([_result({"values": WITNESS["values"]})]),
    "unregistered.json": _report([_result()], target="vllm 0.33.0"),
    "eagle.json": _report([_result(_lookup_witness(eagle={"x": 1}),
                                   theorem="lookup-loads-only-hit")]),
    "negativelocal.json": _report([_result(_lookup_witness(local_hit=-4),
                                           theorem="lookup-loads-only-hit")]),
    "badstate.json": _report([_result(_lookup_witness(state="SOMETIMES"),
                                      theorem="lookup-loads-only-hit")]),
    "nogeometry.json": _report([_result(_lookup_witness(geometry="FA4"),
                                        theorem="lookup-loads-only-hit")]),
    "hugecase.json": _report([_result(_lookup_witness(num_tokens=10**7),
                                      theorem="lookup-loads-only-hit")]),
    "deepwitness.json": _report([_result({**WITNESS, "note": json.loads("[" * 40 + "]" * 40)})]),
    # --geometry files (issue 9 item 2): each one bad in one way
    "geo-impossible.json": {"groups": [{"kind": "full", "block_size": 16},
                                       {"kind": "sliding_window", "block_size": 8,
                                        "sliding_window": 1}]},
    "geo-nogroups.json": {"groups": []},
    "geo-malformed.json": {"groups": [{"kind": "full"}]},
    "geo-kind.json": {"groups": [{"kind": "linear", "block_size": 16}]},
    "geo-eagle.json": {"groups": [{"kind": "full", "block_size": 16, "eagle": "yes"}]},
    "geo-emptylist.json": [],
    "geo-badentry.json": [{"groups": [{"kind": "full", "block_size": 16}]}, 5],
    "geo-emptylabel.json": {"label": "", "geometry": {"groups": [
        {"kind": "full", "block_size": 16}]}},
    "geo-extrakey.json": {"label": "x", "bpc": 4, "geometry": {"groups": [
        {"kind": "full", "block_size": 16}]}},
    "geo-huge.json": {"groups": [{"kind": "full", "block_size": 16},
                                 {"kind": "sliding_window", "block_size": 16,
                                  "sliding_window": 10**9}]},
    "geo-retention.json": {"groups": [{"kind": "full", "block_size": 16},
                                      {"kind": "sliding_window", "block_size": 16,
                                       "sliding_window": 128}], "retention_interval": 8},
    "geo-neither.json": {"name": "gpt-oss-20b"},
    # findings baselines (issue #11 item 2: --baseline-file), each bad in one way
    "baseline-version.json": {"version": 9, "kind": "kvcontract-findings-baseline",
                              "findings": []},
    "baseline-fp.json": {"version": 1, "findings": [{"fingerprint": "C4:x", "clause": "C4",
                                                     "theorem": "window-exact"}]},
    "baseline-entries.json": {"version": 1, "findings": "all of them"},
    "mod.py": "def unrelated():\n    return 1\n",
    "fuzz.json": {"version": 1, "command": "fuzz", "target": "reference", "cases": 1,
                  "per_clause": {"C3": 4},
                  "differences": [{"clause": "C3", "kind": "lookup", "message": "m",
                                   "program": ["step(4)"]}]},
}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad-inputs")
    (root / "afile").write_text("not a folder\n")
    (root / "empty").mkdir()
    (root / "notjson.json").write_text("[1, 2")
    (root / "binary.json").write_bytes(b"\xff\xfe\x00\x81")
    (root / "plain.txt").write_text("print('hello')\n")
    (root / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (root / "bigint.json").write_text('{"version": 1, "x": ' + "9" * 5000 + "}")
    for name, data in REPORTS.items():
        (root / name).write_text(json.dumps(data))
    return root


@pytest.fixture(autouse=True)
def engines_guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """No engine runs in this module unless a test replaces it on purpose."""
    import kvcontract.proofs.runner
    import kvcontract.tools.audit.command
    import kvcontract.tools.explain
    import kvcontract.tools.fuzz
    import kvcontract.tools.mutate.campaign

    def guard(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError(ENGINE_GUARD)

    monkeypatch.setattr(kvcontract.proofs.runner, "prove", guard)
    monkeypatch.setattr(kvcontract.tools.fuzz, "run_fuzz", guard)
    monkeypatch.setattr(kvcontract.tools.audit.command, "run_audit_command", guard)
    monkeypatch.setattr(kvcontract.tools.mutate.campaign, "run_campaign", guard)
    monkeypatch.setattr(kvcontract.tools.explain, "draw", guard)


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, prog_name="kvcontract", terminal_width=200)


def _no_traceback(result: Result) -> None:
    assert TRACEBACK not in result.output, result.output
    assert not isinstance(result.exception, AssertionError), result.output  # engine guard
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)


# -- the sweep -------------------------------------------------------------------------------
# (argv, exit code, substrings the output must contain: the offending input, by name).
# ``{T}`` is the sandbox folder.
Case = tuple[list[str], int, tuple[str, ...]]

GEO = ["--swa-block", "4", "--sliding-window", "8"]
"""A valid geometry for explain's flag scenarios."""

CASES: dict[str, Case] = {
    # the group
    "no-such-command": (["nosuch"], 2, ("nosuch",)),
    "no-such-global-option": (["--bogus", "list"], 2, ("--bogus",)),
    "debug-after-command": (["list", "--debug"], 2, ("--debug",)),
    "list-unknown-option": (["list", "--bogus"], 2, ("--bogus",)),
    "list-extra-argument": (["list", "extra"], 2, ("extra",)),
    # prove
    "prove-unknown-impl": (["prove", "--impl", "nope"], 2, ("'nope'", "reference")),
    "prove-empty-impl": (["prove", "--impl", ""], 2, ("unknown implementation ''",)),
    "prove-unknown-clause": (["prove", "--clause", "C99"], 2, ("'C99'", "C1, C2")),
    "prove-second-clause-unknown": (["prove", "--clause", "C2", "--clause", "X"], 2,
                                    ("'X'",)),
    "prove-empty-clause": (["prove", "--clause", ""], 2, ("unknown clause ''",)),
    "prove-system-clause": (["prove", "--clause", "C11"], 2, ("C11", "kvcontract fuzz")),
    "prove-jobs-zero": (["prove", "--jobs", "0"], 2, ("--jobs", "not 0")),
    "prove-jobs-negative": (["prove", "--jobs", "-3"], 2, ("--jobs", "not -3")),
    "prove-jobs-huge": (["prove", "--jobs", "100000"], 2, ("--jobs", "100000")),
    "prove-jobs-text": (["prove", "--jobs", "many"], 2, ("--jobs", "many")),
    "prove-jobs-float": (["prove", "--jobs", "1.5"], 2, ("--jobs", "1.5")),
    "prove-json-under-file": (["prove", "--json", "{T}/afile/r.json"], 2,
                              ("--json", "afile", "not a folder")),
    "prove-json-is-folder": (["prove", "--json", "{T}/empty"], 2, ("--json", "is a folder")),
    "prove-json-empty": (["prove", "--json", ""], 2, ("--json", "empty")),
    "prove-output-under-file": (["prove", "--output", "{T}/afile/r.sarif"], 2,
                                ("--output", "afile")),
    "prove-output-is-folder": (["prove", "--format", "json", "--output", "{T}/empty"], 2,
                               ("--output", "is a folder")),
    "prove-output-suffix": (["prove", "--output", "{T}/report.pdf"], 2,
                            ("report.pdf", "suffix")),
    "prove-two-formats-stdout": (["prove", "--format", "json", "--format", "sarif"], 2,
                                 ("--format", "--output")),
    "prove-format-output-count": (["prove", "--format", "json", "--format", "sarif",
                                   "--output", "{T}/a.json"], 2, ("2 --format", "1 --output")),
    "prove-unknown-format": (["prove", "--format", "pdf"], 2, ("--format", "pdf")),
    "prove-same-file-twice": (["prove", "--json", "{T}/r.json", "--output", "{T}/r.json"], 2,
                              ("r.json", "same file")),
    "prove-fail-on-unknown": (["prove", "--fail-on", "bogus"], 2, ("'bogus'", "--fail-on")),
    "prove-fail-on-mixed": (["prove", "--fail-on", "crash,nope"], 2, ("'nope'",)),
    "prove-extra-argument": (["prove", "C2"], 2, ("C2",)),
    # fuzz
    "fuzz-unknown-impl": (["fuzz", "--impl", "nope"], 2, ("'nope'",)),
    "fuzz-examples-negative": (["fuzz", "--examples", "-1"], 2, ("--examples", "-1")),
    "fuzz-examples-huge": (["fuzz", "--examples", "100000000"], 2,
                           ("--examples", "100000000")),
    "fuzz-examples-text": (["fuzz", "--examples", "lots"], 2, ("--examples", "lots")),
    "fuzz-seed-negative": (["fuzz", "--seed", "-1"], 2, ("--seed", "-1")),
    "fuzz-seed-huge": (["fuzz", "--seed", str(2**32)], 2, ("--seed", str(2**32))),
    "fuzz-seed-float": (["fuzz", "--seed", "0.5"], 2, ("--seed", "0.5")),
    "fuzz-unknown-device": (["fuzz", "--device", "tpu"], 2, ("--device", "tpu")),
    "fuzz-json-under-file": (["fuzz", "--json", "{T}/afile/f.json"], 2, ("--json", "afile")),
    "fuzz-output-under-file": (["fuzz", "--output", "{T}/afile/f.xml"], 2,
                               ("--output", "afile")),
    "fuzz-fail-on-unknown": (["fuzz", "--fail-on", "slow"], 2, ("'slow'",)),
    "fuzz-unknown-option": (["fuzz", "--clause", "C2"], 2, ("--clause",)),
    # gen-tests
    "gen-tests-no-out": (["gen-tests"], 2, ("--out",)),
    "gen-tests-out-under-file": (["gen-tests", "--out", "{T}/afile/tests"], 2,
                                 ("--out", "afile", "not a folder")),
    "gen-tests-out-is-file": (["gen-tests", "--out", "{T}/afile"], 2,
                              ("--out", "afile", "is a file")),
    "gen-tests-out-empty": (["gen-tests", "--out", ""], 2, ("--out", "empty")),
    "gen-tests-max-classes-zero": (["gen-tests", "--out", "{T}/g", "--boundary-classes",
                                    "--max-classes", "0"], 2, ("--max-classes", "not 0")),
    "gen-tests-max-classes-negative": (["gen-tests", "--out", "{T}/g", "--max-classes", "-2"],
                                       2, ("--max-classes", "-2")),
    "gen-tests-max-classes-huge": (["gen-tests", "--out", "{T}/g", "--max-classes",
                                    "1000000"], 2, ("--max-classes", "1000000")),
    "gen-tests-jobs-zero": (["gen-tests", "--out", "{T}/g", "--jobs", "0"], 2, ("--jobs",)),
    "gen-tests-unknown-impl": (["gen-tests", "--out", "{T}/g", "--impl", "nope"], 2,
                               ("'nope'",)),
    "gen-tests-unknown-clause": (["gen-tests", "--out", "{T}/g", "--clause", "C0"], 2,
                                 ("'C0'",)),
    "gen-tests-system-clause": (["gen-tests", "--out", "{T}/g", "--clause", "C11"], 2,
                                ("C11",)),
    "gen-tests-report-missing": (["gen-tests", "--out", "{T}/g", "--report",
                                  "{T}/missing.json"], 2, ("missing.json", "cannot read")),
    "gen-tests-report-folder": (["gen-tests", "--out", "{T}/g", "--report", "{T}/empty"], 2,
                                ("empty", "cannot read")),
    "gen-tests-report-not-json": (["gen-tests", "--out", "{T}/g", "--report",
                                   "{T}/notjson.json"], 2, ("notjson.json", "not valid JSON")),
    "gen-tests-report-binary": (["gen-tests", "--out", "{T}/g", "--report",
                                 "{T}/binary.json"], 2, ("binary.json", "UTF-8")),
    "gen-tests-report-version": (["gen-tests", "--out", "{T}/g", "--report",
                                  "{T}/version2.json"], 2, ("version2.json", "version 2")),
    "gen-tests-report-no-command": (["gen-tests", "--out", "{T}/g", "--report",
                                     "{T}/nocommand.json"], 2, ("'command'",)),
    "gen-tests-report-no-results": (["gen-tests", "--out", "{T}/g", "--report",
                                     "{T}/noresults.json"], 2, ("'results'",)),
    "gen-tests-report-results-object": (["gen-tests", "--out", "{T}/g", "--report",
                                         "{T}/resultsdict.json"], 2, ("'results'", "list")),
    "gen-tests-report-top-list": (["gen-tests", "--out", "{T}/g", "--report",
                                   "{T}/toplist.json"], 2, ("toplist.json", "JSON object")),
    "gen-tests-report-no-verdict": (["gen-tests", "--out", "{T}/g", "--report",
                                     "{T}/noverdict.json"], 2, ("results[0]", "'verdict'")),
    "gen-tests-report-bad-verdict": (["gen-tests", "--out", "{T}/g", "--report",
                                      "{T}/badverdict.json"], 2, ("'MAYBE'",)),
    "gen-tests-report-bad-seconds": (["gen-tests", "--out", "{T}/g", "--report",
                                      "{T}/badseconds.json"], 2, ("results[0].seconds",)),
    "gen-tests-report-bad-exit-code": (["gen-tests", "--out", "{T}/g", "--report",
                                        "{T}/badexit.json"], 2, ("'exit_code'", "7")),
    "gen-tests-report-bad-impact": (["gen-tests", "--out", "{T}/g", "--report",
                                     "{T}/badimpact.json"], 2, ("'catastrophe'",)),
    "gen-tests-witness-list": (["gen-tests", "--out", "{T}/g", "--report",
                                "{T}/witnesslist.json"], 2, ("results[0].witness",)),
    "gen-tests-witness-float": (["gen-tests", "--out", "{T}/g", "--report",
                                 "{T}/nonint.json"], 2,
                                ("C2/first-run-covers-load", "bs=4.5", "not an integer")),
    "gen-tests-witness-string": (["gen-tests", "--out", "{T}/g", "--report",
                                  "{T}/strval.json"], 2, ("C2/first-run-covers-load", "sw='2'")),
    "gen-tests-witness-bool": (["gen-tests", "--out", "{T}/g", "--report",
                               "{T}/boolval.json"], 2, ("C2/first-run-covers-load", "e=True")),
    "gen-tests-witness-null-text": (["gen-tests", "--out", "{T}/g", "--report",
                                     "{T}/nullval.json"], 2, ("N='null'",)),
    "gen-tests-witness-no-values": (["gen-tests", "--out", "{T}/g", "--report",
                                     "{T}/novalues.json"], 2,
                                    ("C2/first-run-covers-load", "'values'")),
    "gen-tests-witness-values-list": (["gen-tests", "--out", "{T}/g", "--report",
                                       "{T}/valueslist.json"], 2, ("'values'",)),
    "gen-tests-witness-missing-variable": (["gen-tests", "--out", "{T}/g", "--report",
                                            "{T}/missingvar.json"], 2, ("lacks sw",)),
    "gen-tests-unknown-theorem": (["gen-tests", "--out", "{T}/g", "--report",
                                   "{T}/unknowntheorem.json"], 2,
                                  ("C2/no-such-theorem", "no such theorem")),
    "gen-tests-unknown-clause-theorem": (["gen-tests", "--out", "{T}/g", "--report",
                                          "{T}/unknownclause.json"], 2,
                                         ("C99/first-run-covers-load",)),
    "gen-tests-witness-outside-domain": (["gen-tests", "--out", "{T}/g", "--report",
                                          "{T}/outside.json"], 2,
                                         ("C2/first-run-covers-load", "outside")),
    "gen-tests-witness-negative": (["gen-tests", "--out", "{T}/g", "--report",
                                    "{T}/negative.json"], 2, ("outside the theorem's domain",)),
    "gen-tests-witness-wrong-kind": (["gen-tests", "--out", "{T}/g", "--report",
                                      "{T}/wrongkind.json"], 2, ("kind 'exhaustive'",)),
    "gen-tests-witness-no-kind": (["gen-tests", "--out", "{T}/g", "--report",
                                   "{T}/nokind.json"], 2, ("kind None",)),
    "gen-tests-witness-eagle-object": (["gen-tests", "--out", "{T}/g", "--report",
                                        "{T}/eagle.json"], 2,
                                       ("C2/lookup-loads-only-hit", "eagle")),
    "gen-tests-witness-negative-local-hit": (["gen-tests", "--out", "{T}/g", "--report",
                                              "{T}/negativelocal.json"], 2,
                                             ("C2/lookup-loads-only-hit", "local_hit")),
    "gen-tests-witness-unknown-state": (["gen-tests", "--out", "{T}/g", "--report",
                                         "{T}/badstate.json"], 2,
                                        ("C2/lookup-loads-only-hit", "SOMETIMES")),
    "gen-tests-witness-geometry-text": (["gen-tests", "--out", "{T}/g", "--report",
                                         "{T}/nogeometry.json"], 2,
                                        ("C2/lookup-loads-only-hit",)),
    "gen-tests-report-deep-json": (["gen-tests", "--out", "{T}/g", "--report",
                                    "{T}/deep.json"], 2, ("deep.json", "nested too deeply")),
    "gen-tests-report-huge-integer": (["gen-tests", "--out", "{T}/g", "--report",
                                       "{T}/bigint.json"], 2, ("bigint.json", "4300 digits")),
    "gen-tests-witness-too-deep": (["gen-tests", "--out", "{T}/g", "--report",
                                    "{T}/deepwitness.json"], 2,
                                   ("C2/first-run-covers-load", "nested more than")),
    "gen-tests-witness-huge-case": (["gen-tests", "--out", "{T}/g", "--report",
                                     "{T}/hugecase.json"], 2, ("num_tokens=10000000",)),
    "gen-tests-report-unregistered-target": (["gen-tests", "--out", "{T}/g", "--report",
                                              "{T}/unregistered.json"], 2, ("'vllm 0.33.0'",)),
    "gen-tests-report-impl-mismatch": (["gen-tests", "--out", "{T}/g", "--report",
                                        "{T}/good.json", "--impl", "reference"], 2,
                                       ("--impl reference", "'unaligned-hit'")),
    # explain
    "explain-nothing": (["explain"], 2, ("--geometry", "--swa-block")),
    "explain-tokens-only": (["explain", "--tokens", "10"], 2, ("--geometry",)),
    "explain-no-tokens": (["explain", *GEO], 2, ("--tokens",)),
    "explain-negative-tokens": (["explain", *GEO, "--tokens", "-1"], 2, ("--tokens", "-1")),
    "explain-negative-hit": (["explain", *GEO, "--tokens", "16", "--hit", "-4"], 2,
                             ("--hit", "-4")),
    "explain-negative-local": (["explain", *GEO, "--tokens", "16", "--local", "-4"], 2,
                               ("--local", "-4")),
    "explain-hit-beyond-prompt": (["explain", *GEO, "--tokens", "10", "--hit", "20"], 2,
                                  ("--hit 20", "--tokens 10")),
    "explain-unaligned-local": (["explain", *GEO, "--tokens", "16", "--hit", "12", "--local",
                                 "3"], 2, ("--local 3", "multiple of 4")),
    "explain-local-above-hit": (["explain", *GEO, "--tokens", "16", "--hit", "4", "--local",
                                 "8"], 2, ("--local 8", "--hit 4")),
    "explain-local-beyond-prompt": (["explain", *GEO, "--tokens", "10", "--local", "12"], 2,
                                    ("--local 12", "--tokens 10")),
    "explain-too-many-chunks": (["explain", "--swa-block", "1", "--sliding-window", "4",
                                 "--tokens", "100000000"], 2, ("100000000 tokens", "chunks")),
    "explain-zero-swa-block": (["explain", "--swa-block", "0", "--sliding-window", "8",
                                "--tokens", "16"], 2, ("--swa-block", "not 0")),
    "explain-zero-fa-block": (["explain", *GEO, "--fa-block", "0", "--tokens", "16"], 2,
                              ("--fa-block",)),
    "explain-window-one": (["explain", "--swa-block", "4", "--sliding-window", "1",
                            "--tokens", "16"], 2, ("sliding_window=1",)),
    "explain-zero-bpc": (["explain", *GEO, "--bpc", "0", "--tokens", "16"], 2, ("--bpc",)),
    "explain-negative-e": (["explain", *GEO, "--e", "-1", "--tokens", "16"], 2, ("--e",)),
    "explain-negative-retention": (["explain", *GEO, "--retention", "-4", "--tokens", "16"],
                                   2, ("--retention",)),
    "explain-unaligned-retention": (["explain", *GEO, "--retention", "3", "--tokens", "16"],
                                    2, ("retention_interval=3",)),
    "explain-states-syntax": (["explain", *GEO, "--tokens", "16", "--states", "HHM"], 2,
                              ("'HHM'", "GROUP=LETTERS")),
    "explain-states-letters": (["explain", *GEO, "--tokens", "16", "--states", "0=HHXZ"], 2,
                               ("'0=HHXZ'", "'X'")),
    "explain-states-group-range": (["explain", *GEO, "--tokens", "16", "--states", "5=HH"], 2,
                                   ("--states 5", "1 groups")),
    "explain-states-negative-group": (["explain", *GEO, "--tokens", "16", "--states",
                                       "-1=HH"], 2, ("'-1=HH'",)),
    "explain-states-twice": (["explain", *GEO, "--tokens", "16", "--states", "0=H",
                              "--states", "0=M"], 2, ("'0=M'", "twice")),
    "explain-geometry-groups-int": (["explain", "--geometry", '{"groups": 3}', "--tokens",
                                     "16"], 2, ("geometry",)),
    "explain-geometry-no-groups": (["explain", "--geometry", '{"groups": []}', "--tokens",
                                    "16"], 2, ("at least one",)),
    "explain-geometry-bad-json": (["explain", "--geometry", '{"groups": [', "--tokens", "16"],
                                  2, ("--geometry", "not valid JSON")),
    "explain-geometry-missing-file": (["explain", "--geometry", "{T}/missing.json",
                                       "--tokens", "16"], 2, ("missing.json",)),
    "explain-geometry-list": (["explain", "--geometry", "{T}/toplist.json", "--tokens",
                               "16"], 2, ("toplist.json", "'groups'")),
    "explain-geometry-unknown-kind": (["explain", "--geometry",
                                       '{"groups": [{"kind": "nope", "block_size": 4}]}',
                                       "--tokens", "16"], 2, ("kind='nope'",)),
    "explain-geometry-eagle-text": (["explain", "--geometry",
                                     '{"groups": [{"kind": "full", "block_size": 4, '
                                     '"eagle": "yes"}]}', "--tokens", "16"], 2,
                                    ("eagle", "'yes'")),
    "explain-geometry-and-flags": (["explain", "--geometry",
                                    '{"groups": [{"kind": "full", "block_size": 4}]}',
                                    "--swa-block", "4", "--tokens", "16"], 2,
                                   ("--swa-block", "--geometry")),
    "explain-png-under-file": (["explain", *GEO, "--tokens", "16", "--png",
                                "{T}/afile/x.png"], 2, ("--png", "afile")),
    "explain-png-suffix": (["explain", *GEO, "--tokens", "16", "--png", "{T}/x.svg"], 2,
                           ("--png", "x.svg", ".png")),
    "explain-svg-suffix": (["explain", *GEO, "--tokens", "16", "--svg", "{T}/x.pdf"], 2,
                           ("--svg", "x.pdf", ".svg")),
    "explain-png-is-folder": (["explain", *GEO, "--tokens", "16", "--png", "{T}/empty"], 2,
                              ("--png", "is a folder")),
    "explain-out-is-file": (["explain", *GEO, "--tokens", "16", "--out", "{T}/afile"], 2,
                            ("--out", "afile")),
    "explain-theorem-without-report": (["explain", "--theorem", "C2/x", *GEO, "--tokens",
                                        "16"], 2, ("--theorem", "only with --report")),
    "explain-all-without-report": (["explain", "--all"], 2, ("--all", "--report")),
    "explain-impl-without-report": (["explain", "--impl", "reference", *GEO, "--tokens", "16"],
                                    2, ("--impl", "--report")),
    "explain-report-and-geometry": (["explain", "--report", "{T}/good.json", "--tokens",
                                     "16"], 2, ("--tokens", "--report")),
    "explain-report-missing": (["explain", "--report", "{T}/missing.json"], 2,
                               ("missing.json",)),
    "explain-report-not-json": (["explain", "--report", "{T}/notjson.json"], 2,
                                ("notjson.json", "not valid JSON")),
    "explain-report-no-such-result": (["explain", "--report", "{T}/good.json", "--theorem",
                                       "C2/no-such"], 2, ("'C2/no-such'",)),
    "explain-report-unknown-impl": (["explain", "--report", "{T}/good.json", "--impl",
                                     "nope"], 2, ("'nope'",)),
    "explain-report-unregistered-target": (["explain", "--report", "{T}/unregistered.json"],
                                           2, ("'vllm 0.33.0'", "--impl")),
    "explain-witness-float": (["explain", "--report", "{T}/nonint.json"], 2,
                              ("C2/first-run-covers-load", "bs=4.5")),
    "explain-witness-no-values": (["explain", "--report", "{T}/novalues.json"], 2,
                                  ("C2/first-run-covers-load", "'values'")),
    "explain-unknown-theorem": (["explain", "--report", "{T}/unknowntheorem.json"], 2,
                                ("C2/no-such-theorem",)),
    "explain-witness-outside-domain": (["explain", "--report", "{T}/outside.json"], 2,
                                       ("C2/first-run-covers-load", "outside")),
    "explain-witness-eagle-object": (["explain", "--report", "{T}/eagle.json"], 2,
                                     ("C2/lookup-loads-only-hit", "eagle")),
    "explain-witness-unknown-state": (["explain", "--report", "{T}/badstate.json"], 2,
                                      ("SOMETIMES",)),
    "explain-witness-huge-case": (["explain", "--report", "{T}/hugecase.json"], 2,
                                  ("C2/lookup-loads-only-hit", "num_tokens=10000000")),
    "explain-report-deep-json": (["explain", "--report", "{T}/deep.json"], 2,
                                 ("deep.json", "nested too deeply")),
    "explain-geometry-deep-json": (["explain", "--geometry", "{T}/deep.json", "--tokens",
                                    "16"], 2, ("deep.json", "nested too deeply")),
    "explain-geometry-huge-integer": (["explain", "--geometry", "{T}/bigint.json", "--tokens",
                                       "16"], 2, ("bigint.json", "4300 digits")),
    "explain-fuzz-program": (["explain", "--report", "{T}/fuzz.json"], 2,
                             ("C3/fuzz-lookup", "no token-axis picture")),
    # audit
    "audit-no-target": (["audit"], 2, ("--target",)),
    "audit-unknown-target": (["audit", "--target", "nope"], 2, ("'nope'", "vllm:PATH")),
    "audit-empty-target": (["audit", "--target", ""], 2, ("unknown implementation ''",)),
    "audit-vllm-no-path": (["audit", "--target", "vllm:"], 2, ("'vllm:'",)),
    "audit-vllm-missing": (["audit", "--target", "vllm:{T}/missing"], 2,
                           ("missing", "no such file")),
    "audit-vllm-file": (["audit", "--target", "vllm:{T}/afile"], 2,
                        ("afile", "must be a folder")),
    "audit-vllm-empty": (["audit", "--target", "vllm:{T}/empty"], 2,
                         ("empty", "no vLLM offloading sources")),
    "audit-module-missing": (["audit", "--target", "module:{T}/missing.py"], 2,
                             ("missing.py", "no such file")),
    "audit-module-not-python": (["audit", "--target", "module:{T}/plain.txt"], 2,
                                ("plain.txt", ".py")),
    "audit-module-folder": (["audit", "--target", "module:{T}/empty"], 2,
                            ("empty", "a folder")),
    "audit-unknown-builtin": (["audit", "--target", "builtin:nope"], 2, ("'nope'",)),
    "audit-unknown-baseline": (["audit", "--target", "reference", "--baseline", "nope"], 2,
                               ("'nope'",)),
    "audit-unknown-clause": (["audit", "--target", "reference", "--clause", "C99"], 2,
                             ("'C99'",)),
    "audit-timeout-zero": (["audit", "--target", "reference", "--timeout", "0"], 2,
                           ("--timeout", "not 0")),
    "audit-timeout-negative": (["audit", "--target", "reference", "--timeout", "-1"], 2,
                               ("--timeout", "-1")),
    "audit-timeout-nan": (["audit", "--target", "reference", "--timeout", "nan"], 2,
                          ("--timeout", "nan")),
    "audit-timeout-inf": (["audit", "--target", "reference", "--timeout", "inf"], 2,
                          ("--timeout", "inf")),
    "audit-timeout-minus-inf": (["audit", "--target", "reference", "--timeout", "-inf"], 2,
                                ("--timeout", "-inf")),
    "audit-timeout-tiny": (["audit", "--target", "reference", "--timeout", "1e-9"], 2,
                           ("--timeout", "1e-09")),
    "audit-timeout-long": (["audit", "--target", "reference", "--timeout", "1801"], 2,
                           ("--timeout", "1801")),
    "audit-timeout-text": (["audit", "--target", "reference", "--timeout", "soon"], 2,
                           ("--timeout", "soon")),
    "audit-budget-zero": (["audit", "--target", "reference", "--budget", "0"], 2,
                          ("--budget", "positive number of cases", "not 0")),
    "audit-budget-negative": (["audit", "--target", "reference", "--budget", "-5"], 2,
                              ("--budget", "-5")),
    "audit-budget-float": (["audit", "--target", "reference", "--budget", "1.5"], 2,
                           ("--budget", "1.5")),
    "audit-jobs-zero": (["audit", "--target", "reference", "--jobs", "0"], 2, ("--jobs",)),
    "audit-jobs-huge": (["audit", "--target", "reference", "--jobs", "5000"], 2,
                        ("--jobs", "5000")),
    "audit-json-under-file": (["audit", "--target", "reference", "--json", "{T}/afile/a.json"],
                              2, ("--json", "afile")),
    "audit-output-under-file": (["audit", "--target", "reference", "--output",
                                 "{T}/afile/a.sarif"], 2, ("--output", "afile")),
    "audit-reproducers-is-file": (["audit", "--target", "reference", "--reproducers",
                                   "{T}/afile"], 2, ("--reproducers", "afile")),
    "audit-pictures-under-file": (["audit", "--target", "reference", "--pictures",
                                   "{T}/afile/pictures"], 2, ("--pictures", "afile")),
    "audit-fail-on-unknown": (["audit", "--target", "reference", "--fail-on", "doom"], 2,
                              ("'doom'",)),
    # mutate
    "mutate-unknown-impl": (["mutate", "--impl", "nope"], 2, ("nope",)),
    "mutate-module-missing": (["mutate", "--impl", "module:{T}/missing.py"], 2,
                              ("missing.py",)),
    "mutate-sample-zero": (["mutate", "--sample", "0"], 2, ("--sample", "not 0")),
    "mutate-sample-negative": (["mutate", "--sample", "-1"], 2, ("--sample", "-1")),
    "mutate-seed-negative": (["mutate", "--seed", "-1"], 2, ("--seed", "-1")),
    "mutate-seed-huge": (["mutate", "--seed", str(2**40)], 2, ("--seed", str(2**40))),
    "mutate-jobs-zero": (["mutate", "--jobs", "0"], 2, ("--jobs", "not 0")),
    "mutate-jobs-huge": (["mutate", "--jobs", "100000"], 2, ("--jobs", "100000")),
    "mutate-fail-under-high": (["mutate", "--fail-under", "101"], 2, ("--fail-under", "101")),
    "mutate-fail-under-negative": (["mutate", "--fail-under", "-1"], 2, ("--fail-under",)),
    "mutate-fail-under-nan": (["mutate", "--fail-under", "nan"], 2, ("--fail-under", "nan")),
    "mutate-safety-timeout-zero": (["mutate", "--safety-timeout", "0"], 2,
                                   ("--safety-timeout", "not 0")),
    "mutate-safety-timeout-nan": (["mutate", "--safety-timeout", "nan"], 2,
                                  ("--safety-timeout", "nan")),
    "mutate-safety-timeout-inf": (["mutate", "--safety-timeout", "inf"], 2,
                                  ("--safety-timeout", "inf")),
    "mutate-safety-timeout-huge": (["mutate", "--safety-timeout", "1e12"], 2,
                                   ("--safety-timeout", "1e+12")),
    "mutate-json-under-file": (["mutate", "--json", "{T}/afile/m.json"], 2,
                               ("--json", "afile")),
    "mutate-unknown-function": (["mutate", "--function", "no_such_function"], 2,
                                ("no_such_function",)),
    # --model / --geometry / --bpc / --retention (prove, fuzz, audit; issue 9 item 2)
    "prove-model-unknown": (["prove", "--model", "nope"], 2,
                            ("--model 'nope'", "gpt-oss-20b", "list --models")),
    "prove-model-empty": (["prove", "--model", ""], 2, ("--model ''",)),
    "prove-model-second-unknown": (["prove", "--model", "gpt-oss-20b", "--model", "gpt-5"],
                                   2, ("'gpt-5'",)),
    "prove-bpc-without-model": (["prove", "--bpc", "4"], 2, ("--bpc", "--model")),
    "prove-retention-without-model": (["prove", "--retention", "none"], 2,
                                      ("--retention", "--model")),
    "prove-bpc-zero": (["prove", "--model", "gpt-oss-20b", "--bpc", "0"], 2,
                       ("--bpc", "not 0")),
    "prove-bpc-huge": (["prove", "--model", "gpt-oss-20b", "--bpc", "100000"], 2,
                       ("--bpc", "100000")),
    "prove-bpc-text": (["prove", "--model", "gpt-oss-20b", "--bpc", "many"], 2,
                       ("--bpc", "many")),
    "prove-retention-word": (["prove", "--model", "gpt-oss-20b", "--retention", "often"], 2,
                             ("--retention 'often'", "none")),
    "prove-retention-negative": (["prove", "--model", "gpt-oss-20b", "--retention", "-16"],
                                 2, ("--retention '-16'",)),
    "prove-retention-rejected": (["prove", "--model", "gpt-oss-20b", "--retention", "8"], 2,
                                 ("--model gpt-oss-20b --bpc 1 --retention 8",
                                  "retention_interval", "choose another --retention")),
    "prove-retention-rejected-bpc": (["prove", "--model", "command-r7b", "--bpc", "4",
                                      "--retention", "32"], 2,
                                     ("--bpc 4 --retention 32", "multiple")),
    "prove-geometry-missing": (["prove", "--geometry", "{T}/missing.json"], 2,
                               ("missing.json", "cannot read")),
    "prove-geometry-folder": (["prove", "--geometry", "{T}/empty"], 2,
                              ("empty", "cannot read")),
    "prove-geometry-empty-name": (["prove", "--geometry", ""], 2, ("--geometry", "empty")),
    "prove-geometry-not-json": (["prove", "--geometry", "{T}/notjson.json"], 2,
                                ("notjson.json", "not valid JSON")),
    "prove-geometry-binary": (["prove", "--geometry", "{T}/binary.json"], 2,
                              ("binary.json", "UTF-8")),
    "prove-geometry-deep": (["prove", "--geometry", "{T}/deep.json"], 2,
                            ("deep.json", "not a geometry")),
    "prove-geometry-impossible": (["prove", "--geometry", "{T}/geo-impossible.json"], 2,
                                  ("geo-impossible.json", "sliding_window=1", ">= 2")),
    "prove-geometry-no-groups": (["prove", "--geometry", "{T}/geo-nogroups.json"], 2,
                                 ("geo-nogroups.json", "at least one KV-cache group")),
    "prove-geometry-malformed": (["prove", "--geometry", "{T}/geo-malformed.json"], 2,
                                 ("geo-malformed.json", "malformed")),
    "prove-geometry-kind": (["prove", "--geometry", "{T}/geo-kind.json"], 2,
                            ("geo-kind.json", "'linear'")),
    "prove-geometry-eagle": (["prove", "--geometry", "{T}/geo-eagle.json"], 2,
                             ("geo-eagle.json", "eagle", "'yes'")),
    "prove-geometry-empty-list": (["prove", "--geometry", "{T}/geo-emptylist.json"], 2,
                                  ("geo-emptylist.json", "no geometry")),
    "prove-geometry-bad-entry": (["prove", "--geometry", "{T}/geo-badentry.json"], 2,
                                 ("geo-badentry.json", "entry 1")),
    "prove-geometry-empty-label": (["prove", "--geometry", "{T}/geo-emptylabel.json"], 2,
                                   ("geo-emptylabel.json", "'label'")),
    "prove-geometry-extra-key": (["prove", "--geometry", "{T}/geo-extrakey.json"], 2,
                                 ("geo-extrakey.json", "unknown keys", "'bpc'")),
    "prove-geometry-huge": (["prove", "--geometry", "{T}/geo-huge.json"], 2,
                            ("geo-huge.json", "sliding_window=1000000000", "beyond")),
    "prove-geometry-retention": (["prove", "--geometry", "{T}/geo-retention.json"], 2,
                                 ("geo-retention.json", "retention_interval=8")),
    "prove-geometry-neither": (["prove", "--geometry", "{T}/geo-neither.json"], 2,
                               ("geo-neither.json", "'groups'")),
    "prove-geometry-report": (["prove", "--geometry", "{T}/good.json"], 2,
                              ("good.json", "'groups'")),
    "fuzz-model-unknown": (["fuzz", "--model", "nope"], 2, ("--model 'nope'",)),
    "fuzz-model-matrix": (["fuzz", "--model", "gpt-oss-20b", "--bpc", "1", "--matrix"], 2,
                          ("--matrix", "--model")),
    "fuzz-geometry-impossible": (["fuzz", "--geometry", "{T}/geo-impossible.json"], 2,
                                 ("geo-impossible.json",)),
    "fuzz-bpc-without-model": (["fuzz", "--bpc", "2"], 2, ("--bpc", "--model")),
    "audit-model-unknown": (["audit", "--target", "reference", "--model", "nope"], 2,
                            ("--model 'nope'",)),
    "audit-geometry-malformed": (["audit", "--target", "reference", "--geometry",
                                  "{T}/geo-malformed.json"], 2, ("geo-malformed.json",)),
    "audit-retention-rejected": (["audit", "--target", "reference", "--model",
                                  "gpt-oss-20b", "--retention", "24"], 2,
                                 ("--retention 24",)),
    # the pull-request gate (issue #11 item 2): baselines, --fail-on new, git:REF
    "prove-fail-on-new-alone": (["prove", "--fail-on", "new"], 2,
                                ("--fail-on new", "--baseline-file", "--write-baseline")),
    "prove-fail-on-new-unknown": (["prove", "--fail-on", "new,doom"], 2, ("'doom'",)),
    "prove-baseline-file-missing": (["prove", "--baseline-file", "{T}/missing.json"], 2,
                                    ("missing.json", "no such file")),
    "prove-baseline-file-folder": (["prove", "--baseline-file", "{T}/empty"], 2,
                                   ("empty", "a folder")),
    "prove-baseline-file-empty-name": (["prove", "--baseline-file", ""], 2,
                                       ("--baseline-file", "empty string")),
    "prove-baseline-file-not-json": (["prove", "--baseline-file", "{T}/notjson.json"], 2,
                                     ("notjson.json", "not valid JSON")),
    "prove-baseline-file-binary": (["prove", "--baseline-file", "{T}/binary.json"], 2,
                                   ("binary.json", "UTF-8")),
    "prove-baseline-file-is-report": (["prove", "--baseline-file", "{T}/good.json"], 2,
                                      ("good.json", "not a findings baseline")),
    "prove-baseline-file-version": (["prove", "--baseline-file",
                                     "{T}/baseline-version.json"], 2,
                                    ("baseline-version.json", "version 9")),
    "prove-baseline-file-entries": (["prove", "--baseline-file",
                                     "{T}/baseline-entries.json"], 2,
                                    ("baseline-entries.json", "'findings' must be a list")),
    "prove-write-baseline-under-file": (["prove", "--write-baseline", "{T}/afile/b.json"], 2,
                                        ("--write-baseline", "afile")),
    "prove-write-baseline-is-json": (["prove", "--write-baseline", "{T}/w.json", "--json",
                                      "{T}/w.json"], 2, ("w.json", "same file")),
    "prove-output-dash-twice": (["prove", "--format", "json", "--output", "-", "--format",
                                 "github", "--output", "-"], 2, ("--output -", "twice")),
    "fuzz-fail-on-new": (["fuzz", "--fail-on", "new"], 2, ("--fail-on new", "prove")),
    "audit-baseline-file-fingerprint": (["audit", "--target", "reference", "--baseline-file",
                                         "{T}/baseline-fp.json"], 2,
                                        ("baseline-fp.json", "findings[0].fingerprint")),
    "audit-fail-on-new-alone": (["audit", "--target", "reference", "--fail-on", "new"], 2,
                                ("--fail-on new",)),
    "audit-write-baseline-is-folder": (["audit", "--target", "reference", "--write-baseline",
                                        "{T}/empty"], 2, ("--write-baseline", "is a folder")),
    "audit-git-no-revision": (["audit", "--target", "module:{T}/mod.py", "--baseline",
                               "git:"], 2, ("git:REF needs a revision",)),
    "audit-git-option-revision": (["audit", "--target", "module:{T}/mod.py", "--baseline",
                                   "git:-x"], 2, ("git:-x", "not a revision")),
    "audit-git-builtin-target": (["audit", "--target", "reference", "--baseline",
                                  "git:HEAD"], 2, ("git:REF needs --target vllm:PATH",)),
    "audit-git-outside-repository": (["audit", "--target", "module:{T}/mod.py", "--baseline",
                                      "git:HEAD"], 2, ("not inside a git repository",)),
}


def _expand(args: list[str], root: Path) -> list[str]:
    return [a.replace("{T}", str(root)) for a in args]


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name: str, sandbox: Path) -> None:
    argv, code, needles = CASES[name]
    result = invoke(_expand(argv, sandbox))
    _no_traceback(result)
    assert result.exit_code == code, result.output
    for needle in needles:
        assert needle.replace("{T}", str(sandbox)) in result.output, (needle, result.output)
    if code == 2 and not any(s in result.output for s in ("Usage:", "Error:")):
        # kvcontract's own errors: one line, the documented prefix
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("kvcontract: error: "), result.output


def test_the_sweep_is_large() -> None:
    assert len(CASES) >= 100
    commands = {argv[0] for argv, _, _ in CASES.values()}
    assert commands >= {"prove", "fuzz", "gen-tests", "explain", "audit", "mutate", "list"}


def test_cuda_without_a_device() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("validation passes with a device")
    result = invoke(["fuzz", "--device", "cuda"])
    _no_traceback(result)
    assert result.exit_code == 2 and "--device cuda" in result.output


def test_nothing_is_written_before_validation(sandbox: Path) -> None:
    """A rejected command leaves no folder behind (the checks only look)."""
    target = sandbox / "new" / "deeper"
    result = invoke(["gen-tests", "--out", str(target), "--max-classes", "0"])
    assert result.exit_code == 2
    assert not (sandbox / "new").exists()


# -- internal errors, interruptions, --debug -------------------------------------------------
def _fail_with(exc: BaseException) -> Any:
    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise exc
    return fail


@pytest.fixture
def engine_raises(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``engine_raises(command, exc)``: the engine behind ``command`` raises ``exc``;
    returns the argv that reaches it."""
    import kvcontract.proofs.runner
    import kvcontract.tools.audit.command
    import kvcontract.tools.explain
    import kvcontract.tools.fuzz
    import kvcontract.tools.mutate.campaign

    def arm(command: str, exc: BaseException, tmp: Path) -> list[str]:
        fail = _fail_with(exc)
        if command == "prove":
            monkeypatch.setattr(kvcontract.proofs.runner, "prove", fail)
            return ["prove", "--clause", "C2", "--quiet"]
        if command == "gen-tests":
            monkeypatch.setattr(kvcontract.proofs.runner, "prove", fail)
            return ["gen-tests", "--out", str(tmp / "generated")]
        if command == "fuzz":
            monkeypatch.setattr(kvcontract.tools.fuzz, "run_fuzz", fail)
            return ["fuzz", "--examples", "0"]
        if command == "audit":
            monkeypatch.setattr(kvcontract.tools.audit.command, "run_audit_command", fail)
            return ["audit", "--target", "reference", "--clause", "C3", "--quiet"]
        if command == "mutate":
            monkeypatch.setattr(kvcontract.tools.mutate.campaign, "run_campaign", fail)
            return ["mutate", "--sample", "1", "--quiet"]
        if command == "explain":
            monkeypatch.setattr(kvcontract.tools.explain, "build_scene", fail)
            return ["explain", *GEO, "--tokens", "16"]
        raise AssertionError(command)

    yield arm


ENGINE_COMMANDS = ["prove", "gen-tests", "fuzz", "audit", "mutate", "explain"]

BROKEN = BrokenProcessPool("A process in the process pool was terminated abruptly while "
                           "the future was running or pending.")


def _internal_line(result: Result, type_name: str) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"kvcontract: internal error: {type_name}: "), lines[0]
    assert lines[0].endswith("(run with --debug for the traceback)"), lines[0]
    return lines[0]


@pytest.mark.parametrize("command", ENGINE_COMMANDS)
def test_killed_worker_is_an_internal_error(command: str, engine_raises: Any,
                                            tmp_path: Path) -> None:
    result = invoke(engine_raises(command, BROKEN, tmp_path))
    _no_traceback(result)
    assert result.exit_code == 4
    assert "terminated abruptly" in _internal_line(result, "BrokenProcessPool")


@pytest.mark.parametrize("command", ENGINE_COMMANDS)
def test_keyboard_interrupt_exits_130(command: str, engine_raises: Any,
                                      tmp_path: Path) -> None:
    result = invoke(engine_raises(command, KeyboardInterrupt(), tmp_path))
    _no_traceback(result)
    assert result.exit_code == 130
    assert result.output == "kvcontract: interrupted\n"


@pytest.mark.parametrize(("exc", "type_name"), [
    (pickle.PicklingError("Can't pickle <function <lambda>>: attribute lookup failed"),
     "PicklingError"),
    (ZeroDivisionError("integer division or modulo by zero"), "ZeroDivisionError"),
    (RuntimeError("first line\nsecond line"), "RuntimeError"),
    (MemoryError(), "MemoryError"),
])
def test_unexpected_exceptions_are_one_line(exc: BaseException, type_name: str,
                                            engine_raises: Any, tmp_path: Path) -> None:
    result = invoke(engine_raises("fuzz", exc, tmp_path))
    _no_traceback(result)
    assert result.exit_code == 4
    line = _internal_line(result, type_name) if str(exc) else result.output.strip()
    assert line.startswith(f"kvcontract: internal error: {type_name}")


def test_debug_prints_the_traceback(engine_raises: Any, tmp_path: Path) -> None:
    argv = engine_raises("prove", BROKEN, tmp_path)
    result = invoke(["--debug", *argv])
    assert result.exit_code == 4
    assert TRACEBACK in result.output and "BrokenProcessPool" in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("kvcontract: internal error: BrokenProcessPool: ")
    assert "--debug" not in last


def test_debug_from_the_environment(engine_raises: Any, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVCONTRACT_DEBUG", "1")
    result = invoke(engine_raises("audit", ZeroDivisionError("x"), tmp_path))
    assert result.exit_code == 4 and TRACEBACK in result.output


def test_debug_shows_the_traceback_of_input_errors_too() -> None:
    result = invoke(["--debug", "prove", "--clause", "C99"])
    assert result.exit_code == 2 and TRACEBACK in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("kvcontract: error: unknown clause 'C99'")


def test_campaign_failure_is_internal(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvcontract.tools.mutate.campaign as campaign

    monkeypatch.setattr(campaign, "run_campaign", _fail_with(
        campaign.CampaignError("the unmutated target reference does not run: boom")))
    result = invoke(["mutate", "--sample", "1", "--quiet"])
    _no_traceback(result)
    assert result.exit_code == 4
    assert "does not run: boom" in _internal_line(result, "CampaignError")


@pytest.mark.skipif(os.name != "posix", reason="the prover forks its workers on POSIX only")
def test_real_killed_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prover worker that dies (a real fork pool, no mock of the executor): exit 4."""
    runner = kvcontract.proofs.runner
    monkeypatch.setattr(runner, "prove", _REAL_PROVE)
    monkeypatch.setattr(runner, "_run_task", _die)
    result = invoke(["prove", "--clause", "C1", "--jobs", "2", "--quiet"])
    _no_traceback(result)
    assert result.exit_code == 4
    _internal_line(result, "BrokenProcessPool")


def _die(task: Any) -> Any:
    os._exit(9)  # a worker killed (OOM killer, segfault in Z3)


# -- the other exit codes, through fake engine results ----------------------------------------
@pytest.mark.parametrize(("verdict", "code"), [
    ("PROVED", 0), ("COUNTEREXAMPLE", 1), ("UNKNOWN", 3), ("VACUOUS", 3),
])
def test_verdict_exit_codes(verdict: str, code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvcontract.proofs.runner as runner
    from kvcontract.proofs.verdicts import TheoremResult, Verdict

    def fake(impl_name: str, *_args: Any, **kwargs: Any) -> Any:
        result = TheoremResult("C2", "first-run-covers-load", Verdict(verdict), "all", 0.1,
                               impact="lost-hit" if verdict == "COUNTEREXAMPLE" else None)
        return runner.ProveReport(impl_name, [result], 0.1, ["C2"],
                                  fail_on=kwargs["fail_on"])

    monkeypatch.setattr(runner, "prove", fake)
    result = invoke(["prove", "--clause", "C2", "--quiet"])
    _no_traceback(result)
    assert result.exit_code == code, result.output


def test_help_version_and_list_exit_0() -> None:
    for argv in (["--help"], ["--version"], ["prove", "--help"], ["list"]):
        result = invoke(argv)
        _no_traceback(result)
        assert result.exit_code == 0, (argv, result.output)


ERRORS: list[Exception] = [
    errors.KvContractError("a problem"),
    errors.UsageError("--jobs must be at least 1"),
    errors.UnknownClauseError("C42", ["C1", "C2"]),
    errors.UnknownTargetError("nope", ["reference"]),
    errors.UnknownPropertyError("no property 'C2/x'"),
    errors.GeometryError("block_size", 0, "must be >= 1"),
    errors.InputFileError("r.json", "not valid JSON"),
    errors.WitnessError("C2/x: the witness lacks sw"),
    errors.ProofError("the prover could not run C2/x"),
]

UNDECIDED: list[Exception] = [
    errors.EngineUnavailableError("--judge engine: vLLM's engine cannot judge vllm:x: no "
                                  "vllm package is installed in this Python"),
]
"""Errors that leave the question open rather than reject the input: exit 3."""


def test_every_error_class_is_covered() -> None:
    defined = {v for v in vars(errors).values()
               if isinstance(v, type) and issubclass(v, errors.KvContractError)}
    assert defined == {type(e) for e in ERRORS + UNDECIDED}


@pytest.mark.parametrize(("error", "code"), [*((e, 2) for e in ERRORS),
                                            *((e, 3) for e in UNDECIDED)],
                         ids=[type(e).__name__ for e in ERRORS + UNDECIDED])
def test_kvcontract_errors_exit_2_or_3(error: Exception, code: int, engine_raises: Any,
                                       tmp_path: Path) -> None:
    """An input error exits 2; one that leaves the question open exits 3."""
    result = invoke(engine_raises("audit", error, tmp_path))
    _no_traceback(result)
    assert result.exit_code == code
    assert result.output == f"kvcontract: error: {error}\n"


# -- the real script (subprocess): real exit statuses ------------------------------------------
def _script(*args: str, env: dict[str, str] | None = None,
            code: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "kvcontract"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_script_usage_and_input_errors(sandbox: Path) -> None:
    done = _script("prove", "--clause", "C99")
    assert done.returncode == 2 and TRACEBACK not in done.stderr
    assert done.stderr == ("kvcontract: error: unknown clause 'C99'; known clauses: "
                           + ", ".join(clause_ids()) + "\n")
    done = _script("explain", "--report", str(sandbox / "nonint.json"))
    assert done.returncode == 2 and "bs=4.5" in done.stderr and TRACEBACK not in done.stderr
    done = _script("audit", "--target", "reference", "--timeout", "nan")
    assert done.returncode == 2 and "--timeout" in done.stderr
    done = _script("nosuch")
    assert done.returncode == 2 and "nosuch" in done.stderr


INTERNAL = """
import sys
from concurrent.futures.process import BrokenProcessPool
import kvcontract.proofs.runner as runner
def prove(*args, **kwargs):
    raise BrokenProcessPool("A child process terminated abruptly")
runner.prove = prove
from kvcontract.tools.cli import main
main(sys.argv[1:])
"""


def test_script_internal_error_and_debug() -> None:
    done = _script("prove", "--quiet", code=INTERNAL)
    assert done.returncode == 4, done.stderr
    assert done.stderr == ("kvcontract: internal error: BrokenProcessPool: A child process "
                           "terminated abruptly (run with --debug for the traceback)\n")
    done = _script("--debug", "prove", "--quiet", code=INTERNAL)
    assert done.returncode == 4
    assert TRACEBACK in done.stderr and ", in prove\n" in done.stderr
    assert done.stderr.endswith("kvcontract: internal error: BrokenProcessPool: A child "
                                "process terminated abruptly\n")


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_ctrl_c_during_a_proof_exits_130() -> None:
    """Ctrl-C reaches the whole process group (the CLI and its prover workers): the
    workers die quietly, the CLI prints one line and exits 130."""
    # --no-cache: a warm proof cache (CI's venv check proves first) ends the run before
    # the interrupt arrives.
    proc = subprocess.Popen([sys.executable, "-m", "kvcontract", "prove", "--jobs", "2",
                             "--no-cache"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not _children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _children(proc.pid), "the prover started no worker"
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert err == "kvcontract: interrupted\n", err
    assert TRACEBACK not in out
