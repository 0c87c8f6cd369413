"""End-to-end property (C12, no lost hits): a producer request runs the implementation's
store path, a consumer then looks up what the producer left in the offload manager.

The *promise* (:func:`promised_hit`) is stated from the spec alone: the hit vLLM's own
GPU prefix-cache rule would give the consumer (restated at the offload's granularity by
:mod:`kvcontract.spec.multigroup`: ``maxhit = N - 1``, each group's load set, the EAGLE
peek chunk, Mamba states at chunk ends) over the chunks the producer owes by contract
(:func:`contract_supply`): every complete chunk of a full-attention or Mamba group, and
for a sliding-window group the chunks a consumer's lookup demands
(:func:`~kvcontract.spec.reachability.demanded_chunk_range`) at the boundaries the store
mask is built for (:func:`reachable_boundaries`), whose replay boundaries are vLLM's GPU
replay rule, EAGLE included
(:func:`~kvcontract.spec.reachability.store_replay_boundaries`). docs/CONTRACT.md
section 9, C12.

The *observation* runs the implementation: the producer through
:func:`~kvcontract.spec.properties.store.simulate_store_case` (the
:class:`~kvcontract.impl.scheduler.StoreTracker` with the replay boundaries the
implementation passes, ``impl.store_replay_boundaries``),
every offered chunk stored and completed (HIT; everything else MISS), then the
consumer through :func:`~kvcontract.impl.scheduler.lookup_complete_chunks` with its keys
limited to the prefix it shares with the producer (``num_keys``). The judge compares the
accepted hit with the promise: less is a lost hit (the tokens lost are reported); a
chunk read at the accepted hit that is not HIT is the load crash (C2's); more with every
chunk HIT means the producer stored more than it owes (waste, C8's).

``replay_rule="p-1"`` owes the producer the replay boundary ``P - 1`` alone (upstream's
store path, without the EAGLE boundaries): not C12's promise, a measurement of what the
EAGLE boundaries add (``benchmarks/lost_hits.py``).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.scheduler import ConvergenceError, StoreTracker, lookup_complete_chunks
from kvcontract.spec import multigroup
from kvcontract.spec.geometry import Geometry, GroupKind, GroupSpec, fa, mamba, swa
from kvcontract.spec.lookup import HIT, MISS, LookupResult, hashed_tokens
from kvcontract.spec.properties.base import (
    CaseProperty,
    CaseSpace,
    Family,
    LastCase,
    Observer,
    Picture,
    Violation,
    is_count,
)
from kvcontract.spec.properties.lookup import LOOKUP_FUNCTIONS, crash_of
from kvcontract.spec.properties.store import (
    STORE_FUNCTIONS,
    StoreCase,
    StoreRun,
    offered_chunks,
    run_store,
    schedule_steps,
)
from kvcontract.spec.reachability import (
    demanded_chunk_range,
    group_mask,
    junction_boundary,
    keeps_final_tail,
    replay_boundary_block,
    storable_chunks,
    store_replay_boundaries,
    stored_token_count,
)
from kvcontract.spec.retention import skipped_tokens
from kvcontract.vocabulary import Impact, RequestStatus

CONSUMER_KINDS = ("resend", "continuation", "sibling", "junction")


# -- the producer's end state, from the spec ----------------------------------------------
@dataclass(frozen=True)
class ProducerEnd:
    """Where a producer stands when it finished or aborted (what its last store job saw)."""

    status: RequestStatus
    computed: int
    """Tokens computed (the KV written) at the end."""
    num_tokens: int
    """Tokens of the request at the end (a finished one holds its final sampled token)."""
    output_tokens: int
    """Tokens it sampled (its final sampled token included): a continuation resends them."""


def producer_end(producer: StoreCase) -> ProducerEnd:
    """The end state of a producer's schedule (prefill steps, decode steps, finish or
    abort): the last step of the store family's walk (``schedule_steps``)."""
    last = schedule_steps(producer)[-1]
    status = RequestStatus(last.status)
    # A finished request sampled one token per decode step and one after its prefill.
    output = last.num_tokens - producer.prompt_len if status is RequestStatus.FINISHED else 0
    return ProducerEnd(status, last.num_computed, last.num_tokens, max(0, output))


def producer_tokens(producer: StoreCase) -> int:
    """The tokens a consumer can share with the producer: its prompt and its output."""
    tokens: int = producer.prompt_len + producer_end(producer).output_tokens
    return tokens


def horizon_chunks(geometry: Geometry, group: GroupSpec, producer: StoreCase) -> int:
    """Complete chunks of ``group`` the producer may store at its end (section 5)."""
    end = producer_end(producer)
    tokens = stored_token_count(end.status, end.computed, 0, end.num_tokens,
                                producer.prompt_len, None, producer.prompt_only)
    if geometry.hash_lookahead:  # stored once hashed (docs/CONTRACT.md 2.1)
        tokens = min(tokens, int(hashed_tokens(max(end.num_tokens, producer.prompt_len),
                                               geometry.tokens_per_hash,
                                               geometry.hash_lookahead)))
    return int(storable_chunks(tokens, geometry.chunk_tokens(group),
                               geometry.drops_eagle_block(group), end.status))


# -- what the producer owes by contract ---------------------------------------------------
def _segment_tokens(geometry: Geometry) -> int | None:
    """The segment of the tails: ``A`` (retention None), the interval, none (0)."""
    segment: int | None = (geometry.alignment_tokens if geometry.retention_interval is None
                           else geometry.retention_interval or None)
    return segment


def mask_is_dense(geometry: Geometry, group: GroupSpec) -> bool:
    """Whether the store mask of an SWA group keeps every block (no alignment to reason
    with, or a segment no longer than the needed history): then every boundary up to the
    horizon is one it is built for."""
    rule, need = group_mask(geometry, group)
    return rule.store_all or (rule.period is not None and need >= rule.period)


