"""``kvcontract mutate``: the operators, one killed mutant, equivalence, the CLI.

Kept small: each child process runs a handful of cheap theorems (C1's retained-range
theorem, the store family), never the whole catalogue.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvcontract.tools.mutate.campaign import _job, plan, run_job
from kvcontract.tools.mutate.equivalence import compare
from kvcontract.tools.mutate.operators import (
    OPERATORS,
    enumerate_points,
    function_source,
    mutated_source,
)
from kvcontract.tools.mutate.targets import REFERENCE_MODULE, SCHEDULER_MODULE, resolve_target

ROOT = Path(__file__).resolve().parents[2]

TOY = textwrap.dedent('''
    def toy(n, bs, e, flag):
        """Docstring: 7 + 1 is not mutated."""
        total: int = n + e
        if total < 3 and flag:
            return max(total // bs, 0)
        for i in range(4):
            if i == 2:
                break
            continue
        return -(-total // bs)
''')


def _after(operator: str) -> list[str]:
    return [p.after for p in enumerate_points(TOY, "toy", "toy.py") if p.operator == operator]


def test_each_operator_yields_the_expected_source() -> None:
    points = enumerate_points(TOY, "toy", "toy.py")
    assert {p.operator for p in points} == set(OPERATORS)
    assert _after("int-constant") == [
        "if total < 4 and flag:", "if total < 2 and flag:",
        "return max(total // bs, 1)", "return max(total // bs, -1)",
        "for i in range(5):", "for i in range(3):",
        "if i == 3:", "if i == 1:",
    ]
    assert _after("comparison") == ["if total <= 3 and flag:", "if i != 2:"]
    assert _after("floor-ceil") == ["return max(-(-total // bs), 0)", "return total // bs"]
    assert _after("drop-term") == ["total: int = n"]
    assert _after("max-min") == ["return min(total // bs, 0)"]
    assert _after("negate-if") == ["if not (total < 3 and flag):", "if not i == 2:"]
    assert _after("delete-jump") == ["pass", "pass"]
    assert _after("and-or") == ["if total < 3 or flag:"]
    # The docstring and the annotation are never mutated; lines are the file's.
    assert all(p.line >= 4 for p in points)
    assert [p.index for p in points] == list(range(len(points)))


def test_a_mutant_is_applied_to_a_copy_and_keeps_line_numbers() -> None:
    point = next(p for p in enumerate_points(TOY, "toy", "toy.py") if p.operator == "max-min")
    assert "min(total // bs, 0)" in function_source(TOY, point)
    assert "max(" not in mutated_source(TOY, point)
    source = (ROOT / "impl" / "reference.py").read_text(encoding="utf-8")
    points = enumerate_points(source, REFERENCE_MODULE, "impl/reference.py")
    assert points == enumerate_points(source, REFERENCE_MODULE, "impl/reference.py")
    for p in points[:5]:
        assert source.splitlines()[p.line - 1].strip().startswith(p.before.split(" ")[0])


def test_reference_target_covers_both_modules_and_maps_clauses() -> None:
    target = resolve_target("reference")
    modules = {p.module for p in target.points()}
    assert modules == {REFERENCE_MODULE, SCHEDULER_MODULE}
    prepared = plan("reference", functions=["get_num_skipped_tokens", "StoreTracker.step",
                                            "lookup_complete_chunks"])
    by_function = {p.function: prepared.judges_of(p) for p in prepared.points}
    assert "C1/retained-blocks-exact" in by_function["get_num_skipped_tokens"].theorems
    # C12 drives the store path and the lookup end to end: it judges both.
    # The lifecycle family (C13-C15) runs the store path of the executable system too.
    assert by_function["StoreTracker.step"].clauses == (
        "C8", "C9", "C10", "C12", "C13", "C14", "C15")
    assert "C12/no-lost-hits" in by_function["lookup_complete_chunks"].theorems
    sampled = plan("reference", sample=5, seed=3)
    assert len(sampled.points) == 5 and sampled.total_points == len(target.points())
    assert sampled.points == plan("reference", sample=5, seed=3).points


def test_dropping_e_in_skipped_tokens_is_killed_by_c1() -> None:
    prepared = plan("reference", functions=["get_num_skipped_tokens"])
    point = next(p for p in prepared.points
                 if p.operator == "drop-term" and "- extra_retained" not in p.after)
    judges = prepared.judges_of(point)
    out, _ = run_job(_job(prepared, point, judges.theorems, baseline=None, fuzz=False,
                          limit=None), safety_timeout=300)
    assert out is not None
    assert out["status"] == "killed", out
    assert out["killed_by"]["clause"] == "C1"
    assert out["killed_by"]["verdict"] == "COUNTEREXAMPLE"


def test_equivalent_mutant_is_shown_and_a_real_one_is_not() -> None:
    def original(num_computed_tokens: int, sliding_window: int) -> int:
        skipped = num_computed_tokens - sliding_window + 1
        if skipped < 0:
            return 0
        return skipped

    def same(num_computed_tokens: int, sliding_window: int) -> int:
        skipped = num_computed_tokens - sliding_window + 1
        if skipped <= 0:  # returns 0 at 0 either way
            return 0
        return skipped

    def different(num_computed_tokens: int, sliding_window: int) -> int:
        skipped = num_computed_tokens - sliding_window + 1
        if skipped < 1:
            return 0
        return skipped + (1 if skipped == 100 else 0)

    shown = compare(original, same)
    assert shown.equivalent is True and shown.method == "z3"
    refuted = compare(original, different)
    assert refuted.equivalent is False
    assert refuted.distinguishing_input is not None
    assert different(**refuted.distinguishing_input) != original(**refuted.distinguishing_input)


def test_equivalence_needs_known_parameters_and_grids_scans() -> None:
    def mystery(x: int) -> int:
        return x

    assert compare(mystery, mystery).equivalent is None

    def scan(lookup, start, end):  # type: ignore[no-untyped-def]
        return sum(1 for i in range(start, end) if lookup(i).name == "HIT")

    def scan_broken(lookup, start, end):  # type: ignore[no-untyped-def]
        return sum(1 for i in range(start, end - 1) if lookup(i).name == "HIT")

    assert compare(scan, scan_broken).equivalent is False


def test_equivalence_is_on_the_contract_s_domain_only() -> None:
    """A local hit is whole blocks (docs/CONTRACT.md 13): rounding it up or down to
    blocks is the same function there, and shown so; with parameter names that carry no
    such relation the same change is a difference."""
    def ceil_blocks(local_hit: int, block_tokens: int) -> int:
        return -(-local_hit // block_tokens)

    def floor_blocks(local_hit: int, block_tokens: int) -> int:
        return local_hit // block_tokens

    shown = compare(ceil_blocks, floor_blocks)
    assert shown.equivalent is True
    assert "local_hit a multiple of block_tokens" in shown.detail

    def ceil_any(hit: int, block_tokens: int) -> int:
        return -(-hit // block_tokens)

    def floor_any(hit: int, block_tokens: int) -> int:
        return hit // block_tokens

    differs = compare(ceil_any, floor_any)
    assert differs.equivalent is False and differs.distinguishing_input is not None


def _kvcontract(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvcontract", "mutate", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, message", [
    (("--impl", "no-such-impl"), "unknown implementation"),
    (("--sample", "0"), "--sample must be a positive integer"),
    (("--sample", "many"), "many"),
    (("--jobs", "0"), "--jobs must be at least 1"),
    (("--function", "no_such_function"), "no function no_such_function"),
    (("--fail-under", "101"), "--fail-under"),
    (("--impl", "module:missing_file.py"), "no such file"),
])
def test_cli_argument_errors_exit_2(args: tuple[str, ...], message: str) -> None:
    run = _kvcontract(*args)
    assert run.returncode == 2, run.stdout + run.stderr
    assert message in run.stderr


def test_cli_json_shape_and_fail_under(tmp_path: Path) -> None:
    report = tmp_path / "m.json"
    run = _kvcontract("--function", "store_final_segment_end", "--no-fuzz", "--jobs", "1",
                      "--json", str(report), "--fail-under", "0")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "mutation score" in run.stdout
    data = json.loads(report.read_text())
    assert data["version"] == 1 and data["command"] == "mutate"
    assert data["target"] == "reference"
    assert set(data) >= {"score", "killed", "survived", "equivalent", "timeout", "mutants",
                         "by_operator", "baseline", "seconds_per_mutant", "total_points"}
    assert data["mutants"], data
    for mutant in data["mutants"]:
        assert mutant["status"] in {"killed", "survived", "equivalent", "timeout"}
        assert mutant["location"].startswith("impl/reference.py:")
        assert mutant["function"] == "store_final_segment_end"
        assert {"before", "after", "operator", "should_be_caught_by", "killed_by"} <= set(mutant)
    scored = data["killed"] + data["survived"]
    assert data["score"] == (round(data["killed"] / scored, 4) if scored else None)


def test_module_file_stands_in_for_the_reference(tmp_path: Path) -> None:
    patch = tmp_path / "patch.py"
    patch.write_text(textwrap.dedent('''
        def store_final_segment_end(status, prompt_horizon_chunks, current_chunks,
                                    retention_interval):
            if status in ENDED_STATUSES:
                return current_chunks
            return prompt_horizon_chunks
    '''))
    target = resolve_target(f"module:{patch}")
    assert [m.name for m in target.modules] == [REFERENCE_MODULE]
    assert {p.function for p in target.points()} == {"store_final_segment_end"}
    not_python = tmp_path / "notes.py"
    not_python.write_text("x = 1\n")
    with pytest.raises(Exception, match="must define functions"):
        resolve_target(f"module:{not_python}")


def test_a_module_file_that_does_not_import_is_a_usage_error(tmp_path: Path) -> None:
    patch = tmp_path / "broken.py"
    patch.write_text("import kvcontract_no_such_module\n\n"
                     "def store_final_segment_end(status, prompt_horizon_chunks, "
                     "current_chunks, retention_interval):\n"
                     "    return current_chunks - 1\n")
    run = _kvcontract("--impl", f"module:{patch}", "--no-fuzz", "--jobs", "1")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "kvcontract_no_such_module" in run.stderr
