"""An implementation under test: the bundle of functions the prover and the system use.

The reference and every historic variant are :class:`Implementation` objects; a variant
is the reference with one or more functions replaced, so each variant differs from the
reference in exactly the code its defect lived in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcontract.impl import reference as _reference


@dataclass(frozen=True)
class Implementation:
    """Named functions in upstream's shapes (see :mod:`kvcontract.impl.reference`)."""

    name: str
    description: str
    get_num_skipped_tokens: Callable[..., Any]
    retained_block_range: Callable[..., tuple[Any, Any]]
    load_chunk_range: Callable[..., tuple[Any, Any]]
    get_sliding_window_size_in_chunks: Callable[..., Any]
    load_window_size_in_chunks: Callable[..., Any]
    sliding_window_lookup: Callable[..., int | None]
    prefix_lookup: Callable[..., int | None]
    is_block_reachable: Callable[..., Any]
    store_final_segment_end: Callable[..., int | None]
    """``(status, prompt_horizon_chunks, current_chunks, retention_interval)``: the chunk
    count that closes the final partial segment of a store job, None for no final tail."""
    store_replay_boundaries: Callable[..., tuple[int, ...]]
    """``(prompt_len, alignment_tokens, retention_interval, use_eagle)``: the replay
    boundaries (tokens) the producer's store path passes to its mask; ``use_eagle`` is
    whether the geometry has an EAGLE group."""
    violates: tuple[str, ...] = ()
    """Clauses the variant is known to violate (empty for the reference)."""
    notes: dict[str, str] = field(default_factory=dict)
    # The store step's decisions (``StoreTracker.step`` calls them; pure, so the prover
    # lifts them for every schedule). They default to the reference's, so a bundle that
    # predates them (an audit binding, a user's bundle) keeps the reference's store step.
    get_num_offloadable_tokens: Callable[..., Any] = _reference.get_num_offloadable_tokens
    """``(status, num_computed, num_scheduled, num_tokens, prompt_len,
    max_offload_tokens, offload_prompt_only)``: the tokens whose KV this step may store."""
    store_step_bounds: Callable[..., tuple[Any, Any, Any, Any]] = _reference.store_step_bounds
    """``(status, offloadable_tokens, prompt_len, max_offload_tokens, tokens_per_chunk,
    use_eagle, next_stored_chunk_idx)``: ``(first candidate, end of the candidates,
    stored index after the step, prompt horizon in chunks)``."""
    store_chunk_offered: Callable[..., tuple[Any, Any]] = _reference.store_chunk_offered
    """``(status, offered_before, has_marked_block, first_marked_block,
    first_live_block)``: ``(offer, unstorable)`` of one candidate chunk."""
    # One group's turn of the multi-group lookup (``lookup_complete_chunks`` folds it over
    # the groups; pure, so the prover lifts it for every state). The reference's by
    # default, like the store step's decisions.
    multigroup_lookup_step: Callable[..., tuple[Any, ...]] = (
        _reference.multigroup_lookup_step)
    """``(max_hit, confirmed, deferred, local_hit, tokens_per_chunk, num_keys, eagle,
    mamba, scan)``: ``(max_hit, confirmed, deferred, scanned_at, ended, popped)`` after
    the group's turn (:func:`kvcontract.impl.reference.multigroup_lookup_step`)."""
    initial_lookup_cap: Callable[..., Any] = _reference.initial_lookup_cap
    """``(num_tokens, recomputes_last_token, max_hit_tokens)``: the multi-group lookup's
    first candidate boundary (the request less its recomputed last token, capped by the
    scheduling budget; :func:`kvcontract.impl.reference.initial_lookup_cap`)."""
    # The deferral deadline (C13): when a deferred request's lookup stops deferring and
    # decides with what is ready. The reference's by default (pure: lifted by the prover).
    deferral_clock: Callable[..., Any] = _reference.deferral_clock
    """``(deferred_since, step)``: the step the request's deferral started after it
    deferred again at ``step`` (``deferred_since < 0``: it was not deferred)."""
    deferral_expired: Callable[..., Any] = _reference.deferral_expired
    """``(deferred_since, step, bound)``: whether the lookup at ``step`` must decide
    (``bound < 0``: no deadline configured)."""
    # A failed transfer (C14): what the system does with a store job the worker reports
    # failed. The reference's by default.
    store_job_published: Callable[[bool], bool] = _reference.store_job_published
    """``(failed)``: whether the reported store job's chunks become readable."""
    # Block placement (C10): the slot a store job's worker writes each live block into.
    # The reference's by default (pure: lifted by the prover for all values).
    store_block_slot: Callable[..., Any] = _reference.store_block_slot
    """``(position, first_live_page, nulls_before, blocks_per_chunk)``: the slot, from
    the first page of the job's first chunk, that the job writes the live block at
    ``position`` of its pages into (:func:`kvcontract.impl.reference.store_block_slot`)."""
    # The EAGLE drop per hash mode (docs/CONTRACT.md 2.1), asked separately by the lookup
    # and by the store path: the two must agree, and a variant that makes them disagree is
    # the mixed-mode defect C5 and C12 catch.
    lookup_drops_eagle_block: Callable[[bool, int], bool] = _reference.drops_eagle_block
    """``(eagle, hash_lookahead)``: whether the lookup peeks and pops the group's
    trailing chunk."""
    store_drops_eagle_block: Callable[[bool, int], bool] = _reference.drops_eagle_block
    """``(eagle, hash_lookahead)``: whether the store path shifts the group's mask to its
    peek block, withholds its last chunk while decoding and passes the GPU's EAGLE replay
    boundaries."""
    keyed_tokens: Callable[[int, int, int], int] = _reference.keyed_tokens
    """``(num_tokens, hash_block_size, hash_lookahead)``: the tokens a request's offload
    keys cover (its lookup's keys; with lookahead hashes also the store path's horizon)."""
    # Mamba retention (C1): the first block of the chunk holding the group's state. The
    # reference's by default (pure: lifted by the prover for all values).
    mamba_first_live_block: Callable[..., Any] = _reference.mamba_first_live_block
    """``(num_computed, chunk_tokens, blocks_per_chunk)``: the first block a Mamba group
    keeps after ``num_computed`` tokens
    (:func:`kvcontract.impl.reference.mamba_first_live_block`)."""
    # Shared-prefix junctions (C12, docs/CONTRACT.md 9.3): the boundary a request whose
    # hit a sparse group cut stores for besides its replay boundaries. The reference's by
    # default.
    shared_prefix_junction: Callable[..., int] = _reference.shared_prefix_junction
    """``(full_attention_boundary, local_hit, hit, retention_interval)``: the junction
    the request registers after its lookup, 0 for none
    (:func:`kvcontract.impl.reference.shared_prefix_junction`)."""
