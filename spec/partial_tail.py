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
* :func:`partial_tail_promise` - the hit floor a consumer is owed through it (C12).

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
    parallelism. EAGLE groups key their partial block past the boundary (a proof margin);
    the contract does not state that case yet, so it is named here too."""
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
    if any(g.eagle for g in geometry.groups):
        return ("an EAGLE group: vLLM keys its partial block at a proof position past the "
                "boundary, which the contract does not state (not checked)")
    return None


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


__all__ = ["partial_tail_boundary", "partial_tail_off", "partial_tail_promise"]
