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
from typing import Any

import pytest

from kvcontract.tools.mutate.campaign import _job, plan, run_job
from kvcontract.tools.mutate.equivalence import (
    MESSAGE_FIELDS,
    UPDATE_METHODS,
    SourceIndex,
    compare,
    syntactic_equivalence,
)
from kvcontract.tools.mutate.operators import (
    OPERATORS,
    enumerate_points,
    function_source,
    mutate_tree,
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


# -- equivalence read off the source (issue 30) ---------------------------------------------
SYNTACTIC = textwrap.dedent('''
    from dataclasses import dataclass, field


    @dataclass
    class LookupOutcome:
        reason: str = ""
        pairs: list[tuple[int, int]] = field(default_factory=list)
        codes: list[int] = field(default_factory=list)


    @dataclass
    class Other:
        reason: str = ""
        pairs: list[tuple[int, int]] = field(default_factory=list)


    @dataclass
    class StoreTracker:
        unstorable: set[int] = field(default_factory=set)
        offered: set[int] = field(default_factory=set)

        def step(self, chunk, bad):
            if bad > 2:
                self.unstorable.add(chunk)
            if bad > 3:
                self.offered.add(chunk)
            return chunk


    def bounds(end, next_after):
        if end > next_after:
            next_after = end
        return next_after


    def not_idempotent(end, next_after):
        if end > next_after:
            next_after = end + 1
        return next_after


    def flows(n):
        outcome = LookupOutcome()
        outcome.pairs.extend((n, k) for k in range(n))
        if outcome.pairs:
            g = outcome.pairs[0][0]
            outcome.reason = f"group {g} is busy"
            return outcome
        return outcome


    def escapes(n):
        outcome = LookupOutcome()
        outcome.pairs.append((n, n))
        if outcome.pairs:
            g = outcome.pairs[0][0]
            outcome.reason = f"group {g} is busy"
            return g
        return outcome


    def undeclared(n):
        outcome = LookupOutcome()
        outcome.codes.append(n)
        if outcome.codes:
            g = outcome.codes[0]
            outcome.reason = f"code {g}"
            return outcome
        return outcome


    def not_a_message(n):
        outcome = Other()
        outcome.pairs.append((n, n))
        if outcome.pairs:
            g = outcome.pairs[0][0]
            outcome.reason = f"group {g} is busy"
            return outcome
        return outcome


    def raises(n):
        if n > 3:
            raise ValueError(n + 1)
        return n


    def step(eagle, n):
        peek = 1 if eagle else 0
        return n + peek


    def count(eagle, n):
        return n + eagle


    def drive(impl, group, n):
        return impl.step(1 if group.eagle else 0, n)


    def drive_count(impl, group, n):
        return impl.count(1 if group.eagle else 0, n)


    def slot(position, first_live_page, nulls_before):
        return position


    def slot_read(position, first_live_page, nulls_before):
        return position - nulls_before


    def place(impl, pages):
        laid = []
        first = None
        nulls = 0
        for position, live in enumerate(pages):
            if not live:
                nulls += 1
                continue
            if first is None:
                first = position
            laid.append(impl.slot(position, first, nulls))
        return laid


    def place_read(impl, pages):
        nulls = 0
        for position, live in enumerate(pages):
            if not live:
                nulls += 1
        return impl.slot_read(0, 0, nulls)


    def place_returned(impl, pages):
        nulls = 0
        for live in pages:
            if not live:
                nulls += 1
        return impl.slot(0, 0, nulls), nulls
''')
TOY_INDEX = SourceIndex({"toy": (SYNTACTIC, None)},
                        {"step": ("toy", "step"), "count": ("toy", "count"),
                         "slot": ("toy", "slot"), "slot_read": ("toy", "slot_read")})


def _shown(function: str, after: str) -> str | None:
    """The syntactic rule's detail for the toy's mutant of ``function`` whose changed
    line contains ``after`` (None: not shown)."""
    points = [p for p in enumerate_points(SYNTACTIC, "toy", "toy.py", {function})
              if after in p.after]
    assert points, (function, after)
    found = {(lambda e: None if e is None else e.detail)(
        syntactic_equivalence(SYNTACTIC, p, TOY_INDEX)) for p in points}
    assert len(found) == 1, found
    return found.pop()


def _shown_without_sources(function: str, after: str) -> Any:
    """The syntactic rules' answer for the toy's first mutant of ``function`` whose
    changed line contains ``after``, with no source index (no callee to read)."""
    point = next(p for p in enumerate_points(SYNTACTIC, "toy", "toy.py", {function})
                 if after in p.after)
    return syntactic_equivalence(SYNTACTIC, point, None)


def test_an_assignment_that_cannot_change_a_value_is_equivalent() -> None:
    detail = _shown("bounds", "if end >= next_after:")
    assert detail is not None and "idempotent assignment" in detail
    # The same guard over a different assignment changes the value at equality.
    assert _shown("not_idempotent", "if end >= next_after:") is None
    assert _shown("bounds", "if not end > next_after:") is None  # every case differs


def test_a_value_that_only_reaches_a_message_is_equivalent() -> None:
    # The index of a declared tuple[int, int], read only by the message before return.
    detail = _shown("flows", "g = outcome.pairs[0][1]")
    assert detail is not None and "message only" in detail and "tuple[int, int]" in detail
    assert _shown("flows", "g = outcome.pairs[0][-1]") is not None
    # The list's own index may leave it: not shown.
    assert _shown("flows", "g = outcome.pairs[1][0]") is None
    # Returned as well as printed: behaviour.
    assert _shown("escapes", "g = outcome.pairs[0][1]") is None
    # A list[int] has no declared length.
    assert _shown("undeclared", "g = outcome.codes[1]") is None
    # Another class's `reason` is not declared a message (MESSAGE_FIELDS).
    assert _shown("not_a_message", "g = outcome.pairs[0][1]") is None
    # A branch that only adds to a declared report, and one that changes behaviour.
    detail = _shown("StoreTracker.step", "if bad >= 2:")
    assert detail is not None and "self.unstorable.add(chunk)" in detail
    assert _shown("StoreTracker.step", "if bad >= 3:") is None  # guards `offered`
    # Inside the exception's arguments, with nothing that can raise.
    detail = _shown("raises", "raise ValueError(n + 2)")
    assert detail is not None and "message of `raise" in detail
    assert _shown("raises", "if n > 4:") is None  # the test decides whether it raises


def test_a_flag_argument_changed_to_another_true_value_is_equivalent() -> None:
    detail = _shown("drive", "impl.step(2 if group.eagle else 0, n)")
    assert detail is not None and "flag argument" in detail and "`eagle`" in detail
    assert _shown("drive", "impl.step(0 if group.eagle else 0, n)") is None  # truth changes
    assert _shown("drive", "impl.step(1 if group.eagle else 1, n)") is None
    # A callee that counts with it: not a flag.
    assert _shown("drive_count", "impl.count(2 if group.eagle else 0, n)") is None
    assert _shown_without_sources("drive", "2 if") is None  # no callee source


def test_a_value_only_an_unread_parameter_receives_is_equivalent() -> None:
    detail = _shown("place", "nulls += 2")
    assert detail is not None and "unread argument" in detail and "slot(nulls_before)" in detail
    detail = _shown("place", "if not first is None:")
    assert detail is not None and "slot(first_live_page)" in detail
    assert _shown("place", "if not not live:") is None  # decides what is laid
    # The callee reads the parameter, or the value escapes: behaviour.
    assert _shown("place_read", "nulls += 2") is None
    assert _shown("place_returned", "nulls += 2") is None
    assert _shown_without_sources("place", "nulls += 2") is None  # no callee source


def test_the_unread_argument_rule_follows_the_target() -> None:
    """The placement driver's null count is unread by the reference's slot, read by the
    variant whose slot counts nulls (first-block-null-offset): equivalent for the one,
    not for the other."""
    for name, shown in (("reference", True), ("first-block-null-offset", False)):
        target = resolve_target(name)
        index = SourceIndex({m.name: (m.source, m.base_source) for m in target.modules},
                            dict(target.field_functions))
        point = next(p for p in target.points(["store_job_placement"])
                     if "nulls += 2" in p.after)
        found = syntactic_equivalence(target.module(point.module).source, point, index)
        assert (found is not None) is shown, name


def _reference_point(function: str, before: str, after: str) -> Any:
    target = resolve_target("reference")
    found = [p for p in target.points([function]) if before in p.before and after in p.after]
    assert len(found) == 1, found
    return target, found[0]


@pytest.mark.parametrize("function, before, after, rule", [
    # The issue's survivors shown equivalent (docs/MUTANTS.md).
    ("store_step_bounds", "if end > next_after:", "if end >= next_after:",
     "idempotent assignment"),
    ("lookup_complete_chunks", "1 if drops else 0", "2 if drops else 0",
     "flag argument"),
    ("multigroup_lookup_step", "if max_hit > num_keys * tokens_per_chunk:",
     "if max_hit >= num_keys * tokens_per_chunk:", "idempotent assignment"),
    ("store_job_placement", "nulls = 0", "nulls = 1", "unread argument"),
])
def test_the_issue_s_equivalent_survivors_are_shown(function: str, before: str, after: str,
                                                    rule: str) -> None:
    target, point = _reference_point(function, before, after)
    index = SourceIndex({m.name: (m.source, m.base_source) for m in target.modules},
                        dict(target.field_functions))
    shown = syntactic_equivalence(target.module(point.module).source, point, index)
    assert shown is not None and shown.equivalent and shown.method == "syntactic"
    assert rule in shown.detail


@pytest.mark.parametrize("function, before, after", [
    # The issue's real survivors: killed by new theorems, never claimed equivalent.
    ("is_block_reachable", "tail_start <= block < final_segment_end_block",
     "tail_start <= block <= final_segment_end_block"),
    ("store_replay_boundaries", "extension = prompt_len // unit * unit",
     "extension = -(-prompt_len // unit) * unit"),
    ("store_replay_boundaries", "if boundary > 0", "if boundary > 1"),
])
def test_the_issue_s_real_survivors_are_not_claimed(function: str, before: str,
                                                    after: str) -> None:
    target, point = _reference_point(function, before, after)
    index = SourceIndex({m.name: (m.source, m.base_source) for m in target.modules},
                        dict(target.field_functions))
    assert syntactic_equivalence(target.module(point.module).source, point, index) is None


def test_every_syntactic_claim_on_a_comparable_function_agrees_with_the_comparison() -> None:
    """Cross-check: where the Z3/grid comparison applies (parameters of known domain), it
    never shows a difference for a mutant a syntactic rule calls equivalent."""
    import ast
    import types

    target = resolve_target("reference")
    index = SourceIndex({m.name: (m.source, m.base_source) for m in target.modules},
                        dict(target.field_functions))
    checked = 0
    for point in target.points():
        source = target.module(point.module).source
        if syntactic_equivalence(source, point, index) is None:
            continue
        if "." in point.function:
            continue
        loaded = []
        for name, tree in (("original", ast.parse(source)),
                           ("mutant", mutate_tree(source, point))):
            module = types.ModuleType(f"kvcontract_test_{name}")
            sys.modules[module.__name__] = module  # dataclasses look their module up
            try:
                exec(compile(tree, f"{name}.py", "exec"), module.__dict__)
            finally:
                del sys.modules[module.__name__]
            loaded.append(module)
        original, module = loaded
        outcome = compare(getattr(original, point.function), getattr(module, point.function))
        if outcome.method == "none":
            continue
        checked += 1
        assert outcome.equivalent is not False, (point.id, outcome.detail)
    assert checked >= 2  # the comparable claims (a guarded assignment in each)


def test_a_finished_request_is_compared_in_the_contract_s_finished_states() -> None:
    """``tokens = num_tokens - 1`` on finish, then clamped to the computed tokens: without
    the ``- 1`` the clamp alone leaves the final sampled slot out in every finished state
    vLLM produces (all but that slot computed, or an error finish before the prompt's
    end), so the mutant is equivalent there; ``- 2`` is not."""
    import ast
    import types

    target = resolve_target("reference")

    def compared(after: str) -> Any:
        point = next(p for p in target.points(["get_num_offloadable_tokens"])
                     if p.before.strip() == "tokens = num_tokens - 1"
                     and p.after.strip() == after)
        source = target.module(point.module).source
        loaded = []
        for name, tree in (("original", ast.parse(source)),
                           ("mutant", mutate_tree(source, point))):
            module = types.ModuleType(f"kvcontract_finished_{name}")
            sys.modules[module.__name__] = module
            try:
                exec(compile(tree, f"{name}.py", "exec"), module.__dict__)
            finally:
                del sys.modules[module.__name__]
            loaded.append(module.get_num_offloadable_tokens)
        return compare(*loaded)

    shown = compared("tokens = num_tokens")
    assert shown.equivalent is True and "a finished request all but its final" in shown.detail
    assert compared("tokens = num_tokens - 2").equivalent is False


def test_message_fields_are_read_by_nothing_the_contract_observes() -> None:
    """The declared message fields are written, never read: a lookup's ``reason`` by no
    caller of ``lookup_complete_chunks`` (the property layer, C12, the system), a store
    tracker's ``unstorable`` by no code of the package at all (only added to)."""
    import ast

    callers = 0
    package = [path for folder in ("spec", "impl", "proofs", "tools", "kvcontract", "live")
               for path in ROOT.joinpath(folder).rglob("*.py")]
    # Each declared field is scanned below: a new one needs its own scan here.
    assert {"LookupOutcome": {"reason"}, "StoreTracker": {"unstorable"}} == MESSAGE_FIELDS
    for path in package:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Call)
                 and getattr(node.value.func, "id", None) == "lookup_complete_chunks"
                 for t in node.targets if isinstance(t, ast.Name)}
        callers += bool(bound)
        updates = {id(node.value) for node in ast.walk(tree)
                   if isinstance(node, ast.Attribute) and node.attr in UPDATE_METHODS}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
                continue
            if node.attr == "reason" and isinstance(node.value, ast.Name) and (
                    node.value.id in bound):
                raise AssertionError(f"{path}:{node.lineno} reads {node.value.id}.reason")
            if node.attr == "unstorable" and id(node) not in updates:
                raise AssertionError(f"{path}:{node.lineno} reads .unstorable")
    assert callers >= 3


