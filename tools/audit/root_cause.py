"""The root cause of an audit finding: the upstream functions whose replacement removes it.

A finding (one theorem's witness) is re-checked with parts of the bound upstream code
replaced by the reference, smallest replacement first. What removes it is the finding's
root cause, and findings with the same root cause are one defect
(:mod:`kvcontract.tools.audit.defects`). Runs in the sandbox child that found the
witness (the upstream code may hang or raise), before the row leaves it.

How a root cause was established (``how``), strongest first:

* ``rebound``: an upstream *function* (a binding role) was replaced by the reference's
  rule in upstream's own signature (:data:`REFERENCE_ROLES`) and the adapters, the
  upstream loop and the store path were rebuilt over it: the witness passes. This
  follows the value everywhere upstream's code reads it (the window ``W`` is read by
  ``load_window_size_in_chunks``, upstream's loop and the store path alike).
* ``field``: one field of the adapted bundle (or, failing that, a pair) was replaced by
  the reference's and the witness passes; the field's location is the upstream function
  it is adapted from.
* ``inferred``: a theorem of upstream's own loop or store path (``upstream-*``) whose
  witness also fails kvcontract's driver over the same upstream primitives; that
  driver's field-level root cause is named (upstream's loop calls the same primitive;
  the replacement inside upstream's loop was not executed, and the row says so).
* ``loop``: upstream's loop or store path fails where kvcontract's driver over the same
  primitives does not: the loop itself is the cause.
* ``unisolated``: no replacement of one or two fields removes it; every field the
  theorem reads is named.

Nothing here changes a verdict: a root cause only groups findings and locates them.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import REFERENCE
from kvcontract.spec.properties import CaseProperty, Property
from kvcontract.tools.audit.binding import _build_adapters
from kvcontract.tools.audit.recheck import _fails as engine_fails
from kvcontract.tools.audit.recheck import theorem_fields
from kvcontract.tools.audit.roles import FIELD_ROLES, ROLE_BY_NAME, Binding, _pseudo_sources
from kvcontract.tools.audit.stand_ins import SlidingWindowSpec

HOW = ("rebound", "field", "inferred", "loop", "unisolated")
"""How a root cause was established, strongest first (module docstring)."""

LOOKUP_LOOP_ROLE = "multi_group_lookup"
STORE_PATH_ROLE = "store_jobs"


def _reference_window(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """``get_sliding_window_size_in_chunks(kv_cache_spec, tokens_per_chunk)`` with the
    reference's ``W`` for a sliding-window spec; upstream's answer for every other spec
    (full attention, chunked local, Mamba), which the reference does not restate."""

    def get_sliding_window_size_in_chunks(kv_cache_spec: Any, tokens_per_chunk: Any) -> Any:
        if isinstance(kv_cache_spec, SlidingWindowSpec):
            return REFERENCE.get_sliding_window_size_in_chunks(
                kv_cache_spec.sliding_window,
                getattr(kv_cache_spec, "extra_retained_tokens", 0), tokens_per_chunk)
        return upstream(kv_cache_spec, tokens_per_chunk)

    return get_sliding_window_size_in_chunks


def _reference_skipped(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """``SlidingWindowManager.get_num_skipped_tokens(self, num_computed_tokens)`` with the
    reference's retention (the window and ``e`` as the manager holds them)."""
    del upstream

    def get_num_skipped_tokens(self: Any, num_computed_tokens: Any) -> Any:
        return REFERENCE.get_num_skipped_tokens(
            num_computed_tokens, self.sliding_window,
            getattr(self, "extra_retained_tokens", 0))

    return get_num_skipped_tokens


REFERENCE_ROLES: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "window": _reference_window,
    "skipped": _reference_skipped,
}
"""Binding roles the reference can replace in upstream's own signature (a factory of the
replacement from upstream's function). Replacing a role rebuilds everything over it."""


def rebind(binding: Binding, roles: Sequence[str]) -> Binding:
    """``binding`` with ``roles`` replaced by the reference's rule (:data:`REFERENCE_ROLES`)
    and every adapter rebuilt over them; the original is unchanged."""
    functions = dict(binding.functions)
    for role in roles:
        functions[role] = REFERENCE_ROLES[role](binding.functions[role])
    rebound = dataclasses.replace(binding, functions=functions, implementation=None,
                                  missing_fields={})
    _build_adapters(rebound)
    return rebound


