"""Store reachability: which SWA blocks/chunks the producer stores (docs/CONTRACT.md section 5).

The mask is stated per block as a predicate, so it is evaluable for a symbolic block
index. Parameters that decide *which rule applies* (alignment, block size, retention
interval) are plain ints; token counts, windows and indices may be Z3 terms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcontract.spec.arith import (
    Bool,
    Num,
    and_,
    any_of,
    cdiv,
    floordiv,
    ite,
    max_,
    min_,
    mod,
    or_,
)
from kvcontract.spec.geometry import Geometry, GroupSpec
from kvcontract.spec.lookup import load_window_chunks
from kvcontract.vocabulary import ENDED_STATUSES
from kvcontract.vocabulary import RequestStatus as RequestStatus  # defined in vocabulary


def store_need_blocks(
    sliding_window: Num, extra_retained: Num, block_tokens: Num, eagle: bool
) -> Num:
    """Blocks of history a reachable boundary needs: ``cdiv(sw + e - 1, B) + eagle``.

    Offload stores use the MTP-widened window ``sw + e`` (they must cover every retained
    token); an EAGLE group needs one more block (its peek block).
    """
    return cdiv(sliding_window + extra_retained - 1, block_tokens) + (1 if eagle else 0)


@dataclass(frozen=True)
class MaskRule:
    """Which blocks of an SWA group are reachable, in blocks of ``B = bs * dcp``.

    ``store_all`` means the geometry gives no alignment to reason with (A is None or
    not a multiple of B) or the segment is shorter than the needed history.
    ``period`` is the segment length in blocks (None: only replay boundaries).
    """

    store_all: bool
    period: int | None
    alignment_blocks: int | None


def junction_boundary(full_attention_boundary: Num, local_hit: Num, hit: Num,
                      retention_interval: Num | None) -> Num:
    """The shared-prefix junction a request registers after its lookup (docs/CONTRACT.md
    9.3; 0: none): the boundary its full-attention groups serve, when a sparse group cut
    the accepted hit (``local_hit + hit``) below it and a retention interval (0
    included) is configured."""
    if retention_interval is None:
        return 0
    return ite(full_attention_boundary > local_hit + hit, full_attention_boundary, 0)


def keeps_final_tail(retention_interval: int | None) -> bool:
    """Whether a store job closes a final partial segment at all (C9).

    Only with dense retention (``None``, segments of ``A``). Under a retention interval
    vLLM's GPU prefix cache keeps no such tail (its ``cache_blocks`` passes no final
    segment end): a hit inside the final partial segment is served only at the replay
    boundaries, whose tails the mask marks anyway. A final tail there would be stored for
    no boundary the GPU rule serves (docs/CONTRACT.md 5, rule (c)).
    """
    return retention_interval is None


def mask_rule(
    alignment_tokens: int | None, block_tokens: int, retention_interval: int | None
) -> MaskRule:
    """The structural part of the mask (no token counts involved)."""
    if alignment_tokens is None or alignment_tokens % block_tokens:
        return MaskRule(store_all=True, period=None, alignment_blocks=None)
    alignment_blocks = alignment_tokens // block_tokens
    if retention_interval is None:
        segment: int | None = alignment_tokens
    elif retention_interval == 0:
        segment = None
    else:
        segment = retention_interval
    period = None if segment is None else segment // block_tokens
    return MaskRule(store_all=False, period=period, alignment_blocks=alignment_blocks)


def replay_boundary_block(boundary_tokens: Num, alignment_tokens: int, block_tokens: int) -> Num:
    """A replay boundary (e.g. ``P - 1``) aligned down to A, in blocks."""
    aligned = floordiv(boundary_tokens, alignment_tokens) * alignment_tokens
    return floordiv(aligned, block_tokens)


def block_is_reachable(
    block: Num,
    rule: MaskRule,
    need: Num,
    eagle: bool,
    final_segment_end_block: Num | None,
    replay_blocks: Sequence[Num] = (),
    blocks_per_chunk: int = 1,
) -> Bool:
    """Whether block ``block`` must be stored (some reachable boundary demands it).

    For EAGLE the demand of boundary block ``bb`` ends with the peek chunk
    ``cdiv(bb, bpc)`` (:func:`demanded_chunk_range`); its first block is marked besides
    the peek block ``bb`` itself (the same block when ``bb`` is chunk-aligned).
    """
    if rule.store_all:
        return True
    shift = 1 if eagle else 0
    marks: list[Bool] = []
    period = rule.period
    if period is not None:
        # Segment boundary k * period demands blocks [k * period + shift - need, ...):
        # together every block from period + shift - need on, so all of them only when
        # need >= period + shift (an EAGLE group's first block is not, at need == period).
        if not isinstance(need, int) or need < period + shift:
            tail = segment_tail_block(block, period, need, shift)
            marks.append(or_(need >= period + shift, tail))
        else:
            return True
        if eagle and blocks_per_chunk > 1:
            # ``block`` starts a chunk and a segment boundary lies in (block - bpc, block].
            marks.append(
                and_(
                    block >= period,
                    mod(block, blocks_per_chunk) == 0,
                    mod(block, period) < blocks_per_chunk,
                )
            )
        if final_segment_end_block is not None and not eagle:
            marks.append(final_tail_block(block, final_segment_end_block, period, need))
    for boundary in replay_blocks:
        marks.append(replay_window_block(block, boundary, need, eagle, blocks_per_chunk))
    return any_of(marks)


def replay_window_block(
    block: Num, boundary_block: Num, need: Num, eagle: bool, blocks_per_chunk: Num
) -> Bool:
    """Rules (d) and (e) of docs/CONTRACT.md 5: ``block`` is one of the ``need`` blocks
    before the replay block ``boundary_block`` (an EAGLE consumer's window ends one block
    later, with its peek block, as for segment tails), or, for EAGLE, the first block of
    the chunk its lookup peeks at (:func:`peek_chunk_first_block`)."""
    shift = 1 if eagle else 0
    window = and_(block >= boundary_block + shift - need, block < boundary_block + shift)
    if not eagle:
        return window
    return or_(window, block == peek_chunk_first_block(boundary_block, blocks_per_chunk))


def segment_tail_block(block: Num, period: Num, need: Num, shift: int) -> Bool:
    """Rule (a) of docs/CONTRACT.md 5: ``block`` is one of the ``need`` blocks before a
    segment boundary ``k * period`` (an EAGLE group's, ``shift = 1``, end one block
    later, with the peek block)."""
    return and_(block >= shift, mod(block - shift, period) >= period - need)


def final_tail_range(final_segment_end_block: Num, period: Num, need: Num) -> tuple[Num, Num]:
    """Rule (c) of docs/CONTRACT.md 5: the final tail ``[max(F - F mod per, F - need),
    F)`` of a final partial segment ending at block ``F`` (empty when ``F mod per == 0``:
    no partial segment, see :func:`final_tail_block`). The blocks the final horizon
    demands within its own segment, and no block at or past ``F``."""
    end = final_segment_end_block
    return max_(end - mod(end, period), end - need), end


def final_tail_block(block: Num, final_segment_end_block: Num, period: Num, need: Num) -> Bool:
    """Whether ``block`` is in the final tail (rule (c), non-EAGLE groups, dense
    retention): the final segment is partial (``F mod per != 0``) and ``block`` lies in
    :func:`final_tail_range`."""
    start, end = final_tail_range(final_segment_end_block, period, need)
    return and_(mod(final_segment_end_block, period) != 0, block >= start, block < end)


def peek_chunk_first_block(boundary_block: Num, blocks_per_chunk: Num) -> Num:
    """The first block of the chunk an EAGLE lookup peeks at for a boundary block."""
    return cdiv(boundary_block, blocks_per_chunk) * blocks_per_chunk


def chunk_is_stored(
    chunk: Num,
    blocks_per_chunk: int,
    rule: MaskRule,
    need: Num,
    eagle: bool,
    final_segment_end_block: Num | None,
    replay_blocks: Sequence[Num] = (),
) -> Bool:
    """A chunk is stored when any of its blocks is reachable."""
    return any_of(
        [
            block_is_reachable(
                chunk * blocks_per_chunk + k,
                rule,
                need,
                eagle,
                final_segment_end_block,
                replay_blocks,
                blocks_per_chunk,
            )
            for k in range(blocks_per_chunk)
        ]
    )


def eagle_replay_boundaries(prompt_len: Num, unit: Num) -> tuple[Num, Num]:
    """The two boundaries vLLM 0.33.0's GPU prefix cache serves an EAGLE request at, in
    its legacy EAGLE hash mode (``kv_cache_coordinator.replay_boundaries``): the hit
    lands one unit below the aligned boundary it matched (the drafter's last unit is
    volatile), so the resend's ``P - 1`` and a longer sibling's ``P``, each aligned down
    to the unit, minus one unit (either may be 0 or below: no hit).

    vLLM 0.34.0's lookahead-hash mode for EAGLE (its own issue) plugs in here: a mode
    argument choosing that release's rule, passed by :func:`gpu_replay_boundaries` and
    :func:`owed_replay_boundary`, so the store path's theorem
    (``C7/replay-boundaries-exact``) and C12's promise follow it together.
    """
    resend = floordiv(prompt_len - 1, unit) * unit
    extension = floordiv(prompt_len, unit) * unit
    return resend - unit, extension - unit


def gpu_replay_boundaries(prompt_len: int, unit: int, eagle: bool) -> tuple[int, ...]:
    """The replay boundaries vLLM 0.33.0's GPU prefix cache keeps for a prompt (stated
    from ``kv_cache_coordinator.replay_boundaries``, with the offload's unit ``A`` in
    place of the scheduler block): the resend's ``P - 1``; with EAGLE the hit lands one
    unit below the aligned boundary it matched, so the resend's ``(P - 1)`` and a longer
    sibling's ``P``, each aligned down to the unit, minus one unit (not below 0:
    :func:`eagle_replay_boundaries`)."""
    if not eagle:
        return (prompt_len - 1,)
    return tuple(sorted({max(int(b), 0) for b in eagle_replay_boundaries(prompt_len, unit)}))


def owed_replay_boundary(
    boundary: Num, prompt_len: Num, alignment_tokens: Num | None,
    retention_interval: Num | None, eagle: bool,
) -> Bool:
    """Whether the store path owes the mask replay boundary ``boundary`` (tokens > 0) for
    a ``prompt_len``-token prompt: the membership form of
    :func:`replay_boundaries_owed` (the same rule, evaluable for symbolic counts).

    Only with a retention interval (0 included); then the resend's ``P - 1`` and, when
    the geometry has an EAGLE group and an alignment ``A``, the two EAGLE boundaries of
    vLLM 0.33.0's GPU replay rule at the unit ``A`` (:func:`eagle_replay_boundaries`).
    A boundary of 0 or below is no hit and is never owed.
    """
    if retention_interval is None:
        return False
    candidates: list[Bool] = [boundary == prompt_len - 1]
    if eagle and alignment_tokens is not None:
        candidates += [boundary == b
                       for b in eagle_replay_boundaries(prompt_len, alignment_tokens)]
    return and_(boundary > 0, any_of(candidates))


def replay_boundaries_owed(
    prompt_len: int, alignment_tokens: int | None, retention_interval: int | None,
    eagle: bool,
) -> tuple[int, ...]:
    """The replay boundaries (tokens, ascending, without duplicates) a producer's store
    path owes the mask for a ``prompt_len``-token prompt, from the prompt, the alignment
    ``A``, the retention interval and whether the geometry has an EAGLE group: vLLM's
    GPU replay rule (:func:`gpu_replay_boundaries`) at the offload's unit ``A``, the
    resend's ``P - 1`` kept besides (see :func:`store_replay_boundaries`)."""
    if retention_interval is None:
        return ()
    found = {prompt_len - 1}
    if eagle and alignment_tokens is not None:
        found.update(gpu_replay_boundaries(prompt_len, alignment_tokens, True))
    return tuple(sorted(b for b in found if b > 0))


