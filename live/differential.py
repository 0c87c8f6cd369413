"""kvcontract's executable model of vLLM against the live engine, on one fuzz program.

Contract: :func:`compare_program` runs one program (the fuzzer's operations) on two
systems in lockstep: kvcontract's executable system
(:class:`~kvcontract.impl.system.engine.OffloadSystem`, running the implementation under
test, normally ``upstream-current``: kvcontract's model of vLLM 0.33.0), given by the
caller with the function that applies an operation to it, and a
:class:`~kvcontract.live.session.LiveSession` on vLLM's own scheduler. Per request, it
compares what each side decided: the accepted hits (GPU prefix hit plus offloaded hit,
one per admission), the load sets (chunk ranges per geometry group, one per load) and
the store offers (chunks per geometry group, all steps together), and whether a load
crashed. A difference is a :class:`ModelGap`: a finding about **kvcontract's model of
vLLM**, never a contract violation of vLLM. Each gap is put in a named class
(:data:`GAP_CLASSES`, :func:`classify`) when the program shows the cause; otherwise it
is ``unexplained``.

A geometry the live backend or vLLM will not build is ``refused``; where vLLM's verdict
and :func:`kvcontract.spec.build.buildable` disagree, that disagreement is itself a gap
(class ``buildable``). A program operation without a faithful live equivalent makes the
program ``not-replayable`` with the reason
(:class:`~kvcontract.live.session.NotReplayableError`), never a silent skip; so does a
gap of kvcontract's live driver (:mod:`kvcontract.live.gaps`: the driver did not fit
the installed vLLM's API), which is never a model gap nor a crash of vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcontract.impl.system.engine import OffloadSystem
from kvcontract.impl.system.events import Event, LoadCrashEvent, LoadEvent, LookupEvent, StoreEvent
from kvcontract.live.build import BuildOptions, Refused
from kvcontract.live.capabilities import has
from kvcontract.live.observation import LiveObservation
from kvcontract.live.session import LiveSession, NotReplayableError
from kvcontract.live.worker import Timing
from kvcontract.spec.build import buildable
from kvcontract.spec.geometry import Geometry
from kvcontract.spec.reachability import group_mask
from kvcontract.vocabulary import GroupKind

Op = tuple[Any, ...]

ASPECTS = ("hits", "loads", "offers", "crash")
"""What is compared per request."""

OUTCOMES = ("agreed", "disagreed", "refused", "not-replayable")

GAP_CLASSES: dict[str, str] = {
    "buildable": "spec.build.buildable and vLLM disagree on whether the geometry builds "
                 "(a gap in kvcontract's planning model)",
    "failed-store": "the installed release has no failed store (0.33.0: its worker reports "
                    "a job done or not at all): the live worker never reports the failed "
                    "job (its chunks stay HIT_PENDING), the executable system drops the "
                    "chunks (absent)",
    "gpu-prefix-hit": "the request's GPU prefix hit L differs: the executable system's "
                      "GPU prefix-hit rule and block pool are not vLLM's KV-cache manager "
                      "(docs/CONTRACT.md 12 lists the rule as a departure), so the hit, the "
                      "loads and the offers past L differ",
    "mamba-checkpoints": "only Mamba groups' offers differ: vLLM's scheduler (Mamba align "
                         "mode) ends prefill steps on checkpoint boundaries and keeps a "
                         "state only there, the executable system keeps one at every "
                         "chunk end its steps pass",
    "hit-chunk-offers": "the offers differ only below the chunk end at or after the hit: "
                        "after a load vLLM resumes storing at cdiv(hit, tpc) (the chunk "
                        "the hit ends in was loaded whole), after a GPU-only hit at chunk "
                        "0 (next_stored_chunk_idx moves only on a load); the executable "
                        "system resumes at hit // tpc in both cases (offers of chunks the "
                        "hit covers: where the CPU tier holds them, prepare_store stores "
                        "nothing new)",
    "deferral-deadline": "the executable system stopped deferring the request at its C13 "
                         "deadline (SystemConfig.deferral_bound) and decided over the ready "
                         "chunks; vLLM 0.33.0 keeps deferring while a chunk it needs is "
                         "pending or being loaded",
    "admission": "vLLM never looked the request up: its scheduler admits waiting requests "
                 "only while the step's token budget lasts, the executable system looks "
                 "up every waiting request at each step whatever the budget",
    "sub-chunk-hit": "a gap in kvcontract's model of vLLM's lookup: vLLM's "
                     "_lookup_complete_chunks answers 0 when the hit past the GPU hit L "
                     "is shorter than a chunk of a group it visits; kvcontract's lookup "
                     "(impl.scheduler.lookup_complete_chunks over upstream-current) has no "
                     "such rule and loads the sub-chunk hit",
    "sliding-recheck-only": "vLLM took an offloaded hit shorter than a full-attention "
                            "chunk past L: after a sliding-window group (here an EAGLE "
                            "pop) shrinks the boundary, vLLM's _lookup_complete_chunks "
                            "re-checks only its sliding-window groups, so the "
                            "full-attention groups' at-least-a-chunk rule is not applied "
                            "again; kvcontract's lookup re-checks every group and answers "
                            "less",
    "eagle-store-all": "a gap in kvcontract's model of vLLM's store mask: for an EAGLE "
                       "group whose needed history fills a segment exactly (need = "
                       "cdiv(sw + e - 1, B) + 1 = period, e.g. sw 8 + e 2 or 3 in blocks "
                       "of 4 under A = 16), vLLM's SlidingWindowManager.reachable_block_mask "
                       "stores every block (need >= per_segment), block 0 too; "
                       "kvcontract's mask (upstream-current, the reference's "
                       "is_block_reachable) stores all only from need >= period + 1 and "
                       "leaves block 0 out, which at bpc 1 is chunk 0: the request, with "
                       "the same hits on both sides, is offered chunk 0 by vLLM alone",
    "mtp-mamba-prefill-stall": "vLLM's own stall, not a gap of the model: with a Mamba "
                               "group in align mode and a multi-module MTP drafter (k = "
                               "e + 1 lookahead tokens), Scheduler._mamba_block_aligned_split "
                               "ends the prefill chunk at the last Mamba block boundary B "
                               "before the prompt end P, and when 0 < P - B < k "
                               "_reserve_prefill_lookahead (never end a chunk within k "
                               "tokens of the prefill end) cuts it back to P - k; from "
                               "there the split's only end is B, which the reservation "
                               "cuts to 0 tokens, every step: the request stays RUNNING "
                               "at P - k and never finishes its prefill, so what it "
                               "stores and what later requests find differ",
    "junction-registration": "the request's shared-prefix junctions differ, its "
                             "connectors registered the same ones, and only its "
                             "sliding-window groups' offers differ: vLLM's KV-cache manager "
                             "also registers a junction from the GPU prefix cache at "
                             "admission (get_computed_blocks), which the executable system "
                             "does not model (it registers the connector's, after a "
                             "lookup: docs/CONTRACT.md 9.3), and the store path stores for "
                             "it; the connector's own rule is judged on vLLM directly "
                             "(C12/upstream-junction-registered-exact, the monitor's "
                             "C12/junction-registered)",
    "tier-capacity": "the CPU tier filled up (a capacity of a few chunks): vLLM's "
                     "CPUOffloadingManager takes or refuses a store job for every group at "
                     "once and evicts by its own LRU, the executable system's manager takes "
                     "each group's offer apart, so which chunks stay, and what later "
                     "requests find, differ",
    "follows-earlier-gap": "an earlier request of the program already differs (what it "
                           "stored, or when it finished), so what this one finds differs",
    "unexplained": "no class of the program explains it",
}
"""The classes of disagreement between kvcontract's model and vLLM (docs/usage.md and
docs/vllm-findings.md explain each)."""


@dataclass
class RequestDecisions:
    """What one system decided for one request."""

    hits: list[int] = field(default_factory=list)
    """Accepted hits (tokens reused: local plus offloaded), one per admission."""
    loads: list[dict[int, tuple[int, int]]] = field(default_factory=list)
    """Per load, the ``[lo, hi)`` chunk range per geometry group (empty ones left out)."""
    offers: dict[int, set[int]] = field(default_factory=dict)
    """Per geometry group, every chunk offered to the manager's ``prepare_store``."""
    crashed: bool = False
    local_hits: list[int] = field(default_factory=list)
    """The GPU prefix hit ``L`` of each admission (classification only, not compared)."""
    lookups: int = 0
    """Lookups made for it, deferred ones included (classification only)."""
    computed: int | None = None
    """Tokens it had computed at the end, None where unknown (classification only)."""
    finished: bool = True
    """It ended (finished or aborted) by the end of the program (classification only)."""
    junctions: set[int] = field(default_factory=set)
    """Every non-zero shared-prefix junction it registered (classification only; the
    model's: its lookups', from ``LookupEvent.junction``)."""
    connector_junctions: set[int] | None = None
    """Those its offloading connector registered (live only, classification only; None
    where unobserved: the model's are all its connector's)."""

    def aspect(self, name: str) -> Any:
        """The compared value of ``name`` (one of :data:`ASPECTS`), plain data."""
        if name == "hits":
            return _collapse(self.hits)
        if name == "loads":
            return _collapse([{g: list(r) for g, r in sorted(d.items())} for d in self.loads])
        if name == "offers":
            return {g: sorted(c) for g, c in sorted(self.offers.items()) if c}
        return self.crashed


