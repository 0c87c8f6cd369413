"""Request traces for the live engine: what arrives when, and what happens to it.

A :class:`Trace` is a list of :class:`TraceRequest` (tokens, decode length, the step it
arrives, an abort at a step) and :class:`TraceEvent` (at a step: preempt a request,
reset the GPU prefix cache alone, reset it with the connector), the chunked-prefill
budget and the worker's timing. Token ids are plain ints: a consumer sharing a prefix
with a producer shares its token ids, so it shares its block hashes and offload keys.
Helpers build the usual shapes (:func:`prompt_tokens`, :func:`producer_consumer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcontract.live.worker import Timing

SAMPLED_TOKEN_BASE = 600_000
"""Token ids the stand-in sampler emits (request-independent, so a continuation that
resends a producer's output shares its hashes)."""
DIVERGENT_TOKEN_BASE = 900_000
"""Token ids of the new tokens of a continuation or sibling past the shared prefix."""

EVENT_KINDS = ("preempt", "reset-prefix-cache", "reset-all", "abort")


def prompt_tokens(length: int, *, offset: int = 1) -> list[int]:
    """``length`` distinct token ids starting at ``offset``."""
    return list(range(offset, offset + length))


def sampled_token(index: int) -> int:
    """The ``index``-th token the stand-in sampler emits for any request."""
    return SAMPLED_TOKEN_BASE + index


def divergent_tokens(count: int, *, salt: int = 0) -> list[int]:
    return [DIVERGENT_TOKEN_BASE + 97 * salt + i for i in range(count)]


@dataclass(frozen=True)
class TraceRequest:
    """One request: its prompt, the tokens it samples (``max_tokens``: the first at the
    end of its prefill, then one per decode step), the step it arrives at, and
    optionally the step it is aborted at (``abort_at``: before that step's schedule)."""

    name: str
    tokens: tuple[int, ...]
    max_tokens: int = 1
    arrive_at: int = 0
    abort_at: int | None = None
    kv_transfer_params: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError(f"request {self.name!r} has no tokens")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")


@dataclass(frozen=True)
class TraceEvent:
    """At the start of ``step`` (before its schedule): ``kind`` one of
    :data:`EVENT_KINDS`, on request ``request`` where it names one."""

    step: int
    kind: str
    request: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"event kind must be one of {EVENT_KINDS}, not {self.kind!r}")


@dataclass(frozen=True)
class Phase:
    """Requests run until the engine is idle (every request finished and every job the
    worker will report reported), or ``max_steps``."""

    requests: tuple[TraceRequest, ...]
    events: tuple[TraceEvent, ...] = ()
    max_steps: int = 200
    reset_prefix_cache_after: bool = False
    """After the phase: ``Scheduler.reset_prefix_cache(reset_connector=False)``, so the
    next phase's hits come from the offloaded tier alone."""


@dataclass(frozen=True)
class Trace:
    """Phases run in order on one engine; the worker's timing for all of them."""

    phases: tuple[Phase, ...]
    timing: Timing = field(default_factory=Timing)

    @property
    def requests(self) -> tuple[TraceRequest, ...]:
        return tuple(r for phase in self.phases for r in phase.requests)


def producer_consumer(producer: TraceRequest, consumer: TraceRequest, *,
                      timing: Timing | None = None, max_steps: int = 400) -> Trace:
    """A producer run to the end, the GPU prefix cache reset (the connector's tier
    kept), then the consumer: its hit is the offloaded tier alone."""
    return Trace((Phase((producer,), max_steps=max_steps, reset_prefix_cache_after=True),
                  Phase((consumer,), max_steps=max_steps)), timing or Timing())