def field_role(binding: Binding, field_name: str) -> str | None:
    """The bound role an Implementation field is adapted from (the first bound source
    of a pseudo-role such as ``reachability``)."""
    for role in FIELD_ROLES.get(field_name, ()):
        for candidate in _pseudo_sources(binding, role):
            if binding.location(candidate) is not None:
                return candidate
    return None


def describe(binding: Binding, roles: Sequence[str], how: str,
             fields: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON of a root cause: the upstream functions (qualified name, path, line,
    what the role computes), how it was established, and the bundle fields if any."""
    functions = []
    for role in roles:
        record = binding.roles.get(role)
        spec = ROLE_BY_NAME.get(role)
        entry: dict[str, Any] = {"role": role,
                                 "qualname": (record.qualname if record and record.qualname
                                              else role),
                                 "what": spec.what if spec else role}
        if record is not None and record.path is not None:
            entry["path"] = record.path
            entry["line"] = record.line
        functions.append(entry)
    found: dict[str, Any] = {"how": how, "functions": functions}
    if fields:
        found["fields"] = list(fields)
    return found


def _runs(theorem: Property, impl: Any, witness: Any) -> bool:
    """Whether the witness can be judged on ``impl`` at all: a field the release could
    not be bound for (:class:`~kvcontract.tools.audit.binding.MissingRole`) makes every
    replacement look like a fix, so such a check proves nothing."""
    from kvcontract.tools.audit.upstream_calls import MissingRole

    try:
        if isinstance(theorem, CaseProperty):
            theorem.check(witness, impl)
        return True
    except MissingRole:
        return False
    except Exception:
        return True


def _fails(theorem: Property, binding: Binding, witness: Any) -> bool:
    impl = binding.implementation
    assert impl is not None
    return engine_fails(theorem, impl, witness)


def filled_implementation(binding: Binding) -> Implementation:
    """The bound implementation with every field the release could not be bound for (a
    store horizon upstream computes inside ``_build_store_jobs``) the reference's: what
    lets kvcontract's drivers run over the release's primitives at all. Used only to
    locate and to cost (both sides alike), never to judge upstream."""
    impl = binding.implementation
    assert impl is not None
    unbound = {f: getattr(REFERENCE, f) for f in binding.missing_fields
               if hasattr(REFERENCE, f)}
    return dataclasses.replace(impl, **unbound) if unbound else impl


def _field_cause(theorem: Property, binding: Binding, witness: Any,
                 fields: Sequence[str], impl: Any = None) -> list[str] | None:
    """The smallest set (one field, else two) of ``fields`` whose replacement by the
    reference makes the witness pass on ``impl`` (default: the bound implementation);
    None if there is none."""
    impl = impl if impl is not None else binding.implementation
    assert impl is not None
    # A field the release lacks is no root cause: replacing it only fills the gap.
    fields = [f for f in fields if f not in binding.missing_fields]
    for size in (1, 2):
        for names in itertools.combinations(fields, size):
            patched = dataclasses.replace(impl, **{n: getattr(REFERENCE, n) for n in names})
            try:
                if not engine_fails(theorem, patched, witness):
                    return list(names)
            except Exception:
                continue
    return None


def _roles_of_fields(binding: Binding, fields: Sequence[str]) -> list[str]:
    roles: list[str] = []
    for name in fields:
        role = field_role(binding, name) or name
        if role not in roles:
            roles.append(role)
    return roles


UpstreamBuilder = Callable[[Binding, CaseProperty], "CaseProperty | None"]
"""Rebuilds an ``upstream-*`` theorem over another binding from its base property."""


def find_root_cause(theorem: Property, witness: Any, binding: Binding,
                    base: Property | None = None,
                    rebuild: UpstreamBuilder | None = None) -> dict[str, Any] | None:
    """The root cause of ``theorem``'s counterexample ``witness`` on ``binding``.

    ``base`` is the catalogue property an ``upstream-*`` theorem observes upstream's loop
    or store path for (None for the others); ``rebuild(binding, base)`` makes the
    ``upstream-*`` theorem over a rebound binding. None when the witness cannot be
    re-checked at all (the theorem passes on it here)."""
    if binding.target.kind == "builtin":
        fields = list(theorem_fields(theorem))
        names = _field_cause(theorem, binding, witness, fields)
        if names is not None:
            return describe(binding, [], "field", names)
        return describe(binding, [], "unisolated", fields)
    for role in REFERENCE_ROLES:
        if role not in binding.functions:
            continue
        try:
            rebound = rebind(binding, [role])
            checked: Property | None = theorem
            if base is not None:
                checked = rebuild(rebound, base) if rebuild is not None else None  # type: ignore[arg-type]
            if checked is not None and not _fails(checked, rebound, witness):
                return describe(binding, [role], "rebound")
        except Exception:
            continue
    if base is not None:
        # An upstream-* theorem: does kvcontract's driver over the same primitives fail too?
        # (With the reference's for what the release does not expose as a function, so
        # the driver runs; such a field is never named.)
        driver = filled_implementation(binding)
        try:
            driver_fails = _runs(base, driver, witness) and engine_fails(base, driver, witness)
        except Exception:
            driver_fails = False
        if driver_fails:
            names = _field_cause(base, binding, witness, list(theorem_fields(base)), driver)
            if names is not None:
                return describe(binding, _roles_of_fields(binding, names), "inferred", names)
        loop_role = LOOKUP_LOOP_ROLE if theorem.name.startswith("upstream-lookup-") else None
        if loop_role is None:
            from kvcontract.tools.audit.store import blame as store_blame

            assert isinstance(theorem, CaseProperty)
            loop_role = store_blame(theorem, witness)[1]
        return describe(binding, [loop_role], "loop")
    fields = [f for f in theorem_fields(theorem) if f not in binding.missing_fields]
    names = _field_cause(theorem, binding, witness, fields)
    if names is not None:
        return describe(binding, _roles_of_fields(binding, names), "field", names)
    return describe(binding, _roles_of_fields(binding, fields), "unisolated", fields)


def replay_root_cause(theorem_id: str, witness: Any, impl: Any) -> dict[str, Any] | None:
    """The root cause of a ``prove`` counterexample (a JSON witness) on a built-in or
    registered implementation: the smallest set of its fields (one, else two, of those
    the theorem calls) whose replacement by the reference's makes the witness pass,
    replayed by id (:func:`kvcontract.spec.properties.replay`); ``unisolated`` naming
    every field when none does. None when the witness cannot be replayed."""
    from kvcontract.spec.properties import get_property, replay

    try:
        if replay(theorem_id, witness, impl) is None:
            return None
        prop = get_property(theorem_id)
        # A built-in or registered implementation has every field, kvcontract's own steps
        # (the lookup's first candidate, the store step's decisions) included.
        fields = list(prop.uses) if prop.uses else list(theorem_fields(prop))
    except Exception:
        return None
    for size in (1, 2):
        for names in itertools.combinations(fields, size):
            patched = dataclasses.replace(impl, **{n: getattr(REFERENCE, n) for n in names})
            try:
                if replay(theorem_id, witness, patched) is None:
                    return {"how": "field", "functions": [], "fields": list(names)}
            except Exception:
                continue
    return {"how": "unisolated", "functions": [], "fields": fields}


def upstream_base(theorem: Property, theorems: Sequence[Property]) -> Property | None:
    """The catalogue property an ``upstream-*`` theorem observes upstream's code for."""
    from kvcontract.tools.audit import store

    name = theorem.name
    if name.startswith("upstream-lookup-"):
        wanted = name[len("upstream-"):]
    elif name == store.UPSTREAM_NO_LOST_HITS:
        wanted = "no-lost-hits"
    elif name.startswith(store.UPSTREAM_STORE):
        wanted = name[len(store.UPSTREAM_STORE):]
    else:
        return None
    return next((t for t in theorems if t.name == wanted and t.clause == theorem.clause),
                None)


def rebuild_upstream(theorem_name: str) -> UpstreamBuilder:
    """A builder of the ``upstream-*`` theorem named ``theorem_name`` over any binding."""
    from kvcontract.tools.audit import store
    from kvcontract.tools.audit.lookup import upstream_lookup_theorems

    def build(binding: Binding, base: CaseProperty) -> CaseProperty | None:
        if theorem_name.startswith("upstream-lookup-"):
            made = upstream_lookup_theorems(binding, [base])
        elif theorem_name == store.UPSTREAM_NO_LOST_HITS:
            made = store.upstream_end_to_end_theorems(binding, [base])
        else:
            made = store.upstream_store_theorems(binding, [base])
        return next((t for t in made if t.name == theorem_name), None)

    return build


__all__ = ["HOW", "REFERENCE_ROLES", "describe", "field_role", "filled_implementation",
           "find_root_cause", "rebind",
           "rebuild_upstream", "replay_root_cause", "upstream_base"]