def _collapse(values: list[Any]) -> list[Any]:
    """Consecutive repeats dropped: vLLM asks its connector again when a request it
    matched could not be scheduled, the executable system admits it at once."""
    out: list[Any] = []
    for value in values:
        if not out or out[-1] != value:
            out.append(value)
    return out


class ModelRecorder:
    """The decisions of an :class:`OffloadSystem`, from its events."""

    def __init__(self, system: OffloadSystem) -> None:
        self.requests: dict[str, RequestDecisions] = {}
        system.subscribe(self)

    def _of(self, request: str) -> RequestDecisions:
        return self.requests.setdefault(request, RequestDecisions())

    def __call__(self, event: Event) -> None:
        if isinstance(event, LookupEvent):
            self._of(event.request).lookups += 1
        if isinstance(event, LookupEvent) and event.hit is not None:
            self._of(event.request).hits.append(event.hit)
            self._of(event.request).local_hits.append(event.local_hit)
            if event.junction:
                self._of(event.request).junctions.add(event.junction)
        elif isinstance(event, LoadEvent):
            self._of(event.request).loads.append(
                {g: r for g, r in event.load_ranges if r[1] > r[0]})
        elif isinstance(event, LoadCrashEvent):
            self._of(event.request).crashed = True
        elif isinstance(event, StoreEvent) and event.offered:
            self._of(event.request).offers.setdefault(event.group, set()).update(
                event.offered)


