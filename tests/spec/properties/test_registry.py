"""The catalogue is the only registry (kvcontract.spec.properties.catalog, issue 21 item 7).

A toy property added the way ARCHITECTURE.md's "How to add a clause" says (a list in
``catalog.PROPERTY_LISTS``, ``observable_on`` declared on the property) must reach the
audit's upstream-loop theorems, its plan and the fuzzer's monitor with no other line
changed; a declaration no consumer can honour, a property of an unknown clause or a
clause without its impact is an error naming the entry. The jobs ``uses`` used to do by
equality (the audit's ``via``) are the space's own declaration, and a report locates a
step bug at the step (``multigroup_lookup_step``), not at an unrelated primitive.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcontract.impl.system.events import LookupEvent
from kvcontract.impl.variants import REFERENCE, VARIANTS
from kvcontract.spec.clauses import CLAUSES, CatalogueError, Clause, validated
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.properties import CaseProperty, Property, catalog
from kvcontract.spec.properties.base import Observer
from kvcontract.spec.properties.end_to_end import END_TO_END_SPACE
from kvcontract.spec.properties.lookup import (
    LOOKUP_FUNCTIONS,
    LOOKUP_SPACE,
    LookupCase,
    LookupObservation,
)
from kvcontract.spec.properties.scan import scan_properties
from kvcontract.spec.properties.store import STORE_SPACE
from kvcontract.vocabulary import Impact, LookupResult

HAS_VLLM = importlib.util.find_spec("vllm") is not None
"""The audit binds the installed vLLM's source (read, never imported)."""

TOY_CALLS: list[tuple[int | None, int]] = []


def toy_judge(case: LookupCase, observation: LookupObservation) -> str | None:
    """A toy C4 judge that refuses every external hit (so a judged event shows)."""
    TOY_CALLS.append((observation.hit_tokens, case.local_hit))
    hit = observation.hit_tokens
    if hit is not None and hit > case.local_hit:
        return f"toy: an external hit {hit}"
    return None


TOY = CaseProperty("C4", "lookup-toy-no-external-hit", "toy: no external hit is accepted",
                   LOOKUP_SPACE, toy_judge, LOOKUP_FUNCTIONS,
                   observable_on=frozenset({Observer.UPSTREAM_LOOP, Observer.MONITOR}))


@pytest.fixture
def with_catalogue() -> Iterator[Callable[[Iterable[Property]], None]]:
    """Add properties to the catalogue as a new module would (``PROPERTY_LISTS``), for
    the test only; the cached catalogue is rebuilt before and after."""
    from kvcontract.spec.properties import scoped

    original = catalog.PROPERTY_LISTS

    def rebuilt() -> None:
        # Everything cached from the catalogue goes with it: a scoped catalogue built
        # before would keep the old property objects (their judges are closures).
        catalog.properties.cache_clear()
        scoped._scoped_cached.cache_clear()

    def add(extra: Iterable[Property]) -> None:
        listed = list(extra)
        catalog.PROPERTY_LISTS = (*original, lambda: listed)
        rebuilt()

    try:
        yield add
    finally:
        catalog.PROPERTY_LISTS = original
        rebuilt()


def test_a_toy_property_reaches_the_monitor(
        with_catalogue: Callable[[Iterable[Property]], None]) -> None:
    from kvcontract.tools.monitor import Monitor, monitored_properties

    with_catalogue([TOY])
    attributed, judged = monitored_properties()
    assert TOY in judged and TOY not in attributed
    geometry = Geometry((fa(4), swa(4, 8)))
    monitor = Monitor(geometry)
    hit = LookupResult.HIT
    # 9 tokens, both chunks of each group HIT: the contract's answer is 8 (the last token
    # is never a hit), so the monitor's own C2-C4 checks pass and the toy judge refuses it.
    states = ((hit, hit), (hit, hit))
    load_ranges = ((0, (0, 2)), (1, (0, 2)))
    TOY_CALLS.clear()
    monitor(LookupEvent("r", 9, 0, states, frozenset(), 8, load_ranges))
    assert TOY_CALLS == [(8, 0)]
    assert [(v.clause, v.kind, v.witness.get("theorem")) for v in monitor.violations] == [
        ("C4", "lookup", "C4/lookup-toy-no-external-hit")]
    assert monitor.checks["C4"] == 2  # the monitor's own C4 check, then the toy's