def store_replay_boundaries(geometry: Geometry, prompt_len: int) -> tuple[int, ...]:
    """The replay boundaries (tokens) the producer's store path must pass to the mask:
    vLLM's GPU replay rule (:func:`gpu_replay_boundaries`) with the offload's unit ``A``.

    The resend's ``P - 1`` (its last prompt token is recomputed); when the geometry has
    an EAGLE group, also the boundaries an EAGLE consumer is served at, one unit below
    the resend's and the extension's aligned boundaries (an EAGLE hit at ``(P - 1)``
    aligned down needs the peek chunk past it, which is incomplete unless ``A`` divides
    ``P``): without them an EAGLE resend gets nothing where the GPU cache serves one unit
    less than the aligned prompt. ``P - 1`` stays too: where an SWA chunk is smaller than
    ``A`` its tail's peek chunk is complete and the offload serves an EAGLE resend there,
    at a finer grain than the GPU's unit. A boundary of 0 (no hit) is left out.

    Sorted, without duplicates. Only with a retention interval (0 included); without
    one the segments of ``A`` already end at every multiple of ``A``, these included.
    """
    return replay_boundaries_owed(
        prompt_len, geometry.alignment_tokens, geometry.retention_interval,
        any(geometry.drops_eagle_block(group) for group in geometry.groups))