# -- shards and merge ---------------------------------------------------------------------------
def _fake_report(prepared: Any, statuses: str) -> dict[str, Any]:
    """A campaign report of ``prepared``'s mutants with the given statuses (k: killed,
    s: survived, e: equivalent), as a shard writes it, without running anything."""
    from kvcontract.tools.mutate.campaign import Baseline, MutantResult, MutationReport

    names = {"k": "killed", "s": "survived", "e": "equivalent"}
    mutants = [MutantResult(p, names[statuses[i % len(statuses)]], "", prepared.judges_of(p))
               for i, p in enumerate(prepared.points)]
    report = MutationReport(
        target="reference", total_points=prepared.total_points, sample=None, seed=0,
        mutants=mutants, baseline=Baseline({"C1/x": "PROVED"}, {}, [], [], 1.0),
        seconds=10.0 + len(mutants), jobs=2, fuzz=False,
        shard=None if prepared.shard is None else {**prepared.shard, "fuzz": False})
    return report.to_json()


def test_shards_partition_the_campaign_exactly_once() -> None:
    from kvcontract.proofs.shards import Shard

    whole = plan("reference", functions=["store_final_segment_end", "segment_blocks"])
    shards = [plan("reference", functions=["store_final_segment_end", "segment_blocks"],
                   shard=Shard(i, 3)) for i in (1, 2, 3)]
    positions = sorted(p for s in shards for p in (s.shard or {})["positions"])
    assert positions == list(range(len(whole.points)))
    for s in shards:
        section = s.shard or {}
        assert section["mutants"] == [p.id for p in s.points]
        assert [whole.points[i] for i in section["positions"]] == s.points
    assert len({(s.shard or {})["selection"] for s in shards}) == 1
    again = plan("reference", functions=["store_final_segment_end", "segment_blocks"],
                 shard=Shard(2, 3))
    assert again.points == shards[1].points  # static: the same split every time


