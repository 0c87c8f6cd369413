"""Allocation retention: what the GPU sliding-window manager keeps (docs/CONTRACT.md section 3).

Every function works on Python ints and on Z3 terms (see :mod:`kvcontract.spec.arith`).
Ranges are half-open ``(start, end)`` pairs.
"""

from __future__ import annotations

from kvcontract.spec.arith import Bool, Num, cdiv, floordiv, max_


def skipped_tokens(n: Num, sliding_window: Num, extra_retained: Num) -> Num:
    """Tokens below the retained history once ``n`` tokens are computed.

    Token ``n`` (the next one computed) attends ``[n - sw + 1, n]``; MTP keeps ``e``
    more tokens of history, so everything below ``n - sw + 1 - e`` is freed or null.
    """
    return max_(0, n - sliding_window + 1 - extra_retained)


def retained_token_range(n: Num, sliding_window: Num, extra_retained: Num) -> tuple[Num, Num]:
    """The tokens a sliding-window group must hold after ``n`` computed tokens."""
    return skipped_tokens(n, sliding_window, extra_retained), n


def retained_block_range(
    n: Num, block_size: Num, sliding_window: Num, extra_retained: Num
) -> tuple[Num, Num]:
    """``Ret(n) = [skipped(n) // bs, cdiv(n, bs))``: the live blocks of an SWA group."""
    return (
        floordiv(skipped_tokens(n, sliding_window, extra_retained), block_size),
        cdiv(n, block_size),
    )


def first_fresh_block(
    hit: Num, local_hit: Num, block_size: Num, sliding_window: Num, extra_retained: Num
) -> Num:
    """First block allocated fresh (and loaded) for an external hit after a local hit."""
    return max_(
        cdiv(local_hit, block_size),
        floordiv(skipped_tokens(hit, sliding_window, extra_retained), block_size),
    )


def load_chunk_range(
    hit: Num,
    local_hit: Num,
    block_size: Num,
    blocks_per_chunk: Num,
    sliding_window: Num,
    extra_retained: Num,
) -> tuple[Num, Num]:
    """``Load(N, L)``: the chunks an SWA group loads for an external hit ``N`` after ``L``."""
    first = first_fresh_block(hit, local_hit, block_size, sliding_window, extra_retained)
    return floordiv(first, blocks_per_chunk), cdiv(hit, block_size * blocks_per_chunk)


def full_attention_load_chunk_range(
    hit: Num, local_hit: Num, block_size: Num, blocks_per_chunk: Num
) -> tuple[Num, Num]:
    """The chunks a full-attention group loads: every chunk past the local hit."""
    return (
        floordiv(cdiv(local_hit, block_size), blocks_per_chunk),
        cdiv(hit, block_size * blocks_per_chunk),
    )


def allocation_block_span(
    hit: Num, local_hit: Num, block_size: Num, sliding_window: Num, extra_retained: Num
) -> Num:
    """Blocks allocated fresh for the hit: ``cdiv(N, bs) - first_fresh_block``."""
    return cdiv(hit, block_size) - first_fresh_block(
        hit, local_hit, block_size, sliding_window, extra_retained
    )


def allocation_bound_holds(
    hit: Num,
    local_hit: Num,
    block_size: Num,
    blocks_per_chunk: Num,
    sliding_window: Num,
    extra_retained: Num,
    window: Num,
) -> Bool:
    """The allocator's assertion: fresh blocks ``<= W * bpc + 1``."""
    span = allocation_block_span(hit, local_hit, block_size, sliding_window, extra_retained)
    return span <= window * blocks_per_chunk + 1
