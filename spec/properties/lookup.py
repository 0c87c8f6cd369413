"""Multi-group lookup properties (C2-C6): the implementation's whole lookup on every
MISS/HIT/HIT_PENDING assignment of every chunk of a catalogue of small geometries,
judged against the contract's answer (:func:`kvcontract.spec.multigroup.contract_answer`).

The space observes the reference scheduler's loop
(:func:`kvcontract.impl.scheduler.lookup_complete_chunks`) driving the implementation's
primitives; the audit observes upstream's own loop instead and judges it with the same
properties (an observation that does not report a field, such as upstream's pops, is
judged on what it reports).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.scheduler import ConvergenceError, lookup_complete_chunks
from kvcontract.spec import multigroup
from kvcontract.spec.arith import cdiv
from kvcontract.spec.geometry import Geometry, GroupKind, fa, mamba, swa
from kvcontract.spec.lookup import HIT, HIT_PENDING, LookupResult
from kvcontract.spec.properties.base import (
    CaseProperty,
    CaseSpace,
    Family,
    LastCase,
    Observer,
    Picture,
    Violation,
    count_field,
    fields_set,
    optional_count_field,
)
from kvcontract.vocabulary import Impact


@dataclass(frozen=True)
class LookupCase:
    geometry_name: str
    geometry: Geometry
    num_tokens: int
    local_hit: int
    states: tuple[tuple[LookupResult, ...], ...]
    max_hit_tokens: int | None = None
    """The scheduler's budget for the hit, in tokens from the request's start (vLLM caps
    the candidate at the local hit plus ``max_num_new_tokens`` and plus the request's
    ``max_load_tokens``); None: unlimited. The contract's answer is the largest boundary
    within it."""

    def to_json(self) -> dict[str, Any]:
        return {
            "geometry_name": self.geometry_name,
            "geometry": self.geometry.to_dict(),
            "num_tokens": self.num_tokens,
            "local_hit": self.local_hit,
            "states": {str(g): [s.name for s in seq] for g, seq in enumerate(self.states)},
            **fields_set(self, "max_hit_tokens"),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LookupCase:
        geometry = Geometry.from_dict(dict(data["geometry"]))
        num_tokens, local_hit = data["num_tokens"], data["local_hit"]
        for key, value in (("num_tokens", num_tokens), ("local_hit", local_hit)):
            count_field(key, value)
        if local_hit > num_tokens:
            raise ValueError(f"local_hit {local_hit} exceeds num_tokens {num_tokens}")
        budget = optional_count_field("max_hit_tokens", data.get("max_hit_tokens"))
        states = data["states"]
        rows = []
        for g, group in enumerate(geometry.groups):
            row = tuple(LookupResult[str(name)] for name in states[str(g)])
            keys = num_tokens // geometry.chunk_tokens(group)
            if len(row) != keys:
                raise ValueError(f"group {g} has {keys} keys for {num_tokens} tokens, "
                                 f"the witness gives {len(row)} states")
            rows.append(row)
        return cls(str(data.get("geometry_name", "")), geometry, num_tokens, local_hit,
                   tuple(rows), budget)


@dataclass
class LookupObservation:
    """What a lookup did on one case."""

    hit_tokens: int | None
    """The accepted boundary (absolute; the local hit when nothing is gained); None: defer."""
    load_ranges: dict[int, tuple[int, int]] | None = None
    """Chunks loaded per group, as the implementation reports them (None: not reported)."""
    lookups: list[tuple[int, int]] = field(default_factory=list)
    pops: dict[int, int] | None = None
    popped_at: list[tuple[int, int]] | None = None
    """``(group, candidate boundary)`` of every pop (None: not reported)."""
    max_hit_trace: list[int] | None = None
    iterations: int | None = None
    """Passes of the convergence loop, as the implementation reports them (None: not
    reported)."""
    error: str | None = None
    """The loop did not converge (the message), so nothing else was observed."""


LOOKUP_STATES = (LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING)


def lookup_catalog() -> list[tuple[str, Geometry, int, int]]:
    """Small geometries with every kind of interaction, and their request sizes."""
    return [
        ("FA4+SWA4(sw8)", Geometry((fa(4), swa(4, 8))), 17, 0),
        ("FA4+SWA4(sw8,e3)", Geometry((fa(4), swa(4, 8, 3))), 17, 0),
        ("FA8+SWA4(sw6),bpc1", Geometry((fa(8), swa(4, 6))), 21, 0),
        ("SWA4(sw8)+SWA8(sw12)", Geometry((swa(4, 8), swa(8, 12))), 25, 0),
        ("FA4+SWA4(sw8,eagle)", Geometry((fa(4), swa(4, 8, eagle=True))), 21, 0),
        # The EAGLE group is the full-attention one (GPT-OSS with EAGLE-3): its prefix
        # scan peeks one chunk further and pops it.
        ("FA4(eagle)+SWA4(sw8)", Geometry((fa(4, eagle=True), swa(4, 8))), 17, 0),
        ("SWA4(sw8,eagle)", Geometry((swa(4, 8, eagle=True),)), 25, 0),
        ("SWA2(sw5),bpc2", Geometry((swa(2, 5),), blocks_per_chunk=2), 25, 0),
        ("FA4+SWA4(sw8),local4", Geometry((fa(4), swa(4, 8))), 21, 4),
        # A prompt of whole chunks: with an SWA group the last token is recomputed, so
        # the last chunk can never be loaded (maxhit N - 1); without one it can.
        ("FA4+SWA4(sw8),aligned", Geometry((fa(4), swa(4, 8))), 16, 0),
        ("FA4,aligned", Geometry((fa(4),)), 16, 0),
        # Mamba in align mode as vLLM builds it: the Mamba block is the base block, so
        # every attention chunk ends on a Mamba chunk end.
        ("Mamba4+SWA8(sw12)", Geometry((mamba(4), swa(8, 12))), 25, 0),
        # A Mamba block larger than an attention block is not a geometry vLLM builds: kept
        # so the latent grading and the Mamba rounding stay exercised.
        ("SWA4(sw8)+Mamba8", Geometry((swa(4, 8), mamba(8))), 25, 0),
        # EAGLE at chunk granularity (bpc > 1): the peek and the pop are one chunk of
        # bpc blocks; unaligned boundaries, e > 0 and a local hit included.
        ("FA4+SWA2(sw3,eagle),bpc2", Geometry((fa(4), swa(2, 3, eagle=True)),
                                               blocks_per_chunk=2), 17, 0),
        ("FA4+SWA2(sw3,eagle),bpc2,local4", Geometry((fa(4), swa(2, 3, eagle=True)),
                                                      blocks_per_chunk=2), 17, 4),
        ("SWA2(sw3,e1,eagle)+SWA4(sw5,e1),bpc2",
         Geometry((swa(2, 3, 1, eagle=True), swa(4, 5, 1)), blocks_per_chunk=2), 21, 0),
    ]


def lookup_retry_catalog() -> list[tuple[str, Geometry, int, int]]:
    """Smaller geometries whose chunks also take RETRY (an asynchronous lookup in
    flight): 4^n assignments, so the requests are short."""
    return [
        ("FA4+SWA4(sw8),retry", Geometry((fa(4), swa(4, 8))), 13, 0),
        ("SWA4(sw8,eagle),retry", Geometry((swa(4, 8, eagle=True),)), 21, 0),
        ("SWA2(sw5),bpc2,retry", Geometry((swa(2, 5),), blocks_per_chunk=2), 17, 0),
        ("Mamba4+SWA8(sw12),retry", Geometry((mamba(4), swa(8, 12))), 17, 0),
        ("SWA4(sw8)+Mamba8,retry", Geometry((swa(4, 8), mamba(8))), 17, 0),
    ]


def lookup_extra_catalog() -> list[tuple[str, Geometry, int, int, int | None]]:
    """Short requests enumerated after the other catalogues (so the counterexamples
    found there stay the first ones), with a scheduling budget (the last field,
    ``max_hit_tokens``; None: unlimited). Few keys each: the lookup family's size is the
    prover's time.

    A budget below maxhit, inside a chunk: the answer is the largest boundary within it
    (an FA chunk loaded whole for part of it, an SWA window ending there, an EAGLE peek
    past it, a local hit below it)."""
    return [
        ("FA4+SWA4(sw8),budget6", Geometry((fa(4), swa(4, 8))), 9, 0, 6),
        ("SWA4(sw8,eagle),budget10", Geometry((swa(4, 8, eagle=True),)), 17, 0, 10),
        ("SWA4(sw8),local4,budget11", Geometry((swa(4, 8),)), 17, 4, 11),
        # A coarser group visited after a finer one clamps maxhit to its keys (19 -> 16)
        # once the finer one confirmed 19: the finer one must be checked again at 16,
        # where its window reads a chunk further left.
        ("SWA4(sw8)+SWA8(sw12),clamp", Geometry((swa(4, 8), swa(8, 12))), 20, 0, None),
        # Lookahead block hashes (docs/CONTRACT.md 2.1): the EAGLE group drops nothing, a
        # block is keyed once the token past it exists. Full attention alone serves the
        # last complete chunk of a prompt one token longer (16 of 17: a legacy EAGLE
        # group peeks at a chunk with no key there and stops at 12).
        ("FA4(eagle),lookahead", Geometry((fa(4, eagle=True),), hash_lookahead=1),
         17, 0, None),
        ("FA4(eagle)+SWA4(sw8),lookahead",
         Geometry((fa(4, eagle=True), swa(4, 8)), hash_lookahead=1), 13, 0, None),
        ("SWA4(sw8,eagle),lookahead", Geometry((swa(4, 8, eagle=True),), hash_lookahead=1),
         17, 0, None),
        # A GPU hit inside a chunk (bpc > 1: a block-aligned hit need not be chunk-aligned)
        # with less than one chunk between it and the cap, which lies past the end of the
        # hit's chunk: worth loading by the contract (N // tpc > L // tpc, counted from the
        # end of L's chunk), not by a rule that counts a whole chunk from L itself
        # (:func:`short_of_a_chunk`). FA alone, 12 of 12 (the runtime monitor's request in
        # vLLM's own test_offloading_connector); FA + SWA, the cap one token short of the
        # prompt (12 of 13, and 16 of 17 from a hit in the second chunk).
        ("FA4,bpc3,local4", Geometry((fa(4),), blocks_per_chunk=3), 12, 4, None),
        ("FA4+SWA4(sw8),bpc3,local4", Geometry((fa(4), swa(4, 8)), blocks_per_chunk=3),
         13, 4, None),
        ("FA4+SWA4(sw8),bpc2,local12", Geometry((fa(4), swa(4, 8)), blocks_per_chunk=2),
         17, 12, None),
    ]


def lookup_cases() -> Iterator[LookupCase]:
    """Every MISS/HIT/HIT_PENDING assignment of the catalogue, then every assignment
    with RETRY of the RETRY catalogue, then every MISS/HIT/HIT_PENDING assignment of the
    extra catalogue (smallest request first within each)."""
    for catalog, states in ((lookup_catalog(), LOOKUP_STATES),
                            (lookup_retry_catalog(), tuple(LookupResult))):
        yield from _assignments([(*entry, None) for entry in catalog], states)
    yield from _assignments(lookup_extra_catalog(), LOOKUP_STATES)


def _assignments(catalog: Sequence[tuple[str, Geometry, int, int, int | None]],
                 alphabet: tuple[LookupResult, ...]) -> Iterator[LookupCase]:
    for name, geometry, num_tokens, local_hit, budget in catalog:
        sizes = [multigroup.complete_chunks(geometry, g, num_tokens) for g in geometry.groups]
        total = sum(sizes)
        for flat in itertools.product(alphabet, repeat=total):
            states: list[tuple[LookupResult, ...]] = []
            offset = 0
            for size in sizes:
                states.append(tuple(flat[offset : offset + size]))
                offset += size
            yield LookupCase(name, geometry, num_tokens, local_hit, tuple(states), budget)


def lookup_domain() -> str:
    names = ", ".join(name for name, *_ in lookup_catalog())
    retry = ", ".join(name for name, *_ in lookup_retry_catalog())
    extra = ", ".join(name if budget is None else f"{name} (a budget of {budget} tokens)"
                      for name, _, _, _, budget in lookup_extra_catalog())
    return ("the bounded cross-check of C5/eagle-step-peeks-once and "
            "C6/lookup-step-converges (which cover every state, one turn at a time): the "
            "whole loop with its real scans, driver and geometries; "
            f"every MISS/HIT/HIT_PENDING state of every chunk of {names}; every "
            f"MISS/HIT/HIT_PENDING/RETRY state of every chunk of {retry}; every "
            f"MISS/HIT/HIT_PENDING state of every chunk of {extra}")


def _run_lookup(case: LookupCase, impl: Implementation) -> LookupObservation:
    """The reference scheduler's loop over the implementation's primitives."""
    try:
        outcome = lookup_complete_chunks(
            impl, case.geometry, case.num_tokens, case.local_hit,
            lambda g, k: case.states[g][k], max_hit_tokens=case.max_hit_tokens,
        )
    except ConvergenceError as exc:
        return LookupObservation(None, error=str(exc))
    return LookupObservation(
        outcome.hit_tokens, dict(outcome.load_ranges), list(outcome.lookups),
        dict(outcome.pops), list(outcome.popped_at), list(outcome.max_hit_trace),
        outcome.iterations,
    )


run_lookup: LastCase[LookupCase, LookupObservation] = LastCase(_run_lookup)


def _contract_answer(case: LookupCase, _impl: Any = None) -> multigroup.ContractAnswer:
    return multigroup.contract_answer(case.geometry, case.num_tokens, case.local_hit,
                                      dict(enumerate(case.states)), case.max_hit_tokens)


contract_answer: LastCase[LookupCase, multigroup.ContractAnswer] = LastCase(
    _contract_answer
)


LOOKUP_SPACE: CaseSpace[LookupCase, LookupObservation] = CaseSpace(
    family=Family.LOOKUP, cases=lookup_cases, describe=lookup_domain,
    to_json=LookupCase.to_json, from_json=LookupCase.from_json, observe=run_lookup,
    geometry_of=lambda case: case.geometry,
    driver="kvcontract's multi-group lookup over the bound primitives",
    drivers=("lookup_complete_chunks",),
)


def _raised(observation: LookupObservation) -> str:
    return f"the implementation raised ConvergenceError: {observation.error}"


def crash_of(state: LookupResult | None) -> str:
    """What upstream's ``prepare_load`` says when it meets a chunk in ``state``."""
    return "not found in cache" if state in (None, LookupResult.MISS) else "not ready"


