"""Defects: counterexamples grouped by root cause (tools/audit/root_cause, defects), on
released code and on hand-made rows; the per-defect baseline comparison; the gate's
defect ids; the one-screen summary."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from audit_releases import release_tree
from test_audit_engine import CLAUSES, _audit

from kvcontract.tools.audit.defects import (
    compare_defects,
    defect_id,
    group_defects,
    witness_line,
)
from kvcontract.tools.audit.root_cause import REFERENCE_ROLES, rebind
from kvcontract.tools.reports.summary import SUMMARY_WIDTH, defect_block, summary_lines

WINDOW = "get_sliding_window_size_in_chunks"
STORE_JOBS = "OffloadingConnectorScheduler._build_store_jobs"
LOOP = "OffloadingConnectorScheduler._lookup_complete_chunks"


def _functions(defect: dict[str, Any]) -> set[str]:
    return {f["qualname"] for f in defect["root_cause"]["functions"]}


def _by_function(defects: list[dict[str, Any]], qualname: str) -> list[dict[str, Any]]:
    return [d for d in defects if _functions(d) == {qualname}]


_LOOKUP_RUNS: dict[str, Any] = {}


def _lookup_audit(version: str) -> Any:
    """C3 and C4 at the default budget (the lookup family reaches the window formula's
    witnesses there; about 15 s on two cores)."""
    if version not in _LOOKUP_RUNS:
        from kvcontract.tools.audit.binding import bind
        from kvcontract.tools.audit.engine import AuditOptions, run_audit
        from kvcontract.tools.audit.targets import resolve_target

        binding = bind(resolve_target(f"vllm:{release_tree(version)}"))
        _LOOKUP_RUNS[version] = binding, run_audit(
            binding, AuditOptions(clauses=["C3", "C4"], jobs=2))
    return _LOOKUP_RUNS[version]


def test_window_formula_is_one_defect_on_0_33() -> None:
    """The window formula's findings (C4 load window, W, maximality; C3's deferral on a
    pending copy of the extra chunk) are one defect at config.py's W, established by
    replacing upstream's W and re-running (rebound), not by reading the source."""
    _, run = _lookup_audit("0.33.0")
    defects = group_defects(run.rows)
    window = _by_function(defects, WINDOW)
    assert len(window) == 1, [d["title"] for d in defects]
    theorems = set(window[0]["theorems"])
    assert {"C4/load-window-exact", "C4/window-exact", "C4/lookup-is-maximal",
            "C3/lookup-defers-only-in-scope"} <= theorems
    assert window[0]["root_cause"]["how"] == "rebound"
    assert window[0]["impact"] == "lost-hit"
    assert window[0]["impacts"] == ["lost-hit", "delay"]
    assert window[0]["locations"][0]["display"].endswith("offloading/config.py:61")
    # Upstream's own loop is a defect of its own, per clause; the store path's replay
    # boundary too (C9, in the cheaper run).
    assert len(_by_function(group_defects(_audit("0.33.0", CLAUSES)[1].rows), STORE_JOBS)) == 1
    loop = _by_function(defects, LOOP)
    assert {d["clauses"][0] for d in loop} >= {"C3"}
    # Every counterexample is in exactly one defect.
    found = [t for d in defects for t in d["theorems"]]
    failing = [f"{r['clause']}/{r['theorem']}" for r in run.rows
               if r["verdict"] == "COUNTEREXAMPLE"]
    assert sorted(found) == sorted(failing)


def test_rebinding_the_window_removes_the_finding_on_upstreams_own_loop() -> None:
    """What "rebound" means: with upstream's W replaced by the reference's, upstream's own
    loop (not only kvcontract's) accepts the hit the window formula lost."""
    from kvcontract.tools.audit.lookup import make_runner

    tree = release_tree("0.33.0")
    from kvcontract.tools.audit.binding import bind
    from kvcontract.tools.audit.targets import resolve_target

    binding = bind(resolve_target(f"vllm:{tree}"))
    row = next(r for r in _lookup_audit("0.33.0")[1].rows if r["theorem"] == "lookup-is-maximal")
    from kvcontract.spec.properties import get_property

    case = get_property("C4/lookup-is-maximal").space.decode(row["witness"])
    answer = lambda g, k: case.states[g][k]  # noqa: E731
    before = make_runner(binding)(case.geometry, case.num_tokens, case.local_hit, answer)
    after = make_runner(rebind(binding, ["window"]))(case.geometry, case.num_tokens,
                                                    case.local_hit, answer)
    assert before.hit_tokens == 0
    assert after.hit_tokens == 24
    assert set(REFERENCE_ROLES) == {"window", "skipped"}
    assert binding.functions["window"] is not rebind(binding, ["window"]).functions["window"]


