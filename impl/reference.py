"""The reference implementation: operational code in upstream's style.

These functions are written the way the serving code is written (loops over lookup
results, early returns, per-block masks) and deliberately do not import the formulas of
:mod:`kvcontract.spec`: the prover checks them against the spec. They are the correct
design. Where upstream's current release differs, the difference is kept as the
``upstream-current`` variant (:mod:`kvcontract.impl.variants`) and explained in
ARCHITECTURE.md ("departures from upstream"):

* ``get_sliding_window_size_in_chunks`` uses the exact history ``sw - 1 + e``; upstream
  keeps a lower bound ``cdiv(sw, tpc)`` that, for ``sw = 1 (mod tpc)`` and ``e = 0``,
  demands one chunk that no load needs and no store provides (C4, C7).

Every function here must also run on the symbolic integers of
:mod:`kvcontract.proofs.symbolic` (so only ``+ - * // %``, comparisons, ``if``,
``max``/``min`` on numbers; no ``range`` over a symbolic bound in the arithmetic part).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcontract.vocabulary import ENDED_STATUSES, LookupResult, RequestStatus

HIT = LookupResult.HIT
MISS = LookupResult.MISS
HIT_PENDING = LookupResult.HIT_PENDING
RETRY = LookupResult.RETRY


def _cdiv(a: Any, b: Any) -> Any:
    return -(-a // b)


# -- allocation retention (GPU sliding-window manager) -----------------------------
def get_num_skipped_tokens(
    num_computed_tokens: Any, sliding_window: Any, extra_retained: Any
) -> Any:
    """Tokens below the window (freed or null) after ``num_computed_tokens``."""
    num_skipped = num_computed_tokens - sliding_window + 1 - extra_retained
    if num_skipped < 0:
        return 0
    return num_skipped


def retained_block_range(
    num_computed_tokens: Any, block_size: Any, sliding_window: Any, extra_retained: Any
) -> tuple[Any, Any]:
    """Live block indices ``[first, end)`` of a sliding-window group."""
    skipped = get_num_skipped_tokens(num_computed_tokens, sliding_window, extra_retained)
    return skipped // block_size, _cdiv(num_computed_tokens, block_size)


def load_chunk_range(
    num_hit_tokens: Any,
    num_local_tokens: Any,
    block_size: Any,
    blocks_per_chunk: Any,
    sliding_window: Any,
    extra_retained: Any,
) -> tuple[Any, Any]:
    """Chunks to load for an external hit: every fresh block of the retained range."""
    first_block, _ = retained_block_range(
        num_hit_tokens, block_size, sliding_window, extra_retained
    )
    num_local_blocks = _cdiv(num_local_tokens, block_size)
    if num_local_blocks > first_block:
        first_block = num_local_blocks
    return first_block // blocks_per_chunk, _cdiv(num_hit_tokens, block_size * blocks_per_chunk)


# -- lookup coverage ----------------------------------------------------------------
def get_sliding_window_size_in_chunks(
    sliding_window: Any, extra_retained: Any, tokens_per_chunk: Any
) -> Any:
    """Chunks a chunk-aligned boundary must find: the ``sw - 1 + e`` tokens of history."""
    history = sliding_window - 1 + extra_retained
    return _cdiv(history, tokens_per_chunk)


def load_window_size_in_chunks(
    boundary: Any, sliding_window: Any, extra_retained: Any, tokens_per_chunk: Any
) -> Any:
    """Chunks a (possibly unaligned) boundary must find, counted back from its last chunk."""
    window = get_sliding_window_size_in_chunks(sliding_window, extra_retained, tokens_per_chunk)
    padding = (-boundary) % tokens_per_chunk
    padded = _cdiv(sliding_window - 1 + extra_retained + padding, tokens_per_chunk)
    if padded > window:
        return padded
    return window


LookupFn = Callable[[int], LookupResult]


def sliding_window_step(
    consecutive: Any, required: Any, defer: Any, pending_in_run: Any, result: Any, window: Any
) -> tuple[Any, Any, Any, Any, Any]:
    """One key of the right-to-left scan: the scan state after ``result``, and whether the
    run now completes its window.

    The state is the run of present keys counted so far, the run length it must reach
    (``initial_window`` while the run touches the right end, ``window`` after), the
    sticky RETRY defer and whether the run holds a HIT_PENDING. A MISS or RETRY ends the
    run and forgets its pending mark. Pure and loop-free, so the prover lifts it for
    every state and every window (an induction over the scan).
    """
    if result in (HIT, HIT_PENDING):
        consecutive += 1
        if result == HIT_PENDING:
            pending_in_run = True
        return consecutive, required, defer, pending_in_run, consecutive >= required
    if result == RETRY:
        defer = True
    return 0, window, defer, False, False


def sliding_window_lookup(
    lookup: LookupFn, start: int, end: int, initial_window: int, window: int
) -> int | None:
    """Right-to-left scan for the rightmost complete window over keys ``[start, end)``.

    Returns the exclusive end index of the window, the length of the prefix run when
    the scan reaches ``start``, or None to defer. A HIT_PENDING only defers if it is in
    the window that completes: a MISS or RETRY ends the run and forgets its pending mark
    (a RETRY keeps a sticky defer, since the key's location is unknown). Each key is one
    :func:`sliding_window_step`.
    """
    consecutive = 0
    required = initial_window
    defer = False
    pending_in_run = False
    for idx in range(end - 1, start - 1, -1):
        consecutive, required, defer, pending_in_run, complete = sliding_window_step(
            consecutive, required, defer, pending_in_run, lookup(idx), window
        )
        if complete:
            if defer or pending_in_run:
                return None
            found: int = idx + consecutive
            return found
    if defer or pending_in_run:
        return None
    return start + consecutive


def prefix_step(count: Any, defer: Any, result: Any) -> tuple[Any, Any, Any]:
    """One key of the left-to-right prefix scan: ``(count, defer, stop)`` after ``result``.

    A MISS stops the scan; a RETRY defers and is scanned past uncounted (it starts the
    asynchronous lookups of the keys after it); a HIT_PENDING counts and defers. Pure
    and loop-free, so the prover lifts it for every state.
    """
    if result == MISS:
        return count, defer, True
    if result == RETRY:
        return count, True, False
    if result == HIT_PENDING:
        defer = True
    return count + 1, defer, False


def prefix_lookup(lookup: LookupFn, start: int, end: int) -> int | None:
    """Left-to-right scan of a full-attention group: the present keys before a MISS.

    A RETRY defers but the scan continues (it starts the asynchronous lookups of the
    keys after it); a HIT_PENDING counts and defers. Each key is one :func:`prefix_step`.
    """
    defer = False
    count = 0
    for idx in range(start, end):
        count, defer, stop = prefix_step(count, defer, lookup(idx))
        if stop:
            break
    if defer:
        return None
    return start + count


# -- store reachability (producer) ---------------------------------------------------
def segment_blocks(segment_tokens: Any, block_tokens: Any) -> Any:
    """Blocks per store segment. A segment (the alignment ``A``, or a retention interval,
    which vLLM makes a multiple of ``A``) is whole blocks wherever the mask applies (it
    stores everything when ``A`` is not a multiple of the block)."""
    return segment_tokens // block_tokens


def is_block_reachable(
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
    """Whether a consumer can ever demand this SWA block (a per-block mask entry).

    An EAGLE consumer peeks one whole *chunk* past its boundary (the offload lookup
    works in chunks). When a boundary falls inside a chunk, the block after it is in the
    boundary's own chunk, so the first block of the next chunk is marked too: it makes
    the peek chunk stored. (Upstream marks only the block after the boundary; see
    ARCHITECTURE.md, "Departures from upstream".)
    """
    if alignment_tokens is None or alignment_tokens % block_tokens != 0:
        return True
    shift = 1 if use_eagle else 0
    # Offload stores must cover every retained token: widen the window by e.
    need = _cdiv(sliding_window + extra_retained - 1, block_tokens) + shift
    if retention_interval is None:
        period: int | None = segment_blocks(alignment_tokens, block_tokens)
    elif retention_interval == 0:
        period = None
    else:
        period = segment_blocks(retention_interval, block_tokens)
    if period is not None:
        # Boundary k * period demands blocks [k * period + shift - need, ...): together
        # every block from period + shift - need on. Only when that is block 0 is every
        # block demanded (an EAGLE group's first block is not, at need == period).
        if need >= period + shift:
            return True
        if block >= shift and (block - shift) % period >= period - need:
            return True
        if (
            use_eagle
            and blocks_per_chunk > 1
            and block >= period
            and block % blocks_per_chunk == 0
            and block % period < blocks_per_chunk
        ):
            return True  # the first block of the chunk after a segment boundary
        if final_segment_end_block is not None and not use_eagle:
            partial = final_segment_end_block % period
            if partial != 0:
                tail_start = final_segment_end_block - partial
                if final_segment_end_block - need > tail_start:
                    tail_start = final_segment_end_block - need
                if tail_start <= block < final_segment_end_block:
                    return True
    for boundary in replay_boundary_blocks:
        # An EAGLE group's window ends one block later: its peek block.
        if boundary + shift - need <= block < boundary + shift:
            return True
        if use_eagle and block == -(-boundary // blocks_per_chunk) * blocks_per_chunk:
            return True  # the first block of the peek chunk
    return False


def store_final_segment_end(
    status: RequestStatus | str, prompt_horizon_chunks: int, current_chunks: int,
    retention_interval: int | None,
) -> int | None:
    """Which chunk count closes the final partial segment for this step's store job
    (None: no final tail).

    While the prompt is being prefilled (and while decoding) the prompt horizon does:
    an intermediate frontier is not the end of anything. On finish or abort the
    request's actual horizon does. Only with dense retention (``None``): under a
    retention interval vLLM's GPU cache keeps no final partial-segment tail and serves
    that segment at its replay boundaries alone, so a final tail would go unused.
    """
    if retention_interval is not None:
        return None
    if status in ENDED_STATUSES:
        return current_chunks
    return prompt_horizon_chunks


def store_replay_boundaries(
    prompt_len: int, alignment_tokens: int | None, retention_interval: int | None,
    use_eagle: bool,
) -> tuple[int, ...]:
    """The replay boundaries (tokens, ascending) the store path passes to the block mask.

    Upstream's ``_build_store_jobs`` passes ``num_prompt_tokens - 1`` only. That is the
    boundary a resend is served at, except with EAGLE (``use_eagle``: the geometry has an
    EAGLE group): the GPU prefix cache serves an EAGLE hit one unit below the aligned
    boundary it matched (the drafter's last unit is volatile), so vLLM's GPU replay rule
    (``kv_cache_coordinator.replay_boundaries``) keeps the resend's ``P - 1`` and the
    extension's ``P``, each aligned down to the unit, minus one unit. ``P - 1`` stays: its
    tail serves an EAGLE resend at the offload's finer grain whenever its peek chunk is
    complete (an SWA chunk smaller than ``A``). The offload's unit is the alignment ``A``.
    Without them an EAGLE resend whose peek chunk past ``(P - 1)`` aligned down is
    incomplete gets no offloaded hit at all. A boundary of 0 is no hit and is not passed.
    Only with a retention interval (0 included).
    """
    if retention_interval is None:
        return ()
    candidates: tuple[int, ...] = (prompt_len - 1,)
    if use_eagle and alignment_tokens is not None:
        unit = alignment_tokens
        resend = (prompt_len - 1) // unit * unit
        extension = prompt_len // unit * unit
        candidates += (resend - unit, extension - unit)
    return tuple(sorted({boundary for boundary in candidates if boundary > 0}))


def get_num_offloadable_tokens(
    status: RequestStatus | str,
    num_computed_tokens: int,
    num_scheduled_tokens: int,
    num_tokens: int,
    prompt_len: int,
    max_offload_tokens: int | None,
    offload_prompt_only: bool,
) -> int:
    """Tokens whose KV this step may store.

    An aborted request stores what it computed; a finished one everything but the final
    sampled slot (its KV was never written); a running one what this step computes.
    """
    if status == RequestStatus.ABORTED:
        tokens = num_computed_tokens
    elif status == RequestStatus.FINISHED:
        tokens = num_tokens - 1
        if tokens < prompt_len:
            tokens = prompt_len
    else:
        tokens = num_computed_tokens + num_scheduled_tokens
    if max_offload_tokens is not None and tokens > max_offload_tokens:
        tokens = max_offload_tokens
    if offload_prompt_only and tokens > prompt_len:
        tokens = prompt_len
    return tokens
