"""Defects from the command line: ``prove`` on every historic variant fails by default
and opens with the summary of its defects; ``explain --defect ID``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kvcontract.tools.cli import cli

HISTORIC = {
    # variant: the cheapest clause that refutes it, and the impact of its defect there
    "stale-pending": ("C3", "delay"),         # seed 000: deferred until the client gives up
    "unaligned-hit": ("C2", "crash"),         # seed 001
    "mtp-extra-retained": ("C1", "corruption"),  # seed 003
    "prefill-horizon": ("C9", "waste"),       # seed 004: CPU memory nobody reads
    "upstream-current": ("C4", "lost-hit"),   # the window formula
}


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, prog_name="kvcontract", terminal_width=80)


@pytest.mark.parametrize("variant", sorted(HISTORIC))
def test_prove_fails_on_every_historic_variant_by_default(variant: str, tmp_path: Path) -> None:
    clause, impact = HISTORIC[variant]
    report_path = tmp_path / "r.json"
    # --fail-fast: the first counterexample ends the run (the default suite's budget);
    # its defect is what the summary then shows.
    result = invoke(["prove", "--impl", variant, "--clause", clause, "--jobs", "1",
                     "--fail-fast", "--json", str(report_path)])
    assert result.exit_code == 1, result.output
    report = json.loads(report_path.read_text())
    defects = report["defects"]
    assert defects and defects[0]["impact"] == impact, defects
    # Every counterexample is in exactly one defect, located at the variant's functions.
    failing = sorted(f"{r['clause']}/{r['theorem']}" for r in report["results"]
                     if r["verdict"] == "COUNTEREXAMPLE")
    assert sorted(t for d in defects for t in d["theorems"]) == failing
    assert all(d["root_cause"]["fields"] for d in defects)
    # The summary comes first, before the theorem table.
    lines = result.output.splitlines()
    assert lines[0] == f"kvcontract prove: {variant}"
    assert lines[1].startswith(f"{len(defects)} defect")
    assert lines.index(next(line for line in lines if "┏" in line)) > 3
    assert f"--defect {defects[0]['id']}" in result.output


def test_prove_on_the_reference_exits_0_and_has_no_defects(tmp_path: Path) -> None:
    report_path = tmp_path / "r.json"
    result = invoke(["prove", "--clause", "C1", "--json", str(report_path), "--jobs", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert "defects" not in report
    assert "defect" not in result.output


def test_explain_draws_a_defect_by_id(tmp_path: Path) -> None:
    report_path = tmp_path / "r.json"
    invoke(["prove", "--impl", "mtp-extra-retained", "--clause", "C1", "--jobs", "1",
            "--quiet", "--json", str(report_path)])
    defects = json.loads(report_path.read_text())["defects"]
    drawn = invoke(["explain", "--report", str(report_path), "--defect", defects[0]["id"]])
    assert drawn.exit_code == 0, drawn.output
    assert drawn.output.startswith(defects[0]["witness"]["theorem"])
    unknown = invoke(["explain", "--report", str(report_path), "--defect", "D000000000000"])
    assert unknown.exit_code == 2
    assert "D000000000000" in unknown.output and defects[0]["id"] in unknown.output
    alone = invoke(["explain", "--defect", defects[0]["id"]])
    assert alone.exit_code == 2 and "--report" in alone.output