# -- the store rule of one group of a geometry (concrete ints) ---------------------------
def group_mask(geometry: Geometry, group: GroupSpec) -> tuple[MaskRule, int]:
    """The mask rule and the needed history (blocks) of an SWA group of ``geometry``."""
    assert group.sliding_window is not None, "only sliding-window groups have a mask"
    block_tokens = geometry.block_tokens(group)
    rule = mask_rule(geometry.alignment_tokens, block_tokens, geometry.retention_interval)
    need = store_need_blocks(
        group.sliding_window, group.extra_retained_tokens, block_tokens,
        geometry.drops_eagle_block(group),
    )
    return rule, int(need)


def group_replay_blocks(
    geometry: Geometry, group: GroupSpec, replay_boundaries: Sequence[int]
) -> tuple[int, ...]:
    """Replay boundaries (tokens) as the mask's boundary blocks (none without a mask)."""
    align = geometry.alignment_tokens
    rule = mask_rule(align, geometry.block_tokens(group), geometry.retention_interval)
    if rule.store_all or align is None:
        return ()
    block_tokens = geometry.block_tokens(group)
    return tuple(
        int(replay_boundary_block(b, align, block_tokens)) for b in replay_boundaries
    )


def group_marked_blocks(
    geometry: Geometry,
    group: GroupSpec,
    chunk: int,
    final_segment_end_chunk: int | None,
    replay_boundaries: Sequence[int] = (),
) -> list[int]:
    """The blocks of ``chunk`` that the store mask marks, ascending.

    Every block for a full-attention or Mamba group (they store every chunk); for an SWA
    group the blocks :func:`block_is_reachable` marks, with the geometry's rule and need,
    the final segment closed at ``final_segment_end_chunk`` and the replay boundaries
    given in tokens. A chunk is stored iff this is not empty (:func:`chunk_is_stored`);
    it is *storable* (C10) iff, besides, its first marked block is still live.
    """
    bpc = geometry.blocks_per_chunk
    blocks = range(chunk * bpc, (chunk + 1) * bpc)
    if not group.is_swa:
        return list(blocks)
    rule, need = group_mask(geometry, group)
    final_block = None if final_segment_end_chunk is None else final_segment_end_chunk * bpc
    replay = group_replay_blocks(geometry, group, replay_boundaries)
    return [
        b for b in blocks
        if block_is_reachable(b, rule, need, geometry.drops_eagle_block(group), final_block,
                              replay, bpc)
    ]


