"""Upstream's own store path (``_build_store_jobs``), driven by stand-ins, and the
end-to-end check (C12) of upstream's store path composed with upstream's lookup.

The catalogue's store theorems would run kvcontract's
:class:`~kvcontract.impl.scheduler.StoreTracker` over the bound primitives; on upstream
code they need a store horizon, which no binding models from ``_build_store_jobs``' text
(issue 20): they are left unchecked, named, and this module's theorems are upstream's
store path as executed. This module runs
*upstream's* store-job builder itself, step after step of a store case, with what it
calls bound from the same release and executed too: ``_calc_num_offloadable_tokens``,
``RequestOffloadState.storable_chunks`` and ``advance_stored_idx``,
``_final_swa_alignment_blocks``, ``_reachable_store_block_mask`` over the manager's
``reachable_block_mask`` (0.30+), or ``is_store_reachable_swa_chunk`` (0.28/0.29).
Which of them a release needs is read off the builder's own calls (:func:`missing`): a
release that lacks one leaves the theorems unchecked with a line naming it.

Stand-ins carry only what those bodies read:

* the scheduler: ``config`` (the group configs built as ``SchedulerOffloadConfig.from_spec``
  builds them: ``sliding_window_size_in_chunks`` from the bound window function, the
  manager class, ``requires_cow_source`` for a Mamba group in align mode, the EAGLE flag,
  0.28/0.29's ``alignment_chunk_count``; ``blocks_per_chunk``, ``alignment_tokens``
  (``A``, the geometry's), ``retention_interval``, ``offload_prompt_only``,
  ``dcp_world_size`` 1 with the contract's block size), ``_req_status``, a manager whose
  ``prepare_store`` records the keys offered and accepts them all, job bookkeeping
  (``_generate_job_id``, ``_jobs``, the fence maps), a no-op ``_touch`` (0.28-0.30: it
  only refreshes the manager's LRU) and an events tracker;
* the request: status (``RUNNING``, ``FINISHED_STOPPED`` or ``FINISHED_ABORTED``),
  ``num_computed_tokens``, ``num_prompt_tokens``, ``num_tokens``, ``is_finished()``,
  ``shared_prefix_boundary`` None;
* per group: ``offload_keys`` (one ``(group, chunk)`` key per complete chunk of the
  request's tokens, as ``update_offload_keys`` derives them from the block hashes) and
  ``block_ids`` (the blocks allocated up to the step's frontier, ``0`` below the group's
  first live block, :func:`~kvcontract.impl.scheduler.group_first_live_block` of the
  reference: the blocks the GPU manager freed. Upstream has a null block there when it
  was never allocated, and zeroes a freed block in ``_update_req_states`` once it is
  reallocated; one not reallocated yet keeps its id and its bytes. The runner treats
  every freed block as reallocated, the case C10 guards against); a request that starts
  from a cached prefix has ``next_stored_chunk_idx`` at its chunks
  (``update_state_after_alloc`` after a load from the offload tier, chunk-level policy);
* per step a ``SchedulerOutput`` (``num_scheduled_tokens``, ``finished_req_ids``).

One request's run is an :class:`UpstreamStorePath` (:func:`make_store_path`): a builder
call per step serves every group, as upstream's does. The observation is a
:class:`~kvcontract.spec.properties.store.StoreRun` (per group the
chunks offered to ``prepare_store`` at each step and ``next_stored_chunk_idx`` after
it), so the store family's judges apply unchanged (:func:`upstream_store_theorems`).
The same path is the executable system's store path on upstream code
(:mod:`.system`), and the bound ``store_replay_boundaries`` is read off it
(:func:`executed_replay_boundaries`: what the builder passes to its mask, observed).
:func:`upstream_end_to_end_theorems` composes this producer with upstream's
``_lookup_complete_chunks`` (:mod:`.lookup`) as the consumer and keeps C12's judge.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import itertools
import math
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.scheduler import StoreTracker, group_first_live_block
from kvcontract.impl.variants import REFERENCE
from kvcontract.spec import multigroup
from kvcontract.spec.geometry import Geometry, GroupKind, GroupSpec
from kvcontract.spec.lookup import hashed_tokens
from kvcontract.spec.properties import CaseProperty
from kvcontract.spec.properties.base import CaseSpace, Family, LastCase, Observer
from kvcontract.spec.properties.catalog import observed_by
from kvcontract.spec.properties.end_to_end import (
    END_TO_END_SPACE,
    EndToEndCase,
    EndToEndObservation,
    _unread,
    consumer_keys,
    contract_supply,
    is_junction_consumer,
    manager_state,
    promise,
)
from kvcontract.spec.properties.store import (
    ENDED,
    STORE_SPACE,
    StoreCase,
    StoreRun,
    offered_chunks,
    schedule_steps,
)
from kvcontract.tools.audit import lookup
from kvcontract.tools.audit.derived_spaces import (
    filtered_space,
    stand_in_family,
    without_absent_modes,
)
from kvcontract.tools.audit.roles import ROLE_BY_NAME, Binding
from kvcontract.tools.audit.stand_ins import (
    GroupConfig,
    UpstreamRequestStatus,
    _EventsTracker,
    _manager_class,
    _namespace,
    _Record,
    cdiv,
    spec_stand_in,
)
from kvcontract.tools.audit.upstream_calls import (
    StandInGap,
    UpstreamError,
    _garbage,
    _guarded,
    stand_in_gap,
)
from kvcontract.vocabulary import RequestStatus

UPSTREAM_STORE = "upstream-store-"
"""Name prefix of the store theorems observed on upstream's store path."""
UPSTREAM_NO_LOST_HITS = "upstream-no-lost-hits"
"""C12 on upstream's store path and upstream's lookup."""

