"""What the audit binds, and the record of what it bound.

:data:`ROLES` are the upstream functions the audit looks for (qualified names, and files
in search order), :data:`FIELD_ROLES` the :class:`~kvcontract.impl.bundle.Implementation`
fields built from them, and a :class:`Binding` is what was found for one target (a
:class:`RoleBinding` per role, the compiled functions, the adapted bundle). Its own
module below :mod:`.binding` (which fills a Binding) and :mod:`.lookup` and :mod:`.store`
(which drive the bound functions), so those read the record without importing each other.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.tools.audit.audited_files import MANAGER, OFFLOAD_CONFIG, SCHEDULER
from kvcontract.tools.audit.targets import Target

SCHED_CLS = "OffloadingConnectorScheduler"
SWM_CLS = "SlidingWindowManager"


@dataclass(frozen=True)
class RoleSpec:
    """One upstream function the audit looks for."""

    role: str
    qualnames: tuple[str, ...]
    """Qualified names, preferred first (a class method is ``Class.method``)."""
    files: tuple[str, ...]
    """Files relative to the vllm package, in search order (0.33 first where it moved)."""
    what: str


ROLES: tuple[RoleSpec, ...] = (
    RoleSpec("skipped", (f"{SWM_CLS}.get_num_skipped_tokens",), (MANAGER,),
             "tokens skipped below the window (allocation retention)"),
    RoleSpec("window", ("get_sliding_window_size_in_chunks",), (OFFLOAD_CONFIG, SCHEDULER),
             "window size W in chunks"),
    RoleSpec("load_window", ("GroupOffloadConfig.load_window_size_in_chunks",), (SCHEDULER,),
             "load window lw(N) for an unaligned boundary"),
    RoleSpec("sw_scan", (f"{SCHED_CLS}._sliding_window_lookup",), (SCHEDULER,),
             "sliding-window scanner"),
    RoleSpec("prefix_scan", (f"{SCHED_CLS}._maximal_prefix_lookup",), (SCHEDULER,),
             "full-attention prefix scanner"),
    RoleSpec("store_mask", (f"{SCHED_CLS}._reachable_store_block_mask",), (SCHEDULER,),
             "store reachability mask (scheduler side, MTP widening)"),
    RoleSpec("block_mask", (f"{SWM_CLS}.reachable_block_mask",), (MANAGER,),
             "reachability block mask"),
    RoleSpec("contiguous_blocks", (f"{SWM_CLS}._contiguous_blocks_for_hit",), (MANAGER,),
             "blocks a hit needs (used by the block mask)"),
    RoleSpec("store_predicate", ("is_store_reachable_swa_chunk",), (SCHEDULER,),
             "chunk-level store reachability predicate (0.28/0.29 shape)"),
    RoleSpec("multi_group_lookup", (f"{SCHED_CLS}._lookup_complete_chunks",), (SCHEDULER,),
             "multi-group lookup with convergence"),
    RoleSpec("store_jobs", (f"{SCHED_CLS}._build_store_jobs",), (SCHEDULER,),
             "store-job builder (executed by the upstream store path, tools/audit/store.py; "
             "never read for a modelled horizon)"),
    RoleSpec("mamba_align", ("resolve_mamba_align_size",), (SCHEDULER,),
             "the Mamba alignment of the hit window (align cache mode)"),
    # What upstream's store path (_build_store_jobs) calls; executed by tools/audit/store.py.
    RoleSpec("offloadable_tokens", (f"{SCHED_CLS}._calc_num_offloadable_tokens",), (SCHEDULER,),
             "tokens a store job may cover (max_offload_tokens, offload_prompt_only)"),
    RoleSpec("storable_chunks", ("RequestOffloadState.storable_chunks",), (SCHEDULER,),
             "storable chunks of a group (EAGLE volatile chunk, allocated and keyed chunks)"),
    RoleSpec("advance_stored_idx", ("RequestOffloadState.advance_stored_idx",), (SCHEDULER,),
             "stored-chunk index advance of a step that stores nothing"),
    RoleSpec("final_swa_alignment", (f"{SCHED_CLS}._final_swa_alignment_blocks",),
             (SCHEDULER,), "final-tail alignment in blocks of a non-EAGLE SWA group"),
    RoleSpec("base_block_mask", ("SingleTypeKVCacheManager.reachable_block_mask",), (MANAGER,),
             "the default (dense) block mask of the managers that keep every block (FA)"),
)
ROLE_BY_NAME = {r.role: r for r in ROLES}

FIELD_ROLES: dict[str, tuple[str, ...]] = {
    "get_num_skipped_tokens": ("skipped",),
    "retained_block_range": ("skipped",),
    "load_chunk_range": ("skipped",),
    "get_sliding_window_size_in_chunks": ("window",),
    "load_window_size_in_chunks": ("load_window",),
    "sliding_window_lookup": ("sw_scan",),
    "prefix_lookup": ("prefix_scan",),
    "is_block_reachable": ("reachability",),
    "store_final_segment_end": ("store_horizon",),
    "store_replay_boundaries": ("store_jobs",),
}
"""Implementation field -> the binding roles it is built from (pseudo-roles
``reachability`` and ``store_horizon`` are resolved from several upstream shapes)."""


@dataclass
class RoleBinding:
    """What the audit found for one role (printed, and in the report's ``bindings``)."""

    role: str
    status: str
    """``found``, ``missing``, ``derived`` (composed from found functions) or ``error``.
    Nothing is ``inferred``: no behaviour of upstream is modelled from its source text."""
    what: str
    qualname: str | None = None
    path: str | None = None
    line: int | None = None
    signature: str | None = None
    shape: str | None = None
    note: str = ""
    source: str | None = None
    """Where a found role's definition came from: ``patch`` (the ``module:`` file),
    ``base`` (the base release it is laid over) or ``target`` (the tree's own file)."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def where(self) -> str:
        return f"{self.path}:{self.line}" if self.path else "-"


@dataclass
class Binding:
    """The bound target: role records, compiled functions and the adapted bundle."""

    target: Target
    roles: dict[str, RoleBinding] = field(default_factory=dict)
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)
    nodes: dict[str, ast.FunctionDef] = field(default_factory=dict)
    """The located definition of each found role (inspected, e.g. the store builder)."""
    implementation: Implementation | None = None
    missing_fields: dict[str, str] = field(default_factory=dict)
    """Implementation field -> why it could not be bound."""
    engine: Any = None
    """The target's vLLM as the judge (:class:`kvcontract.tools.audit.on_engine.
    EngineJudge`), set by :func:`~kvcontract.tools.audit.on_engine.prepare_engine`'s
    caller; None: the ``upstream-*`` theorems run on stand-ins."""
    engine_why: str = ""
    """Why there is no engine (empty when there is one, or for a built-in target)."""
    engine_fallback: bool = False
    """The engine was wanted (``--judge auto``) and could not run: the stand-ins'
    findings are ``unconfirmed`` (exit 3), never a defect of the release. False when
    stand-ins were chosen (``--judge stand-ins``, or a binding no engine was offered)."""

    def location(self, role: str) -> tuple[str, int] | None:
        rb = self.roles.get(role)
        if rb is None or rb.path is None or rb.line is None:
            return None
        return rb.path, rb.line

    def field_location(self, field_name: str) -> tuple[str, int] | None:
        for role in FIELD_ROLES.get(field_name, ()):
            for candidate in _pseudo_sources(self, role):
                loc = self.location(candidate)
                if loc:
                    return loc
        return None

    def to_json(self) -> list[dict[str, Any]]:
        return [rb.to_json() for rb in self.roles.values()]


def _pseudo_sources(binding: Binding, role: str) -> list[str]:
    if role == "reachability":
        return ["store_mask", "store_predicate", "block_mask"]
    if role == "store_horizon":
        return ["store_jobs", "store_predicate"]
    return [role]


def _where(binding: Binding, role: str) -> str:
    """A bound role as error messages name it: ``qualname (path:line)``."""
    rb = binding.roles[role]
    return f"{rb.qualname} ({rb.path}:{rb.line})"


def has_lookahead_hashes(binding: Binding) -> bool:
    """Whether the bound release's offloading code has the lookahead block-hash mode
    (docs/CONTRACT.md 2.1: a bound function reads ``use_lookahead_block_hashes``): a
    capability found in the code, not by version."""
    return any("use_lookahead_block_hashes" in getattr(getattr(fn, "__code__", None),
                                                        "co_names", ())
               for fn in binding.functions.values())
