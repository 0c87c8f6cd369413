"""Every property of the contract, in clause order, and lookup by theorem id."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from kvcontract.errors import UnknownPropertyError
from kvcontract.impl.bundle import Implementation
from kvcontract.spec.clauses import CLAUSES
from kvcontract.spec.properties.base import Property
from kvcontract.spec.properties.end_to_end import end_to_end_properties
from kvcontract.spec.properties.formulas import formula_properties
from kvcontract.spec.properties.lookup import lookup_properties
from kvcontract.spec.properties.scan import scan_properties
from kvcontract.spec.properties.sequences import sequence_properties
from kvcontract.spec.properties.store import store_properties
from kvcontract.spec.properties.unbounded import unbounded_properties
from kvcontract.spec.properties.unbounded_lookup import unbounded_lookup_properties
from kvcontract.spec.properties.unbounded_store import unbounded_store_properties


@functools.cache
def properties() -> tuple[Property, ...]:
    """Every property, in clause order (formulas, the unbounded scanner theorems, then
    sequences, scans, lookups, stores and end-to-end runs within a clause). Built once
    per process: the objects are immutable."""
    every: list[Property] = [*formula_properties(), *unbounded_properties(),
                             *unbounded_lookup_properties(),
                             *unbounded_store_properties(), *sequence_properties(),
                             *scan_properties(), *lookup_properties(), *store_properties(),
                             *end_to_end_properties()]
    order = {c.id: i for i, c in enumerate(CLAUSES)}
    return tuple(sorted(every, key=lambda p: order[p.clause]))


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
