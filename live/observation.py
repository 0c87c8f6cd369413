"""What the live engine did, in kvcontract's vocabulary.

Chunks are named per geometry group (the group of :class:`~kvcontract.spec.geometry.Geometry`
whose layers a vLLM KV-cache group holds) and chunk index ``k`` (the chunk ending at
token ``(k + 1) * tpc``), lookup answers are :class:`~kvcontract.vocabulary.LookupResult`
words, an exception vLLM raised is a crash (C2's "not found" / "not ready" among them).
Plain data: no vLLM object is kept, so an observation is printed or written as JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kvcontract.vocabulary import Impact, LookupResult


@dataclass(frozen=True)
class LookupAnswer:
    """One ``OffloadingManager.lookup`` the connector made."""

    step: int
    request: str
    group: int
    vllm_group: int
    chunk: int
    result: LookupResult


@dataclass(frozen=True)
class MatchAnswer:
    """One ``get_num_new_matched_tokens``: the offloaded hit the connector offered past
    the local (GPU prefix-cache) hit; ``external`` None: deferred (asked again later)."""

    step: int
    request: str
    local_hit: int
    external: int | None
    asynchronous: bool


@dataclass(frozen=True)
class LoadRecord:
    """One ``prepare_load``: the chunks loaded per geometry group."""

    step: int
    request: str
    chunks: dict[int, tuple[int, ...]]

    def ranges(self) -> dict[int, tuple[int, int]]:
        """Per group, ``[lo, hi)`` of the chunks loaded (contiguous in every case seen)."""
        return {g: (min(c), max(c) + 1) for g, c in self.chunks.items() if c}


@dataclass(frozen=True)
class StoreOffer:
    """One ``prepare_store``: the chunks offered per geometry group, those the manager
    took as new, and the chunks it evicted for them (any group)."""

    step: int
    request: str
    offered: dict[int, tuple[int, ...]]
    new: dict[int, tuple[int, ...]]
    evicted: int
    refused: bool = False
    """The manager returned None: no room (every chunk in use)."""


@dataclass(frozen=True)
class LiveException:
    """An exception vLLM raised during a step (the run stops there)."""

    step: int
    where: str
    type: str
    message: str

    @property
    def impact(self) -> Impact:
        return Impact.CRASH


@dataclass
class RequestOutcome:
    """One request's course through the engine."""

    name: str
    arrived: int | None = None
    first_compute_step: int | None = None
    reused_tokens: int | None = None
    """Tokens computed before its first compute step (GPU prefix hit + offloaded hit)."""
    scheduled: list[int] = field(default_factory=list)
    """Tokens scheduled per step it ran."""
    deferred_steps: int = 0
    """Steps it was waiting (admitted or not) after its arrival and before its first
    compute step: a deferred lookup, an asynchronous load in flight, no room."""
    preempted: int = 0
    status: str | None = None
    num_computed: int = 0


@dataclass
class LiveObservation:
    """Everything one trace did on the live engine."""

    geometry: dict[str, Any]
    vllm_version: str
    steps: int = 0
    lookups: list[LookupAnswer] = field(default_factory=list)
    matches: list[MatchAnswer] = field(default_factory=list)
    loads: list[LoadRecord] = field(default_factory=list)
    stores: list[StoreOffer] = field(default_factory=list)
    requests: dict[str, RequestOutcome] = field(default_factory=dict)
    exceptions: list[LiveException] = field(default_factory=list)
    resets: list[tuple[int, str, bool]] = field(default_factory=list)
    """``(step, kind, result)`` of every cache reset."""
    flushed_jobs: int = 0
    stalled_jobs: int = 0
    failed_loads: int = 0
    cpu_chunks: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        return bool(self.exceptions)

    def accepted_hit(self, request: str) -> int | None:
        """The offloaded hit the connector finally offered ``request`` (its last answer
        that was not deferred), None if it never answered."""
        answers = [m.external for m in self.matches if m.request == request]
        final = [a for a in answers if a is not None]
        return final[-1] if final else None

    def stored_chunks(self, group: int, request: str | None = None) -> set[int]:
        """Chunks of ``group`` offered to ``prepare_store`` (by ``request``)."""
        found: set[int] = set()
        for offer in self.stores:
            if request is None or offer.request == request:
                found.update(offer.offered.get(group, ()))
        return found

    def load_ranges(self, request: str) -> dict[int, tuple[int, int]]:
        """Per group, the chunks loaded for ``request`` (all its loads)."""
        chunks: dict[int, set[int]] = {}
        for load in self.loads:
            if load.request == request:
                for g, cs in load.chunks.items():
                    chunks.setdefault(g, set()).update(cs)
        return {g: (min(c), max(c) + 1) for g, c in chunks.items() if c}

    def lookup_states(self, request: str) -> dict[int, dict[int, str]]:
        """Per group and chunk, the last answer the manager gave ``request``."""
        found: dict[int, dict[int, str]] = {}
        for answer in self.lookups:
            if answer.request == request:
                found.setdefault(answer.group, {})[answer.chunk] = answer.result.name
        return found

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["lookups"] = [dict(asdict(a), result=a.result.name) for a in self.lookups]
        data["crashed"] = self.crashed
        return data