def _demand(geometry: Geometry, group: GroupSpec, boundary: int) -> tuple[int, int]:
    assert group.sliding_window is not None
    lo, hi = demanded_chunk_range(boundary, group.sliding_window, group.extra_retained_tokens,
                                  geometry.chunk_tokens(group), geometry.drops_eagle_block(group))
    return int(lo), int(hi)


REPLAY_RULES = ("gpu", "p-1")
"""Which replay boundaries a promise assumes the producer retains: ``gpu`` (the
contract's, C12: vLLM's GPU replay rule, ``P - 1`` plus, with an EAGLE group, one unit
short of the resend's and the extension's aligned boundaries:
:func:`~kvcontract.spec.reachability.store_replay_boundaries`) or ``p-1`` (``P - 1``
alone, what upstream's store path passes: a measurement, not a promise)."""


def replay_boundaries_of(producer: StoreCase, replay_rule: str = "gpu") -> tuple[int, ...]:
    """The replay boundaries (tokens) ``producer`` is owed under ``replay_rule``."""
    if replay_rule not in REPLAY_RULES:
        raise ValueError(f"replay_rule must be one of {REPLAY_RULES}, not {replay_rule!r}")
    if replay_rule == "gpu":
        boundaries: tuple[int, ...] = store_replay_boundaries(producer.geometry,
                                                              producer.prompt_len)
        return boundaries
    if producer.geometry.retention_interval is None or producer.prompt_len < 1:
        return ()
    return (producer.prompt_len - 1,)


