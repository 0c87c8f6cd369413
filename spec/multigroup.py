"""Multi-group lookup: which boundary every group accepts (docs/CONTRACT.md 4.4), declaratively.

A group *accepts* a boundary ``N`` (tokens) when every chunk it must read for ``N`` is
present: its load set (:mod:`kvcontract.spec.retention`) and, for an unverified EAGLE
group, the peek chunk after it. Within one chunk of a group, acceptance is upward
closed (a larger ``N`` has less padding, hence a smaller window ending at the same chunk),
so the largest boundary accepted by all groups is also what a scan that only proposes
chunk ends can reach. The contract's answer is that boundary (C4), accepted only when
every chunk read for it is HIT (C2), deferred only when a chunk read for it is pending or
an asynchronous lookup is in flight (C3).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvcontract.spec.arith import Num, floordiv, max_, min_
from kvcontract.spec.geometry import Geometry, GroupKind, GroupSpec
from kvcontract.spec.lookup import HIT, HIT_PENDING, LookupResult, hashed_tokens
from kvcontract.spec.retention import (
    full_attention_load_chunk_range,
    load_chunk_range,
    retained_block_range,
)


def initial_max_hit(geometry: Geometry, num_tokens: int) -> int:
    """``maxhit``: the last prompt token is recomputed for logits when a group has a
    window (sliding window or Mamba: ``Geometry.recomputes_last_token``)."""
    return num_tokens - 1 if geometry.recomputes_last_token else num_tokens


def lookup_cap(geometry: Geometry, num_tokens: Num, max_hit_tokens: Num | None) -> Num:
    """The largest boundary a lookup may answer: :func:`initial_max_hit`, then the
    scheduling budget ``max_hit_tokens`` (the local hit plus what a step may load), never
    the other way round: a budget below the request already leaves its last token to
    compute, so it is not lowered again (docs/CONTRACT.md 4.4, C4)."""
    cap = initial_max_hit(geometry, num_tokens)
    return cap if max_hit_tokens is None else min_(cap, max_hit_tokens)


def complete_chunks(geometry: Geometry, group: GroupSpec, num_tokens: int) -> int:
    """Offload keys exist only for complete chunks of the hashed tokens
    (:func:`~kvcontract.spec.lookup.hashed_tokens`)."""
    keyed = hashed_tokens(num_tokens, geometry.tokens_per_hash, geometry.hash_lookahead)
    return int(keyed // geometry.chunk_tokens(group))


def load_range(geometry: Geometry, group: GroupSpec, hit: int, local_hit: int) -> tuple[int, int]:
    """The chunks a group loads for an external hit ``hit`` after a local hit."""
    bs = geometry.block_tokens(group)
    bpc = geometry.blocks_per_chunk
    if group.kind is GroupKind.SLIDING_WINDOW:
        assert group.sliding_window is not None
        start, end = load_chunk_range(
            hit, local_hit, bs, bpc, group.sliding_window, group.extra_retained_tokens
        )
        return int(start), int(end)
    if group.kind is GroupKind.MAMBA:
        # A Mamba group's state lives in the chunk that ends at the boundary.
        tpc = geometry.chunk_tokens(group)
        return max(local_hit // tpc, hit // tpc - 1), hit // tpc
    start, end = full_attention_load_chunk_range(hit, local_hit, bs, bpc)
    return int(start), int(end)


def mamba_first_live_block(num_computed: Num, tokens_per_chunk: Num,
                           blocks_per_chunk: Num) -> Num:
    """The first block a Mamba group holds after ``num_computed`` tokens: the first block
    of the chunk whose end is the last chunk end at or before them (its state; the start
    of its load range for a hit there), block 0 before the first chunk end. On ints and
    Z3 terms alike."""
    return max_(floordiv(num_computed, tokens_per_chunk) - 1, 0) * blocks_per_chunk


def first_live_block(geometry: Geometry, group: GroupSpec, num_computed: int) -> int:
    """First block a group still holds after ``num_computed`` tokens (blocks below it are
    freed or null).

    SWA: the start of ``Ret(n)``; Mamba: the first block of the chunk holding the state
    at the last chunk end (the start of its load range for a hit of ``n``); FA: 0. The
    spec side of ``impl/scheduler.group_first_live_block``.
    """
    if group.kind is GroupKind.SLIDING_WINDOW:
        assert group.sliding_window is not None
        first, _ = retained_block_range(
            num_computed, geometry.block_tokens(group), group.sliding_window,
            group.extra_retained_tokens,
        )
        return int(first)
    if group.kind is GroupKind.MAMBA:
        return int(mamba_first_live_block(num_computed, geometry.chunk_tokens(group),
                                          geometry.blocks_per_chunk))
    return 0


def read_range(geometry: Geometry, group: GroupSpec, hit: int, local_hit: int) -> tuple[int, int]:
    """The chunks a group must find present for ``hit``: its load set plus the EAGLE peek."""
    start, end = load_range(geometry, group, hit, local_hit)
    return start, end + (1 if geometry.drops_eagle_block(group) else 0)


def group_read_requirement(
    geometry: Geometry, group: GroupSpec, hit: int, local_hit: int, num_tokens: int
) -> tuple[int, int] | None:
    """The chunks ``[start, end)`` that must be present for ``group`` to serve ``hit``,
    or None when no chunk states could make it serve ``hit``."""
    tpc = geometry.chunk_tokens(group)
    if group.kind is GroupKind.MAMBA and hit % tpc:
        return None
    if hit // tpc <= local_hit // tpc:
        return None  # less than one chunk beyond the local hit: nothing to gain
    start, end = read_range(geometry, group, hit, local_hit)
    if end > complete_chunks(geometry, group, num_tokens):
        return None
    return start, end


def full_attention_served(geometry: Geometry, num_tokens: int, local_hit: int,
                          states: Sequence[Sequence[LookupResult]], cap: int,
                          ) -> tuple[int, frozenset[tuple[int, int]]]:
    """The largest boundary past ``local_hit``, at most ``cap``, that every full-attention
    group serves with the chunks ``states`` has present (HIT or HIT_PENDING), and the
    ``(group, chunk)`` pairs it reads there; ``(0, {})`` when they serve none (or the
    geometry has no full-attention group). What a shared-prefix junction is registered
    at, before the first sparse group's keys clamp it (docs/CONTRACT.md 9.3).
    ``states[g][k]``: the state of chunk ``k`` of group ``g``."""
    groups = geometry.groups
    full = [g for g, spec in enumerate(groups) if spec.kind is GroupKind.FULL]
    if not full:
        return 0, frozenset()
    present = (HIT, HIT_PENDING)
    # Within a chunk of every full-attention group the requirement does not change, so
    # the largest boundary served is the cap or a chunk end below it.
    candidates = {cap, *(end for g in full
                         for end in range(0, cap, geometry.chunk_tokens(groups[g])))}
    for boundary in sorted((b for b in candidates if b > local_hit), reverse=True):
        required = [group_read_requirement(geometry, groups[g], boundary, local_hit,
                                           num_tokens) for g in full]
        if all(r is not None and all(k < len(states[g]) and states[g][k] in present
                                     for k in range(*r))
               for g, r in zip(full, required, strict=True)):
            return boundary, frozenset((g, k) for g, r in zip(full, required, strict=True)
                                       if r is not None for k in range(*r))
    return 0, frozenset()


def group_accepts(
    geometry: Geometry,
    group: GroupSpec,
    hit: int,
    local_hit: int,
    num_tokens: int,
    present: Callable[[int], bool],
) -> bool:
    """Whether ``group`` can serve boundary ``hit`` with the keys ``present`` reports."""
    required = group_read_requirement(geometry, group, hit, local_hit, num_tokens)
    if required is None:
        return False
    return all(present(chunk) for chunk in range(*required))


@functools.lru_cache(maxsize=256)
def _requirements(
    geometry: Geometry, num_tokens: int, local_hit: int
) -> tuple[tuple[int, tuple[tuple[int, int], ...] | None], ...]:
    """Per candidate boundary (largest first), every group's read requirement, or None
    when some group can never serve it. Independent of chunk states, so it is computed
    once per geometry and request: the exhaustive theorems ask for the contract's
    answer on hundreds of thousands of state assignments of one geometry."""
    table = []
    for hit in range(initial_max_hit(geometry, num_tokens), local_hit, -1):
        ranges = []
        for group in geometry.groups:
            required = group_read_requirement(geometry, group, hit, local_hit, num_tokens)
            if required is None:
                break
            ranges.append(required)
        table.append((hit, tuple(ranges) if len(ranges) == len(geometry.groups) else None))
    return tuple(table)


@dataclass(frozen=True)
class ContractAnswer:
    """What the contract says a multi-group lookup must answer."""

    best_present: int | None
    """Largest boundary every group accepts counting pending chunks as present."""
    pending_in_window: bool
    """Whether a chunk read for ``best_present`` is still pending."""

    def required_hit(self) -> int | None:
        """The hit the lookup must accept when it does not defer (C4)."""
        return self.best_present


def contract_answer(
    geometry: Geometry,
    num_tokens: int,
    local_hit: int,
    states: Mapping[int, Sequence[LookupResult]],
    max_hit_tokens: int | None = None,
) -> ContractAnswer:
    """The declarative answer of the multi-group lookup for concrete chunk states.

    ``states[g][k]`` is the lookup result of chunk ``k`` of group index ``g``.
    ``max_hit_tokens`` is a scheduling budget: candidates past it are left out, with the
    same read requirements for the rest (a budget caps the candidate, not the keys: an
    EAGLE group still peeks past it).
    """
    best: int | None = None
    best_ranges: tuple[tuple[int, int], ...] = ()
    present = (HIT, HIT_PENDING)
    cap = lookup_cap(geometry, num_tokens, max_hit_tokens)
    for hit, ranges in _requirements(geometry, num_tokens, local_hit):
        if hit > cap:
            continue
        if ranges is not None and all(
            states[g][k] in present
            for g, (start, end) in enumerate(ranges)
            for k in range(start, end)
        ):
            best, best_ranges = hit, ranges
            break
    pending = any(
        states[g][k] == HIT_PENDING
        for g, (start, end) in enumerate(best_ranges)
        for k in range(start, end)
    )
    return ContractAnswer(best_present=best, pending_in_window=pending)


def group_visit_order(geometry: Geometry, windows: Mapping[int, int]) -> list[int]:
    """FA groups first, then SWA groups by window descending, then Mamba groups."""
    fa_groups = [g for g, s in enumerate(geometry.groups) if s.kind is GroupKind.FULL]
    swa_groups = sorted(
        (g for g, s in enumerate(geometry.groups) if s.kind is GroupKind.SLIDING_WINDOW),
        key=lambda g: -windows[g],
    )
    others = [g for g, s in enumerate(geometry.groups) if s.kind is GroupKind.MAMBA]
    return fa_groups + swa_groups + others


def left_chunk(geometry: Geometry, num_tokens: int, local_hit: int,
               chunk_state: Callable[[int, int], LookupResult]
               ) -> tuple[int, int, int] | None:
    """``(boundary, group, chunk)``: the leftmost chunk the contract would read at the
    boundary it accepts now (docs/CONTRACT.md 10, "left chunk"): the first of the load
    range of the SWA group with the widest range (the first group without one), at
    :func:`contract_answer`'s ``best_present``; None when no boundary is served.
    ``chunk_state(group, chunk)``: the state of each complete chunk of the request, asked
    group by group in chunk order."""
    states = {
        g: [chunk_state(g, k) for k in range(num_tokens // geometry.chunk_tokens(spec))]
        for g, spec in enumerate(geometry.groups)
    }
    best = contract_answer(geometry, num_tokens, local_hit, states).best_present
    if best is None:
        return None
    windows = {
        g: load_range(geometry, s, best, local_hit)
        for g, s in enumerate(geometry.groups) if s.kind is GroupKind.SLIDING_WINDOW
    } or {0: load_range(geometry, geometry.groups[0], best, local_hit)}
    group = max(windows, key=lambda i: (windows[i][1] - windows[i][0], -i))
    return best, group, windows[group][0]

