"""``kvcontract prove/fuzz --shard I/N`` and ``kvcontract merge``: the merged shards are
the unsharded run's report; ``prove``'s cache and ``--fail-fast`` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kvcontract.tools.cli import cli
from kvcontract.tools.reports.merge import comparable

NARROW = ("--fail-on", "crash,corruption,lost-hit")
"""A --fail-on that leaves prefill-horizon's waste finding reported but passing (every
impact but latent fails by default), for the tests of --fail-on at merge time."""

CLAUSES = ["--clause", "C1", "--clause", "C9", "--clause", "C10"]
"""Three formula theorems and the store family (three members): four units of work,
cheap enough for the default suite."""


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, prog_name="kvcontract", terminal_width=200)


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _prove(tmp_path: Path, name: str, *extra: str, impl: str = "reference") -> tuple[int, Path]:
    path = tmp_path / name
    result = invoke(["prove", "--impl", impl, *CLAUSES, "--quiet", "--jobs", "1",
                     "--json", str(path), *extra])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, path


@pytest.mark.parametrize("shards", [2, 3])
def test_merged_prove_shards_equal_the_unsharded_run(tmp_path: Path, shards: int) -> None:
    code, whole = _prove(tmp_path, "whole.json", "--no-cache")
    paths = []
    for index in range(1, shards + 1):
        _, path = _prove(tmp_path, f"shard{index}.json", "--no-cache", "--shard",
                         f"{index}/{shards}")
        assert _read(path)["shard"]["index"] == index
        paths.append(str(path))
    merged_path = tmp_path / "merged.json"
    result = invoke(["merge", *reversed(paths), "--quiet", "--json", str(merged_path)])
    assert result.exit_code == code, result.output
    merged, unsharded = _read(merged_path), _read(whole)
    assert [r["theorem"] for r in merged["results"]] == \
        [r["theorem"] for r in unsharded["results"]]
    assert comparable(merged) == comparable(unsharded)
    assert "shard" not in merged


def test_merge_of_a_variant_keeps_its_exit_code_and_findings(tmp_path: Path) -> None:
    code, whole = _prove(tmp_path, "whole.json", "--no-cache", *NARROW, impl="prefill-horizon")
    paths = [str(_prove(tmp_path, f"s{i}.json", "--no-cache", "--shard", f"{i}/2", *NARROW,
                        impl="prefill-horizon")[1]) for i in (1, 2)]
    merged_path = tmp_path / "merged.json"
    result = invoke(["merge", *paths, "--json", str(merged_path)])
    assert result.exit_code == code == 0
    assert len(_read(merged_path)["defects"]) == 1  # grouped from the shards' rows
    merged = _read(merged_path)
    assert any(r["verdict"] == "COUNTEREXAMPLE" for r in merged["results"])
    assert comparable(merged) == comparable(_read(whole))
    # The gate at merge time: --fail-on all turns the waste finding into a failure.
    failing = invoke(["merge", *paths, "--quiet", "--fail-on", "all"])
    assert failing.exit_code == 1, failing.output


def test_merge_rejects_what_is_not_one_whole_run(tmp_path: Path) -> None:
    paths = [str(_prove(tmp_path, f"s{i}.json", "--shard", f"{i}/2")[1]) for i in (1, 2)]
    other = tmp_path / "other.json"  # another selection: C1 alone
    assert invoke(["prove", "--clause", "C1", "--shard", "2/2", "--quiet", "--jobs", "1",
                   "--json", str(other)]).exit_code == 0
    _, whole = _prove(tmp_path, "whole.json")
    cases = [
        ([paths[0]], "shard 2/2 missing"),
        ([paths[0], paths[0], paths[1]], "given twice"),
        ([paths[0], str(other)], "different runs"),
        ([paths[0], str(whole)], "not a shard report"),
        ([], "needs the JSON report"),
        ([str(tmp_path / "absent.json")], "absent.json"),
    ]
    for args, message in cases:
        result = invoke(["merge", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)


def test_shards_take_no_findings_baseline(tmp_path: Path) -> None:
    result = invoke(["prove", "--clause", "C1", "--shard", "1/2", "--baseline-file",
                     str(tmp_path / "b.json")])
    assert result.exit_code == 2
    assert "kvcontract merge" in result.output


def test_prove_reads_its_cache_and_no_cache_does_not(tmp_path: Path) -> None:
    _, cold = _prove(tmp_path, "cold.json")
    _, warm = _prove(tmp_path, "warm.json")
    _, fresh = _prove(tmp_path, "fresh.json", "--no-cache")
    assert not any(r.get("cached") for r in _read(cold)["results"])
    assert all(r.get("cached") is True for r in _read(warm)["results"])
    assert not any(r.get("cached") for r in _read(fresh)["results"])
    assert comparable(_read(cold)) == comparable(_read(warm)) == comparable(_read(fresh))


def test_no_cache_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "cache"
    monkeypatch.setenv("KVCONTRACT_CACHE_DIR", str(folder))
    _prove(tmp_path, "a.json", "--no-cache")
    assert not folder.exists()
    _prove(tmp_path, "b.json")
    assert any(folder.rglob("*.json"))


def test_fail_fast_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "fast.json"
    result = invoke(["prove", "--impl", "unaligned-hit", "--clause", "C1", "--clause", "C2",
                     "--fail-fast", "--no-cache", "--jobs", "1", "--json", str(path)])
    assert result.exit_code == 1, result.output
    assert "not run (--fail-fast)" in " ".join(result.output.split())
    assert _read(path)["not_run"]


def test_merged_fuzz_shards_equal_the_unsharded_run(tmp_path: Path) -> None:
    def fuzz(name: str, *extra: str) -> tuple[int, Path]:
        path = tmp_path / name
        result = invoke(["fuzz", "--impl", "stale-pending", "--examples", "0", "--quiet",
                         "--json", str(path), *extra])
        assert result.exit_code in (0, 1), result.output
        return result.exit_code, path

    code, whole = fuzz("whole.json")
    paths = [str(fuzz(f"s{i}.json", "--shard", f"{i}/2")[1]) for i in (1, 2)]
    assert all(_read(Path(p))["cases"] > 0 for p in paths)
    merged_path = tmp_path / "merged.json"
    result = invoke(["merge", *paths, "--quiet", "--json", str(merged_path)])
    assert result.exit_code == code, result.output
    unsharded = _read(whole)
    assert unsharded["differences"], "stale-pending's seed scenario shows a difference"
    assert comparable(_read(merged_path)) == comparable(unsharded)


def test_fuzz_matrix_shards_partition_the_scenarios() -> None:
    from kvcontract.proofs.shards import Shard
    from kvcontract.tools.commands.fuzz import _shard_plan
    from kvcontract.tools.fuzz import matrix_scenarios, seed_scenarios

    every = [s.name for s in [*seed_scenarios(0), *matrix_scenarios(0)]]
    plans = [_shard_plan(Shard(i, 3), matrix=True, seed=0, examples=50, scope=())
             for i in (1, 2, 3)]
    names = sorted(s.name for plan in plans for s in plan.scenarios)
    assert names == sorted(every)
    assert sum(plan.examples > 0 for plan in plans) == 1  # the state machine runs once
    positions = sorted(p for plan in plans for p in plan.positions)
    assert positions == list(range(len(every) + 1))
    again = _shard_plan(Shard(2, 3), matrix=True, seed=0, examples=50, scope=())
    assert [s.name for s in again.scenarios] == [s.name for s in plans[1].scenarios]
    assert len({plan.selection for plan in plans}) == 1
    sizes = [len(plan.scenarios) for plan in plans]
    assert min(sizes) > 0.5 * max(sizes)  # balanced by cost, roughly by count too


def test_a_configured_baseline_is_applied_by_merge(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    written = invoke(["prove", "--impl", "prefill-horizon", *CLAUSES, "--quiet", "--jobs", "1",
                      "--write-baseline", "baseline.json"])
    assert written.exit_code == 1, written.output  # the waste finding fails by default
    (tmp_path / "pyproject.toml").write_text(
        '[tool.kvcontract]\nfail-on = "all,new"\nbaseline-file = "baseline.json"\n')
    paths = [str(_prove(tmp_path, f"s{i}.json", "--shard", f"{i}/2",
                        impl="prefill-horizon")[1]) for i in (1, 2)]
    # A shard does not apply the baseline: its finding is a plain failure under "all".
    assert any(r["verdict"] == "COUNTEREXAMPLE" and "baseline_state" not in r
               for p in paths for r in _read(Path(p))["results"])
    merged_path = tmp_path / "merged.json"
    result = invoke(["merge", *paths, "--quiet", "--json", str(merged_path)])
    assert result.exit_code == 0, result.output  # every finding is in the baseline
    merged = _read(merged_path)
    states = {r.get("baseline_state") for r in merged["results"]
              if r["verdict"] == "COUNTEREXAMPLE"}
    assert states == {"baseline"}
    assert merged["findings_baseline"]["only_new"] is True


# -- audit shards (issue 11) --------------------------------------------------------------
AUDIT = ["--clause", "C1", "--clause", "C9", "--clause", "C10", "--clause", "C11"]
"""On the built-in prefill-horizon: three formula theorems, the store walk and the seed
scenarios; waste findings in C9 from the walk and from two scenarios, whose rows sort
between C9's theorems and C10 (about 2 s)."""