CALLED_ROLES: dict[str, tuple[str, ...]] = {
    "_calc_num_offloadable_tokens": ("offloadable_tokens",),
    "storable_chunks": ("storable_chunks",),
    "advance_stored_idx": ("advance_stored_idx",),
    "_reachable_store_block_mask": ("store_mask", "block_mask", "base_block_mask"),
    "_final_swa_alignment_blocks": ("final_swa_alignment",),
    "is_store_reachable_swa_chunk": ("store_predicate",),
}
"""What ``_build_store_jobs`` calls (``self.X``, ``req_status.X`` or a module function)
-> the binding roles executed for it (``_reachable_store_block_mask`` drives the
managers' ``reachable_block_mask``: the sliding-window one and the dense default)."""

STAND_IN_METHODS = ("_generate_job_id", "_touch")
"""Scheduler methods the builder calls that decide nothing about which chunks are
offered: a job counter, and 0.28-0.30's LRU refresh of the manager."""

RID = "audit"


# -- what a release needs -------------------------------------------------------------------
def _builder_calls(node: ast.FunctionDef) -> tuple[set[str], set[str]]:
    """``(methods, functions)``: the names the builder calls on ``self`` or its request
    state, and the bare names it calls."""
    methods: set[str] = set()
    functions: set[str] = set()
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                func.value.id in ("self", "req_status"):
            methods.add(func.attr)
        elif isinstance(func, ast.Name):
            functions.add(func.id)
    return methods, functions


def missing(binding: Binding) -> list[str]:
    """Why upstream's store path cannot run on ``binding`` (empty: it can): each missing
    function the builder calls, named as upstream names it, or a call that has neither
    a binding role nor a stand-in."""
    node = binding.nodes.get("store_jobs")
    if node is None or "store_jobs" not in binding.functions:
        return [_role_line(binding, "store_jobs")]
    methods, functions = _builder_calls(node)
    known = set(_namespace()) | set(dir(builtins))
    roles = ["window"]
    reasons = []
    for name in sorted(methods):
        if name in CALLED_ROLES:
            roles += CALLED_ROLES[name]
        elif name not in STAND_IN_METHODS and not _is_state_method(name):
            reasons.append(f"{name} (called by _build_store_jobs; no role or stand-in)")
    for name in sorted(functions):
        if name in CALLED_ROLES:
            roles += CALLED_ROLES[name]
        elif name not in known:
            reasons.append(f"{name} (called by _build_store_jobs; no role or stand-in)")
    absent = [r for r in dict.fromkeys(roles) if r not in binding.functions]
    return [_role_line(binding, r) for r in absent] + reasons


def _is_state_method(name: str) -> bool:
    """Methods of the stand-in state objects (dicts, sets, lists) the builder may call."""
    return name in ("get", "setdefault", "add", "append", "extend", "items", "keys", "values",
                    "pop", "update", "discard", "remove", "clear")


def _role_line(binding: Binding, role: str) -> str:
    record = binding.roles.get(role)
    status = record.status if record is not None else "missing"
    return f"{ROLE_BY_NAME[role].qualnames[0]} ({status})"


def unchecked(binding: Binding, wanted: set[str] | None) -> list[dict[str, Any]]:
    """The plan's line for every upstream store theorem that cannot run on ``binding``
    (the engine adds them next to the upstream lookup's)."""
    absent = missing(binding)
    lines = []
    for prop in store_path_properties():
        if absent and (wanted is None or prop.clause in wanted):
            lines.append({"clause": prop.clause, "theorem": UPSTREAM_STORE + prop.name,
                          "reason": "upstream's store path needs " + ", ".join(absent)})
    absent_lookup = lookup.missing_roles(binding)
    for prop in end_to_end_path_properties():
        if wanted is not None and prop.clause not in wanted:
            continue
        if absent or absent_lookup:
            needs = absent + [_role_line(binding, r) for r in absent_lookup]
            lines.append({"clause": prop.clause, "theorem": f"upstream-{prop.name}",
                          "reason": "upstream's store path and lookup need "
                                    + ", ".join(needs)})
        elif judges_junctions_only(prop):
            # Every case it judges is left out on stand-ins: a verdict would be vacuous.
            lines.append({"clause": prop.clause, "theorem": f"upstream-{prop.name}",
                          "reason": JUNCTION_NOTE})
    return lines


