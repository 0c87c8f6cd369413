"""C13-C15 as judges of a :class:`~kvcontract.spec.lifecycle.LifecycleTrace`.

Contract: every judge here is a pure function ``judge(trace, geometry) -> list of
Violation`` (empty: the clause holds on the trace), reading nothing but the trace's
records and the spec (:mod:`kvcontract.spec.lifecycle` for the states, the transitions
and the deferral bound, :mod:`kvcontract.spec.retention` for what an SWA group needs on
the GPU). Each violation carries its impact: an unbounded deferral is ``stall``, a
bounded one past ``D`` is ``delay``, an exception ``crash``, a store from a freed or
reused block and a run over missing KV ``corruption``. The same judges judge the
executable system (the case space :data:`LIFECYCLE_SPACE` below: every short program of
lifecycle operations over small geometries, run on :mod:`kvcontract.impl.system`) and
vLLM's own scheduler through the live backend: a backend maps its run to the trace,
never the other way round. The deadline rule itself (``impl.deferral_clock``,
``impl.deferral_expired``) is proved for every step by induction
(:func:`deadline_rule_bounds_age`, a formula property).

What a trace cannot show is not a pass: a judge whose records are absent (a backend
that does not observe jobs, say) returns no violation, and the backend names the gap
in ``trace.notes``; :func:`unobserved` lists them for the reports.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvcontract.errors import WitnessError
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.reference import NO_BOUND
from kvcontract.spec.arith import Bool, and_, implies, not_, or_
from kvcontract.spec.geometry import Geometry, GroupSpec, fa, swa
from kvcontract.spec.lifecycle import (
    DEFAULT_DEFERRAL_BOUND,
    ENDED_STATES,
    JOB_ENDINGS,
    DeferCause,
    JobEvent,
    JobKind,
    LifecycleTrace,
    LookupRecord,
    RequestState,
    deferral_age,
    transition_allowed,
    within_deferral_bound,
)
from kvcontract.spec.properties.base import (
    CaseProperty,
    CaseSpace,
    Config,
    Env,
    Family,
    FormulaProperty,
    LastCase,
    Observer,
    Picture,
    Property,
    Violation,
)
from kvcontract.spec.retention import skipped_tokens
from kvcontract.vocabulary import GroupKind, Impact, RequestStatus

TraceJudge = Callable[[LifecycleTrace, Geometry], list[Violation]]
"""``judge(trace, geometry) -> violations`` (empty when the clause holds on the trace)."""


def bound_of(trace: LifecycleTrace) -> int:
    """The ``D`` a trace is judged by: its own, else the contract's default."""
    return DEFAULT_DEFERRAL_BOUND if trace.deferral_bound is None else trace.deferral_bound


# -- C13 bounded deferral -------------------------------------------------------------
def deferral_has_cause(trace: LifecycleTrace, geometry: Geometry) -> list[Violation]:
    """C13: every deferral names its cause, and a cause other than RETRY or the request's
    own transfers names the chunks it waits on."""
    del geometry
    found: list[Violation] = []
    for record in trace.lookups:
        if record.answer is not None:
            continue
        if not record.causes:
            found.append(Violation(
                f"step {record.step}: {record.request}'s lookup deferred with no cause "
                "(neither RETRY, a pending chunk in its window, a chunk loading elsewhere "
                "nor its own transfer)", Impact.DELAY))
            continue
        for cause in record.causes:
            if cause in (DeferCause.RETRY, DeferCause.OWN_TRANSFER):
                continue
            if not any(w.cause is cause for w in record.waited_on):
                found.append(Violation(
                    f"step {record.step}: {record.request} deferred for {cause.value} but "
                    "names no chunk it waits on", Impact.DELAY))
    return found


def _episodes(lookups: Iterable[LookupRecord]) -> list[tuple[int, LookupRecord | None,
                                                              list[LookupRecord]]]:
    """A request's deferral episodes: ``(first deferred step, deciding lookup or None,
    the deferred lookups)``; an episode ends at the first lookup that decides."""
    episodes: list[tuple[int, LookupRecord | None, list[LookupRecord]]] = []
    current: list[LookupRecord] = []
    for record in lookups:
        if record.answer is None:
            current.append(record)
            continue
        if current:
            episodes.append((current[0].step, record, current))
            current = []
    if current:
        episodes.append((current[0].step, None, current))
    return episodes


def _ended_at(trace: LifecycleTrace, request: str) -> int | None:
    for record in trace.states_of(request):
        if record.state in ENDED_STATES:
            return record.step
    return None


def _waited_text(deferred: list[LookupRecord]) -> str:
    keys = sorted({f"g{w.group} chunk {w.chunk} ({w.cause.value})"
                   for r in deferred for w in r.waited_on})
    causes = sorted({c.value for r in deferred for c in r.causes})
    shown = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
    return shown or ", ".join(causes) or "nothing named"