def _audit(tmp_path: Path, name: str, *extra: str, target: str = "prefill-horizon",
           clauses: list[str] | None = None) -> tuple[int, Path]:
    path = tmp_path / name
    result = invoke(["audit", "--target", target, *(AUDIT if clauses is None else clauses),
                     "--quiet", "--jobs", "2", "--json", str(path), *extra])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, path


def _audit_shards(tmp_path: Path, count: int, *extra: str, prefix: str = "a",
                  **kwargs: Any) -> list[str]:
    return [str(_audit(tmp_path, f"{prefix}{i}.json", "--shard", f"{i}/{count}", *extra,
                       **kwargs)[1]) for i in range(1, count + 1)]


@pytest.mark.parametrize("count", [2, 3])
def test_merged_audit_shards_equal_the_unsharded_audit(tmp_path: Path, count: int) -> None:
    code, whole = _audit(tmp_path, "whole.json", *NARROW)
    paths = _audit_shards(tmp_path, count, *NARROW)
    merged_path = tmp_path / "merged.json"
    result = invoke(["merge", *reversed(paths), "--quiet", "--json", str(merged_path)])
    assert result.exit_code == code == 0, result.output  # waste is outside --fail-on
    unsharded, merged = _read(whole), _read(merged_path)
    rows = [(r["clause"], r["theorem"], r["verdict"]) for r in unsharded["results"]]
    assert ("C9", "system[seed004-prefill-horizon]", "COUNTEREXAMPLE") in rows
    assert [(r["clause"], r["theorem"], r["verdict"]) for r in merged["results"]] == rows
    assert comparable(merged) == comparable(unsharded)
    # --fail-on at merge time, as for prove: the waste findings now fail the run.
    failing = invoke(["merge", *paths, "--quiet", "--fail-on", "all"])
    assert failing.exit_code == 1, failing.output