def live_decisions(observation: LiveObservation) -> dict[str, RequestDecisions]:
    """The same decisions read from a live observation."""
    requests: dict[str, RequestDecisions] = {
        name: RequestDecisions() for name in observation.requests}

    def of(name: str) -> RequestDecisions:
        return requests.setdefault(name, RequestDecisions())

    for match in observation.matches:
        of(match.request).lookups += 1
        if match.external is not None:
            of(match.request).hits.append(match.local_hit + match.external)
            of(match.request).local_hits.append(match.local_hit)
    for load in observation.loads:
        of(load.request).loads.append(load.ranges())
    for offer in observation.stores:
        for g, chunks in offer.offered.items():
            of(offer.request).offers.setdefault(g, set()).update(chunks)
    for name, outcome in observation.requests.items():
        of(name).computed = outcome.num_computed
        of(name).finished = str(outcome.status or "").startswith("FINISHED")
        of(name).junctions = set(outcome.junctions)
        of(name).connector_junctions = set(outcome.connector_junctions)
    if observation.exceptions:
        for name, outcome in observation.requests.items():
            if outcome.status not in ("FINISHED_STOPPED", "FINISHED_ABORTED",
                                      "FINISHED_LENGTH_CAPPED"):
                of(name).crashed = True
    return requests


@dataclass
class ModelGap:
    """One difference between kvcontract's model and vLLM: a finding about the model."""

    scenario: str
    request: str
    aspect: str
    model: Any
    live: Any
    gap_class: str = "unexplained"
    program: list[str] = field(default_factory=list)
    kind: str = "model-gap"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "scenario": self.scenario, "request": self.request,
                "aspect": self.aspect, "model": self.model, "live": self.live,
                "class": self.gap_class, "explanation": GAP_CLASSES[self.gap_class],
                "program": list(self.program)}

    def line(self) -> str:
        return (f"model-gap [{self.gap_class}] {self.scenario}: {self.request} {self.aspect}"
                f" model={self.model} live={self.live}")


@dataclass
class ProgramComparison:
    """One program on both systems."""

    scenario: str
    outcome: str
    reason: str | None = None
    """Why it was refused or not replayable."""
    gaps: list[ModelGap] = field(default_factory=list)
    live_crash: str | None = None
    live_steps: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "outcome": self.outcome, "reason": self.reason,
                "gaps": [g.to_json() for g in self.gaps], "live_crash": self.live_crash,
                "live_steps": self.live_steps}


