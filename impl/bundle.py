"""An implementation under test: the bundle of functions the prover and the system use.

The reference and every historic variant are :class:`Implementation` objects; a variant
is the reference with one or more functions replaced, so each variant differs from the
reference in exactly the code its defect lived in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


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
