"""The judge of the executable system: a monitor of its events, against the spec.

Contract: :class:`Monitor` subscribes to an
:class:`~kvcontract.impl.system.engine.OffloadSystem` (``Monitor.attach(system)``, or
``system.subscribe(Monitor(geometry))``) and judges each event of
:mod:`kvcontract.impl.system.events` as it arrives, recording a :class:`Violation` per
finding (never raising) and counting the checks per clause in ``checks``:

* :class:`~kvcontract.impl.system.events.LookupEvent` (C3, C4, and C5 when a group is
  EAGLE): the accepted hit is the contract's answer at the local GPU hit ``L``
  (:func:`kvcontract.spec.properties.lookup.contract_answer` and
  :func:`~kvcontract.spec.properties.lookup.expected_hit` on a
  :class:`~kvcontract.spec.properties.lookup.LookupCase` of the event's states; the
  property layer's :func:`~kvcontract.spec.properties.lookup.defers_only_in_scope` and
  :func:`~kvcontract.spec.properties.lookup.is_maximal` decide a wrong defer and a wrong
  hit), and an external hit's load ranges are the spec's ``Load(N, L)`` (C2,
  :func:`~kvcontract.spec.properties.lookup.loads_only_hit`). Two rules
  of the system's own lookup are kept: nothing is judged when a state is RETRY (an
  asynchronous lookup in flight may defer anything), and the lookup must defer when the
  spec's load set touches a chunk another request is loading. A wrong hit is C2 when it
  is larger than the answer or the lookup had to defer, C4 when it is smaller, C3 a
  defer that should not be. The lookup properties the monitor judges are those of the
  catalogue that declare ``Observer.MONITOR``
  (:func:`kvcontract.spec.properties.catalog.observed_by`): the three above with the
  attribution just described (:data:`ATTRIBUTED`), every other one by its own judge on
  the event's case and observation, so a new property is judged by fuzzing without a
  line here;
* :class:`~kvcontract.impl.system.events.LoadEvent` (C2 checked) and
  :class:`~kvcontract.impl.system.events.LoadCrashEvent` (a C2 violation: upstream's
  "not found" / "not ready" crash);
* :class:`~kvcontract.impl.system.events.AllocationEvent` (C1): the live blocks of a
  sliding-window group after a hit are ``Ret(N)``, those of a Mamba group the chunk
  holding the state at ``N`` (:func:`kvcontract.spec.multigroup.first_live_block`);
* the shared-prefix junction a :class:`~kvcontract.impl.system.events.LookupEvent`
  reports (C12, docs/CONTRACT.md 9.3): the one the spec registers for the accepted hit
  (:func:`kvcontract.spec.reachability.junction_boundary` of the spec's full-attention
  boundary, :func:`spec_full_attention_boundary`; :meth:`Monitor.spec_junction`); an
  event that reports none (``junction=None``) is not judged;
* :class:`~kvcontract.impl.system.events.StoreEvent` (C7, C8, C9, C10): the chunks
  offered equal the spec's reachability mask at the spec's horizon for this step, the
  junction the store path was handed passed to the mask besides the replay boundaries
  (:meth:`Monitor.spec_offers`), are offered at most once, ``next_stored_chunk_idx``
  never moves back, and no offered chunk holds an uncommitted slot;
* :class:`~kvcontract.impl.system.events.RestoreEvent` and
  :class:`~kvcontract.impl.system.events.AttentionEvent` (C11): the outcomes of the
  engine's byte and attention comparisons with the data oracles.

* a program's :class:`~kvcontract.spec.lifecycle.LifecycleTrace` (C13, C14, C15), handed
  to :meth:`Monitor.judge_lifecycle` by the fuzzer once the program drains or stops at an
  exception: every lifecycle property of the catalogue that declares
  ``Observer.MONITOR``, each by its own judge, each finding with its judge's impact.

The monitor holds no system state: everything it judges is in the events, the traces
and the geometry it was built for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcontract.impl.system.engine import OffloadSystem
from kvcontract.impl.system.events import (
    AllocationEvent,
    AttentionEvent,
    Event,
    LoadCrashEvent,
    LoadEvent,
    LookupEvent,
    RestoreEvent,
    StoreEvent,
)
from kvcontract.spec import multigroup, retention
from kvcontract.spec.clauses import CatalogueError
from kvcontract.spec.geometry import Geometry
from kvcontract.spec.lifecycle import LifecycleTrace
from kvcontract.spec.lookup import window_chunks
from kvcontract.spec.properties.base import (
    CaseProperty,
    Family,
    Observer,
)
from kvcontract.spec.properties.base import Violation as PropertyViolation
from kvcontract.spec.properties.catalog import observed_by
from kvcontract.spec.properties.lifecycle import LifecycleCase
from kvcontract.spec.properties.lookup import (
    LookupCase,
    LookupObservation,
    contract_answer,
    defers_only_in_scope,
    expected_hit,
    is_maximal,
    loads_only_hit,
)
from kvcontract.spec.properties.store import spec_step_offers
from kvcontract.spec.reachability import junction_boundary, store_replay_boundaries
from kvcontract.vocabulary import GroupKind, Impact, LookupResult, RequestStatus


@dataclass(frozen=True)
class Violation:
    """One finding: the clause, what was judged (``lookup``, ``junction``, ``load-set``, ``crash``,
    ``retention``, ``store``, ``bytes``, ``attention``, or a lifecycle judge's name), a
    message and the witness."""

    clause: str
    kind: str
    message: str
    witness: dict[str, object] = field(default_factory=dict)
    impact: Impact | None = None
    """This finding's own impact where its judge grades it (a lifecycle deferral decided
    late is ``delay``, one never decided ``stall``); None: the clause's."""