def deferral_is_bounded(trace: LifecycleTrace, geometry: Geometry) -> list[Violation]:
    """C13: a request first deferred at step ``s`` is decided (or ended) by step
    ``s + D``. Decided later: ``delay``; still deferred when the trace ends, past ``D``,
    with nothing that would decide it: ``stall`` (it waits until the client gives up)."""
    del geometry
    bound = bound_of(trace)
    found: list[Violation] = []
    for request in trace.requests():
        ended = _ended_at(trace, request)
        for first, decided, deferred in _episodes(trace.lookups_of(request)):
            if decided is not None:
                if not within_deferral_bound(first, decided.step, bound):
                    found.append(Violation(
                        f"{request} first deferred at step {first} was decided at step "
                        f"{decided.step}: {deferral_age(first, decided.step)} steps, past "
                        f"the bound D = {bound} (waiting on {_waited_text(deferred)})",
                        Impact.DELAY))
                continue
            last = deferred[-1].step if ended is None else min(ended, trace.steps)
            if ended is not None and within_deferral_bound(first, ended, bound):
                continue  # aborted (or finished) while still within the bound
            end = trace.steps if ended is None else ended
            if within_deferral_bound(first, end, bound):
                continue  # the trace ended before the bound: nothing to say
            found.append(Violation(
                f"{request} deferred from step {first} to step {last} "
                f"({len(deferred)} lookups, {deferral_age(first, end)} steps; bound D = "
                f"{bound}) and never decided: waiting on {_waited_text(deferred)}",
                Impact.STALL))
    return found


def decides_once_ready(trace: LifecycleTrace, geometry: Geometry) -> list[Violation]:
    """C13: once the stores a deferral waited on have ended (completed or failed) and
    none was submitted again (or stalled since), the request's next lookup does not wait
    on them. A trace orders records by step only, and a step's lookups may come before
    its completions (vLLM reports jobs after it schedules; a drain completes jobs after
    the step's lookups), so a store that ended at step ``s`` is owed to the lookups of
    the steps after ``s``: a lag of one step is not seen, a longer wait is."""
    del geometry
    ended_at: dict[str, int] = {}
    for job in trace.jobs:
        if job.kind is not JobKind.STORE:
            continue
        for key in job.keys:
            if job.event in JOB_ENDINGS:
                ended_at[key] = job.step
            elif job.event is JobEvent.SUBMITTED:
                ended_at.pop(key, None)
    for key in trace.stalled_keys:
        # Its latest write never ends: the environment stalled it, maybe after an earlier
        # store of the same key had ended (a fixture making a stored chunk pending).
        ended_at.pop(key, None)
    found: list[Violation] = []
    for request in trace.requests():
        lookups = trace.lookups_of(request)
        for before, after in itertools.pairwise(lookups):
            if before.answer is not None or after.answer is not None:
                continue
            waited = {w.key for w in before.waited_on if w.cause is DeferCause.HIT_PENDING}
            stale = sorted(k for k in waited & {w.key for w in after.waited_on
                                                 if w.cause is DeferCause.HIT_PENDING}
                           if k in ended_at and ended_at[k] < after.step)
            if stale:
                found.append(Violation(
                    f"step {after.step}: {request} still waits on {stale[0]}, whose store "
                    f"ended at step {ended_at[stale[0]]}", Impact.DELAY))
    return found


# -- C14 lifecycle safety ----------------------------------------------------------------
def raises_nothing(trace: LifecycleTrace, geometry: Geometry) -> list[Violation]:
    """C14: no operation of the scheduler or the connector raises, at any point."""
    del geometry
    return [Violation(f"step {e.step}: {e.where} of {e.request or 'the step'} raised "
                      f"{e.type_name}: {e.message}", Impact.CRASH) for e in trace.exceptions]


def follows_transitions(trace: LifecycleTrace, geometry: Geometry) -> list[Violation]:
    """C14: each request starts waiting and moves only as
    :data:`~kvcontract.spec.lifecycle.TRANSITIONS` allows."""
    del geometry
    found: list[Violation] = []
    for request in trace.requests():
        states = trace.states_of(request)
        if not states:
            continue
        if states[0].state is not RequestState.WAITING:
            found.append(Violation(f"{request} starts {states[0].state.value}, not waiting",
                                   Impact.CRASH))
        for before, after in itertools.pairwise(states):
            if not transition_allowed(before.state, after.state):
                found.append(Violation(
                    f"step {after.step}: {request} moved {before.state.value} -> "
                    f"{after.state.value}, which the lifecycle does not allow", Impact.CRASH))
    return found


def jobs_end_once(trace: LifecycleTrace, geometry: Geometry) -> list[Violation]:
    """C14: every job is submitted once and ends exactly once (completed, failed or
    cancelled); a job the environment stalls may stay open, any other may not (unless
    the run ended at an engine-fatal exception, which is the finding)."""
    del geometry
    lines: dict[int, list[JobEvent]] = defaultdict(list)
    first: dict[int, str] = {}
    keys: dict[int, tuple[str, ...]] = {}
    for job in trace.jobs:
        lines[job.job_id].append(job.event)
        first.setdefault(job.job_id, f"{job.kind.value} job {job.job_id} of {job.request}")
        keys.setdefault(job.job_id, job.keys)
    stalled = set(trace.stalled_keys)
    found: list[Violation] = []
    for job_id, events in lines.items():
        submitted = events.count(JobEvent.SUBMITTED)
        endings = [e for e in events if e in JOB_ENDINGS]
        if submitted != 1:
            found.append(Violation(f"{first[job_id]} submitted {submitted} times",
                                   Impact.CRASH))
        if len(endings) > 1:
            found.append(Violation(
                f"{first[job_id]} ended {len(endings)} times "
                f"({', '.join(e.value for e in endings)})", Impact.CRASH))
        if not endings and not trace.fatal and not (set(keys[job_id]) & stalled):
            found.append(Violation(f"{first[job_id]} never ended", Impact.STALL))
    return found


