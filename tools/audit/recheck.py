"""A witness re-checked on an implementation, and the bound fields a theorem reads.

:func:`_fails` judges a theorem's witness again on an implementation (the bound one, or
one with fields replaced by the reference's); :func:`theorem_fields` names the bound
:class:`~kvcontract.impl.bundle.Implementation` fields a theorem calls (its ``uses``,
less :data:`KVCONTRACT_ONLY_FIELDS`). The engine's rows (:mod:`.engine`), the root cause
(:mod:`.root_cause`) and the root cause on vLLM's engine (:mod:`.on_engine`) all
re-check witnesses so: its own module, below the three.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.proofs.uses import LOOKUP_FUNCTIONS, STORE_FUNCTIONS, THEOREM_FUNCTIONS
from kvcontract.spec.properties import Env, FormulaProperty, Property
from kvcontract.spec.properties.base import HYPOTHESES_ONLY
from kvcontract.tools.audit.lookup import UPSTREAM_LOOKUP
from kvcontract.tools.audit.roles import FIELD_ROLES
from kvcontract.tools.audit.store import is_upstream
from kvcontract.tools.audit.upstream_calls import (
    MissingRole,
    StandInGap,
    UpstreamError,
    UpstreamTimeout,
    stand_in_gap,
)

ALL_FIELDS = tuple(f.name for f in dataclasses.fields(Implementation)
                   if f.name not in ("name", "description", "violates", "notes"))

KVCONTRACT_ONLY_FIELDS: tuple[str, ...] = tuple(
    f for f in ALL_FIELDS if f not in FIELD_ROLES)
"""Implementation fields the audit never binds from upstream: kvcontract's own step
functions (the store step's bounds and per-chunk decision, the multi-group loop's turn,
the offloadable-token count). An audited bundle keeps the reference's for them, so the
case families that drive kvcontract's scheduler over the bound primitives run (labelled
``via``), while upstream's own loop and store path are checked whole by the
``upstream-*`` theorems."""


def _bound_fields(uses: tuple[str, ...]) -> tuple[str, ...]:
    """What of a property's ``uses`` the audit binds from upstream: its requirements, what
    a counterexample is blamed on and what a baseline comparison proves equal (the
    kvcontract-only fields are the reference's on both sides)."""
    return tuple(f for f in uses if f not in KVCONTRACT_ONLY_FIELDS)


_LOOKUP_FIELDS: tuple[str, ...] = _bound_fields(LOOKUP_FUNCTIONS)
_STORE_FIELDS: tuple[str, ...] = _bound_fields(STORE_FUNCTIONS)
THEOREM_FIELDS: dict[str, tuple[str, ...]] = {
    name: _bound_fields(uses) for name, uses in THEOREM_FUNCTIONS.items()}
"""Which bound Implementation fields each catalogue theorem calls (its ``uses``,
:mod:`kvcontract.proofs.uses`, less the kvcontract-only fields). A theorem not listed
there is assumed to need every field."""


def theorem_fields(theorem: Property) -> tuple[str, ...]:
    if is_upstream(theorem.name):
        return ()  # upstream's own store path (and lookup): no Implementation field
    if theorem.name.startswith(UPSTREAM_LOOKUP):
        return _LOOKUP_FIELDS
    # The property's own declaration (THEOREM_FIELDS by name is the same, for report
    # rows that carry only the name); a property that calls nothing needs everything.
    return _bound_fields(theorem.uses) if theorem.uses else ALL_FIELDS


def _admissible(theorem: FormulaProperty, values: dict[str, int]) -> bool:
    """Whether the theorem's hypotheses hold (they never depend on the implementation)."""
    hyps, _ = theorem.statement(Env(values), HYPOTHESES_ONLY)
    admissible: bool = all(bool(h) for h in hyps)
    return admissible


def _violation(
    theorem: FormulaProperty, impl: Implementation, values: dict[str, int]
) -> str | None:
    """The failure message for admissible ``values`` (upstream executed), or None."""
    try:
        _, goal = theorem.statement(Env(values), impl)
        holds = bool(goal)
    except (UpstreamTimeout, StandInGap):
        raise  # decides nothing: the theorem becomes UNKNOWN (_concrete_z3_theorem)
    except UpstreamError as exc:
        return str(exc)
    except Exception as exc:  # the adapters turn upstream errors into UpstreamError
        gap = stand_in_gap(exc)
        if gap is not None:
            raise StandInGap(gap) from exc
        return f"the implementation raised {type(exc).__name__}: {exc}"
    if holds:
        return None
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    return f"{theorem.description} fails for {shown}"


def _undecided(exc: BaseException) -> BaseException | None:
    """``exc`` as what decides nothing about the code (a CPU-time limit, a stand-in gap),
    or None when it is upstream's own failure (a finding)."""
    from kvcontract.live.gaps import DriverGapError

    if isinstance(exc, (UpstreamTimeout, StandInGap, DriverGapError)):
        return exc
    gap = stand_in_gap(exc) if isinstance(exc, Exception) else None
    return StandInGap(gap) if gap is not None else None


def _fails(theorem: Property, impl: Implementation, witness: Any) -> bool:
    if isinstance(theorem, FormulaProperty):
        return _admissible(theorem, witness) and _violation(theorem, impl, witness) is not None
    try:
        return theorem.check(witness, impl) is not None
    except MissingRole:
        raise  # an unbound field decides nothing (a root cause must not name it)
    except Exception as exc:
        if _undecided(exc) is not None:
            raise  # a stand-in gap or a CPU-time limit decides nothing either
        return True
