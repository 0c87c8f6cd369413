"""Lookup coverage: window sizes and the two scanners, stated declaratively.

docs/CONTRACT.md section 4. The scanners here describe *what* the answer is (the rightmost
complete window, the prefix fallback, when it is deferred); the operational loops that
upstream writes live in :mod:`kvcontract.impl.reference` and are checked against these.

Lookup results are small integers so that a sequence of them can be a sequence of Z3
integer variables (see :class:`LookupResult`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcontract.spec.arith import (
    Bool,
    Num,
    and_,
    any_of,
    cdiv,
    ite,
    ite_bool,
    max_,
    mod,
    not_,
    or_,
)
from kvcontract.vocabulary import LookupResult as LookupResult  # defined in vocabulary

HIT = LookupResult.HIT
MISS = LookupResult.MISS
HIT_PENDING = LookupResult.HIT_PENDING
RETRY = LookupResult.RETRY


# -- window sizes -------------------------------------------------------------------
def window_chunks(sliding_window: Num, extra_retained: Num, chunk_tokens: Num) -> Num:
    """``W``: chunks of history a chunk-aligned boundary needs.

    The next token attends ``sw - 1`` earlier tokens and MTP retains ``e`` more, so the
    history is ``sw - 1 + e`` tokens. Upstream adds a lower bound ``cdiv(sw, tpc)``; the
    reference does not, because that bound demands a chunk that no load needs and no
    store provides when ``sw = 1 (mod tpc)`` and ``e = 0`` (ARCHITECTURE.md, "departures").
    """
    return cdiv(sliding_window - 1 + extra_retained, chunk_tokens)


def load_window_chunks(
    boundary: Num, sliding_window: Num, extra_retained: Num, chunk_tokens: Num
) -> Num:
    """``lw(N)``: chunks of history a boundary ``N`` that need not be chunk-aligned needs.

    The padding ``p = (-N) mod tpc`` is the unfilled tail of the last chunk; the window
    must reach ``sw - 1 + e`` tokens before ``N``, i.e. ``sw - 1 + e + p`` before the end of
    the last chunk.
    """
    padding = mod(-boundary, chunk_tokens)
    return max_(
        window_chunks(sliding_window, extra_retained, chunk_tokens),
        cdiv(sliding_window - 1 + extra_retained + padding, chunk_tokens),
    )


# -- scanners (declarative) ---------------------------------------------------------
@dataclass(frozen=True)
class ScanAnswer:
    """A scanner's answer: ``deferred`` (the lookup says "not yet") or ``end``.

    ``end`` is an index into the scanned key list: the exclusive end of the chosen
    window, or the length of the prefix run when no window completes.
    ``window_start`` is where the chosen window (or prefix) begins.
    """

    deferred: Bool
    end: Num
    window_start: Num

    def concrete(self) -> int | None:
        """The answer as upstream returns it: None when deferred, else the end index."""
        if not isinstance(self.deferred, bool) or not isinstance(self.end, int):
            raise TypeError("concrete() needs a scan evaluated on Python ints")
        return None if self.deferred else self.end


def is_present(result: Num) -> Bool:
    """HIT or HIT_PENDING: the key exists on the CPU side."""
    return or_(result == HIT, result == HIT_PENDING)


def sliding_window_answer(
    results: Sequence[Num], initial_window: int, window: int
) -> ScanAnswer:
    """The sliding-window lookup, declaratively (docs/CONTRACT.md 4.3).

    The answer is the rightmost complete window: the largest ``j`` such that keys
    ``[j - req(j), j)`` are all present, where ``req(len) = initial_window`` (the run
    touching the right end) and ``req(j) = window`` for ``j < len``. If none exists, the
    leftmost run is a prefix hit of length ``k`` (the longest present prefix).
    The answer is deferred iff a RETRY lies at or right of the chosen window's start
    ... but outside it (it was scanned before the window completed), or a HIT_PENDING
    lies inside the window.
    """
    length = len(results)
    present = [is_present(r) for r in results]

    def complete(end: int) -> Bool:
        required = initial_window if end == length else window
        if end - required < 0 or required <= 0:
            return False
        return and_(*present[end - required : end])

    def deferred_for(start: int, end: int) -> Bool:
        retry_right = any_of([results[k] == RETRY for k in range(end, length)])
        pending_inside = any_of(
            [results[k] == HIT_PENDING for k in range(start, end)]
        )
        return or_(retry_right, pending_inside)

    # Prefix fallback: the longest present prefix, built from the left.
    prefix_len: Num = length
    for k in range(length - 1, -1, -1):
        prefix_len = ite(not_(present[k]), k, prefix_len)
    prefix_deferred: Bool = False
    for k in range(length + 1):
        prefix_deferred = ite_bool(prefix_len == k, deferred_for(0, k), prefix_deferred)

    end: Num = prefix_len
    start: Num = 0
    deferred: Bool = prefix_deferred
    # Later candidates override earlier ones: iterate from the left so the rightmost
    # complete window wins.
    for j in range(1, length + 1):
        required = initial_window if j == length else window
        if j - required < 0:
            continue  # no window of the required length fits
        ok = complete(j)
        end = ite(ok, j, end)
        start = ite(ok, j - required, start)
        deferred = ite_bool(ok, deferred_for(j - required, j), deferred)
    return ScanAnswer(deferred=deferred, end=end, window_start=start)


def prefix_answer(results: Sequence[Num]) -> ScanAnswer:
    """The prefix (full-attention) lookup, declaratively.

    The answer is the number of present keys before the first MISS (RETRY is not a
    stop: it is scanned past to start asynchronous lookups); it is deferred iff any
    RETRY or HIT_PENDING lies before that first MISS.
    """
    length = len(results)
    stop: Num = length
    for k in range(length - 1, -1, -1):
        stop = ite(results[k] == MISS, k, stop)
    # count = present keys before the first MISS; all keys before it are present
    # or RETRY; a RETRY there defers anyway.
    deferred: Bool = False
    for k in range(length + 1):
        here = any_of(
            [or_(results[i] == RETRY, results[i] == HIT_PENDING) for i in range(k)]
        )
        deferred = ite_bool(stop == k, here, deferred)
    return ScanAnswer(deferred=deferred, end=stop, window_start=0)


def eagle_query_end(candidate_end: Num, num_keys: Num) -> Num:
    """An unverified EAGLE group peeks one chunk past the candidate end, if it exists."""
    return ite(candidate_end + 1 <= num_keys, candidate_end + 1, num_keys)


def answer_is_all_hit(results: Sequence[Num], answer: ScanAnswer) -> Bool:
    """C2 on one scan: a non-deferred answer's window holds only HIT keys."""
    checks: list[Bool] = []
    for k in range(len(results)):
        inside = and_(answer.window_start <= k, k < answer.end)
        checks.append(or_(not_(inside), results[k] == HIT))
    return or_(answer.deferred, and_(*checks))