def nothing_left_pending(trace: LifecycleTrace, geometry: Geometry) -> list[Violation]:
    """C14: at the end no chunk stays HIT_PENDING (but those of a stalled job), no
    request stays counted as loading, no key stays referenced by a load."""
    del geometry
    if trace.fatal:
        return []  # what an engine-fatal exception left behind: the exception is the finding
    stalled = set(trace.stalled_keys)
    final = trace.final
    found: list[Violation] = []
    pending = sorted(set(final.pending_keys) - stalled)
    if pending:
        found.append(Violation(f"{len(pending)} chunk(s) stay HIT_PENDING forever "
                               f"(first {pending[0]}): every later lookup of them defers",
                               Impact.STALL))
    for request in final.loading_requests:
        found.append(Violation(f"{request} stays counted as loading after its end",
                               Impact.STALL))
    if final.loading_keys:
        found.append(Violation(f"{len(final.loading_keys)} key(s) stay counted as being "
                               f"loaded (first {final.loading_keys[0]})", Impact.STALL))
    if final.referenced_keys:
        found.append(Violation(f"{len(final.referenced_keys)} key(s) keep a load reference "
                               f"(first {final.referenced_keys[0]}): never evictable",
                               Impact.WASTE))
    return found


def stores_only_live_blocks(trace: LifecycleTrace, geometry: Geometry) -> list[Violation]:
    """C14: nothing is stored from a GPU block that was freed or handed to another
    request before the store captured it."""
    del geometry
    return [Violation(f"step {s.step}: store job {s.job_id} of {s.request} reads group "
                      f"{s.group}'s block {s.block}, already {s.reason.value}",
                      Impact.CORRUPTION) for s in trace.final.stale_stores]


def ended_store_horizon(trace: LifecycleTrace, geometry: Geometry) -> list[Violation]:
    """C14 (with C9): the store step of a request that ended offers no chunk past the
    tokens it had computed: an abort before scheduling offers nothing."""
    found: list[Violation] = []
    for offer in trace.offers:
        if offer.status not in (RequestStatus.ABORTED.value, RequestStatus.FINISHED.value):
            continue
        spec = geometry.groups[offer.group]
        tpc = geometry.chunk_tokens(spec)
        past = [c for c in offer.offered if (c + 1) * tpc > offer.num_computed]
        if past:
            found.append(Violation(
                f"step {offer.step}: {offer.request} {offer.status} with "
                f"{offer.num_computed} tokens computed, but group {offer.group} offered "
                f"chunk {past[0]} (tokens {past[0] * tpc}-{(past[0] + 1) * tpc}): no KV "
                "was computed for it", Impact.CORRUPTION))
    return found


def _store_endings(trace: LifecycleTrace) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """``(failed, completed)``: per key, the steps at which a store job holding it failed
    and at which one completed."""
    failed: dict[str, list[int]] = defaultdict(list)
    completed: dict[str, list[int]] = defaultdict(list)
    for job in trace.jobs:
        if job.kind is not JobKind.STORE:
            continue
        if job.event is JobEvent.FAILED:
            for key in job.keys:
                failed[key].append(job.step)
        elif job.event is JobEvent.COMPLETED:
            for key in job.keys:
                completed[key].append(job.step)
    return failed, completed


def _stored_again(completed: Mapping[str, list[int]], key: str, since: int, until: int) -> bool:
    """A store of ``key`` completed at a step in ``[since, until]`` (fresh bytes)."""
    return any(since <= step <= until for step in completed.get(key, ()))


def failed_store_unpublished(trace: LifecycleTrace, geometry: Geometry) -> list[Violation]:
    """C14: a failed store publishes nothing: no chunk of a store job that failed is
    loaded by a later hit unless a store of it completed since (its bytes were never
    written, so reading them runs the request on garbage KV). A trace orders records by
    step only: a lookup in the failure's own step may have come before it (vLLM reports
    jobs after it schedules), so only lookups of later steps are owed, and a store that
    completed in the failure's step or after counts as fresh."""
    del geometry
    failed, completed = _store_endings(trace)
    if not failed:
        return []
    found: list[Violation] = []
    for record in trace.lookups:
        if record.answer is None:
            continue
        for key in record.load_keys:
            gone = [step for step in failed.get(key, ()) if step < record.step
                    and not _stored_again(completed, key, step, record.step)]
            if gone:
                found.append(Violation(
                    f"step {record.step}: {record.request}'s hit of {record.answer} tokens "
                    f"loads {key}, whose store job failed at step {gone[-1]} and was never "
                    "stored again: the failed store was published, the load reads KV that "
                    "was never written", Impact.CORRUPTION))
                break
    return found