def test_historic_defects_on_0_29_are_located_apart() -> None:
    """0.29's stale pending (the scanner), missing load window and ignored e (W), and
    prefill horizon (the store-job builder) are separate defects, each at its function."""
    _, run = _audit("0.29.0", CLAUSES)
    defects = group_defects(run.rows)
    assert len(_by_function(defects, WINDOW)) == 1
    assert len(_by_function(defects, STORE_JOBS)) == 1
    scanner = [d for d in defects
               if _functions(d) == {"OffloadingConnectorScheduler._sliding_window_lookup"}]
    assert len(scanner) == 1
    assert "C3/scan-defers-only-in-scope" in scanner[0]["theorems"]


def _row(clause: str, theorem: str, impact: str, names: list[str], how: str = "field",
         witness: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"clause": clause, "theorem": theorem, "verdict": "COUNTEREXAMPLE",
            "impact": impact, "message": f"{theorem} fails",
            "witness": witness or {"kind": "arith", "values": {"bs": 1, "sw": 2}},
            "root_cause": {"how": how, "functions": [
                {"role": n, "qualname": n, "what": f"the {n} (detail)", "path": "/x/vllm/a.py",
                 "line": 3} for n in names]}}


def test_grouping_rules() -> None:
    rows = [
        _row("C4", "a", "lost-hit", ["f"]),
        _row("C3", "b", "delay", ["f"]),
        _row("C2", "c", "latent", ["f"]),              # latent: a defect apart
        _row("C3", "d", "delay", ["loop"], how="loop"),
        _row("C4", "e", "waste", ["loop"], how="loop"),  # a whole loop: split by clause
        {**_row("C9", "g", "waste", []), "root_cause": None},
        {"clause": "C1", "theorem": "h", "verdict": "PROVED"},
    ]
    defects = group_defects(rows)
    assert [d["theorems"] for d in defects] == [
        ["C4/a", "C3/b"], ["C3/d"], ["C4/e"], ["C9/g"], ["C2/c"]]
    assert defects[0]["impact"] == "lost-hit" and defects[0]["title"] == "the f (f)"
    assert defects[1]["title"] == "readiness scope (C3) in loop"
    assert defects[-1]["latent"] and defects[-1]["impact"] == "latent"
    assert defects[3]["title"].startswith("store horizon (C9)")
    assert defects[0]["locations"][0]["display"] == "vllm/a.py:3"


def test_a_defect_needs_a_mode_only_when_every_finding_does() -> None:
    """A configuration beyond vLLM's defaults (legacy block hashes on 0.34.0) is the
    defect's only where every member needs it, and the summary says so."""
    from kvcontract.tools.audit.on_engine import LEGACY_HASHES_MODE

    legacy = {**_row("C12", "a", "lost-hit", ["f"]), "mode": LEGACY_HASHES_MODE}
    (alone,) = group_defects([legacy, {**legacy, "theorem": "b"}])
    assert alone["mode"] == LEGACY_HASHES_MODE
    block = [text for text, _ in defect_block(1, alone)]
    assert any(line.startswith("    needs: disable_lookahead_block_hashes=True") for line in block)
    (mixed,) = group_defects([legacy, _row("C12", "b", "lost-hit", ["f"])])
    assert "mode" not in mixed
    assert not any("needs:" in text for text, _ in defect_block(1, mixed))
    dense = {**_row("C12", "c", "lost-hit", ["f"]), "mode": "retention=None"}
    (either,) = group_defects([legacy, dense])
    assert either["mode"] == f"{LEGACY_HASHES_MODE} or retention=None"


def test_a_finding_without_a_drafter_needs_no_mode() -> None:
    from kvcontract.spec.geometry import Geometry, fa, swa
    from kvcontract.spec.properties.lookup import LookupCase
    from kvcontract.tools.audit.on_engine import finding_mode

    case = LookupCase.__new__(LookupCase)
    object.__setattr__(case, "geometry", Geometry((fa(4), swa(4, 8))))
    assert finding_mode(case) is None


