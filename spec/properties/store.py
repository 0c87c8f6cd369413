"""Store-schedule properties (C8, C9, C10): the implementation's producer over every
chunked-prefill schedule of a catalogue of prompts, finished after decode steps or
aborted after any step, judged against the spec's store mask at the real horizon
(:mod:`kvcontract.spec.reachability`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.scheduler import StoreTracker
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.properties.base import CaseProperty, CaseSpace, LastCase, Picture
from kvcontract.spec.reachability import RequestStatus, chunk_is_stored, mask_rule, store_need_blocks

ENDINGS = ("finished", "aborted")


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoreCase:
        geometry = Geometry.from_dict(dict(data["geometry"]))
        prompt_len = data["prompt_len"]
        steps = list(data["steps"])
        decode = data.get("decode", 0)
        for key, value in [("prompt_len", prompt_len), ("decode", decode),
                           *(("steps", s) for s in steps)]:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{key} must hold integers >= 0, not {value!r}")
        if sum(steps) > prompt_len:
            raise ValueError(f"the prefill steps {steps} exceed the prompt of {prompt_len}")
        if data["ending"] not in ENDINGS:
            raise ValueError(f"ending must be one of {ENDINGS}, not {data['ending']!r}")
        return cls(str(data.get("geometry_name", "")), geometry, prompt_len, tuple(steps),
                   str(data["ending"]), decode)


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


def store_domain() -> str:
    names = ", ".join(name for name, *_ in store_catalog())
    return (
        f"chunked-prefill schedules (steps of 7, 16, 25 tokens and one shot), finish after "
        f"3 decode steps or abort after every step, for {names}"
    )


@dataclass
class StoreRun:
    """What the producer did on one case: per group, its tracker (offers per step)."""

    trackers: list[StoreTracker]
    frontiers: list[int]
    """Computed tokens before each prefill step."""
    computed: int
    """Computed tokens at the end (the real horizon)."""


def simulate_store_case(case: StoreCase, impl: Implementation) -> StoreRun:
    """Run the producer through the case's schedule, finish or abort."""
    trackers = [StoreTracker(impl, case.geometry, g, case.prompt_len)
                for g in range(len(case.geometry.groups))]
    computed = 0
    frontiers = []
    for scheduled in case.steps:
        for tracker in trackers:
            tracker.step(RequestStatus.PREFILLING, computed, scheduled, case.prompt_len)
        frontiers.append(computed)
        computed += scheduled
    if case.ending == "finished":
        for _ in range(case.decode):
            for tracker in trackers:
                tracker.step(RequestStatus.DECODING, computed, 1, computed + 1)
            computed += 1
        for tracker in trackers:
            tracker.step(RequestStatus.FINISHED, computed, 0, computed + 1)
    else:
        for tracker in trackers:
            tracker.step(RequestStatus.ABORTED, computed, 0, computed)
    return StoreRun(trackers, frontiers, computed)


run_store = LastCase(simulate_store_case)
"""The producer run of a case, shared by the store family's judges."""


STORE_SPACE: CaseSpace[StoreCase, StoreRun] = CaseSpace(
    family="store", cases=store_cases, describe=store_domain,
    to_json=StoreCase.to_json, from_json=StoreCase.from_json, observe=run_store,
)


def _expected_swa_chunks(case: StoreCase, group_index: int, horizon_tokens: int,
                         frontier_chunks: list[int]) -> set[int]:
    """The chunks a correct producer offers: the mask at the real final horizon, plus
    tails of complete segments already offered under the prompt horizon."""
    geometry = case.geometry
    group = geometry.groups[group_index]
    assert group.sliding_window is not None
    block_tokens = geometry.block_tokens(group)
    tpc = geometry.chunk_tokens(group)
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


def _offer_difference(case: StoreCase, run: StoreRun) -> list[tuple[int, list[int], list[int]]]:
    """Per SWA group: the chunks offered beyond the real horizon's demand, and the
    demanded chunks never offered."""
    differences = []
    for g, group in enumerate(case.geometry.groups):
        if not group.is_swa:
            continue
        expected = store_expected_offers(case, g) - run.trackers[g].unstorable
        offered = run.trackers[g].offered
        differences.append((g, sorted(offered - expected), sorted(expected - offered)))
    return differences


