"""The audit's speed devices change nothing it finds (issue 9): remembered implementation
calls, families walked together over their shared cases, and the scoped scenarios in
shards."""

from __future__ import annotations

from typing import Any

import pytest
from audit_releases import release_tree

from kvcontract.spec.models import preset_geometries
from kvcontract.spec.properties import CaseProperty
from kvcontract.spec.properties.scoped import scoped_properties
from kvcontract.tools.audit import derived_spaces, engine, store, system
from kvcontract.tools.audit.binding import bind
from kvcontract.tools.audit.engine import AuditOptions
from kvcontract.tools.audit.lookup import upstream_lookup_theorems
from kvcontract.tools.audit.targets import resolve_target


# -- remembered calls ---------------------------------------------------------------------
def test_remembered_calls_return_what_the_function_returns() -> None:
    calls: list[tuple[Any, ...]] = []

    def fn(*args: Any) -> Any:
        calls.append(args)
        return ("bool" if args and args[0] is True else "int", len(calls))

    remembered = engine._remembered(fn)
    assert remembered(1, (2, 3), None) == ("int", 1)
    assert remembered(1, (2, 3), None) == ("int", 1)  # remembered
    assert remembered(True, (2, 3), None) == ("bool", 2)  # True == 1, but another call
    assert remembered([1], 2) == ("int", 3)  # a list argument: never remembered
    assert remembered([1], 2) == ("int", 4)
    assert len(calls) == 4


def test_remembered_calls_never_remember_a_raise_or_a_list() -> None:
    count = [0]

    def raises(x: int) -> int:
        count[0] += 1
        raise ValueError(x)

    remembered = engine._remembered(raises)
    for _ in range(2):
        with pytest.raises(ValueError):
            remembered(3)
    assert count[0] == 2

    def listing(x: int) -> list[int]:
        return [x]

    remembered_list = engine._remembered(listing)
    first = remembered_list(1)
    first.append(2)  # a caller may mutate a list: the next call gets a fresh one
    assert remembered_list(1) == [1]


# -- families walked together ---------------------------------------------------------------
def _scoped_bound(version: str, model: str) -> tuple[Any, list[Any]]:
    binding = bind(resolve_target(f"vllm:{release_tree(version)}"))
    scope = tuple(preset_geometries(model))[:1]
    return binding, list(scoped_properties(scope))


def _plain_rows(rows: list[tuple[Any, Any]]) -> list[Any]:
    return [(r.verdict, r.witness, r.message, r.impact, r.latent, r.queries, r.domain)
            for r, _ in rows]


@pytest.mark.parametrize("version", ["0.33.0"])
def test_a_shared_walk_finds_what_separate_passes_find(version: str) -> None:
    """The store family and upstream's (its cases less the Mamba geometries), the lookup
    family and upstream's: walked together, every theorem gets the verdict, witness,
    message and case count of a pass of its own, within the budget or past it."""
    binding, theorems = _scoped_bound(version, "gpt-oss-20b-eagle3")
    impl = binding.implementation
    stores = [t for t in theorems if isinstance(t, CaseProperty) and t.family == "store"]
    lookups = [t for t in theorems if isinstance(t, CaseProperty) and t.family == "lookup"]
    pairs = [(stores, store.upstream_store_theorems(binding, stores)),
             (lookups, upstream_lookup_theorems(binding, lookups))]
    for budget in (40, 250_000):
        options = AuditOptions(budget=budget)
        for base, derived in pairs:
            assert derived and derived_spaces.shared_cases(derived[0].space) is not None
            together = engine._families([base, derived], impl, options)
            alone = [engine._family(base, impl, options), engine._family(derived, impl, options)]
            assert [_plain_rows(r) for r in together] == [_plain_rows(r) for r in alone]


def test_units_fuse_the_families_that_share_cases() -> None:
    binding = bind(resolve_target(f"vllm:{release_tree('0.33.0')}"))
    theorems = engine.theorems_for(binding)
    indices, _ = engine.plan(binding, AuditOptions())
    units = engine._units(theorems, indices)
    families = [sorted({str(getattr(theorems[i], "family", "")) for i in unit})
                for unit in units]
    # The store family over kvcontract's StoreTracker (and its C12 driver) needs a store
    # horizon, never modelled from source text (issue 20): unchecked on upstream code,
    # so upstream's executed store path is walked on its own.
    assert ["upstream-store"] in families
    assert ["lookup", "upstream-lookup"] in families
    assert ["upstream-end-to-end"] in families
    assert sorted(i for unit in units for i in unit) == sorted(indices)


# -- the scoped scenarios in shards -----------------------------------------------------------
def test_shards_keep_every_scenario_in_order() -> None:
    from kvcontract.tools.fuzz import scoped_seed_scenarios

    scope = [(label, g) for label, g in preset_geometries("gpt-oss-20b-eagle3")]
    scenarios = scoped_seed_scenarios(scope, 0)
    for workers in (1, 2, 8):
        pieces = system.shards(scenarios, workers)
        assert [s for piece in pieces for s in piece] == list(scenarios)
        assert all(pieces) and len(pieces) <= system.SHARDS_PER_WORKER * workers
    assert system.shards([], 2) == [[]]


def test_program_weight_counts_request_tokens() -> None:
    from kvcontract.tools.fuzz import Scenario

    geometry = preset_geometries("gpt-oss-20b-eagle3")[0][1]
    scenario = Scenario("s", geometry, [("add_request", "r", [1] * 100, 1), ("step", 8)])
    assert system.program_weight(scenario) == 101