# -- C15 load-failure recovery -----------------------------------------------------------
def needed_chunks(geometry: Geometry, group: GroupSpec, boundary: int) -> range:
    """The chunks of ``group`` whose KV a request with ``boundary`` tokens computed must
    hold on the GPU: every chunk below it (full attention), the chunks of its retained
    window ``Ret(boundary)`` (sliding window: the whole window of the new boundary), the
    chunk of its state (Mamba)."""
    tpc = geometry.chunk_tokens(group)
    end = -(-boundary // tpc)
    if group.kind is GroupKind.SLIDING_WINDOW:
        assert group.sliding_window is not None
        first = int(skipped_tokens(boundary, group.sliding_window,
                                   group.extra_retained_tokens)) // tpc
        return range(first, end)
    if group.kind is GroupKind.MAMBA:
        return range(max(0, end - 1), end)
    return range(0, end)


def recovers_from_failed_load(trace: LifecycleTrace, geometry: Geometry) -> list[Violation]:
    """C15: after a failed or cancelled load the request resumes at a boundary every
    group's needed KV of which is on the GPU: no failed chunk is needed unless loaded
    again from a store that completed after the failure; a later hit never loads a
    failed chunk still in the manager from before."""
    found: list[Violation] = []
    stored_after: dict[str, int] = {}
    for job in trace.jobs:
        if job.kind is JobKind.STORE and job.event is JobEvent.COMPLETED:
            for key in job.keys:
                stored_after[key] = max(stored_after.get(key, -1), job.step)
    for rec in trace.recoveries:
        if rec.resumed_at is None:
            continue
        failed = set(rec.failed)
        refilled = dict(rec.resumed_load_ranges)
        for g, spec in enumerate(geometry.groups):
            lo, hi = refilled.get(g, (0, 0))
            for chunk in needed_chunks(geometry, spec, rec.resumed_at):
                if (g, chunk) not in failed:
                    continue
                if lo <= chunk < hi:
                    continue  # loaded again by the resumed hit (checked below)
                found.append(Violation(
                    f"step {rec.step}: {rec.request}'s load of group {g} chunk {chunk} "
                    f"failed, but it resumed at {rec.resumed_at} tokens, which needs that "
                    "chunk's KV on the GPU: it runs on missing KV", Impact.CORRUPTION))
                break
        reloaded = set(rec.resumed_keys) & set(rec.failed_keys)
        for key in sorted(reloaded):
            if stored_after.get(key, -1) > rec.step:
                continue
            # Not a crash by itself: a transient failure reloads fine. But nothing
            # marks the chunk bad, so a persistent one (a lost or corrupt CPU copy)
            # repeats load, fail, recompute, lookup: the request never completes.
            found.append(Violation(
                f"step {rec.step}: {rec.request}'s load of {key} failed, and its next hit "
                "loads the same chunk again from the manager's unchanged state (a "
                "persistent failure repeats without end)",
                Impact.STALL))
    return found


def _deciding_lookup(lookups: tuple[LookupRecord, ...], submitted: int,
                     keys: frozenset[str]) -> int | None:
    """The index in ``lookups`` of the decision whose load job was submitted at step
    ``submitted`` (a backend submits a hit's loads in the step that decided it): the last
    decided lookup of that step, one that loads ``keys`` first (else, for a backend that
    records no such lookup, the last decided one before)."""
    chosen: int | None = None
    fallback: int | None = None
    for index, record in enumerate(lookups):
        if record.step > submitted:
            break
        if record.answer is None:
            continue
        if record.step == submitted and (keys & set(record.load_keys) or chosen is None):
            chosen = index
        fallback = index
    return chosen if chosen is not None else fallback


def _loaded_by_other(trace: LifecycleTrace, key: str, request: str, step: int) -> bool:
    """Another request's load job of ``key`` was submitted by ``step`` and had not ended
    before it."""
    opened: dict[int, bool] = {}
    for job in trace.jobs:
        if job.kind is not JobKind.LOAD or job.request == request or key not in job.keys:
            continue
        if job.event is JobEvent.SUBMITTED and job.step <= step:
            opened[job.job_id] = True
        elif job.event in JOB_ENDINGS and job.step < step:
            opened.pop(job.job_id, None)
    return bool(opened)


def failed_load_not_retried(trace: LifecycleTrace, geometry: Geometry) -> list[Violation]:
    """C15: a failed load is never retried: after a request's load failed, none of its
    later lookups (the one after the recovery, and every one after a preemption) loads a
    failed chunk again unless a store of it completed since, and none waits on the failed
    load (a failed chunk still counted as being loaded): the failure decides the request
    (it recomputes what it cannot load), it does not defer on the transfer that
    failed."""
    del geometry
    _, completed = _store_endings(trace)
    submitted = {job.job_id: job.step for job in trace.jobs
                 if job.event is JobEvent.SUBMITTED}
    found: list[Violation] = []
    for job in trace.jobs:
        if job.kind is not JobKind.LOAD or job.event is not JobEvent.FAILED or not job.keys:
            continue
        keys = frozenset(job.keys)
        lookups = trace.lookups_of(job.request)
        decided = _deciding_lookup(lookups, submitted.get(job.job_id, job.step), keys)
        if decided is None:
            continue
        for record in lookups[decided + 1:]:
            if record.answer is None:
                # Only a wait on the failed load itself (its chunk still counted as being
                # loaded, no other request's load of it open): a RETRY of the tier or a
                # fresh store's pending chunk is another cause, bounded by C13.
                waited = sorted(
                    w.key for w in record.waited_on
                    if w.key in keys and w.cause is DeferCause.LOADING_ELSEWHERE
                    and not _stored_again(completed, w.key, job.step, record.step)
                    and not _loaded_by_other(trace, w.key, job.request, record.step))
                if waited:
                    found.append(Violation(
                        f"step {record.step}: {job.request}'s lookup waits on {waited[0]}, "
                        f"whose load failed at step {job.step}: the failure should decide "
                        "it (recompute), not defer it", Impact.DELAY))
                    break
                continue
            again = sorted(k for k in keys & set(record.load_keys)
                           if not _stored_again(completed, k, job.step, record.step))
            if again:
                found.append(Violation(
                    f"step {record.step}: {job.request} loads {again[0]} again, whose load "
                    f"failed at step {job.step}, from the state that failed (no store of "
                    "it completed since): a persistent failure repeats load, fail, "
                    "recompute without end", Impact.STALL))
                break
    return found


def failed_load_state_consistent(trace: LifecycleTrace,
                                 geometry: Geometry) -> list[Violation]:
    """C15: a failed or cancelled load leaves no key referenced or counted as loading
    (the manager's state for the failed chunks is consistent afterwards)."""
    del geometry
    if trace.fatal:
        return []
    failed = {key for rec in trace.recoveries for key in rec.failed_keys}
    final = trace.final
    found: list[Violation] = []
    for key in sorted(failed & set(final.referenced_keys)):
        found.append(Violation(f"{key}'s failed load left a reference: never evictable",
                               Impact.WASTE))
    for key in sorted(failed & set(final.loading_keys)):
        found.append(Violation(f"{key}'s failed load still counts it as being loaded: "
                               "every later lookup of it defers", Impact.STALL))
    return found


def unobserved(trace: LifecycleTrace) -> tuple[str, ...]:
    """What the trace's backend could not observe (so an absent record is not a pass)."""
    return trace.notes


JUDGES: tuple[tuple[str, str, str, TraceJudge], ...] = (
    ("C13", "deferral-has-cause",
     "every deferral is caused by a RETRY, a pending chunk in its window, a chunk loading "
     "elsewhere or its own transfer, and names what it waits on", deferral_has_cause),
    ("C13", "deferral-bounded",
     "a deferred request is decided within D scheduler steps of its first deferral",
     deferral_is_bounded),
    ("C13", "decides-once-ready",
     "once the stores a deferral waits on have ended, the next lookup does not wait on "
     "them", decides_once_ready),
    ("C14", "raises-nothing",
     "abort, preemption, re-admission and cache reset at every point raise nothing",
     raises_nothing),
    ("C14", "follows-transitions", "each request moves only as the lifecycle allows",
     follows_transitions),
    ("C14", "jobs-end-once", "every job is submitted once and ends exactly once",
     jobs_end_once),
    ("C14", "nothing-left-pending",
     "no chunk stays pending, no request or key stays counted as loading",
     nothing_left_pending),
    ("C14", "no-store-from-freed-block", "nothing is stored from a freed or reused block",
     stores_only_live_blocks),
    ("C14", "ended-store-horizon",
     "an ended request's store step offers no chunk past its computed tokens",
     ended_store_horizon),
    ("C14", "failed-store-unpublished",
     "no chunk of a failed store job is loaded by a later hit unless a later store of it "
     "completed", failed_store_unpublished),
    ("C15", "resumes-on-present-kv",
     "after a failed load the request resumes where every needed chunk is on the GPU",
     recovers_from_failed_load),
    ("C15", "failed-load-state-consistent",
     "a failed load leaves no reference and no loading count behind",
     failed_load_state_consistent),
    ("C15", "failed-load-not-retried",
     "after a request's load failed, no later lookup of it loads the failed chunks again "
     "or waits on them", failed_load_not_retried),
)
"""Every lifecycle judge: ``(clause, name, description, judge)``, in clause order."""


JUDGE_IMPACT: dict[str, Impact] = {
    "deferral-has-cause": Impact.DELAY, "deferral-bounded": Impact.STALL,
    "decides-once-ready": Impact.DELAY, "raises-nothing": Impact.CRASH,
    "follows-transitions": Impact.CRASH, "jobs-end-once": Impact.CRASH,
    "nothing-left-pending": Impact.STALL, "no-store-from-freed-block": Impact.CORRUPTION,
    "ended-store-horizon": Impact.CORRUPTION, "failed-store-unpublished": Impact.CORRUPTION,
    "resumes-on-present-kv": Impact.CORRUPTION, "failed-load-state-consistent": Impact.STALL,
    "failed-load-not-retried": Impact.STALL,
}
"""The worst impact each judge's findings have (each finding carries its own: a
deferral decided late is ``delay``, one never decided ``stall``); what ``kvcontract
list`` shows."""


def judge_trace(trace: LifecycleTrace, geometry: Geometry,
                clauses: Iterable[str] = ("C13", "C14", "C15")) -> dict[str, list[Violation]]:
    """Every judge of the named clauses on one trace: ``{"C13/deferral-bounded": [...]}``
    (the live backend's entry point)."""
    wanted = set(clauses)
    return {f"{clause}/{name}": judge(trace, geometry)
            for clause, name, _, judge in JUDGES if clause in wanted}


# -- the executable system's lifecycle programs (the case space) -------------------------
ACTIONS = ("-", "add c", "abort p", "abort c", "preempt p", "preempt c", "error p",
           "stall-store", "fail-store", "fail-load", "reset-cache", "retry-lookups")
"""What may happen before each scheduler step of a program: nothing (``-``), the
consumer ``c`` arrives (a resend of the producer's prompt), an abort or a preemption
of either, the producer finishes with an error wherever its prefill is (vLLM's
``FINISHED_ERROR``; ignored unless it is running), the environment stalls or fails
the next store job or fails the next load job, the prefix caches are reset, the offload
tier answers RETRY to every lookup for ``RETRY_STEPS`` steps (longer than ``D``)."""

SEED_PROGRAMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("stalled-store", ("stall-store", "add c")),
    ("stalled-final-store", ("-", "-", "-", "stall-store", "add c")),
    ("abort-unscheduled", ("abort p",)),
    ("abort-loading", ("-", "add c", "abort c")),
    ("preempt-store-in-flight", ("-", "preempt p", "add c")),
    ("failed-store", ("fail-store", "-", "add c")),
    ("failed-load", ("-", "fail-load", "add c")),
    ("reset-during-load", ("-", "add c", "reset-cache")),
    ("retried-lookup", ("-", "-", "-", "retry-lookups", "add c")),
    ("error-mid-prefill", ("-", "error p")),
)
"""The named lifecycle scenarios of issue 21, checked first (their witnesses are the
ones a report shows): a stalled write a resend waits on (vLLM #49829: the producer's
first store job, and its last one, whose chunks the resend's window reads on any
geometry), an abort before
the first schedule (#49118), an abort with loads in flight, a preemption with its store
in flight and a re-admission (#46014), a failed store a resend then looks up, a failed
load (#35223, #45474) and the resend's lookup after it, a cache reset
while a load holds its chunks, a resend whose lookups the offload tier answers RETRY for
longer than the bound (P2P lookups stuck in RETRY: #56823, #56836), a producer
finished with an error after its first prefill step (``FINISHED_ERROR`` mid-prefill: its
store job may offer only the 8 tokens it computed, vLLM 0.34.0)."""

