"""Pictures on the token axis: every counterexample of each variant's report draws as a
valid PNG and SVG, the terminal rendering names the offending chunk, and the ranges in a
scene are the spec's (checked on the worked numbers of docs/CONTRACT.md section 8)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from kvcontract.errors import UsageError
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lookup import HIT, HIT_PENDING, MISS
from kvcontract.tools.explain import (
    Scene,
    build_scene,
    draw,
    parse_states,
    render_terminal,
    scene_from_result,
)

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def terminal_text(scene: Scene) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(render_terminal(scene))
    return console.export_text()


def assert_pictures(png: Path, svg: Path) -> None:
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert png.stat().st_size > 2000
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(list(root.iter())) > 50  # a drawing, not an empty canvas


def test_every_counterexample_draws(
    variant_reports: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    drawn = 0
    for name, report in variant_reports.items():
        impl = get_implementation(name)
        for result in report["results"]:
            if result["verdict"] != "COUNTEREXAMPLE":
                continue
            scene = scene_from_result(result, impl)
            offending = scene.offending()
            assert offending, (name, result["theorem"])
            stem = tmp_path / f"{name}-{result['theorem']}"
            png, svg = draw(scene, [f"{stem}.png", f"{stem}.svg"])
            assert_pictures(png, svg)
            text = terminal_text(scene)
            for group, chunk in offending:
                assert f"offending chunk: group {group} chunk {chunk}" in text
            drawn += 1
    assert drawn >= 12


def _scene(reports: dict[str, dict[str, Any]], name: str, theorem: str) -> Scene:
    result = next(r for r in reports[name]["results"] if r["theorem"] == theorem)
    return scene_from_result(result, get_implementation(name))


def test_offending_chunks_are_the_defects(variant_reports: dict[str, dict[str, Any]]) -> None:
    # mtp-extra-retained: hit 12 loads SWA chunk 0, which is missing (the "not found" crash)
    scene = _scene(variant_reports, "mtp-extra-retained", "lookup-loads-only-hit")
    assert scene.offending() == [(1, 0)] and scene.rows[1].states[0] == MISS
    assert scene.rows[1].load_chunks == (0, 3)
    # stale-pending: the pending chunk 2 is outside the window of boundary 4, yet defers
    scene = _scene(variant_reports, "stale-pending", "lookup-defers-only-in-scope")
    assert scene.offending() == [(1, 2)] and scene.rows[1].states[2] == HIT_PENDING
    assert scene.rows[1].window_chunks == (0, 1)
    # prefill-horizon: the intermediate tails {0..4} no boundary demands
    scene = _scene(variant_reports, "prefill-horizon", "store-horizon")
    assert scene.offending() == [(1, k) for k in range(5)]
    assert scene.rows[1].stored == {5, 6, 7, 8, 9}
    # unaligned-hit: chunk 0 is loaded for N=5 but only chunk 1 is checked
    scene = _scene(variant_reports, "unaligned-hit", "first-run-covers-load")
    assert scene.offending() == [(0, 0)] and scene.rows[0].load_chunks == (0, 2)


def test_seed_001_unaligned_hit_numbers() -> None:
    """docs/CONTRACT.md 8.2: groups FA 256, SWA 64 (sw 128), SWA 8 (sw 128), bpc 4, prompt 4353,
    N = 3904: the bs-64 group needs chunks {14, 15}."""
    geometry = Geometry((fa(256), swa(64, 128), swa(8, 128)), blocks_per_chunk=4)
    scene = build_scene(geometry, 4353, 3904)
    assert scene.rows[1].load_chunks == (14, 16)
    assert scene.rows[1].window_chunks == (14, 16)
    assert scene.rows[1].retained_tokens == (3777, 3904)


def test_seed_003_mtp_numbers_and_states() -> None:
    """docs/CONTRACT.md 8.3: bs = tpc = 16, sw 32, e 3, N 64: needed chunks {1, 2, 3}."""
    geometry = Geometry((fa(64), swa(16, 32, 3)), blocks_per_chunk=1)
    states = parse_states(["1=MMHHM"])
    scene = build_scene(geometry, 80, 64, states=states)
    assert scene.rows[1].load_chunks == (1, 4)
    assert scene.rows[1].missing() == [0, 1, 4] and scene.rows[1].states[2] == HIT
    text = terminal_text(scene)
    assert "load chunks [1, 4)" in text and "missing {0-1, 4}" in text


def test_svg_is_deterministic(variant_reports: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    scene = _scene(variant_reports, "stale-pending", "lookup-defers-only-in-scope")
    draw(scene, [tmp_path / "a.svg"])
    draw(scene, [tmp_path / "b.svg"])
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()


def test_long_rows_are_cropped() -> None:
    geometry = Geometry((fa(16), swa(16, 128)), blocks_per_chunk=1)
    scene = build_scene(geometry, 100_000, 64_000)
    lo, hi = scene.view()
    assert lo <= 64_000 - 128 and hi >= 64_000 and (hi - lo) // 16 <= 96


def test_bad_inputs() -> None:
    with pytest.raises(UsageError, match="unknown letters"):
        parse_states(["1=HHX"])
    with pytest.raises(UsageError, match="GROUP=LETTERS"):
        parse_states(["HHM"])
    with pytest.raises(UsageError, match=r"\.png and \.svg"):
        draw(build_scene(Geometry((swa(4, 8),)), 16, 8), ["x.pdf"])
    with pytest.raises(UsageError, match="below the local hit"):
        build_scene(Geometry((swa(4, 8),)), 16, 4, local_hit=8)
    fuzz = {"clause": "C3", "theorem": "fuzz-lookup", "verdict": "COUNTEREXAMPLE",
            "witness": {"kind": "fuzz", "program": ["step(4)"]}}
    with pytest.raises(UsageError, match="no token-axis picture"):
        scene_from_result(fuzz, get_implementation("reference"))


def _explain(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvcontract", "explain", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_cli_flags_and_report(variant_reports: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    done = _explain("--fa-block", "16", "--swa-block", "16", "--sliding-window", "32",
                    "--e", "3", "--tokens", "80", "--hit", "64", "--states", "1=MHHHM",
                    "--svg", str(tmp_path / "s.svg"), "--png", str(tmp_path / "s.png"),
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_pictures(tmp_path / "s.png", tmp_path / "s.svg")
    assert "load chunks [1, 4)" in done.stdout
    report = tmp_path / "report.json"
    report.write_text(json.dumps(variant_reports["mtp-extra-retained"]))
    done = _explain("--report", str(report), "--all", "--out", str(tmp_path / "pics"),
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = [r for r in variant_reports["mtp-extra-retained"]["results"]
             if r["verdict"] == "COUNTEREXAMPLE"]
    assert len(list((tmp_path / "pics").glob("*.png"))) == len(found) >= 3
    assert "offending chunk: group 1 chunk 0 (MISS)" in done.stdout
    done = _explain("--report", str(report), "--theorem", "C2/no-such-theorem", cwd=tmp_path)
    assert done.returncode == 2
    assert "report.json" in done.stderr
    assert "no result for theorem 'C2/no-such-theorem'" in done.stderr
    done = _explain("--tokens", "10", cwd=tmp_path)
    assert done.returncode == 2 and "--geometry" in done.stderr