def group_chunk_is_stored(
    geometry: Geometry,
    group: GroupSpec,
    chunk: int,
    final_segment_end_chunk: int | None,
    replay_boundaries: Sequence[int] = (),
) -> bool:
    """Whether the producer stores ``chunk`` of ``group``: the one geometry-level form of
    the rule (:func:`chunk_is_stored` for SWA groups, every chunk for the others)."""
    if not group.is_swa:
        return True
    rule, need = group_mask(geometry, group)
    bpc = geometry.blocks_per_chunk
    final_block = None if final_segment_end_chunk is None else final_segment_end_chunk * bpc
    replay = group_replay_blocks(geometry, group, replay_boundaries)
    return bool(chunk_is_stored(chunk, bpc, rule, need, geometry.drops_eagle_block(group),
                                final_block, replay))


def group_stored_chunks(
    geometry: Geometry,
    group: GroupSpec,
    horizon_chunks: int,
    final_segment_end_chunk: int | None = None,
    replay_boundaries: Sequence[int] = (),
) -> set[int]:
    """The chunks below ``horizon_chunks`` the producer stores, the final segment closed
    at ``final_segment_end_chunk`` (by default the horizon itself)."""
    end = horizon_chunks if final_segment_end_chunk is None else final_segment_end_chunk
    return {
        c for c in range(horizon_chunks)
        if group_chunk_is_stored(geometry, group, c, end, replay_boundaries)
    }