def _first_not_hit(case: LookupCase, g: int, chunks: range) -> str | None:
    for k in chunks:
        state = case.states[g][k] if k < len(case.states[g]) else None
        if state != HIT:
            shown = "absent (no key)" if state is None else state.name
            return (f"group {g} must load chunk {k}, which is {shown}: upstream would crash "
                    f"with '{crash_of(state)}'")
    return None


@functools.lru_cache(maxsize=4096)
def _spec_loads(geometry: Geometry, hit: int, local_hit: int) -> dict[int, tuple[int, int]]:
    """``Load(N, L)`` of every group (state-independent: computed once per boundary)."""
    return {g: multigroup.load_range(geometry, group, hit, local_hit)
            for g, group in enumerate(geometry.groups)}


def loads_only_hit(case: LookupCase, observation: LookupObservation) -> str | None:
    """C2 on what is loaded. The allocation of a hit loads the spec's ``Load(N, L)`` of
    every group, so each of its chunks must be HIT; and the implementation's own load
    set (when it reports one) must be exactly that set: a chunk it adds must be HIT too
    (else the load crashes), a chunk it leaves out stays unfilled. Upstream's loop
    reports no load set (the GPU manager derives it from the hit): only the first part
    applies."""
    if observation.error is not None:
        return _raised(observation)
    hit = observation.hit_tokens
    if hit is None or hit <= case.local_hit:
        return None
    expected = _spec_loads(case.geometry, hit, case.local_hit)
    for g, (lo, hi) in expected.items():
        crash = _first_not_hit(case, g, range(lo, hi))
        if crash is not None:
            return f"hit {hit} accepted but {crash}"
    if observation.load_ranges is None:
        return None
    for g, (lo, hi) in expected.items():
        if g not in observation.load_ranges:
            return f"hit {hit} accepted but the lookup reports no load set for group {g}"
        got_lo, got_hi = (int(x) for x in observation.load_ranges[g])
        if (got_lo, got_hi) == (lo, hi):
            continue
        crash = _first_not_hit(case, g, range(got_lo, got_hi))
        if crash is not None:
            return f"hit {hit} accepted and the implementation's load set says {crash}"
        found: str = Violation(
            f"hit {hit} accepted but the implementation loads chunks [{got_lo}, {got_hi}) "
            f"of group {g}, the allocation needs [{lo}, {hi})", Impact.CORRUPTION)
        return found
    return None


