"""Store-schedule properties (C8, C9, C10): the implementation's producer over every
chunked-prefill schedule of a catalogue of prompts, finished after decode steps or
aborted after any step, judged against the spec's store mask at the real horizon
(:mod:`kvcontract.spec.reachability`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvcontract.impl.bundle import Implementation
from kvcontract.impl.scheduler import StoreTracker
from kvcontract.spec.geometry import Geometry, GroupSpec, fa, mamba, swa
from kvcontract.spec.lookup import hashed_tokens
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
    is_count,
    optional_count_field,
)
from kvcontract.spec.reachability import (
    RequestStatus,
    final_segment_end_chunk,
    group_marked_blocks,
    storable_chunks,
    store_replay_boundaries,
    stored_token_count,
)
from kvcontract.spec.retention import skipped_tokens
from kvcontract.vocabulary import Impact

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
    prompt_only: bool = True
    """``offload_prompt_only``: store the prompt only (vLLM's default) or the decoded
    tokens too."""
    start_hit: int = 0
    """Tokens the request found cached (a multiple of every chunk): their chunks are
    never offered, and prefill starts after them."""
    max_offload_tokens: int | None = None
    """The request's ``max_offload_tokens`` (vLLM's offloading connector stores at most
    that many of its first tokens, and its final segment ends there); None: no cap."""

    @property
    def replay_boundaries(self) -> tuple[int, ...]:
        """Where a consumer of this prompt can replay from, by the spec (vLLM's GPU
        replay rule: :func:`kvcontract.spec.reachability.store_replay_boundaries`): what
        the judges expect; the producer under test passes its own."""
        boundaries: tuple[int, ...] = store_replay_boundaries(self.geometry, self.prompt_len)
        return boundaries

    def to_json(self) -> dict[str, Any]:
        return {
            "geometry_name": self.geometry_name,
            "geometry": self.geometry.to_dict(),
            "prompt_len": self.prompt_len,
            "steps": list(self.steps),
            "ending": self.ending,
            "decode": self.decode,
            **fields_set(self, "prompt_only", "start_hit", "max_offload_tokens"),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoreCase:
        geometry = Geometry.from_dict(dict(data["geometry"]))
        prompt_len = data["prompt_len"]
        steps = list(data["steps"])
        decode = data.get("decode", 0)
        for key, value in [("prompt_len", prompt_len), ("decode", decode),
                           *(("steps", s) for s in steps)]:
            if not is_count(value):
                raise ValueError(f"{key} must hold integers >= 0, not {value!r}")
        if data["ending"] not in ENDINGS:
            raise ValueError(f"ending must be one of {ENDINGS}, not {data['ending']!r}")
        prompt_only = data.get("prompt_only", True)
        if not isinstance(prompt_only, bool):
            raise ValueError(f"prompt_only must be true or false, not {prompt_only!r}")
        start_hit = count_field("start_hit", data.get("start_hit", 0))
        cap = optional_count_field("max_offload_tokens", data.get("max_offload_tokens"))
        if start_hit + sum(steps) > prompt_len:
            raise ValueError(f"the hit {start_hit} and the prefill steps {steps} exceed the "
                             f"prompt of {prompt_len}")
        for group in geometry.groups:
            if start_hit % geometry.chunk_tokens(group):
                raise ValueError(f"start_hit {start_hit} is not a multiple of the chunk "
                                 f"({geometry.chunk_tokens(group)} tokens) of {group}")
        return cls(str(data.get("geometry_name", "")), geometry, prompt_len, tuple(steps),
                   str(data["ending"]), decode, prompt_only, start_hit, cap)


def store_catalog() -> list[tuple[str, Geometry, tuple[int, ...], bool, int]]:
    """``(name, geometry, prompt lengths, offload_prompt_only, cached prefix tokens)``."""
    return [
        ("FA36+SWA4(sw16)", Geometry((fa(36), swa(4, 16))), (40, 75, 120), True, 0),
        ("FA16+SWA4(sw8,e3)", Geometry((fa(16), swa(4, 8, 3))), (33, 64), True, 0),
        ("FA8+SWA4(sw6),bpc2", Geometry((fa(4), swa(4, 6)), blocks_per_chunk=2), (29, 48),
         True, 0),
        ("FA16+SWA4(sw8),retention32",
         Geometry((fa(16), swa(4, 8)), retention_interval=32), (64, 70), True, 0),
        # vLLM's default retention (0: only the replay boundary gets a tail), EAGLE
        # groups with segment tails and with a replay boundary, and decoded tokens stored.
        ("FA16+SWA4(sw8),retention0",
         Geometry((fa(16), swa(4, 8)), retention_interval=0), (35, 64), True, 0),
        ("FA16+SWA4(sw8,eagle)", Geometry((fa(16), swa(4, 8, eagle=True))), (33, 64), True,
         0),
        # EAGLE at retention 0: vLLM's GPU replay boundaries (P 25: both are 0, none;
        # P 49: P - 1 aligned, the resend's and the extension's coincide at 32).
        ("FA16+SWA4(sw8,eagle),retention0",
         Geometry((fa(16), swa(4, 8, eagle=True)), retention_interval=0), (25, 35, 49, 64),
         True, 0),
        ("FA16+SWA4(sw8,e3),decoded", Geometry((fa(16), swa(4, 8, 3))), (32, 33), False, 0),
        ("FA16+SWA4(sw8,eagle),decoded", Geometry((fa(16), swa(4, 8, eagle=True))), (31, 32),
         False, 0),
        # A request that found a cached prefix (a consumer continuing a conversation).
        ("FA16+SWA4(sw8),hit32", Geometry((fa(16), swa(4, 8))), (64, 70), True, 32),
        # An EAGLE group whose window is exactly one segment (need == period): every
        # block but the first is demanded by a segment boundary.
        ("FA8+SWA4(sw5,eagle),need=period", Geometry((fa(8), swa(4, 5, eagle=True))),
         (33,), True, 0),
        # EAGLE at chunk granularity (bpc 2) with short windows: segment boundaries at
        # chunk starts, the peek chunk's first block marked (rule (b)) and nothing after it.
        ("FA8+SWA2(sw3,eagle),bpc2", Geometry((fa(8), swa(2, 3, eagle=True)),
                                              blocks_per_chunk=2), (41, 57), True, 0),
        # A Mamba group as vLLM builds it (the base block): it stores every chunk whose
        # state is live, the chunk of the last chunk end before the frontier on.
        ("Mamba8+SWA8(sw12),retention0",
         Geometry((mamba(8), swa(8, 12)), retention_interval=0), (35,), True, 0),
        # No mask: A is not a multiple of the SWA block, or the FA groups disagree (no A).
        ("FA4+SWA8(sw9),store-all", Geometry((fa(4), swa(8, 9))), (33,), True, 0),
        ("FA4+FA8+SWA4(sw8),no-alignment", Geometry((fa(4), fa(8), swa(4, 8))), (33,), True,
         0),
    ]


@dataclass(frozen=True)
class StoreVariation:
    """A catalogue entry that departs from the defaults of :func:`store_catalog`."""

    name: str
    geometry: Geometry
    prompts: tuple[int, ...]
    decode: int = 3
    prompt_only: bool = True
    start_hit: int = 0
    max_offload_tokens: int | None = None
    aborts: bool = True
    """Also abort each schedule after every step (the default)."""


def store_variation_catalog() -> list[StoreVariation]:
    """Producers that use what the plain catalogue leaves at its default."""
    return [
        # max_offload_tokens inside the prompt: nothing past it is stored and the final
        # segment ends there, not at the prompt (vLLM's final boundary is the smaller).
        StoreVariation("FA16+SWA4(sw8),offload41", Geometry((fa(16), swa(4, 8))), (64,),
                       max_offload_tokens=41),
        StoreVariation("FA16+SWA4(sw8,eagle),retention0,offload37",
                       Geometry((fa(16), swa(4, 8, eagle=True)), retention_interval=0),
                       (49,), max_offload_tokens=37),
        # An EAGLE group that stores every chunk, decoded tokens stored, a decode long
        # enough to complete two chunks: each decode step withholds exactly the last
        # complete chunk (volatile), no more and no less.
        StoreVariation("FA4(eagle)+SWA4(sw8),decoded", Geometry((fa(4, eagle=True), swa(4, 8))),
                       (17,), decode=10, prompt_only=False),
        # Chunks of two blocks and a window of 3 + 1 tokens: on an abort mid-chunk the
        # final tail's chunk has its first marked block freed and its second live, so it
        # is never stored (C10: its freed block would be copied).
        StoreVariation("FA8+SWA2(sw3,e1),bpc2", Geometry((fa(8), swa(2, 3, 1)),
                                                         blocks_per_chunk=2), (21,)),
        # Chunks of eight SWA blocks whose window frees six of them in one step: vLLM
        # reallocates some freed ones at once and zeroes them in its connector's table,
        # so a stored chunk holds null pages after live ones (C10 placement; vLLM
        # 0.33.0's jobs shift the window's blocks to lower offsets). Aborted mid-prefill
        # (retention None), the final tail's chunk has its marked blocks freed: the spec
        # never stores it, while vLLM's abort path rewinds below its stored index and
        # copies the chunk from its connector's stale table, blocks already reused for
        # later positions included (C9 waste, C10 on the engine's data trace;
        # docs/vllm-findings.md, "the final tail an abort stores from a stale block
        # table").
        StoreVariation("FA16+SWA4(sw8),bpc8", Geometry((fa(16), swa(4, 8)),
                                                       blocks_per_chunk=8), (136,)),
        # Lookahead block hashes (docs/CONTRACT.md 2.1): an EAGLE group's mask has no peek
        # block, no chunk is held back while decoding, and P - 1 is the only replay
        # boundary.
        StoreVariation("FA16+SWA4(sw8,eagle),retention0,lookahead",
                       Geometry((fa(16), swa(4, 8, eagle=True)), retention_interval=0,
                                hash_lookahead=1), (33, 49)),
        StoreVariation("FA4(eagle)+SWA4(sw8),decoded,lookahead",
                       Geometry((fa(4, eagle=True), swa(4, 8)), hash_lookahead=1),
                       (17,), decode=10, prompt_only=False),
    ]


def _compositions(total: int, step: int) -> list[tuple[int, ...]]:
    """Prefill schedules: equal steps of ``step`` tokens, plus the one-shot schedule."""
    steps = (step,) * (total // step) + ((total % step,) if total % step else ())
    return [steps] if steps == (total,) else [steps, (total,)]


def store_cases() -> Iterator[StoreCase]:
    """Every schedule of :func:`store_catalog`, then of :func:`store_variation_catalog`."""
    entries = [StoreVariation(name, geometry, prompts, prompt_only=prompt_only, start_hit=hit)
               for name, geometry, prompts, prompt_only, hit in store_catalog()]
    for entry in entries + store_variation_catalog():
        hit = entry.start_hit
        for prompt in entry.prompts:
            # Distinct schedules only (the one-shot one is shared by every step size).
            schedules = dict.fromkeys(
                steps for step in (7, 16, 25) for steps in _compositions(prompt - hit, step))
            for steps in schedules:
                yield StoreCase(entry.name, entry.geometry, prompt, steps, "finished",
                                decode=entry.decode, prompt_only=entry.prompt_only,
                                start_hit=hit, max_offload_tokens=entry.max_offload_tokens)
                for cut in range(1, len(steps) if entry.aborts else 1):
                    yield StoreCase(entry.name, entry.geometry, prompt, steps[:cut], "aborted",
                                    prompt_only=entry.prompt_only, start_hit=hit,
                                    max_offload_tokens=entry.max_offload_tokens)


def store_domain() -> str:
    names = ", ".join(name for name, *_ in store_catalog())
    variations = ", ".join(
        f"{v.name} ({v.decode} decode steps"
        + ("" if v.prompt_only else ", decoded tokens stored")
        + ("" if v.max_offload_tokens is None else f", max_offload_tokens {v.max_offload_tokens}")
        + ("" if v.aborts else ", finished only")
        + ")" for v in store_variation_catalog())
    return (
        "the bounded cross-check of the store-step induction (C8/store-steps-offer-once, "
        "C9/store-steps-refine-spec, C10/store-steps-well-formed, every schedule): real "
        "masks, geometries and the tracker's own loop; "
        f"chunked-prefill schedules (steps of 7, 16, 25 tokens and one shot), finish after "
        f"3 decode steps or abort after every step, replay boundaries P - 1 (and, with "
        f"EAGLE, vLLM's GPU replay boundaries) with a retention interval, for {names}; "
        f"the same schedules for {variations}"
    )


@dataclass
class StoreRun:
    """What the producer did on one case: per group, its tracker (offers per step)."""

    trackers: list[StoreTracker]
    next_indices: list[list[int]]
    """Per group, ``next_stored_chunk_idx`` after each step."""
    frontiers: list[int]
    """Computed tokens before each prefill step."""
    computed: int
    """Computed tokens at the end (the real horizon)."""
    integrity: tuple[str, ...] | None = None
    """What a traced run found wrong with the data its store jobs copy (vLLM's engine:
    :mod:`kvcontract.live.judge.stores`: C10 is then judged on the data the jobs copy);
    None where nothing is traced (a model's run: C10 is judged on its block ranges)."""


def simulate_store_case(case: StoreCase, impl: Implementation) -> StoreRun:
    """Run the producer through the case's schedule (:func:`schedule_steps`)."""
    # The implementation decides the replay boundaries it passes to its mask (like
    # upstream's _build_store_jobs); the judges use the spec's (case.replay_boundaries).
    trackers = [StoreTracker(impl, case.geometry, g, case.prompt_len,
                             max_offload_tokens=case.max_offload_tokens,
                             offload_prompt_only=case.prompt_only)
                for g in range(len(case.geometry.groups))]
    for tracker in trackers:
        tracker.mark_computed(case.start_hit // case.geometry.chunk_tokens(tracker.group))
    next_indices: list[list[int]] = [[] for _ in trackers]
    frontiers = []
    for step in schedule_steps(case):
        if step.status == RequestStatus.PREFILLING:
            frontiers.append(step.num_computed)
        for g, tracker in enumerate(trackers):
            tracker.step(step.status, step.num_computed, step.num_scheduled, step.num_tokens)
            next_indices[g].append(tracker.next_stored_chunk_idx)
    steps = schedule_steps(case)
    return StoreRun(trackers, next_indices, frontiers, steps[-1].num_computed)


run_store = LastCase(simulate_store_case)
"""The producer run of a case, shared by the store family's judges."""


STORE_SPACE: CaseSpace[StoreCase, StoreRun] = CaseSpace(
    family=Family.STORE, cases=store_cases, describe=store_domain,
    to_json=StoreCase.to_json, from_json=StoreCase.from_json, observe=run_store,
    geometry_of=lambda case: case.geometry,
    driver="kvcontract's StoreTracker over the bound mask and horizon",
    drivers=("StoreTracker.*",),
)


ENDED = (RequestStatus.FINISHED, RequestStatus.ABORTED)


def step_bounds(
    geometry: Geometry,
    group: GroupSpec,
    status: RequestStatus,
    num_computed: int,
    num_scheduled: int,
    num_tokens: int,
    prompt_len: int,
    prompt_only: bool = True,
    max_offload_tokens: int | None = None,
) -> tuple[int, int | None, int]:
    """``(storable chunks, chunk closing the final segment, first live block)`` of one
    store step of one group, from the spec alone."""
    tpc = geometry.chunk_tokens(group)
    tokens = int(stored_token_count(status, num_computed, num_scheduled, num_tokens,
                                    prompt_len, max_offload_tokens, prompt_only))
    if geometry.hash_lookahead:
        # A block is stored once it is hashed: its lookahead tokens exist (2.1).
        # (The whole prompt is hashed from arrival, whatever the step reports.)
        tokens = min(tokens, int(hashed_tokens(max(num_tokens, prompt_len),
                                               geometry.tokens_per_hash,
                                               geometry.hash_lookahead)))
    storable = int(storable_chunks(tokens, tpc, geometry.drops_eagle_block(group), status))
    prompt_tokens = prompt_len if max_offload_tokens is None else min(prompt_len,
                                                                      max_offload_tokens)
    final = final_segment_end_chunk(status, prompt_tokens // tpc, storable,
                                    geometry.retention_interval)
    first_live = 0
    if group.is_swa:
        assert group.sliding_window is not None
        skipped = skipped_tokens(num_computed, group.sliding_window,
                                 group.extra_retained_tokens)
        first_live = int(skipped) // geometry.block_tokens(group)
    return storable, None if final is None else int(final), first_live


def spec_step_offers(
    geometry: Geometry,
    group_index: int,
    status: RequestStatus,
    num_computed: int,
    num_scheduled: int,
    num_tokens: int,
    prompt_len: int,
    offered_before: set[int],
    next_before: int,
    prompt_only: bool = True,
    replay_boundaries: Sequence[int] = (),
    max_offload_tokens: int | None = None,
) -> tuple[list[int], int]:
    """The spec of one store step of one group: the chunks a correct producer offers to
    ``prepare_store`` (ascending) and its stored-chunk index after the step.

    Everything comes from the spec (:mod:`kvcontract.spec.reachability`,
    :mod:`kvcontract.spec.retention`): the tokens that may be stored this step, the
    complete (and, for EAGLE while decoding, non-volatile) chunks, the horizon that
    closes the final segment (the prompt's while prefilling: no intermediate final tail,
    C9), the mask, and the blocks still live at ``num_computed`` (a chunk whose first
    marked block was freed is never stored, C10). Chunks offered before are never
    offered again (C8); while running, only chunks past the stored index are candidates;
    on finish or abort every complete chunk not yet offered is.
    """
    group = geometry.groups[group_index]
    storable, final_chunk, first_live = step_bounds(
        geometry, group, status, num_computed, num_scheduled, num_tokens, prompt_len,
        prompt_only, max_offload_tokens,
    )
    candidates = range(storable) if status in ENDED else range(next_before, storable)
    chosen = []
    for chunk in candidates:
        if chunk in offered_before:
            continue
        marked = group_marked_blocks(geometry, group, chunk, final_chunk, replay_boundaries)
        if marked and min(marked) >= first_live:
            chosen.append(chunk)
    return chosen, max(next_before, storable)


@dataclass(frozen=True)
class StoreStep:
    """One step of a case's schedule, as the producer sees it."""

    status: RequestStatus
    num_computed: int
    num_scheduled: int
    num_tokens: int


def schedule_steps(case: StoreCase) -> list[StoreStep]:
    """The case's steps: prefill steps, then decode steps and finish, or abort."""
    steps = []
    computed = case.start_hit
    for scheduled in case.steps:
        steps.append(StoreStep(RequestStatus.PREFILLING, computed, scheduled, case.prompt_len))
        computed += scheduled
    if case.ending == "finished":
        for _ in range(case.decode):
            steps.append(StoreStep(RequestStatus.DECODING, computed, 1, computed + 1))
            computed += 1
        steps.append(StoreStep(RequestStatus.FINISHED, computed, 0, computed + 1))
    else:
        steps.append(StoreStep(RequestStatus.ABORTED, computed, 0, computed))
    return steps


def spec_offers(case: StoreCase, group_index: int) -> list[list[int]]:
    """What a correct producer offers for one group, step by step (the spec's run)."""
    return _spec_run(case, group_index)[0]


def _spec_run(case: StoreCase, group_index: int) -> tuple[list[list[int]], list[int]]:
    """The spec's run of one group: offers and stored index after each step (computed
    once per case for all groups: every store judge reads it)."""
    run: tuple[list[list[int]], list[int]] = _spec_runs(case)[group_index]
    return run


def _spec_runs_of(case: StoreCase, _impl: Any = None) -> list[tuple[list[list[int]], list[int]]]:
    return [_spec_group_run(case, g) for g in range(len(case.geometry.groups))]


_spec_runs: LastCase[StoreCase, list[tuple[list[list[int]], list[int]]]] = LastCase(
    _spec_runs_of
)


def _spec_group_run(case: StoreCase, group_index: int) -> tuple[list[list[int]], list[int]]:
    """The spec's run of one group, step after step (:func:`spec_step_offers`)."""
    cached = case.start_hit // case.geometry.chunk_tokens(case.geometry.groups[group_index])
    offered: set[int] = set(range(cached))  # chunks of a hit are never offered
    next_index = cached
    per_step = []
    indices = []
    for step in schedule_steps(case):
        chosen, next_index = spec_step_offers(
            case.geometry, group_index, step.status, step.num_computed, step.num_scheduled,
            step.num_tokens, case.prompt_len, offered, next_index, case.prompt_only,
            case.replay_boundaries, case.max_offload_tokens,
        )
        offered.update(chosen)
        per_step.append(chosen)
        indices.append(next_index)
    return per_step, indices


def store_expected_offers(case: StoreCase, group_index: int) -> set[int]:
    """The chunks a correct producer offers for group ``group_index`` of ``case``."""
    return {c for step in spec_offers(case, group_index) for c in step}


def offered_chunks(tracker: StoreTracker) -> set[int]:
    """What the producer offered to ``prepare_store`` (its per-step offers; chunks of a
    cached prefix that it merely marked as computed are not offers)."""
    return {c for offer in tracker.offers for c in offer}


def _offer_difference(case: StoreCase, run: StoreRun) -> list[tuple[int, list[int], list[int]]]:
    """Per group: the chunks the implementation offered that the spec does not, and the
    chunks the spec offers that the implementation never did. The expectation is the
    spec's own run (nothing the implementation says about itself, such as which chunks
    it found unstorable, is taken on trust)."""
    differences = []
    for g in range(len(case.geometry.groups)):
        expected = store_expected_offers(case, g)
        offered = offered_chunks(run.trackers[g])
        differences.append((g, sorted(offered - expected), sorted(expected - offered)))
    return differences


def stores_only_demanded(case: StoreCase, run: StoreRun) -> str | None:
    """C8: every offered chunk is demanded by a boundary a consumer can reach."""
    for g, extra, _ in _offer_difference(case, run):
        if extra:
            return f"group {g} offered chunks {extra} that no reachable boundary demands"
    return None


def store_horizon(case: StoreCase, run: StoreRun) -> str | None:
    """C9: the union of offers is the mask at the real horizon (no intermediate tails).
    A chunk too few is a consumer's lost hit (reported first: it costs more); a chunk
    too many wastes memory."""
    differences = _offer_difference(case, run)
    for g, extra, missing in differences:
        if missing:
            also = f" (and offered {extra}, which none demands)" if extra else ""
            found: str = Violation(
                f"group {g} never offered chunks {missing} the real horizon demands{also}",
                Impact.LOST_HIT)
            return found
    for g, extra, _ in differences:
        if extra:
            found = Violation(
                f"group {g} offered chunks {extra} that no reachable boundary demands",
                Impact.WASTE)
            return found
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
    """C10: offered chunks are complete and committed, and every block of an offered
    chunk that the mask marks is still live (not freed) at the step that offers it; on a
    traced run (vLLM's engine), every store job copies what its chunks' positions hold."""
    if run.integrity is not None:
        # What the copies hold, traced on vLLM's engine: a freed block whose content is
        # intact when copied is not corrupt; what the model's block ranges can only
        # suspect is measured. A finding the trace graded keeps its impact (a wrong
        # block in a slot the mask does not mark is waste: no load reads it), any other
        # is corruption; the worst is reported.
        if not run.integrity:
            return None
        graded = [f if isinstance(f, Violation) else Violation(f, Impact.CORRUPTION)
                  for f in run.integrity]
        traced: str = min(graded, key=lambda f: list(Impact).index(f.impact))
        return traced
    steps = schedule_steps(case)
    for g, tracker in enumerate(run.trackers):
        group = case.geometry.groups[g]
        tpc = case.geometry.chunk_tokens(group)
        committed = min(run.computed, case.prompt_len) if case.prompt_only else run.computed
        what = "committed tokens"
        if case.max_offload_tokens is not None and case.max_offload_tokens < committed:
            committed, what = case.max_offload_tokens, "tokens max_offload_tokens allows"
        for chunk in offered_chunks(tracker):
            if (chunk + 1) * tpc > committed:
                return (
                    f"group {g} offered chunk {chunk} ending at token {(chunk + 1) * tpc}, "
                    f"past the {committed} {what}"
                )
        for index, (step, offer) in enumerate(zip(steps, tracker.offers, strict=False)):
            _, final, live_from = step_bounds(
                case.geometry, group, step.status, step.num_computed, step.num_scheduled,
                step.num_tokens, case.prompt_len, case.prompt_only, case.max_offload_tokens,
            )
            for chunk in offer:
                # The marked blocks are the ones copied; an unmarked chunk is waste (C8).
                marked = group_marked_blocks(case.geometry, group, chunk, final,
                                             case.replay_boundaries)
                if marked and min(marked) < live_from:
                    return (f"group {g} offered chunk {chunk} at step {index} with block "
                            f"{min(marked)} already freed (blocks are live from "
                            f"{live_from})")
    return None


def stores_placed(case: StoreCase, run: StoreRun) -> str | None:
    """C10 placement: every live block of a chunk a store job stores that the mask marks
    is written (a load of the chunk reads it), and every live block written lands in its
    own CPU chunk at its own offset (``block mod bpc``), null pages before it or not.
    Read off each
    step's job as laid into its chunks (``placements``: the model's tracker through the
    implementation's ``store_block_slot``; on vLLM, its store jobs' block ids, group sizes
    and block indices laid as its CPU worker lays them)."""
    bpc = case.geometry.blocks_per_chunk
    steps = schedule_steps(case)
    for g, tracker in enumerate(run.trackers):
        group = case.geometry.groups[g]
        for index, placed in enumerate(tracker.placements):
            for chunk, page, block in placed:
                if block >= 0 and block != chunk * bpc + page:
                    found: str = Violation(
                        f"group {g}: the store job of step {index} writes block {block} "
                        f"(chunk {block // bpc}, offset {block % bpc}) into chunk {chunk} at "
                        f"offset {page}: a load of chunk {chunk} reads it in place of "
                        f"block {chunk * bpc + page}", Impact.CORRUPTION)
                    return found
            if index >= len(steps) or index >= len(tracker.offers):
                continue
            # Every live block of a stored chunk that the mask marks is written: a load
            # of the chunk reads it (an unmarked one no load reads; a freed marked one is
            # stores_well_formed's finding; a slot written with bytes of unknown origin
            # is the data trace's question, not a left-out block).
            step = steps[index]
            _, final, live_from = step_bounds(
                case.geometry, group, step.status, step.num_computed, step.num_scheduled,
                step.num_tokens, case.prompt_len, case.prompt_only, case.max_offload_tokens)
            written = {(chunk, page) for chunk, page, _ in placed}
            for chunk in sorted(set(tracker.offers[index])):
                left_out = [b for b in group_marked_blocks(case.geometry, group, chunk, final,
                                                           case.replay_boundaries)
                            if b >= live_from and (chunk, b % bpc) not in written]
                if left_out:
                    found = Violation(
                        f"group {g}: the store job of step {index} stores chunk {chunk} "
                        f"without block {left_out[0]}, which its mask marks: a load of chunk "
                        f"{chunk} reads offset {left_out[0] % bpc} unwritten",
                        Impact.CORRUPTION)
                    return found
    return None


def store_steps(case: StoreCase, run: StoreRun) -> str | None:
    """C9, step by step: each step offers exactly the chunks the spec's step offers, and
    the stored index after it is the spec's (it never moves back). An offer earlier than
    the spec allows stores a chunk that is not final yet (an EAGLE group's volatile last
    chunk while decoding): corruption; a later one delays the hit; a missing one loses it.
    """
    steps = schedule_steps(case)
    for g, tracker in enumerate(run.trackers):
        want_offers, want_indices = _spec_run(case, g)
        for index, step in enumerate(steps):
            got = tracker.offers[index] if index < len(tracker.offers) else []
            want = want_offers[index]
            if sorted(got) != sorted(want):
                early = sorted(set(got) - set(want))
                later = {c for offers in want_offers[index + 1:] for c in offers}
                impact = (Impact.CORRUPTION if early and set(early) <= later
                          else Impact.WASTE if early else Impact.LOST_HIT)
                found: str = Violation(
                    f"group {g} offered {sorted(got)} at step {index} ({step.status.value}, "
                    f"{step.num_computed}+{step.num_scheduled} tokens); the spec's step offers "
                    f"{sorted(want)}", impact)
                return found
            got_index = run.next_indices[g][index]
            if got_index != want_indices[index]:
                found = Violation(
                    f"group {g}: next_stored_chunk_idx is {got_index} after step {index}, "
                    f"the spec's is {want_indices[index]}", Impact.LOST_HIT)
                return found
    return None


def picture(case: StoreCase, impl: Implementation) -> Picture:
    """What the spec stores per group; offending: offered but not stored by the spec,
    stored by the spec but never offered, or offered twice."""
    run = run_store(case, impl)
    stored: dict[int, set[int]] = {}
    offending: dict[int, set[int]] = {}
    notes = [f"prefill steps {list(case.steps)}, then {case.ending}"]
    for g in range(len(case.geometry.groups)):
        tracker = run.trackers[g]
        expected = store_expected_offers(case, g)
        stored[g] = expected
        wrong = offered_chunks(tracker) ^ expected
        seen: set[int] = set()
        for offer in tracker.offers:
            wrong |= seen & set(offer)
            seen |= set(offer)
        if wrong:
            offending[g] = wrong
            notes.append(f"group {g}: the implementation offered "
                         f"{sorted(offered_chunks(tracker))}, "
                         f"the spec stores {sorted(expected)}")
    return Picture(case.geometry, case.prompt_len, None, 0, stored=stored,
                   offending=offending, notes=notes)


STORE_FUNCTIONS: tuple[str, ...] = (
    "store_replay_boundaries", "is_block_reachable", "store_final_segment_end",
    "get_num_skipped_tokens", "store_step_bounds", "store_chunk_offered",
    "get_num_offloadable_tokens",
)
"""The store-schedule properties run the producer (the replay boundaries it passes to
its mask, the mask, the horizon, the first live block; then the tracker's step, whose
decisions are the implementation's: last, so a variant's step is located there only
when none of the others differs)."""


def store_properties() -> list[CaseProperty]:
    def make(clause: str, name: str, description: str, judge: Any,
             uses: tuple[str, ...] = STORE_FUNCTIONS) -> CaseProperty:
        return CaseProperty(clause, name, description, STORE_SPACE, judge, uses,
                            picture, observable_on=frozenset({Observer.UPSTREAM_STORE_PATH}))

    return [
        make("C8", "offered-at-most-once", "no chunk is offered twice", offered_at_most_once),
        make("C8", "stores-only-demanded",
             "every offered chunk is demanded by a reachable boundary", stores_only_demanded),
        make("C9", "store-horizon",
             "stores equal the mask at the real horizon: no intermediate final tails",
             store_horizon),
        make("C9", "store-steps",
             "each step offers exactly the spec's step, and the stored index follows it",
             store_steps),
        make("C10", "stores-well-formed",
             "offered chunks are complete and committed (no final sampled slot)",
             stores_well_formed),
        make("C10", "stores-placed",
             "every live block of a store job lands in its own CPU chunk at its own offset "
             "(block mod bpc)", stores_placed, ("store_block_slot", *STORE_FUNCTIONS)),
    ]