ATTRIBUTED = frozenset({"C2/lookup-loads-only-hit", "C3/lookup-defers-only-in-scope",
                        "C4/lookup-is-maximal"})
"""The monitored properties whose findings the lookup handler attributes itself (a hit
larger than the contract's answer is C2, not C4; a defer the system's loading rule asks
for is none): each must be a catalogue property that declares ``Observer.MONITOR``."""

def monitored_properties() -> tuple[list[CaseProperty], list[CaseProperty]]:
    """``(attributed, judged)``: the catalogue's properties that declare
    ``Observer.MONITOR``, split into those :data:`ATTRIBUTED` names and those judged by
    their own judge. A declared property of a family no event observes, or an attributed
    id the catalogue does not monitor, is the catalogue's error, named."""
    declared = observed_by(Observer.MONITOR)
    for prop in declared:
        if prop.family not in Observer.MONITOR.families:
            raise CatalogueError(
                f"property {prop.theorem_id} declares the monitor, but no system event "
                f"gives a {prop.family} case (the monitor observes: "
                f"{', '.join(sorted(Observer.MONITOR.families))})")
    ids = {p.theorem_id for p in declared}
    stale = sorted(ATTRIBUTED - ids)
    if stale:
        raise CatalogueError(
            f"tools/monitor.py ATTRIBUTED names {', '.join(stale)}, which the catalogue "
            "does not declare observable by the monitor (Observer.MONITOR)")
    return ([p for p in declared if p.theorem_id in ATTRIBUTED],
            [p for p in declared if p.theorem_id not in ATTRIBUTED])


def spec_full_attention_boundary(geometry: Geometry, num_tokens: int, local_hit: int,
                                 states: Sequence[Sequence[LookupResult]]) -> int:
    """The boundary a lookup's full-attention groups serve, by the spec (docs/CONTRACT.md
    9.3): the largest boundary past the local hit, up to the lookup's first candidate
    (:func:`kvcontract.spec.multigroup.initial_max_hit`), at which every full-attention
    group reads only present chunks (:func:`~kvcontract.spec.multigroup.
    group_read_requirement`; a pending chunk counts, as for the boundary a window serves),
    clamped to the keys of the first sparse group the lookup visits
    (:func:`~kvcontract.spec.multigroup.group_visit_order`): vLLM's
    ``full_attention_hit_boundary``. 0 when they serve none past the local hit, or the
    geometry lacks a full-attention or a sparse group (no junction is registered then).
    ``states[g][k]``: the state of chunk ``k`` of group ``g``, every complete chunk."""
    groups = geometry.groups
    full = [g for g, spec in enumerate(groups) if spec.kind is GroupKind.FULL]
    windows = {g: int(window_chunks(spec.sliding_window, spec.extra_retained_tokens,
                                    geometry.chunk_tokens(spec)))
               for g, spec in enumerate(groups)
               if spec.kind is GroupKind.SLIDING_WINDOW and spec.sliding_window is not None}
    sparse = [g for g in multigroup.group_visit_order(geometry, windows) if g not in full]
    if not full or not sparse:
        return 0
    served, _ = multigroup.full_attention_served(
        geometry, num_tokens, local_hit, states, multigroup.initial_max_hit(geometry, num_tokens))
    first = groups[sparse[0]]
    return min(served, multigroup.complete_chunks(geometry, first, num_tokens)
               * geometry.chunk_tokens(first))


