"""Every property of the contract, in clause order, and lookup by theorem id.

The catalogue is the only registry of properties: the prover, the audit (its theorems
on upstream's own loop and store path included), the fuzzer's monitor, ``kvcontract
mutate``, the reports and the proof cache all read it, and each consumer other than the
prover takes the properties it judges from what a property declares
(``CaseProperty.observable_on``: :func:`observed_by`). The catalogue is checked when
it is built (:func:`validated`): a property of an unknown clause, of a clause the prover
does not check, a duplicate id or a prover clause without a property is a
:class:`~kvcontract.spec.clauses.CatalogueError` naming it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kvcontract.errors import UnknownPropertyError
from kvcontract.impl.bundle import Implementation
from kvcontract.spec.clauses import CLAUSES, CatalogueError
from kvcontract.spec.properties.base import CaseProperty, Observer, Property
from kvcontract.spec.properties.end_to_end import end_to_end_properties
from kvcontract.spec.properties.formulas import formula_properties
from kvcontract.spec.properties.lifecycle import lifecycle_properties
from kvcontract.spec.properties.lookup import lookup_properties
from kvcontract.spec.properties.scan import scan_properties
from kvcontract.spec.properties.sequences import sequence_properties
from kvcontract.spec.properties.store import store_properties
from kvcontract.spec.properties.unbounded import unbounded_properties
from kvcontract.spec.properties.unbounded_lookup import unbounded_lookup_properties
from kvcontract.spec.properties.unbounded_store import unbounded_store_properties


def validated(every: Iterable[Property]) -> tuple[Property, ...]:
    """The properties in clause order (stable within a clause), checked: each names a
    clause of :data:`~kvcontract.spec.clauses.CLAUSES` that the prover checks, theorem ids
    are unique, and every clause the prover checks has a property."""
    order = {c.id: i for i, c in enumerate(CLAUSES)}
    checked_by = {c.id: c.proved_by for c in CLAUSES}
    seen: set[str] = set()
    props = list(every)
    for prop in props:
        if prop.clause not in order:
            raise CatalogueError(
                f"property {prop.theorem_id} names clause {prop.clause!r}, which is not in "
                f"spec/clauses.py CLAUSES ({CLAUSES[0].id}-{CLAUSES[-1].id}): add the "
                "clause there first")
        if checked_by[prop.clause] != "prover":
            raise CatalogueError(
                f"property {prop.theorem_id}: clause {prop.clause} is checked by "
                f"{checked_by[prop.clause]!r}, not by the prover (Clause.proved_by)")
        if prop.theorem_id in seen:
            raise CatalogueError(f"property {prop.theorem_id} is in the catalogue twice")
        seen.add(prop.theorem_id)
        if not isinstance(prop, CaseProperty) and getattr(prop, "observable_on", None):
            raise CatalogueError(
                f"property {prop.theorem_id}: only case properties are observed besides "
                "the prover (observable_on)")
    covered = {p.clause for p in props}
    for clause in CLAUSES:
        if clause.proved_by == "prover" and clause.id not in covered:
            raise CatalogueError(
                f"clause {clause.id} ({clause.title}) is checked by the prover but no "
                "property states it: add its properties to spec/properties/catalog.py, or "
                "say what checks it (Clause.proved_by)")
    return tuple(sorted(props, key=lambda p: order[p.clause]))


PROPERTY_LISTS: tuple[Callable[[], Iterable[Property]], ...] = (
    formula_properties, unbounded_properties, unbounded_lookup_properties,
    unbounded_store_properties, sequence_properties, scan_properties, lookup_properties,
    store_properties, end_to_end_properties, lifecycle_properties,
)
"""Where the properties come from, one list per module (a new clause's module adds its
list here); :func:`properties` orders them by clause, this order within a clause."""


@functools.cache
def properties() -> tuple[Property, ...]:
    """Every property, in clause order (formulas, the unbounded scanner theorems, then
    sequences, scans, lookups, stores and end-to-end runs within a clause), validated
    (:func:`validated`). Built once per process: the objects are immutable."""
    return validated(prop for source in PROPERTY_LISTS for prop in source())


def observed_by(observer: Observer, among: Iterable[Property] | None = None,
                family: str | None = None) -> list[CaseProperty]:
    """The case properties that declare ``observer`` (``CaseProperty.observable_on``),
    in catalogue order: of ``among`` (a scoped run's catalogue) or of the catalogue, of
    one ``family`` if given. What the audit runs on upstream's loop and store path and
    what the fuzzer's monitor judges, derived here and nowhere else."""
    chosen = properties() if among is None else among
    return [p for p in chosen if isinstance(p, CaseProperty) and observer in p.observable_on
            and (family is None or p.family == family)]


def get_property(theorem_id: str) -> Property:
    """The property ``C2/first-run-covers-load`` (the clause may be omitted)."""
    wanted = theorem_id.strip()
    for prop in properties():
        if wanted in (prop.theorem_id, prop.name):
            return prop
    known = ", ".join(p.theorem_id for p in properties())
    raise UnknownPropertyError(f"no property {theorem_id!r}; known: {known}")


def replay(theorem_id: str, witness: Mapping[str, Any], impl: Implementation) -> str | None:
    """Replay one witness of a property on ``impl``: the violation message, or None when
    the property holds there. Raises :class:`~kvcontract.spec.properties.base.WitnessError`
    for a malformed witness or one outside the property's domain."""
    violation: str | None = get_property(theorem_id).replay(witness, impl)
    return violation