def defers_only_in_scope(case: LookupCase, observation: LookupObservation) -> str | None:
    if observation.error is not None:
        return _raised(observation)
    if observation.hit_tokens is not None:
        return None
    answer = contract_answer(case)
    if answer.pending_in_window:
        return None
    if any(case.states[g][k] == LookupResult.RETRY for g, k in observation.lookups):
        return None  # a lookup in flight: the location is unknown, a defer is allowed
    return (
        "the lookup deferred, but no chunk read for the best boundary "
        f"{answer.best_present} is pending (and no RETRY was seen)"
    )


def expected_hit(case: LookupCase) -> int:
    """The largest boundary every group can serve (the local hit when none can)."""
    answer = contract_answer(case)
    return answer.best_present if answer.best_present is not None else case.local_hit


def is_maximal(case: LookupCase, observation: LookupObservation) -> str | None:
    """C4: the accepted hit is exactly the largest servable boundary.

    Less is a lost hit. More is graded by what it costs: a boundary that reads a chunk
    that is not present is the crash C2 also reports; one whose reads are all present
    is safe, but it lies less than one chunk of some group beyond the local hit (the
    contract's worth-loading rule, docs/CONTRACT.md 4.4): that group loads a whole chunk
    for part of it, and the rest is recomputed (``waste``; vLLM 0.31-0.33 accepts such
    hits when a finer group shrinks the boundary after a coarser one confirmed it); one
    past the case's scheduling budget makes the step wait for more than it may load
    (``delay``).
    """
    if observation.error is not None:
        return _raised(observation)
    hit = observation.hit_tokens
    if hit is None:
        return None
    expected = expected_hit(case)
    if hit == expected:
        return None
    message = f"the lookup accepted {hit}; the largest servable boundary is {expected}"
    if hit < expected:
        return message
    for g, (lo, hi) in _spec_loads(case.geometry, hit, case.local_hit).items():
        missing = _first_not_hit(case, g, range(lo, hi))
        if missing is not None:
            found: str = Violation(f"{message}, and {missing}", Impact.CRASH)
            return found
    budget = case.max_hit_tokens
    if budget is not None and hit > budget:
        # Past the scheduler's budget: the request loads more than its step (or its
        # max_load_tokens) allows, and the batch waits for it.
        over: str = Violation(f"{message}, past the scheduling budget of {budget} tokens",
                              Impact.DELAY)
        return over
    short = [g for g, group in enumerate(case.geometry.groups)
             if hit // case.geometry.chunk_tokens(group)
             <= case.local_hit // case.geometry.chunk_tokens(group)]
    waste: str = Violation(
        f"{message}: safe (every chunk it reads is present), but groups {short} gain less "
        "than one chunk beyond the local hit: a whole chunk is loaded for part of it",
        Impact.WASTE)
    return waste


def eagle_peek(case: LookupCase, observation: LookupObservation) -> str | None:
    """C5: the peek chunk is looked up and HIT, never loaded; each EAGLE group pops
    exactly once per candidate boundary it verified (never twice at one boundary, and
    no pop by a group that is not EAGLE)."""
    if observation.error is not None:
        return _raised(observation)
    hit = observation.hit_tokens
    if observation.popped_at is not None:
        seen: set[tuple[int, int]] = set()
        for g, boundary in observation.popped_at:
            if not case.geometry.drops_eagle_block(case.geometry.groups[g]):
                why = ("its block hashes cover the lookahead" if case.geometry.groups[g].eagle
                       else "it is not an EAGLE group")
                return f"group {g} drops no block ({why}) but popped at boundary {boundary}"
            if (g, boundary) in seen:
                return f"EAGLE group {g} popped twice at boundary {boundary}"
            seen.add((g, boundary))
            # A pop drops the peek chunk past the candidate's last chunk, so that chunk
            # must exist (a key): checked from the case, not from the pop count.
            peek = -(-boundary // case.geometry.chunk_tokens(case.geometry.groups[g]))
            if peek >= len(case.states[g]):
                return (f"EAGLE group {g} popped at boundary {boundary}, but its peek chunk "
                        f"{peek} has no key ({len(case.states[g])} keys)")
        if observation.pops is not None:
            for g, count in observation.pops.items():
                recorded = sum(1 for p, _ in observation.popped_at if p == g)
                if count != recorded:
                    return (f"EAGLE group {g} popped {count} times for {recorded} verified "
                            "boundaries")
    for g, group in enumerate(case.geometry.groups):
        if not case.geometry.drops_eagle_block(group):
            continue
        if hit is None or hit <= case.local_hit:
            continue
        _, hi = multigroup.load_range(case.geometry, group, hit, case.local_hit)
        if (g, hi) not in observation.lookups:
            return f"EAGLE group {g}: the peek chunk {hi} after hit {hit} was never looked up"
        peek_state = case.states[g][hi] if hi < len(case.states[g]) else None
        if peek_state != HIT:
            shown = "absent (no key)" if peek_state is None else peek_state.name
            return f"EAGLE group {g}: hit {hit} accepted with peek chunk {hi} {shown}, not HIT"
        if observation.load_ranges is not None and observation.load_ranges[g][1] > hi:
            return f"EAGLE group {g}: the peek chunk {hi} is in the load set"
    return None


def peeks_one_chunk(case: LookupCase, observation: LookupObservation) -> str | None:
    """C5: an unverified EAGLE group queries exactly one chunk past its boundary.

    No group looks up a chunk past the one its first candidate boundary ends in (the
    first ``maxhit``, capped by the budget and clamped to the group's keys), except an
    EAGLE group's one peek chunk after it (its window of ``W + 1`` / ``initial + 1``
    chunks ends there). A group that looks further reads, and may defer on or lose its
    hit to, a chunk no boundary of this lookup needs; that the peek itself is looked up,
    HIT and popped once, never loaded, is ``C5/eagle-peek``; that the window left of it
    was checked whole is C2's (``lookup-loads-only-hit``)."""
    if observation.error is not None:
        return _raised(observation)
    geometry = case.geometry
    first = int(multigroup.lookup_cap(geometry, case.num_tokens, case.max_hit_tokens))
    for g, chunk in observation.lookups:
        group = geometry.groups[g]
        tpc = geometry.chunk_tokens(group)
        candidate = min(first, len(case.states[g]) * tpc)
        drops = geometry.drops_eagle_block(group)
        last = int(cdiv(candidate, tpc)) - 1 + (1 if drops else 0)
        if chunk > last:
            what = "its peek chunk" if drops else "the chunk of its first candidate"
            return (f"group {g} looked up chunk {chunk}, past {what} {last} (first "
                    f"candidate {candidate}; an EAGLE group peeks exactly one chunk, "
                    "another none)")
    return None


def budget_is_maximal(case: LookupCase, observation: LookupObservation) -> str | None:
    """C4 under a scheduling budget (docs/CONTRACT.md 4.4): the accepted hit is the largest
    boundary within the budget every group serves. The request's recomputed last token
    comes off its length, not off the budget: a budget below the prompt is a boundary the
    lookup may take whole. Vacuous without a budget (``lookup-is-maximal`` judges those);
    its own row, so a release's budget order is judged apart from its other C4 defects."""
    if case.max_hit_tokens is None:
        return None
    return is_maximal(case, observation)


@functools.lru_cache(maxsize=4096)
def _chunk_of_local_hit(geometry: Geometry, num_tokens: int, local_hit: int,
                        budget: int | None) -> tuple[int, int, int] | None:
    """``(group, tpc, first candidate)`` of the first group whose chunk the local hit
    lies inside with less than one chunk of it to the first candidate (the cap, clamped
    to the group's keys); None when no group has that shape."""
    if not local_hit:
        return None
    cap = int(multigroup.lookup_cap(geometry, num_tokens, budget))
    for g, group in enumerate(geometry.groups):
        tpc = geometry.chunk_tokens(group)
        first = min(cap, multigroup.complete_chunks(geometry, group, num_tokens) * tpc)
        if local_hit % tpc and 0 < first - local_hit < tpc:
            return g, tpc, first
    return None


def short_of_a_chunk(case: LookupCase) -> bool:
    """Whether the case's local hit lies inside a chunk of some group, with less than one
    chunk of that group between it and the lookup's first candidate (the cap, clamped to
    the group's keys). There the contract's worth-loading rule, counted from the end of
    the local hit's chunk (docs/CONTRACT.md 4.4: ``N // tpc > L // tpc``), may serve a
    boundary that a rule counting a whole chunk from the local hit itself refuses."""
    return _chunk_of_local_hit(case.geometry, case.num_tokens, case.local_hit,
                               case.max_hit_tokens) is not None


def local_hit_is_maximal(case: LookupCase, observation: LookupObservation) -> str | None:
    """C4 from a local hit inside a chunk with less than a chunk to the cap
    (:func:`short_of_a_chunk`): the accepted hit is the largest servable boundary; the
    tokens between the local hit and the end of its chunk count towards a chunk (vLLM
    0.33.0 and 0.34.0 answer nothing there: the early exit of ``_lookup_complete_chunks``
    counts a whole chunk from the local hit). Vacuous on the other cases
    (``lookup-is-maximal`` judges those); its own row, so the audit reports this shape
    apart from the loop's other C4 findings. A lost hit names the group whose chunk the
    local hit lies in, and whether the lookup looked up any chunk (an early exit does
    not)."""
    shape = _chunk_of_local_hit(case.geometry, case.num_tokens, case.local_hit,
                                case.max_hit_tokens)
    if shape is None:
        return None
    message = is_maximal(case, observation)
    hit = observation.hit_tokens
    if message is None or hit is None or hit >= expected_hit(case):
        return message  # no finding, or not a lost hit (graded by is_maximal)
    g, tpc, first = shape
    local = case.local_hit
    looked = "" if observation.lookups else ", and the lookup looked up no chunk"
    return (f"{message}: the local hit {local} lies inside chunk {local // tpc} of group "
            f"{g} ({tpc} tokens a chunk); the cap {first} is less than a chunk past it "
            f"({first - local} tokens), yet past that chunk's end{looked}")


def lookahead_drops_nothing(case: LookupCase, observation: LookupObservation) -> str | None:
    """C5 under lookahead block hashes: an EAGLE group reads like any other group. Its
    block hashes cover the drafter's lookahead, so no chunk of it is volatile: it pops
    nothing and looks up no chunk past the one its first candidate ends in (a peek would
    read, defer on and lose the hit to a chunk the producer does not store in this
    mode). Vacuous under legacy hashes (``C5/eagle-peek`` judges those)."""
    if observation.error is not None:
        return _raised(observation)
    geometry = case.geometry
    if not geometry.hash_lookahead:
        return None
    for g, boundary in observation.popped_at or ():
        return (f"EAGLE group {g} popped a chunk at boundary {boundary} under lookahead "
                f"block hashes ({geometry.hash_lookahead} token(s)): no block is volatile")
    first = int(multigroup.lookup_cap(geometry, case.num_tokens, case.max_hit_tokens))
    for g, chunk in observation.lookups:
        group = geometry.groups[g]
        if not group.eagle:
            continue
        tpc = geometry.chunk_tokens(group)
        last = int(cdiv(min(first, len(case.states[g]) * tpc), tpc)) - 1
        if chunk > last:
            return (f"EAGLE group {g} looked up chunk {chunk} past its first candidate's "
                    f"last chunk {last} under lookahead block hashes: a legacy peek")
    return None


def converges(case: LookupCase, observation: LookupObservation) -> str | None:
    """C6: the loop terminates, maxhit never grows (each traced value lowers it), the
    passes are at most its decreases plus one, and the final N is safe at N itself for
    every group (not only at an earlier, larger candidate): every chunk the group reads
    there (its load set, and an EAGLE group's peek chunk) is present, and a Mamba group's
    state exists at N (a chunk end).

    Upstream's per-group "less than one chunk beyond the local hit gives 0" is a
    worth-loading heuristic, not a safety rule: a final N inside a coarser group's chunk
    is safe when that group's load set is present (the chunk is loaded whole and its tail
    recomputed; vLLM's scheduler does not need external hits to be block-aligned), so it
    is not required here (docs/CONTRACT.md, C6).
    """
    if observation.error is not None:
        return observation.error
    trace = observation.max_hit_trace or []
    if any(b > a for a, b in itertools.pairwise(trace)):
        return f"maxhit grew: {trace}"
    if any(b == a for a, b in itertools.pairwise(trace)):
        # Each entry records a lowering (a shrink or a clamp): one that lowers nothing
        # is a pass or a clamp that did not change maxhit, reported as progress.
        return f"maxhit recorded twice without lowering it: {trace}"
    if observation.iterations is not None:
        # The ranking function: every pass but the last lowers maxhit, by a shrink or
        # by a clamp to a group's keys, and the trace records every value it took, so
        # 1 <= passes <= decreases + 1. The count the implementation reports is checked
        # against its trace, not trusted.
        decreases = sum(1 for a, b in itertools.pairwise(trace) if b < a)
        if not 1 <= observation.iterations <= decreases + 1:
            return (f"the loop reports {observation.iterations} passes for {decreases} "
                    f"decreases of maxhit {trace}: each pass but the last must lower it")
    hit = observation.hit_tokens
    if hit is None or hit <= case.local_hit:
        return None
    for g, group in enumerate(case.geometry.groups):
        tpc = case.geometry.chunk_tokens(group)
        if group.kind is GroupKind.MAMBA and hit % tpc:
            found: str = Violation(
                f"final hit {hit} is not a chunk end of Mamba group {g} ({tpc} tokens): "
                "its state does not exist there", Impact.CORRUPTION)
            return found
        lo, hi = multigroup.read_range(case.geometry, group, hit, case.local_hit)
        for k in range(lo, hi):
            if k >= len(case.states[g]) or case.states[g][k] not in (HIT, HIT_PENDING):
                return (f"final hit {hit} is not servable by group {g}: chunk {k} is not "
                        "present (checked only at an earlier candidate)")
    return None


def picture(case: LookupCase, impl: Implementation) -> Picture:
    """The case's chunk states, the spec's ranges at the accepted (or the spec's best)
    boundary, and the chunks that make the verdict: loaded but not HIT, pending outside
    the read window yet deferring, or demanded beyond the spec's read range (a lost hit)."""
    geometry, states, local_hit = case.geometry, case.states, case.local_hit
    answer = contract_answer(case)
    observation = run_lookup(case, impl)
    hit = observation.hit_tokens
    note = (f"the implementation did not converge: {observation.error}"
            if observation.error is not None
            else f"implementation: {'defer' if hit is None else f'hit {hit}'}")
    shown = hit if hit is not None and hit > local_hit else answer.best_present
    offending: dict[int, set[int]] = {}
    for g, group in enumerate(geometry.groups):
        bad: set[int] = set()
        if hit is not None and hit > local_hit:
            lo, hi = multigroup.load_range(geometry, group, hit, local_hit)
            bad |= {k for k in range(lo, hi) if k >= len(states[g]) or states[g][k] != HIT}
        if not bad and hit is None and answer.best_present is not None:
            lo, hi = multigroup.read_range(geometry, group, answer.best_present, local_hit)
            bad |= {k for k, s in enumerate(states[g]) if s == HIT_PENDING and not lo <= k < hi}
        best = answer.best_present
        if not bad and best is not None and (hit is None or hit < best) and group.is_swa:
            # A lost hit: the chunks the implementation demands for the spec's best
            # boundary beyond what the spec reads there (and that are not HIT).
            assert group.sliding_window is not None
            lo, hi = multigroup.read_range(geometry, group, best, local_hit)
            tpc = geometry.chunk_tokens(group)
            end = int(cdiv(best, tpc))
            demanded = int(impl.load_window_size_in_chunks(
                best, group.sliding_window, group.extra_retained_tokens, tpc))
            bad |= {k for k in range(max(0, end - demanded), lo)
                    if k >= len(states[g]) or states[g][k] != HIT}
        if bad:
            offending[g] = bad
    notes = [note, f"spec: best boundary {answer.best_present}"
             + (", a chunk it reads is pending" if answer.pending_in_window else "")]
    return Picture(geometry, case.num_tokens, shown, local_hit,
                   states={g: list(row) for g, row in enumerate(states)},
                   offending=offending, notes=notes)


LOOKUP_FUNCTIONS: tuple[str, ...] = (
    "get_sliding_window_size_in_chunks", "load_window_size_in_chunks",
    "sliding_window_lookup", "prefix_lookup", "load_chunk_range", "initial_lookup_cap",
    "multigroup_lookup_step",
)
"""The multi-group lookup calls all of these: the scheduler's fold drives the primitives
and each group's turn (``multigroup_lookup_step``, last: a variant's turn is located
there only when no primitive of it differs)."""

ON_UPSTREAM_LOOP = frozenset({Observer.UPSTREAM_LOOP})
ON_UPSTREAM_LOOP_AND_MONITOR = frozenset({Observer.UPSTREAM_LOOP, Observer.MONITOR})


def lookup_properties() -> list[CaseProperty]:
    def make(clause: str, name: str, description: str, judge: Any,
             observable_on: frozenset[Observer], domain_note: str = "",
             relevant: Callable[[Any], bool] | None = None) -> CaseProperty:
        return CaseProperty(clause, name, description, LOOKUP_SPACE, judge,
                            LOOKUP_FUNCTIONS, picture, observable_on=observable_on,
                            domain_note=domain_note, relevant=relevant)

    return [
        make("C2", "lookup-loads-only-hit",
             "every chunk of every accepted load set was answered HIT", loads_only_hit,
             ON_UPSTREAM_LOOP_AND_MONITOR),
        make("C3", "lookup-defers-only-in-scope",
             "the multi-group lookup defers only for a pending chunk it would read",
             defers_only_in_scope, ON_UPSTREAM_LOOP_AND_MONITOR),
        make("C4", "lookup-is-maximal",
             "the accepted hit is the largest boundary every group can serve", is_maximal,
             ON_UPSTREAM_LOOP_AND_MONITOR),
        make("C4", "lookup-budget-is-maximal",
             "under a scheduling budget, the accepted hit is the largest boundary within "
             "it every group can serve", budget_is_maximal, ON_UPSTREAM_LOOP,
             "judged on the budgeted cases (vacuous on the others)",
             relevant=lambda case: case.max_hit_tokens is not None),
        # Neither upstream's loop nor a system event reports the lookups and pops.
        make("C5", "eagle-peek",
             "EAGLE: the peek chunk is looked up and HIT, not loaded; one pop per boundary",
             eagle_peek, frozenset(),
             "the peek is judged on the EAGLE geometries (on the others: no group pops)"),
        # Issue 30: the peek's size (one chunk, no more) and the window it closes.
        # Upstream's loop reports its lookups, but this stays kvcontract's (its first
        # candidate and keys are the contract's; the audit runs it via kvcontract's
        # loop over the bound primitives).
        make("C5", "eagle-peeks-one-chunk",
             "EAGLE: exactly one chunk (the peek) is looked up past the boundary; no other "
             "group looks past it", peeks_one_chunk,
             frozenset()),
        # Upstream's loop reports its lookups (a pop shows as a lookup past the boundary):
        # the engine judges the lookahead geometries in vLLM's default mode.
        make("C5", "lookup-lookahead-drops-nothing",
             "EAGLE under lookahead block hashes: no peek, no pop; the group reads its "
             "load set like any other", lookahead_drops_nothing, ON_UPSTREAM_LOOP,
             "judged on the lookahead-hash geometries (vacuous on the others)",
             relevant=lambda case: bool(case.geometry.hash_lookahead)),
        # A system event carries no trace of the loop's maxhit.
        make("C6", "lookup-converges",
             "the loop terminates, maxhit never grows, the final N is servable by every group",
             converges, ON_UPSTREAM_LOOP),
        # After the others (their order is pinned): the worth-loading rule from a local
        # hit inside a chunk, on its own row like the budget's. Judged on upstream's loop
        # (the audit); the monitor judges every lookup by lookup-is-maximal already.
        make("C4", "lookup-local-hit-is-maximal",
             "from a local hit inside a chunk with less than a chunk to the cap, the "
             "accepted hit is the largest boundary every group can serve",
             local_hit_is_maximal, ON_UPSTREAM_LOOP,
             "judged on the cases whose local hit lies inside a chunk with less than one "
             "chunk between it and the cap (vacuous on the others)",
             relevant=short_of_a_chunk),
    ]