class Monitor:
    """Judges one system's events against the spec (see the module docstring)."""

    def __init__(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self.violations: list[Violation] = []
        self.checks: Counter[str] = Counter()
        self._eagle = any(geometry.drops_eagle_block(group) for group in geometry.groups)
        _, judged = monitored_properties()
        self._judged = [p for p in judged if p.family == Family.LOOKUP]
        self._lifecycle = [p for p in judged if p.family == Family.LIFECYCLE]
        self._handlers: dict[type, Callable[[Any], None]] = {
            LookupEvent: self._lookup_and_junction,
            LoadEvent: self._load,
            LoadCrashEvent: self._crash,
            AllocationEvent: self._allocation,
            StoreEvent: self._store,
            RestoreEvent: self._restore,
            AttentionEvent: self._attention,
        }

    @classmethod
    def attach(cls, system: OffloadSystem) -> Monitor:
        """A monitor for ``system``'s geometry, subscribed to its events."""
        monitor = cls(system.geometry)
        system.subscribe(monitor)
        return monitor

    def __call__(self, event: Event) -> None:
        self._handlers[type(event)](event)

    def _violate(self, clause: str, kind: str, message: str, **witness: object) -> None:
        self.violations.append(Violation(clause, kind, message, dict(witness)))

    # -- the request's lifecycle (C13-C15) -------------------------------------------------
    def judge_lifecycle(self, trace: LifecycleTrace) -> None:
        """Judge a program's lifecycle so far (the trace of the system's lifecycle events,
        :class:`~kvcontract.impl.system.lifecycle.TraceRecorder`) by every lifecycle
        property that declares the monitor, each reporting its first violation with its
        own impact. Called once a program has drained, or has stopped at an exception."""
        case = LifecycleCase("system", self.geometry, ())
        for prop in self._lifecycle:
            self.checks[prop.clause] += 1
            found = prop.judge(case, trace)
            if found is None:
                continue
            impact = found.impact if isinstance(found, PropertyViolation) else prop.impact
            self.violations.append(Violation(
                # The kind names the judge (a report's theorem: ``C13/fuzz-deferral-
                # bounded``); a crash keeps the kind every crash has.
                prop.clause, "crash" if impact is Impact.CRASH else prop.name,
                f"{prop.theorem_id}: {found}", {"theorem": prop.theorem_id}, impact))

    # -- lookups and loads ----------------------------------------------------------------
    def _lookup_and_junction(self, event: LookupEvent) -> None:
        self._lookup(event)
        self._junction(event)

    def spec_junction(self, event: LookupEvent) -> int | None:
        """The junction the spec says the lookup of ``event`` registers (docs/CONTRACT.md
        9.3): :func:`kvcontract.spec.reachability.junction_boundary` of the spec's
        full-attention boundary (:func:`spec_full_attention_boundary` over the event's
        states), the local hit, the accepted hit past it and the retention interval.
        None when nothing is judged: the lookup deferred, the event reports no junction
        (a runtime monitor's lookup), or a state is RETRY."""
        if event.hit is None or event.junction is None or any(
                LookupResult.RETRY in row for row in event.states):
            return None
        geo = self.geometry
        boundary = spec_full_attention_boundary(geo, event.num_tokens, event.local_hit,
                                                event.states)
        return int(junction_boundary(boundary, event.local_hit, event.hit - event.local_hit,
                                     geo.retention_interval))

    def _junction(self, event: LookupEvent) -> None:
        """C12 (docs/CONTRACT.md 9.3): the junction the request registered with its hit
        is the spec's: with a retention interval, the boundary its full-attention groups
        serve when a sparse group cut the hit below it; none otherwise. A junction
        missing loses the later hit at it (its window is never stored), one too large
        stores a window no boundary reads (judged on the system's accepted hit: a wrong
        hit is the lookup's own finding)."""
        want = self.spec_junction(event)
        if want is None:
            return
        self.checks["C12"] += 1
        if event.junction != want:
            self._violate(
                "C12", "junction",
                f"request {event.request}: registered the shared-prefix junction "
                f"{event.junction}, the spec's is {want} (full-attention boundary "
                f"{event.full_attention_boundary} reported, hit {event.hit}, local "
                f"{event.local_hit}, retention {self.geometry.retention_interval})",
                request=event.request, system=event.junction, spec=want,
                hit=event.hit, local=event.local_hit)

    def _lookup(self, event: LookupEvent) -> None:
        if any(LookupResult.RETRY in row for row in event.states):
            return  # an asynchronous lookup in flight may defer anything: nothing to compare
        geo = self.geometry
        local = event.local_hit
        case = LookupCase("system", geo, event.num_tokens, local, event.states)
        observation = LookupObservation(event.hit, dict(event.load_ranges))
        answer = contract_answer(case)
        expected: int | None = None
        expected_ranges: dict[int, tuple[int, int]] = {}
        loading_defer = False
        if answer.best_present is None or not answer.pending_in_window:
            expected = expected_hit(case)
        if answer.best_present is not None and expected is not None:
            expected_ranges = {
                g: multigroup.load_range(geo, s, expected, local) for g, s in enumerate(geo.groups)
            }
            # The system's rule: a load set that touches a chunk another request is
            # loading defers the request.
            loading_defer = any(
                (g, k) in event.loading
                for g, (lo, hi) in expected_ranges.items()
                for k in range(lo, hi)
            )
            if loading_defer:
                expected = None
        for checked in ("C3", "C4"):
            self.checks[checked] += 1
        if self._eagle:
            self.checks["C5"] += 1
        hit = event.hit
        clause: str | None = None
        if hit is None:
            if not loading_defer and defers_only_in_scope(case, observation) is not None:
                clause = "C3"
        elif expected is None:
            clause = "C2"  # accepted although a chunk it reads is pending or being loaded
        elif is_maximal(case, observation) is not None:
            clause = "C2" if hit > expected else "C4"
        if clause is not None:
            self._violate(
                clause,
                "lookup",
                f"request {event.request}: system accepted {hit} (local {local}), "
                f"the contract answers {expected}",
                request=event.request, system=hit, spec=expected, local=local,
                states={g: [int(r) for r in row] for g, row in enumerate(event.states)},
            )
            return
        # The hit is the contract's answer here, so every chunk of the spec's load set is
        # HIT; what is left for the property to find is a load set other than Load(N, L).
        if hit is not None and hit > local and loads_only_hit(case, observation) is not None:
            load_ranges = dict(event.load_ranges)
            self._violate(
                "C2", "load-set",
                f"request {event.request}: load ranges {load_ranges}, "
                f"the spec says {expected_ranges}",
                request=event.request,
            )
            return
        if loading_defer:
            return  # the system's own rule decided: the contract's case does not apply
        for prop in self._judged:
            self.checks[prop.clause] += 1
            found = prop.judge(case, observation)
            if found is not None:
                self._violate(prop.clause, "lookup",
                              f"request {event.request}: {prop.theorem_id}: {found}",
                              request=event.request, theorem=prop.theorem_id)
                return

    def _load(self, event: LoadEvent) -> None:
        self.checks["C2"] += 1

    def _crash(self, event: LoadCrashEvent) -> None:
        self._violate("C2", "crash", event.message, request=event.request, hit=event.hit,
                      local=event.local_hit, loads=str(dict(sorted(event.load_ranges))))

    # -- allocation -------------------------------------------------------------------------
    def _allocation(self, event: AllocationEvent) -> None:
        geo = self.geometry
        spec = geo.groups[event.group]
        bs = geo.block_tokens(spec)
        if spec.kind is GroupKind.SLIDING_WINDOW:
            assert spec.sliding_window is not None
            first, end = retention.retained_block_range(
                event.hit, bs, spec.sliding_window, spec.extra_retained_tokens
            )
            kept = f"Ret({event.hit})"
        elif spec.kind is GroupKind.MAMBA:
            # The chunk holding the state at the hit (a chunk end), nothing below it.
            first = multigroup.first_live_block(geo, spec, event.hit)
            end = -(-event.hit // bs)
            kept = f"the state chunk at {event.hit}"
        else:
            return
        table = event.live
        self.checks["C1"] += 1
        ok = len(table) == int(end) and all(
            live == (b >= int(first)) for b, live in enumerate(table)
        )
        if not ok:
            live_blocks = [b for b, live in enumerate(table) if live]
            self._violate(
                "C1", "retention",
                f"request {event.request} group {event.group}: live blocks "
                f"{live_blocks[:3]}..{live_blocks[-3:]} != {kept} = [{first}, {end})",
                request=event.request, group=event.group,
            )

    # -- stores -----------------------------------------------------------------------------
    def spec_offers(self, event: StoreEvent) -> list[int]:
        """What the spec says this step offers, given the tracker's state before it (the
        store properties' own step, :func:`kvcontract.spec.properties.store.spec_step_offers`)."""
        replay = store_replay_boundaries(self.geometry, event.prompt_len)
        if self.geometry.retention_interval is not None and event.junction:
            # The junction the store path was handed is one more boundary
            # (docs/CONTRACT.md 9.3; whether it is the right one is the lookup's C12).
            replay = tuple(sorted({*replay, event.junction}))
        chosen, _ = spec_step_offers(
            self.geometry, event.group, event.status, event.before, event.scheduled,
            event.num_tokens, event.prompt_len, set(event.offered_before), event.next_before,
            event.prompt_only, replay,
        )
        offers: list[int] = chosen
        return offers

    def _store(self, event: StoreEvent) -> None:
        request, g, status = event.request, event.group, event.status
        tpc = self.geometry.chunk_tokens(self.geometry.groups[g])
        offered = list(event.offered)
        expected = self.spec_offers(event)
        self.checks["C8"] += 1
        self.checks["C9"] += 1
        if offered != expected:
            extra_chunks = sorted(set(offered) - set(expected))
            missing_chunks = sorted(set(expected) - set(offered))
            self._violate(
                "C9" if extra_chunks and status is RequestStatus.PREFILLING else
                ("C8" if extra_chunks else "C7"),
                "store",
                f"request {request} group {g} ({status.value}, "
                f"{event.before}+{event.scheduled} tokens): "
                f"offered {offered}, the spec's mask says {expected} "
                f"(extra {extra_chunks}, missing {missing_chunks})",
                request=request, group=g, offered=offered, spec=expected,
            )
        if set(offered) & event.offered_before or event.next_after < event.next_before:
            self._violate("C8", "store", f"request {request} group {g}: chunk offered twice "
                          "or next_stored_chunk_idx moved back", request=request, group=g)
        for chunk in offered:
            self.checks["C10"] += 1
            if (chunk + 1) * tpc > event.num_computed:
                self._violate(
                    "C10", "store",
                    f"request {request} group {g}: chunk {chunk} holds uncommitted slots",
                    request=request, group=g,
                )

    # -- data (C11) -------------------------------------------------------------------------
    def _restore(self, event: RestoreEvent) -> None:
        self._restored(event, event.positions_match, "bytes",
                       f"restored KV differs from the producer's at position {event.first_bad}",
                       position=event.first_bad)

    def _attention(self, event: AttentionEvent) -> None:
        self._restored(event, event.outputs_match, "attention",
                       "decode attention over the restored cache differs from a recomputed "
                       "cache")

    def _restored(self, event: RestoreEvent | AttentionEvent, holds: bool, kind: str,
                  differs: str, **witness: object) -> None:
        """One C11 check of the cache a hit restored: a ``kind`` violation saying what
        ``differs`` when it does not hold."""
        self.checks["C11"] += 1
        if not holds:
            self._violate(
                "C11", kind,
                f"request {event.request} group {event.group}: {differs} (hit {event.hit})",
                request=event.request, group=event.group, **witness,
            )
