"""A fuzz finding replays: its witness carries the program (tools/fuzz.encode_program),
``kvcontract.api.replay_fuzz`` runs it again on any implementation, and ``gen-tests``
turns it into a pytest reproducer that fails on the defect and passes on the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvcontract.api import replay_fuzz
from kvcontract.errors import WitnessError
from kvcontract.impl.system import ChunkState
from kvcontract.tools.cli import cli
from kvcontract.tools.fuzz import decode_program, encode_program, run_fuzz

TOKENS = [1, 2, 3, 4, 5]


def test_a_program_round_trips_through_json() -> None:
    ops = [("add_request", "a", TOKENS, 1), ("install_chunk", TOKENS, 0, 1, ChunkState.PENDING),
           ("step", 8), ("drain",)]
    encoded = json.loads(json.dumps(encode_program(ops)))
    assert encoded["token_lists"] == [TOKENS]  # a shared prompt is stored once
    assert decode_program(encoded) == ops


@pytest.mark.parametrize(("ops", "message"), [
    ([["teleport"]], "known operation"),
    ([["step", {"tokens": 3}]], "no token list 3"),
    ([["install_chunk", {"chunk_state": "molten"}]], "unknown chunk state"),
    ([["step", 1.5]], "is not an integer"),
])
def test_a_malformed_program_is_named(ops: list[list[object]], message: str) -> None:
    with pytest.raises(WitnessError, match=message):
        decode_program({"token_lists": [], "ops": ops})


def test_replay_fuzz_runs_the_program_again() -> None:
    report = run_fuzz("no-deadline", examples=0).to_json()
    witness = json.loads(json.dumps(report["differences"][0]["witness"]))
    assert witness["replay"]["clause"] == "C13"
    violation = replay_fuzz(witness, "no-deadline")
    assert violation is not None and "C13/deferral-bounded" in violation
    assert replay_fuzz(witness, "reference") is None
    with pytest.raises(WitnessError, match="no replayable program"):
        replay_fuzz({"kind": "fuzz", "program": ["step(8)"]})


def test_gen_tests_writes_fuzz_reproducers(tmp_path: Path) -> None:
    report = tmp_path / "fuzz.json"
    runner = CliRunner()
    done = runner.invoke(cli, ["fuzz", "--impl", "abort-unscheduled-crash", "--examples",
                               "0", "--quiet", "--json", str(report)])
    assert done.exit_code == 1, done.output
    out = tmp_path / "tests"
    done = runner.invoke(cli, ["gen-tests", "--report", str(report), "--out", str(out)])
    assert done.exit_code == 0, done.output
    files = sorted(out.glob("test_*.py"))
    assert files and all("from kvcontract.api import replay_fuzz" in f.read_text()
                         for f in files)
    env = {k: v for k, v in os.environ.items() if k != "KVCONTRACT_IMPL"}

    def run(impl: str | None) -> int:
        extra = {"KVCONTRACT_IMPL": impl} if impl else {}
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out)],
            cwd=out, env={**env, **extra}, capture_output=True, text=True,
            timeout=600).returncode

    assert run(None) == 1  # fails on the defect
    assert run("reference") == 0  # passes on the fix