def format_op(op: Op) -> str:
    name, *args = op
    shown = [f"<{len(a)} tokens>" if isinstance(a, list) and len(a) > 8 else repr(a)
             for a in args]
    return f"{name}({', '.join(shown)})"


def _live_timing(delay_steps: int) -> Timing:
    """The live worker's timing that matches the executable system's ``delay_steps``: a
    job the system submits at a step's start completes ``delay_steps`` polls later,
    while vLLM's worker reports a job of step ``t`` in step ``t``'s output at the
    earliest, which the next schedule reads (one step of the system's delay)."""
    if delay_steps <= 1:
        return Timing()
    return Timing("delayed", delay_steps - 1)


def build_options(program: Sequence[Op], *, capacity_chunks: int | None,
                  prompt_only: bool) -> BuildOptions:
    """Engine settings for a program: a batch budget and model length that admit its
    largest step and longest request, a GPU pool no program exhausts (the executable
    system's pool grows), the CPU tier's capacity in chunks."""
    budgets = [int(op[1]) for op in program if op[0] == "step" and len(op) > 1]
    lengths = [len(op[2]) + (int(op[3]) if len(op) > 3 else 2)
               for op in program if op[0] == "add_request"]
    requests = sum(1 for op in program if op[0] == "add_request")
    longest = max([64, *lengths])
    model_len = -(-(longest + 64) // 256) * 256
    return BuildOptions(max_num_batched_tokens=max([8192, *budgets]),
                        max_model_len=model_len, max_num_seqs=max(16, requests + 1),
                        gpu_blocks=None, cpu_chunks=capacity_chunks,
                        offload_prompt_only=prompt_only)


def compare_program(scenario: str, geometry: Geometry, program: Sequence[Op], *,
                    model: OffloadSystem, apply_model: Callable[[Op], None],
                    options: BuildOptions | None = None, delay_steps: int = 1,
                    ) -> ProgramComparison:
    """Run ``program`` (then a drain) on ``model`` (through ``apply_model``) and on a live
    session of ``geometry``; compare their decisions (see the module docstring)."""
    ok, why_not = buildable(geometry)
    opened = LiveSession.open(geometry, options, _live_timing(delay_steps))
    if isinstance(opened, Refused):
        comparison = ProgramComparison(scenario, "refused", opened.reason)
        if opened.by_vllm and ok:
            comparison.gaps.append(ModelGap(
                scenario, "-", "buildable", "buildable", f"refused: {opened.reason}",
                "buildable"))
        return comparison
    session = opened
    recorder = ModelRecorder(model)
    shown: list[str] = []
    try:
        for op in [*program, ("drain",)]:
            shown.append(format_op(op))
            apply_model(op)
            try:
                getattr(session, op[0])(*op[1:])
            except NotReplayableError as exc:
                return ProgramComparison(scenario, "not-replayable",
                                         f"{format_op(op)}: {exc}")
    finally:
        observation = session.close()
    gap = observation.driver_gap
    if gap is not None:
        return ProgramComparison(scenario, "not-replayable", gap.text(),
                                 live_steps=observation.steps)
    comparison = ProgramComparison(scenario, "agreed", live_steps=observation.steps)
    if not ok:
        comparison.gaps.append(ModelGap(scenario, "-", "buildable",
                                        f"not buildable: {why_not}", "built", "buildable"))
    if observation.exceptions:
        first = observation.exceptions[0]
        comparison.live_crash = f"{first.type}: {first.message}"
    live = live_decisions(observation)
    order = _request_order(program)
    deadlined = {line.split()[1] for line in model.log
                 if line.startswith("lookup ") and " deadline after " in line}
    # The model's manager refused an offer or evicted for one (its "offer" log lines).
    tier_filled = options is not None and options.cpu_chunks is not None and any(
        line.startswith("offer ") and ("-> refused" in line or (
            " evicted=" in line and not line.endswith(" evicted=0"))) for line in model.log)
    earlier_gap = False
    for request in sorted(set(recorder.requests) | set(live), key=order):
        mine = recorder.requests.get(request, RequestDecisions())
        theirs = live.get(request, RequestDecisions())
        found = False
        for aspect in ASPECTS:
            a, b = mine.aspect(aspect), theirs.aspect(aspect)
            if a != b:
                found_gap = ModelGap(scenario, request, aspect, a, b, program=list(shown))
                found_gap.gap_class = classify(
                    found_gap, geometry, program, mine, theirs, earlier_gap,
                    request in deadlined,
                    failed_stores_reported=has("failed-transfer-jobs"),
                    tier_filled=tier_filled)
                comparison.gaps.append(found_gap)
                found = True
        earlier_gap = earlier_gap or found
    if comparison.gaps:
        comparison.outcome = "disagreed"
    return comparison


def _request_order(program: Sequence[Op]) -> Callable[[str], tuple[int, str]]:
    arrivals = [str(op[1]) for op in program if op[0] == "add_request"]

    def key(name: str) -> tuple[int, str]:
        return (arrivals.index(name) if name in arrivals else len(arrivals), name)

    return key


def classify(gap: ModelGap, geometry: Geometry, program: Sequence[Op],
             model: RequestDecisions, live: RequestDecisions, earlier_gap: bool,
             deadlined: bool = False, *, failed_stores_reported: bool = False,
             tier_filled: bool = False) -> str:
    """The class of :data:`GAP_CLASSES` the program and the two sides' decisions show to
    be the gap's cause (checked in this order; ``unexplained`` when none fits).
    ``failed_stores_reported``: the installed release's worker reports failed stores
    (capability ``failed-transfer-jobs``), so a failed store is no cause.
    ``tier_filled``: the program's CPU tier has a capacity and the model's manager
    refused or evicted for it (class ``tier-capacity``)."""
    if not failed_stores_reported and any(op[0] == "fail_next_store" for op in program):
        return "failed-store"
    if deadlined:
        return "deferral-deadline"
    if model.lookups and not live.lookups:
        return "admission"
    if _prefill_stalled(gap, geometry, program, live):
        return "mtp-mamba-prefill-stall"
    if gap.aspect in ("hits", "loads") and _sub_chunk_hit(geometry, model, live):
        return "sub-chunk-hit"
    if gap.aspect in ("hits", "loads") and _sub_chunk_hit(geometry, live, model):
        return "sliding-recheck-only"
    if model.local_hits and live.local_hits and model.local_hits[0] != live.local_hits[0]:
        return "gpu-prefix-hit"
    if gap.aspect == "offers":
        differing = {g for g in set(gap.model) | set(gap.live)
                     if gap.model.get(g) != gap.live.get(g)}
        if differing and all(geometry.groups[g].kind is GroupKind.MAMBA for g in differing):
            return "mamba-checkpoints"
        if differing and model.aspect("hits") == live.aspect("hits") and all(
                _eagle_store_all(geometry, g, gap.model.get(g, []), gap.live.get(g, []))
                for g in differing):
            return "eagle-store-all"
        if differing and model.junctions != live.junctions \
                and live.connector_junctions is not None \
                and live.connector_junctions == model.junctions and all(
                    geometry.groups[g].kind is GroupKind.SLIDING_WINDOW for g in differing):
            # The connectors agree: the junction only vLLM has is its KV-cache manager's.
            return "junction-registration"
        hits = model.hits[-1:] + live.hits[-1:]
        if hits and len(model.hits) == len(live.hits) and _agree_past_hit(
                geometry, max(hits), gap.model, gap.live):
            return "hit-chunk-offers"
    if tier_filled:
        return "tier-capacity"
    if earlier_gap:
        return "follows-earlier-gap"
    return "unexplained"


def _prefill_stalled(gap: ModelGap, geometry: Geometry, program: Sequence[Op],
                     live: RequestDecisions) -> bool:
    """vLLM left the request RUNNING at ``P - k`` tokens computed, its prompt ``P``, on a
    geometry with a Mamba group and an MTP drafter of ``k = e + 1`` lookahead tokens,
    with a Mamba block boundary strictly between ``P - k`` and ``P`` (the class
    ``mtp-mamba-prefill-stall``: the chunk that must end at that boundary is cut to 0
    tokens by the lookahead reservation, every step)."""
    blocks = [g.block_size for g in geometry.groups if g.kind is GroupKind.MAMBA]
    extra = max((g.extra_retained_tokens for g in geometry.groups
                 if g.kind is GroupKind.SLIDING_WINDOW), default=0)
    if not blocks or not extra or live.finished or live.computed is None:
        return False
    prompt = next((len(op[2]) for op in program
                   if op[0] == "add_request" and op[1] == gap.request), None)
    if prompt is None:
        return False
    stalled_at = prompt - (extra + 1)
    return live.computed == stalled_at >= 0 and any(
        (prompt - 1) // block * block > stalled_at for block in blocks)


def _eagle_store_all(geometry: Geometry, g: int, model: list[int], live: list[int]) -> bool:
    """Group ``g`` is an EAGLE group whose needed history fills a segment exactly, in
    chunks of one block (``bpc`` 1: kvcontract's mask marks every block but block 0,
    so chunk 0 is the only chunk it leaves out), and vLLM offered what the model did
    plus chunk 0 alone (the class ``eagle-store-all``)."""
    group = geometry.groups[g]
    if not group.eagle or group.sliding_window is None or geometry.blocks_per_chunk != 1:
        return False
    rule, need = group_mask(geometry, group)
    if rule.store_all or rule.period is None or need != rule.period:
        return False
    return set(model) <= set(live) and set(live) - set(model) == {0}


def _sub_chunk_hit(geometry: Geometry, model: RequestDecisions,
                   live: RequestDecisions) -> bool:
    """``model`` took an offloaded hit shorter than some group's chunk past ``L`` where
    ``live`` took none (its hit is its GPU hit); with the sides swapped, the converse."""
    if not (model.hits and live.hits and model.local_hits and live.local_hits):
        return False
    past = model.hits[0] - model.local_hits[0]
    largest = max(geometry.chunk_tokens(g) for g in geometry.groups)
    return 0 < past < largest and live.hits[0] == live.local_hits[0]


def _agree_past_hit(geometry: Geometry, hit: int, model: dict[int, list[int]],
                    live: dict[int, list[int]]) -> bool:
    """Whether two offer sets agree on every chunk at or past ``cdiv(hit, tpc)``."""
    for g, spec in enumerate(geometry.groups):
        first = -(-hit // geometry.chunk_tokens(spec))
        if [c for c in model.get(g, []) if c >= first] != \
                [c for c in live.get(g, []) if c >= first]:
            return False
    return True


@dataclass
class LiveComparisonReport:
    """The live comparison of a fuzz run: every program's outcome and the gaps."""

    implementation: str
    vllm_version: str
    programs: list[ProgramComparison] = field(default_factory=list)
    partial_tails: Any = None
    """The partial-tail campaign on vLLM's engine
    (:class:`kvcontract.live.partial_tail.PartialTailCampaign`), or why it did not run (a
    string); None where it was not asked for."""

    def count(self, outcome: str) -> int:
        return sum(1 for p in self.programs if p.outcome == outcome)

    @property
    def compared(self) -> int:
        return self.count("agreed") + self.count("disagreed")

    @property
    def agreement(self) -> float | None:
        """Agreed over compared programs (None when none was compared)."""
        return self.count("agreed") / self.compared if self.compared else None

    @property
    def gaps(self) -> list[ModelGap]:
        return [g for p in self.programs for g in p.gaps]

    def classes(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for gap in self.gaps:
            found[gap.gap_class] = found.get(gap.gap_class, 0) + 1
        return dict(sorted(found.items()))

    def summary(self) -> str:
        rate = "n/a" if self.agreement is None else f"{self.agreement:.1%}"
        text = (f"live (vLLM {self.vllm_version}) vs {self.implementation}: "
                f"{self.count('agreed')}/{self.compared} programs agree ({rate}); "
                f"{self.count('refused')} refused, {self.count('not-replayable')} not "
                f"replayable; {len(self.gaps)} model gaps")
        if isinstance(self.partial_tails, str):
            return f"{text}\npartial tails on vLLM: not run ({self.partial_tails})"
        if self.partial_tails is not None:
            return f"{text}\n{self.partial_tails.summary()}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "implementation": self.implementation, "vllm_version": self.vllm_version,
            "compared": self.compared, "agreed": self.count("agreed"),
            "disagreed": self.count("disagreed"), "refused": self.count("refused"),
            "not_replayable": self.count("not-replayable"), "agreement": self.agreement,
            "gap_classes": self.classes(),
            "gaps": [g.to_json() for g in self.gaps],
            "refused_programs": [{"scenario": p.scenario, "reason": p.reason}
                                 for p in self.programs if p.outcome == "refused"],
            "not_replayable_programs": [{"scenario": p.scenario, "reason": p.reason}
                                        for p in self.programs
                                        if p.outcome == "not-replayable"],
            **({} if self.partial_tails is None else {"partial_tails": (
                {"not_run": self.partial_tails} if isinstance(self.partial_tails, str)
                else self.partial_tails.to_json())}),
        }
