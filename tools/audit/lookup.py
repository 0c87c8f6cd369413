"""Upstream's own multi-group lookup (``_lookup_complete_chunks``), driven by stand-ins.

The catalogue's lookup theorems run kvcontract's multi-group loop over the bound
primitives. This module runs *upstream's* loop instead: a stand-in scheduler carries
exactly what the body reads (``config.kv_group_configs``, ``_lookup_groups``,
``_sliding_window_groups``, ``_mamba_align_size``, ``_chunks_being_loaded``, a manager
whose ``lookup`` answers from the case's chunk states, and the bound upstream scanners as
its methods); a stand-in request state carries the offload keys (one per complete
chunk, as ``(group, chunk)``), the local hit and the token count. The same lookup-state
domain as the catalogue is checked against the spec (:mod:`kvcontract.spec.multigroup`),
so a defect in the convergence loop itself (not only in a primitive) is found. The
properties are the catalogue's own (:mod:`kvcontract.spec.properties.lookup`), those that
declare ``Observer.UPSTREAM_LOOP`` (:func:`upstream_loop_properties`): only the
observation differs (upstream's loop instead of kvcontract's), so nothing is restated.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.spec.geometry import Geometry
from kvcontract.spec.lookup import LookupResult, hashed_tokens
from kvcontract.spec.properties import CaseProperty
from kvcontract.spec.properties.base import Family, LastCase, Observer
from kvcontract.spec.properties.catalog import observed_by
from kvcontract.spec.properties.lookup import (
    LOOKUP_SPACE,
    LookupCase,
    LookupObservation,
)
from kvcontract.tools.audit.derived_spaces import (
    filtered_space,
    stand_in_family,
    without_absent_modes,
)
from kvcontract.tools.audit.roles import Binding, _where
from kvcontract.tools.audit.stand_ins import GroupConfig, MambaSpec, _EventsTracker, spec_stand_in
from kvcontract.tools.audit.upstream_calls import (
    UpstreamError,
    _garbage,
    _guarded,
    limited,
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


def takes_budget(binding: Binding) -> bool:
    """Whether the bound ``_lookup_complete_chunks`` takes ``max_num_new_tokens`` (0.30+),
    the scheduling budget of a lookup case (``LookupCase.max_hit_tokens``)."""
    try:
        parameters = inspect.signature(binding.functions["multi_group_lookup"]).parameters
    except (KeyError, TypeError, ValueError):
        return False
    return "max_num_new_tokens" in parameters


BUDGET_NOTE = ("cases with a scheduling budget are left out: this release's "
               "_lookup_complete_chunks takes no max_num_new_tokens")


def make_runner(binding: Binding) -> Callable[..., UpstreamOutcome]:
    """``run(geometry, num_tokens, local_hit, lookup, max_hit_tokens=None) ->
    UpstreamOutcome`` on upstream code. A budget reaches upstream as vLLM 0.33's connector
    passes it: ``max_num_new_tokens``, how far past the local hit a load may reach."""
    f = binding.functions
    roles = binding.roles
    where = f"{roles['multi_group_lookup'].qualname} ({roles['multi_group_lookup'].path}:" \
            f"{roles['multi_group_lookup'].line})"
    loop = _guarded(where, f["multi_group_lookup"])
    # Called outside the loop, so each under its own per-call limit (its exceptions
    # unchanged): a hang is UNKNOWN, naming it, never a child running to its CPU limit.
    window = limited(_where(binding, "window"), f["window"])
    load_window = f.get("load_window")
    resolve = (limited(_where(binding, "mamba_align"), f["mamba_align"])
               if "mamba_align" in f else None)

    def mamba_align(geometry: Geometry, configs: list[GroupConfig]) -> int | None:
        """``_mamba_align_size``: upstream's ``resolve_mamba_align_size`` run on the
        groups (a Mamba group is in align mode, the only mode offloading allows); where
        a release lacks it, its rule: the Mamba group's chunk."""
        if resolve is None:
            mamba = [c.tokens_per_chunk for c in configs if isinstance(c.kv_cache_spec,
                                                                      MambaSpec)]
            return mamba[0] if mamba else None
        # 0.30-0.33 read ``spec.config.groups``, 0.28/0.29 ``spec.tokens_per_block``.
        spec = types.SimpleNamespace(
            blocks_per_chunk=geometry.blocks_per_chunk,
            tokens_per_block=tuple(c.tokens_per_block for c in configs),
            config=types.SimpleNamespace(groups=tuple(
                types.SimpleNamespace(group_id=c.group_idx, tokens_per_block=c.tokens_per_block)
                for c in configs)))
        kv_cache_config = types.SimpleNamespace(kv_cache_groups=tuple(
            types.SimpleNamespace(kv_cache_spec=c.kv_cache_spec) for c in configs))
        value = resolve(spec, kv_cache_config)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise _garbage(f"resolve_mamba_align_size ({roles['mamba_align'].path})", value,
                           "None or a token count >= 1")
        return value

    budgeted = takes_budget(binding)

    def run(geometry: Geometry, num_tokens: int, local_hit: int,
            answer: Callable[[int, int], LookupResult],
            max_hit_tokens: int | None = None) -> UpstreamOutcome:
        log: list[tuple[int, int]] = []
        configs = []
        for index, group in enumerate(geometry.groups):
            tpc = geometry.chunk_tokens(group)
            bs = geometry.block_tokens(group)
            spec = spec_stand_in(geometry, group)
            config = GroupConfig(group_idx=index, tokens_per_block=bs, tokens_per_chunk=tpc,
                                 sliding_window_size_in_chunks=window(spec, tpc),
                                 kv_cache_spec=spec, is_eagle_group=group.eagle)
            if load_window is not None:
                # A method upstream's loop calls on the config (0.30+), bound from the
                # release; the stand-in dataclass has no such field.
                setattr(config, "load_window_size_in_chunks",  # noqa: B010
                        types.MethodType(load_window, config))
            configs.append(config)
        full = [i for i, c in enumerate(configs) if c.sliding_window_size_in_chunks is None]
        sliding = sorted((i for i, c in enumerate(configs)
                          if c.sliding_window_size_in_chunks is not None),
                         key=lambda i: -configs[i].sliding_window_size_in_chunks)
        sched = types.SimpleNamespace(
            config=types.SimpleNamespace(kv_group_configs=tuple(configs)),
            _lookup_groups=tuple(full + sliding), _sliding_window_groups=tuple(sliding),
            _mamba_align_size=mamba_align(geometry, configs), _chunks_being_loaded=set(),
            manager=_Manager(answer, log), _events_tracker=_EventsTracker(),
            # the geometry's hash mode (docs/CONTRACT.md 2.1), read where a release has it
            use_lookahead_block_hashes=bool(geometry.hash_lookahead),
        )
        sched._sliding_window_lookup = types.MethodType(f["sw_scan"], sched)
        sched._maximal_prefix_lookup = types.MethodType(f["prefix_scan"], sched)
        request = types.SimpleNamespace(num_tokens=num_tokens, request_id="audit")
        states = tuple(types.SimpleNamespace(
            offload_keys=[(g, k) for k in range(
                hashed_tokens(num_tokens, geometry.tokens_per_hash,
                              geometry.hash_lookahead) // configs[g].tokens_per_chunk)],
            lookup_hit_end_chunk_idx=0) for g in range(len(configs)))
        req_status = types.SimpleNamespace(
            num_locally_computed_tokens=local_hit, max_load_tokens=None, req=request,
            req_context=None, group_states=states)
        if max_hit_tokens is None:
            value = loop(sched, req_status)
        elif budgeted:
            value = loop(sched, req_status, max(0, max_hit_tokens - local_hit))
        else:
            raise RuntimeError(f"{where}: {BUDGET_NOTE}")
        if value is None:
            return UpstreamOutcome(None, log)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _garbage(where, value, "None or a token count >= 0")
        return UpstreamOutcome(local_hit + value, log)

    return run


def upstream_lookup_theorems(binding: Binding,
                             properties: Sequence[CaseProperty] | None = None,
                             ) -> list[CaseProperty]:
    """The lookup properties that declare :attr:`Observer.UPSTREAM_LOOP`
    (:func:`upstream_loop_properties`), observed on upstream's
    ``_lookup_complete_chunks`` (empty when it is not bound); their ids are
    ``Cn/upstream-<name>`` (:func:`upstream_loop_name`).
    ``properties`` are the lookup properties to choose from (by default the catalogue's;
    a scoped run passes its own, whose space enumerates the cases of its geometries)."""
    if missing_roles(binding):
        return []
    properties = upstream_loop_properties(properties)
    run = make_runner(binding)

    def observe_upstream(case: LookupCase, impl: Implementation) -> LookupObservation:
        del impl  # upstream's loop is bound to its own primitives
        outcome = run(case.geometry, case.num_tokens, case.local_hit,
                      lambda g, k: case.states[g][k], case.max_hit_tokens)
        return LookupObservation(outcome.hit_tokens, lookups=outcome.lookups)

    base = properties[0].space if properties else LOOKUP_SPACE
    # The lookup family's cases (less the budgeted ones where the release's loop takes no
    # budget, and the lookahead-hash geometries where it has no such mode): the engine
    # walks both together, so the contract's answer for a case (a per-case memo) is
    # computed once.
    in_release, mode_note = without_absent_modes(binding, lambda case: case.geometry)
    budgeted = takes_budget(binding)
    notes = [note for note in (None if budgeted else BUDGET_NOTE, mode_note) if note]
    space = filtered_space(
        base, stand_in_family(Family.LOOKUP), LastCase(observe_upstream),
        lambda case: (budgeted or case.max_hit_tokens is None) and in_release(case),
        "; ".join(notes) or None)
    return [
        dataclasses.replace(prop, name=upstream_loop_name(prop.name), space=space,
                            description=f"upstream's loop: {prop.description}")
        for prop in properties
    ]


UPSTREAM_LOOKUP = "upstream-lookup-"
"""Name prefix of the theorems observed on upstream's loop (what the engine, the root
cause and the summary recognise them by)."""


def upstream_loop_name(name: str) -> str:
    """``lookup-is-maximal`` -> ``upstream-lookup-is-maximal``: a lookup property judged
    on upstream's loop is named ``lookup-*`` (the engine checks it:
    ``engine._check_observers``), so the upstream theorem's name starts with
    :data:`UPSTREAM_LOOKUP` and gives back the catalogue name (``root_cause``)."""
    return "upstream-" + name


def upstream_loop_properties(properties: Sequence[CaseProperty] | None = None,
                             ) -> list[CaseProperty]:
    """The lookup family's properties that declare :attr:`Observer.UPSTREAM_LOOP` (of
    ``properties``, else of the catalogue): the one list of what upstream's own loop is
    judged by, here and in the plan's unchecked lines."""
    return observed_by(Observer.UPSTREAM_LOOP, properties, family=Family.LOOKUP)


__all__ = ["UpstreamError", "UpstreamOutcome", "make_runner", "missing_roles",
           "upstream_lookup_theorems", "upstream_loop_name", "upstream_loop_properties"]
