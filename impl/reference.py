"""The reference implementation: operational code in upstream's style.

These functions are written the way the serving code is written (loops over lookup
results, early returns, per-block masks) and deliberately do not import the formulas of
:mod:`kvcontract.spec`: the prover checks them against the spec. They are the correct
design. Where upstream's current release differs, the difference is kept as the
``upstream-current`` variant (:mod:`kvcontract.impl.variants`) and explained in
docs/CONTRACT.md (section 12, "Departures from upstream"):

* ``get_sliding_window_size_in_chunks`` uses the exact history ``sw - 1 + e``; upstream
  keeps a lower bound ``cdiv(sw, tpc)`` that, for ``sw = 1 (mod tpc)`` and ``e = 0``,
  demands one chunk that no load needs and no store provides (C4, C7).

Every function here must also run on the symbolic integers of
:mod:`kvcontract.spec.symbolic` (so only ``+ - * // %``, comparisons, ``if``,
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
    return widen_to_boundary(window, boundary, sliding_window, extra_retained, tokens_per_chunk)


def widen_to_boundary(
    window: Any, boundary: Any, sliding_window: Any, extra_retained: Any, tokens_per_chunk: Any
) -> Any:
    """``window`` (the chunks a chunk-aligned boundary must find), widened to the chunks
    the ``sw - 1 + e`` tokens of history span back from an unaligned ``boundary``: its
    last chunk is only partly before it."""
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


def initial_lookup_cap(
    num_tokens: Any, recomputes_last_token: bool, max_hit_tokens: Any | None
) -> Any:
    """The multi-group lookup's first candidate boundary ``maxhit``.

    A windowed group (sliding window, Mamba) recomputes the request's last token for its
    logits, so the candidate starts one token below the request; a scheduling budget
    (``max_hit_tokens``: the local hit plus the tokens a step may load) then caps it. The
    ``- 1`` belongs to the request, never to the budget: a budget below the request is
    already a boundary with a token left to compute (vLLM 0.34.0's order).
    """
    cap = num_tokens
    if recomputes_last_token:
        cap = cap - 1
    if max_hit_tokens is not None and max_hit_tokens < cap:
        cap = max_hit_tokens
    return cap


LOOKUP_GOES_ON = 0
"""The group's turn left the multi-group lookup running (:func:`multigroup_lookup_step`)."""
LOOKUP_NO_CHUNK = 1
"""The group has less than one chunk beyond the local hit at the boundary: answer L."""
LOOKUP_NOTHING_BEYOND = 2
"""The group shrank the boundary to the local hit or below: answer L."""


def multigroup_lookup_step(
    max_hit: Any,
    confirmed: Any,
    deferred: Any,
    local_hit: Any,
    tokens_per_chunk: Any,
    num_keys: Any,
    eagle: Any,
    mamba: Any,
    scan: Callable[[Any, Any, Any, bool], Any],
) -> tuple[Any, Any, Any, Any, Any, Any]:
    """One group's turn of the multi-group lookup at boundary ``max_hit``.

    ``confirmed``: the group confirmed ``max_hit`` already; ``deferred``: it deferred at
    ``max_hit``. ``scan(start, stop, at, present_view)`` is the group's scan of keys
    ``[start, stop)`` for boundary ``at`` (``present_view``: HIT_PENDING counted as
    HIT), answering the end index it confirms or None. Returns ``(max_hit, confirmed,
    deferred, scanned_at, ended, popped)``: the boundary after the turn and the group's
    two flags there, the boundary it scanned at (``max_hit`` clamped to its keys), a
    ``LOOKUP_*`` code, and whether an EAGLE group popped its peek chunk. The caller
    (``impl/scheduler.lookup_complete_chunks``, the fold driver) drops every other
    group's flags whenever ``max_hit`` changes, since they were for a larger boundary.
    Pure and loop-free, so the prover lifts it for every state and every group.
    """
    if confirmed:  # nothing left to check at this boundary
        return max_hit, True, deferred, max_hit, LOOKUP_GOES_ON, False
    # Not enough keys: a smaller boundary. An unconfirmed group has no deferral to drop
    # (a deferral is recorded only with a confirmation, and both lapse together).
    if max_hit > num_keys * tokens_per_chunk:
        max_hit = num_keys * tokens_per_chunk
    start = local_hit // tokens_per_chunk
    if max_hit // tokens_per_chunk <= start:
        return max_hit, False, deferred, max_hit, LOOKUP_NO_CHUNK, False
    end = _cdiv(max_hit, tokens_per_chunk)
    peek = 1 if eagle else 0  # an EAGLE group looks up one chunk past the boundary
    peeked = bool(peek)
    verified = True  # whether the proposed boundary was checked by a scan
    deferred_here = False
    if peek and end + 1 > num_keys:
        # No key for the peek chunk: propose one chunk less, unscanned, to be re-checked.
        peeked = False
        verified = False
        found = end
    elif mamba and max_hit % tokens_per_chunk:
        found = max_hit // tokens_per_chunk  # a Mamba state exists only at chunk ends
        verified = False
    else:
        found = scan(start, end + peek, max_hit, False)  # through the peek chunk ``end``
        if found is None:
            # Deferred by a pending key of the window it found. Scan again with pending
            # keys counted as present to learn which boundary that window serves: the
            # defer holds only if that boundary is the final one (C3).
            found = scan(start, end + peek, max_hit, True)
            if found is None:  # a RETRY: location unknown, sticky defer
                return max_hit, True, True, max_hit, LOOKUP_GOES_ON, False
            deferred_here = True
    # The peek chunk is looked up, never loaded: pop it, once per boundary.
    popped = peeked
    found -= peek
    boundary = found * tokens_per_chunk
    if boundary < max_hit:
        # Only a scan confirms a boundary; a proposal must be re-checked. A deferral
        # recorded here is for exactly this boundary.
        if boundary <= local_hit:
            return boundary, False, False, max_hit, LOOKUP_NOTHING_BEYOND, popped
        return boundary, verified, deferred_here, max_hit, LOOKUP_GOES_ON, popped
    return max_hit, True, deferred or deferred_here, max_hit, LOOKUP_GOES_ON, popped


# -- Mamba retention (C1) ---------------------------------------------------------------
def mamba_first_live_block(num_computed: Any, chunk_tokens: Any, blocks_per_chunk: Any) -> Any:
    """The first block a Mamba group keeps after ``num_computed`` tokens: the first block
    of the chunk holding its state at the last chunk end at or before them (vLLM keeps
    Mamba states at block ends in align mode), block 0 before the first chunk end."""
    state_chunk = num_computed // chunk_tokens - 1
    return max(state_chunk, 0) * blocks_per_chunk


# -- store reachability (producer) ---------------------------------------------------
def drops_eagle_block(eagle: bool, hash_lookahead: int) -> bool:
    """Whether a group drops its trailing block as EAGLE: an EAGLE group whose block
    hashes do not cover the drafter's lookahead (``hash_lookahead == 0``, the legacy
    hashes). The drafter's KV at a block's last position depends on the next token; a
    hash that covers that token (``hash_lookahead > 0``) proves it, so nothing is dropped:
    the lookup peeks and pops nothing, and the store path keeps no peek chunk."""
    return bool(eagle) and not hash_lookahead


def keyed_tokens(num_tokens: int, hash_block_size: int, hash_lookahead: int) -> int:
    """Tokens covered by block hashes: whole hash blocks with ``hash_lookahead`` tokens
    past each (a block is hashed only once its lookahead tokens exist)."""
    return max(0, num_tokens - hash_lookahead) // hash_block_size * hash_block_size


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
    docs/CONTRACT.md section 12, "Departures from upstream".)
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
    sampled slot (its KV was never written), and never more than it computed: a request
    finished before its prefill completed (an error finish) has KV only for its computed
    tokens (vLLM 0.34.0; 0.33.0 stored such a request up to its prompt); a running one
    what this step computes.
    """
    if status == RequestStatus.ABORTED:
        tokens = num_computed_tokens
    elif status == RequestStatus.FINISHED:
        tokens = num_tokens - 1
        if tokens < prompt_len:
            tokens = prompt_len
        if tokens > num_computed_tokens:
            tokens = num_computed_tokens
    else:
        tokens = num_computed_tokens + num_scheduled_tokens
    if max_offload_tokens is not None and tokens > max_offload_tokens:
        tokens = max_offload_tokens
    if offload_prompt_only and tokens > prompt_len:
        tokens = prompt_len
    return tokens


# -- the store step's decisions (pure, so the prover lifts them for every schedule) ----------
def store_step_bounds(
    status: RequestStatus | str,
    offloadable_tokens: Any,
    prompt_len: Any,
    max_offload_tokens: Any | None,
    tokens_per_chunk: Any,
    use_eagle: Any,
    next_stored_chunk_idx: Any,
) -> tuple[Any, Any, Any, Any]:
    """One store step's chunk bounds: ``(first candidate, end of the candidates, stored
    index after the step, prompt horizon in chunks)``.

    The candidates are ``[first, end)``: the complete chunks of the offloadable tokens
    (an EAGLE group's last one is volatile while decoding; with no chunk complete that
    leaves -1, an empty range either way), from the stored index while the request runs
    and from chunk 0 on finish or abort (the real horizon reconsiders every chunk not
    offered yet). The stored index never moves back. The prompt horizon is what vLLM's
    offloading connector stores of the prompt at most (``max_offload_tokens``), where a
    final segment ends while the request runs (:func:`store_final_segment_end`).
    """
    end = offloadable_tokens // tokens_per_chunk
    if use_eagle and status == RequestStatus.DECODING:
        end -= 1
    first = 0 if status in ENDED_STATUSES else next_stored_chunk_idx
    next_after = next_stored_chunk_idx
    if end > next_after:
        next_after = end
    prompt_tokens = prompt_len
    if max_offload_tokens is not None and max_offload_tokens < prompt_tokens:
        prompt_tokens = max_offload_tokens
    return first, end, next_after, prompt_tokens // tokens_per_chunk


def store_chunk_offered(
    status: RequestStatus | str,
    offered_before: Any,
    has_marked_block: Any,
    first_marked_block: Any,
    first_live_block: Any,
) -> tuple[Any, Any]:
    """Whether a candidate chunk of this store step is offered to ``prepare_store``, and
    whether it is unstorable: ``(offer, unstorable)``.

    ``has_marked_block`` and ``first_marked_block`` summarize the mask over the chunk's
    blocks (the first one ignored when none is marked). A chunk the mask marks nowhere is
    demanded by no boundary (C8); one whose first marked block was already freed would
    copy a null block (C10). On finish or abort the candidates start at chunk 0, so a
    chunk offered before is skipped here; while running the candidates start at the
    stored index, past every chunk offered so far, so the flag is not needed there.
    """
    if status in ENDED_STATUSES and offered_before:
        return False, False
    if not has_marked_block:
        return False, False
    if first_marked_block < first_live_block:
        return False, True
    return True, False


def store_block_slot(position: Any, first_live_page: Any, nulls_before: Any,
                     blocks_per_chunk: Any) -> Any:
    """Where one group's store job writes a live GPU block: its slot in the job's CPU
    chunks, counted from the first page of the job's first chunk (CPU chunk ``slot //
    blocks_per_chunk`` of the job's chunks, page ``slot % blocks_per_chunk``).

    ``position`` is the block's place in the job's pages (its chunk's rank among the
    job's chunks times ``blocks_per_chunk``, plus its page in the chunk);
    ``first_live_page`` the page of the job's first live block (the pages before it are
    null); ``nulls_before`` the null pages before ``position`` (freed out of the window,
    or zeroed when reallocated). The worker skips ``block index mod blocks_per_chunk``
    pages of the first chunk and writes the listed blocks one after another; the job
    lists every page of a stored chunk from the chunk's first page, a null one as a
    placeholder (the null block is zeroed: copying it is harmless), so every block keeps
    its own offset (vLLM 0.34.0). C10 (``store-blocks-placed``): the slot is
    ``position``.
    """
    return position


# -- the deferral deadline (C13; pure, so the prover lifts it for every step) ---------------
NO_DEFERRAL = -1
"""``deferred_since`` of a request that is not deferred (steps count from 0)."""
NO_BOUND = -1
"""A deferral bound that never expires (a system configured without a deadline)."""


def deferral_clock(deferred_since: Any, step: Any) -> Any:
    """The step a request's current deferral started, after it deferred again at
    ``step``: the first deferral's step, kept across every later failed lookup (a clock
    restarted at each round would never expire while a job stalls)."""
    if deferred_since < 0:
        return step
    return deferred_since


def deferral_expired(deferred_since: Any, step: Any, bound: Any) -> Any:
    """Whether a request deferred since ``deferred_since`` must be decided at ``step``:
    once ``bound`` steps have passed, the lookup decides with what is ready
    (:func:`ready_after_deadline`) instead of deferring once more."""
    if bound < 0:
        return False
    return step - deferred_since >= bound


def ready_after_deadline(result: LookupResult, loading_elsewhere: bool) -> LookupResult:
    """A chunk's answer for the lookup that decides at the deadline: only a chunk that
    is ready and nobody else is loading counts (HIT); pending, RETRY and chunks being
    loaded are treated as missing, so the lookup returns the hit the ready chunks serve
    (possibly the local hit: recompute) and never defers again."""
    if result == HIT and not loading_elsewhere:
        return HIT
    return MISS


# -- a failed transfer (C14, C15) -------------------------------------------------------------
def store_job_published(failed: bool) -> bool:
    """Whether a store job the worker reported ends with its chunks readable: only one
    whose transfer succeeded. A failed job's chunks are dropped, never published, so no
    later lookup answers HIT for bytes that were never written (a later store of the
    same chunk may publish them)."""
    return not failed


# -- shared-prefix junctions (C12; docs/CONTRACT.md 9.3) ---------------------------------------
def shared_prefix_junction(full_attention_boundary: int, local_hit: int, hit: int,
                           retention_interval: int | None) -> int:
    """The shared-prefix junction a request registers after its lookup (0: none): the
    boundary its full-attention groups serve, when a sparse (sliding-window or Mamba)
    group cut the accepted hit (``local_hit + hit``) below it and a retention interval
    (0 included) is configured. The request retains its sparse groups' history there
    while it recomputes, and its store path stores the chunks a later consumer sharing
    the prefix through the junction reads (the junction is one more boundary it passes
    to its mask), so that consumer gets the boundary (vLLM 0.34.0)."""
    if retention_interval is None or full_attention_boundary <= local_hit + hit:
        return 0
    return full_attention_boundary
