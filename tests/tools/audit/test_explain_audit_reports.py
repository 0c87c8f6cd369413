"""``kvcontract explain`` on real audit reports: every defect and every counterexample
row draws, or says in one line why it cannot (exit 2 or 3), never an internal error.

Two reports: a built-in variant's (replayed on the variant), and vLLM
0.33.0's C9 and C12 (upstream's own store path, whose theorems once ended explain in
``internal error: MissingRole: store_final_segment_end``: the binding has no store
horizon, upstream computes it inside ``_build_store_jobs``), plus a system scenario's
row, which has no token-axis picture. The work is bounded by ``--budget`` cases.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from audit_releases import release_tree

from kvcontract.tools.audit.binding import bind
from kvcontract.tools.audit.engine import AuditOptions, run_audit
from kvcontract.tools.audit.report import build_report
from kvcontract.tools.audit.targets import resolve_target
from kvcontract.tools.cli import main
from kvcontract.vocabulary import EXIT_INTERNAL, EXIT_OK, EXIT_UNKNOWN, EXIT_USAGE


def _explain(capsys: pytest.CaptureFixture[str], *argv: str,
             quiet: bool = True) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(["explain", *argv, *(["--quiet"] if quiet else [])])
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out + captured.err


def _every_drawing(report: Path) -> Iterator[tuple[str, list[str]]]:
    """Every defect's and every counterexample row's explain arguments."""
    data = json.loads(report.read_text())
    for defect in data.get("defects") or []:
        yield f"defect {defect['id']}", ["--report", str(report), "--defect", defect["id"]]
    for row in data["results"]:
        if row["verdict"] == "COUNTEREXAMPLE":
            theorem = f"{row['clause']}/{row['theorem']}"
            yield theorem, ["--report", str(report), "--theorem", theorem]


def _explain_all(report: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, int]:
    codes = {}
    for name, argv in _every_drawing(report):
        code, output = _explain(capsys, *argv)
        assert code != EXIT_INTERNAL, (name, output)
        assert code in (EXIT_OK, EXIT_USAGE, EXIT_UNKNOWN), (name, code, output)
        if code != EXIT_OK:
            # Why not, in one line.
            assert len([line for line in output.splitlines() if line.strip()]) == 1, output
        codes[name] = code
    return codes


def _audit_report(target: str, clauses: list[str], budget: int, path: Path) -> dict[str, Any]:
    """The audit's JSON report, on stand-ins (the judge a binding alone gets)."""
    binding = bind(resolve_target(target))
    run = run_audit(binding, AuditOptions(clauses=clauses, budget=budget, examples=20,
                                          jobs=2))
    report = build_report(binding, run, report_file=str(path))
    path.write_text(json.dumps(report))
    return report


def test_every_defect_of_a_variant_report_draws(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Defects of every kind of witness the clauses give (a formula's, a store
    schedule's, a lifecycle timeline's, a system program's row), C7 left out only for
    its cost (its Z3 searches take minutes)."""
    report = tmp_path / "variant.json"
    data = _audit_report("builtin:upstream-current", ["C4", "C9", "C13"], 300, report)
    assert data["defects"], "the variant's audit finds defects"
    codes = _explain_all(report, capsys)
    drawn = [name for name, code in codes.items() if code == EXIT_OK]
    assert len(drawn) >= len(data["defects"]), codes


def test_upstream_store_path_rows_draw(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM 0.33.0's store path: its C9 and C12 counterexamples (found within the first
    few hundred cases) draw from what upstream's store path did, their offending chunks
    marked; a system scenario's row says why it has no picture (exit 2)."""
    report = tmp_path / "v033.json"
    data = _audit_report(f"vllm:{release_tree('0.33.0')}", ["C9", "C12"], 1300, report)
    rows = {f"{r['clause']}/{r['theorem']}": r for r in data["results"]}
    store_rows = [name for name, row in rows.items() if row["verdict"] == "COUNTEREXAMPLE"
                  and "/upstream-" in name]
    assert "C9/upstream-store-store-horizon" in store_rows, sorted(rows)
    # The MissingRole shape: a store theorem drawn by kvcontract's store path, which
    # needs the store horizon the binding lacks (the catalogue's C9/store-horizon, on
    # the upstream row's witness).
    horizon = rows["C9/upstream-store-store-horizon"]
    data["results"].append({**horizon, "theorem": "store-horizon",
                            "witness": {**horizon["witness"], "theorem": "C9/store-horizon"}})
    # A system scenario's counterexample row, as the audit reports one (C4 of 0.33.0).
    data["results"].append({
        "clause": "C4", "theorem": "system[window-sw9-tpc4]", "verdict": "COUNTEREXAMPLE",
        "domain": "", "seconds": 0.0, "examples": 0, "via": "", "evidence": None,
        "message": "the lookup accepted a hit the window does not cover", "impact": "crash",
        "witness": {"kind": "system", "scenario": "window-sw9-tpc4",
                    "program": ["add_request('producer', <49 tokens>, 1)", "step(35)"]},
        "description": "the seed scenarios of the executable system"})
    report.write_text(json.dumps(data))
    codes = _explain_all(report, capsys)
    for name in store_rows:
        assert codes[name] == EXIT_OK, (name, codes)
    assert codes["C4/system[window-sw9-tpc4]"] == EXIT_USAGE
    assert codes["C9/store-horizon"] == EXIT_UNKNOWN
    code, output = _explain(capsys, "--report", str(report), "--theorem", "C9/store-horizon")
    assert "store_final_segment_end" in output and "internal" not in output, output
    code, output = _explain(capsys, "--report", str(report), "--theorem",
                            "C9/upstream-store-store-horizon", quiet=False)
    assert code == EXIT_OK and "offending chunk" in output, output
    code, output = _explain(capsys, "--report", str(report), "--theorem",
                            "C4/system[window-sw9-tpc4]")
    assert "a program of the executable system" in output and "internal" not in output


def test_an_engine_judged_row_draws_from_vllms_engine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A C12 lost hit judged on the installed vLLM's engine draws from what the engine
    did (its store path and lookup as executed), where kvcontract's stand-ins would not
    run the release's loop (0.34.0 reads ``block_hashes`` no stand-in models)."""
    from tests.live.conftest import _FOUND, LIVE_REASON

    if not _FOUND.ok:
        pytest.skip(LIVE_REASON)
    report = tmp_path / "engine.json"
    with pytest.raises(SystemExit) as info:
        main(["audit", "--target", "vllm:installed", "--clause", "C12", "--catalogue-only",
              "--quiet", "--json", str(report)])
    capsys.readouterr()
    assert info.value.code == 1
    rows = {r["theorem"]: r for r in json.loads(report.read_text())["results"]}
    assert rows["upstream-no-lost-hits"]["judge"] == "engine"
    code, output = _explain(capsys, "--report", str(report), "--theorem",
                            "C12/upstream-no-lost-hits", quiet=False)
    assert code == EXIT_OK, output
    assert "(vLLM's engine store path and lookup as executed)" in output
    assert "offending chunk" in output
