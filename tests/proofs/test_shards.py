"""``--shard I/N`` (proofs/shards.py, the prover's partition) and ``--fail-fast``."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcontract.errors import UsageError
from kvcontract.impl.variants import get_implementation
from kvcontract.proofs.runner import _costs, _groups, catalog, prove, select
from kvcontract.proofs.shards import Shard, parse_shard, partition
from kvcontract.proofs.theorem import run_property
from kvcontract.proofs.verdicts import Verdict
from kvcontract.spec.properties import get_property


@pytest.mark.parametrize(("text", "shard"), [("1/1", Shard(1, 1)), ("2/3", Shard(2, 3)),
                                             (" 3/3 ", Shard(3, 3)), (None, None)])
def test_parse_shard(text: str | None, shard: Shard | None) -> None:
    assert parse_shard(text) == shard


@pytest.mark.parametrize("text", ["0/3", "4/3", "1/0", "3", "a/b", "1/2/3", "-1/2", "1/5000"])
def test_parse_shard_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--shard"):
        parse_shard(text)


def test_partition_is_deterministic_complete_and_balanced() -> None:
    costs = [5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0, 2.0]
    groups = partition(costs, 3)
    assert groups == partition(list(costs), 3)
    assert sorted(i for g in groups for i in g) == list(range(len(costs)))
    assert all(g == sorted(g) for g in groups)
    totals = sorted(sum(costs[i] for i in g) for g in groups)
    assert totals == [5.0, 5.0, 6.0]
    assert partition([], 2) == [[], []]
    assert partition([1.0], 3) == [[0], [], []]


def test_families_stay_whole_and_the_catalogue_costs_are_static() -> None:
    theorems = catalog()
    groups = _groups(theorems, select(None))
    families = [g for g in groups if len(g) > 1]
    assert families, "the lookup, scan and store families have several members"
    for group in families:
        assert len({theorems[i].family for i in group}) == 1  # type: ignore[union-attr]
    assert sorted(i for g in groups for i in g) == select(None)
    assert _costs(theorems, groups) == _costs(theorems, groups)


def test_prover_shards_cover_the_selection_once() -> None:
    reports = [prove("reference", ["C1", "C9", "C10"], jobs=1, shard=Shard(i, 3))
               for i in (1, 2, 3)]
    positions = sorted(p for r in reports for p in (r.shard or {})["positions"])
    whole = prove("reference", ["C1", "C9", "C10"], jobs=1)
    assert positions == list(range(len(whole.results)))
    ids = sorted(f"{x.clause}/{x.theorem}" for r in reports for x in r.results)
    assert ids == sorted(f"{x.clause}/{x.theorem}" for x in whole.results)
    assert all(r.shard is not None and r.shard["count"] == 3 for r in reports)


def test_fail_fast_stops_at_the_first_failing_counterexample() -> None:
    fast = prove("unaligned-hit", ["C1", "C2"], jobs=1, fail_fast=True)
    assert fast.exit_code == 1
    assert fast.not_run, "stopped before the expensive theorems (cheapest first)"
    assert len(fast.results) + len(fast.not_run) == len(select(["C1", "C2"]))
    assert not {f"{r.clause}/{r.theorem}" for r in fast.results} & set(fast.not_run)
    found = [r for r in fast.results if r.verdict is Verdict.COUNTEREXAMPLE]
    assert [f"{r.clause}/{r.theorem}" for r in found] == ["C2/first-run-covers-load"]
    # The counterexample is the one the theorem has without --fail-fast.
    alone = run_property(get_property("C2/first-run-covers-load"),
                         get_implementation("unaligned-hit"))
    assert found[0].witness == alone.witness
    assert fast.to_json()["not_run"] == fast.not_run


def test_fail_fast_ends_running_workers() -> None:
    fast = prove("unaligned-hit", ["C1", "C2"], jobs=2, fail_fast=True)
    assert fast.exit_code == 1 and fast.not_run


def test_the_api_takes_shard_cache_and_fail_fast(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import kvcontract.api as api

    monkeypatch.setenv("KVCONTRACT_CACHE_DIR", str(tmp_path))
    first = api.prove("reference", ["C1"], jobs=1, shard=(1, 2), cache=True)
    second = api.prove("reference", ["C1"], jobs=1, shard="2/2", cache=True)
    assert first.shard is not None and second.shard is not None
    assert len(first.results) + len(second.results) == len(select(["C1"]))
    assert any(tmp_path.rglob("*.json"))
    assert all(api.prove("reference", ["C1"], jobs=1, shard=(1, 2), cache=True).cached)
    assert not api.prove("reference", ["C1"], jobs=1).cached  # off by default
    for bad in ((0, 2), (1, 2, 3), "1-2", 3):
        with pytest.raises(UsageError, match="shard"):
            api.prove("reference", ["C1"], jobs=1, shard=bad)  # type: ignore[arg-type]