LIFECYCLE_DEPTH = 3
"""Actions per program in the catalogue: every sequence up to this length is run."""


@dataclass(frozen=True)
class LifecycleCase:
    """One program: the producer ``p`` arrives, then ``actions[i]`` happens before step
    ``i + 1``; then the tail of steps of :class:`~kvcontract.impl.system.lifecycle.
    ProgramConfig` runs (longer than the bound ``D``) and every job that can end ends."""

    geometry_name: str
    geometry: Geometry
    actions: tuple[str, ...]
    label: str = ""
    """A seed scenario's name (empty for the enumerated programs)."""
    prompt_len: int = 0
    """The producer's prompt (0: the family's, :class:`~kvcontract.impl.system.lifecycle.
    ProgramConfig`); a scoped run sizes it to its geometry (:func:`scoped_cases`)."""
    token_budget: int = 0
    """Tokens per step (0: the family's)."""

    def config(self) -> Any:
        """The program's :class:`~kvcontract.impl.system.lifecycle.ProgramConfig`."""
        from kvcontract.impl.system.lifecycle import ProgramConfig

        default = ProgramConfig()
        return dataclasses.replace(
            default, prompt_len=self.prompt_len or default.prompt_len,
            token_budget=self.token_budget or default.token_budget)

    def program(self) -> list[str]:
        ops = ["add p"]
        for action in self.actions:
            if action != "-":
                ops.append(action)
            ops.append("step")
        return ops

    def to_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "geometry_name": self.geometry_name, "geometry": self.geometry.to_dict(),
            "actions": list(self.actions), "label": self.label}
        if self.prompt_len or self.token_budget:
            shown.update(prompt_len=self.prompt_len, token_budget=self.token_budget)
        return shown

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LifecycleCase:
        actions = tuple(str(a) for a in data["actions"])
        unknown = [a for a in actions if a not in ACTIONS]
        if unknown:
            raise WitnessError(f"unknown lifecycle action {unknown[0]!r}; the actions are "
                               f"{', '.join(ACTIONS)}")
        sizes = [data.get("prompt_len", 0), data.get("token_budget", 0)]
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in sizes):
            raise WitnessError(f"prompt_len and token_budget must be integers >= 0, not "
                               f"{sizes[0]!r} and {sizes[1]!r}")
        return cls(str(data.get("geometry_name", "witness")),
                   Geometry.from_dict(dict(data["geometry"])), actions,
                   str(data.get("label", "")), int(sizes[0]), int(sizes[1]))