def judges_junctions_only(prop: CaseProperty) -> bool:
    """Whether ``prop`` decides junction consumers only (the stand-ins leave them out)."""
    return prop.relevant is is_junction_consumer


def store_path_properties(properties: Sequence[CaseProperty] | None = None,
                          ) -> list[CaseProperty]:
    """The store family's properties that declare ``Observer.UPSTREAM_STORE_PATH`` (of
    ``properties``, else of the catalogue): what upstream's store path is judged by."""
    return observed_by(Observer.UPSTREAM_STORE_PATH, properties, family=Family.STORE)


def end_to_end_path_properties(properties: Sequence[CaseProperty] | None = None,
                               ) -> list[CaseProperty]:
    """The end-to-end family's properties that declare both upstream observers (its
    producer is upstream's store path, its consumer upstream's loop)."""
    return [p for p in observed_by(Observer.UPSTREAM_STORE_PATH, properties,
                                   family=Family.END_TO_END)
            if Observer.UPSTREAM_LOOP in p.observable_on]


# -- the stand-ins ----------------------------------------------------------------------------
@dataclass
class UpstreamOffers:
    """One group's offers to ``prepare_store``, step by step: what the store judges read
    of a producer's tracker (``offers``)."""

    group_index: int
    offers: list[list[int]] = field(default_factory=list)
    placements: list[list[tuple[int, int, int]]] = field(default_factory=list)
    """Per step, ``(chunk, page, block)`` of every live block the step's store jobs
    write (:func:`laid_jobs`)."""


def laid_jobs(built: Any, groups: int, blocks_per_chunk: int,
              position: Callable[[int, int], int]) -> list[list[tuple[int, int, int]]]:
    """Per group, where upstream's store jobs ``built`` (job id -> ``TransferJob``) write
    each live block, as vLLM's CPU worker lays a job: per group its block ids in order
    into the group's CPU chunks (its keys, in the job's order), skipping ``block_indices
    mod blocks_per_chunk`` pages of the first; a null block (0) is a placeholder.
    ``(chunk, page, position(group, block id))``, -1 for a block of no known position."""
    laid: list[list[tuple[int, int, int]]] = [[] for _ in range(groups)]
    for job in built.values():
        spec = job.src_spec
        ids = [int(b) for b in (spec.args[0] if getattr(spec, "args", None)
                                else getattr(spec, "block_ids", ()))]
        sizes = [int(x) for x in (getattr(spec, "group_sizes", None) or [len(ids)])]
        starts = [int(x) for x in (getattr(spec, "block_indices", None) or [0] * len(sizes))]
        keys = list(job.dst_spec.args[0]) if getattr(job.dst_spec, "args", None) else []
        offset = 0
        for g, (size, first) in enumerate(zip(sizes, starts, strict=False)):
            chunks = [key[1] for key in keys if key[0] == g]
            slot = first % blocks_per_chunk
            for block_id in ids[offset:offset + size]:
                rank, page = divmod(slot, blocks_per_chunk)
                slot += 1
                if block_id and rank < len(chunks) and g < groups:
                    laid[g].append((chunks[rank], page, position(g, block_id)))
            offset += size
    return laid


class _StoreManager:
    """The offload manager as the store path sees it: ``prepare_store`` records the keys
    offered and accepts them all (every offered chunk is stored)."""

    def __init__(self) -> None:
        self.offered: list[Any] = []

    def prepare_store(self, keys: Any, req_context: Any = None) -> Any:
        keys = list(keys)
        self.offered.extend(keys)
        return types.SimpleNamespace(keys_to_store=keys, store_spec=_Record(keys))

    def touch(self, keys: Any, req_context: Any = None) -> None:
        return None


