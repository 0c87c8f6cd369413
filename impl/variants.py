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
* ``legacy-drop-lookahead-store`` (the hash modes mixed, docs/CONTRACT.md 2.1): under
  lookahead block hashes the lookup still peeks one chunk past its boundary and pops it,
  while the store path, rightly, keeps no peek chunk: the peek finds no key or a MISS and
  the hit drops a chunk (C4, C5, C12), and a pending peek chunk defers it (C3).
* ``legacy-mask-lookahead-lookup``: the converse mix: the store path keeps the legacy
  EAGLE mask under lookahead hashes (the peek block of every tail, the last chunk held
  back while decoding, the GPU's EAGLE replay boundaries), which no lookup reads (C8, C9).
* ``no-deadline`` (vLLM #49829; 0.33.0 measures ``deferred_lookup_start_time`` and
  enforces nothing): HIT_PENDING defers forever behind a stalled write (C13: stall).
* ``publish-failed-store`` (vLLM 0.33.0's connector scheduler has no failed job: every
  store job the worker reports is completed as stored, and its worker asserts that no
  transfer failed; 0.34.0 drops a failed job's chunks): a store job that failed is
  published, so a later resend loads chunks whose bytes were never written (C14:
  corruption).
* ``minus-one-after-clamps`` (vLLM 0.33.0's ``_lookup_complete_chunks``; 0.34.0 moved
  the subtraction first): the windowed lookup's ``- 1`` (the last prompt token is
  recomputed) is applied after the scheduling budgets (``max_num_new_tokens``, the
  request's ``max_load_tokens``), so a budget below the prompt loses one more token and,
  when the budget is a chunk end, the chunk before it: SWA block 4, ``sw`` 8, 17 tokens,
  a budget of 12 caps the candidate at 11 (C4: the hit 12 is lost).
* ``full-horizon-unfinished-prefill`` (vLLM 0.33.0's ``_build_store_jobs``; 0.34.0 clamps
  to ``num_computed_tokens``): a request that finished before its prefill completed (an
  error finish, ``FINISHED_ERROR``: a failed KV load under the ``fail`` policy, a
  grammar or encoder-cache error) is stored like one that finished by sampling, up to
  its prompt, offering chunks whose KV was never computed (C10: uncommitted slots, C14:
  the ended request's store horizon).
* ``first-block-null-offset`` (vLLM 0.33.0's ``_build_store_jobs``; 0.34.0 keeps null
  pages as placeholders): a store job lists only the non-null blocks of its chunks and
  declares its first non-null block's index, so the worker lays every later block right
  after the one before it: a null page after a live one (a freed block the scheduler
  reallocated and zeroed in the connector's table) shifts every later block of the job
  to a lower offset, and the slots the window's blocks belong in stay unwritten (C10:
  corruption). On vLLM 0.33.0's engine: FA bs 16 + SWA bs 4, ``sw`` 8, ``bpc`` 8, a
  136-token prompt in steps of 103, 24 and 9 tokens.
* ``no-shared-prefix-junction`` (vLLM 0.33.0's offloading connector registers no
  shared-prefix junction; 0.34.0's ``_maybe_register_shared_prefix_junction`` does): a
  request whose offloaded hit a sliding-window group cut below the full-attention
  boundary stores nothing for that boundary, so a later request sharing the prefix
  through it is cut again (C12: lost hit). On vLLM 0.33.0's engine: FA bs 16 + SWA bs 4,
  ``sw`` 8, retention 0, a 53-token producer, a first consumer of 59 tokens sharing 40
  (hit 0, full-attention boundary 32), a second consumer of 43 sharing 40: hit 0, where
  0.34.0 gives 32.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

from kvcontract.errors import UnknownTargetError
from kvcontract.impl import reference as ref
from kvcontract.impl.bundle import Implementation
from kvcontract.vocabulary import LookupResult, RequestStatus


def _cdiv(a: Any, b: Any) -> Any:
    return -(-a // b)


@functools.cache
def _parameters(fn: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def _reference_with(fn: Callable[..., Any], args: tuple[Any, ...], **defect: Any) -> Any:
    """The reference function ``fn`` called with a variant's positional arguments
    ``args``, the ones its defect names (``fn``'s parameters) replaced."""
    return fn(**{**dict(zip(_parameters(fn), args, strict=False)), **defect})


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
    return ref.widen_to_boundary(window, boundary, sliding_window, extra_retained,
                                 tokens_per_chunk)


def _upstream_block_reachable(*args: Any) -> Any:
    # Upstream's block mask knows no chunks: it marks the block after an EAGLE boundary
    # but not the first block of the chunk the lookup peeks at.
    return _reference_with(ref.is_block_reachable, args, blocks_per_chunk=1)


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


def _mtp_block_reachable(*args: Any) -> Any:
    # The defect: the store mask uses the attention window, not the retained history.
    return _reference_with(ref.is_block_reachable, args, extra_retained=0)


# -- prefill-horizon ----------------------------------------------------------------
def _prefill_horizon_final_end(
    status: RequestStatus | str, prompt_horizon_chunks: int, current_chunks: int,
    retention_interval: int | None,
) -> int | None:
    # The defect: the current frontier closes the "final" segment even mid-prefill.
    return current_chunks


# -- lifecycle (C13, C14) --------------------------------------------------------------
def _aborted_like_finished_tokens(status: RequestStatus | str, *args: Any) -> int:
    # The defect: an aborted request is stored up to its prompt, as if finished, whatever
    # it computed (for one never scheduled: nothing, and it has no blocks). A finished
    # request's horizon is the one before vLLM 0.34.0 clamped it to the computed tokens.
    # ``args``: the other arguments of ``get_num_offloadable_tokens``, passed on as given.
    if status == RequestStatus.ABORTED:
        status = RequestStatus.FINISHED
    return _full_horizon_tokens(status, *args)


def _legacy_eagle_drop(eagle: bool, hash_lookahead: int) -> bool:
    # The defect: the legacy EAGLE drop whatever the block hashes cover.
    return bool(eagle)


def _resetting_deferral_clock(deferred_since: Any, step: Any) -> Any:
    # The defect: every failed round restarts the clock, so it never reaches the bound.
    return step


def _no_junction(full_attention_boundary: Any, local_hit: Any, hit: Any,
                 retention_interval: Any) -> int:
    """vLLM 0.33.0: no shared-prefix junction is registered for an offloaded hit."""
    return 0


def _never_expires(deferred_since: Any, step: Any, bound: Any) -> Any:
    # The defect: no deadline at all.
    return False


def _publish_every_store(failed: bool) -> bool:
    # The defect: the job is completed as stored whether its transfer failed or not.
    return True


# -- full-horizon-unfinished-prefill (C10, C14) ------------------------------------------
def _full_horizon_tokens(
    status: RequestStatus | str, num_computed_tokens: int, num_scheduled_tokens: int,
    num_tokens: int, prompt_len: int, max_offload_tokens: int | None,
    offload_prompt_only: bool,
) -> int:
    # The defect: a finished request is stored up to its prompt (or its tokens but the
    # final sampled slot) whatever it computed: the reference's rule with the computed
    # tokens never the smaller bound.
    if status == RequestStatus.FINISHED:
        num_computed_tokens = max(num_computed_tokens, num_tokens, prompt_len)
    return ref.get_num_offloadable_tokens(status, num_computed_tokens, num_scheduled_tokens,
                                          num_tokens, prompt_len, max_offload_tokens,
                                          offload_prompt_only)


# -- minus-one-after-clamps (C4) ---------------------------------------------------------
def _minus_one_after_clamps(
    num_tokens: Any, recomputes_last_token: bool, max_hit_tokens: Any | None
) -> Any:
    # The defect: the budget caps the request first, and the recomputed last token is
    # subtracted from whatever is left, the budget included.
    cap = num_tokens
    if max_hit_tokens is not None and max_hit_tokens < cap:
        cap = max_hit_tokens
    if recomputes_last_token:
        cap = cap - 1
    return cap


# -- first-block-null-offset (C10) ------------------------------------------------------------
def _first_block_null_offset_slot(position: Any, first_live_page: Any, nulls_before: Any,
                                  blocks_per_chunk: Any) -> Any:
    # The defect: null pages are dropped from the job and its block index is the first
    # live block's, so the worker skips the leading null pages and then writes every
    # listed block one after another; a null page after a live one is not skipped.
    return first_live_page + (position - nulls_before)


def _variant(name: str, **changes: Any) -> Implementation:
    """The reference under another name with ``changes``: its description, the functions
    its defect lives in and the clauses it violates."""
    return dataclasses.replace(REFERENCE, name=name, **changes)


VARIANTS: dict[str, Implementation] = {impl.name: impl for impl in (
    REFERENCE,
    _variant(
        "stale-pending",
        description="seed 000: a pending flag behind a MISS still defers the ready window",
        sliding_window_lookup=_stale_pending_lookup,
        violates=("C3",),
    ),
    _variant(
        "unaligned-hit",
        description="seed 001: unaligned boundaries check only W chunks",
        load_window_size_in_chunks=_unaligned_load_window,
        violates=("C2", "C12"),
    ),
    _variant(
        "mtp-extra-retained",
        description="seed 003: lookup and store ignore extra_retained_tokens",
        get_sliding_window_size_in_chunks=_mtp_window,
        load_window_size_in_chunks=_mtp_load_window,
        is_block_reachable=_mtp_block_reachable,
        # Measured by `kvcontract prove`: a window short by e chunks breaks the
        # allocation bound, coverage, maximality, convergence, and the store mask.
        violates=("C1", "C2", "C3", "C4", "C6", "C7", "C9", "C12"),
    ),
    _variant(
        "prefill-horizon",
        description="seed 004: intermediate prefill frontiers create final tails",
        store_final_segment_end=_prefill_horizon_final_end,
        violates=("C8", "C9", "C12"),  # stores-only-demanded, store-horizon; C12: waste
    ),
    _variant(
        "upstream-current",
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
    _variant(
        "abort-unscheduled-crash",
        description="vLLM #49118: an aborted request's store job covers its prompt, so "
        "one aborted before scheduling has keys but no blocks (assertion)",
        get_num_offloadable_tokens=_aborted_like_finished_tokens,
        # Measured by `kvcontract prove`: the store step offers an aborted request's
        # uncomputed chunks (C8 waste, C9 horizon, C10 uncommitted slots, C12 waste), and
        # the lifecycle's abort before scheduling raises the assertion (C14).
        violates=("C8", "C9", "C10", "C12", "C14"),
    ),
    _variant(
        "resetting-deadline",
        description="vLLM #53087: the deferral deadline restarts at every failed "
        "promotion round and never expires while a write stalls",
        deferral_clock=_resetting_deferral_clock,
        violates=("C13",),
    ),
    _variant(
        "no-deadline",
        description="vLLM #49829: HIT_PENDING defers without a deadline (a stalled write "
        "defers the request until the client gives up)",
        deferral_expired=_never_expires,
        violates=("C13",),
    ),
    _variant(
        "legacy-drop-lookahead-store",
        description="the lookup keeps the legacy EAGLE drop (peek and pop a chunk) under "
        "lookahead block hashes, while the store path stores as lookahead hashes allow",
        lookup_drops_eagle_block=_legacy_eagle_drop,
        # Measured by `kvcontract prove`: the peek reads a chunk with no key or a MISS
        # (C4, C12 lost hit), pops (C5), and defers on a pending peek chunk (C3).
        violates=("C3", "C4", "C5", "C12"),
    ),
    _variant(
        "legacy-mask-lookahead-lookup",
        description="the store path keeps the legacy EAGLE mask (peek block, volatile "
        "last chunk, the GPU's EAGLE replay boundaries) under lookahead block hashes, "
        "while the lookup drops nothing",
        store_drops_eagle_block=_legacy_eagle_drop,
        # Measured by `kvcontract prove`: peek chunks no lookup reads (C8, C9 and C12
        # waste).
        violates=("C8", "C9", "C12"),
    ),
    _variant(
        "minus-one-after-clamps",
        description="vLLM 0.33.0: the SWA lookup subtracts the recomputed last token after "
        "the scheduling budgets, so a budget below the prompt loses a token (and a chunk)",
        initial_lookup_cap=_minus_one_after_clamps,
        violates=("C4",),
    ),
    _variant(
        "full-horizon-unfinished-prefill",
        description="vLLM 0.33.0: a request finished before its prefill completed (an "
        "error finish) is stored up to its prompt, past the tokens it computed",
        get_num_offloadable_tokens=_full_horizon_tokens,
        violates=("C10", "C14"),
    ),
    _variant(
        "publish-failed-store",
        description="vLLM 0.33.0's scheduler: a store job the worker reports is completed "
        "as stored even when its transfer failed, so a resend loads unwritten chunks",
        store_job_published=_publish_every_store,
        # Measured by `kvcontract prove --impl publish-failed-store --clause C14
        # --clause C15`.
        violates=("C14",),
    ),
    _variant(
        "first-block-null-offset",
        description="vLLM 0.33.0's store jobs: null pages are dropped and only the first "
        "block's offset is kept, so a block after an interior null page lands at the "
        "wrong offset of its CPU chunk",
        store_block_slot=_first_block_null_offset_slot,
        violates=("C10",),
    ),
    _variant(
        "no-shared-prefix-junction",
        description="vLLM 0.33.0's offloading connector: a request whose hit a sparse "
        "group cut below the full-attention boundary registers no junction and stores "
        "nothing for it, so a later request sharing the prefix is cut again",
        shared_prefix_junction=_no_junction,
        # Measured by `kvcontract prove --impl no-shared-prefix-junction`.
        violates=("C12",),
    ),
)}


def get_implementation(name: str) -> Implementation:
    """Look up a registered implementation by name."""
    try:
        return VARIANTS[name]
    except KeyError:
        raise UnknownTargetError(name, sorted(VARIANTS)) from None


def variant_names() -> list[str]:
    return list(VARIANTS)