def lifecycle_geometries() -> list[tuple[str, Geometry]]:
    """Small hybrid geometries: full attention and a sliding window of two blocks, one
    block per chunk (every chunk its own job) and two (a window's first chunk partly
    out of the window)."""
    return [("fa4+swa4(sw8)", Geometry((fa(4), swa(4, 8)), blocks_per_chunk=1)),
            ("fa4+swa4(sw8),bpc2", Geometry((fa(4), swa(4, 8)), blocks_per_chunk=2))]


def lifecycle_cases(depth: int = LIFECYCLE_DEPTH) -> Iterator[LifecycleCase]:
    """The seed scenarios, then every action sequence up to ``depth``, shortest first,
    on every geometry of :func:`lifecycle_geometries`."""
    geometries = lifecycle_geometries()
    for name, geometry in geometries:
        for label, actions in SEED_PROGRAMS:
            yield LifecycleCase(name, geometry, actions, label)
    for length in range(depth + 1):
        for actions in itertools.product(ACTIONS, repeat=length):
            for name, geometry in geometries:
                yield LifecycleCase(name, geometry, actions)


def lifecycle_domain(depth: int = LIFECYCLE_DEPTH) -> str:
    from kvcontract.impl.system.lifecycle import ProgramConfig

    config = ProgramConfig()
    names = ", ".join(name for name, _ in lifecycle_geometries())
    return (f"the system on {names}: {len(SEED_PROGRAMS)} seed scenarios and every "
            f"sequence of <= {depth} of {len(ACTIONS)} actions, one per step, after a "
            f"{config.prompt_len}-token producer ({config.token_budget} tokens a step, "
            f"{config.tail_steps} more steps, D = {config.deferral_bound})")