def test_merged_audit_takes_the_findings_baseline(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    _audit(tmp_path, "first.json", "--write-baseline", str(baseline))
    gate = ["--baseline-file", str(baseline), "--fail-on", "all,new"]
    code, whole = _audit(tmp_path, "whole.json", *gate)
    paths = _audit_shards(tmp_path, 2, "--fail-on", "all")
    merged_path = tmp_path / "merged.json"
    result = invoke(["merge", *paths, "--quiet", "--json", str(merged_path), *gate])
    assert result.exit_code == code == 0, result.output  # every finding is accepted
    merged = _read(merged_path)
    states = {r.get("baseline_state") for r in merged["results"]
              if r["verdict"] == "COUNTEREXAMPLE"}
    assert states == {"baseline"}
    assert merged["findings_baseline"]["only_new"] is True
    assert comparable(merged) == comparable(_read(whole))
    # Without the baseline, the same shards fail under --fail-on all.
    assert invoke(["merge", *paths, "--quiet"]).exit_code == 1


def test_merge_rejects_what_is_not_one_whole_audit(tmp_path: Path) -> None:
    paths = _audit_shards(tmp_path, 2)
    # Second shards of other runs: fewer clauses, another budget, another target.
    _, other_clauses = _audit(tmp_path, "c2.json", "--shard", "2/2",
                              clauses=["--clause", "C1", "--clause", "C9"])
    _, other_budget = _audit(tmp_path, "b2.json", "--shard", "2/2", "--budget", "100")
    _, other_target = _audit(tmp_path, "t2.json", "--shard", "2/2", target="reference")
    _, whole = _audit(tmp_path, "whole.json")
    _, prove_shard = _prove(tmp_path, "prove2.json", "--shard", "2/2")
    edited = tmp_path / "edited.json"
    data = _read(Path(paths[1]))
    data["shard"]["row_keys"] = data["shard"]["row_keys"][1:]
    edited.write_text(json.dumps(data))
    cases = [
        ([paths[0]], "shard 2/2 missing"),
        ([paths[1], paths[1]], "given twice"),
        ([paths[0], str(other_clauses)], "the size of the work list"),
        ([paths[0], str(other_budget)], "differ in --budget"),
        ([paths[0], str(other_target)], "differ in 'target'"),
        ([paths[0], str(prove_shard)], "'command'"),
        ([paths[0], str(whole)], "not a shard report"),
        ([paths[0], str(edited)], "row_keys"),
    ]
    for args, message in cases:
        result = invoke(["merge", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in " ".join(result.output.split()), (args, result.output)
        assert "Traceback" not in result.output
    # The same shards, complete, merge (exit 1: the waste findings fail by default).
    assert invoke(["merge", *paths, "--quiet"]).exit_code == 1
