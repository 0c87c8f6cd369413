"""The reference and the named historic variants (docs/CONTRACT.md section 8).

Each variant is the reference with the defective function put back, written in the
shape the defect had upstream:

* ``stale-pending`` (seed 000): HIT_PENDING sets a global defer that a later MISS does
  not clear, so a pending chunk behind a gap defers a ready window (C3).
* ``unaligned-hit`` (seed 001): the scan requires ``W`` chunks ending at ``cdiv(N, tpc)``
  even when ``N`` is not chunk-aligned; the retained window reaches one unchecked chunk
  further left (C2).
* ``mtp-extra-retained`` (seed 003): allocation retains ``e`` extra tokens, but lookup
  and store ignore them (C2).
* ``prefill-horizon`` (seed 004): each intermediate prefill frontier is treated as the
  final partial segment, storing tails no load can request (C8, C9).
* ``upstream-current``: the reference with upstream's current window formula
  ``W = max(cdiv(sw, tpc), cdiv(sw - 1 + e, tpc))`` (the first term demands a chunk no
  load needs when ``sw = 1 (mod tpc)`` and ``e = 0``: C3, C4) and upstream's block
  mask, which does not store the chunk an EAGLE lookup peeks at when an alignment
  boundary falls inside a chunk (C7), and upstream's store replay boundary ``P - 1``
  alone, which leaves out the EAGLE replay boundaries of vLLM's GPU rule (C9, C12),
  and no deferral deadline, as 0.33.0 (C13: a stalled store defers forever).
* ``abort-unscheduled-crash`` (the shape of vLLM #49118, #49146, #52211, #49889,
  #49285, #52170): the store path treats an aborted request like a finished one and
  stores its prompt; for a request aborted before it was ever scheduled the chunks have
  keys but no GPU blocks, and ``assert len(offload_keys) == len(offload_block_ids)``
  fails in ``_build_store_jobs`` (engine-fatal: C14); an abort mid-prefill offers
  chunks past the computed tokens (C8, C9, C10, C12). A shape, not a transcription:
  vLLM 0.28.0-0.33.0 already store ``num_computed_tokens`` for ``FINISHED_ABORTED``
  (docs/CONTRACT.md 9.1).
* ``resetting-deadline`` (vLLM #53087, a review of the first deadline): the deferral
  clock restarts at every failed promotion round, so a request waiting on a stalled
  write is never decided (C13: stall).
* ``no-deadline`` (vLLM #49829; 0.33.0 measures ``deferred_lookup_start_time`` and
  enforces nothing): HIT_PENDING defers forever behind a stalled write (C13: stall).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvcontract.errors import UnknownTargetError
from kvcontract.impl import reference as ref
from kvcontract.impl.bundle import Implementation
from kvcontract.vocabulary import LookupResult, RequestStatus


def _cdiv(a: Any, b: Any) -> Any:
    return -(-a // b)


REFERENCE = Implementation(
    name="reference",
    description="the correct design (kvcontract.impl.reference)",
    get_num_skipped_tokens=ref.get_num_skipped_tokens,
    retained_block_range=ref.retained_block_range,
    load_chunk_range=ref.load_chunk_range,
    get_sliding_window_size_in_chunks=ref.get_sliding_window_size_in_chunks,
    load_window_size_in_chunks=ref.load_window_size_in_chunks,
    sliding_window_lookup=ref.sliding_window_lookup,
    prefix_lookup=ref.prefix_lookup,
    is_block_reachable=ref.is_block_reachable,
    store_final_segment_end=ref.store_final_segment_end,
    store_replay_boundaries=ref.store_replay_boundaries,
)


# -- stale-pending ------------------------------------------------------------------
def _stale_pending_lookup(
    lookup: ref.LookupFn, start: int, end: int, initial_window: int, window: int
) -> int | None:
    consecutive = 0
    required = initial_window
    defer = False
    for idx in range(end - 1, start - 1, -1):
        result = lookup(idx)
        if result in (LookupResult.HIT, LookupResult.HIT_PENDING):
            consecutive += 1
            if result == LookupResult.HIT_PENDING:
                defer = True  # the defect: never cleared by a later MISS
            if consecutive >= required:
                return None if defer else idx + consecutive
            continue
        if result == LookupResult.RETRY:
            defer = True
        consecutive = 0
        required = window
    return None if defer else start + consecutive


# -- unaligned-hit ------------------------------------------------------------------
def _unaligned_load_window(
    boundary: Any, sliding_window: Any, extra_retained: Any, tokens_per_chunk: Any
) -> Any:
    # The defect: the padding of an unaligned boundary is ignored.
    return ref.get_sliding_window_size_in_chunks(sliding_window, extra_retained, tokens_per_chunk)


# -- upstream window formula --------------------------------------------------------
def _upstream_window(sliding_window: Any, extra_retained: Any, tokens_per_chunk: Any) -> Any:
    lower = _cdiv(sliding_window, tokens_per_chunk)
    history = _cdiv(sliding_window - 1 + extra_retained, tokens_per_chunk)
    if lower > history:
        return lower
    return history


def _upstream_load_window(
    boundary: Any, sliding_window: Any, extra_retained: Any, tokens_per_chunk: Any
) -> Any:
    window = _upstream_window(sliding_window, extra_retained, tokens_per_chunk)
    padding = (-boundary) % tokens_per_chunk
    padded = _cdiv(sliding_window - 1 + extra_retained + padding, tokens_per_chunk)
    if padded > window:
        return padded
    return window


def _upstream_block_reachable(
    block: Any,
    alignment_tokens: int | None,
    block_tokens: int,
    sliding_window: Any,
    extra_retained: Any,
    use_eagle: bool,
    retention_interval: int | None,
    final_segment_end_block: Any | None,
    replay_boundary_blocks: tuple[Any, ...] = (),
    blocks_per_chunk: int = 1,
) -> Any:
    # Upstream's block mask knows no chunks: it marks the block after an EAGLE boundary
    # but not the first block of the chunk the lookup peeks at.
    return ref.is_block_reachable(
        block, alignment_tokens, block_tokens, sliding_window, extra_retained, use_eagle,
        retention_interval, final_segment_end_block, replay_boundary_blocks, 1,
    )


def _upstream_replay_boundaries(
    prompt_len: int, alignment_tokens: int | None, retention_interval: int | None,
    use_eagle: bool,
) -> tuple[int, ...]:
    # vLLM 0.33.0 offloading/scheduler.py:_build_store_jobs passes num_prompt_tokens - 1.
    if retention_interval is None or prompt_len < 1:
        return ()
    return (prompt_len - 1,)


# -- mtp-extra-retained -------------------------------------------------------------
def _mtp_window(sliding_window: Any, extra_retained: Any, tokens_per_chunk: Any) -> Any:
    return _upstream_window(sliding_window, 0, tokens_per_chunk)  # the defect: e ignored


def _mtp_load_window(
    boundary: Any, sliding_window: Any, extra_retained: Any, tokens_per_chunk: Any
) -> Any:
    return _upstream_load_window(boundary, sliding_window, 0, tokens_per_chunk)


def _mtp_block_reachable(
    block: Any,
    alignment_tokens: int | None,
    block_tokens: int,
    sliding_window: Any,
    extra_retained: Any,
    use_eagle: bool,
    retention_interval: int | None,
    final_segment_end_block: Any | None,
    replay_boundary_blocks: tuple[Any, ...] = (),
    blocks_per_chunk: int = 1,
) -> Any:
    # The defect: the store mask uses the attention window, not the retained history.
    return ref.is_block_reachable(
        block, alignment_tokens, block_tokens, sliding_window, 0, use_eagle,
        retention_interval, final_segment_end_block, replay_boundary_blocks,
        blocks_per_chunk,
    )


# -- prefill-horizon ----------------------------------------------------------------
def _prefill_horizon_final_end(
    status: RequestStatus | str, prompt_horizon_chunks: int, current_chunks: int,
    retention_interval: int | None,
) -> int | None:
    # The defect: the current frontier closes the "final" segment even mid-prefill.
    return current_chunks


# -- lifecycle (C13, C14) --------------------------------------------------------------
def _aborted_like_finished_tokens(
    status: RequestStatus | str, num_computed_tokens: int, num_scheduled_tokens: int,
    num_tokens: int, prompt_len: int, max_offload_tokens: int | None,
    offload_prompt_only: bool,
) -> int:
    # The defect: an aborted request is stored up to its prompt, as if finished, whatever
    # it computed (for one never scheduled: nothing, and it has no blocks).
    if status == RequestStatus.ABORTED:
        status = RequestStatus.FINISHED
    return ref.get_num_offloadable_tokens(status, num_computed_tokens, num_scheduled_tokens,
                                          num_tokens, prompt_len, max_offload_tokens,
                                          offload_prompt_only)


def _resetting_deferral_clock(deferred_since: Any, step: Any) -> Any:
    # The defect: every failed round restarts the clock, so it never reaches the bound.
    return step


def _never_expires(deferred_since: Any, step: Any, bound: Any) -> Any:
    # The defect: no deadline at all.
    return False


VARIANTS: dict[str, Implementation] = {
    "reference": REFERENCE,
    "stale-pending": dataclasses.replace(
        REFERENCE,
        name="stale-pending",
        description="seed 000: a pending flag behind a MISS still defers the ready window",
        sliding_window_lookup=_stale_pending_lookup,
        violates=("C3",),
    ),
    "unaligned-hit": dataclasses.replace(
        REFERENCE,
        name="unaligned-hit",
        description="seed 001: unaligned boundaries check only W chunks",
        load_window_size_in_chunks=_unaligned_load_window,
        violates=("C2", "C12"),
    ),
    "mtp-extra-retained": dataclasses.replace(
        REFERENCE,
        name="mtp-extra-retained",
        description="seed 003: lookup and store ignore extra_retained_tokens",
        get_sliding_window_size_in_chunks=_mtp_window,
        load_window_size_in_chunks=_mtp_load_window,
        is_block_reachable=_mtp_block_reachable,
        # Measured by `kvcontract prove`: a window short by e chunks breaks the
        # allocation bound, coverage, maximality, convergence, and the store mask.
        violates=("C1", "C2", "C3", "C4", "C6", "C7", "C9", "C12"),
    ),
    "prefill-horizon": dataclasses.replace(
        REFERENCE,
        name="prefill-horizon",
        description="seed 004: intermediate prefill frontiers create final tails",
        store_final_segment_end=_prefill_horizon_final_end,
        violates=("C8", "C9", "C12"),  # stores-only-demanded, store-horizon; C12: waste
    ),
    "upstream-current": dataclasses.replace(
        REFERENCE,
        name="upstream-current",
        description="upstream's current window formula (cdiv(sw, tpc) lower bound), "
        "block mask (no EAGLE peek chunk), store replay boundary (P - 1 only) and no "
        "deferral deadline",
        get_sliding_window_size_in_chunks=_upstream_window,
        load_window_size_in_chunks=_upstream_load_window,
        is_block_reachable=_upstream_block_reachable,
        store_replay_boundaries=_upstream_replay_boundaries,
        # vLLM 0.33.0 enforces no deferral deadline (it measures
        # deferred_lookup_start_time for a histogram only; live: a stalled store defers
        # its consumer at every step), so kvcontract's model of it has none either.
        deferral_expired=_never_expires,
        # The over-demanded chunk defers on a pending key no load reads (C3) and
        # loses the hit when it is missing (C4); an EAGLE peek chunk after an A boundary
        # inside a chunk is never stored (C7); the EAGLE replay tails are never stored
        # (C9 store-steps, C12 lost hit); a stalled store defers forever (C13 stall).
        violates=("C3", "C4", "C7", "C9", "C12", "C13"),
    ),
    "abort-unscheduled-crash": dataclasses.replace(
        REFERENCE,
        name="abort-unscheduled-crash",
        description="vLLM #49118: an aborted request's store job covers its prompt, so "
        "one aborted before scheduling has keys but no blocks (assertion)",
        get_num_offloadable_tokens=_aborted_like_finished_tokens,
        # Measured by `kvcontract prove`: the store step offers an aborted request's
        # uncomputed chunks (C8 waste, C9 horizon, C10 uncommitted slots, C12 waste), and
        # the lifecycle's abort before scheduling raises the assertion (C14).
        violates=("C8", "C9", "C10", "C12", "C14"),
    ),
    "resetting-deadline": dataclasses.replace(
        REFERENCE,
        name="resetting-deadline",
        description="vLLM #53087: the deferral deadline restarts at every failed "
        "promotion round and never expires while a write stalls",
        deferral_clock=_resetting_deferral_clock,
        violates=("C13",),
    ),
    "no-deadline": dataclasses.replace(
        REFERENCE,
        name="no-deadline",
        description="vLLM #49829: HIT_PENDING defers without a deadline (a stalled write "
        "defers the request until the client gives up)",
        deferral_expired=_never_expires,
        violates=("C13",),
    ),
}


def get_implementation(name: str) -> Implementation:
    """Look up a registered implementation by name."""
    try:
        return VARIANTS[name]
    except KeyError:
        raise UnknownTargetError(name, sorted(VARIANTS)) from None


def variant_names() -> list[str]:
    return list(VARIANTS)