def scoped_program_size(geometry: Geometry) -> tuple[int, int]:
    """``(prompt_len, token_budget)`` of a scoped run's programs on ``geometry``: a prompt
    of at least four of its largest chunks and past its widest window (plus two chunks),
    one token more so its last chunk is partial, prefilled over three steps."""
    widest_chunk = max(geometry.chunk_tokens(g) for g in geometry.groups)
    window = max((g.sliding_window or 0) + g.extra_retained_tokens for g in geometry.groups)
    prompt = max(4 * widest_chunk, window + 2 * widest_chunk) + 1
    return prompt, -(-prompt // 3)


def scoped_cases(scope: Iterable[tuple[str, Geometry]], depth: int = 1) -> Iterator[
        LifecycleCase]:
    """The lifecycle programs of a scoped run (``--model``/``--geometry``): the seed
    scenarios and every sequence of up to ``depth`` actions on each given geometry, the
    prompt and budget sized to it (:func:`scoped_program_size`)."""
    scope = list(scope)
    for name, geometry in scope:
        prompt, budget = scoped_program_size(geometry)
        for label, actions in SEED_PROGRAMS:
            yield LifecycleCase(name, geometry, actions, label, prompt, budget)
    for length in range(depth + 1):
        for actions in itertools.product(ACTIONS, repeat=length):
            for name, geometry in scope:
                prompt, budget = scoped_program_size(geometry)
                yield LifecycleCase(name, geometry, actions, "", prompt, budget)


def scoped_domain(scope: Iterable[tuple[str, Geometry]], depth: int = 1) -> str:
    scope = list(scope)
    sizes = "; ".join(f"{name}: {scoped_program_size(g)[0]}-token prompt, "
                      f"{scoped_program_size(g)[1]} tokens a step" for name, g in scope)
    count = sum(1 for _ in scoped_cases(scope, depth))
    from kvcontract.impl.system.lifecycle import ProgramConfig

    bound = ProgramConfig().deferral_bound
    return (f"{count} lifecycle programs on the executable system: {len(SEED_PROGRAMS)} seed "
            f"scenarios and every sequence of <= {depth} of {len(ACTIONS)} actions per "
            f"geometry ({sizes}; D = {bound})")


def _observe(case: LifecycleCase, impl: Implementation) -> LifecycleTrace:
    from kvcontract.impl.system.lifecycle import run_program

    return run_program(case.geometry, impl, case.program(), case.config())


observe_lifecycle: LastCase[LifecycleCase, LifecycleTrace] = LastCase(_observe)

LIFECYCLE_SPACE: CaseSpace[LifecycleCase, LifecycleTrace] = CaseSpace(
    family=Family.LIFECYCLE, cases=lifecycle_cases, describe=lifecycle_domain,
    to_json=LifecycleCase.to_json, from_json=LifecycleCase.from_json,
    observe=observe_lifecycle, geometry_of=lambda case: case.geometry,
    driver="kvcontract's executable system (impl/system) over the bound primitives",
    drivers=("lookup_complete_chunks", "StoreTracker.*", "group_first_live_block",
             "group_load_range"),
    not_on_bound_code=(
        "the request's lifecycle (C13-C15) is vLLM's scheduler and connector, which the "
        "stand-ins do not run; `audit --live` judges it on vLLM itself"),
)

LIFECYCLE_FUNCTIONS = (
    "deferral_clock", "deferral_expired", "store_job_published", "get_num_offloadable_tokens",
    "store_step_bounds",
    "store_chunk_offered", "store_final_segment_end", "store_replay_boundaries",
    "is_block_reachable", "initial_lookup_cap", "multigroup_lookup_step",
    "sliding_window_lookup", "prefix_lookup",
    "get_sliding_window_size_in_chunks", "load_window_size_in_chunks", "load_chunk_range",
    "retained_block_range", "get_num_skipped_tokens")
"""Every bundle function a lifecycle program's decisions run: the deadline rule and what
a failed store publishes first (the lifecycle's own), then the store path and the lookup
the system drives."""


@dataclass
class TimelinePicture(Picture):
    """A lifecycle witness as a timeline: one row per scheduler step and request
    (``(step, request, what happened)``), drawn by ``kvcontract explain`` as steps."""

    timeline: list[tuple[int, str, str]] = field(default_factory=list)
    offending_steps: set[int] = field(default_factory=set)


def timeline_of(trace: LifecycleTrace) -> list[tuple[int, str, str]]:
    """Every record of a trace as ``(step, request, text)``, in step order."""
    rows: list[tuple[int, int, str, str]] = []
    order = 0

    def add(step: int, request: str, text: str) -> None:
        nonlocal order
        rows.append((step, order, request, text))
        order += 1

    for lookup in trace.lookups:
        if lookup.answer is None:
            waited = ", ".join(f"{w.key} {w.cause.value}" for w in lookup.waited_on[:3])
            add(lookup.step, lookup.request, f"lookup deferred: {waited or 'no cause'}")
        else:
            how = " by the deadline" if lookup.by_deadline else ""
            add(lookup.step, lookup.request,
                f"lookup decided {lookup.answer} tokens{how} (local {lookup.local_hit})")
    for s in trace.states:
        add(s.step, s.request, f"{s.state.value} ({s.num_computed} computed)")
    for job in trace.jobs:
        keys = ",".join(job.keys[:4]) + ("..." if len(job.keys) > 4 else "")
        add(job.step, job.request, f"{job.kind.value} job {job.job_id} {job.event.value} "
            f"[{keys}]")
    for e in trace.exceptions:
        add(e.step, e.request or "-", f"RAISED {e.type_name} in {e.where}: {e.message}")
    for r in trace.recoveries:
        add(r.step, r.request, f"load failed for {','.join(r.failed_keys[:4])}: resumes "
            f"at {r.resumed_at}")
    for stale in trace.final.stale_stores:
        add(stale.step, stale.request, f"store job {stale.job_id} reads {stale.reason.value} "
            f"block {stale.block}")
    rows.sort(key=lambda r: (r[0], r[1]))
    return [(step, request, text) for step, _, request, text in rows]


def _steps_named(message: str) -> set[int]:
    return {int(m) for m in re.findall(r"step (\d+)", message)}


def lifecycle_picture(judge: TraceJudge) -> Callable[[LifecycleCase, Implementation],
                                                      Picture]:
    def draw(case: LifecycleCase, impl: Implementation) -> Picture:
        trace = observe_lifecycle(case, impl)
        found = judge(trace, case.geometry)
        notes = [f"program: {' ; '.join(case.program())}, then "
                 f"{case.config().tail_steps} steps"
                 + (f" ({case.label})" if case.label else ""),
                 *[str(v) for v in found[:3]], *trace.notes]
        steps = set().union(*(_steps_named(str(v)) for v in found)) if found else set()
        return TimelinePicture(case.geometry, case.config().prompt_len, None, notes=notes,
                               timeline=timeline_of(trace), offending_steps=steps)

    return draw


def _case_judge(judge: TraceJudge) -> Callable[[LifecycleCase, LifecycleTrace], str | None]:
    def case_judge(case: LifecycleCase, trace: LifecycleTrace) -> str | None:
        found = judge(trace, case.geometry)
        return found[0] if found else None

    case_judge.__name__ = judge.__name__
    return case_judge


# -- the deadline rule for every step (Z3, by induction) ---------------------------------
DEADLINE_BOUNDS = (0, 1, 4, 16, 1024)
"""The bounds of the deadline rule's case split, should the symbolic bound not decide."""


def deadline_rule_bounds_age(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """Induction over the steps of one deferral: the clock's start never moves past the
    first deferral (base: the first deferral at ``t0`` starts it at most at ``t0``;
    step: a start at most ``t0`` stays at most ``t0`` at any later step ``t``), and a
    start at most ``t0`` expires at every step ``t >= t0 + D``. Together: a request
    deferred at every step from ``t0`` is decided by step ``t0 + D`` (C13)."""
    t0, t, start, bound = env["t0"], env["t"], env["start"], env["D"]
    hyps = [t0 >= 0, t > t0, start >= 0, start <= t0, bound >= 0]
    env.assume(hyps)
    first = env.call(impl.deferral_clock, -1, t0)
    kept = env.call(impl.deferral_clock, start, t)
    expires = env.call(impl.deferral_expired, kept, t, bound)
    base = and_(first >= 0, first <= t0)
    step = and_(kept >= 0, kept <= t0)
    deadline = or_(t < t0 + bound, expires)
    return hyps, and_(base, step, deadline)


def deadline_rule_not_early(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """The other side of the deadline: a deferral whose clock started at ``start`` does
    not expire before step ``start + D``, and without a deadline (``NO_BOUND``) it never
    expires. Expiring earlier decides the lookup over the ready chunks while a load the
    request waits on may still complete: its tokens are recomputed (a lost hit)."""
    t, start, bound = env["t"], env["start"], env["D"]
    hyps = [start >= 0, t >= start, bound >= 0]
    env.assume(hyps)
    expires = env.call(impl.deferral_expired, start, t, bound)
    unbounded = env.call(impl.deferral_expired, start, t, NO_BOUND)
    return hyps, and_(implies(expires, t >= start + bound), not_(unbounded))


def lifecycle_properties() -> list[Property]:
    """C13-C15: the deadline rule for every step (formula), and every lifecycle judge on
    every program of the case space (exhaustive)."""
    made: list[Property] = [FormulaProperty(
        "C13", "deadline-rule-bounds-age",
        "a deferral's clock starts at its first deferral and expires D steps later",
        ("t0", "t", "start"), deadline_rule_bounds_age,
        lambda: [Config(f"D={bound}", {"D": bound}) for bound in DEADLINE_BOUNDS],
        "every first-deferral step t0 >= 0, later step t and clock start <= t0, "
        f"D in {{{', '.join(str(b) for b in DEADLINE_BOUNDS)}}}",
        uses=("deferral_clock", "deferral_expired"),
        symbolic_sizes=("D",),
        symbolic_domain="every bound D >= 0",
        impact=Impact.STALL,
    ), FormulaProperty(
        "C13", "deadline-not-early",
        "a deferral expires no earlier than D steps after its clock started, and never "
        "without a deadline",
        ("t", "start"), deadline_rule_not_early,
        lambda: [Config(f"D={bound}", {"D": bound}) for bound in DEADLINE_BOUNDS],
        "every clock start >= 0 and step t >= start, "
        f"D in {{{', '.join(str(b) for b in DEADLINE_BOUNDS)}}} and no deadline",
        uses=("deferral_expired",),
        symbolic_sizes=("D",),
        symbolic_domain="every bound D >= 0, and no deadline",
        impact=Impact.LOST_HIT,
    )]
    for clause, name, description, judge in JUDGES:
        # Every judge reads a trace alone, so the fuzzer's monitor judges it on the
        # trace of each program it runs, as the prover does on this space's programs.
        made.append(CaseProperty(clause, name, description, LIFECYCLE_SPACE,
                                 _case_judge(judge), LIFECYCLE_FUNCTIONS,
                                 lifecycle_picture(judge), impact=JUDGE_IMPACT[name],
                                 observable_on=frozenset({Observer.MONITOR})))
    return made