# -- horizons -----------------------------------------------------------------------
def stored_token_count(
    status: RequestStatus,
    num_computed: Num,
    num_scheduled: Num,
    num_tokens: Num,
    prompt_len: Num,
    max_offload_tokens: Num | None = None,
    prompt_only: bool = True,
) -> Num:
    """Tokens whose KV may be stored this step (the final sampled slot never is)."""
    if status == RequestStatus.ABORTED:
        tokens = num_computed
    elif status == RequestStatus.FINISHED:
        # Never past what it computed: a request finished before its prefill completed
        # (an error finish) has no KV for the rest of its prompt.
        tokens = min_(num_computed, max_(prompt_len, num_tokens - 1))
    else:
        tokens = num_computed + num_scheduled
    if max_offload_tokens is not None:
        tokens = min_(tokens, max_offload_tokens)
    if prompt_only:
        tokens = min_(tokens, prompt_len)
    return tokens


def storable_chunks(tokens: Num, chunk_tokens: Num, eagle: bool, status: RequestStatus) -> Num:
    """Complete chunks that may be stored; an EAGLE group's last chunk is volatile
    while decoding."""
    full = floordiv(tokens, chunk_tokens)
    if eagle and status == RequestStatus.DECODING:
        return max_(0, full - 1)
    return full


def final_segment_end_chunk(
    status: RequestStatus, prompt_horizon_chunks: Num, current_chunks: Num,
    retention_interval: int | None,
) -> Num | None:
    """Which horizon closes the final partial segment (C9), None for none.

    While prefilling (and decoding), the prompt horizon: intermediate frontiers never
    create a final tail, and an active decode frontier past the prompt creates none.
    On finish or abort, the actual horizon. Under a retention interval none
    (:func:`keeps_final_tail`).
    """
    if not keeps_final_tail(retention_interval):
        return None
    if status in ENDED_STATUSES:
        return current_chunks
    return prompt_horizon_chunks


def demanded_chunk_range(
    boundary: Num, sliding_window: Num, extra_retained: Num, chunk_tokens: Num, eagle: bool
) -> tuple[Num, Num]:
    """Chunks a consumer's lookup demands at boundary ``N`` (window, plus EAGLE peek)."""
    end = cdiv(boundary, chunk_tokens)
    start = max_(
        0, end - load_window_chunks(boundary, sliding_window, extra_retained, chunk_tokens)
    )
    return start, end + (1 if eagle else 0)
