"""Store reachability: which SWA blocks/chunks the producer stores (DOMAIN.md section 5).

The mask is stated per block as a predicate, so it is evaluable for a symbolic block
index. Parameters that decide *which rule applies* (alignment, block size, retention
interval) are plain ints; token counts, windows and indices may be Z3 terms.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from kvcontract.spec.arith import Bool, Num, and_, any_of, cdiv, floordiv, max_, min_, mod, or_
from kvcontract.spec.lookup import load_window_chunks


class RequestStatus(str, enum.Enum):
    """Where a request is when its store job is built."""

    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"
    ABORTED = "aborted"


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
        if not isinstance(need, int) or need < period:
            tail = and_(block >= shift, mod(block - shift, period) >= period - need)
            marks.append(or_(need >= period, tail))
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
            end = final_segment_end_block
            partial = mod(end, period)
            marks.append(
                and_(
                    partial != 0,
                    block >= max_(end - partial, end - need),
                    block < end,
                )
            )
    for boundary in replay_blocks:
        marks.append(and_(block >= boundary - need, block < boundary))
        if eagle:
            marks.append(block == peek_chunk_first_block(boundary, blocks_per_chunk))
    return any_of(marks)


def peek_chunk_first_block(boundary_block: Num, blocks_per_chunk: int) -> Num:
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
    if status is RequestStatus.ABORTED:
        tokens = num_computed
    elif status is RequestStatus.FINISHED:
        tokens = max_(prompt_len, num_tokens - 1)
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
    if eagle and status is RequestStatus.DECODING:
        return max_(0, full - 1)
    return full


def final_segment_end_chunk(
    status: RequestStatus, prompt_horizon_chunks: Num, current_chunks: Num
) -> Num | None:
    """Which horizon closes the final partial segment (C9).

    While prefilling (and decoding), the prompt horizon: intermediate frontiers never
    create a final tail, and an active decode frontier past the prompt creates none.
    On finish or abort, the actual horizon.
    """
    if status in (RequestStatus.FINISHED, RequestStatus.ABORTED):
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
