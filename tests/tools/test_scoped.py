"""``--model`` / ``--geometry`` of ``prove``, ``fuzz`` and ``audit`` (issue 9, item 2):
the contract checked on a model preset's geometry, or on a geometry from a file.

Small presets at one ``bpc`` keep each run to a few seconds: GPT-OSS-20B (SWA ``bs 16,
sw 128`` + FA ``bs 16``) and Command R7B (``sw 4097``, upstream's window bound: one chunk
too many when ``sw = 1 (mod tpc)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from kvcontract.spec.geometry import Geometry
from kvcontract.spec.models import get_preset
from kvcontract.tools.cli import cli


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, prog_name="kvcontract", terminal_width=200)


def _rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{r['clause']}/{r['theorem']}": r for r in report["results"]}


def test_prove_reference_on_gpt_oss(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = invoke(["prove", "--impl", "reference", "--model", "gpt-oss-20b", "--bpc", "1",
                     "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "gpt-oss-20b bpc=1: SWA(bs=16, sw=128) + FA(bs=16); bpc=1; retention=0; " \
           "buildable: yes" in result.output
    report = json.loads(out.read_text())
    [described] = report["geometries"]
    assert described["label"] == "gpt-oss-20b bpc=1" and described["buildable"] is True
    assert described["preset"] == "gpt-oss-20b"
    assert Geometry.from_dict(described["geometry"]) == get_preset("gpt-oss-20b").geometry(1)
    rows = _rows(report)
    for theorem_id in ("C2/lookup-loads-only-hit", "C9/store-horizon", "C12/no-lost-hits"):
        assert "gpt-oss-20b bpc=1" in rows[theorem_id]["domain"], theorem_id
    for theorem_id in ("C4/load-window-exact", "C7/replay-boundary-supplied[plain-zero]"):
        assert rows[theorem_id]["verdict"] == "PROVED-FOR-DOMAIN"
        assert "sw=128" in rows[theorem_id]["domain"]
    # nothing that fails the run (the C12 row may report waste: see docs/usage.md)
    assert all(r["verdict"] != "COUNTEREXAMPLE" or r["impact"] == "waste"
               for r in report["results"])


def test_prove_upstream_on_command_r_finds_the_lost_hit(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = invoke(["prove", "--impl", "upstream-current", "--model", "command-r7b",
                     "--bpc", "1", "--clause", "C4", "--clause", "C12", "--json", str(out),
                     "--quiet"])
    assert result.exit_code == 1, result.output
    rows = _rows(json.loads(out.read_text()))
    lookup = rows["C4/lookup-is-maximal"]
    assert lookup["verdict"] == "COUNTEREXAMPLE" and lookup["impact"] == "lost-hit"
    assert lookup["witness"]["geometry"]["groups"][0]["sliding_window"] == 4097
    window = rows["C4/load-window-exact"]["witness"]["values"]
    assert (window["sw"], window["bs"], window["e"]) == (4097, 16, 0)
    assert rows["C12/no-lost-hits"]["verdict"] == "COUNTEREXAMPLE"


def test_geometry_file_round_trip(tmp_path: Path) -> None:
    """A geometry written by ``Geometry.to_dict`` (plain, labelled, in a list) gives the
    same verdicts as the preset it came from."""
    geometry = get_preset("command-r7b").geometry(1)
    (tmp_path / "plain.json").write_text(json.dumps(geometry.to_dict()))
    (tmp_path / "list.json").write_text(json.dumps(
        [{"label": "mine", "geometry": geometry.to_dict()}]))
    reports = {}
    for name, args in (("model", ["--model", "command-r7b", "--bpc", "1"]),
                       ("plain", ["--geometry", str(tmp_path / "plain.json")]),
                       ("list", ["--geometry", str(tmp_path / "list.json")])):
        out = tmp_path / f"{name}.json"
        result = invoke(["prove", "--impl", "upstream-current", *args, "--clause", "C1",
                         "--clause", "C12", "--fail-on", "all", "--json", str(out),
                         "--quiet"])
        assert result.exit_code == 1, result.output
        reports[name] = json.loads(out.read_text())
    labels = {name: [g["label"] for g in r["geometries"]] for name, r in reports.items()}
    assert labels == {"model": ["command-r7b bpc=1"], "plain": ["plain"], "list": ["mine"]}
    for report in reports.values():
        assert Geometry.from_dict(report["geometries"][0]["geometry"]) == geometry
    verdicts = {name: {k: (r["verdict"], r.get("impact")) for k, r in _rows(report).items()}
                for name, report in reports.items()}
    assert verdicts["model"] == verdicts["plain"] == verdicts["list"]
    assert verdicts["model"]["C12/no-lost-hits"][0] == "COUNTEREXAMPLE"


def test_geometry_vllm_does_not_build_is_checked_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "latent.json"
    path.write_text(json.dumps({"groups": [
        {"kind": "full", "block_size": 528},
        {"kind": "sliding_window", "block_size": 32, "sliding_window": 64}]}))
    result = invoke(["prove", "--geometry", str(path), "--clause", "C1", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "buildable: no" in result.output
    assert "does not build latent" in result.output and "graded latent" in result.output


def test_fuzz_on_command_r(tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    result = invoke(["fuzz", "--impl", "upstream-current", "--model", "command-r7b",
                     "--bpc", "1", "--examples", "0", "--json", str(out)])
    assert result.exit_code == 1, result.output
    report = json.loads(out.read_text())
    assert [g["label"] for g in report["geometries"]] == ["command-r7b bpc=1"]
    lost = [d for d in report["differences"] if d["clause"] == "C4"]
    assert lost and lost[0]["impact"] == "lost-hit"
    assert "command-r7b bpc=1 P=4113" in lost[0]["witness"]["scenario"]


def test_fuzz_seed_scenarios_on_a_geometry() -> None:
    from kvcontract.tools.fuzz import run_fuzz, scoped_seed_scenarios

    scope = [("gpt-oss-20b bpc=1", get_preset("gpt-oss-20b").geometry(1))]
    scenarios = scoped_seed_scenarios(scope)
    kinds = {s.name.rsplit(" ", 1)[1] for s in scenarios}
    assert kinds == {"resend", "continuation", "stalled-store", "stale-pending",
                     "prefill-horizon"}
    assert all(s.geometry == scope[0][1] for s in scenarios)
    report = run_fuzz("stale-pending", examples=0, geometries=scope)
    assert any(d.clause == "C3" for d in report.differences)
    # The stalled store on the model's geometry: a deferral without a deadline (C13).
    stalled = run_fuzz("no-deadline", examples=0, geometries=scope).differences
    assert any(d.clause == "C13" and "stalled-store" in d.witness["scenario"]
               for d in stalled)
    assert run_fuzz("reference", examples=3, geometries=scope).differences == []


def test_audit_on_command_r() -> None:
    result = invoke(["audit", "--target", "upstream-current", "--model", "command-r7b",
                     "--bpc", "1", "--clause", "C4", "--jobs", "1", "--format", "json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["geometries"][0]["label"] == "command-r7b bpc=1"
    rows = _rows(report)
    assert rows["C4/lookup-is-maximal"]["verdict"] == "COUNTEREXAMPLE"
    assert "command-r7b bpc=1" in rows["C4/lookup-is-maximal"]["domain"]
    assert rows["C4/load-window-exact"]["witness"]["values"]["sw"] == 4097


