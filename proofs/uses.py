"""Which functions of an :class:`~kvcontract.impl.bundle.Implementation` each theorem
exercises, by theorem name (the part before any ``[...]``), most specific first.

Derived from the properties' own ``uses`` (:mod:`kvcontract.spec.properties`), never
written twice. The jobs that read it: the reports locate a counterexample at the first of
these functions that a variant replaced (a case family's include its driver's turn
functions, e.g. ``multigroup_lookup_step``); ``kvcontract mutate`` and the proof cache
start their call graphs here (with the space's ``drivers``); the audit keeps the part it
binds from upstream (``tools/audit/engine.THEOREM_FIELDS``: less the kvcontract-only
fields) to decide which theorems a partial binding can still run, what a counterexample
is blamed on and which functions a baseline comparison must prove equal. How a theorem
ran in an audit (its ``via``) is its space's ``driver``, never read from these lists.
"""

from __future__ import annotations

from kvcontract.spec.properties import properties
from kvcontract.spec.properties.lookup import LOOKUP_FUNCTIONS
from kvcontract.spec.properties.store import STORE_FUNCTIONS

THEOREM_FUNCTIONS: dict[str, tuple[str, ...]] = {
    prop.name.split("[", 1)[0]: prop.uses for prop in properties() if prop.uses
}
"""Properties about the spec alone (no implementation call) are absent."""

__all__ = ["LOOKUP_FUNCTIONS", "STORE_FUNCTIONS", "THEOREM_FUNCTIONS"]
