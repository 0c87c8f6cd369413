"""Partial tails: what the contract owes at a boundary finer than a chunk (docs/CONTRACT.md
9.2).

vLLM 0.33.0's offloading connector can serve a hit that ends inside a chunk: the
*partial tail*. A producer stores, besides its complete chunks, one block per group keyed
at its prompt's partial-tail boundary ``b(P)`` (a multiple of the hash block, not of the
chunk); a consumer whose complete-chunk hit ends below ``b(P)`` looks the boundary up and,
when every group's key is ready, loads its complete chunks and the partial blocks. This
module states, in kvcontract's terms and from the geometry alone:

* :func:`partial_tail_off` - why a geometry has no partial tails (None: it has them),
  the connector's rule of ``SchedulerOffloadConfig.from_spec``;
* :func:`partial_tail_boundary` - ``b(P)``, the one sub-chunk boundary a producer of
  ``P`` prompt tokens stores (vLLM's Mamba prefill checkpoint at hash granularity);
* :func:`partial_tail_promise` - the hit floor a consumer is owed through it (C12);
* :func:`partial_tail_key_position` - where a group's partial block is keyed (a legacy
  EAGLE group one proof margin past the boundary);
* :func:`partial_tail_candidates` - the boundaries a consumer's search covers, anchored
  at the full-attention hit since vLLM 0.34.0 (C4).

No implementation is called and vLLM is not imported: the live backend
(``kvcontract.live.partial_tail``) holds vLLM's own runs against these.
"""

from __future__ import annotations

from kvcontract.spec.geometry import Geometry
from kvcontract.vocabulary import GroupKind


def partial_tail_off(geometry: Geometry) -> str | None:
    """Why ``geometry`` has no partial tails, or None when it has them.

    vLLM 0.33.0 (``offloading/scheduler.py``, ``SchedulerOffloadConfig.from_spec``:
    ``supports_partial_tail``) offers them only with one block per chunk, one block size
    for every group, a Mamba group (align mode, the only one kvcontract models) whose
    block exceeds the hash block, no sliding-window group, and no decode context
    parallelism (0.34.0 keeps these conditions). EAGLE geometries have them in vLLM too,
    keyed per :func:`partial_tail_key_position`; the contract states no promise there,
    so they are named here (the reason says which block-hash mode)."""
    if geometry.blocks_per_chunk != 1:
        return f"blocks per chunk is {geometry.blocks_per_chunk} (partial tails need 1)"
    sizes = {geometry.block_tokens(g) for g in geometry.groups}
    if len(sizes) != 1:
        return f"groups have block sizes {sorted(sizes)} (partial tails need one)"
    tph = geometry.hash_block_size
    assert tph is not None
    if not any(g.kind is GroupKind.MAMBA and geometry.block_tokens(g) > tph
               for g in geometry.groups):
        return (f"no Mamba group with a block larger than the hash block ({tph} tokens): "
                "a boundary finer than the block has no state to resume from")
    if any(g.kind is GroupKind.SLIDING_WINDOW for g in geometry.groups):
        return "a sliding-window group (partial tails need non-windowed groups)"
    if geometry.dcp != 1:
        return f"decode context parallelism {geometry.dcp} (partial tails need 1)"
    if any(geometry.drops_eagle_block(g) for g in geometry.groups):
        return ("an EAGLE group under legacy hashes: vLLM keys its partial block at a proof "
                "position past the boundary (partial_tail_key_position) and stores a tail "
                "only for a producer that loaded from the offload tier; the contract "
                "promises nothing there (not checked)")
    if any(g.eagle for g in geometry.groups):
        return ("an EAGLE group under lookahead hashes: keyed at the boundary "
                "(partial_tail_key_position), but b(P) against the keyed tokens is not "
                "stated (not checked)")
    return None


def partial_tail_key_position(geometry: Geometry, group_index: int, boundary: int) -> int:
    """The token position whose hash keys group ``group_index``'s partial block at
    ``boundary`` (vLLM 0.33.0 and 0.34.0, ``_partial_tail_key_tokens``): ``boundary``,
    except for a non-Mamba EAGLE group under legacy hashes (``drops_eagle_block``), keyed
    one hash block further (its proof: vLLM's ``eagle_proof_margin``, a hash block where
    the group's manager matches at hash granularity, as full attention does on the
    partial-tail geometries). Under lookahead hashes (0.34.0's default) the hash at the
    boundary already covers the drafter's next tokens: no margin."""
    group = geometry.groups[group_index]
    if geometry.drops_eagle_block(group) and group.kind is not GroupKind.MAMBA:
        tph = geometry.hash_block_size
        assert tph is not None
        return boundary + tph
    return boundary


