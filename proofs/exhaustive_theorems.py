"""Exhaustive theorems: scanners, the multi-group lookup and store schedules.

These properties are about sequences and states, not formulas: each is checked on
every case of a stated finite domain (every lookup-state sequence up to a length, every
chunk-state assignment of a geometry catalogue, every chunked-prefill schedule of a
prompt set), in increasing size, so the first failure is a minimal counterexample.
The scanner specification itself is proved for every sequence up to length 12 by Z3
(:mod:`kvcontract.proofs.sequence_theorems`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.scheduler import ConvergenceError, StoreTracker, lookup_complete_chunks
from kvcontract.proofs.theorem import ExhaustiveTheorem
from kvcontract.spec import multigroup
from kvcontract.spec.geometry import Geometry, fa, mamba, swa
from kvcontract.spec.lookup import HIT, HIT_PENDING, LookupResult, sliding_window_answer
from kvcontract.spec.reachability import chunk_is_stored, mask_rule, store_need_blocks

SCAN_MAX_LENGTH = 6
SCAN_WINDOWS = (1, 2, 3)
ALL_STATES = tuple(LookupResult)


# -- scanners -------------------------------------------------------------------------
@dataclass(frozen=True)
class ScanCase:
    states: tuple[LookupResult, ...]
    initial_window: int
    window: int

    def to_json(self) -> dict[str, Any]:
        return {
            "states": [s.name for s in self.states],
            "initial_window": self.initial_window,
            "window": self.window,
        }


def scan_cases() -> Iterator[ScanCase]:
    for length in range(1, SCAN_MAX_LENGTH + 1):
        for window in SCAN_WINDOWS:
            for initial in (window, window + 1):
                for states in itertools.product(ALL_STATES, repeat=length):
                    yield ScanCase(states, initial, window)


class _LastCase:
    """A one-entry memo: the theorems of a family check one case after another, so the
    implementation's lookup and the spec's answer for a case are computed once, not
    once per clause (a failure is remembered and raised again)."""

    def __init__(self, compute: Any) -> None:
        self.compute = compute
        self.key: tuple[Any, Any] | None = None
        self.value: Any = None
        self.error: BaseException | None = None

    def __call__(self, case: Any, impl: Any = None) -> Any:
        key = (case, impl)
        if self.key is None or self.key[0] is not case or self.key[1] is not impl:
            self.key, self.value, self.error = key, None, None
            try:
                self.value = self.compute(case, impl)
            except Exception as exc:
                self.error = exc
        if self.error is not None:
            raise self.error
        return self.value


@_LastCase
def _run_scan(case: ScanCase, impl: Implementation) -> int | None:
    states = case.states
    found: int | None = impl.sliding_window_lookup(
        lambda k: states[k], 0, len(states), case.initial_window, case.window
    )
    return found


@_LastCase
def _scan_answer(case: ScanCase, _impl: Any = None) -> Any:
    return sliding_window_answer(list(case.states), case.initial_window, case.window)


def _required(case: ScanCase, end: int) -> int:
    return case.initial_window if end == len(case.states) else case.window


def scan_accepts_only_hit(case: ScanCase, impl: Implementation) -> str | None:
    found = _run_scan(case, impl)
    if found is None:
        return None
    start = max(0, found - _required(case, found))
    bad = [k for k in range(start, found) if case.states[k] != HIT]
    if bad:
        return (
            f"the scan accepted keys [{start}, {found}) but key {bad[0]} is "
            f"{case.states[bad[0]].name}, not HIT"
        )
    return None


def scan_defers_only_in_scope(case: ScanCase, impl: Implementation) -> str | None:
    found = _run_scan(case, impl)
    spec = _scan_answer(case)
    if found is None and not spec.deferred:
        return (
            f"the scan deferred, but no RETRY was scanned and no pending key lies in the "
            f"window [{spec.window_start}, {spec.end}) it would use"
        )
    return None


def scan_is_maximal(case: ScanCase, impl: Implementation) -> str | None:
    found = _run_scan(case, impl)
    spec = _scan_answer(case)
    if found is not None and not spec.deferred and found != spec.end:
        return f"the scan answered {found}, the rightmost complete window ends at {spec.end}"
    return None


def _scan_theorems() -> list[ExhaustiveTheorem]:
    domain = (
        f"all {len(ALL_STATES)}^n lookup-state sequences, n <= {SCAN_MAX_LENGTH}, "
        f"W in {set(SCAN_WINDOWS)}, initial in {{W, W+1}}"
    )
    return [
        ExhaustiveTheorem(
            "C2", "scan-accepts-only-hit",
            "a non-deferred sliding-window scan accepts only HIT keys",
            scan_cases, scan_accepts_only_hit, domain, lambda c: c.to_json(),
            family="scan",
        ),
        ExhaustiveTheorem(
            "C3", "scan-defers-only-in-scope",
            "the scan defers only for a RETRY or a pending key in the window it would use",
            scan_cases, scan_defers_only_in_scope, domain, lambda c: c.to_json(),
            family="scan",
        ),
        ExhaustiveTheorem(
            "C4", "scan-is-maximal",
            "a non-deferred scan answers the rightmost complete window",
            scan_cases, scan_is_maximal, domain, lambda c: c.to_json(),
            family="scan",
        ),
    ]


# -- multi-group lookup -------------------------------------------------------------
@dataclass(frozen=True)
class LookupCase:
    geometry_name: str
    geometry: Geometry
    num_tokens: int
    local_hit: int
    states: tuple[tuple[LookupResult, ...], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "geometry_name": self.geometry_name,
            "geometry": self.geometry.to_dict(),
            "num_tokens": self.num_tokens,
            "local_hit": self.local_hit,
            "states": {str(g): [s.name for s in seq] for g, seq in enumerate(self.states)},
        }


LOOKUP_STATES = (LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING)


def lookup_catalog() -> list[tuple[str, Geometry, int, int]]:
    """Small geometries with every kind of interaction, and their request sizes."""
    return [
        ("FA4+SWA4(sw8)", Geometry((fa(4), swa(4, 8))), 17, 0),
        ("FA4+SWA4(sw8,e3)", Geometry((fa(4), swa(4, 8, 3))), 17, 0),
        ("FA8+SWA4(sw6),bpc1", Geometry((fa(8), swa(4, 6))), 21, 0),
        ("SWA4(sw8)+SWA8(sw12)", Geometry((swa(4, 8), swa(8, 12))), 25, 0),
        ("FA4+SWA4(sw8,eagle)", Geometry((fa(4), swa(4, 8, eagle=True))), 21, 0),
        ("SWA4(sw8,eagle)", Geometry((swa(4, 8, eagle=True),)), 25, 0),
        ("SWA2(sw5),bpc2", Geometry((swa(2, 5),), blocks_per_chunk=2), 25, 0),
        ("FA4+SWA4(sw8),local4", Geometry((fa(4), swa(4, 8))), 21, 4),
        ("SWA4(sw8)+Mamba8", Geometry((swa(4, 8), mamba(8))), 25, 0),
        # EAGLE at chunk granularity (bpc > 1): the peek and the pop are one chunk of
        # bpc blocks; unaligned boundaries, e > 0 and a local hit included.
        ("FA4+SWA2(sw3,eagle),bpc2", Geometry((fa(4), swa(2, 3, eagle=True)),
                                               blocks_per_chunk=2), 17, 0),
        ("FA4+SWA2(sw3,eagle),bpc2,local4", Geometry((fa(4), swa(2, 3, eagle=True)),
                                                      blocks_per_chunk=2), 17, 4),
        ("SWA2(sw3,e1,eagle)+SWA4(sw5),bpc2",
         Geometry((swa(2, 3, 1, eagle=True), swa(4, 5)), blocks_per_chunk=2), 21, 0),
    ]


def lookup_cases() -> Iterator[LookupCase]:
    for name, geometry, num_tokens, local_hit in lookup_catalog():
        sizes = [num_tokens // geometry.chunk_tokens(g) for g in geometry.groups]
        total = sum(sizes)
        for flat in itertools.product(LOOKUP_STATES, repeat=total):
            states: list[tuple[LookupResult, ...]] = []
            offset = 0
            for size in sizes:
                states.append(tuple(flat[offset : offset + size]))
                offset += size
            yield LookupCase(name, geometry, num_tokens, local_hit, tuple(states))


def lookup_domain() -> str:
    names = ", ".join(name for name, *_ in lookup_catalog())
    return f"every MISS/HIT/HIT_PENDING state of every chunk of {names}"


@_LastCase
def _run_lookup(case: LookupCase, impl: Implementation) -> Any:
    return lookup_complete_chunks(
        impl, case.geometry, case.num_tokens, case.local_hit,
        lambda g, k: case.states[g][k],
    )


@_LastCase
def _contract_answer(case: LookupCase, _impl: Any = None) -> multigroup.ContractAnswer:
    return multigroup.contract_answer(case.geometry, case.num_tokens, case.local_hit,
                                      dict(enumerate(case.states)))


def lookup_loads_only_hit(case: LookupCase, impl: Implementation) -> str | None:
    outcome = _run_lookup(case, impl)
    if outcome.hit_tokens is None or outcome.hit_tokens <= case.local_hit:
        return None
    for g, group in enumerate(case.geometry.groups):
        lo, hi = multigroup.load_range(case.geometry, group, outcome.hit_tokens, case.local_hit)
        for k in range(lo, hi):
            state = case.states[g][k] if k < len(case.states[g]) else None
            if state != HIT:
                shown = "absent (no key)" if state is None else state.name
                crash = "not found in cache" if state in (None, LookupResult.MISS) else "not ready"
                return (
                    f"hit {outcome.hit_tokens} accepted but group {g} must load chunk {k}, "
                    f"which is {shown}: upstream would crash with '{crash}'"
                )
    return None


def lookup_defers_only_in_scope(case: LookupCase, impl: Implementation) -> str | None:
    outcome = _run_lookup(case, impl)
    if outcome.hit_tokens is not None:
        return None
    answer = _contract_answer(case)
    if not answer.pending_in_window:
        return (
            "the lookup deferred, but no chunk read for the best boundary "
            f"{answer.best_present} is pending (and no RETRY was seen)"
        )
    return None


def lookup_is_maximal(case: LookupCase, impl: Implementation) -> str | None:
    outcome = _run_lookup(case, impl)
    if outcome.hit_tokens is None:
        return None
    answer = _contract_answer(case)
    expected = answer.best_present if answer.best_present is not None else case.local_hit
    if outcome.hit_tokens != expected:
        return (
            f"the lookup accepted {outcome.hit_tokens}; "
            f"the largest servable boundary is {expected}"
        )
    return None


def lookup_eagle_peek(case: LookupCase, impl: Implementation) -> str | None:
    outcome = _run_lookup(case, impl)
    hit = outcome.hit_tokens
    for g, group in enumerate(case.geometry.groups):
        if not group.eagle:
            continue
        distinct = len(set(outcome.max_hit_trace))
        if outcome.pops.get(g, 0) > distinct + 1:
            return f"EAGLE group {g} popped {outcome.pops[g]} times for {distinct} boundaries"
        if hit is None or hit <= case.local_hit:
            continue
        _, hi = multigroup.load_range(case.geometry, group, hit, case.local_hit)
        if (g, hi) not in outcome.lookups:
            return f"EAGLE group {g}: the peek chunk {hi} after hit {hit} was never looked up"
        if case.states[g][hi] != HIT:
            return f"EAGLE group {g}: hit {hit} accepted with peek chunk {hi} not HIT"
        if outcome.load_ranges[g][1] > hi:
            return f"EAGLE group {g}: the peek chunk {hi} is in the load set"
    return None


def lookup_converges(case: LookupCase, impl: Implementation) -> str | None:
    try:
        outcome = _run_lookup(case, impl)
    except ConvergenceError as exc:
        return str(exc)
    trace = outcome.max_hit_trace
    if any(b > a for a, b in itertools.pairwise(trace)):
        return f"maxhit grew: {trace}"
    hit = outcome.hit_tokens
    if hit is not None and hit > case.local_hit:
        for g, group in enumerate(case.geometry.groups):
            if not multigroup.group_accepts(
                case.geometry, group, hit, case.local_hit, case.num_tokens,
                lambda k, g=g: case.states[g][k] in (HIT, HIT_PENDING),
            ):
                return f"final hit {hit} is not servable by group {g} (checked only earlier)"
    return None


def _lookup_theorems() -> list[ExhaustiveTheorem]:
    domain = lookup_domain()
    return [
        ExhaustiveTheorem("C2", "lookup-loads-only-hit",
                          "every chunk of every accepted load set was answered HIT",
                          lookup_cases, lookup_loads_only_hit, domain,
                          lambda c: c.to_json(), family="lookup"),
        ExhaustiveTheorem("C3", "lookup-defers-only-in-scope",
                          "the multi-group lookup defers only for a pending chunk it would read",
                          lookup_cases, lookup_defers_only_in_scope, domain,
                          lambda c: c.to_json(), family="lookup"),
        ExhaustiveTheorem("C4", "lookup-is-maximal",
                          "the accepted hit is the largest boundary every group can serve",
                          lookup_cases, lookup_is_maximal, domain,
                          lambda c: c.to_json(), family="lookup"),
        ExhaustiveTheorem("C5", "eagle-peek",
                          "EAGLE: the peek chunk is looked up and HIT, not loaded; "
                          "one pop per boundary",
                          lookup_cases, lookup_eagle_peek, domain,
                          lambda c: c.to_json(), family="lookup"),
        ExhaustiveTheorem("C6", "lookup-converges",
                          "the loop terminates, maxhit never grows, "
                          "the final N is servable by every group",
                          lookup_cases, lookup_converges, domain,
                          lambda c: c.to_json(), family="lookup"),
    ]


# -- store schedules ----------------------------------------------------------------
@dataclass(frozen=True)
class StoreCase:
    geometry_name: str
    geometry: Geometry
    prompt_len: int
    steps: tuple[int, ...]
    """Tokens scheduled per prefill step (they sum to at most the prompt)."""
    ending: str
    """``finished`` (after the whole prompt and ``decode`` tokens) or ``aborted``."""
    decode: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "geometry_name": self.geometry_name,
            "geometry": self.geometry.to_dict(),
            "prompt_len": self.prompt_len,
            "steps": list(self.steps),
            "ending": self.ending,
            "decode": self.decode,
        }


def store_catalog() -> list[tuple[str, Geometry, tuple[int, ...]]]:
    return [
        ("FA36+SWA4(sw16)", Geometry((fa(36), swa(4, 16))), (40, 75, 120)),
        ("FA16+SWA4(sw8,e3)", Geometry((fa(16), swa(4, 8, 3))), (33, 64)),
        ("FA8+SWA4(sw6),bpc2", Geometry((fa(4), swa(4, 6)), blocks_per_chunk=2), (29, 48)),
        ("FA16+SWA4(sw8),retention32",
         Geometry((fa(16), swa(4, 8)), retention_interval=32), (64, 70)),
    ]


def _compositions(total: int, step: int) -> list[tuple[int, ...]]:
    """Prefill schedules: equal steps of ``step`` tokens, plus the one-shot schedule."""
    steps = [step] * (total // step) + ([total % step] if total % step else [])
    return [tuple(steps), (total,)]


def store_cases() -> Iterator[StoreCase]:
    for name, geometry, prompts in store_catalog():
        for prompt in prompts:
            for step in sorted({7, 16, 25, prompt}):
                for steps in _compositions(prompt, step):
                    yield StoreCase(name, geometry, prompt, steps, "finished", decode=3)
                    for cut in range(1, len(steps)):
                        yield StoreCase(name, geometry, prompt, steps[:cut], "aborted")


def simulate_store_case(
    case: StoreCase, impl: Implementation
) -> tuple[list[StoreTracker], list[int], int]:
    """Run the producer; return its trackers, the per-step computed counts, the horizon."""
    trackers = [StoreTracker(impl, case.geometry, g, case.prompt_len)
                for g in range(len(case.geometry.groups))]
    computed = 0
    frontiers = []
    for scheduled in case.steps:
        for tracker in trackers:
            tracker.step("prefilling", computed, scheduled, case.prompt_len)
        frontiers.append(computed)
        computed += scheduled
    if case.ending == "finished":
        for _ in range(case.decode):
            for tracker in trackers:
                tracker.step("decoding", computed, 1, computed + 1)
            computed += 1
        for tracker in trackers:
            tracker.step("finished", computed, 0, computed + 1)
    else:
        for tracker in trackers:
            tracker.step("aborted", computed, 0, computed)
    return trackers, frontiers, computed


_simulated = _LastCase(simulate_store_case)
"""The producer run of a case, shared by the store family's checks."""


