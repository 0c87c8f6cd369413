"""Which functions of an :class:`~kvcontract.impl.bundle.Implementation` each theorem
exercises, by theorem name (the part before any ``[...]``), most specific first.

One table for every consumer: the reports locate a counterexample at the first of these
functions that a variant replaced; the audit decides which theorems a partial binding
can still run, and which functions a baseline comparison must prove equal.
"""

from __future__ import annotations

LOOKUP_FUNCTIONS: tuple[str, ...] = (
    "get_sliding_window_size_in_chunks", "load_window_size_in_chunks",
    "sliding_window_lookup", "prefix_lookup", "load_chunk_range",
)
"""The multi-group lookup calls all of these (the scheduler drives them)."""

STORE_FUNCTIONS: tuple[str, ...] = (
    "is_block_reachable", "store_final_segment_end", "get_num_skipped_tokens",
)
"""The store-schedule theorems run the producer (mask, horizon, first live block)."""

THEOREM_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "retained-blocks-exact": ("retained_block_range", "get_num_skipped_tokens"),
    "load-set-exact": ("load_chunk_range",),
    "allocation-bound": ("get_sliding_window_size_in_chunks",),
    "first-run-covers-load": ("load_window_size_in_chunks", "load_chunk_range"),
    "later-run-covers-load": ("get_sliding_window_size_in_chunks", "load_chunk_range"),
    "load-window-exact": ("load_window_size_in_chunks",),
    "window-exact": ("get_sliding_window_size_in_chunks",),
    "scan-accepts-only-hit": ("sliding_window_lookup",),
    "scan-defers-only-in-scope": ("sliding_window_lookup",),
    "scan-is-maximal": ("sliding_window_lookup",),
    "lookup-loads-only-hit": LOOKUP_FUNCTIONS,
    "lookup-defers-only-in-scope": LOOKUP_FUNCTIONS,
    "lookup-is-maximal": LOOKUP_FUNCTIONS,
    "eagle-peek": LOOKUP_FUNCTIONS,
    "lookup-converges": LOOKUP_FUNCTIONS,
    "segment-boundaries-supplied": ("is_block_reachable",),
    "final-boundary-supplied": ("is_block_reachable",),
    "replay-boundary-supplied": ("is_block_reachable",),
    "stored-blocks-demanded": ("is_block_reachable",),
    "offered-at-most-once": STORE_FUNCTIONS,
    "stores-only-demanded": STORE_FUNCTIONS,
    "store-horizon": STORE_FUNCTIONS,
    "stores-well-formed": STORE_FUNCTIONS,
}
"""A theorem missing here exercises every function of the bundle (callers decide what
that means for them); ``tests/proofs/test_engine.py`` checks the table covers the
catalogue."""
