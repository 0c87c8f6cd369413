"""What each defect of an audit costs on real models: the audit's costing stage.

After the theorems ran and their counterexamples were grouped into defects
(:mod:`kvcontract.tools.audit.defects`), each defect on a geometry vLLM builds is
measured on the model presets in the user's units (:mod:`kvcontract.tools.audit.costs`):
the bound upstream code against the same code with the defect's root cause replaced by
the reference, so the cost is the defect's alone, not that of every defect at once. A
C3 deferral's wait is read from its witness when the defects are grouped.

The measurement re-runs upstream's functions, so it runs in a sandbox child with the
audit's CPU-time limits; budgets count prompts and geometries, never seconds.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import REFERENCE
from kvcontract.tools.audit.roles import Binding, has_lookahead_hashes
from kvcontract.tools.audit.root_cause import filled_implementation
from kvcontract.vocabulary import Impact

COSTED = frozenset({Impact.LOST_HIT.value, Impact.WASTE.value})
"""Impacts measured on the presets (a crash's cost is its condition; a delay's, what it
waits on)."""


def patched_implementation(binding: Binding, cause: Mapping[str, Any]) -> Implementation | None:
    """The bound implementation with ``cause`` replaced by the reference; None when the
    root cause is a whole upstream loop (the preset measurement drives kvcontract's loop
    over upstream's primitives, so it cannot take that loop out)."""
    from kvcontract.tools.audit.root_cause import REFERENCE_ROLES, rebind

    impl = binding.implementation
    assert impl is not None
    how = cause.get("how")
    roles = [str(f["role"]) for f in cause.get("functions", ())]
    if how == "rebound" and roles and all(r in REFERENCE_ROLES for r in roles):
        return rebind(binding, roles).implementation
    fields = [str(f) for f in cause.get("fields", ())]
    if how in ("field", "inferred", "unisolated") and fields:
        # The fixed side is a counterfactual: a field the release could not be bound for
        # (e.g. a store horizon upstream computes inside _build_store_jobs) is the
        # reference's there too, so the fixed side can run at all.
        return dataclasses.replace(filled_implementation(binding), **{f: getattr(REFERENCE, f)
                                                         for f in fields})
    return None


def _not_costed(defect: Mapping[str, Any]) -> str:
    cause = defect.get("root_cause") or {}
    if cause.get("how") == "loop":
        return ("not measured on the presets: the root cause is upstream's loop itself, "
                "which the preset measurement does not drive")
    return "not measured on the presets: no root cause isolated"


def _store_runners(binding: Binding, cause: Mapping[str, Any]) -> tuple[Any, Any, str]:
    """The producers' store paths of the two sides: upstream's executed
    ``_build_store_jobs`` where the release has every function it calls (for the
    patched side only when the root cause is rebound in upstream's own signature, so the
    executed path reads the reference's rule); else kvcontract's store path over the
    bundle. The third item says which, for the cost's notes."""
    from kvcontract.tools.audit import store
    from kvcontract.tools.audit.root_cause import REFERENCE_ROLES, rebind

    # Both sides always run the same store path: a difference between two store paths
    # (upstream's executed one leaves Mamba groups out) would be measured as the defect.
    roles = [str(f["role"]) for f in cause.get("functions", ())]
    if binding.target.kind != "builtin" and not store.missing(binding) and \
            cause.get("how") == "rebound" and roles and all(r in REFERENCE_ROLES for r in roles):
        return (store.make_store_runner(binding),
                store.make_store_runner(rebind(binding, roles)),
                "store path: upstream's _build_store_jobs, executed on both sides")
    unbound = sorted(f for f in binding.missing_fields if hasattr(REFERENCE, f))
    if unbound:
        return None, None, ("store path: kvcontract's over the bound functions on both "
                            f"sides, with the reference's {', '.join(unbound)} (not "
                            "bound from the release) on both")
    return None, None, "store path: kvcontract's over the bound functions on both sides"


DENSE_RETENTION_MODE = "prefix_cache_retention_interval=None"
"""How a defect's ``mode`` (:func:`kvcontract.tools.audit.on_engine.finding_mode`) names
dense retention."""


def _default_retention_first(defect: Mapping[str, Any],
                             measure: Callable[[int | None], dict[str, Any]],
                             ) -> dict[str, Any]:
    """A defect's cost at vLLM's default retention interval (0) first; where it costs
    nothing there and needs dense retention (its mode says so, or it is waste: a final
    partial segment's waste needs dense retention, vLLM's default interval keeps no such
    tail: tools/audit/costs, caveats), at dense retention, said so in its notes."""
    cost = measure(0)
    needs_dense = DENSE_RETENTION_MODE in str(defect.get("mode") or "")
    if cost["rows"] or not (needs_dense or defect["impact"] == Impact.WASTE.value):
        return cost
    dense = measure(None)
    if not dense["rows"]:
        return cost
    dense.setdefault("notes", []).append(
        "no cost at vLLM's default retention interval (0): measured at "
        f"{DENSE_RETENTION_MODE}, the mode the finding needs")
    return dense


def _cost_job(binding: Binding, defect: Mapping[str, Any]) -> dict[str, Any]:
    """One defect's cost (a sandbox child's job)."""
    from kvcontract.tools.audit.costs import defect_cost

    cause = defect.get("root_cause") or {}
    if binding.engine is not None:
        from kvcontract.tools.audit.on_engine import rebindable

        roles = rebindable(cause)
        if roles:
            return _engine_cost(binding, defect, roles)
    patched = patched_implementation(binding, cause)
    bound_store, patched_store, path = _store_runners(binding, cause)
    impl = binding.implementation if bound_store is not None else filled_implementation(binding)
    assert impl is not None
    if patched is None:
        return {"impact": defect["impact"], "summary": _not_costed(defect), "rows": []}
    runners = {"bound_store": bound_store, "patched_store": patched_store}
    lookahead = has_lookahead_hashes(binding)
    cost = _default_retention_first(defect, lambda retention: defect_cost(
        impl, patched, defect["impact"], retention=retention, **runners,
        lookahead_hashes=lookahead))
    cost.setdefault("notes", []).append(path)
    if binding.engine is not None:
        cost["measured_on"] = "model"
        cost["notes"].append("measured on kvcontract's model over the bound functions: "
                             "the root cause cannot be replaced inside vLLM's engine")
    if not cost.get("checked") and cost.get("skipped"):
        cost["summary"] = "not measured on the presets: " + str(cost["skipped"][0])
    return cost


def _engine_cost(binding: Binding, defect: Mapping[str, Any],
                 roles: list[str]) -> dict[str, Any]:
    """A defect's cost measured on vLLM's engine: vLLM as it is against vLLM with the
    root cause replaced by the reference inside it (the same resends, both sides run)."""
    from kvcontract.tools.audit.costs import defect_cost
    from kvcontract.tools.audit.on_engine import ENGINE_LENGTHS, engine_resends

    impl = filled_implementation(binding)
    bound_resend, patched_resend, bound_store, patched_store = engine_resends(binding, roles)
    cost = _default_retention_first(defect, lambda retention: defect_cost(
        impl, impl, defect["impact"], retention=retention, lengths=ENGINE_LENGTHS,
        bound_store=bound_store, patched_store=patched_store, bound_resend=bound_resend,
        patched_resend=patched_resend, lookahead_hashes=has_lookahead_hashes(binding)))
    cost["measured_on"] = "engine"
    cost.setdefault("notes", []).append(
        f"measured on vLLM's engine ({binding.engine.release}): as it is, and with "
        f"{', '.join(roles)} replaced by the reference inside it")
    if not cost.get("checked") and cost.get("skipped"):
        cost["summary"] = "not measured on the presets: " + str(cost["skipped"][0])
    return cost


def cost_defects(binding: Binding, report: dict[str, Any], options: Any) -> None:
    """Fill ``cost`` (lost hits or waste on the presets) of every defect of ``report`` on a
    geometry vLLM builds; a measurement that fails is a note. (A C3 deferral's wait is
    read from its witness alone: :func:`kvcontract.tools.audit.defects.attach_defects`.)"""
    from kvcontract.tools.audit.sandbox import run_jobs

    defects = [d for d in report.get("defects", []) if not d["latent"]]
    costed = [d for d in defects if d["impact"] in COSTED]
    if not costed:
        return
    def job(defect: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
        return lambda: _cost_job(binding, defect)

    workers = options.jobs or max(1, min(len(costed), os.cpu_count() or 1))
    outcomes = run_jobs([(str(d["id"]), job(d)) for d in costed], workers=workers,
                        job_timeout=options.theorem_timeout, call_timeout=options.call_timeout)
    for defect in costed:
        outcome = outcomes[str(defect["id"])]
        if outcome.ok and outcome.value is not None:
            defect["cost"] = outcome.value
        else:
            report["notes"].append(f"{defect['id']}: cost not measured: "
                                   + (outcome.error or "no result").splitlines()[0])


__all__ = ["COSTED", "cost_defects", "patched_implementation"]