def test_without_the_declaration_the_monitor_does_not_judge_it(
        with_catalogue: Callable[[Iterable[Property]], None]) -> None:
    from kvcontract.tools.monitor import monitored_properties

    with_catalogue([dataclasses.replace(TOY, observable_on=frozenset())])
    assert all(p.name != TOY.name for group in monitored_properties() for p in group)


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (the audit binds its source)")
def test_a_toy_property_reaches_the_audit_of_upstreams_loop(
        with_catalogue: Callable[[Iterable[Property]], None]) -> None:
    from kvcontract.proofs.runner import catalog as prover_catalog
    from kvcontract.tools.audit.binding import bind
    from kvcontract.tools.audit.engine import AuditOptions, plan, theorems_for
    from kvcontract.tools.audit.lookup import upstream_loop_properties
    from kvcontract.tools.audit.targets import resolve_target

    with_catalogue([TOY])
    assert TOY in prover_catalog()
    assert TOY in upstream_loop_properties()
    binding = bind(resolve_target("vllm:installed"))
    theorems = theorems_for(binding)
    upstream = [t for t in theorems if t.name == "upstream-lookup-toy-no-external-hit"]
    assert len(upstream) == 1 and isinstance(upstream[0], CaseProperty)
    assert upstream[0].family == "upstream-lookup" and upstream[0].judge is toy_judge
    indices, unchecked = plan(binding, AuditOptions(clauses=["C4"]))
    planned = {theorems[i].theorem_id for i in indices}
    assert {"C4/lookup-toy-no-external-hit", "C4/upstream-lookup-toy-no-external-hit"} <= planned
    assert not any("toy" in line["theorem"] for line in unchecked)


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (the audit binds its source)")
def test_upstream_lists_are_the_catalogues_declarations() -> None:
    """Every declared observer is honoured, and nothing else runs on upstream's code."""
    from kvcontract.tools.audit.binding import bind
    from kvcontract.tools.audit.engine import theorems_for
    from kvcontract.tools.audit.lookup import upstream_loop_name
    from kvcontract.tools.audit.store import UPSTREAM_STORE, judges_junctions_only, unchecked
    from kvcontract.tools.audit.targets import resolve_target

    binding = bind(resolve_target("vllm:installed"))
    theorems = theorems_for(binding)
    names = {t.name for t in theorems if t.name.startswith("upstream-")}
    on_loop = {upstream_loop_name(p.name)
               for p in catalog.observed_by(Observer.UPSTREAM_LOOP, family="lookup")}
    on_store = {UPSTREAM_STORE + p.name
                for p in catalog.observed_by(Observer.UPSTREAM_STORE_PATH, family="store")}
    both = {f"upstream-{p.name}"
            for p in catalog.observed_by(Observer.UPSTREAM_STORE_PATH, family="end-to-end")
            if Observer.UPSTREAM_LOOP in p.observable_on and not judges_junctions_only(p)}
    assert names == on_loop | on_store | both
    # The stand-ins leave junction consumers out: a property of those alone is unchecked
    # (named), never run vacuously.
    junction_only = {f"upstream-{p.name}" for p in catalog.observed_by(
        Observer.UPSTREAM_STORE_PATH, family="end-to-end") if judges_junctions_only(p)}
    assert junction_only and not junction_only & names
    assert junction_only <= {u["theorem"] for u in unchecked(binding, None)}
    assert "upstream-lookup-converges" in names  # C6 is judged on upstream's loop
    assert "upstream-lookup-eagle-peek" not in names  # its pops are not observable there


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (the audit binds its source)")
def test_a_toy_store_property_reaches_upstreams_store_path(
        with_catalogue: Callable[[Iterable[Property]], None]) -> None:
    from kvcontract.tools.audit.binding import bind
    from kvcontract.tools.audit.engine import theorems_for
    from kvcontract.tools.audit.store import UPSTREAM_STORE, missing
    from kvcontract.tools.audit.targets import resolve_target

    steps = next(p for p in catalog.properties() if p.name == "store-steps")
    assert isinstance(steps, CaseProperty)
    toy = dataclasses.replace(steps, name="toy-store")
    quiet = dataclasses.replace(steps, name="toy-store-quiet", observable_on=frozenset())
    with_catalogue([toy, quiet])
    binding = bind(resolve_target("vllm:installed"))
    assert missing(binding) == []  # 0.33.0's store path runs through the stand-ins
    names = {t.name for t in theorems_for(binding)}
    assert UPSTREAM_STORE + "toy-store" in names
    assert UPSTREAM_STORE + "toy-store-quiet" not in names and "toy-store-quiet" in names


def test_a_declaration_no_consumer_honours_is_an_error(
        with_catalogue: Callable[[Iterable[Property]], None]) -> None:
    from kvcontract.tools.audit.engine import _check_observers
    from kvcontract.tools.monitor import monitored_properties

    scan = scan_properties()[0]
    odd = dataclasses.replace(scan, name="toy-scan-on-loop",
                              observable_on=frozenset({Observer.UPSTREAM_LOOP}))
    with pytest.raises(CatalogueError, match="toy-scan-on-loop declares upstream-loop"):
        _check_observers([odd])
    unnamed = dataclasses.replace(TOY, name="toy")
    with pytest.raises(CatalogueError, match="C4/toy declares upstream-loop: name it lookup-"):
        _check_observers([unnamed])
    with_catalogue([dataclasses.replace(odd, observable_on=frozenset({Observer.MONITOR}))])
    with pytest.raises(CatalogueError, match="toy-scan-on-loop declares the monitor"):
        monitored_properties()