def test_merge_puts_the_shards_mutants_back_and_rescores() -> None:
    from kvcontract.errors import UsageError
    from kvcontract.proofs.shards import Shard
    from kvcontract.tools.reports.merge import merge_mutate

    functions = ["store_final_segment_end", "segment_blocks"]
    whole = plan("reference", functions=functions)
    parts = [plan("reference", functions=functions, shard=Shard(i, 2)) for i in (1, 2)]
    reports = [(f"s{i}.json", _fake_report(p, "kse" if i == 1 else "ks"))
               for i, p in enumerate(parts, start=1)]
    merged = merge_mutate(reports)
    assert [m["id"] for m in merged["mutants"]] == [p.id for p in whole.points]
    statuses = [m["status"] for m in merged["mutants"]]
    assert merged["killed"] == statuses.count("killed")
    assert merged["survived"] == statuses.count("survived")
    assert merged["equivalent"] == statuses.count("equivalent")
    assert merged["score"] == round(merged["killed"] / (merged["killed"]
                                                        + merged["survived"]), 4)
    assert merged["shards"] == 2 and len(merged["shard_seconds"]) == 2
    assert merged["seconds"] == max(merged["shard_seconds"])
    with pytest.raises(UsageError, match="missing"):
        merge_mutate(reports[:1])
    edited = json.loads(json.dumps(reports[1][1]))
    edited["mutants"] = edited["mutants"][::-1]
    if len(edited["mutants"]) > 1:
        with pytest.raises(UsageError, match="not the ones its shard lists"):
            merge_mutate([reports[0], ("s2.json", edited)])
    other_seed = json.loads(json.dumps(reports[1][1]))
    other_seed["shard"]["seed"] = 7
    with pytest.raises(UsageError, match="seed"):
        merge_mutate([reports[0], ("s2.json", other_seed)])


