"""``kvcontract explain`` on a lifecycle witness (C13-C15): a timeline of scheduler steps,
one lane per request, driven by the property's picture (no branch per theorem)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from kvcontract.impl.variants import get_implementation
from kvcontract.proofs.theorem import run_property
from kvcontract.spec.properties import get_property
from kvcontract.tools.explain import draw, render_terminal, scene_from_result


def _result(theorem: str, variant: str) -> dict[str, object]:
    result = run_property(get_property(theorem), get_implementation(variant))
    assert result.verdict.value == "COUNTEREXAMPLE"
    row = dataclasses.asdict(result)
    row["verdict"] = result.verdict.value
    return row


def test_a_stall_is_drawn_as_a_timeline(tmp_path: Path) -> None:
    scene = scene_from_result(_result("C13/deferral-bounded", "no-deadline"),
                              get_implementation("no-deadline"))
    assert scene.timeline and scene.offending_steps == {2, 10}
    console = Console(record=True, width=160, color_system=None)
    console.print(render_terminal(scene))
    text = console.export_text()
    assert "! step   2 c" in text and "lookup deferred: g0c0 hit-pending" in text
    assert "never decided" in text and "(stalled-store)" in text
    png, svg = draw(scene, [tmp_path / "stall.png", tmp_path / "stall.svg"])
    assert png.read_bytes().startswith(b"\x89PNG")
    assert ET.parse(svg).getroot().tag == "{http://www.w3.org/2000/svg}svg"


def test_a_crash_names_the_raising_step() -> None:
    scene = scene_from_result(_result("C14/raises-nothing", "abort-unscheduled-crash"),
                              get_implementation("abort-unscheduled-crash"))
    rows = [text for _, _, text in scene.timeline]
    assert any(text.startswith("RAISED StoreJobError in abort") for text in rows)
    assert scene.offending_steps == {0}


@pytest.mark.slow  # prove runs the whole C13 family (2,944 programs): 10-30 s
def test_the_cli_proves_and_draws_a_lifecycle_witness(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    proved = subprocess.run(
        [sys.executable, "-m", "kvcontract", "prove", "--impl", "resetting-deadline",
         "--clause", "C13", "--no-cache", "--quiet", "--jobs", "1", "--json", str(report)],
        capture_output=True, text=True, timeout=300)
    assert proved.returncode == 1, proved.stdout + proved.stderr
    drawn = subprocess.run(
        [sys.executable, "-m", "kvcontract", "explain", "--report", str(report),
         "--theorem", "C13/deferral-bounded", "--out", str(tmp_path / "t.svg")],
        capture_output=True, text=True, timeout=300)
    assert drawn.returncode == 0, drawn.stdout + drawn.stderr
    assert "lookup deferred" in drawn.stdout and (tmp_path / "t.svg").exists()