def test_the_catalogue_is_validated_when_built() -> None:
    real = list(catalog.properties())
    with pytest.raises(CatalogueError, match=r"C99/toy names clause 'C99'"):
        catalog.validated([*real, dataclasses.replace(TOY, clause="C99", name="toy")])
    with pytest.raises(CatalogueError, match="C11 is checked by 'system'"):
        catalog.validated([*real, dataclasses.replace(TOY, clause="C11", name="toy")])
    with pytest.raises(CatalogueError, match="C4/lookup-is-maximal is in the catalogue twice"):
        catalog.validated([*real, next(p for p in real if p.name == "lookup-is-maximal")])
    with pytest.raises(CatalogueError, match=r"clause C1 .* no property states it"):
        catalog.validated([p for p in real if p.clause != "C1"])
    assert catalog.validated(real) == catalog.properties()


def test_a_clause_is_declared_whole() -> None:
    """Impact and checker are part of the one definition: a clause cannot be added
    without them, and the catalogue is numbered without gaps."""
    assert {c.id: c.impact for c in CLAUSES}["C3"] is Impact.DELAY
    with pytest.raises(TypeError):
        Clause("C13", "toy", "a toy clause", "prover")  # type: ignore[call-arg]
    with pytest.raises(CatalogueError, match="clause C13: impact='stall'"):
        Clause("C13", "toy", "a toy clause", "prover", "stall")  # type: ignore[arg-type]
    with pytest.raises(CatalogueError, match="clause C13: proved_by='fuzzer'"):
        Clause("C13", "toy", "a toy clause", "fuzzer", Impact.DELAY)
    with pytest.raises(CatalogueError, match="'13' is not of the form"):
        Clause("13", "toy", "a toy clause", "prover", Impact.DELAY)
    toy = Clause(f"C{len(CLAUSES) + 2}", "toy", "a toy clause", "prover", Impact.DELAY)
    with pytest.raises(CatalogueError, match=rf"expected C{len(CLAUSES) + 1}"):
        validated([*CLAUSES, toy])


def test_via_is_the_spaces_driver_not_an_equality_of_uses() -> None:
    """A lookup-family property that calls fewer functions than the family's list still
    ran through kvcontract's multi-group lookup (the old label, computed by comparing
    ``uses`` with the lookup list, was empty for it); C12's end-to-end driver is named."""
    from kvcontract.tools.audit.engine import via_of

    narrow = dataclasses.replace(TOY, uses=("sliding_window_lookup",))
    assert via_of(narrow) == LOOKUP_SPACE.driver
    assert "multi-group lookup" in via_of(narrow)
    c12 = next(p for p in catalog.properties() if p.name == "no-lost-hits")
    assert via_of(c12) == END_TO_END_SPACE.driver != ""
    store = next(p for p in catalog.properties() if p.name == "store-steps")
    assert via_of(store) == STORE_SPACE.driver
    scan = scan_properties()[0]
    assert via_of(scan) == ""  # the scan calls the implementation's scanner directly


def test_the_audit_binds_uses_less_kvcontracts_own_step() -> None:
    """``uses`` names every function a case exercises (the turn of the loop too); the
    audit requires and blames only what it binds from upstream."""
    from kvcontract.tools.audit.recheck import KVCONTRACT_ONLY_FIELDS, theorem_fields

    assert "multigroup_lookup_step" in LOOKUP_FUNCTIONS
    assert "multigroup_lookup_step" in KVCONTRACT_ONLY_FIELDS
    for prop in catalog.observed_by(Observer.UPSTREAM_LOOP, family="lookup"):
        fields = theorem_fields(prop)
        assert fields == tuple(f for f in prop.uses if f not in KVCONTRACT_ONLY_FIELDS)
        assert "multigroup_lookup_step" not in fields and "sliding_window_lookup" in fields


def _step_variant(*args: Any, **kwargs: Any) -> Any:
    """The reference's turn, as a function of its own (a variant that replaces it)."""
    return REFERENCE.multigroup_lookup_step(*args, **kwargs)


def test_a_step_bug_is_located_at_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variant that replaces only ``multigroup_lookup_step``: its lookup findings point
    at that function (the old lookup list lacked it, so they pointed at the reference's
    ``get_sliding_window_size_in_chunks``, which the variant does not change)."""
    from kvcontract.tools.reports.locate import locate

    variant = dataclasses.replace(REFERENCE, name="toy-step",
                                  multigroup_lookup_step=_step_variant)
    monkeypatch.setitem(VARIANTS, "toy-step", variant)
    for theorem in ("C2/lookup-loads-only-hit", "C6/lookup-converges", "C12/no-lost-hits"):
        location = locate("toy-step", theorem)
        assert location is not None, theorem
        assert Path(location["path"]).name == "test_registry.py", theorem
        lines = Path(__file__).read_text(encoding="utf-8").splitlines()
        assert lines[location["line"] - 1].startswith("def _step_variant"), theorem