def test_cli_lists_shards_and_merges_mutate_reports(tmp_path: Path) -> None:
    from kvcontract.proofs.shards import Shard

    listed = _kvcontract("--list", "--function", "store_final_segment_end")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    points = plan("reference", functions=["store_final_segment_end"]).points
    assert [line.split("\t")[0] for line in lines] == [p.id for p in points]
    assert _kvcontract("--list", "--shard", "3/2").returncode == 2
    functions = ["store_final_segment_end", "segment_blocks"]
    files = []
    for i, statuses in ((1, "ks"), (2, "kss")):
        path = tmp_path / f"mutate-{i}.json"
        path.write_text(json.dumps(_fake_report(
            plan("reference", functions=functions, shard=Shard(i, 2)), statuses)))
        files.append(str(path))
    merged = tmp_path / "merged.json"
    run = subprocess.run([sys.executable, "-m", "kvcontract", "merge", *files, "--json",
                          str(merged), "--fail-under", "100"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr  # survivors: below 100%
    assert "mutation score" in run.stdout and "2 shards" in run.stdout
    data = json.loads(merged.read_text())
    assert data["command"] == "mutate" and len(data["mutants"]) == len(
        plan("reference", functions=functions).points)
    run = subprocess.run([sys.executable, "-m", "kvcontract", "merge", *files,
                          "--format", "sarif", "--output", str(tmp_path / "x.sarif")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "campaign report" in run.stderr


def test_the_nightly_workflow_runs_every_shard_and_merges() -> None:
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load((ROOT / "examples" / "github-actions" / "mutation-nightly.yml")
                          .read_text())
    shards = int(data["env"]["SHARDS"])
    mutate_job, merge_job = data["jobs"]["mutate"], data["jobs"]["merge"]
    assert mutate_job["strategy"]["matrix"]["shard"] == list(range(1, shards + 1))
    runs = " ".join(step.get("run", "") for step in mutate_job["steps"])
    assert "kvcontract mutate" in runs and "--shard" in runs and "--json" in runs
    assert "--sample" not in runs  # the whole campaign
    merged = " ".join(step.get("run", "") for step in merge_job["steps"])
    assert "kvcontract merge" in merged and "--fail-under" in merged
    assert merge_job["needs"] == "mutate"


def test_the_loop_turn_is_compared_on_the_states_the_loop_reaches() -> None:
    """The multi-group loop's turn takes its scan as a callback and two flags the loop
    keeps related (deferred implies confirmed, C6's invariant): Z3 compares two turns
    with the scan uninterpreted, on those states only."""
    def needs_invariant(confirmed: bool, deferred: bool) -> bool:
        return deferred and not confirmed  # never true on the loop's states

    def never(confirmed: bool, deferred: bool) -> bool:
        return False

    def differs(confirmed: bool, deferred: bool) -> bool:
        return confirmed and not deferred

    shown = compare(needs_invariant, never)
    assert shown.equivalent is True and "deferred implies confirmed" in shown.detail
    assert compare(differs, never).equivalent is False

    def turn(max_hit: int, confirmed: bool, deferred: bool, local_hit: int,
             tokens_per_chunk: int, num_keys: int, eagle: bool, mamba: bool,
             scan: Any) -> Any:
        found = scan(local_hit, num_keys, max_hit, False)
        return max_hit if found is None else found

    def turn_other_range(max_hit: int, confirmed: bool, deferred: bool, local_hit: int,
                         tokens_per_chunk: int, num_keys: int, eagle: bool, mamba: bool,
                         scan: Any) -> Any:
        found = scan(local_hit, num_keys + 1, max_hit, False)  # other keys, other answer
        return max_hit if found is None else found

    refuted = compare(turn, turn_other_range)
    assert refuted.equivalent is False and refuted.distinguishing_input is not None
    assert "scan" in refuted.distinguishing_input


def test_the_reference_turn_s_boundary_test_at_equality_is_equivalent() -> None:
    """`if boundary < max_hit` turned `<=` (a survivor of seed 202): at equality the turn
    confirms the boundary either way, the deferral flag being False on every state the
    loop calls it in; a turn that drops its confirmed check differs."""
    import types

    target = resolve_target("reference")
    source = target.module(REFERENCE_MODULE).source
    original = types.ModuleType("original")
    exec(compile(source, "original.py", "exec"), original.__dict__)
    results = {}
    for before, after in (("if boundary < max_hit:", "if boundary <= max_hit:"),
                          ("if confirmed:", "if not confirmed:")):
        point = next(p for p in target.points(["multigroup_lookup_step"])
                     if p.before.startswith(before) and p.after.startswith(after))
        mutant = types.ModuleType("mutant")
        exec(compile(mutate_tree(source, point), "mutant.py", "exec"), mutant.__dict__)
        results[after] = compare(original.multigroup_lookup_step,
                                 mutant.multigroup_lookup_step)
    assert results["if boundary <= max_hit:"].equivalent is True
    assert results["if not confirmed:"].equivalent is False
