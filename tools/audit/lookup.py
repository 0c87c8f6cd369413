"""Upstream's own multi-group lookup (``_lookup_complete_chunks``), driven by stand-ins.

The catalogue's lookup theorems run kvcontract's multi-group loop over the bound
primitives. This module runs *upstream's* loop instead: a stand-in scheduler carries
exactly what the body reads (``config.kv_group_configs``, ``_lookup_groups``,
``_sliding_window_groups``, ``_mamba_align_size``, ``_chunks_being_loaded``, a manager
whose ``lookup`` answers from the case's chunk states, and the bound upstream scanners as
its methods); a stand-in request state carries the offload keys (one per complete
chunk, as ``(group, chunk)``), the local hit and the token count. The same lookup-state
domain as the catalogue is checked against the spec (:mod:`kvcontract.spec.multigroup`),
so a defect in the convergence loop itself (not only in a primitive) is found.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.proofs.exhaustive_theorems import LookupCase, lookup_cases, lookup_domain
from kvcontract.proofs.theorem import ExhaustiveTheorem
from kvcontract.spec import multigroup
from kvcontract.spec.geometry import Geometry, GroupKind
from kvcontract.spec.lookup import HIT, HIT_PENDING, LookupResult
from kvcontract.tools.audit.binding import (
    Binding,
    FullAttentionSpec,
    GroupConfig,
    MambaSpec,
    SlidingWindowSpec,
    UpstreamError,
    _EventsTracker,
    _garbage,
    _guarded,
)

NEEDED_ROLES = ("multi_group_lookup", "sw_scan", "prefix_scan", "window")


@dataclass
class UpstreamOutcome:
    hit_tokens: int | None
    """Absolute accepted boundary (the local hit when nothing is gained); None: defer."""
    lookups: list[tuple[int, int]] = field(default_factory=list)


class _Manager:
    def __init__(self, answer: Callable[[int, int], LookupResult],
                 log: list[tuple[int, int]]) -> None:
        self._answer = answer
        self._log = log

    def lookup(self, key: tuple[int, int], req_context: Any = None) -> LookupResult:
        self._log.append(key)
        return self._answer(*key)


def missing_roles(binding: Binding) -> list[str]:
    return [r for r in NEEDED_ROLES if r not in binding.functions]


def make_runner(binding: Binding) -> Callable[[Geometry, int, int, Callable[[int, int],
                                                                          LookupResult]],
                                              UpstreamOutcome]:
    """``run(geometry, num_tokens, local_hit, lookup) -> UpstreamOutcome`` on upstream code."""
    f = binding.functions
    roles = binding.roles
    where = f"{roles['multi_group_lookup'].qualname} ({roles['multi_group_lookup'].path}:" \
            f"{roles['multi_group_lookup'].line})"
    loop = _guarded(where, f["multi_group_lookup"])
    window = f["window"]
    load_window = f.get("load_window")

    def run(geometry: Geometry, num_tokens: int, local_hit: int,
            answer: Callable[[int, int], LookupResult]) -> UpstreamOutcome:
        log: list[tuple[int, int]] = []
        configs = []
        for index, group in enumerate(geometry.groups):
            tpc = geometry.chunk_tokens(group)
            bs = geometry.block_tokens(group)
            spec: Any
            if group.kind is GroupKind.SLIDING_WINDOW:
                spec = SlidingWindowSpec(block_size=bs, sliding_window=group.sliding_window,
                                         extra_retained_tokens=group.extra_retained_tokens)
            elif group.kind is GroupKind.MAMBA:
                spec = MambaSpec(block_size=bs)
            else:
                spec = FullAttentionSpec(block_size=bs)
            config = GroupConfig(group_idx=index, tokens_per_block=bs, tokens_per_chunk=tpc,
                                 sliding_window_size_in_chunks=window(spec, tpc),
                                 kv_cache_spec=spec, is_eagle_group=group.eagle)
            if load_window is not None:
                config.load_window_size_in_chunks = types.MethodType(load_window, config)
            configs.append(config)
        full = [i for i, c in enumerate(configs) if c.sliding_window_size_in_chunks is None]
        sliding = sorted((i for i, c in enumerate(configs)
                          if c.sliding_window_size_in_chunks is not None),
                         key=lambda i: -configs[i].sliding_window_size_in_chunks)
        # Mamba groups are in "align" cache mode (a state exists only at chunk ends):
        # upstream then rounds the initial boundary down to the Mamba chunk.
        mamba = [geometry.chunk_tokens(g) for g in geometry.groups if g.kind is GroupKind.MAMBA]
        sched = types.SimpleNamespace(
            config=types.SimpleNamespace(kv_group_configs=tuple(configs)),
            _lookup_groups=tuple(full + sliding), _sliding_window_groups=tuple(sliding),
            _mamba_align_size=mamba[0] if mamba else None, _chunks_being_loaded=set(),
            manager=_Manager(answer, log), _events_tracker=_EventsTracker(),
        )
        sched._sliding_window_lookup = types.MethodType(f["sw_scan"], sched)
        sched._maximal_prefix_lookup = types.MethodType(f["prefix_scan"], sched)
        request = types.SimpleNamespace(num_tokens=num_tokens, request_id="audit")
        states = tuple(types.SimpleNamespace(
            offload_keys=[(g, k) for k in range(num_tokens // configs[g].tokens_per_chunk)],
            lookup_hit_end_chunk_idx=0) for g in range(len(configs)))
        req_status = types.SimpleNamespace(
            num_locally_computed_tokens=local_hit, max_load_tokens=None, req=request,
            req_context=None, group_states=states)
        value = loop(sched, req_status)
        if value is None:
            return UpstreamOutcome(None, log)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _garbage(where, value, "None or a token count >= 0")
        return UpstreamOutcome(local_hit + value, log)

    return run


_LAST: dict[str, Any] = {}


def _outcome(run: Callable[..., UpstreamOutcome], case: LookupCase) -> UpstreamOutcome:
    """Upstream's answer for a case, computed once for the four theorems (a one-entry
    memo: the family pass checks every theorem on a case before the next case)."""
    if _LAST.get("case") is not case or _LAST.get("run") is not run:
        _LAST.update(case=case, run=run, value=None, error=None)
        try:
            _LAST["value"] = run(case.geometry, case.num_tokens, case.local_hit,
                                 lambda g, k: case.states[g][k])
        except Exception as exc:
            _LAST["error"] = exc
    if _LAST["error"] is not None:
        raise _LAST["error"]
    value: UpstreamOutcome = _LAST["value"]
    return value


def _answer(case: LookupCase) -> multigroup.ContractAnswer:
    if _LAST.get("answer_case") is not case:
        _LAST["answer_case"] = case
        _LAST["answer"] = multigroup.contract_answer(case.geometry, case.num_tokens,
                                                     case.local_hit, dict(enumerate(case.states)))
    answer: multigroup.ContractAnswer = _LAST["answer"]
    return answer


def _checks(run: Callable[..., UpstreamOutcome]) -> dict[str, Callable[[LookupCase,
                                                                          Implementation],
                                                                         str | None]]:
    def loads_only_hit(case: LookupCase, impl: Implementation) -> str | None:
        outcome = _outcome(run, case)
        hit = outcome.hit_tokens
        if hit is None or hit <= case.local_hit:
            return None
        for g, group in enumerate(case.geometry.groups):
            lo, hi = multigroup.load_range(case.geometry, group, hit, case.local_hit)
            for k in range(lo, hi):
                state = case.states[g][k] if k < len(case.states[g]) else None
                if state != HIT:
                    shown = "absent (no key)" if state is None else state.name
                    crash = "not found in cache" if state in (None, LookupResult.MISS) \
                        else "not ready"
                    return (f"upstream accepted hit {hit} but group {g} must load chunk {k}, "
                            f"which is {shown}: '{crash}' at load time")
        return None

    def defers_only_in_scope(case: LookupCase, impl: Implementation) -> str | None:
        outcome = _outcome(run, case)
        if outcome.hit_tokens is not None:
            return None
        answer = _answer(case)
        if not answer.pending_in_window:
            return ("upstream deferred, but no chunk read for the best boundary "
                    f"{answer.best_present} is pending (and no RETRY was seen)")
        return None

    def is_maximal(case: LookupCase, impl: Implementation) -> str | None:
        outcome = _outcome(run, case)
        if outcome.hit_tokens is None:
            return None
        answer = _answer(case)
        expected = answer.best_present if answer.best_present is not None else case.local_hit
        if outcome.hit_tokens < expected:
            return (f"upstream accepted {outcome.hit_tokens}; the largest servable boundary "
                    f"is {expected}")
        return None

    def converges(case: LookupCase, impl: Implementation) -> str | None:
        outcome = _outcome(run, case)
        hit = outcome.hit_tokens
        if hit is None or hit <= case.local_hit:
            return None
        for g, group in enumerate(case.geometry.groups):
            if not multigroup.group_accepts(
                case.geometry, group, hit, case.local_hit, case.num_tokens,
                lambda k, g=g: case.states[g][k] in (HIT, HIT_PENDING),
            ):
                return f"upstream's final hit {hit} is not servable by group {g}"
        return None

    return {"loads_only_hit": loads_only_hit, "defers_only_in_scope": defers_only_in_scope,
            "is_maximal": is_maximal, "converges": converges}


def upstream_lookup_theorems(binding: Binding) -> list[ExhaustiveTheorem]:
    """Theorems over upstream's ``_lookup_complete_chunks`` (empty when it is not bound)."""
    if missing_roles(binding):
        return []
    checks = _checks(make_runner(binding))
    domain = lookup_domain()

    def to_json(case: LookupCase) -> dict[str, Any]:
        data: dict[str, Any] = case.to_json()
        return data

    family: dict[str, Any] = (
        {"family": "upstream-lookup"}
        if "family" in getattr(ExhaustiveTheorem, "__dataclass_fields__", {}) else {})
    theorems = [
        ExhaustiveTheorem("C2", "upstream-lookup-loads-only-hit",
                          "upstream's multi-group lookup loads only HIT chunks",
                          lookup_cases, checks["loads_only_hit"], domain, to_json),
        ExhaustiveTheorem("C3", "upstream-lookup-defers-only-in-scope",
                          "upstream's multi-group lookup defers only for a pending chunk "
                          "it would read", lookup_cases, checks["defers_only_in_scope"],
                          domain, to_json),
        ExhaustiveTheorem("C4", "upstream-lookup-is-maximal",
                          "upstream's multi-group lookup loses no servable boundary",
                          lookup_cases, checks["is_maximal"], domain, to_json),
        ExhaustiveTheorem("C6", "upstream-lookup-converges",
                          "upstream's final hit is servable by every group",
                          lookup_cases, checks["converges"], domain, to_json),
    ]
    return [dataclasses.replace(t, **family) for t in theorems]


__all__ = ["UpstreamError", "UpstreamOutcome", "make_runner", "missing_roles",
           "upstream_lookup_theorems"]