def reachable_boundaries(geometry: Geometry, group: GroupSpec, producer: StoreCase,
                         replay_rule: str = "gpu", *,
                         complete_only: bool = True) -> list[tuple[str, int]]:
    """``(kind, boundary)`` of every boundary a sparse store mask of ``group`` is built
    for, whose whole demand lies in the producer's complete chunks (C7's set; with
    ``complete_only=False`` also those whose demand only starts there):

    * ``segment``: the multiples of the segment (``A`` for retention None, the interval
      ``R``), with retention 0 none;
    * ``replay``: the replay boundaries aligned down to ``A``, with a retention interval
      (0 included): ``P - 1`` and, when the geometry has an EAGLE group, vLLM's EAGLE
      replay boundaries (:func:`replay_boundaries_of`; ``replay_rule="p-1"``: ``P - 1``
      alone);
    * ``final``: the horizon of the finished or aborted request, when segments exist
      and the group is not EAGLE (an EAGLE group's peek chunk past it never exists).
    """
    replays = replay_boundaries_of(producer, replay_rule)
    tpc = geometry.chunk_tokens(group)
    horizon = horizon_chunks(geometry, group, producer)
    align = geometry.alignment_tokens
    segment = _segment_tokens(geometry)
    found: list[tuple[str, int]] = []
    if segment:
        found += [("segment", k * segment) for k in range(1, horizon * tpc // segment + 1)]
    if align is not None:
        for boundary in replays:
            aligned = int(replay_boundary_block(boundary, align, 1))
            found.append(("replay", aligned))
    if (segment and not geometry.drops_eagle_block(group) and horizon
            and keeps_final_tail(geometry.retention_interval)):
        found.append(("final", horizon * tpc))
    return [(kind, b) for kind, b in dict.fromkeys(found)
            if b > 0 and (_demand(geometry, group, b)[1] <= horizon
                          or (not complete_only and _demand(geometry, group, b)[0] < horizon))]


def _final_tail_live(geometry: Geometry, group: GroupSpec, producer: StoreCase,
                     boundary: int, chunk: int) -> bool:
    """Whether the producer can still write ``chunk`` for the final horizon ``boundary``.

    The tails of segment and replay boundaries, and the final tail at the prompt
    horizon, are known from the first step and written when their chunks complete,
    while every block they hold is live. A final horizon that differs from the prompt
    horizon (an abort) is known only at the end: its blocks in the final partial segment
    must still be live then (``skipped(computed) // bs``; blocks below that are freed,
    C10). Blocks below the segment start belong to the previous segment's tail.
    """
    end = producer_end(producer)
    tpc, bs = geometry.chunk_tokens(group), geometry.block_tokens(group)
    bpc = geometry.blocks_per_chunk
    if boundary // tpc == producer.prompt_len // tpc:
        return True
    assert group.sliding_window is not None
    segment = _segment_tokens(geometry) or boundary
    segment_start = boundary - boundary % segment
    demand_from = int(skipped_tokens(boundary, group.sliding_window,
                                     group.extra_retained_tokens)) // bs
    first = max(chunk * bpc, demand_from, segment_start // bs)
    live_from = int(skipped_tokens(end.computed, group.sliding_window,
                                   group.extra_retained_tokens)) // bs
    live: bool = first >= live_from
    return live


@functools.lru_cache(maxsize=512)
def contract_supply(producer: StoreCase,
                    replay_rule: str = "gpu") -> tuple[frozenset[int], ...]:
    """Per group, the chunks the producer owes the offload manager by contract.

    Full-attention and Mamba groups, and SWA groups whose mask is dense: every complete
    chunk below the horizon. Other SWA groups: the union of the demand of every
    reachable boundary (:func:`reachable_boundaries`), a final tail only where its
    blocks are still live (:func:`_final_tail_live`). A boundary past the producer's end
    (an abort, an EAGLE peek chunk past the prompt) still owes its demanded chunks below
    the horizon: the store path writes them as they complete (C9 requires it), and a
    consumer may be served at an earlier boundary from them. They are live at the end
    (a boundary past the computed tokens skips no more than those do). Never read from
    an implementation, and not from the block mask either: the demand side of C7.
    """
    if producer.start_hit:
        raise ValueError("an end-to-end producer starts from an empty cache (start_hit 0)")
    geometry = producer.geometry
    supply = []
    for group in geometry.groups:
        horizon = horizon_chunks(geometry, group, producer)
        if not group.is_swa or mask_is_dense(geometry, group):
            supply.append(frozenset(range(horizon)))
            continue
        owed: set[int] = set()
        finals = []
        for kind, boundary in reachable_boundaries(geometry, group, producer, replay_rule,
                                                   complete_only=False):
            if kind == "final":
                finals.append(boundary)
                continue
            lo, hi = _demand(geometry, group, boundary)
            owed.update(range(lo, min(hi, horizon)))
        for boundary in finals:
            owed.update(c for c in range(*_demand(geometry, group, boundary))
                        if c in owed or _final_tail_live(geometry, group, producer, boundary, c))
        supply.append(frozenset(owed))
    return tuple(supply)


def consumer_keys(geometry: Geometry, num_tokens: int, shared_tokens: int) -> dict[int, int]:
    """Offload keys per group a consumer has in common with the producer: the complete
    chunks of the shared prefix (a chunk with one token past it hashes differently; with
    lookahead block hashes, a chunk whose lookahead tokens are not all shared)."""
    shared = int(hashed_tokens(min(shared_tokens, num_tokens), geometry.tokens_per_hash,
                               geometry.hash_lookahead))
    return {g: shared // geometry.chunk_tokens(group)
            for g, group in enumerate(geometry.groups)}


def _candidates(geometry: Geometry, max_hit: int) -> list[int]:
    """``maxhit`` and every chunk end below it, largest first: within one chunk of every
    group acceptance is upward closed (docs/CONTRACT.md 4.4), so the largest accepted
    boundary is one of these."""
    ends = {max_hit}
    for group in geometry.groups:
        tpc = geometry.chunk_tokens(group)
        ends.update(range(tpc, max_hit, tpc))
    return sorted((b for b in ends if b > 0), reverse=True)


def gpu_hit_unit(geometry: Geometry) -> int:
    """The granularity of a GPU prefix-cache hit: the scheduler block, the LCM of the
    groups' block sizes (vLLM's hybrid coordinator serves hits every group holds in whole
    blocks; ``scheduler_block_size``, docs/CONTRACT.md 11)."""
    return math.lcm(*(geometry.block_tokens(group) for group in geometry.groups))


def promised_hit(geometry: Geometry, producer: StoreCase, num_tokens: int,
                 shared_tokens: int | None = None, replay_rule: str = "gpu",
                 unit: int = 1, *, extra: Sequence[frozenset[int]] | None = None,
                 full_attention_only: bool = False) -> int:
    """The hit a consumer of ``num_tokens`` tokens, sharing its first ``shared_tokens``
    with ``producer`` (all of them by default), must be given once the producer's stores
    completed: the largest boundary every group serves (:mod:`kvcontract.spec.multigroup`:
    the last token recomputed for logits, each group's load set, an EAGLE group's peek
    chunk, a Mamba state at a chunk end) from :func:`contract_supply`, limited to the
    shared keys; 0 when there is none. Spec only: no implementation is called.

    The replay boundaries are vLLM's GPU replay rule, EAGLE included (C12's promise);
    ``replay_rule="p-1"`` owes ``P - 1`` alone (:data:`REPLAY_RULES`), to measure what
    the EAGLE boundaries add (``benchmarks/lost_hits.py``). ``unit``: only boundaries
    that are multiples of it (``gpu_hit_unit``: what the GPU prefix cache itself would
    serve, in whole scheduler blocks; the offload may also accept an unaligned boundary).
    ``extra``: per group, chunks owed besides the producer's (a junction's,
    :func:`junction_supply`); ``full_attention_only``: the boundary the full-attention
    groups alone serve (where a junction is registered, :func:`spec_junction`).
    """
    if producer.geometry != geometry:
        raise ValueError("the producer ran on another geometry")
    supply = contract_supply(producer, replay_rule)
    if extra is not None:
        supply = tuple(owed | more for owed, more in zip(supply, extra, strict=True))
    keys = consumer_keys(geometry, num_tokens, num_tokens if shared_tokens is None
                         else shared_tokens)
    present: list[list[int]] = []  # prefix counts of the chunks a lookup finds HIT
    for g, group in enumerate(geometry.groups):
        counts = [0]
        for k in range(multigroup.complete_chunks(geometry, group, num_tokens)):
            counts.append(counts[-1] + (1 if k < keys[g] and k in supply[g] else 0))
        present.append(counts)
    for hit in _candidates(geometry, multigroup.initial_max_hit(geometry, num_tokens)):
        if hit % unit:
            continue
        for g, group in enumerate(geometry.groups):
            if full_attention_only and group.kind is not GroupKind.FULL:
                continue
            required = multigroup.group_read_requirement(geometry, group, hit, 0, num_tokens)
            if required is None:
                break
            lo, hi = required
            if present[g][hi] - present[g][lo] != hi - lo:
                break
        else:
            return hit
    return 0


# -- shared-prefix junctions (docs/CONTRACT.md 9.3) ---------------------------------------
def junction_geometry(geometry: Geometry) -> bool:
    """Whether junction consumers are enumerated on ``geometry``: a full-attention and a
    sliding-window group, a retention interval (0 included: vLLM registers no junction
    without one), no EAGLE drop and no lookahead hashes (vLLM's GPU side also keeps the
    block below an EAGLE junction, which the offload's store path does not: narrowed)."""
    kinds = {group.kind for group in geometry.groups}
    return (geometry.retention_interval is not None and not geometry.hash_lookahead
            and {GroupKind.FULL, GroupKind.SLIDING_WINDOW} <= kinds
            and not any(geometry.drops_eagle_block(group) for group in geometry.groups))


def _consumer_step(geometry: Geometry) -> int:
    step: int = geometry.alignment_tokens or max(geometry.chunk_tokens(g)
                                                 for g in geometry.groups)
    return step


def first_consumer(case: EndToEndCase) -> Consumer:
    """The request between the producer and a ``junction`` consumer: it shares the same
    prefix with the producer and runs one alignment unit (and the usual divergence)
    past it, so its own replay boundary lies past the prefix the junction consumer
    shares; its hit is cut at the junction, and it stores for it."""
    shared = case.consumer.shared_tokens
    return Consumer("sibling", shared + _consumer_step(case.geometry) + SIBLING_DIVERGENCE,
                    shared)


def spec_junction(geometry: Geometry, producer: StoreCase, first: Consumer) -> int:
    """The junction the first consumer ``first`` registers, by the spec (0: none): the
    boundary the producer's owed full-attention chunks serve it, when its promised hit
    lies below that (a sparse group cut it) and a retention interval is configured
    (vLLM 0.34.0's offloading connector; 0.33.0 registers none)."""
    if geometry.retention_interval is None:
        return 0
    boundary = promised_hit(geometry, producer, first.num_tokens, first.shared_tokens,
                            full_attention_only=True)
    hit = promised_hit(geometry, producer, first.num_tokens, first.shared_tokens)
    return int(junction_boundary(boundary, 0, hit, geometry.retention_interval))


def junction_supply(geometry: Geometry, junction: int) -> tuple[frozenset[int], ...]:
    """Per group, what the first consumer owes for its junction: a sparse SWA group's
    demand at the junction aligned down to ``A`` (the chunks a later consumer reads
    there); nothing for the other groups (their chunks below the junction are the
    producer's, owed already)."""
    align = geometry.alignment_tokens
    supply: list[frozenset[int]] = []
    for group in geometry.groups:
        if not junction or align is None or not group.is_swa \
                or mask_is_dense(geometry, group):
            supply.append(frozenset())
            continue
        boundary = junction // align * align
        supply.append(frozenset(range(*_demand(geometry, group, boundary)))
                      if boundary else frozenset())
    return tuple(supply)


def junction_promise(case: EndToEndCase, unit: int = 1) -> int:
    """The hit a ``junction`` consumer is owed (C12): the promise over the producer's
    owed chunks and the first consumer's junction supply."""
    geometry, producer, consumer = case.geometry, case.producer, case.consumer
    junction = spec_junction(geometry, producer, first_consumer(case))
    return promised_hit(geometry, producer, consumer.num_tokens, consumer.shared_tokens,
                        unit=unit, extra=junction_supply(geometry, junction))


# -- the case space -----------------------------------------------------------------------
@dataclass(frozen=True)
class Consumer:
    """A later request: ``num_tokens`` tokens, the first ``shared_tokens`` of them the
    producer's (a resend, a continuation of its conversation, a sibling)."""

    kind: str
    num_tokens: int
    shared_tokens: int

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_tokens": self.num_tokens,
                "shared_tokens": self.shared_tokens}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Consumer:
        kind = data["kind"]
        if kind not in CONSUMER_KINDS:
            raise ValueError(f"consumer kind must be one of {CONSUMER_KINDS}, not {kind!r}")
        values = (data["num_tokens"], data["shared_tokens"])
        for value in values:
            if not is_count(value, 1):
                raise ValueError(f"consumer token counts must be integers >= 1, not {value!r}")
        if values[1] > values[0]:
            raise ValueError(f"the shared prefix {values[1]} exceeds the consumer's "
                             f"{values[0]} tokens")
        return cls(str(kind), int(values[0]), int(values[1]))


@dataclass(frozen=True)
class EndToEndCase:
    producer: StoreCase
    consumer: Consumer

    @property
    def geometry(self) -> Geometry:
        return self.producer.geometry

    @property
    def geometry_name(self) -> str:
        name: str = self.producer.geometry_name
        return name

    def to_json(self) -> dict[str, Any]:
        return {"producer": self.producer.to_json(), "consumer": self.consumer.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EndToEndCase:
        producer = StoreCase.from_json(dict(data["producer"]))
        consumer = Consumer.from_json(dict(data["consumer"]))
        if producer.start_hit:
            raise ValueError("an end-to-end producer starts from an empty cache (start_hit 0)")
        if consumer.shared_tokens > producer_tokens(producer):
            raise ValueError(f"the consumer shares {consumer.shared_tokens} tokens, the "
                             f"producer has {producer_tokens(producer)}")
        return cls(producer, consumer)


def end_to_end_catalog() -> list[tuple[str, Geometry, tuple[int, ...]]]:
    """``(name, geometry, prompt lengths)``: vLLM's default retention 0, retention None,
    an interval, EAGLE groups (SWA and FA), MTP ``e``, bpc 1 and 2, a Mamba group, a
    dense mask. Every geometry is one vLLM can build (``spec.build.buildable``)."""
    return [
        ("FA16+SWA4(sw8),retention0",
         Geometry((fa(16), swa(4, 8)), retention_interval=0), (31, 33, 48, 53)),
        ("FA16+SWA4(sw8)", Geometry((fa(16), swa(4, 8))), (33, 48, 53)),
        ("FA16+SWA4(sw8),retention32",
         Geometry((fa(16), swa(4, 8)), retention_interval=32), (48, 65, 75)),
        # EAGLE at retention 0 with P = 33 (not a multiple of A): the resend is served at
        # the GPU's EAGLE replay boundary 16, which P - 1 alone leaves unstored
        # (docs/CONTRACT.md 12); 48 and 64 are multiples of A.
        ("FA16+SWA4(sw8,eagle),retention0",
         Geometry((fa(16), swa(4, 8, eagle=True)), retention_interval=0), (33, 48, 64)),
        ("FA16+SWA4(sw8,eagle)", Geometry((fa(16), swa(4, 8, eagle=True))), (33, 48)),
        ("FA16(eagle)+SWA4(sw8),retention0",
         Geometry((fa(16, eagle=True), swa(4, 8)), retention_interval=0), (33, 48, 64)),
        ("FA16+SWA4(sw8,e3),retention0",
         Geometry((fa(16), swa(4, 8, 3)), retention_interval=0), (37, 48)),
        ("FA4+SWA4(sw6),bpc2,retention0",
         Geometry((fa(4), swa(4, 6)), blocks_per_chunk=2, retention_interval=0), (29, 40)),
        ("FA4+SWA4(sw6),bpc2", Geometry((fa(4), swa(4, 6)), blocks_per_chunk=2), (29, 40)),
        ("FA8+SWA8(sw12)+Mamba8,retention0",
         Geometry((fa(8), swa(8, 12), mamba(8)), retention_interval=0), (33, 41)),
        ("FA16+SWA4(sw16),dense", Geometry((fa(16), swa(4, 16))), (37,)),
        # Upstream's departures (docs/CONTRACT.md 12): sw = 1 (mod tpc) with e = 0 (the
        # window formula), and an EAGLE replay boundary inside an SWA chunk (the peek chunk).
        ("FA16+SWA4(sw9),retention0",
         Geometry((fa(16), swa(4, 9)), retention_interval=0), (33, 48)),
        ("FA16+SWA4(sw9)", Geometry((fa(16), swa(4, 9))), (48, 53)),
        ("FA4+SWA8(sw8,eagle),bpc2,retention0",
         Geometry((fa(4), swa(8, 8, eagle=True)), blocks_per_chunk=2, retention_interval=0),
         (29, 40)),
        ("SWA4(sw8)+SWA8(sw12),retention0",
         Geometry((swa(4, 8), swa(8, 12)), retention_interval=0), (33, 48)),
        # Lookahead block hashes (docs/CONTRACT.md 2.1, vLLM 0.34.0's default with an
        # EAGLE drafter): the EAGLE group is stored and read with no peek chunk.
        ("FA16+SWA4(sw8,eagle),retention0,lookahead",
         Geometry((fa(16), swa(4, 8, eagle=True)), retention_interval=0, hash_lookahead=1),
         (33, 48)),
        ("FA16(eagle)+SWA4(sw8),retention0,lookahead",
         Geometry((fa(16, eagle=True), swa(4, 8)), retention_interval=0, hash_lookahead=1),
         (33,)),
    ]


def _schedules(prompt: int) -> list[tuple[int, ...]]:
    """One shot, and steps of 7 and 16 tokens (distinct ones only)."""
    found: dict[tuple[int, ...], None] = {(prompt,): None}
    for step in (7, 16):
        steps = (step,) * (prompt // step) + ((prompt % step,) if prompt % step else ())
        found.setdefault(steps, None)
    return list(found)


def producers(name: str, geometry: Geometry, prompts: Sequence[int]) -> Iterator[StoreCase]:
    """Every schedule finished after 3 decode steps, and aborted after each step but the
    last (``offload_prompt_only``, vLLM's default)."""
    for prompt in prompts:
        for steps in _schedules(prompt):
            yield StoreCase(name, geometry, prompt, steps, "finished", decode=3)
            for cut in range(1, len(steps)):
                yield StoreCase(name, geometry, prompt, steps[:cut], "aborted")


SIBLING_DIVERGENCE = 3
"""New tokens of a continuation or a sibling past the prefix it shares."""


def consumers(producer: StoreCase) -> list[Consumer]:
    """A resend of the prompt, a continuation (prompt, output and new tokens) and
    siblings sharing a prefix ``k`` of the prompt: one token either side of every
    multiple of the alignment ``A`` (and the multiples), and ``P - 1``."""
    prompt = producer.prompt_len
    found = [Consumer("resend", prompt, prompt)]
    shared = producer_tokens(producer)
    found.append(Consumer("continuation", shared + SIBLING_DIVERGENCE, shared))
    step = producer.geometry.alignment_tokens or max(
        producer.geometry.chunk_tokens(g) for g in producer.geometry.groups)
    prefixes = {m * step + d for m in range(1, prompt // step + 1) for d in (-1, 0, 1)}
    prefixes.add(prompt - 1)
    found += [Consumer("sibling", k + SIBLING_DIVERGENCE, k)
              for k in sorted(prefixes) if 0 < k < prompt]
    if producer.ending == "finished" and junction_geometry(producer.geometry):
        found += [Consumer("junction", k + SIBLING_DIVERGENCE, k)
                  for k in junction_prefixes(producer)]
    return found


def junction_prefixes(producer: StoreCase) -> list[int]:
    """The prefixes ``k = mA + 1`` of a finished producer at which a first consumer
    (:func:`first_consumer`) registers a junction by the spec: its hit is cut below the
    full-attention boundary (docs/CONTRACT.md 9.3); and ``k = mA + t`` (``t`` the
    smallest sparse chunk, when it is less than ``A``), where the sparse groups' keys
    reach a chunk past the full-attention boundary, so a junction taken from their keys
    rather than from what the full-attention groups serve shows."""
    geometry = producer.geometry
    step = _consumer_step(geometry)
    sparse = min((geometry.chunk_tokens(g) for g in geometry.groups
                  if g.kind is not GroupKind.FULL),
                 default=step)
    offsets = sorted({1, sparse} if 1 < sparse < step else {1})
    found = []
    for base in range(step, producer.prompt_len, step):
        for k in (base + d for d in offsets if base + d < producer.prompt_len):
            first = Consumer("sibling", k + step + SIBLING_DIVERGENCE, k)
            if spec_junction(geometry, producer, first):
                found.append(k)
    return found


def end_to_end_cases() -> Iterator[EndToEndCase]:
    for name, geometry, prompts in end_to_end_catalog():
        for producer in producers(name, geometry, prompts):
            for consumer in consumers(producer):
                yield EndToEndCase(producer, consumer)


def end_to_end_domain() -> str:
    names = ", ".join(name for name, *_ in end_to_end_catalog())
    return (
        "end to end, a producer's whole store path and then a consumer's whole lookup (no "
        "unbounded encoding composes the two yet; each side is proved for all values by "
        "C2-C10); "
        "producers: one-shot and 7/16-token chunked prefill, finish after 3 decode steps or "
        "abort after any step, offload_prompt_only, replay boundaries P - 1 and vLLM's GPU "
        "EAGLE replay boundaries (the implementation's own for the producer); consumers: a "
        "resend, a continuation, siblings sharing k = mA - 1, mA, mA + 1 and P - 1 tokens, "
        "and (finished producers, retention 0 or R, non-EAGLE FA + SWA) junction "
        "consumers sharing k = mA + 1 and mA + t (t the smallest sparse chunk) with the "
        "producer and with a first consumer of "
        "k + A + 3 tokens whose hit was cut at a shared-prefix junction, which stored "
        "for it; "
        f"on {names}"
    )


# -- observation --------------------------------------------------------------------------
@dataclass
class EndToEndObservation:
    """What the consumer's lookup did over what the producer offered."""

    hit_tokens: int | None
    offered: list[set[int]]
    """Per group, the chunks the producer offered (all stored: HIT)."""
    keys: dict[int, int]
    load_ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    error: str | None = None
    junction: int | None = None
    """The junction the first consumer registered (``junction`` consumers; None else)."""


def manager_state(observation: EndToEndObservation, g: int, k: int) -> LookupResult:
    """What the offload manager answers the consumer for chunk ``k`` of group ``g``."""
    return HIT if k < observation.keys.get(g, 0) and k in observation.offered[g] else MISS


def _observe(case: EndToEndCase, impl: Implementation) -> EndToEndObservation:
    run = run_store(case.producer, impl)
    if case.consumer.kind == "junction":
        return observe_junction(case, impl, run)
    return observe_consumer(case, impl, run)


def observe_junction(case: EndToEndCase, impl: Implementation,
                     run: StoreRun) -> EndToEndObservation:
    """A ``junction`` consumer: the first consumer (:func:`first_consumer`) looks up
    what the producer offered (``impl``'s lookup), registers the junction ``impl``
    decides (``impl.shared_prefix_junction``), recomputes from its hit in one step and
    finishes, its store path (``impl``'s, the junction passed to its mask besides its
    replay boundaries) storing what it offers; then the junction consumer looks up the
    producer's and the first consumer's stores (only the chunks of the shared prefix
    hash alike)."""
    geometry = case.geometry
    offered = [offered_chunks(tracker) for tracker in run.trackers]
    first = first_consumer(case)
    keys = consumer_keys(geometry, first.num_tokens, first.shared_tokens)
    seen = EndToEndObservation(None, offered, keys)
    try:
        outcome = lookup_complete_chunks(
            impl, geometry, first.num_tokens, 0,
            lambda g, k: manager_state(seen, g, k), num_keys=keys)
    except ConvergenceError as exc:
        seen.error = f"the first consumer's lookup: {exc}"
        return seen
    hit = outcome.hit_tokens or 0
    junction = 0
    if outcome.hit_tokens is not None:
        junction = int(impl.shared_prefix_junction(
            outcome.full_attention_boundary or 0, 0, hit, geometry.retention_interval))
    steps = schedule_steps(StoreCase(case.producer.geometry_name, geometry,
                                     first.num_tokens, (first.num_tokens - hit,),
                                     "finished", start_hit=hit))
    stored = []
    for g, group in enumerate(geometry.groups):
        tracker = StoreTracker(impl, geometry, g, first.num_tokens, junction=junction)
        tracker.mark_computed(hit // geometry.chunk_tokens(group))
        for step in steps:
            tracker.step(step.status, step.num_computed, step.num_scheduled, step.num_tokens)
        stored.append({c for c in offered_chunks(tracker) if c < keys[g]})
    observation = lookup_over(case, impl,
                              [o | more for o, more in zip(offered, stored, strict=True)])
    observation.junction = junction
    return observation


def observe_consumer(case: EndToEndCase, impl: Implementation,
                     run: StoreRun) -> EndToEndObservation:
    """The consumer's lookup (``impl``'s) over what the producer's store path offered in
    ``run``: the second half of :data:`run_end_to_end`."""
    return lookup_over(case, impl, [offered_chunks(tracker) for tracker in run.trackers])


def lookup_over(case: EndToEndCase, impl: Implementation,
                offered: list[set[int]]) -> EndToEndObservation:
    """The consumer's lookup (``impl``'s) over ``offered`` (per group, every chunk
    stored and complete), its keys limited to the prefix it shares."""
    keys = consumer_keys(case.geometry, case.consumer.num_tokens, case.consumer.shared_tokens)
    observation = EndToEndObservation(None, offered, keys)
    try:
        outcome = lookup_complete_chunks(
            impl, case.geometry, case.consumer.num_tokens, 0,
            lambda g, k: manager_state(observation, g, k), num_keys=keys,
        )
    except ConvergenceError as exc:
        observation.error = str(exc)
        return observation
    observation.hit_tokens = outcome.hit_tokens
    observation.load_ranges = dict(outcome.load_ranges)
    return observation


run_end_to_end: LastCase[EndToEndCase, EndToEndObservation] = LastCase(_observe)


def _promise(case: EndToEndCase, _impl: Any = None) -> int:
    if case.consumer.kind == "junction":
        return junction_promise(case)
    return promised_hit(case.geometry, case.producer, case.consumer.num_tokens,
                        case.consumer.shared_tokens)


promise: LastCase[EndToEndCase, int] = LastCase(_promise)


def _gpu_promise(case: EndToEndCase, _impl: Any = None) -> int:
    if case.consumer.kind == "junction":
        return junction_promise(case, unit=gpu_hit_unit(case.geometry))
    return promised_hit(case.geometry, case.producer, case.consumer.num_tokens,
                        case.consumer.shared_tokens, unit=gpu_hit_unit(case.geometry))


gpu_promise: LastCase[EndToEndCase, int] = LastCase(_gpu_promise)
"""What vLLM's GPU prefix cache itself would serve: the promise in whole scheduler
blocks. A hit below it is a lost hit; between it and the (unaligned) promise the
offload gives at least what the GPU would, and C12 does not report it."""


# -- resends of realistic prompts (benchmarks/lost_hits.py, the audit's defect costs) -----
def prompt_lengths(first: int, last: int, count: int) -> list[int]:
    """``count`` lengths spread over ``[first, last]`` by an odd step, so that their
    residues modulo every chunk and alignment vary (fewer when the step overshoots)."""
    step = max(1, (last - first) // max(1, count - 1))
    step += 1 - step % 2
    return [first + i * step for i in range(count) if first + i * step <= last]


def resend_case(name: str, geometry: Geometry, prompt: int,
                steps: tuple[int, ...] | None = None) -> EndToEndCase:
    """A producer that prefills ``prompt`` tokens (in one shot, or by ``steps``), decodes
    3 tokens and finishes, then a consumer that resends the prompt."""
    producer = StoreCase(name, geometry, prompt, steps or (prompt,), "finished", decode=3)
    return EndToEndCase(producer, Consumer("resend", prompt, prompt))


@dataclass(frozen=True)
class ResendPoint:
    """What an implementation's resend of one prompt gives (:func:`resend_point`)."""

    prompt: int
    hit: int | None
    """The accepted hit in tokens; None: deferred, or the lookup failed (``error``)."""
    error: str | None = None
    """Why the lookup did not converge (a crash)."""
    unread: tuple[int, int, str] | None = None
    """``(group, chunk, state)`` of the first chunk read for the accepted hit that is not
    HIT: the load would crash."""


def resend_point(case: EndToEndCase, impl: Implementation,
                 run: StoreRun | None = None) -> ResendPoint:
    """Run ``case`` (a :func:`resend_case`) on ``impl``: its store path, then its lookup
    (:data:`run_end_to_end`); with ``run``, the lookup over that run of the producer
    (a store path known to be the same). An exception of the implementation propagates."""
    observation = (run_end_to_end(case, impl) if run is None
                   else observe_consumer(case, impl, run))
    hit = observation.hit_tokens
    unread = _unread(case, observation, hit) if hit else None
    return ResendPoint(case.consumer.num_tokens, hit, observation.error,
                       None if unread is None else (unread[0], unread[1], unread[2].name))


def resend_promises(case: EndToEndCase) -> tuple[int, int]:
    """The promise of ``case`` in whole scheduler blocks (:func:`gpu_hit_unit`: what vLLM's
    GPU prefix cache would serve, below which a hit is lost): under vLLM's GPU replay
    rule (C12's), and under ``P - 1`` alone (``replay_rule="p-1"``). Spec only."""
    geometry, producer, consumer = case.geometry, case.producer, case.consumer
    unit = gpu_hit_unit(geometry)
    promised = promised_hit(geometry, producer, consumer.num_tokens, consumer.shared_tokens,
                            unit=unit)
    p1 = promised_hit(geometry, producer, consumer.num_tokens, consumer.shared_tokens,
                      replay_rule="p-1", unit=unit)
    return promised, p1


END_TO_END_SPACE: CaseSpace[EndToEndCase, EndToEndObservation] = CaseSpace(
    family=Family.END_TO_END, cases=end_to_end_cases, describe=end_to_end_domain,
    to_json=EndToEndCase.to_json, from_json=EndToEndCase.from_json, observe=run_end_to_end,
    geometry_of=lambda case: case.producer.geometry,
    driver=("kvcontract's StoreTracker, then its multi-group lookup, over the bound "
            "functions"),
    drivers=("lookup_complete_chunks", "StoreTracker.*"),
)


# -- the judge ----------------------------------------------------------------------------
def _describe(case: EndToEndCase) -> str:
    producer, consumer = case.producer, case.consumer
    ran = f"prefill {list(producer.steps)}, " + (
        f"finished after {producer.decode} decode steps" if producer.ending == "finished"
        else "aborted")
    return (f"{case.geometry.describe()}; producer P={producer.prompt_len} ({ran}); "
            f"{consumer.kind} consumer of {consumer.num_tokens} tokens sharing "
            f"{consumer.shared_tokens}")


def _unread(case: EndToEndCase, observation: EndToEndObservation,
            hit: int) -> tuple[int, int, LookupResult] | None:
    """The first chunk read for ``hit`` (load set and EAGLE peek) that is not HIT."""
    for g, group in enumerate(case.geometry.groups):
        lo, hi = multigroup.read_range(case.geometry, group, hit, 0)
        for k in range(lo, hi):
            state = manager_state(observation, g, k)
            if state != HIT:
                return g, k, state
    return None


def no_lost_hit(case: EndToEndCase, observation: EndToEndObservation) -> str | None:
    """C12: the consumer's accepted hit equals the promised hit, and every chunk it reads
    for it is HIT. Less is a lost hit (the tokens lost are reported); a chunk read that
    is not HIT is the load crash of C2; more with every chunk HIT means the producer
    stored more than the contract owes (C8's waste, reported too)."""
    if observation.error is not None:
        found: str = Violation(f"{_describe(case)}: the lookup did not converge: "
                               f"{observation.error}", Impact.CRASH)
        return found
    promised = promise(case)
    hit = observation.hit_tokens
    if hit is None:
        found = Violation(f"{_describe(case)}: the lookup deferred, although every chunk is "
                          f"stored or absent (promised hit {promised})", Impact.DELAY)
        return found
    unread = _unread(case, observation, hit) if hit > 0 else None
    if unread is not None:
        g, k, state = unread
        found = Violation(
            f"{_describe(case)}: accepted hit {hit} (promised {promised}) reads group {g} "
            f"chunk {k}, which is {state.name}: upstream would crash with "
            f"'{crash_of(state)}'", Impact.CRASH)
        return found
    if hit < promised:
        # Lost only against what vLLM's GPU prefix cache would have served (whole
        # scheduler blocks): the unaligned rest is the offload's bonus, not a promise
        # upstream ever made (no false alarm on a release that serves aligned hits).
        floor = gpu_promise(case)
        if hit < floor:
            found = Violation(
                f"{_describe(case)}: accepted hit {hit}, promised {floor}: "
                f"{floor - hit} tokens lost", Impact.LOST_HIT)
            return found
        return None
    if hit > promised:
        found = Violation(
            f"{_describe(case)}: accepted hit {hit} exceeds the promised {promised} with "
            "every chunk HIT: the producer stored more than the contract owes",
            Impact.WASTE)
        return found
    return None


def is_junction_consumer(case: EndToEndCase) -> bool:
    """A ``junction`` consumer's case (the cases a junction property judges)."""
    return case.consumer.kind == "junction"


def junction_registered(case: EndToEndCase, observation: EndToEndObservation) -> str | None:
    """C12: the junction a first consumer registers is the spec's: the boundary its
    full-attention groups serve (the producer's owed full-attention chunks, its keys),
    when a sparse group cut its hit below it. A larger one holds and stores sparse
    history for a boundary no full-attention chunk serves (waste); a smaller one or none
    leaves the later consumer's window at the junction unstored (its hit is lost)."""
    if observation.error is not None or observation.junction is None:
        return None  # no_lost_hit reports a lookup that did not converge
    want = spec_junction(case.geometry, case.producer, first_consumer(case))
    got = observation.junction
    if got == want:
        return None
    found: str = Violation(
        f"{_describe(case)}: the first consumer registered the junction {got}; the "
        f"boundary its full-attention groups serve, past its cut hit, is {want}",
        Impact.WASTE if got > want else Impact.LOST_HIT)
    return found


def picture(case: EndToEndCase, impl: Implementation) -> Picture:
    """The manager's contents as the consumer sees them and the spec's ranges at the
    promised boundary (at the accepted one when it is larger); offending: the chunks
    read there that are not HIT, and the chunks the implementation's own window demands
    for the promised boundary beyond the spec's read range (a lost hit)."""
    observation = run_end_to_end(case, impl)
    promised = promise(case)
    hit = observation.hit_tokens
    geometry = case.geometry
    shown = hit if hit is not None and hit > promised else promised
    states = {g: [manager_state(observation, g, k)
                  for k in range(multigroup.complete_chunks(geometry, group,
                                                            case.consumer.num_tokens))]
              for g, group in enumerate(geometry.groups)}
    offending: dict[int, set[int]] = {}
    for g, group in enumerate(geometry.groups):
        if not shown:
            break
        lo, hi = multigroup.read_range(geometry, group, shown, 0)
        bad = {k for k in range(lo, hi) if manager_state(observation, g, k) != HIT}
        if not bad and group.is_swa and (hit or 0) < promised:
            assert group.sliding_window is not None
            tpc = geometry.chunk_tokens(group)
            demanded = int(impl.load_window_size_in_chunks(
                promised, group.sliding_window, group.extra_retained_tokens, tpc))
            end = -(-promised // tpc)
            bad = {k for k in range(max(0, end - demanded), lo)
                   if manager_state(observation, g, k) != HIT}
        if bad:
            offending[g] = bad
    notes = [_describe(case), f"promised hit {promised}, accepted {hit}"]
    return Picture(geometry, case.consumer.num_tokens, shown, 0,
                   states=states, offending=offending, notes=notes)


END_TO_END_FUNCTIONS: tuple[str, ...] = tuple(dict.fromkeys(
    itertools.chain(STORE_FUNCTIONS, LOOKUP_FUNCTIONS, ("shared_prefix_junction",))))
"""The producer's store path, then the consumer's multi-group lookup."""


def end_to_end_properties() -> list[CaseProperty]:
    return [
        CaseProperty(
            "C12", "no-lost-hits",
            "a consumer of a finished or aborted producer gets the promised hit",
            END_TO_END_SPACE, no_lost_hit, END_TO_END_FUNCTIONS, picture,
            impact=Impact.LOST_HIT,
            # upstream's store path as the producer, upstream's loop as the consumer
            observable_on=frozenset({Observer.UPSTREAM_STORE_PATH, Observer.UPSTREAM_LOOP}),
        ),
        CaseProperty(
            "C12", "junction-registered-exact",
            "a first consumer whose hit a sparse group cut registers the junction the "
            "full-attention groups serve",
            END_TO_END_SPACE, junction_registered, END_TO_END_FUNCTIONS, picture,
            impact=Impact.LOST_HIT,
            domain_note="the junction consumers' first consumers",
            relevant=is_junction_consumer,
            # vLLM's own lookup registers it (the request's shared_prefix_boundary)
            observable_on=frozenset({Observer.UPSTREAM_STORE_PATH, Observer.UPSTREAM_LOOP}),
        ),
    ]