class _Stats:
    def increase_counter(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Request:
    """The request fields the store path reads."""

    def __init__(self, prompt_len: int) -> None:
        self.request_id = RID
        self.num_prompt_tokens = prompt_len
        self.num_tokens = prompt_len
        self.num_computed_tokens = 0
        self.status = UpstreamRequestStatus.RUNNING
        self.shared_prefix_boundary: int | None = None
        self.kv_transfer_params: Any = None
        self.block_hashes: list[int] = []
        """One entry per hashed block (0.34.0's lookahead mode reads how many exist)."""

    def is_finished(self) -> bool:
        finished: bool = self.status > UpstreamRequestStatus.PREEMPTED
        return finished


def _status(step_status: RequestStatus) -> UpstreamRequestStatus:
    if step_status is RequestStatus.ABORTED:
        return UpstreamRequestStatus.FINISHED_ABORTED
    if step_status is RequestStatus.FINISHED:
        return UpstreamRequestStatus.FINISHED_STOPPED
    return UpstreamRequestStatus.RUNNING


def _alignment_chunk_count(alignment: int | None, tpc: int, window: int | None) -> int | None:
    """0.28/0.29's ``GroupOffloadConfig.alignment_chunk_count`` (``from_spec``: the FA
    segment in this group's chunks, when longer than one chunk and than the window)."""
    if alignment is None or window is None or alignment <= tpc:
        return None
    per_segment = alignment // tpc
    return None if window >= per_segment else per_segment


def _block_id(group: int, block: int) -> int:
    """A distinct non-null GPU block id per group and block (0 is the null block)."""
    return 1 + group * 1_000_000 + block


class _Unset:
    """The default of :class:`UpstreamStorePath`'s ``alignment_tokens``: the geometry's."""


UNSET = _Unset()


@dataclass(frozen=True)
class _BuilderParts:
    """What every request's store path shares: the guarded builder and the group
    configs built from the binding (:func:`store_path_parts`)."""

    build: Callable[..., Any]
    where: str
    functions: dict[str, Callable[..., Any]]
    configs_of: Callable[[Geometry], list[GroupConfig]]
    passes_boundaries: bool
    """Whether the builder calls a mask that takes replay boundaries
    (``_reachable_store_block_mask``, 0.30+); 0.28/0.29's chunk predicate takes none."""


class UpstreamStorePath:
    """One request's store path on upstream's ``_build_store_jobs``: the stand-in
    scheduler of the module docstring with this request in ``_req_status``; each
    :meth:`step` calls the builder once (every group at once, as upstream does) and
    returns the chunks offered per group. What happens between builder calls (admission,
    a hit's chunks, preemption) is the driver's: :meth:`mark_computed` sets the stored
    index past a hit as ``update_state_after_alloc`` does (chunk-level policy).

    ``boundaries`` lists the ``reachable_boundaries`` each call of the mask
    (``_reachable_store_block_mask``) received, in call order: the replay boundaries
    upstream's builder passes, observed, never restated."""

    def __init__(self, parts: _BuilderParts, geometry: Geometry, prompt_len: int, *,
                 prompt_only: bool = True, max_offload_tokens: int | None = None,
                 loaded_from_offload: bool = False,
                 first_live: Callable[[GroupSpec, int], int] | None = None,
                 alignment_tokens: int | _Unset | None = UNSET) -> None:
        self.geometry = geometry
        self.prompt_len = prompt_len
        self._parts = parts
        self._first_live = first_live or (
            lambda group, computed: group_first_live_block(REFERENCE, geometry, group,
                                                           computed))
        self.boundaries: list[tuple[int, ...]] = []
        f = parts.functions
        configs = parts.configs_of(geometry)
        self._manager = _StoreManager()
        jobs = itertools.count()
        alignment = (geometry.alignment_tokens if isinstance(alignment_tokens, _Unset)
                     else alignment_tokens)
        sched = types.SimpleNamespace(
            config=types.SimpleNamespace(
                kv_group_configs=tuple(configs), blocks_per_chunk=geometry.blocks_per_chunk,
                tokens_per_hash=geometry.hash_block_size, num_workers=1,
                offload_prompt_only=prompt_only, supports_partial_tail=False,
                alignment_tokens=alignment,
                retention_interval=geometry.retention_interval, dcp_world_size=1),
            manager=self._manager, _connector_stats=_Stats(),
            _events_tracker=_EventsTracker(), _jobs={}, _block_id_to_pending_jobs={},
            _current_batch_allocated_block_ids=set(), _current_batch_jobs_to_flush=set(),
            _sliding_window_groups=tuple(
                i for i, c in enumerate(configs) if c.sliding_window_size_in_chunks is not None),
            # the geometry's hash mode (docs/CONTRACT.md 2.1); releases with lookahead
            # block hashes read the switch
            use_lookahead_block_hashes=bool(geometry.hash_lookahead),
        )
        sched._generate_job_id = lambda: next(jobs)
        sched._touch = lambda req_status: None
        for name, role in (("_calc_num_offloadable_tokens", "offloadable_tokens"),
                           ("_final_swa_alignment_blocks", "final_swa_alignment")):
            if role in f:
                setattr(sched, name, types.MethodType(f[role], sched))
        if "store_mask" in f:
            sched._reachable_store_block_mask = self._recording_mask(f["store_mask"], sched)
        self._request = _Request(prompt_len)
        self._states = tuple(types.SimpleNamespace(
            offload_keys=[], block_ids=[], next_stored_chunk_idx=0, num_hit_chunks=0,
            lookup_hit_end_chunk_idx=0) for _ in geometry.groups)
        req_status = types.SimpleNamespace(
            config=sched.config, req=self._request, req_context=None,
            group_states=self._states, max_load_tokens=None,
            max_offload_tokens=max_offload_tokens, num_locally_computed_tokens=0,
            transfer_jobs=set(), loaded_from_offload=loaded_from_offload,
            finished_signaled=False, partial_tail_boundary=None)
        req_status.storable_chunks = types.MethodType(f["storable_chunks"], req_status)
        req_status.advance_stored_idx = types.MethodType(f["advance_stored_idx"], req_status)
        sched._req_status = {RID: req_status}
        self._sched = sched
        self._allocated = [0] * len(geometry.groups)
        self.placements: list[list[tuple[int, int, int]]] = [[] for _ in geometry.groups]
        """Per group, where the last step's store jobs write each live block."""

    def _recording_mask(self, mask: Callable[..., Any], sched: Any) -> Callable[..., Any]:
        """``_reachable_store_block_mask`` bound to ``sched``, recording the boundaries
        the builder passes (whatever form the call takes: the mask's own signature
        binds it). A mask without the parameter receives none: ``()``."""
        signature = inspect.signature(mask)

        def recording(*args: Any, **kwargs: Any) -> Any:
            try:
                passed = signature.bind(sched, *args, **kwargs).arguments
            except TypeError:
                passed = {}  # the call itself raises below, as upstream's would
            found = passed.get("reachable_boundaries", ())
            self.boundaries.append(tuple(found) if isinstance(found, (tuple, list)) else
                                   (found,))
            return mask(sched, *args, **kwargs)

        return recording

    def next_stored_chunk_idx(self, group_index: int) -> int:
        """The group's ``next_stored_chunk_idx`` as upstream's state holds it."""
        index = self._states[group_index].next_stored_chunk_idx
        if not isinstance(index, int) or isinstance(index, bool):
            raise _garbage(self._parts.where, index, "next_stored_chunk_idx, an int")
        return index

    def mark_computed(self, group_index: int, num_chunks: int) -> None:
        """Chunks ``[0, num_chunks)`` came from a hit: the stored index moves past them
        (``update_state_after_alloc``, chunk-level policy; never back)."""
        state = self._states[group_index]
        state.next_stored_chunk_idx = max(state.next_stored_chunk_idx, num_chunks)

    def step(self, status: RequestStatus | str, num_computed: int, num_scheduled: int,
             num_tokens: int) -> list[list[int]]:
        """One scheduler step of the request (the arguments of
        :meth:`kvcontract.impl.scheduler.StoreTracker.step`): the builder's offers, per
        group, in the order it offered them."""
        status = RequestStatus(status)
        geometry = self.geometry
        groups = geometry.groups
        ended = status in ENDED
        request = self._request
        request.status = _status(status)
        request.num_computed_tokens = num_computed
        request.num_tokens = max(num_tokens, self.prompt_len)
        # Hashes exist for whole hash blocks with their lookahead tokens (2.1).
        request.block_hashes = list(range(
            hashed_tokens(request.num_tokens, geometry.tokens_per_hash,
                          geometry.hash_lookahead) // geometry.tokens_per_hash))
        for g, (group, state) in enumerate(zip(groups, self._states, strict=True)):
            bs = geometry.block_tokens(group)
            if not ended:
                self._allocated[g] = max(self._allocated[g], cdiv(num_computed + num_scheduled,
                                                                  bs))
            live = self._first_live(group, num_computed)
            state.offload_keys = [(g, k) for k in range(
                len(request.block_hashes) * geometry.tokens_per_hash
                // geometry.chunk_tokens(group))]
            state.block_ids = [0 if j < live else _block_id(g, j)
                               for j in range(self._allocated[g])]
        output = types.SimpleNamespace(
            num_scheduled_tokens={} if ended else {RID: num_scheduled},
            finished_req_ids={RID} if ended else set(), kv_connector_block_state=None,
            kv_cache_block_copies=None, preempted_req_ids=None, scheduled_new_reqs=[])
        self._manager.offered = []
        built = self._parts.build(self._sched, output)
        if not isinstance(built, dict):
            raise _garbage(self._parts.where, built, "a dict of store jobs")
        offers: list[list[int]] = [[] for _ in groups]
        for key in self._manager.offered:
            if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], int)
                    and 0 <= key[0] < len(groups)):
                raise _garbage(self._parts.where, key, "an offload key of the request")
            offers[key[0]].append(key[1])
        self.placements = laid_jobs(
            built, len(groups), geometry.blocks_per_chunk,
            lambda g, block_id: block_id - _block_id(g, 0) if block_id >= _block_id(g, 0)
            and block_id < _block_id(g + 1, 0) else -1)
        return offers


def store_path_parts(binding: Binding) -> _BuilderParts:
    """The shared parts of upstream's store path on ``binding`` (the roles of
    :func:`missing` must be bound)."""
    f = binding.functions
    rb = binding.roles["store_jobs"]
    where = f"{rb.qualname} ({rb.path}:{rb.line})"
    builder = f["store_jobs"]
    if "store_predicate" in f:
        # 0.28/0.29 call the module function by name: give the builder the bound one.
        builder = types.FunctionType(
            builder.__code__, {**builder.__globals__,
                               "is_store_reachable_swa_chunk": f["store_predicate"]},
            builder.__name__, builder.__defaults__, builder.__closure__)
    window = _guarded(f"{binding.roles['window'].qualname} ({binding.roles['window'].path})",
                      f["window"])
    swa_cls = _manager_class(binding)
    dense_cls = None
    if "base_block_mask" in f:
        dense_cls = type("FullAttentionManager", (),
                         {"reachable_block_mask": classmethod(f["base_block_mask"])})

    def configs_of(geometry: Geometry) -> list[GroupConfig]:
        alignment = geometry.alignment_tokens
        configs = []
        for index, group in enumerate(geometry.groups):
            tpc = geometry.chunk_tokens(group)
            bs = geometry.block_tokens(group)
            spec = spec_stand_in(geometry, group)
            sw_chunks = window(spec, tpc)
            configs.append(GroupConfig(
                group_idx=index, tokens_per_block=bs, tokens_per_chunk=tpc,
                sliding_window_size_in_chunks=sw_chunks, kv_cache_spec=spec,
                manager_cls=swa_cls if group.kind is GroupKind.SLIDING_WINDOW else dense_cls,
                requires_cow_source=group.kind is GroupKind.MAMBA,
                is_eagle_group=group.eagle,
                alignment_chunk_count=(_alignment_chunk_count(alignment, tpc, sw_chunks)
                                       if group.kind is GroupKind.SLIDING_WINDOW else None)))
        return configs

    node = binding.nodes.get("store_jobs")
    methods = _builder_calls(node)[0] if node is not None else set()
    return _BuilderParts(_guarded(where, builder), where, dict(f), configs_of,
                         "_reachable_store_block_mask" in methods and "store_mask" in f)


def make_store_path(binding: Binding) -> Callable[..., UpstreamStorePath]:
    """``new(geometry, prompt_len, **options) -> UpstreamStorePath``: a request's store
    path on upstream's builder (options: those of :class:`UpstreamStorePath`)."""
    parts = store_path_parts(binding)

    def new(geometry: Geometry, prompt_len: int, **options: Any) -> UpstreamStorePath:
        return UpstreamStorePath(parts, geometry, prompt_len, **options)

    return new


def make_store_runner(binding: Binding) -> Callable[[StoreCase], StoreRun]:
    """``run(case) -> StoreRun`` on upstream's ``_build_store_jobs`` (the roles of
    :func:`missing` must be bound)."""
    new_path = make_store_path(binding)

    def run(case: StoreCase) -> StoreRun:
        geometry = case.geometry
        groups = geometry.groups
        path = new_path(geometry, case.prompt_len, prompt_only=case.prompt_only,
                        max_offload_tokens=case.max_offload_tokens,
                        loaded_from_offload=bool(case.start_hit))
        for g, group in enumerate(groups):
            # A cached prefix loaded from the offload tier: update_state_after_alloc sets
            # the stored index past its chunks (chunk-level policy).
            path.mark_computed(g, cdiv(case.start_hit, geometry.chunk_tokens(group)))
        offers = [UpstreamOffers(g) for g in range(len(groups))]
        next_indices: list[list[int]] = [[] for _ in groups]
        frontiers = []
        steps = schedule_steps(case)
        for step in steps:
            if step.status is RequestStatus.PREFILLING:
                frontiers.append(step.num_computed)
            offered = path.step(step.status, step.num_computed, step.num_scheduled,
                                step.num_tokens)
            for g, offer in enumerate(offers):
                offer.offers.append(offered[g])
                offer.placements.append(path.placements[g])
                next_indices[g].append(path.next_stored_chunk_idx(g))
        trackers = cast(list[StoreTracker], offers)  # the judges read ``offers`` only
        return StoreRun(trackers, next_indices, frontiers, steps[-1].num_computed)

    return run


# -- the replay boundaries, executed ----------------------------------------------------------
REPLAY_PROBE = (
    "observed: the reachable_boundaries upstream's _build_store_jobs passes to "
    "_reachable_store_block_mask, on one prefill step of the prompt (a full-attention "
    "group whose block divides the prompt and the retention interval, EAGLE when asked)")


def executed_replay_boundaries(binding: Binding) -> Callable[..., tuple[int, ...]]:
    """The ``store_replay_boundaries`` field of the bound bundle, executed: upstream's
    builder runs one prefill step of a ``prompt_len``-token prompt under the given
    alignment (the stand-in config's ``alignment_tokens``), retention interval and EAGLE
    flag, and what its mask calls receive is the answer (:data:`REPLAY_PROBE`). 0.28/0.29's
    builder calls no mask with boundaries (``is_store_reachable_swa_chunk``): ``()``.
    Calls that disagree (a builder passing a group its own boundaries) cannot be one
    field: :class:`UpstreamError`. Memoized on the arguments."""
    parts = store_path_parts(binding)
    memo: dict[tuple[Any, ...], tuple[int, ...]] = {}

    def store_replay_boundaries(prompt_len: int, alignment_tokens: int | None,
                                retention_interval: int | None,
                                use_eagle: bool) -> tuple[int, ...]:
        for value in (prompt_len, alignment_tokens, retention_interval, use_eagle):
            if value is not None and not isinstance(value, int):
                # An executed probe answers plain values only: a symbolic argument (the
                # prover lifting a theorem) is refused, so the audit searches concretely.
                from kvcontract.spec.symbolic import LiftError

                raise LiftError("the store path's replay boundaries are observed by "
                                "executing _build_store_jobs, on plain ints only")
        key = (prompt_len, alignment_tokens, retention_interval, bool(use_eagle))
        if key not in memo:
            memo[key] = _probe_boundaries(parts, *key)
        return memo[key]

    return store_replay_boundaries


def _probe_boundaries(parts: _BuilderParts, prompt_len: int, alignment_tokens: int | None,
                      retention_interval: int | None, use_eagle: bool) -> tuple[int, ...]:
    if not parts.passes_boundaries or prompt_len < 1:
        return ()  # no mask takes boundaries, or no token to store
    # One chunk at least within the prompt; a block dividing the retention interval, as
    # the geometry requires (Geometry validates retention % A).
    block = math.gcd(prompt_len, retention_interval or 0)
    geometry = Geometry((GroupSpec(GroupKind.FULL, block, eagle=use_eagle),),
                        retention_interval=retention_interval)
    path = UpstreamStorePath(parts, geometry, prompt_len, alignment_tokens=alignment_tokens)
    path.step(RequestStatus.PREFILLING, 0, prompt_len, prompt_len)
    seen = set(path.boundaries)
    if len(seen) > 1:
        raise UpstreamError(
            f"{parts.where} passed different replay boundaries to its mask calls in one "
            f"step ({sorted(seen)}): not one set per prompt, as store_replay_boundaries is")
    return next(iter(seen), ())


# -- the theorems -----------------------------------------------------------------------------
def _has_mamba(geometry: Geometry) -> bool:
    return any(group.kind is GroupKind.MAMBA for group in geometry.groups)


MAMBA_NOTE = ("geometries with a Mamba group are left out: upstream stores a Mamba state "
              "through the GPU's boundary hand-off (_build_aligned_boundary_store_jobs), "
              "not _build_store_jobs, which skips a group with requires_cow_source")


JUNCTION_NOTE = ("junction consumers are left out: the stand-in store path and lookup "
                 "decide no shared-prefix junction (shared_prefix_boundary); they are "
                 "judged on vLLM's engine (docs/CONTRACT.md 9.3)")


def _without_mamba(space: CaseSpace[Any, Any], family: str, observe: Callable[[Any, Any], Any],
                   geometry_of: Callable[[Any], Geometry], binding: Binding,
                   junctions: bool = True) -> CaseSpace[Any, Any]:
    """``space`` less the Mamba geometries, the modes the release lacks and (without
    ``junctions``: the end-to-end space on stand-ins) the junction consumers."""
    in_release, note = without_absent_modes(binding, geometry_of)
    notes = [MAMBA_NOTE, *([note] if note else []), *([] if junctions else [JUNCTION_NOTE])]

    def accepts(case: Any) -> bool:
        if _has_mamba(geometry_of(case)) or not in_release(case):
            return False
        return junctions or getattr(getattr(case, "consumer", None), "kind", "") != "junction"

    return filtered_space(space, family, observe, accepts, "; ".join(notes))


def upstream_store_theorems(binding: Binding,
                            properties: Sequence[CaseProperty] | None = None,
                            ) -> list[CaseProperty]:
    """The store family (C8 ``offered-at-most-once``, ``stores-only-demanded``; C9
    ``store-horizon``, ``store-steps``; C10 ``stores-well-formed``), observed on
    upstream's ``_build_store_jobs`` (empty when it cannot run); ids
    ``Cn/upstream-store-<name>``. Every judge applies: each reads only the offers per
    step, the stored index after each step and the spec. ``properties``: the store
    properties to choose from (by default the catalogue's; a scoped run passes its own),
    of which those declaring ``Observer.UPSTREAM_STORE_PATH`` run
    (:func:`store_path_properties`)."""
    if binding.target.kind == "builtin" or missing(binding):
        return []
    properties = store_path_properties(properties)
    run = make_store_runner(binding)

    def observe_upstream(case: StoreCase, impl: Implementation) -> StoreRun:
        del impl  # upstream's store path is bound to its own functions
        return run(case)

    base = properties[0].space if properties else STORE_SPACE
    space = _without_mamba(base, stand_in_family(Family.STORE), LastCase(observe_upstream),
                           lambda case: case.geometry, binding)
    return [dataclasses.replace(prop, name=UPSTREAM_STORE + prop.name, space=space, uses=(),
                                description=f"upstream's store path: {prop.description}")
            for prop in properties]


class ConsumerError(Exception):
    """The consumer's side of C12 (upstream's lookup) raised: blamed on the lookup."""


def upstream_end_to_end_theorems(binding: Binding,
                                 properties: Sequence[CaseProperty] | None = None,
                                 ) -> list[CaseProperty]:
    """C12 ``no-lost-hits`` with the producer run by upstream's ``_build_store_jobs``
    and the consumer by upstream's ``_lookup_complete_chunks`` (empty when either cannot
    run); id ``C12/upstream-no-lost-hits``. The consumer has a key per complete chunk of
    its tokens (upstream's loop asserts as much); those past the prefix it shares with
    the producer hash differently, so the manager answers MISS for them (the
    observation's ``num_keys``, as upstream meets it). The judge is unchanged."""
    if binding.target.kind == "builtin" or missing(binding) or lookup.missing_roles(binding):
        return []
    properties = end_to_end_path_properties(properties)
    store_run = make_store_runner(binding)
    lookup_run = lookup.make_runner(binding)
    producer_run: LastCase[StoreCase, StoreRun] = LastCase(
        lambda producer, _impl: store_run(producer))

    def observe_upstream(case: EndToEndCase, impl: Implementation) -> EndToEndObservation:
        del impl
        run = producer_run(case.producer)
        offered = [offered_chunks(tracker) for tracker in run.trackers]
        keys = consumer_keys(case.geometry, case.consumer.num_tokens,
                             case.consumer.shared_tokens)
        observation = EndToEndObservation(None, offered, keys)
        try:
            outcome = lookup_run(case.geometry, case.consumer.num_tokens, 0,
                                 lambda g, k: manager_state(observation, g, k))
        except StandInGap:
            raise  # the tool's gap, not the lookup's: the theorem is UNKNOWN
        except Exception as exc:
            if stand_in_gap(exc) is not None:
                raise StandInGap(stand_in_gap(exc) or "") from exc
            shown = str(exc) if isinstance(exc, UpstreamError) else \
                f"the consumer's lookup raised {type(exc).__name__}: {exc}"
            raise ConsumerError(shown) from exc
        observation.hit_tokens = outcome.hit_tokens
        return observation

    base = properties[0].space if properties else END_TO_END_SPACE
    space = _without_mamba(base, stand_in_family(Family.END_TO_END), LastCase(observe_upstream),
                           lambda case: case.geometry, binding, junctions=False)
    return [dataclasses.replace(prop, name=f"upstream-{prop.name}", space=space, uses=(),
                                description=f"upstream's store path and lookup: "
                                            f"{prop.description}")
            for prop in properties if not judges_junctions_only(prop)]


def is_upstream(name: str) -> bool:
    """Whether a theorem name is one of this module's."""
    return name.startswith(UPSTREAM_STORE) or is_upstream_end_to_end(name)


def is_upstream_end_to_end(name: str) -> bool:
    """Whether a theorem name is an end-to-end property's on upstream's store path and
    loop (``upstream-<name>`` of :func:`end_to_end_path_properties`)."""
    return name == UPSTREAM_NO_LOST_HITS or name in {
        f"upstream-{p.name}" for p in end_to_end_path_properties()}


def blame(theorem: CaseProperty, case: Any) -> tuple[list[str], str]:
    """``(blamed upstream functions, binding role to locate)`` of a counterexample: the
    store path's theorems blame ``_build_store_jobs``; C12 blames the store path when
    it failed to offer a chunk the promised hit reads (or raised, or stored more than
    owed), else the lookup."""
    store = (["_build_store_jobs"], "store_jobs")
    if not isinstance(case, EndToEndCase):
        return store
    lookup_side = (["_lookup_complete_chunks"], "multi_group_lookup")
    try:
        observation = theorem.space.observe(case, REFERENCE)
    except ConsumerError:
        return lookup_side
    except Exception:
        return store  # the producer's run raised
    promised = promise(case)
    supply = contract_supply(case.producer)
    geometry = case.geometry
    if promised:
        for g, group in enumerate(geometry.groups):
            lo, hi = multigroup.read_range(geometry, group, promised, 0)
            if any(k in supply[g] and k not in observation.offered[g] for k in range(lo, hi)):
                return store
    hit = observation.hit_tokens
    if hit is not None and hit > promised and _unread(case, observation, hit) is None:
        return store  # every chunk read is HIT: the producer stored more than it owes
    return lookup_side


__all__ = ["UPSTREAM_NO_LOST_HITS", "UPSTREAM_STORE", "ConsumerError", "UpstreamOffers",
           "blame", "is_upstream", "make_store_runner", "missing", "unchecked",
           "upstream_end_to_end_theorems", "upstream_store_theorems"]
