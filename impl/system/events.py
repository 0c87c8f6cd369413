"""What the executable system reports about itself: small frozen records of plain data.

Contract: :class:`~kvcontract.impl.system.engine.OffloadSystem` judges nothing. At every
decision the contract speaks about it builds one of these records and hands it to each
subscribed observer (``system.subscribe(fn)``), synchronously and in decision order; a
monitor outside ``impl/`` (:class:`kvcontract.tools.monitor.Monitor`) judges them
against the spec, and a log can keep them. Payloads are ints, bools, strings, tuples,
frozensets and the vocabulary enums (:class:`~kvcontract.vocabulary.LookupResult`,
:class:`~kvcontract.vocabulary.RequestStatus`), never tensors or live system objects,
so an observer cannot change the system through an event. Group and chunk numbers are
indices into the system's geometry; token counts are absolute.

The tensor comparisons of C11 (restored bytes, a decode step of attention) are data
movement and stay in the engine with the oracles of :mod:`.oracle`; the events carry
their outcomes (:class:`RestoreEvent`, :class:`AttentionEvent`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from kvcontract.spec.lifecycle import DeferCause, JobEvent, JobKind, RequestState, StaleReason
from kvcontract.vocabulary import LookupResult, RequestStatus

LoadRanges: TypeAlias = tuple[tuple[int, tuple[int, int]], ...]
"""Chunks loaded per group, ``((group, (lo, hi)), ...)`` in the order the lookup reported
them (``dict(ranges)`` gives the mapping)."""


class LoadError(str, enum.Enum):
    """Why the offload manager refused a load (upstream's two ``prepare_load`` errors)."""

    NOT_FOUND = "not found"
    NOT_READY = "not ready"


@dataclass(frozen=True)
class LookupEvent:
    """A waiting request's lookup: the inputs the scheduler saw and what it accepted.

    ``states[g][k]`` is the manager's answer for chunk ``k`` of group ``g``, for every
    complete chunk of the request's tokens, taken before the lookup ran; ``loading`` holds
    the ``(group, chunk)`` pairs another request was loading at that moment. ``hit`` is
    the accepted boundary (the local hit when nothing is gained), ``None`` for a defer.

    ``junction`` is the shared-prefix junction the request registered with this hit
    (docs/CONTRACT.md 9.3; 0: none), from ``full_attention_boundary``, the boundary the
    full-attention groups served when the first sparse group took its turn (None when
    the lookup ended before one did). Both are None when the lookup deferred, or when
    whoever built the event did not observe a junction (a runtime monitor's lookup:
    nothing to judge then).
    """

    request: str
    num_tokens: int
    local_hit: int
    states: tuple[tuple[LookupResult, ...], ...]
    loading: frozenset[tuple[int, int]]
    hit: int | None
    load_ranges: LoadRanges
    full_attention_boundary: int | None = None
    junction: int | None = None


@dataclass(frozen=True)
class LoadEvent:
    """The manager accepted the load of an external hit (``hit > local_hit``)."""

    request: str
    hit: int
    local_hit: int
    load_ranges: LoadRanges


@dataclass(frozen=True)
class LoadCrashEvent:
    """The manager refused the load of an accepted hit; the request is dropped."""

    request: str
    hit: int
    local_hit: int
    error: LoadError
    message: str
    load_ranges: LoadRanges


@dataclass(frozen=True)
class AllocationEvent:
    """A group's block table right after a hit was allocated (``live[b]``: block ``b`` is
    a real block, not the null block)."""

    request: str
    group: int
    hit: int
    live: tuple[bool, ...]


@dataclass(frozen=True)
class StoreEvent:
    """One group's store step: the tracker's state before, what it offered, the outcome.

    ``status``/``before``/``scheduled`` are the step (``before`` tokens were computed,
    ``scheduled`` more this step; ``scheduled == 0`` on finish or abort), ``num_tokens``
    the request's token count and ``prompt_len`` its prompt (a retention interval's
    replay boundary is ``prompt_len - 1``); ``prompt_only``: only prompt tokens are
    offloaded. ``offered_before``/``next_before`` are the tracker's offered chunks and
    ``next_stored_chunk_idx`` before the step, ``next_after`` the latter after it;
    ``num_computed`` the tokens computed once the step ran. ``refused``/``new``/
    ``evicted`` are the manager's answer to the offer (nothing offered: all zero).
    ``junction`` is the shared-prefix junction the request's store path was handed for
    its mask (docs/CONTRACT.md 9.3; 0: none, or a plugged path that takes none).
    """

    request: str
    group: int
    status: RequestStatus
    before: int
    scheduled: int
    num_tokens: int
    prompt_len: int
    prompt_only: bool
    offered: tuple[int, ...]
    offered_before: frozenset[int]
    next_before: int
    next_after: int
    num_computed: int
    refused: bool = False
    new: int = 0
    evicted: int = 0
    junction: int = 0


@dataclass(frozen=True)
class RestoreEvent:
    """The bytes of positions ``[lo, hit)`` of a group after a hit, read through the
    request's block table, compared with the producer's (:func:`.oracle.expected_kv`)."""

    request: str
    group: int
    hit: int
    lo: int
    positions_match: bool
    first_bad: int | None


@dataclass(frozen=True)
class AttentionEvent:
    """A decode step at ``hit`` over the restored cache compared with the same step over
    a freshly computed cache (:func:`.oracle.window_decode_attention`)."""

    request: str
    group: int
    hit: int
    outputs_match: bool


# -- the request lifecycle (C13-C15; ``OffloadSystem.subscribe_lifecycle``) -------------
@dataclass(frozen=True)
class StateEvent:
    """A request entered ``state`` at scheduler step ``step``."""

    request: str
    step: int
    state: RequestState
    num_computed: int


@dataclass(frozen=True)
class DeferralEvent:
    """A lookup deferred: why, on which chunks (``(group, chunk, key name, cause)``) and
    since when (``deferred_since``: the step the deadline counts from, as the
    implementation's ``deferral_clock`` keeps it)."""

    request: str
    step: int
    local_hit: int
    causes: tuple[DeferCause, ...]
    waited_on: tuple[tuple[int, int, str, DeferCause], ...]
    deferred_since: int


@dataclass(frozen=True)
class DecisionEvent:
    """A lookup decided ``hit`` tokens (``by_deadline``: the deferral bound forced it,
    over the chunks that were ready); ``load_ranges`` the chunks loaded per group and
    ``load_keys`` their key names."""

    request: str
    step: int
    local_hit: int
    hit: int
    load_ranges: LoadRanges
    load_keys: tuple[str, ...]
    by_deadline: bool


@dataclass(frozen=True)
class TransferEvent:
    """One line of a transfer job's life. ``stale`` (a store's submission only): the
    blocks it reads that are no longer the request's, with why."""

    request: str
    step: int
    job_id: int
    kind: JobKind
    event: JobEvent
    group: int
    chunks: tuple[int, ...]
    keys: tuple[str, ...]
    stale: tuple[tuple[int, StaleReason], ...] = ()


@dataclass(frozen=True)
class StoreOfferEvent:
    """The chunks one group's store step offered, with the status it ran with."""

    request: str
    step: int
    group: int
    status: RequestStatus
    num_computed: int
    offered: tuple[int, ...]


@dataclass(frozen=True)
class RecoveryEvent:
    """Loads of an accepted hit failed or were cancelled: the chunks (``(group,
    chunk)``) and key names; the request goes back to waiting with nothing computed."""

    request: str
    step: int
    local_hit: int
    hit: int
    failed: tuple[tuple[int, int], ...]
    failed_keys: tuple[str, ...]


LifecycleEvent: TypeAlias = (
    StateEvent | DeferralEvent | DecisionEvent | TransferEvent | StoreOfferEvent
    | RecoveryEvent
)
LifecycleObserver: TypeAlias = Callable[[LifecycleEvent], None]
"""What ``OffloadSystem.subscribe_lifecycle`` takes (a channel apart from
:data:`Observer`, so the monitor's event handlers see exactly what they saw before)."""


Event: TypeAlias = (
    LookupEvent | LoadEvent | LoadCrashEvent | AllocationEvent | StoreEvent | RestoreEvent
    | AttentionEvent
)
Observer: TypeAlias = Callable[[Event], None]
"""What ``OffloadSystem.subscribe`` takes: called once per event, in decision order."""