def stores_only_demanded(case: StoreCase, run: StoreRun) -> str | None:
    """C8: every offered chunk is demanded by a boundary a consumer can reach."""
    for g, extra, _ in _offer_difference(case, run):
        if extra:
            return f"group {g} offered chunks {extra} that no reachable boundary demands"
    return None


def store_horizon(case: StoreCase, run: StoreRun) -> str | None:
    """C9: the union of offers is the mask at the real horizon (no intermediate tails)."""
    for g, extra, missing in _offer_difference(case, run):
        if extra:
            return f"group {g} offered chunks {extra} that no reachable boundary demands"
        if missing:
            return f"group {g} never offered chunks {missing} the real horizon demands"
    return None


def offered_at_most_once(case: StoreCase, run: StoreRun) -> str | None:
    """C8: no chunk is offered twice."""
    for g, tracker in enumerate(run.trackers):
        seen: set[int] = set()
        for step, offer in enumerate(tracker.offers):
            again = seen & set(offer)
            if again:
                return f"group {g} offered chunks {sorted(again)} again at step {step}"
            seen |= set(offer)
    return None


def stores_well_formed(case: StoreCase, run: StoreRun) -> str | None:
    """C10: offered chunks are complete and committed."""
    for g, tracker in enumerate(run.trackers):
        tpc = case.geometry.chunk_tokens(case.geometry.groups[g])
        committed = min(run.computed, case.prompt_len)
        for chunk in tracker.offered:
            if (chunk + 1) * tpc > committed:
                return (
                    f"group {g} offered chunk {chunk} ending at token {(chunk + 1) * tpc}, "
                    f"past the {committed} committed tokens"
                )
    return None


def picture(case: StoreCase, impl: Implementation) -> Picture:
    """What the spec stores per group; offending: offered but not stored by the spec,
    stored by the spec but never offered, or offered twice."""
    run = run_store(case, impl)
    stored: dict[int, set[int]] = {}
    offending: dict[int, set[int]] = {}
    notes = [f"prefill steps {list(case.steps)}, then {case.ending}"]
    for g, group in enumerate(case.geometry.groups):
        tracker = run.trackers[g]
        if not group.is_swa:
            stored[g] = set(tracker.offered)
            continue
        expected = store_expected_offers(case, g) - tracker.unstorable
        stored[g] = expected
        wrong = tracker.offered ^ expected
        seen: set[int] = set()
        for offer in tracker.offers:
            wrong |= seen & set(offer)
            seen |= set(offer)
        if wrong:
            offending[g] = wrong
            notes.append(f"group {g}: the implementation offered {sorted(tracker.offered)}, "
                         f"the spec stores {sorted(expected)}")
    return Picture(case.geometry, case.prompt_len, None, 0, stored=stored,
                   offending=offending, notes=notes)


STORE_FUNCTIONS: tuple[str, ...] = (
    "is_block_reachable", "store_final_segment_end", "get_num_skipped_tokens",
)
"""The store-schedule properties run the producer (mask, horizon, first live block)."""


def store_properties() -> list[CaseProperty]:
    def make(clause: str, name: str, description: str, judge: Any) -> CaseProperty:
        return CaseProperty(clause, name, description, STORE_SPACE, judge, STORE_FUNCTIONS,
                            picture)

    return [
        make("C8", "offered-at-most-once", "no chunk is offered twice", offered_at_most_once),
        make("C8", "stores-only-demanded",
             "every offered chunk is demanded by a reachable boundary", stores_only_demanded),
        make("C9", "store-horizon",
             "stores equal the mask at the real horizon: no intermediate final tails",
             store_horizon),
        make("C10", "stores-well-formed",
             "offered chunks are complete and committed (no final sampled slot)",
             stores_well_formed),
    ]