def partial_tail_candidates(geometry: Geometry, complete_boundary: int,
                            full_attention_boundary: int, limit: int) -> list[int]:
    """The sub-chunk boundaries a consumer's partial-tail search may serve, largest first
    (C4 at hash-block granularity; vLLM 0.34.0's ``_lookup_partial_tail_hit``).

    ``complete_boundary`` ends its complete-chunk hit; ``full_attention_boundary`` the
    hit its full-attention groups proved before the Mamba group narrowed it; ``limit``
    the largest boundary it may be served up to (its ``N - 1``, its keyed tokens less a
    proof margin, its load budget). The search is anchored at ``max(complete,
    full_attention)``: a hit at ``b`` loads the full-attention chunks below ``b``'s
    block, which the full-attention groups serve up to the anchor, so every boundary
    below the anchor's next block is a candidate; a chunk boundary at or below the
    anchor is skipped (the complete-chunk lookup already missed it there). vLLM 0.33.0
    searched from ``complete_boundary`` alone (the anchor is the complete hit)."""
    tph = geometry.hash_block_size
    assert tph is not None
    block = geometry.block_tokens(geometry.groups[0])
    anchor = max(complete_boundary, full_attention_boundary)
    # A legacy EAGLE group's tail carries its own proof: vLLM searches one block more.
    blocks = 2 if any(partial_tail_key_position(geometry, i, 0)
                      for i in range(len(geometry.groups))) else 1
    top = min(limit, anchor + blocks * block - 1) // tph * tph
    return [b for b in range(top, complete_boundary, -tph)
            if not (b <= anchor and b % block == 0)]


def partial_tail_boundary(geometry: Geometry, prompt_len: int) -> int | None:
    """``b(P)``: the sub-chunk boundary a producer of ``prompt_len`` prompt tokens
    stores a partial block at, or None when there is none (no partial tails, or ``b(P)``
    falls on a chunk boundary: then the complete chunks serve it).

    The largest multiple of the hash block at most ``P - 1``: the last prompt token is
    recomputed for its logits, and a key exists per hash block. vLLM computes it as the
    Mamba prefill checkpoint (``kv_cache_interface.get_mamba_prefill_checkpoint_position``
    at the hash block, no EAGLE block drop, no hash lookahead); the scheduler ends a
    prefill step there (``Scheduler._mamba_block_aligned_split``: ``tail_boundary``), the
    Mamba manager keys the block holding it (``_cache_partial_tail_block``) and hands its
    copy-on-write block to the connector, which stores it with every other group's block
    at that position (``_build_partial_tail_store_jobs``)."""
    if partial_tail_off(geometry) is not None or prompt_len < 2:
        return None
    tph = geometry.hash_block_size
    assert tph is not None
    boundary = (prompt_len - 1) // tph * tph
    tpc = geometry.chunk_tokens(geometry.groups[0])
    if boundary == 0 or boundary % tpc == 0:
        return None
    return boundary


def partial_tail_promise(geometry: Geometry, prompt_len: int, consumer_tokens: int,
                         shared_tokens: int) -> int:
    """The hit a consumer of ``consumer_tokens`` tokens sharing its first
    ``shared_tokens`` with a producer of ``prompt_len`` prompt tokens is owed through the
    producer's partial tail, once the producer computed past ``b(P)`` (one that ends
    there stores no tail: docs/CONTRACT.md 9.2) and its stores completed: ``b(P)`` when the
    consumer shares the tokens it keys (``shared_tokens >= b(P)``) and may be served up
    to it (``consumer_tokens - 1 >= b(P)``: its own last token is recomputed); else 0
    (the complete chunks' promise is C12's usual one).

    Why the consumer's lookup reaches it: its complete-chunk hit ends at the chunk
    boundary below ``b(P)`` (the producer stored every complete chunk of its prompt and
    the Mamba state there, where its prefill step ended), and vLLM searches the
    boundaries of the next block from the top, one hash block at a time
    (``_lookup``/``_lookup_partial_tail``): ``b(P)`` is among them."""
    boundary = partial_tail_boundary(geometry, prompt_len)
    if boundary is None or shared_tokens < boundary or consumer_tokens - 1 < boundary:
        return 0
    return boundary


__all__ = ["partial_tail_boundary", "partial_tail_candidates", "partial_tail_key_position",
           "partial_tail_off", "partial_tail_promise"]