def test_defect_identity_does_not_depend_on_the_witness() -> None:
    first = group_defects([_row("C4", "a", "lost-hit", ["f"])])[0]
    changed = _row("C4", "a", "lost-hit", ["f"], witness={"kind": "arith",
                                                           "values": {"bs": 4, "sw": 9}})
    changed["root_cause"]["functions"][0]["line"] = 99
    second = group_defects([changed])[0]
    assert first["id"] == second["id"]
    assert first["findings"] != second["findings"]  # the finding itself did change
    assert defect_id((("f",), False, "")) != defect_id((("f",), True, ""))
    assert defect_id((("f",), False, "")) != defect_id((("g",), False, ""))


def test_compare_defects() -> None:
    base = group_defects([_row("C4", "a", "lost-hit", ["f"]), _row("C9", "b", "waste", ["g"]),
                          _row("C3", "c", "delay", ["h"])])
    target = group_defects([_row("C4", "a", "lost-hit", ["f"]),
                            _row("C3", "c", "crash", ["h"]), _row("C8", "d", "waste", ["k"])])
    classes = {e["title"]: e["classification"] for e in compare_defects(base, target)}
    assert classes == {"the f (f)": "still present", "the g (g)": "fixed",
                       "the h (h)": "changed", "the k (k)": "new"}


def test_witness_lines() -> None:
    lookup = {"clause": "C4", "theorem": "x", "message": "the lookup accepted 0 [latent: y]",
              "witness": {"kind": "exhaustive", "geometry_name": "SWA2(sw5)", "num_tokens": 25,
                          "local_hit": 0, "states": {"0": ["MISS", "HIT_PENDING", "HIT"]}}}
    assert witness_line(lookup) == "SWA2(sw5) N=25 L=0 0=MPH: the lookup accepted 0"
    arith = {"witness": {"kind": "arith", "values": {"bs": 1, "N": 2}}, "message": "m"}
    assert witness_line(arith) == "bs=1, N=2"


def test_summary_fits_one_screen() -> None:
    """The summary of a real audit fits 80 columns (paths and commands apart, which are
    never cut) and 50 lines."""
    binding, run = _audit("0.33.0", CLAUSES)
    from kvcontract.tools.audit.report import build_report

    report = build_report(binding, run)
    lines = [text for text, _ in summary_lines(report)]
    assert len(lines) <= 50
    for text in lines:
        if not text.strip().startswith(("at ", "kvcontract ")):
            assert len(text) <= SUMMARY_WIDTH, text
    assert lines[0].startswith("kvcontract audit: vllm:") and "(vLLM 0.33.0)" in lines[0]
    assert any("get_sliding_window_size_in_chunks" in t for t in lines)


def test_gate_accepts_a_defect_whose_witness_changed() -> None:
    from kvcontract.tools.reports.gate import apply_baseline, baseline_document, load_baseline

    report: dict[str, Any] = {"version": 1, "command": "audit", "target": "vllm:x",
                              "results": [_row("C4", "a", "lost-hit", ["f"])]}
    report["defects"] = group_defects(report["results"])
    document = baseline_document(report)
    assert document["findings"][0]["defect"] == report["defects"][0]["id"]
    import json
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "baseline.json"
        path.write_text(json.dumps(document))
        baseline = load_baseline(path)
    later = copy.deepcopy(report)
    later["results"][0]["witness"] = {"kind": "arith", "values": {"bs": 16, "sw": 17}}
    later["defects"] = group_defects(later["results"])
    section = apply_baseline(later, baseline, only_new=True)
    assert later["results"][0]["baseline_state"] == "baseline"
    assert section["new"] == 0 and section["fixed"] == []
    other = copy.deepcopy(later)  # another witness, and another function to blame
    other["results"][0]["root_cause"]["functions"][0]["qualname"] = "g"
    other["defects"] = group_defects(other["results"])
    apply_baseline(other, baseline, only_new=True)
    assert other["results"][0]["baseline_state"] == "new"


@pytest.mark.parametrize("level, impact", [("error", "lost-hit"), ("warning", "waste"),
                                           ("note", "latent")])
def test_sarif_has_one_result_per_defect(level: str, impact: str) -> None:
    import json

    from kvcontract.tools.reports import render

    rows = [_row("C4", "a", impact, ["f"]), _row("C3", "b", impact, ["f"])]
    report = {"version": 1, "command": "audit", "target": "vllm:x", "results": rows,
              "defects": group_defects(rows)}
    results = json.loads(render(report, "sarif"))["runs"][0]["results"]
    assert len(results) == 1
    assert results[0]["level"] == level
    assert len(results[0]["relatedLocations"]) == 2
    assert results[0]["partialFingerprints"]["kvcontractDefect/v1"] == report["defects"][0]["id"]
