"""Lookup coverage: window sizes and the two scanners, stated declaratively.

docs/CONTRACT.md section 4. The scanners here describe *what* the answer is (the rightmost
complete window, the prefix fallback, when it is deferred); the operational loops that
upstream writes live in :mod:`kvcontract.impl.reference` and are checked against these.

Lookup results are small integers so that a sequence of them can be a sequence of Z3
integer variables (see :class:`LookupResult`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvcontract.spec.arith import (
    Bool,
    Num,
    all_in,
    and_,
    any_in,
    any_of,
    cdiv,
    floordiv,
    ite,
    ite_bool,
    max_,
    mod,
    not_,
    or_,
)
from kvcontract.vocabulary import LookupResult as LookupResult  # defined in vocabulary


def hashed_tokens(num_tokens: Num, hash_block_size: Num, hash_lookahead: Num) -> Num:
    """Tokens of a request covered by block hashes, where its offload keys end
    (docs/CONTRACT.md 2.1): whole hash blocks, each with ``hash_lookahead`` tokens past it
    (0 under legacy hashes: every whole hash block)."""
    return floordiv(max_(0, num_tokens - hash_lookahead), hash_block_size) * hash_block_size

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
    store provides when ``sw = 1 (mod tpc)`` and ``e = 0`` (docs/CONTRACT.md section 12).
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


# -- scanners as folds (docs/CONTRACT.md 4.5) ----------------------------------------
# The same two answers, computed one key at a time over a small state. The prover shows
# by induction over the keys (spec/properties/unbounded.py) that each fold's answer is
# the declarative answer above for every sequence length, and that the implementation's
# own step functions refine these steps; the declarative functions stay the definition.
@dataclass(frozen=True)
class WindowScanState:
    """The sliding-window fold's state after the keys right of the scan position.

    ``run`` present keys from the position on, then the end of the keys
    (``touches_end``) or a MISS/RETRY; ``retry_seen``: a RETRY was scanned;
    ``pending_in_run``: a HIT_PENDING lies in the run.
    """

    run: Num
    touches_end: Bool
    retry_seen: Bool
    pending_in_run: Bool


WINDOW_SCAN_START = WindowScanState(0, True, False, False)


def window_required(state: WindowScanState, initial_window: Num, window: Num) -> Num:
    """The run length that completes a window: ``initial_window`` for the run touching
    the right end (its window ends at the boundary), ``window`` for any other run."""
    return ite(state.touches_end, initial_window, window)


def sliding_window_spec_step(
    state: WindowScanState, result: Num, initial_window: Num, window: Num
) -> tuple[WindowScanState, Bool]:
    """One key, scanned right to left: the next state and whether its run completes."""
    present = is_present(result)
    complete = and_(present, state.run + 1 >= window_required(state, initial_window, window))
    return (
        WindowScanState(
            run=ite(present, state.run + 1, 0),
            touches_end=and_(present, state.touches_end),
            retry_seen=or_(state.retry_seen, result == RETRY),
            pending_in_run=and_(present, or_(state.pending_in_run, result == HIT_PENDING)),
        ),
        complete,
    )


def window_fold_answer(state: WindowScanState, position: Num) -> ScanAnswer:
    """The fold's answer when the run of ``state`` completes at key ``position``, or
    when the keys are exhausted at ``position = 0`` (the prefix run)."""
    return ScanAnswer(
        deferred=or_(state.retry_seen, state.pending_in_run),
        end=position + state.run,
        window_start=position,
    )


def sliding_window_fold(results: Sequence[int], initial_window: int, window: int) -> ScanAnswer:
    """:func:`sliding_window_answer` computed by the fold (plain ints)."""
    state = WINDOW_SCAN_START
    for position in range(len(results) - 1, -1, -1):
        state, complete = sliding_window_spec_step(
            state, results[position], initial_window, window
        )
        if complete:
            return window_fold_answer(state, position)
    return window_fold_answer(state, 0)


@dataclass(frozen=True)
class PrefixScanState:
    """The prefix fold's state after the keys left of the scan position: ``end`` is the
    first MISS once ``stopped``, else the position; ``deferred``: a RETRY or HIT_PENDING
    lies before ``end``."""

    end: Num
    stopped: Bool
    deferred: Bool


PREFIX_SCAN_START = PrefixScanState(0, False, False)


def prefix_spec_step(state: PrefixScanState, result: Num) -> PrefixScanState:
    """One key, scanned left to right."""
    stop = or_(state.stopped, result == MISS)
    return PrefixScanState(
        end=ite(stop, state.end, state.end + 1),
        stopped=stop,
        deferred=ite_bool(stop, state.deferred,
                          or_(state.deferred, result == RETRY, result == HIT_PENDING)),
    )


def prefix_fold(results: Sequence[int]) -> ScanAnswer:
    """:func:`prefix_answer` computed by the fold (plain ints)."""
    state = PREFIX_SCAN_START
    for result in results:
        state = prefix_spec_step(state, result)
    return ScanAnswer(deferred=state.deferred, end=state.end, window_start=0)


# -- the declarative answers as predicates over a sequence of any length -------------
KeyAt = Callable[[Num], Num]
"""The lookup result of key ``k``: a list's ``__getitem__``, or a symbolic sequence."""