def _expected_swa_chunks(case: StoreCase, group_index: int, horizon_tokens: int,
                         frontier_chunks: list[int]) -> set[int]:
    """The chunks a correct producer offers: the mask at the real final horizon, plus
    tails of complete segments already offered under the prompt horizon."""
    geometry = case.geometry
    group = geometry.groups[group_index]
    assert group.sliding_window is not None
    tpc = geometry.chunk_tokens(group)
    block_tokens = geometry.block_tokens(group)
    rule = mask_rule(geometry.alignment_tokens, block_tokens, geometry.retention_interval)
    need = store_need_blocks(group.sliding_window, group.extra_retained_tokens, block_tokens,
                             group.eagle)
    prompt_chunks = min(case.prompt_len, horizon_tokens) // tpc
    final_chunks = horizon_tokens // tpc
    bpc = geometry.blocks_per_chunk
    expected = {
        c for c in range(final_chunks)
        if chunk_is_stored(c, bpc, rule, need, group.eagle, final_chunks * bpc)
    }
    # Chunks stored while prefilling under the prompt horizon stay stored.
    for frontier in frontier_chunks:
        expected |= {
            c for c in range(min(frontier, prompt_chunks))
            if chunk_is_stored(c, bpc, rule, need, group.eagle,
                               (case.prompt_len // tpc) * bpc)
        }
    return expected


def _offer_difference(
    case: StoreCase, impl: Implementation
) -> list[tuple[int, list[int], list[int]]]:
    """Per SWA group: the chunks offered beyond the real horizon's demand, and the
    demanded chunks never offered."""
    trackers, _, computed = _simulated(case, impl)
    differences = []
    for g, group in enumerate(case.geometry.groups):
        if not group.is_swa:
            continue
        tpc = case.geometry.chunk_tokens(group)
        horizon = min(computed, case.prompt_len)
        frontier_chunks = [
            min(sum(case.steps[: i + 1]), case.prompt_len) // tpc for i in range(len(case.steps))
        ]
        expected = _expected_swa_chunks(case, g, horizon, frontier_chunks)
        expected -= trackers[g].unstorable
        offered = trackers[g].offered
        differences.append((g, sorted(offered - expected), sorted(expected - offered)))
    return differences


def store_only_demanded(case: StoreCase, impl: Implementation) -> str | None:
    """C8: every offered chunk is demanded by a boundary a consumer can reach."""
    for g, extra, _ in _offer_difference(case, impl):
        if extra:
            return f"group {g} offered chunks {extra} that no reachable boundary demands"
    return None


def store_horizon(case: StoreCase, impl: Implementation) -> str | None:
    """C9: the union of offers is the mask at the real horizon (no intermediate tails)."""
    for g, extra, missing in _offer_difference(case, impl):
        if extra:
            return f"group {g} offered chunks {extra} that no reachable boundary demands"
        if missing:
            return f"group {g} never offered chunks {missing} the real horizon demands"
    return None


def store_offered_once(case: StoreCase, impl: Implementation) -> str | None:
    """C8: no chunk is offered twice."""
    trackers, _, _ = _simulated(case, impl)
    for g, tracker in enumerate(trackers):
        seen: set[int] = set()
        for step, offer in enumerate(tracker.offers):
            again = seen & set(offer)
            if again:
                return f"group {g} offered chunks {sorted(again)} again at step {step}"
            seen |= set(offer)
    return None


def store_well_formed(case: StoreCase, impl: Implementation) -> str | None:
    """C10: offered chunks are complete, committed, and their blocks are live."""
    trackers, _, computed = _simulated(case, impl)
    for g, tracker in enumerate(trackers):
        tpc = case.geometry.chunk_tokens(case.geometry.groups[g])
        committed = min(computed, case.prompt_len)
        for chunk in tracker.offered:
            if (chunk + 1) * tpc > committed:
                return (
                    f"group {g} offered chunk {chunk} ending at token {(chunk + 1) * tpc}, "
                    f"past the {committed} committed tokens"
                )
    return None


def _store_theorems() -> list[ExhaustiveTheorem]:
    names = ", ".join(name for name, *_ in store_catalog())
    domain = (
        f"chunked-prefill schedules (steps of 7, 16, 25 tokens and one shot), finish after "
        f"3 decode steps or abort after every step, for {names}"
    )
    return [
        ExhaustiveTheorem("C8", "offered-at-most-once", "no chunk is offered twice",
                          store_cases, store_offered_once, domain,
                          lambda c: c.to_json(), family="store"),
        ExhaustiveTheorem("C8", "stores-only-demanded",
                          "every offered chunk is demanded by a reachable boundary",
                          store_cases, store_only_demanded, domain,
                          lambda c: c.to_json(), family="store"),
        ExhaustiveTheorem("C9", "store-horizon",
                          "stores equal the mask at the real horizon: no intermediate final tails",
                          store_cases, store_horizon, domain,
                          lambda c: c.to_json(), family="store"),
        ExhaustiveTheorem("C10", "stores-well-formed",
                          "offered chunks are complete and committed (no final sampled slot)",
                          store_cases, store_well_formed, domain,
                          lambda c: c.to_json(), family="store"),
    ]


def exhaustive_theorems() -> list[ExhaustiveTheorem]:
    return _scan_theorems() + _lookup_theorems() + _store_theorems()


# -- int-only replay helpers (reproducers and pictures: tools/gentests.py, tools/explain.py)
def case_from_json(data: dict[str, Any]) -> ScanCase | LookupCase | StoreCase:
    """Rebuild the case of an exhaustive witness (the inverse of each ``to_json``)."""
    if "initial_window" in data:
        return ScanCase(
            tuple(LookupResult[name] for name in data["states"]),
            int(data["initial_window"]), int(data["window"]),
        )
    geometry = Geometry.from_dict(data["geometry"])
    if "num_tokens" in data:
        states = data["states"]
        return LookupCase(
            str(data.get("geometry_name", "")), geometry, int(data["num_tokens"]),
            int(data["local_hit"]),
            tuple(
                tuple(LookupResult[name] for name in states[str(g)])
                for g in range(len(geometry.groups))
            ),
        )
    return StoreCase(
        str(data.get("geometry_name", "")), geometry, int(data["prompt_len"]),
        tuple(int(s) for s in data["steps"]), str(data["ending"]), int(data.get("decode", 0)),
    )


def store_expected_offers(case: StoreCase, group_index: int) -> set[int]:
    """The chunks a correct producer offers for SWA group ``group_index`` of ``case``
    (C9), before chunks whose blocks were already freed are dropped."""
    computed = sum(case.steps) + (case.decode if case.ending == "finished" else 0)
    tpc = case.geometry.chunk_tokens(case.geometry.groups[group_index])
    horizon = min(computed, case.prompt_len)
    frontier_chunks = [
        min(sum(case.steps[: i + 1]), case.prompt_len) // tpc for i in range(len(case.steps))
    ]
    return _expected_swa_chunks(case, group_index, horizon, frontier_chunks)
