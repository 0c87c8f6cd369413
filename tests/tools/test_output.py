"""Terminal output (issue 11): readable at 80 columns, ``COLUMNS`` honoured in pipes,
full theorem ids in ``list`` and ``list --json``, quiet on a closed pipe, progress on a
non-terminal stderr."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from kvcontract.proofs.runner import catalog
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.tools.commands._common import results_table
from kvcontract.tools.reports.console import PIPE_WIDTH, console_width

MTP_PATCH = '''"""Ignores MTP's extra retained tokens when freeing (the shape of seed 003)."""


def get_num_skipped_tokens(num_computed_tokens, sliding_window, extra_retained):
    num_skipped = num_computed_tokens - sliding_window + 1
    if num_skipped < 0:
        return 0
    return num_skipped
'''
"""A ``module:`` implementation that violates C1 (two of its three theorems, in 1 s)."""

WORD = re.compile(r"[A-Z][A-Z-]{2,}")
"""A verdict word cut short (``COUNTEREXAMPL`` without its ``E``)."""


def _kvcontract(*args: str, columns: int | None = 80, cwd: Path | None = None,
                **popen: Any) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "kvcontract", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300, **popen)


def _verdict_cut(text: str) -> list[str]:
    """Lines with a verdict word cut short (``COUNTEREXAMPL`` at a line end, its ``E`` on
    the next line, or ``PROVED-FOR-DO…``): an upper-case word that is a proper prefix of
    a verdict and not a verdict itself."""
    words = {v.value for v in Verdict}
    return [line for line in text.splitlines() for word in WORD.findall(line)
            if word not in words and any(v.startswith(word) for v in words)]


@pytest.fixture(scope="module")
def mtp_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("impl") / "mtp_patch.py"
    path.write_text(MTP_PATCH, encoding="utf-8")
    return path


# -- 80 columns ---------------------------------------------------------------------------
@pytest.mark.parametrize("width", [60, 80, 100, 119, 120, 200])
def test_results_table_never_breaks_a_verdict(width: int) -> None:
    theorems = catalog()
    verdicts = list(Verdict)
    results = [TheoremResult(t.clause, t.name, verdicts[i % len(verdicts)], t.domain, 1.5,
                             123_456_789) for i, t in enumerate(theorems)]
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(results_table(results, "title"))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    for verdict in verdicts:
        assert verdict.value in text, (width, verdict)
    assert not _verdict_cut(text)
    if width >= 80:  # the narrow layout shows the full id, the wide one clause + name
        for t in theorems:
            if len(t.theorem_id) <= 30:
                assert t.theorem_id in text or t.name in text


def test_prove_at_80_columns(mtp_file: Path) -> None:
    done = _kvcontract("prove", "--impl", f"module:{mtp_file}", "--clause", "C1", "--jobs", "1")
    assert done.returncode == 1, done.stderr
    # A line that holds the file's path (the summary's target, a command to copy) is
    # never cut or wrapped; every other line fits.
    lines = [line for line in done.stdout.splitlines() if str(mtp_file) not in line]
    assert max(len(line) for line in lines) <= 80
    assert any(str(mtp_file) in line for line in done.stdout.splitlines())
    assert "COUNTEREXAMPLE" in done.stdout and "PROVED" in done.stdout
    assert "C1/retained-blocks-exact" in done.stdout
    assert not _verdict_cut(done.stdout)
    assert "Traceback" not in done.stderr


def test_piped_output_honours_columns() -> None:
    class Pipe(io.StringIO):
        def isatty(self) -> bool:
            return False

    saved = os.environ.get("COLUMNS")
    try:
        os.environ["COLUMNS"] = "77"
        assert console_width(Pipe()) == 77
        os.environ["COLUMNS"] = "wide"
        assert console_width(Pipe()) == PIPE_WIDTH
        del os.environ["COLUMNS"]
        assert console_width(Pipe()) == PIPE_WIDTH == 100
    finally:
        if saved is not None:
            os.environ["COLUMNS"] = saved
    for columns, bound in ((None, 100), (120, 120), (80, 80)):
        done = _kvcontract("list", columns=columns)
        assert done.returncode == 0, done.stderr
        assert max(len(line) for line in done.stdout.splitlines()) <= bound


def test_list_shows_every_theorem_id_in_full() -> None:
    done = _kvcontract("list")
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    ids = [t.theorem_id for t in catalog()]
    missing = [i for i in ids if i not in done.stdout]
    assert not missing, missing
    # One row per theorem: the four bracketed C7 variants are four different ids.
    assert len([i for i in ids if i.startswith("C7/segment-boundaries-supplied[")]) == 4
    assert "…" not in done.stdout


def test_list_json_shape() -> None:
    done = _kvcontract("list", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["version"] == 1 and data["command"] == "list"
    assert {"clauses", "theorems", "implementations"} <= set(data)
    assert "presets" not in data
    ids = [t["id"] for t in data["theorems"]]
    assert ids == [t.theorem_id for t in catalog()]
    assert len(set(ids)) == len(ids)
    for theorem in data["theorems"]:
        assert set(theorem) >= {"id", "clause", "name", "kind", "domain", "impact",
                                "description", "uses"}
        assert theorem["id"] == f"{theorem['clause']}/{theorem['name']}"
        assert theorem["kind"] in ("arith", "exhaustive")
    clause_ids = [c["id"] for c in data["clauses"]]
    assert clause_ids[:2] == ["C1", "C2"] and "C11" in clause_ids
    by_id = {c["id"]: c for c in data["clauses"]}
    assert by_id["C11"]["proved_by"] == "system" and by_id["C11"]["theorems"] == []
    assert "reference" in [i["name"] for i in data["implementations"]]
    with_models = json.loads(_kvcontract("list", "--json", "--models").stdout)
    assert with_models["presets"]
    preset = with_models["presets"][0]
    assert {"name", "geometry", "buildable", "sources"} <= set(preset)
    assert preset["geometry"]["groups"]


# -- closed pipes -------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "code"), [
    (("list",), 0),
    (("list", "--json"), 0),
    (("prove", "--impl", "module:{mtp}", "--clause", "C1", "--jobs", "1"), 1),
])
def test_closed_pipe_exits_quietly(mtp_file: Path, args: tuple[str, ...], code: int) -> None:
    """The reader is gone before the first write (``kvcontract list | head -0``): no
    traceback, no "Broken pipe" line, and the exit code of the run (its verdict)."""
    env = {**os.environ, "COLUMNS": "80"}
    argv = [a.replace("{mtp}", str(mtp_file)) for a in args]
    process = subprocess.Popen([sys.executable, "-m", "kvcontract", *argv],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=300) == code, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Broken pipe" not in err, err
    assert "Exception ignored" not in err, err


def test_pipe_closed_after_the_first_line() -> None:
    process = subprocess.Popen([sys.executable, "-m", "kvcontract", "list"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline()
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0
    assert err == ""


# -- progress on a non-terminal stderr ----------------------------------------------------
def test_fuzz_prints_progress_lines() -> None:
    done = _kvcontract("fuzz", "--examples", "1")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("kvcontract: fuzzing")]
    assert lines[0].startswith("kvcontract: fuzzing [1/")
    total = int(re.search(r"/(\d+)\]", lines[0]).group(1))  # type: ignore[union-attr]
    assert len(lines) == total and "state machine" in lines[-1]
    quiet = _kvcontract("fuzz", "--examples", "0", "--quiet")
    assert "fuzzing [" not in quiet.stderr


def test_gen_tests_prints_progress_lines(tmp_path: Path, mtp_file: Path) -> None:
    done = _kvcontract("gen-tests", "--impl", f"module:{mtp_file}", "--clause", "C1",
                       "--jobs", "1", "--out", str(tmp_path / "repro"))
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if "proving [" in line]
    names = sorted(line.split("] ")[1] for line in progress)
    assert {"C1/allocation-bound", "C1/load-set-exact", "C1/retained-blocks-exact"} <= set(names)
    assert all(n.startswith("C1/") for n in names)
    assert progress[-1].startswith(f"kvcontract: proving [{len(names)}/{len(names)}] ")
    assert "wrote 2 test files" in done.stdout