def window_complete(at: KeyAt, end: Num, length: Num, initial_window: Num, window: Num) -> Bool:
    """Keys ``[end - req(end), end)`` are all present (``req`` as in
    :func:`sliding_window_answer`)."""
    required = ite(end == length, initial_window, window)
    fits = and_(required >= 1, end - required >= 0)
    if fits is False:
        return False  # on ints: no key below 0 is ever read
    return and_(fits, all_in(end - required, end, lambda k: is_present(at(k))))


def _past_end_or(at: KeyAt, index: Num, length: Num, pred: Callable[[Num], Bool]) -> Bool:
    """``index == length`` or ``pred(at(index))``, reading no key past the end on ints."""
    at_end = index == length
    if at_end is True:
        return True
    return or_(at_end, pred(at(index)))


def deferral_rule(at: KeyAt, length: Num, answer: ScanAnswer) -> Bool:
    """A RETRY at or right of the answer's end, or a HIT_PENDING inside its window."""
    return or_(any_in(answer.end, length, lambda k: at(k) == RETRY),
               any_in(answer.window_start, answer.end, lambda k: at(k) == HIT_PENDING))


def is_sliding_window_answer(
    at: KeyAt, length: Num, initial_window: Num, window: Num, answer: ScanAnswer
) -> Bool:
    """``answer`` is :func:`sliding_window_answer` of keys ``at(0) .. at(length - 1)``:
    the rightmost complete window, else the longest present prefix; deferred by
    :func:`deferral_rule`. Finite on a list, quantified over a symbolic sequence."""
    end, start = answer.end, answer.window_start

    def complete(j: Num) -> Bool:
        return window_complete(at, j, length, initial_window, window)

    found = and_(complete(end), start == end - ite(end == length, initial_window, window))
    prefix = and_(
        all_in(1, end + 1, lambda j: not_(complete(j))),
        start == 0,
        all_in(0, end, lambda k: is_present(at(k))),
        _past_end_or(at, end, length, lambda r: not_(is_present(r))),
    )
    return and_(
        end >= 0,
        end <= length,
        all_in(end + 1, length + 1, lambda j: not_(complete(j))),
        or_(found, prefix),
        answer.deferred == deferral_rule(at, length, answer),
    )


def is_prefix_answer(at: KeyAt, length: Num, answer: ScanAnswer) -> Bool:
    """``answer`` is :func:`prefix_answer` of keys ``at(0) .. at(length - 1)``."""
    end = answer.end
    return and_(
        end >= 0,
        end <= length,
        answer.window_start == 0,
        all_in(0, end, lambda k: at(k) != MISS),
        _past_end_or(at, end, length, lambda r: r == MISS),
        answer.deferred == any_in(0, end, lambda k: or_(at(k) == RETRY, at(k) == HIT_PENDING)),
    )


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
