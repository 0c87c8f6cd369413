"""The contract judged inside a running vLLM: every lookup, load and store its offloading
connector makes, judged as it happens (``kvcontract.monitor`` is the pytest plugin and the
serving hook over this engine).

Contract: :meth:`RuntimeMonitor.install` wraps methods of the running vLLM's
``OffloadingConnectorScheduler`` class (found by capability, never by version: the class
wherever the release defines it, each method only where it exists; what is missing is a
``gap``) without changing vLLM's files; :meth:`RuntimeMonitor.uninstall` puts them back.
A wrapper calls vLLM's method unchanged, then reads what it did from vLLM's own objects:

* the connector's geometry from its ``SchedulerOffloadConfig`` (:func:`geometry_of`: the
  KV-cache spec of each group, ``blocks_per_chunk``, ``tokens_per_hash``, the retention
  interval, DCP, the EAGLE groups and the engine's ``num_hash_lookahead_tokens``); a
  connector whose geometry the contract does not describe is watched and not judged,
  with the reason;
* each answer of its manager's ``lookup`` (the manager's own ``lookup`` wrapped on that
  instance; a ``unittest.mock`` manager's on that mock's own class, so what the test
  configures, asserts and reads back is untouched);
* ``get_num_new_matched_tokens`` (C2, C3, C4, C5; C15 after a failed load): the hit
  judged against the contract's answer for the states seen (:func:`judge_states`): the
  chunks the connector did not ask about are filled once with MISS and once with HIT.
  Equal answers decide the case (the contract's best boundary only grows as chunks
  become present). Unequal answers mean vLLM answered without reading chunks its answer
  depends on: it answers the same in both states, so the one where the contract
  disagrees is the witness. The judging itself is
  :class:`kvcontract.tools.monitor.Monitor`'s, the fuzzer's;
* the shared-prefix junction after such a lookup (C12, ``C12/junction-registered``,
  docs/CONTRACT.md 9.3): where the contract agrees with vLLM's hit, the
  ``shared_prefix_boundary`` vLLM left on the request is the spec's junction for that
  hit (:func:`spec_junction_of`: ``junction_boundary`` of the boundary the
  full-attention groups serve with the chunks seen HIT, clamped to the first sparse
  group's keys; the retention interval the connector's config holds then). vLLM never
  lowers a junction the local prefix cache set before the lookup: below the spec's it
  must be raised to it, with no spec junction it must stay; one at or above the spec's
  is not judged (the contract does not say which of two a request keeps). None or a
  lower one is a lost hit (the recompute drops the window's state at the junction, a
  later consumer recomputes past it), one the spec does not owe waste;
* ``update_state_after_alloc`` (C1, C2, C15): the GPU blocks retained after the hit
  (``Ret``), each loaded key's last answer (a load of a key the manager answered MISS or
  HIT_PENDING is upstream's "not found" / "not ready" crash), the chunks loaded against
  ``Load(N, L)``, and no load at all after a failed one;
* ``build_connector_meta`` (C8, C9, C10): each request's store step offers to the
  manager's ``prepare_store`` (hooked like its ``lookup``) exactly the chunks of the
  spec's step from the same state
  (:func:`kvcontract.spec.properties.store.spec_step_offers`, the store judges' own: the
  mask at the spec's horizon, the replay boundaries and the request's junction, the
  blocks still live; the state is vLLM's stored index and the chunks the request offered
  since its first store step): more is C8 (waste), fewer C9 (a lost store), and vLLM's
  index after a running step is the spec's (C9); a store job's chunks hold only tokens
  computed by the end of the step (C10). Each call is a scheduler step, the clock of
  C13: a request deferred at step ``s`` is decided by ``s + D``
  (:attr:`MonitorOptions.deferral_bound`), later a ``delay``, never (it ends, or its test
  or run does, still deferred) a ``stall``;
* a deferral (C13, ``deferral-has-cause``): a lookup answered ``None`` has a cause the
  contract allows: a transfer of the request's own in flight, a RETRY, a pending chunk
  in the window of the contract's answer for the states seen (C3's rule: a needless
  deferral in C3's scope is C3's finding), a chunk of that answer's load set another
  request's load job holds; and (``decides-once-ready``) what it waits on has not ended:
  a deferral whose every wait is on a job the worker reported done (its own
  ``transfer_jobs``, a chunk still counted as being loaded, on a real manager a chunk
  answered pending after its store ended) is a ``delay``;
* ``update_connector_output`` (C13, C14, C15): the jobs the worker reports done; a store
  job the worker reports failed is not completed as stored (the manager's
  ``complete_store`` hooked like its ``lookup``); a request whose load failed is
  remembered;
* partial tails (docs/CONTRACT.md 9.2; where the release has them: the connector
  config's ``supports_partial_tail``, the request state's ``partial_tail_boundary``):
  vLLM's decision to turn them on is the contract's (``C12/partial-tail-on``:
  :func:`~kvcontract.spec.partial_tail.partial_tail_off` of the connector's geometry;
  off where the contract has them is C12, on where it states them off C2); a lookup that
  accepts a hit off a chunk boundary ends at a multiple of the hash block among the
  boundaries the search covers past the complete-chunk hit, within the request's tokens
  less one and its load caps, with every group's key there answered HIT
  (``C2/partial-tail-boundary``), and, where no sparse group cut the complete hit, no
  candidate above it had every key answered HIT (``C4/partial-tail-maximal``); its load
  names only keys that lookup answered HIT (else upstream's "not found"/"not ready") and
  none another request's load has in flight (``C2/partial-tail-loads``; a second
  transfer, C2 ``partial-tail-in-flight``, waste); a partial-tail search's deferral has
  its cause (C13, a key pending or being loaded). These findings carry a witness (the
  boundary, the keys by group and position, the answers) and no reproducer (the audit
  replays no partial-tail theorem: the message says so);
* an exception vLLM raises with upstream's crash messages (C2, ``crash``).

What it does not judge (and counts, by reason, in ``not_judged``, with the first test of
each): lookups while an asynchronous lookup is in flight (RETRY), while the request has
transfers in flight or another request loads its chunks (the connector's own deferral
rules); of partial tails, C12's promise (``b(P)`` is the producer's prompt's, which no
lookup shows: ``kvcontract.live.partial_tail`` judges it on traces), the maximality of a
tail whose search an anchor widened (a sparse group cut the complete-chunk hit below the
full-attention one: which boundary is owed needs the producer's stores), the boundary and
on/off decision of a geometry the contract names but does not check (EAGLE groups), and a
tail's load whose lookup the monitor did not judge; requests that skip or may not read
the offloaded tier, lookups a test replaced on the connector instance, stand-in requests, and states
that involve chunks vLLM has no offload keys for; deferrals that wait on a job or a
loading count the monitor never saw (a test's fixture); store steps of a request whose
stores restarted (a preemption, a cache reset: the store spec has neither), whose step
counts tokens the request does not hold yet (asynchronous scheduling's placeholders,
draft tokens) or output tokens before its prompt is computed, of a Mamba group, where
vLLM's block table or hashes hold fewer chunks than the spec's storable ones, or where
the connector's alignment, retention or hash mode is not the geometry's; junctions of a
geometry outside the contract's junction cases (a Mamba group, an EAGLE drop, lookahead
hashes), of a request that holds no ``shared_prefix_boundary`` (a release without
junctions, a test's mock), of a lookup the contract does not agree with, or whose
full-attention boundary reads a pending chunk or lies off a chunk end under a
``max_load_tokens`` cap (vLLM rounds it there).

A lookup violation has a witness (the lookup case, replayable by ``kvcontract.replay`` on
the reference and by ``kvcontract.api.replay_audit`` on vLLM's engine) and, where a
reproducer folder is set, a pytest file that replays it (:func:`reproducer_source`). A
store-step violation (C8, C9) has one where the request's store steps map onto a
:class:`~kvcontract.spec.properties.store.StoreCase` (:class:`StoreHistory`, kept per
request like its offers: prompt, the tokens computed at its first store step, each
prefill step's tokens, its decode steps and ending; an ending after the finding's step
when it has none yet), its spec run gives the step the monitor judged, and the
reference meets the theorem on it (:func:`store_theorem`: ``C8/stores-only-demanded``,
``C8/offered-at-most-once`` or ``C9/store-steps``, replayed on vLLM's engine as its
``upstream-store-`` theorem). Only the witness is built in the monitored process; the
reproducer replays it. Where it maps onto none (a refused ``prepare_store``, a test's
mock manager driving the connector by hand, a step the monitor did not judge, a
schedule no StoreCase has, an earlier step that already departed from the spec, a
geometry vLLM's engine does not build) the finding says so in one clause
(``no reproducer: ...``). A shared-prefix junction violation has a witness (the lookup
case and the junctions) and no reproducer (the audit binds no junction rule of vLLM's).
Every violation carries its request's last connector events (a ring of
:attr:`MonitorOptions.recent_events`).

A wrapper never changes what vLLM returns or raises: the monitor's own exceptions are
recorded in ``errors`` and swallowed. Memory is bounded: what is kept per request is
dropped when it finishes, and at most :attr:`MonitorOptions.max_requests` requests are
remembered per connector.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import pprint
import sys
import threading
import weakref
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from kvcontract.impl.system.events import AllocationEvent, LookupEvent
from kvcontract.spec import multigroup
from kvcontract.spec.geometry import Geometry, GroupSpec
from kvcontract.spec.lifecycle import DEFAULT_DEFERRAL_BOUND, deferral_age, within_deferral_bound
from kvcontract.spec.partial_tail import (
    partial_tail_candidates,
    partial_tail_key_position,
    partial_tail_off,
)
from kvcontract.spec.properties.lookup import LookupCase
from kvcontract.spec.properties.lookup import contract_answer as lookup_contract_answer
from kvcontract.spec.properties.store import (
    StoreCase,
    schedule_steps,
    spec_step_offers,
    step_bounds,
    store_expected_offers,
)
from kvcontract.spec.reachability import (
    group_marked_blocks,
    store_replay_boundaries,
    stored_token_count,
)
from kvcontract.tools.monitor import Monitor
from kvcontract.vocabulary import GroupKind, Impact, LookupResult, RequestStatus

MONITOR_REPORT_VERSION = 1
"""The version of the monitor's report document (``kvcontract_monitor``)."""

SCHEDULER_MODULES = (
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector",
)
"""Where releases define ``OffloadingConnectorScheduler`` (0.33.0 and later first)."""

WRAPPED = ("__init__", "get_num_new_matched_tokens", "_lookup_complete_chunks",
           "update_state_after_alloc", "build_connector_meta", "update_connector_output",
           "request_finished", "reset_cache")
"""The connector's methods the monitor wraps (each where the release has it)."""

LOOKUP_INTERNALS = ("_lookup", "_lookup_complete_chunks", "_sliding_window_lookup",
                    "_maximal_prefix_lookup", "_lookup_partial_tail_hit", "_lookup_partial_tail")
"""The connector's own lookup steps: one a test set on the instance (a mock) answers in
place of vLLM's, so the lookup is not vLLM's to judge."""

CRASH_MARKERS = ("not found in cache", "not ready for reading")
"""Upstream's messages for a load of a chunk the manager does not hold ready (C2)."""

THEOREM_OF_CLAUSE = {"C2": "C2/lookup-loads-only-hit", "C3": "C3/lookup-defers-only-in-scope",
                     "C4": "C4/lookup-is-maximal", "C5": "C4/lookup-is-maximal"}
"""The catalogue theorem that replays a lookup violation of each clause."""

PARTIAL_TAIL_HIT = "a partial-tail hit"
"""The scope rule's word for a lookup that accepted a hit off a chunk boundary (vLLM's
``partial_tail_boundary``): judged by the partial-tail checks, not the chunk lookup's."""

NO_PARTIAL_TAIL_REPRODUCER = ("no reproducer: the audit replays no partial-tail theorem; "
                              "kvcontract.live.partial_tail judges such traces on vLLM's "
                              "engine")
"""The clause a partial-tail finding carries in place of a reproducer."""


@dataclass(frozen=True)
class MonitorOptions:
    """How the monitor runs (merged once by its front ends)."""

    reproducers: Path | None = None
    """Where a pytest reproducer is written per violation (None: none written)."""
    max_requests: int = 4096
    """Requests remembered per connector (the oldest are dropped first)."""
    on_violation: Callable[[Finding], None] | None = None
    """Called with each violation as it is found (the serving hook logs it)."""
    recent_events: int = 16
    """The connector events kept per request (a ring), attached to its violations."""
    deferral_bound: int = DEFAULT_DEFERRAL_BOUND
    """``D`` of C13: scheduler steps a request may stay deferred (a deployment's own)."""


@dataclass
class Finding:
    """One violation: where (test, connector event), which clause, what it costs."""

    test: str
    clause: str
    impact: str
    kind: str
    message: str
    theorem: str | None = None
    witness: dict[str, Any] | None = None
    reproducer: str | None = None
    repeats: int = 1
    """The times the same test saw the same violation (a deferred request asks again)."""
    recent: list[str] | None = None
    """The request's last connector events before the violation (its ring)."""

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items()}


@dataclass
class MonitorReport:
    """What a monitored run saw: the JSON document of ``--kvcontract-report``."""

    vllm: str | None = None
    tests: int = 0
    events: Counter[str] = field(default_factory=Counter)
    judged: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    """Judgements of the checks that share a clause, by theorem-style name
    (``C13/deferral-has-cause``, ``C9/store-step``); each is in ``judged`` too."""
    not_judged: Counter[str] = field(default_factory=Counter)
    examples: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per reason a lookup or load was not judged, the first one seen (test and detail)."""
    violations: list[Finding] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    variant: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kvcontract_monitor": MONITOR_REPORT_VERSION,
            "vllm": self.vllm,
            "variant": self.variant,
            "tests": self.tests,
            "events": dict(sorted(self.events.items())),
            "judged": dict(sorted(self.judged.items(), key=lambda kv: _clause_order(kv[0]))),
            "checks": dict(sorted(self.checks.items(),
                                  key=lambda kv: (_clause_order(kv[0].split("/")[0]), kv[0]))),
            "not_judged": dict(self.not_judged.most_common()),
            "not_judged_examples": dict(self.examples),
            "violations": [v.to_json() for v in self.violations],
            "errors": list(self.errors),
            "gaps": list(self.gaps),
        }

    def judge(self, check: str) -> None:
        """Count one judgement of ``check`` (``C13/decides-once-ready``) and its clause."""
        self.judged[check.split("/")[0]] += 1
        self.checks[check] += 1

    def skip(self, reason: str, test: str, detail: str = "") -> None:
        """Count what was not judged, by reason, keeping the first example of each."""
        self.not_judged[reason] += 1
        self.examples.setdefault(reason, {"test": test, "detail": detail})

    def summary_lines(self) -> list[str]:
        """The one-screen summary printed at the end of a session."""
        events = sum(self.events.values())
        lines = [f"kvcontract monitor: vLLM {self.vllm or '?'}"
                 + (f", variant {self.variant}" if self.variant else "")
                 + f": {self.tests} tests, {events} connector events, "
                 f"{sum(self.judged.values())} judgements, {len(self.violations)} violations, "
                 f"{len(self.errors)} monitor errors"]
        if self.judged:
            lines.append("  judged: " + ", ".join(
                f"{c} {n}" for c, n in sorted(self.judged.items(),
                                               key=lambda kv: _clause_order(kv[0]))))
        if self.checks:
            lines.append("  of which: " + ", ".join(
                f"{c} {n}" for c, n in sorted(self.checks.items(), key=lambda kv: (
                    _clause_order(kv[0].split("/")[0]), kv[0]))))
        for reason, count in self.not_judged.most_common(4):
            lines.append(f"  not judged ({count}): {reason}")
        by_clause = Counter(v.clause for v in self.violations)
        if by_clause:
            lines.append("  violations: " + ", ".join(
                f"{c} {n}" for c, n in sorted(by_clause.items(),
                                               key=lambda kv: _clause_order(kv[0]))))
        seen: set[tuple[str, str]] = set()
        for finding in self.violations:
            key = (finding.clause, finding.kind)
            if key in seen or len(seen) >= 8:
                continue
            seen.add(key)
            lines.append(f"  {finding.clause} {finding.impact}: {finding.test}")
            lines.append(f"      {finding.message[:150]}")
        for error in self.errors[:3]:
            lines.append(f"  monitor error in {error['where']}: {error['message'][:120]}")
        for gap in self.gaps[:3]:
            lines.append(f"  gap: {gap}")
        return lines

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")


def _clause_order(clause: str) -> int:
    return int(clause[1:]) if clause[1:].isdigit() else 99


# -- the geometry vLLM built ------------------------------------------------------------------
def geometry_of(config: Any, hash_lookahead: int | None) -> tuple[Geometry | None, str | None]:
    """The contract's geometry of a connector's ``SchedulerOffloadConfig``, or why it has
    none (a group kind the contract does not describe, a size that does not add up)."""
    from kvcontract.live.capabilities import vllm_names

    full, sliding, mamba = vllm_names("vllm.v1.kv_cache_interface", "FullAttentionSpec",
                                      "SlidingWindowSpec", "MambaSpec")
    dcp = int(getattr(config, "dcp_world_size", 1) or 1)
    groups: list[GroupSpec] = []
    for index, group in enumerate(config.kv_group_configs):
        spec = group.kv_cache_spec
        name = type(spec).__name__
        eagle = bool(getattr(group, "is_eagle_group", False))
        if isinstance(spec, sliding):
            groups.append(GroupSpec(GroupKind.SLIDING_WINDOW, int(spec.block_size),
                                    int(spec.sliding_window),
                                    int(getattr(spec, "extra_retained_tokens", 0) or 0), eagle))
        elif isinstance(spec, mamba):
            if getattr(spec, "mamba_cache_mode", "align") != "align":
                return None, f"group {index}: a Mamba group outside the 'align' cache mode"
            groups.append(GroupSpec(GroupKind.MAMBA, int(spec.block_size), eagle=eagle))
        elif type(spec) is full or name in ("FullAttentionSpec", "MLAAttentionSpec"):
            groups.append(GroupSpec(GroupKind.FULL, int(spec.block_size), eagle=eagle))
        else:
            return None, f"group {index}: {name} is outside the contract"
    lookahead = int(hash_lookahead or 0) if any(g.eagle for g in groups) else 0
    try:
        geometry = Geometry(tuple(groups), int(config.blocks_per_chunk),
                            hash_block_size=int(config.tokens_per_hash),
                            retention_interval=getattr(config, "retention_interval", None),
                            dcp=dcp, hash_lookahead=lookahead)
    except Exception as exc:  # GeometryError, and a size vLLM allows that kvcontract refuses
        return None, f"{type(exc).__name__}: {exc}"
    for index, (group, spec) in enumerate(zip(config.kv_group_configs, geometry.groups,
                                              strict=True)):
        if (geometry.block_tokens(spec) != group.tokens_per_block
                or geometry.chunk_tokens(spec) != group.tokens_per_chunk):
            return None, (f"group {index}: vLLM's {group.tokens_per_block}-token blocks and "
                          f"{group.tokens_per_chunk}-token chunks are not the geometry's "
                          f"{geometry.block_tokens(spec)} and {geometry.chunk_tokens(spec)}")
    return geometry, None


# -- the states seen --------------------------------------------------------------------------
@dataclass(frozen=True)
class StatesJudgement:
    """The contract's lookup cases for the states seen, or why they decide nothing.

    ``cases`` holds one case when the states seen decide the answer. It holds two (the
    chunks vLLM has keys for but never asked about set MISS, then HIT) when the answer
    depends on them: vLLM's connector answered without reading them, so it gives the same
    answer in both states, and the contract's answers there differ: at least one of the
    two is a state in which vLLM is wrong, and it is the witness."""

    cases: tuple[LookupCase, ...]
    why_not: str | None = None
    unasked: tuple[tuple[int, int], ...] = ()
    """``(group, chunk)`` of the keyed chunks the connector never asked about (two cases)."""


def judge_states(geometry: Geometry, num_tokens: int, local_hit: int,
                 seen: Sequence[Sequence[LookupResult | None]], keyed: Sequence[int],
                 max_hit_tokens: int | None) -> StatesJudgement:
    """``seen[g][k]``: the manager's answer for chunk ``k`` of group ``g``, None where the
    connector did not ask; ``keyed[g]``: the chunks of group ``g`` vLLM has offload keys
    for (it cannot ask about the others). The contract's best boundary only grows as
    chunks become present, so filling the unseen chunks all MISS and all HIT bounds every
    state they could hold: equal answers decide the case. Otherwise the keyless chunks
    must not matter (else vLLM's block hashes and the geometry differ: nothing is
    judged), and the keyed chunks vLLM never asked about give the two cases."""
    def rows(unasked: LookupResult, keyless: LookupResult) -> tuple[tuple[LookupResult, ...],
                                                                    ...]:
        out = []
        for g, group in enumerate(geometry.groups):
            chunks = num_tokens // geometry.chunk_tokens(group)
            row = list(seen[g][:chunks]) + [None] * max(0, chunks - len(seen[g]))
            out.append(tuple(r if r is not None else (unasked if k < keyed[g] else keyless)
                             for k, r in enumerate(row)))
        return tuple(out)

    def answer(states: tuple[tuple[LookupResult, ...], ...]) -> multigroup.ContractAnswer:
        return multigroup.contract_answer(geometry, num_tokens, local_hit,
                                          dict(enumerate(states)), max_hit_tokens)

    miss, hit = LookupResult.MISS, LookupResult.HIT
    low, high = rows(miss, miss), rows(hit, hit)
    if answer(low) == answer(high):
        return StatesJudgement((LookupCase("vllm", geometry, num_tokens, local_hit, low,
                                           max_hit_tokens),))
    if answer(low) != answer(rows(miss, hit)) or answer(rows(hit, miss)) != answer(high):
        return StatesJudgement((), "the answer depends on chunks vLLM has no offload keys "
                                   "for (its block hashes and the geometry's differ)")
    unasked = tuple((g, k) for g, row in enumerate(low)
                    for k in range(min(len(row), keyed[g], len(seen[g]))) if seen[g][k] is None)
    return StatesJudgement(
        tuple(LookupCase("vllm", geometry, num_tokens, local_hit, states, max_hit_tokens)
              for states in (low, rows(hit, miss))), None, unasked)


def _read_unasked(case: LookupCase, unasked: Sequence[tuple[int, int]],
                  hit: int | None) -> Sequence[tuple[int, int]]:
    """The unasked chunks that vLLM's hit or the contract's answer reads (all of them
    when neither reads one)."""
    from kvcontract.spec.properties.lookup import expected_hit

    geometry = case.geometry
    read: set[tuple[int, int]] = set()
    for boundary in {hit, expected_hit(case)} - {None}:
        assert boundary is not None
        if boundary <= case.local_hit:
            continue
        for g, group in enumerate(geometry.groups):
            required = multigroup.group_read_requirement(geometry, group, boundary,
                                                         case.local_hit, case.num_tokens)
            if required is not None:
                read.update((g, k) for k in range(*required))
    named = [chunk for chunk in unasked if chunk in read]
    return named or list(unasked)


def _chunks_named(chunks: Sequence[tuple[int, int]], case: LookupCase) -> str:
    """``group 1 chunk 3 (MISS here)``, the first few of the chunks vLLM never read."""
    named = [f"group {g} chunk {k} ({case.states[g][k].name} here)" for g, k in chunks[:4]]
    return ", ".join(named) + (f" and {len(chunks) - 4} more" if len(chunks) > 4 else "")


def _picture(seen: Sequence[Sequence[LookupResult | None]]) -> str:
    """Per group the answers seen, one letter a chunk (``.``: not asked)."""
    letters = {LookupResult.HIT: "H", LookupResult.MISS: "M", LookupResult.HIT_PENDING: "P",
               LookupResult.RETRY: "R", None: "."}
    return " ".join(f"{g}={''.join(letters[r] for r in row)}" for g, row in enumerate(seen))


def _result_of(answer: Any) -> LookupResult | None:
    """vLLM's ``LookupResult`` by name (a mock's unconfigured answer is none)."""
    name = getattr(answer, "name", None)
    return LookupResult.__members__.get(name) if isinstance(name, str) else None


# -- shared-prefix junctions (C12, docs/CONTRACT.md 9.3) --------------------------------------
@dataclass(frozen=True)
class JunctionJudgement:
    """The spec's junction for one decided lookup, or why it is not judged online."""

    junction: int | None
    """:func:`kvcontract.spec.reachability.junction_boundary` (0: none); None: not judged."""
    full_attention_boundary: int | None = None
    """The boundary the full-attention groups serve, clamped to the first sparse group's
    keys (None: none beyond the local hit)."""
    why_not: str | None = None


def junction_scope(geometry: Geometry) -> str | None:
    """Why the contract states no junction for a lookup on ``geometry`` (None: it does):
    its junction cases are full-attention + sliding-window geometries without an EAGLE
    drop or lookahead hashes (docs/CONTRACT.md 9.3, "Narrowed")."""
    if any(group.kind is GroupKind.MAMBA for group in geometry.groups):
        return ("a Mamba group (vLLM rounds the boundary to the Mamba state; the "
                "contract's junction cases are full-attention + sliding-window)")
    if any(geometry.drops_eagle_block(group) for group in geometry.groups):
        return "an EAGLE group's dropped block (EAGLE junctions are outside the contract)"
    if geometry.hash_lookahead:
        return "lookahead block hashes (junctions with them are outside the contract)"
    return None


def spec_junction_of(case: LookupCase, hit: int, retention_interval: int | None,
                     first_sparse: int, first_sparse_keys: int,
                     load_capped: bool = False) -> JunctionJudgement:
    """The junction the contract owes after ``case``'s lookup accepted ``hit`` tokens
    past the local hit: ``junction_boundary(F, L, hit, R)``, ``F`` the largest boundary
    up to the lookup's cap that every full-attention group serves with its chunks HIT
    (``spec_junction``'s ``promised_hit(..., full_attention_only=True)`` on the states
    seen), clamped to the keys of the first sparse group the lookup visits
    (``first_sparse``, holding ``first_sparse_keys`` keyed chunks: vLLM's
    ``full_attention_hit_boundary``, docs/CONTRACT.md 9.3). Not judged (``why_not``):
    outside :func:`junction_scope`; a HIT_PENDING chunk read at the full-attention
    boundary (vLLM's full-attention scan defers there and registers none: the contract
    states junctions over present and missing chunks); a ``max_load_tokens`` cap
    (``load_capped``) with a boundary off a chunk end (vLLM rounds the candidate down to
    each group's chunk, the contract's cap does not)."""
    from kvcontract.spec.reachability import junction_boundary

    geometry = case.geometry
    why = junction_scope(geometry)
    if why is not None:
        return JunctionJudgement(None, None, why)
    full = [g for g, spec in enumerate(geometry.groups) if spec.kind is GroupKind.FULL]
    if not full or len(full) == len(geometry.groups):
        return JunctionJudgement(0)  # no full-attention boundary a sparse group could cut
    cap = int(multigroup.lookup_cap(geometry, case.num_tokens, case.max_hit_tokens))
    served, reads = multigroup.full_attention_served(geometry, case.num_tokens,
                                                     case.local_hit, case.states, cap)
    boundary = served or None
    if any(case.states[g][k] is LookupResult.HIT_PENDING for g, k in reads):
        return JunctionJudgement(None, None, "a pending chunk in a full-attention group's "
                                             "prefix (vLLM's scan defers there)")
    if boundary is not None:
        boundary = min(boundary, first_sparse_keys
                       * geometry.chunk_tokens(geometry.groups[first_sparse]))
        if load_capped and any(boundary % geometry.chunk_tokens(spec)
                               for spec in geometry.groups):
            return JunctionJudgement(None, boundary, "a max_load_tokens cap with the "
                                     "full-attention boundary off a chunk end (vLLM rounds "
                                     "it down to each group's chunk)")
    junction = int(junction_boundary(boundary or 0, case.local_hit, hit, retention_interval))
    return JunctionJudgement(junction, boundary)


def first_sparse_group(geometry: Geometry, connector: Any = None) -> int | None:
    """The sparse group a lookup visits first: vLLM's own order where its connector
    names it (``_sliding_window_groups``), else the contract's (largest window first)."""
    order = getattr(connector, "_sliding_window_groups", None)
    if isinstance(order, tuple) and order and isinstance(order[0], int) \
            and 0 <= order[0] < len(geometry.groups):
        return order[0]
    from kvcontract.spec.lookup import window_chunks

    windows = {g: int(window_chunks(spec.sliding_window, spec.extra_retained_tokens,
                                    geometry.chunk_tokens(spec)))
               for g, spec in enumerate(geometry.groups)
               if spec.kind is GroupKind.SLIDING_WINDOW and spec.sliding_window is not None}
    sparse = [g for g in multigroup.group_visit_order(geometry, windows)
              if geometry.groups[g].kind is not GroupKind.FULL]
    return sparse[0] if sparse else None


# -- a request's store steps as a StoreCase (the store family's witness) ---------------------
MAX_PREFILL_STEPS = 256
"""Prefill steps kept per request for its StoreCase (a longer history has no witness)."""


@dataclass
class StoreHistory:
    """What a :class:`~kvcontract.spec.properties.store.StoreCase` needs of one request's
    store steps, from its first on: its prompt, the tokens it had computed at its first
    store step (``start_hit``), the tokens each prefill step scheduled, its decode steps
    and how it ended; ``broken`` the first reason it maps onto no StoreCase (a step the
    monitor did not judge, a refused offer, a schedule no StoreCase has). Constant size
    but for ``prefill`` (at most :data:`MAX_PREFILL_STEPS`); dropped with the request's
    other store state."""

    start_index: tuple[int, ...]
    """vLLM's stored index per group at the first store step (a hit's chunks)."""
    prompt_len: int | None = None
    start: int = 0
    prompt_only: bool = True
    cap: int | None = None
    prefill: list[int] = field(default_factory=list)
    decode: int = 0
    computed: int = 0
    """Where the schedule is: ``start`` plus every step's tokens so far."""
    ended: str | None = None
    steps: int = 0
    """Store steps seen (judged or not)."""
    broken: str | None = None
    departed: int | None = None
    """The step (``steps`` then) of the request's first store finding."""

    def breaks(self, why: str) -> None:
        if self.broken is None:
            self.broken = why

    def advance(self, status: RequestStatus, computed: int, scheduled: int, total: int,
                prompt_len: int, prompt_only: bool, cap: int | None) -> None:
        """One judged store step of the request (call :meth:`breaks` for one that is not)."""
        self.steps += 1
        if self.broken is not None:
            return
        if self.prompt_len is None:
            self.prompt_len, self.start, self.computed = prompt_len, computed, computed
            self.prompt_only, self.cap = prompt_only, cap
        elif (prompt_len, prompt_only, cap) != (self.prompt_len, self.prompt_only, self.cap):
            self.breaks("its prompt, offload_prompt_only or max_offload_tokens changed "
                        "between store steps")
            return
        if self.ended is not None:
            self.breaks("a store step after its finish or abort")
        elif computed != self.computed:
            self.breaks(f"store step {self.steps} starts at {computed} computed tokens, its "
                        f"schedule at {self.computed} (a step the monitor did not see)")
        elif status is RequestStatus.PREFILLING:
            if self.decode or total != prompt_len:
                self.breaks(f"a prefill step at {computed} of {total} tokens after its "
                            "prompt")
            elif len(self.prefill) >= MAX_PREFILL_STEPS:
                self.breaks(f"more than {MAX_PREFILL_STEPS} prefill steps")
            else:
                self.prefill.append(scheduled)
                self.computed += scheduled
        elif status is RequestStatus.DECODING:
            if computed != prompt_len + self.decode or scheduled != 1 \
                    or total != computed + 1:
                self.breaks(f"a decode step of {scheduled} tokens at {computed} of {total} "
                            "(a StoreCase decodes one token a step after its prompt)")
            else:
                self.decode += 1
                self.computed += 1
        elif status is RequestStatus.FINISHED:
            if computed != prompt_len + self.decode or total != computed + 1:
                self.breaks(f"a finish at {computed} of {total} tokens (a StoreCase "
                            "finishes after its prompt and decode steps)")
            self.ended = "finished"
        else:
            if self.decode:
                self.breaks("an abort after decode steps (a StoreCase aborts while "
                            "prefilling)")
            self.ended = "aborted"

    def case(self, geometry: Geometry) -> StoreCase | str:
        """The StoreCase of the steps so far (an ending after the last when it has none
        yet: a finish once the prompt is computed, else an abort), or why there is none."""
        if self.broken is not None:
            return self.broken
        if self.prompt_len is None:
            return "no store step of the request was judged"
        for g, spec in enumerate(geometry.groups):
            tpc = geometry.chunk_tokens(spec)
            if self.start % tpc:
                return (f"it started from {self.start} computed tokens, not a multiple of "
                        f"group {g}'s {tpc}-token chunk")
            if self.start_index[g] != self.start // tpc:
                return (f"its stored index at its first store step ({self.start_index[g]} in "
                        f"group {g}) is not its hit's {self.start // tpc} chunks")
        ending = self.ended or ("finished" if self.computed == self.prompt_len + self.decode
                                else "aborted")
        case = StoreCase("vllm", geometry, self.prompt_len, tuple(self.prefill), ending,
                         self.decode, self.prompt_only, self.start, self.cap)
        try:
            StoreCase.from_json(case.to_json())
        except ValueError as exc:
            return f"no StoreCase holds its schedule ({exc})"
        return case


def spec_store_step(case: StoreCase, index: int) -> list[tuple[list[int], int]]:
    """Per group, the spec's offers at step ``index`` of ``case``'s schedule and its
    stored index after it (the spec's own run from the case's start)."""
    geometry = case.geometry
    steps = schedule_steps(case)[:index + 1]
    found = []
    for g, spec in enumerate(geometry.groups):
        index_now = case.start_hit // geometry.chunk_tokens(spec)
        offered: set[int] = set(range(index_now))
        chosen: list[int] = []
        for step in steps:
            chosen, index_now = spec_step_offers(
                geometry, g, step.status, step.num_computed, step.num_scheduled,
                step.num_tokens, case.prompt_len, offered, index_now, case.prompt_only,
                case.replay_boundaries, case.max_offload_tokens)
            offered.update(chosen)
        found.append((chosen, index_now))
    return found


def store_theorem(case: StoreCase, kind: str, group: int, extra: Sequence[int],
                  offered_earlier: set[int]) -> str:
    """The catalogue store theorem that replays a store-step finding on ``case``: an
    offered chunk the spec's whole run never offers is ``C8/stores-only-demanded``'s, one
    the request offered at an earlier step ``C8/offered-at-most-once``'s; any other
    departure from the spec's step (a chunk early, late or missing, the stored index)
    ``C9/store-steps``' (it judges the run step by step)."""
    if kind == "store-step" and extra:
        if set(extra) - store_expected_offers(case, group):
            return "C8/stores-only-demanded"
        if set(extra) & offered_earlier:
            return "C8/offered-at-most-once"
    return "C9/store-steps"


def engine_theorem(theorem_id: str) -> str:
    """The audit's theorem on vLLM's engine that replays a catalogue theorem's witness:
    ``C4/lookup-is-maximal`` -> ``C4/upstream-lookup-is-maximal``, ``C9/store-steps`` ->
    ``C9/upstream-store-store-steps`` (``kvcontract.api.replay_audit``)."""
    from kvcontract.spec.properties.base import Family
    from kvcontract.spec.properties.catalog import get_property
    from kvcontract.tools.audit.lookup import upstream_loop_name
    from kvcontract.tools.audit.store import UPSTREAM_STORE

    clause, name = theorem_id.split("/", 1)
    family = getattr(getattr(get_property(theorem_id), "space", None), "family", None)
    if family is Family.STORE:
        return f"{clause}/{UPSTREAM_STORE}{name}"
    return f"{clause}/{upstream_loop_name(name)}"


# -- partial tails (C2, C12 at a sub-chunk boundary: docs/CONTRACT.md 9.2) --------------------
@dataclass(frozen=True)
class PartialTailLookup:
    """A lookup that accepted a partial tail: what its load is judged against."""

    boundary: int
    local_hit: int
    complete_hit: int
    answers: dict[Any, LookupResult | None]
    """The manager's answer per key the lookup asked about (its last, as vLLM read it)."""


def key_places(connector: Any, status: Any, keys: Any) -> dict[Any, tuple[int, int]]:
    """``(geometry group, token position)`` of each of ``keys`` whose position vLLM recorded
    on the request's context (``ReqContext.get_offload_key_position``: a chunk's end, or
    a partial-tail key's boundary) and whose group the connector has; the others left
    out (a release or a stand-in without them)."""
    context = getattr(status, "req_context", None)
    position_of = getattr(context, "get_offload_key_position", None)
    if not callable(position_of):
        return {}
    try:
        from kvcontract.live.capabilities import vllm_names

        group_of_key = vllm_names("vllm.v1.kv_offload.base", "get_offload_group_idx")
    except Exception:  # a release without per-group keys
        return {}
    index = {getattr(group, "group_idx", g): g
             for g, group in enumerate(connector.config.kv_group_configs)}
    places: dict[Any, tuple[int, int]] = {}
    for key in keys:
        with contextlib.suppress(Exception):
            position, group = position_of(key), index.get(int(group_of_key(key)))
            if type(position) is int and group is not None:
                places[key] = (group, position)
    return places


def _placed(places: dict[Any, tuple[int, int]], keys: Any) -> list[str]:
    """``group 1 at 224`` per key (``a key of no recorded position`` otherwise), sorted."""
    return sorted(f"group {places[key][0]} at {places[key][1]}" if key in places
                  else "a key of no recorded position" for key in keys)


# -- one connector ----------------------------------------------------------------------------
class _ConnectorWatch:
    """The monitor's view of one connector: its geometry, its judge, the answers its
    manager gave per request (bounded)."""

    def __init__(self, connector: Any, hash_lookahead: int | None, options: MonitorOptions,
                 geometry: Geometry | None = None):
        self.options = options
        self.geometry: Geometry | None = geometry
        self.why_not: str | None = None
        if geometry is None:  # given: a test's stand-in connector
            try:
                self.geometry, self.why_not = geometry_of(connector.config, hash_lookahead)
            except Exception as exc:  # a config of another shape (a test's stand-in)
                self.geometry, self.why_not = None, (f"its config is not readable "
                                                     f"({type(exc).__name__}: {exc})")
        self.judge = Monitor(self.geometry) if self.geometry is not None else None
        self.answers: OrderedDict[str, dict[Any, LookupResult | None]] = OrderedDict()
        self.recording: dict[Any, LookupResult | None] | None = None
        self.unobserved = False
        self.complete_hit: list[Any] = []
        self.complete_boundary: list[Any] = []
        """What vLLM's ``_lookup_complete_chunks`` reported as its full-attention boundary
        (0.34.0 returns it beside the hit), per call of the lookup in progress."""
        self.partial_tails: OrderedDict[str, PartialTailLookup] = OrderedDict()
        """Per request, its last lookup that accepted a partial tail (its load's judge)."""
        self.judged_cases: dict[str, LookupCase] = {}
        """Per request, the lookup case its last judged lookup decided (a load's witness)."""
        self.seen_jobs: set[int] = set()
        self.checks_counted: Counter[str] = Counter()
        """The judge's cumulative checks already added to the report."""
        self.failed_loads: set[str] = set()
        """Requests whose load the worker reported failed (C15: never loaded again)."""
        self.steps = 0
        """Scheduler steps seen (``build_connector_meta`` calls): C13's clock."""
        self.deferred_since: dict[str, int] = {}
        """Per deferred request, the step of its first deferral in this episode."""
        self.recent: OrderedDict[str, deque[str]] = OrderedDict()
        """Per request, its last connector events (bounded like ``answers``)."""
        self.events = 0
        self.offered: OrderedDict[str, list[set[int]]] = OrderedDict()
        """Per request and geometry group, the chunks its store steps offered to the
        manager (C8, C9: the state before each step), from its first store step on;
        kept past ``request_finished`` for the step that builds its last stores."""
        self.histories: OrderedDict[str, StoreHistory] = OrderedDict()
        """Per request, its store steps as a StoreCase needs them (with ``offered``)."""
        self.restarted: set[str] = set()
        """Requests whose stores restarted from chunk 0 (a preemption's lookup, a cache
        reset): the store spec has no such restart, their steps are not judged."""
        self.store_ended: OrderedDict[Any, int] = OrderedDict()
        """Per manager key, the step at which the last store job holding it ended (none
        since submitted): what a pending answer for it waits on has ended (C13). Kept on
        a real manager only."""
        self.load_ended: OrderedDict[Any, int] = OrderedDict()
        """Per manager key, the step at which a load job holding it ended (C13)."""
        self.ended_jobs: OrderedDict[int, int] = OrderedDict()
        """Per job the worker reported done (its last report), the step (C13)."""

    def open_offers(self, request_id: str, groups: int, base: Sequence[int]) -> list[set[int]]:
        """The request's offered chunks per group; a first store step starts them with
        the chunks below vLLM's stored index (a hit's chunks are never offered)."""
        offered = self.offered.get(request_id)
        if offered is None:
            offered = self.offered[request_id] = [set(range(base[g])) for g in range(groups)]
            self.histories[request_id] = StoreHistory(tuple(base))
            while len(self.offered) > self.options.max_requests:
                dropped = self.offered.popitem(last=False)[0]
                self.restarted.discard(dropped)
                self.histories.pop(dropped, None)
        return offered

    def job_ended(self, job_id: int, is_store: bool, keys: Sequence[Any],
                  real_manager: bool) -> None:
        """A job the worker reported done (completed or failed): its keys' last job."""
        _remember(self.ended_jobs, job_id, self.steps, 16 * self.options.max_requests)
        if is_store and not real_manager:
            return
        ended = self.store_ended if is_store else self.load_ended
        for key in keys:
            if _hashable(key):
                _remember(ended, key, self.steps, 16 * self.options.max_requests)

    def remember(self, request_id: str, answers: dict[Any, LookupResult | None]) -> None:
        self.answers[request_id] = answers
        self.answers.move_to_end(request_id)
        while len(self.answers) > self.options.max_requests:
            self.answers.popitem(last=False)

    def note(self, request_id: str, text: str) -> None:
        """One event of the request's, in its ring."""
        self.events += 1
        ring = self.recent.get(request_id)
        if ring is None:
            ring = self.recent[request_id] = deque(maxlen=self.options.recent_events)
            while len(self.recent) > self.options.max_requests:
                self.recent.popitem(last=False)
        ring.append(f"#{self.events} {text}")

    def forget(self, request_id: str) -> None:
        """Drop what is kept for a finished request (its store state stays until the
        step that builds its last stores: :meth:`forget_stores`)."""
        self.deferred_since.pop(request_id, None)
        self.recent.pop(request_id, None)
        self.answers.pop(request_id, None)
        self.judged_cases.pop(request_id, None)
        self.partial_tails.pop(request_id, None)
        self.failed_loads.discard(request_id)

    def forget_stores(self, request_id: str) -> None:
        self.offered.pop(request_id, None)
        self.histories.pop(request_id, None)
        self.restarted.discard(request_id)


Sink = Callable[[tuple[Any, ...], dict[str, Any], Any], None]
"""What a hooked manager method reports: its arguments and its answer."""


def hook_manager_method(manager: Any, name: str, sink: Sink) -> bool:
    """Report each call of ``manager.NAME`` (its arguments and answer) to ``sink``; False
    where the method cannot be observed without changing it (none, or a plain function
    put in its place that cannot be wrapped). A mock's method is wrapped on its own class
    (every ``Mock`` instance has one), so its ``return_value``, ``side_effect`` and call
    records stay the test's; a real manager's on the instance. A second hook replaces the
    sink, never stacks a wrapper."""
    from unittest import mock

    if isinstance(manager, mock.NonCallableMock):
        child = getattr(manager, name)
        if not isinstance(child, mock.CallableMixin):
            return False
        cls = type(child)
        holder = getattr(cls.__call__, "_kvcontract_sink", None)
        if holder is not None:
            holder[0] = sink
            return True
        original = cls.__call__
        box = [sink]

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            _deliver(box[0], args, kwargs, result)
            return result

        __call__._kvcontract_sink = box  # type: ignore[attr-defined]
        cls.__call__ = __call__  # type: ignore[method-assign]
        return True
    current = getattr(manager, name, None)
    if current is None or not callable(current):
        return False
    holder = getattr(current, "_kvcontract_sink", None)
    if holder is not None:
        holder[0] = sink
        return True
    box_real = [sink]

    @functools.wraps(current)
    def method(*args: Any, **kwargs: Any) -> Any:
        result = current(*args, **kwargs)
        _deliver(box_real[0], args, kwargs, result)
        return result

    method._kvcontract_sink = box_real  # type: ignore[attr-defined]
    try:
        setattr(manager, name, method)
    except (AttributeError, TypeError):
        return False
    return True


def _deliver(sink: Sink, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
    with contextlib.suppress(Exception):  # the monitor never changes what vLLM sees
        sink(args, kwargs, result)


class _NotJudged(Exception):
    """A store step left unjudged (counted by its reason first)."""


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _why_extra(extra: Sequence[int], offered: set[int], index: int, storable: int,
               live_from: int, marked: dict[int, list[int]]) -> str:
    """Why the spec's step leaves each of ``extra`` out, in the spec's own terms."""
    reasons: dict[str, list[int]] = {}
    for chunk in extra:
        blocks = marked[chunk]
        reason = ("offered before" if chunk in offered else
                  f"past the {storable} storable chunks" if chunk >= storable else
                  "no reachable boundary demands it (the mask marks none of its blocks)"
                  if not blocks else
                  f"its marked block {blocks[0]} is freed (blocks live from {live_from})"
                  if blocks[0] < live_from else
                  f"below the stored index {index}")
        reasons.setdefault(reason, []).append(chunk)
    return "; ".join(f"{chunks} {reason}" for reason, chunks in reasons.items())


def _chunks_of(keys: set[Any], groups: Sequence[Any]) -> dict[Any, tuple[int, int]]:
    """``(group, chunk)`` of each of ``keys`` among the groups' offload keys, searched
    from the last chunk down (a store step offers recent chunks: the search stops once
    every key is found, so a step costs what it offers, not the request's length)."""
    where: dict[Any, tuple[int, int]] = {}
    for g, group_state in enumerate(groups):
        offload_keys = group_state.offload_keys
        for k in range(len(offload_keys) - 1, -1, -1):
            if len(where) == len(keys):
                return where
            key = offload_keys[k]
            if _hashable(key) and key in keys:
                where[key] = (g, k)
    return where


def _remember(ordered: OrderedDict[Any, int], key: Any, value: int, bound: int) -> None:
    """``ordered[key] = value``, newest last, at most ``bound`` entries."""
    ordered[key] = value
    ordered.move_to_end(key)
    while len(ordered) > bound:
        ordered.popitem(last=False)


def _open_jobs(connector: Any) -> dict[int, tuple[bool, tuple[Any, ...], str]]:
    """The connector's open transfer jobs: ``{job id: (is store, keys, request id)}``."""
    jobs = getattr(connector, "_jobs", None)
    if not isinstance(jobs, dict):
        return {}
    return {job_id: (bool(getattr(job, "is_store", False)),
                     tuple(getattr(job, "keys", ()) or ()), str(getattr(job, "req_id", "")))
            for job_id, job in jobs.items()}


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str,
              default: Any = None) -> Any:
    """A hooked call's argument by position or name (the manager's own signature)."""
    return args[index] if len(args) > index else kwargs.get(name, default)


class _Parameters:
    """A wrapped method's parameter names (``self`` left out)."""

    __slots__ = ("names",)

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def named(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name (defaults left out: a hook names its own)."""
        named = dict(zip(self.names, args, strict=False))
        named.update(kwargs)
        return named


# -- the monitor ------------------------------------------------------------------------------
class RuntimeMonitor:
    """The contract judged on every connector the running vLLM builds (module docstring)."""

    def __init__(self, options: MonitorOptions | None = None) -> None:
        self.options = options or MonitorOptions()
        self.report = MonitorReport()
        self.current_test = "<no test>"
        self._watches: weakref.WeakKeyDictionary[Any, _ConnectorWatch] = \
            weakref.WeakKeyDictionary()
        self._originals: list[tuple[type, str, Any]] = []
        self._lock = threading.RLock()
        self._test_violations = 0
        self._handed_out = 0
        self._reproducer_count = 0
        self._about: tuple[_ConnectorWatch, str] | None = None
        """The connector and request an event handler is judging (for a violation's ring)."""

    # -- installing -------------------------------------------------------------------------
    def install(self) -> bool:
        """Wrap the connector scheduler's methods; False (with a gap) where the running
        vLLM has no such class."""
        cls = _scheduler_class()
        if cls is None:
            self.report.gaps.append("no OffloadingConnectorScheduler in "
                                    + " or ".join(SCHEDULER_MODULES))
            return False
        from importlib import metadata

        try:
            self.report.vllm = metadata.version("vllm")
        except metadata.PackageNotFoundError:
            self.report.vllm = getattr(sys.modules.get("vllm"), "__version__", None)
        for name in WRAPPED:
            original = cls.__dict__.get(name)
            if original is None:
                self.report.gaps.append(f"OffloadingConnectorScheduler.{name} is not in this "
                                        "release: what it does is not judged")
                continue
            self._originals.append((cls, name, original))
            setattr(cls, name, self._wrap(name, original))
        return True

    def uninstall(self) -> None:
        for cls, name, original in reversed(self._originals):
            setattr(cls, name, original)
        self._originals.clear()

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        # The parameters' names past ``self``, read once: a hook reads its arguments by
        # name without ``Signature.bind`` (tens of microseconds a call, every step).
        signature = _Parameters(tuple(inspect.signature(original).parameters)[1:])
        before = getattr(self, f"_before_{name.strip('_')}", None)
        after = getattr(self, f"_after_{name.strip('_')}")
        monitor = self

        @functools.wraps(original)
        def wrapper(connector: Any, *args: Any, **kwargs: Any) -> Any:
            state = None
            if before is not None:
                state = monitor._guarded(name, before, connector, signature, args, kwargs)
            try:
                result = original(connector, *args, **kwargs)
            except Exception as exc:
                monitor._guarded(name, monitor._raised, connector, name, exc)
                raise
            monitor._guarded(name, after, connector, signature, args, kwargs, result, state)
            return result

        wrapper.__kvcontract_original__ = original  # type: ignore[attr-defined]
        return wrapper

    def _guarded(self, where: str, action: Callable[..., Any], *args: Any) -> Any:
        try:
            with self._lock:
                self._about = None
                return action(*args)
        except Exception as exc:
            self.report.errors.append({"test": self.current_test, "where": where,
                                       "message": f"{type(exc).__name__}: {exc}"})
            return None

    def variant(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A context in which kvcontract variant ``name``'s rules replace vLLM's own
        functions (:func:`variant_roles`, ``live.judge.rebinding``); the report names the
        variant and, as a gap, what of it no rebinding role carries."""
        from kvcontract.errors import UsageError
        from kvcontract.impl.variants import VARIANTS
        from kvcontract.live.judge.rebinding import rebound

        if name not in VARIANTS:
            raise UsageError(f"--kvcontract-vllm-variant {name!r}: no such variant (known: "
                             f"{', '.join(sorted(VARIANTS))})")
        roles, left = variant_roles(name)
        if not roles:
            raise UsageError(f"--kvcontract-vllm-variant {name!r}: none of what it changes "
                             f"({', '.join(left)}) can be put into vLLM's code")
        if left:
            self.report.gaps.append(f"variant {name}: {', '.join(left)} not put into vLLM "
                                    "(no rebinding role)")
        self.report.variant = name
        return rebound(roles, implementation=VARIANTS[name])

    # -- per test ---------------------------------------------------------------------------
    def begin_test(self, test_id: str) -> None:
        self.flush()  # what the previous test left deferred is that test's
        self.current_test = test_id
        self.report.tests += 1
        self._test_violations = len(self.report.violations)

    def test_violations(self) -> list[Finding]:
        """The violations found since the current test began."""
        return self.report.violations[self._test_violations:]

    def unreported_violations(self) -> list[Finding]:
        """The violations of the current test not yet handed out by this call."""
        found = self.report.violations[max(self._test_violations, self._handed_out):]
        self._handed_out = len(self.report.violations)
        return found

    # -- watches ----------------------------------------------------------------------------
    def _watch(self, connector: Any) -> _ConnectorWatch | None:
        watch = self._watches.get(connector)
        if watch is None and hasattr(connector, "config"):
            # A connector built without its __init__ (a test's stand-in): no engine config.
            watch = _ConnectorWatch(connector, None, self.options)
            with contextlib.suppress(TypeError):  # no weak references: watched this call
                self._watches[connector] = watch
            self.report.events["connector"] += 1
        return watch

    def _after_init(self, connector: Any, signature: _Parameters, args: tuple[Any, ...],
                    kwargs: dict[str, Any], result: Any, state: Any) -> None:
        bound = signature.named(args, kwargs)
        vllm_config = bound.get("vllm_config")
        lookahead = getattr(vllm_config, "num_hash_lookahead_tokens", 0) if vllm_config else 0
        watch = self._watches[connector] = _ConnectorWatch(connector, int(lookahead or 0),
                                                           self.options)
        self.report.events["connector"] += 1
        self._judge_partial_tail_on(watch, connector)

    # -- partial tails (docs/CONTRACT.md 9.2) ------------------------------------------------
    def _judge_partial_tail_on(self, watch: _ConnectorWatch, connector: Any) -> None:
        """vLLM's own decision (the connector config's ``supports_partial_tail``) against
        the contract's (:func:`~kvcontract.spec.partial_tail.partial_tail_off` of the
        connector's geometry): partial tails on exactly where the contract has them. Off
        where the contract has them on loses every tail's hit (C12); on where it states
        them off serves sub-chunk loads the contract does not state safe (C2). A geometry
        the contract names but does not check (EAGLE groups) is not judged."""
        supports = getattr(connector.config, "supports_partial_tail", None)
        if watch.geometry is None:
            return  # the connector's lookups are skipped with the geometry's reason
        if type(supports) is not bool:
            self.report.skip("partial tails on/off: the connector's config has no "
                             "supports_partial_tail (a release without partial tails, or a "
                             "stand-in)", self.current_test)
            return
        off = partial_tail_off(watch.geometry)
        if off is not None and "not checked" in off:
            self.report.skip(f"partial tails on/off: {off}", self.current_test)
            return
        self.report.judge("C12/partial-tail-on")
        if supports == (off is None):
            return
        where = watch.geometry.describe()
        if supports:
            self._found("C2", "partial-tail-on",
                        f"vLLM turns partial tails on (supports_partial_tail=True) for {where}, "
                        f"where the contract has none: {off} "
                        f"({NO_PARTIAL_TAIL_REPRODUCER})", None,
                        {"geometry": watch.geometry.to_dict(), "supports_partial_tail": True,
                         "contract": off}, Impact.CORRUPTION)
        else:
            self._found("C12", "partial-tail-on",
                        f"vLLM turns partial tails off (supports_partial_tail=False) for "
                        f"{where}, where the contract has them: a consumer loses the hit "
                        f"through every producer's tail ({NO_PARTIAL_TAIL_REPRODUCER})", None,
                        {"geometry": watch.geometry.to_dict(), "supports_partial_tail": False,
                         "contract": "on"}, Impact.LOST_HIT)

    def _judge_partial_tail_lookup(self, watch: _ConnectorWatch, connector: Any,
                                   request: Any, status: Any, state: dict[str, Any],
                                   bound: dict[str, Any], local: int, hit: int) -> None:
        """A lookup that accepted a hit off a chunk boundary (vLLM's
        ``partial_tail_boundary`` ``b``; docs/CONTRACT.md 9.2). ``C2/partial-tail-boundary``:
        ``b`` is a multiple of the hash block, one of the boundaries the search covers past
        the complete-chunk hit ``C`` (:func:`~kvcontract.spec.partial_tail.
        partial_tail_candidates`: below the next block of ``max(C, full-attention hit)``),
        within the request's tokens less one and its load caps, and every group's key at
        ``b`` (:func:`~kvcontract.spec.partial_tail.partial_tail_key_position`) was answered
        HIT. ``C4/partial-tail-maximal`` (where no sparse group cut the complete hit below
        the full-attention one): no candidate above ``b`` had every group's key answered
        HIT and none being loaded. The lookup is kept for its load's judge
        (:meth:`_judge_partial_tail_load`)."""
        assert watch.geometry is not None
        geometry = watch.geometry
        request_id = request.request_id
        boundary = int(status.partial_tail_boundary)
        answers: dict[Any, LookupResult | None] = state["answers"]
        test = self.current_test
        self.report.events["partial-tail hit"] += 1
        watch.note(request_id, f"partial tail at {boundary}")
        complete = watch.complete_hit[-1] if watch.complete_hit else None
        if type(complete) is not int:
            self.report.skip("partial tail: its complete-chunk lookup was not seen (the "
                             "release has no _lookup_complete_chunks, or a test replaced it)",
                             test, f"request {request_id}: tail at {boundary}")
            return
        watch.partial_tails[request_id] = PartialTailLookup(boundary, local, complete,
                                                            dict(answers))
        watch.partial_tails.move_to_end(request_id)
        while len(watch.partial_tails) > self.options.max_requests:
            watch.partial_tails.popitem(last=False)
        self.report.skip("C12 partial tail: the hit owed through a tail is b(P) of the "
                         "producer's prompt, which no lookup shows (kvcontract.live."
                         "partial_tail judges it on traces)", test,
                         f"request {request_id}: tail at {boundary}")
        off = partial_tail_off(geometry)
        if off is not None and "not checked" in off:
            self.report.skip(f"partial-tail boundary: {off}", test, f"request {request_id}")
            return
        places = key_places(connector, status, answers)
        if not places:
            self.report.skip("partial-tail boundary: vLLM records no key positions on the "
                             "request's context (ReqContext.get_offload_key_position)", test,
                             f"request {request_id}")
            return
        tph = geometry.hash_block_size
        assert tph is not None
        complete_boundary = local + complete
        full = watch.complete_boundary[-1] if watch.complete_boundary else None
        anchor = max(complete_boundary, full) if type(full) is int else complete_boundary
        caps = [int(request.num_tokens) - 1] + [
            local + int(x) for x in (bound.get("max_num_new_tokens"),
                                     getattr(status, "max_load_tokens", None))
            if type(x) is int]
        answered = {place: answers.get(key) for key, place in places.items()}
        witness = {"geometry": geometry.to_dict(), "num_tokens": int(request.num_tokens),
                   "local_hit": local, "complete_hit": complete,
                   "full_attention_boundary": full, "boundary": boundary, "caps": caps,
                   "answers": {f"group {g} at {p}": getattr(r, "name", None)
                               for (g, p), r in sorted(answered.items())}}
        what = (f"request {request_id}: a partial tail at {boundary} (local hit {local}, "
                f"complete-chunk hit {complete_boundary}, anchor {anchor})")
        self.report.judge("C2/partial-tail-boundary")
        off_grid = []
        if boundary % tph:
            off_grid.append(f"not a multiple of the {tph}-token hash block")
        elif boundary not in partial_tail_candidates(geometry, complete_boundary, anchor,
                                                     boundary):
            off_grid.append("not a boundary the search covers (past the complete-chunk hit, "
                            "below the anchor's next block, no chunk boundary at or below "
                            "the anchor)")
        if boundary > min(caps):
            off_grid.append(f"past the request's tokens less one or its load cap "
                            f"({min(caps)})")
        if off_grid:
            self._found("C2", "partial-tail-boundary",
                        f"{what}: the boundary is {'; '.join(off_grid)} "
                        f"({NO_PARTIAL_TAIL_REPRODUCER})", None, witness, Impact.CORRUPTION)
        unserved = []
        for g in range(len(geometry.groups)):
            position = partial_tail_key_position(geometry, g, boundary)
            result = answered.get((g, position))
            if result is not LookupResult.HIT:
                unserved.append(f"group {g} at {position}: "
                                + (result.name if result is not None else "never asked"))
        if unserved:
            self._found("C2", "partial-tail-boundary",
                        f"{what}: accepted with a key at the boundary not answered HIT "
                        f"({', '.join(unserved)}; upstream's 'not found'/'not ready' on its "
                        f"load) ({NO_PARTIAL_TAIL_REPRODUCER})", None, witness, Impact.CRASH)
        if anchor > complete_boundary:
            self.report.skip("C4 partial tail: a sparse group cut the complete-chunk hit "
                             "below the full-attention one (an anchor): which boundary is "
                             "owed there needs the producer's stores (not judged online)",
                             test, f"request {request_id}: complete {complete_boundary}, "
                             f"anchor {anchor}, tail at {boundary}")
            return
        loading = {places[key] for key in answers
                   if key in places and key in state["being_loaded"]}
        self._judge_partial_tail_maximal(watch, request, answered, loading, complete_boundary,
                                         boundary, caps, what, witness)

    def _judge_partial_tail_maximal(self, watch: _ConnectorWatch, request: Any,
                                    answered: dict[tuple[int, int], LookupResult | None],
                                    loading: set[tuple[int, int]],
                                    complete_boundary: int, boundary: int, caps: list[int],
                                    what: str, witness: dict[str, Any]) -> None:
        """``C4/partial-tail-maximal``: no candidate boundary above the accepted tail had
        every group's key answered HIT (a key being loaded elsewhere, pending or missing
        rules it out). The search's top is vLLM's own bounds: the prompt less one token
        (a tail is a prefill boundary), the keys the request holds, the load caps."""
        assert watch.geometry is not None
        geometry = watch.geometry
        tph = geometry.hash_block_size
        assert tph is not None
        limit = min(caps)
        prompt = getattr(request, "num_prompt_tokens", None)
        if type(prompt) is int:
            limit = min(limit, prompt - 1)
        hashes = getattr(request, "block_hashes", None)
        if isinstance(hashes, list):
            limit = min(limit, len(hashes) * tph)
        skipped = []
        for candidate in partial_tail_candidates(geometry, complete_boundary,
                                                 complete_boundary, limit):
            if candidate <= boundary:
                break
            places = [(g, partial_tail_key_position(geometry, g, candidate))
                      for g in range(len(geometry.groups))]
            if any(answered.get(place) not in (None, LookupResult.HIT)
                   or place in loading for place in places):
                continue  # missing, pending or being loaded: not served
            if any(answered.get(place) is None for place in places):
                self.report.skip("C4 partial tail: vLLM did not ask about every key of a "
                                 "candidate above its tail", self.current_test,
                                 f"{what}: candidate {candidate}")
                return
            skipped.append(candidate)
        self.report.judge("C4/partial-tail-maximal")
        if skipped:
            self._found("C4", "partial-tail-maximal",
                        f"{what}: every group's key at {skipped[0]} was answered HIT and none "
                        f"is being loaded, yet the tail stops at {boundary} "
                        f"({NO_PARTIAL_TAIL_REPRODUCER})", None,
                        {**witness, "served_above": skipped}, Impact.LOST_HIT)

    # -- lookups ----------------------------------------------------------------------------
    def _before_get_num_new_matched_tokens(self, connector: Any,
                                           signature: _Parameters,
                                           args: tuple[Any, ...],
                                           kwargs: dict[str, Any]) -> dict[str, Any] | None:
        watch = self._watch(connector)
        if watch is None:
            return None
        bound = signature.named(args, kwargs)
        request = bound["request"]
        status = getattr(connector, "_req_status", {}).get(request.request_id)
        answers: dict[Any, LookupResult | None] = {}
        watch.recording = answers
        watch.complete_hit = []
        watch.complete_boundary = []

        def sink(call_args: tuple[Any, ...], call_kwargs: dict[str, Any], result: Any) -> None:
            if watch.recording is not None:
                try:
                    watch.recording[_argument(call_args, call_kwargs, 0, "key")] = \
                        _result_of(result)
                except TypeError:  # an unhashable key
                    watch.unobserved = True

        watch.unobserved = not hook_manager_method(connector.manager, "lookup", sink)
        being_loaded = getattr(connector, "_chunks_being_loaded", None)
        if status is not None and request.request_id in watch.offered:
            # vLLM restarts a re-admitted request's stores at chunk 0 (a preemption).
            watch.restarted.add(request.request_id)
        own = getattr(status, "transfer_jobs", None)
        # The junction the request holds before the connector's lookup (the local prefix
        # cache's, set by vLLM's scheduler just before: C12).
        junction = getattr(request, "shared_prefix_boundary", None)
        return {"in_flight": bool(own), "own": frozenset(own or ()),
                "being_loaded": frozenset(being_loaded or ()), "answers": answers,
                "junction": junction if type(junction) is int else None}

    def _after_lookup_complete_chunks(self, connector: Any, signature: _Parameters,
                                      args: tuple[Any, ...], kwargs: dict[str, Any],
                                      result: Any, state: Any) -> None:
        watch = self._watches.get(connector)
        if watch is not None:
            watch.complete_hit.append(result[0] if isinstance(result, tuple) else result)
            watch.complete_boundary.append(result[1] if isinstance(result, tuple)
                                           and len(result) > 1 else None)

    def _after_get_num_new_matched_tokens(self, connector: Any,
                                          signature: _Parameters,
                                          args: tuple[Any, ...], kwargs: dict[str, Any],
                                          result: Any, state: dict[str, Any] | None) -> None:
        watch = self._watches.get(connector)
        if watch is None or state is None:
            return
        watch.recording = None
        self.report.events["lookup"] += 1
        bound = signature.named(args, kwargs)
        request = bound["request"]
        local = int(bound["num_computed_tokens"])
        status = connector._req_status.get(request.request_id)
        answers: dict[Any, LookupResult | None] = state["answers"]
        watch.remember(request.request_id, answers)
        hit = result[0] if isinstance(result, tuple) else result
        watch.note(request.request_id, f"lookup at local hit {local}: {hit} "
                   f"({len(answers)} keys asked)")
        junction = getattr(request, "shared_prefix_boundary", None)
        if state["junction"] is not None and type(junction) is int \
                and junction != state["junction"]:
            self.report.events["junction"] += 1  # the lookup moved the request's junction
            watch.note(request.request_id, f"junction {state['junction']} -> {junction}")
        self._about = (watch, request.request_id)
        self._judge_deferral(watch, request.request_id, hit)
        if hit is None:
            self._judge_deferral_cause(watch, connector, request, status, state, bound)
        if request.request_id in watch.failed_loads:
            self.report.judged["C15"] += 1
            if hit:  # a deferral (None) or 0 reads nothing from the offloaded tier
                self._found("C15", "failed-load",
                            f"request {request.request_id}: its load failed, and the lookup "
                            f"offers {hit} tokens from the offloaded tier again", None, None,
                            None)
            return
        why = self._lookup_out_of_scope(watch, connector, request, status, state, hit)
        if why is PARTIAL_TAIL_HIT:
            self._judge_partial_tail_lookup(watch, connector, request, status, state, bound,
                                            local, int(hit))
            return
        if why is not None:
            self.report.skip(why, self.current_test)
            return
        assert watch.geometry is not None and watch.judge is not None and status is not None
        geometry = watch.geometry
        seen: list[list[LookupResult | None]] = []
        for group_state in status.group_states:
            seen.append([answers.get(key) for key in group_state.offload_keys])
        budget = bound.get("max_num_new_tokens")
        caps = [local + int(x) for x in (budget, getattr(status, "max_load_tokens", None))
                if x is not None]
        states = judge_states(geometry, int(request.num_tokens), local, seen,
                              [len(gs.offload_keys) for gs in status.group_states],
                              min(caps) if caps else None)
        if not states.cases:
            self.report.skip(str(states.why_not), self.current_test,
                             f"request {request.request_id}: N={request.num_tokens} L={local} "
                             f"hit={hit} seen={_picture(seen)}")
            return
        absolute = None if hit is None else local + int(hit)
        watch.judged_cases[request.request_id] = states.cases[0]
        for case in states.cases:
            ranges: tuple[tuple[int, tuple[int, int]], ...] = ()
            if absolute is not None and absolute > local:
                ranges = tuple((g, multigroup.load_range(geometry, spec, absolute, local))
                               for g, spec in enumerate(geometry.groups))
            before = len(watch.judge.violations)
            watch.judge(LookupEvent(request.request_id, case.num_tokens, local, case.states,
                                    frozenset(), absolute, ranges))
            self._count_checks(watch)
            found = watch.judge.violations[before:]
            for violation in found:
                message = violation.message
                if states.unasked:
                    message += (" in a state the manager may hold: vLLM's answer did not "
                                "read " + _chunks_named(
                                    _read_unasked(case, states.unasked, absolute), case))
                self._found(violation.clause, violation.kind, message,
                            THEOREM_OF_CLAUSE.get(violation.clause), case.to_json(),
                            violation.impact)
            if found:
                return
        if states.unasked:
            self.report.skip("vLLM did not read chunks the answer depends on, and both "
                             "states agree with it", self.current_test,
                             f"request {request.request_id}: hit={hit}")
        if hit is not None:
            self._judge_junction(watch, connector, request, status, state, states.cases,
                                 local, int(hit))

    # -- the shared-prefix junction (C12) ----------------------------------------------------
    def _judge_junction(self, watch: _ConnectorWatch, connector: Any, request: Any,
                        status: Any, state: dict[str, Any], cases: Sequence[LookupCase],
                        local: int, hit: int) -> None:
        """The junction vLLM left on the request after a lookup the contract agrees with
        (``C12/junction-registered``, docs/CONTRACT.md 9.3): the spec's,
        :func:`spec_junction_of` for the same hit. vLLM never lowers a junction the local
        prefix cache set before the lookup (``state["junction"]``): one at or above the
        spec's is not judged (the contract does not say which of two a request keeps);
        below it, the spec's must replace it; with no spec junction, it must stay."""
        assert watch.geometry is not None
        geometry = watch.geometry
        kinds = {spec.kind for spec in geometry.groups}
        if GroupKind.FULL not in kinds or kinds == {GroupKind.FULL}:
            return  # no sparse group cuts a full-attention boundary here
        request_id = request.request_id
        before = state.get("junction")
        after = getattr(request, "shared_prefix_boundary", None)
        if before is None or type(after) is not int:
            self.report.skip("C12 junction: the request holds no shared_prefix_boundary (a "
                             "release without junctions, or a test's mock)", self.current_test,
                             f"request {request_id}")
            return
        retention = getattr(connector.config, "retention_interval",
                            geometry.retention_interval)
        if not (retention is None or type(retention) is int):
            self.report.skip("C12 junction: a stand-in configuration (a test's mock)",
                             self.current_test, f"request {request_id}")
            return
        from kvcontract.spec.properties.lookup import expected_hit

        if any(expected_hit(case) != local + hit for case in cases):
            self.report.skip("C12 junction: the lookup's hit is not the contract's answer",
                             self.current_test, f"request {request_id}: hit={hit}")
            return
        first = first_sparse_group(geometry, connector)
        assert first is not None
        load_capped = getattr(status, "max_load_tokens", None) is not None
        judged = [spec_junction_of(case, hit, retention, first,
                                   len(status.group_states[first].offload_keys), load_capped)
                  for case in cases]
        why = next((j.why_not for j in judged if j.why_not is not None), None)
        if why is None and len({j.junction for j in judged}) > 1:
            why = "the spec's junction depends on chunks vLLM did not read"
        if why is not None:
            self.report.skip(f"C12 junction: {why}", self.current_test,
                             f"request {request_id}: hit={hit}")
            return
        judgement = judged[0]
        junction = judgement.junction
        assert junction is not None
        if 0 < junction <= before:
            self.report.skip("C12 junction: the local prefix cache's junction lies at or "
                             "past the spec's (vLLM keeps it; the contract does not say "
                             "which of the two a request keeps)", self.current_test,
                             f"request {request_id}: local {before}, spec {junction}")
            return
        want = max(before, junction)
        self.report.judge("C12/junction-registered")
        if after == want:
            return
        boundary = judgement.full_attention_boundary
        theirs = watch.complete_boundary[-1] if watch.complete_boundary else None
        message = (f"request {request_id}: after accepting {hit} tokens past the local hit "
                   f"{local}, the request's shared-prefix junction is {after}; the spec's is "
                   f"{junction} (the full-attention groups serve {boundary or 0}, retention "
                   f"interval {retention})")
        if before:
            message += f", the local prefix cache's {before} before the lookup"
        if isinstance(theirs, int) and theirs != boundary:
            message += f"; vLLM's lookup reported the full-attention boundary {theirs}"
        witness = {"lookup": cases[0].to_json(), "hit": hit, "retention_interval": retention,
                   "full_attention_boundary": boundary, "junction_before": before,
                   "registered": after, "spec_junction": junction}
        self._found("C12", "junction-registered", message, None, witness,
                    Impact.LOST_HIT if after < want else Impact.WASTE)

    # -- what a deferral waits on (C13) --------------------------------------------------
    def _judge_deferral_cause(self, watch: _ConnectorWatch, connector: Any, request: Any,
                              status: Any, state: dict[str, Any],
                              bound: dict[str, Any]) -> None:
        """A deferral (``None``) has a cause the contract allows (docs/CONTRACT.md C3,
        C13: ``C13/deferral-has-cause``): a transfer of the request's own in flight, a
        RETRY, a HIT_PENDING chunk in the window of the contract's answer for the states
        seen, or a chunk of that answer's load set ``Load(N, L)`` that another request is
        loading. And what it waits on has not ended (``C13/decides-once-ready``): an own
        job or a load job still open, a pending chunk whose store is still open (judged
        on a real manager only: a test's mock answers what the test configured). A wait
        counts as ended only on a job the monitor saw end; one on a job or a loading
        count it never saw (a test's fixture) is not judged."""
        request_id = request.request_id
        why = self._deferral_out_of_scope(watch, connector, request, status, state)
        if why is not None:
            self.report.skip(f"C13 deferral: {why}", self.current_test,
                             f"request {request_id}")
            return
        assert watch.geometry is not None
        # The connector's jobs now are those the lookup saw: it neither opens nor ends one.
        jobs = state["jobs"] = _open_jobs(connector)
        answers: dict[Any, LookupResult | None] = state["answers"]
        causes: dict[str, str] = {}
        """Per cause, whether what it waits on is ``open``, ``ended`` or ``unknown``."""
        if state["own"]:
            causes["own-transfer"] = (
                "open" if any(job in jobs for job in state["own"]) else
                "ended" if all(job in watch.ended_jobs for job in state["own"]) else
                "unknown")
        if LookupResult.RETRY in answers.values():
            causes["retry"] = "open"  # the tier's own lookup: nothing to see it end
        local = int(bound["num_computed_tokens"])
        cases: tuple[LookupCase, ...] = ()
        partial = not causes and bool(watch.complete_hit) \
            and watch.complete_hit[-1] is not None
        if partial:
            # The complete-chunk lookup answered; the partial-tail search deferred
            # (docs/CONTRACT.md 9.2: a key it would load pending or being loaded).
            self._partial_tail_deferral_causes(watch, connector, status, state, answers,
                                               request_id, causes)
        elif not causes:
            cases = self._states_of(watch, request, status, answers, bound)
            if not cases:
                self.report.skip("C13 deferral: the states seen decide no contract answer",
                                 self.current_test, f"request {request_id}")
                return
        if any(lookup_contract_answer(case).pending_in_window for case in cases):
            causes["hit-pending"] = self._pending_wait(watch, connector, answers, jobs)
        loading = self._loading_wait(watch, status, state, cases, local, request_id)
        if loading is not None:
            causes["loading-elsewhere"] = loading
        self.report.judge("C13/deferral-has-cause")
        if not causes and partial:
            self._found("C13", "deferral-has-cause",
                        f"request {request_id} deferred (local hit {local}) in its partial-"
                        f"tail search with no cause the contract allows: no key it asked "
                        f"about answered HIT_PENDING or RETRY, none being loaded by another "
                        f"request ({NO_PARTIAL_TAIL_REPRODUCER})", None,
                        {"complete_hit": watch.complete_hit[-1], "local_hit": local,
                         "answers": sorted(f"{place}: {getattr(answers.get(key), 'name', None)}"
                                           for key, place in key_places(
                                               connector, status, answers).items())},
                        Impact.DELAY)
            return
        if not causes:
            if self._lookup_out_of_scope(watch, connector, request, status, state,
                                         None) is None:
                return  # in C3's scope: a needless deferral there is C3's finding
            answer = lookup_contract_answer(cases[0]).best_present
            self._found("C13", "deferral-has-cause",
                        f"request {request_id} deferred (local hit {local}) with no cause "
                        "the contract allows: no transfer of its own in flight, no RETRY, "
                        f"no pending chunk in the window of the contract's answer {answer}, "
                        "no chunk of its load set being loaded by another request",
                        None, cases[0].to_json(), Impact.DELAY)
            return
        waits = set(causes.values())
        if "open" not in waits and "unknown" in waits:
            self.report.skip("C13 deferral: it waits on a job or a loading count the "
                             "monitor never saw (a test's fixture)", self.current_test,
                             f"request {request_id}: {causes}")
            return
        self.report.judge("C13/decides-once-ready")
        if waits == {"ended"}:
            self._found("C13", "decides-once-ready",
                        f"request {request_id} deferred on {', '.join(causes)}, but every "
                        "job it waits on has ended: " + self._ended_text(state),
                        None, None, Impact.DELAY)

    @staticmethod
    def _connector_out_of_scope(watch: _ConnectorWatch, connector: Any,
                                status: Any) -> str | None:
        """Why no lookup of this connector can be judged (None: it can): no geometry, no
        request state, or a lookup internal a test replaced on the instance."""
        if watch.geometry is None:
            return f"geometry: {watch.why_not}"
        if status is None:
            return "the connector keeps no state for the request"
        replaced = sorted(set(vars(connector)) & set(LOOKUP_INTERNALS))
        if replaced:
            return f"a test replaced the connector's own {replaced[0]} (a mock)"
        return None

    @staticmethod
    def _stand_in(request: Any, status: Any) -> bool:
        """A test's mock request or request state (every attribute of a MagicMock)."""
        return not isinstance(getattr(request, "num_tokens", None), int) or not isinstance(
            getattr(status, "group_states", None), tuple)

    def _deferral_out_of_scope(self, watch: _ConnectorWatch, connector: Any, request: Any,
                               status: Any, state: dict[str, Any]) -> str | None:
        why = self._connector_out_of_scope(watch, connector, status)
        if why is not None:
            return why
        if self._stand_in(request, status):
            return "a stand-in request or request state (a test's mock)"
        if watch.unobserved:
            return "the manager's lookup answers could not be observed"
        if any(r is None for r in state["answers"].values()):
            return "a lookup answer that is no LookupResult (an unconfigured mock)"
        return None

    def _partial_tail_deferral_causes(self, watch: _ConnectorWatch, connector: Any,
                                      status: Any, state: dict[str, Any],
                                      answers: dict[Any, LookupResult | None],
                                      request_id: str, causes: dict[str, str]) -> None:
        """A partial-tail search's deferral (vLLM's complete-chunk hit 0, a tail key, the
        bridge or an anchor chunk not ready): its causes, as :meth:`_judge_deferral_cause`
        names them: a key it asked about answered HIT_PENDING, a key it would load (asked
        about, or one of the request's chunks) counted as being loaded by another
        request."""
        if LookupResult.HIT_PENDING in answers.values():
            causes["hit-pending"] = self._pending_wait(watch, connector, answers,
                                                       state["jobs"])
        keys = set(answers) | {key for gs in status.group_states for key in gs.offload_keys
                               if _hashable(key)}
        loading = keys & state["being_loaded"]
        if loading:
            causes["loading-elsewhere"] = (
                "open" if any(not is_store and owner != request_id and set(held) & loading
                              for is_store, held, owner in state["jobs"].values()) else
                "ended" if all(key in watch.load_ended for key in loading) else "unknown")

    def _states_of(self, watch: _ConnectorWatch, request: Any, status: Any,
                   answers: dict[Any, LookupResult | None],
                   bound: dict[str, Any]) -> tuple[LookupCase, ...]:
        """The contract's lookup cases for the answers seen (:func:`judge_states`)."""
        assert watch.geometry is not None
        local = int(bound["num_computed_tokens"])
        seen = [[answers.get(key) for key in gs.offload_keys] for gs in status.group_states]
        budget = bound.get("max_num_new_tokens")
        caps = [local + int(x) for x in (budget, getattr(status, "max_load_tokens", None))
                if x is not None]
        return judge_states(watch.geometry, int(request.num_tokens), local, seen,
                            [len(gs.offload_keys) for gs in status.group_states],
                            min(caps) if caps else None).cases

    def _loading_wait(self, watch: _ConnectorWatch, status: Any, state: dict[str, Any],
                      cases: Sequence[LookupCase], local: int, request_id: str) -> str | None:
        """None when no chunk of the contract's load set is counted as being loaded;
        else ``open`` when another request's load job holding one is open, ``ended``
        when the monitor saw the last load of each end, ``unknown`` otherwise."""
        assert watch.geometry is not None
        being_loaded = state["being_loaded"]
        if not being_loaded or not cases:
            return None
        geometry = watch.geometry
        counted: set[Any] = set()
        for case in cases:
            best = lookup_contract_answer(case).best_present
            if best is None or best <= local:
                continue
            for spec, group_state in zip(geometry.groups, status.group_states, strict=True):
                lo, hi = multigroup.load_range(geometry, spec, best, local)
                counted.update(key for key in group_state.offload_keys[lo:hi]
                               if key in being_loaded)
        if not counted:
            return None
        if any(not is_store and owner != request_id and set(keys) & counted
               for is_store, keys, owner in state["jobs"].values()):
            return "open"
        return "ended" if all(key in watch.load_ended for key in counted) else "unknown"

    def _pending_wait(self, watch: _ConnectorWatch, connector: Any,
                      answers: dict[Any, LookupResult | None],
                      jobs: dict[int, tuple[bool, tuple[Any, ...], str]]) -> str:
        """Whether the stores of the chunks answered HIT_PENDING may still be open:
        ``unknown`` on a test's mock manager (its answers are the test's); on a real one
        ``ended`` when the store of each ended at an earlier step and none holding it is
        open, else ``open``."""
        from unittest import mock

        if isinstance(connector.manager, mock.NonCallableMock):
            return "unknown"
        pending = [key for key, answer in answers.items()
                   if answer is LookupResult.HIT_PENDING]
        storing = {key for is_store, keys, _ in jobs.values() if is_store for key in keys}
        ended = all(key not in storing and watch.store_ended.get(key, watch.steps) < watch.steps
                    for key in pending)
        return "ended" if ended else "open"

    @staticmethod
    def _ended_text(state: dict[str, Any]) -> str:
        own = sorted(state["own"])
        if own:
            return f"its transfer_jobs {own} ended (the worker reported them)"
        return ("the chunks it waits on are counted as being loaded, or answered pending, "
                "after every job holding them ended")

    def _lookup_out_of_scope(self, watch: _ConnectorWatch, connector: Any, request: Any,
                             status: Any, state: dict[str, Any], hit: Any) -> str | None:
        why = self._connector_out_of_scope(watch, connector, status)
        if why is not None:
            return why
        if state["in_flight"]:
            return "the request had transfers in flight (the connector's own deferral)"
        if self._stand_in(request, status):
            return "a stand-in request or request state (a test's mock)"
        # ``is True``: a flag a release lacks reads False, never a mock's truthy attribute.
        # 0.33.0 names the request's flag skip_reading_prefix_cache, 0.34.0
        # skip_reading_external_kv; a failed load sets load_failed (0.34.0).
        if any(getattr(holder, flag, False) is True for holder, flag in (
                (request, "skip_reading_external_kv"), (request, "skip_reading_prefix_cache"),
                (status, "load_failed"))):
            return "the request may not read the offloaded tier"
        if watch.unobserved:
            return "the manager's lookup answers could not be observed"
        answers = state["answers"]
        if any(r is None for r in answers.values()):
            return "a lookup answer that is no LookupResult (an unconfigured mock)"
        if LookupResult.RETRY in answers.values():
            return "an asynchronous lookup was in flight (RETRY)"
        if hit is not None and type(getattr(status, "partial_tail_boundary", None)) is int:
            return PARTIAL_TAIL_HIT
        keys = {key for gs in status.group_states for key in gs.offload_keys}
        if keys & state["being_loaded"]:
            return "another request was loading the request's chunks (the connector's rule)"
        complete = watch.complete_hit[-1] if watch.complete_hit else hit
        if complete != hit:
            return ("a partial-tail search turned the complete-chunk answer into a deferral "
                    "(docs/CONTRACT.md 9.2: C3 states no sub-chunk window; its cause is "
                    "judged as C13's)")
        return None

    def _count_checks(self, watch: _ConnectorWatch) -> None:
        """Add what the judge checked since the last count (its counts are cumulative)."""
        assert watch.judge is not None
        now = Counter(watch.judge.checks)
        self.report.judged.update(now - watch.checks_counted)
        watch.checks_counted = now

    # -- loads and retention ----------------------------------------------------------------
    def _before_update_state_after_alloc(self, connector: Any, signature: _Parameters,
                                         args: tuple[Any, ...],
                                         kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """For a partial tail's load (vLLM consumes ``partial_tail_boundary`` there): the
        boundary and the keys other requests' loads hold before this one joins them."""
        bound = signature.named(args, kwargs)
        request = bound.get("request")
        if not int(bound.get("num_external_tokens") or 0) or request is None:
            return None
        statuses = getattr(connector, "_req_status", None)
        status = statuses.get(request.request_id) if isinstance(statuses, dict) else None
        boundary = getattr(status, "partial_tail_boundary", None)
        if type(boundary) is not int:
            return None
        return {"boundary": boundary,
                "being_loaded": frozenset(getattr(connector, "_chunks_being_loaded", None)
                                          or ())}

    def _after_update_state_after_alloc(self, connector: Any, signature: _Parameters,
                                        args: tuple[Any, ...], kwargs: dict[str, Any],
                                        result: Any, state: Any) -> None:
        bound = signature.named(args, kwargs)
        external = int(bound.get("num_external_tokens") or 0)
        if external <= 0:
            return
        watch = self._watch(connector)
        request = bound["request"]
        self.report.events["load"] += 1
        if watch is None or watch.geometry is None or watch.judge is None:
            self.report.skip(f"load: geometry: {watch.why_not if watch else '?'}",
                             self.current_test)
            return
        if request.request_id in watch.failed_loads:
            self.report.judged["C15"] += 1
            self._found("C15", "failed-load",
                        f"request {request.request_id}: loads {external} tokens from the "
                        "offloaded tier again after the worker reported its load failed",
                        None, None, None)
        if state is not None:
            self._judge_partial_tail_load(watch, connector, request, state, external)
            return
        case = watch.judged_cases.get(request.request_id)
        if case is None:
            self.report.skip("load: its lookup was not judged", self.current_test)
            return
        status = connector._req_status.get(request.request_id)
        geometry = watch.geometry
        local = int(status.num_locally_computed_tokens)
        watch.note(request.request_id, f"load of {external} tokens past {local}")
        self._about = (watch, request.request_id)
        hit = local + external
        # The witness of a load finding: the lookup case that decided this hit (its
        # load set is what C2/lookup-loads-only-hit judges, on the reference and on vLLM).
        theorem, witness = (("C2/lookup-loads-only-hit", case.to_json())
                            if case.local_hit == local else (None, None))
        jobs = getattr(connector, "_jobs", {})
        job_ids = sorted(getattr(status, "transfer_jobs", ()) or ())
        keys: tuple[Any, ...] = ()
        if job_ids and job_ids[-1] in jobs:
            keys = tuple(getattr(jobs[job_ids[-1]], "keys", ()) or ())
        chunk_of = {key: (g, k) for g, gs in enumerate(status.group_states)
                    for k, key in enumerate(gs.offload_keys)}
        answers = watch.answers.get(request.request_id, {})
        loaded: dict[int, set[int]] = {}
        for key in keys:
            where = chunk_of.get(key)
            if where is None:
                continue
            loaded.setdefault(where[0], set()).add(where[1])
            answer = answers.get(key)
            self.report.judged["C2"] += 1
            if answer is not None and answer is not LookupResult.HIT:
                self._found("C2", "crash",
                            f"request {request.request_id}: loads chunk {where[1]} of group "
                            f"{where[0]}, which the manager answered {answer.name} (upstream's "
                            f"'not {'ready' if answer is LookupResult.HIT_PENDING else 'found'}'"
                            " crash)", theorem, witness, Impact.CRASH)
        for g, spec in enumerate(geometry.groups):
            if spec.kind is GroupKind.MAMBA:
                continue
            lo, hi = multigroup.load_range(geometry, spec, hit, local)
            got = loaded.get(g, set())
            self.report.judged["C2"] += 1
            if got and got != set(range(lo, hi)):
                self._found("C2", "load-set",
                            f"request {request.request_id} group {g}: loads chunks "
                            f"{sorted(got)}, the contract's Load(N={hit}, L={local}) is "
                            f"[{lo}, {hi})", theorem, witness, None)
        self._judge_retention(watch, connector, request, bound.get("blocks"), hit)

    def _judge_partial_tail_load(self, watch: _ConnectorWatch, connector: Any, request: Any,
                                 state: dict[str, Any], external: int) -> None:
        """``C2/partial-tail-loads`` (docs/CONTRACT.md 9.2, load safety): every key a
        partial tail's load names (the complete chunks below the tail, each group's key at
        the boundary) was answered HIT to the request by the lookup that accepted the tail
        (else upstream's "not found"/"not ready": a crash), and none is a key another
        request's load has in flight (the connector's ``_chunks_being_loaded``: a second
        transfer of it, which 0.34.0 defers)."""
        request_id = request.request_id
        boundary = state["boundary"]
        status = connector._req_status.get(request_id)
        looked = watch.partial_tails.pop(request_id, None)
        test = self.current_test
        watch.note(request_id, f"load of a partial tail at {boundary} ({external} tokens)")
        self._about = (watch, request_id)
        if looked is None or looked.boundary != boundary:
            self.report.skip("partial-tail load: the lookup that accepted it was not judged "
                             "(a test set the boundary or called the connector's lookup by "
                             "hand)", test, f"request {request_id}: tail at {boundary}")
            return
        jobs = getattr(connector, "_jobs", {})
        job_ids = sorted(getattr(status, "transfer_jobs", ()) or ())
        keys: tuple[Any, ...] = ()
        if job_ids and isinstance(jobs, dict) and job_ids[-1] in jobs:
            keys = tuple(getattr(jobs[job_ids[-1]], "keys", ()) or ())
        if not keys:
            self.report.skip("partial-tail load: its load job's keys are not readable", test,
                             f"request {request_id}")
            return
        self.report.judge("C2/partial-tail-loads")
        places = key_places(connector, status, keys)
        unanswered = [key for key in keys if looked.answers.get(key) is not LookupResult.HIT]
        in_flight = [key for key in keys if key in state["being_loaded"]]
        witness = {"boundary": boundary, "local_hit": looked.local_hit,
                   "complete_hit": looked.complete_hit, "num_external_tokens": external,
                   "loaded": _placed(places, keys),
                   "answers": sorted(
                       f"{_placed(places, [key])[0]}: "
                       f"{getattr(looked.answers.get(key), 'name', None) or 'never asked'}"
                       for key in keys),
                   "in_flight_elsewhere": _placed(places, in_flight)}
        if unanswered:
            named = [f"{_placed(places, [key])[0]} "
                     f"({getattr(looked.answers.get(key), 'name', None) or 'never asked'})"
                     for key in unanswered]
            pending = any(looked.answers.get(key) is LookupResult.HIT_PENDING
                          for key in unanswered)
            self._found("C2", "partial-tail-loads",
                        f"request {request_id}: the load of its partial tail at {boundary} "
                        f"names keys its lookup did not answer HIT: {', '.join(sorted(named))} "
                        f"(upstream's 'not {'ready' if pending else 'found'}' crash) "
                        f"({NO_PARTIAL_TAIL_REPRODUCER})", None, witness, Impact.CRASH)
        if in_flight:
            self._found("C2", "partial-tail-in-flight",
                        f"request {request_id}: the load of its partial tail at {boundary} "
                        f"names keys another request's load has in flight: "
                        f"{', '.join(_placed(places, in_flight))} (a second transfer of "
                        f"them) ({NO_PARTIAL_TAIL_REPRODUCER})", None, witness, Impact.WASTE)

    def _judge_retention(self, watch: _ConnectorWatch, connector: Any, request: Any,
                         blocks: Any, hit: int) -> None:
        assert watch.geometry is not None and watch.judge is not None
        table = getattr(blocks, "blocks", None)
        if table is None:
            return
        before = len(watch.judge.violations)
        for g, (group, spec) in enumerate(zip(connector.config.kv_group_configs,
                                              watch.geometry.groups, strict=True)):
            if spec.kind is GroupKind.FULL:
                continue
            end = -(-hit // watch.geometry.block_tokens(spec))
            row = list(table[group.group_idx])[:end]
            if len(row) < end:
                continue
            watch.judge(AllocationEvent(request.request_id, g, hit,
                                        tuple(not getattr(b, "is_null", False) for b in row)))
        self._count_checks(watch)
        for violation in watch.judge.violations[before:]:
            self._found(violation.clause, violation.kind, violation.message, None, None,
                        violation.impact)

    # -- stores -----------------------------------------------------------------------------
    def _before_build_connector_meta(self, connector: Any, signature: _Parameters,
                                     args: tuple[Any, ...],
                                     kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The state before each store step of the step's requests (vLLM's stored index
        per group) and, through the manager's ``prepare_store``, what the step offers."""
        watch = self._watch(connector)
        statuses = getattr(connector, "_req_status", None)
        if watch is None or watch.geometry is None or not isinstance(statuses, dict):
            return None
        output = signature.named(args, kwargs).get("scheduler_output")
        scheduled = getattr(output, "num_scheduled_tokens", None)
        finished = getattr(output, "finished_req_ids", None) or ()
        if not isinstance(scheduled, dict):
            return None
        before: dict[str, tuple[Any, tuple[int, ...]]] = {}
        for request_id in [*scheduled, *finished]:
            status: Any = statuses.get(request_id)
            with contextlib.suppress(Exception):  # gone, or a stand-in state: not judged
                before[request_id] = (status, tuple(int(gs.next_stored_chunk_idx)
                                                    for gs in status.group_states))
        calls: list[tuple[tuple[Any, ...], Any, bool]] = []

        def sink(call_args: tuple[Any, ...], call_kwargs: dict[str, Any], result: Any) -> None:
            calls.append((tuple(_argument(call_args, call_kwargs, 0, "keys") or ()),
                          _argument(call_args, call_kwargs, 1, "req_context"),
                          result is None))

        observed = hook_manager_method(connector.manager, "prepare_store", sink)
        return {"before": before, "calls": calls, "observed": observed}

    def _after_build_connector_meta(self, connector: Any, signature: _Parameters,
                                    args: tuple[Any, ...], kwargs: dict[str, Any],
                                    result: Any, state: dict[str, Any] | None) -> None:
        watch = self._watch(connector)
        if watch is not None:
            watch.steps += 1
        if state is not None:
            with contextlib.suppress(Exception):
                hook_manager_method(connector.manager, "prepare_store", lambda *_: None)
        jobs = getattr(connector, "_jobs", None)
        if watch is None or not isinstance(jobs, dict):
            return
        bound = signature.named(args, kwargs)
        scheduled = getattr(bound.get("scheduler_output"), "num_scheduled_tokens", {}) or {}
        for job_id, job in list(jobs.items()):
            if job_id in watch.seen_jobs or not getattr(job, "is_store", False):
                continue
            watch.seen_jobs.add(job_id)
            self.report.events["store"] += 1
            for key in getattr(job, "keys", ()) or ():
                with contextlib.suppress(TypeError):
                    watch.store_ended.pop(key, None)  # stored again: open
            watch.note(str(job.req_id), f"store job {job_id}: "
                       f"{len(getattr(job, 'keys', ()) or ())} keys")
            self._about = (watch, str(job.req_id))
            if watch.geometry is None:
                self.report.skip(f"store: geometry: {watch.why_not}", self.current_test)
                continue
            status = connector._req_status.get(job.req_id)
            if status is None:
                self.report.skip("store: the request's state is gone", self.current_test)
                continue
            request = status.req
            horizon = int(request.num_computed_tokens) + int(scheduled.get(job.req_id, 0))
            for g, (group_state, spec) in enumerate(zip(status.group_states,
                                                        watch.geometry.groups, strict=True)):
                index = {key: k for k, key in enumerate(group_state.offload_keys)}
                tpc = watch.geometry.chunk_tokens(spec)
                for key in getattr(job, "keys", ()) or ():
                    chunk = index.get(key)
                    if chunk is None:
                        continue
                    self.report.judged["C10"] += 1
                    if (chunk + 1) * tpc > horizon:
                        self._found("C10", "store",
                                    f"request {job.req_id} group {g}: store job {job_id} "
                                    f"holds chunk {chunk} (tokens up to {(chunk + 1) * tpc}) "
                                    f"past the {horizon} tokens computed by this step",
                                    None, None, None)
        if state is not None:
            self._judge_store_steps(watch, connector, signature.named(args, kwargs), state)

    def _judge_store_steps(self, watch: _ConnectorWatch, connector: Any,
                           bound: dict[str, Any], state: dict[str, Any]) -> None:
        """Each request's store step against the spec's step from the same state (C8,
        C9; ``C9/store-steps-refine-spec``'s form): the chunks it offered to
        ``prepare_store`` are exactly :func:`~kvcontract.spec.properties.store.
        spec_step_offers`' (more: C8, waste; fewer: C9, a lost store), and vLLM's stored
        index after a running step is the spec's. The state before the step is vLLM's
        own: its stored index, and the chunks the request offered since its first store
        step plus those below the index it started with (a hit's)."""
        output = bound.get("scheduler_output")
        finished = set(getattr(output, "finished_req_ids", None) or ())
        for request_id, (status, before) in state["before"].items():
            self._about = (watch, str(request_id))
            offers = self._offers_of(watch, request_id, status, before, state["calls"])
            why = self._store_out_of_scope(watch, connector, request_id, status, state)
            history = watch.histories.get(request_id)
            if offers is None or why is not None:
                self.report.skip(f"store step: {why or 'a stand-in request state'}",
                                 self.current_test, f"request {request_id}")
                if history is not None:
                    history.steps += 1
                    history.breaks(f"a store step the monitor did not judge: {why}")
            else:
                try:
                    self._judge_store_step(watch, connector, output, request_id, status,
                                           before, *offers)
                except _NotJudged as exc:
                    if history is not None:
                        history.steps += 1
                        history.breaks(f"a store step the monitor did not judge: {exc}")
            if offers is not None and not offers[1]:
                # What a step offered is offered, judged or not (a refused offer is not:
                # vLLM offers it again).
                for offered, got in zip(watch.offered.get(request_id, ()), offers[0],
                                        strict=False):
                    offered |= got
            if request_id in finished:
                watch.forget_stores(request_id)

    def _offers_of(self, watch: _ConnectorWatch, request_id: str, status: Any,
                   before: tuple[int, ...], calls: Sequence[tuple[tuple[Any, ...], Any, bool]],
                   ) -> tuple[list[set[int]], bool] | None:
        """``(chunks offered per group, whether the manager refused an offer)`` of the
        request's ``prepare_store`` calls this step (keys of no complete chunk, a
        partial tail's, left out); None for a stand-in state. Opens the request's
        offered chunks at its first store step."""
        geometry = watch.geometry
        assert geometry is not None
        context = getattr(status, "req_context", None)
        groups = getattr(status, "group_states", None)
        if context is None or not isinstance(groups, tuple) or len(groups) != len(
                geometry.groups) or len(before) != len(geometry.groups):
            return None
        got: list[set[int]] = [set() for _ in geometry.groups]
        refused = False
        mine = [(keys, none) for keys, call_context, none in calls if call_context is context]
        if mine:
            where = _chunks_of({key for keys, _ in mine for key in keys if _hashable(key)},
                               groups)
            for keys, none in mine:
                chunks = [where[key] for key in keys if _hashable(key) and key in where]
                refused |= none and bool(chunks)
                for g, k in chunks:
                    got[g].add(k)
        watch.open_offers(request_id, len(geometry.groups), before)
        return got, refused

    def _store_out_of_scope(self, watch: _ConnectorWatch, connector: Any, request_id: str,
                            status: Any, state: dict[str, Any]) -> str | None:
        geometry = watch.geometry
        assert geometry is not None
        request = getattr(status, "req", None)
        if not all(isinstance(getattr(request, name, None), int) for name in (
                "num_prompt_tokens", "num_tokens", "num_computed_tokens")) or not callable(
                    getattr(request, "is_finished", None)):
            return "a stand-in request or request state (a test's mock)"
        if request_id in watch.restarted:
            return ("its stores restarted at chunk 0 (a preemption's lookup or a cache "
                    "reset; the store spec has neither)")
        if not state["observed"]:
            return "the manager's prepare_store could not be observed"
        config = connector.config
        for what, theirs, ours in (
                ("alignment", getattr(config, "alignment_tokens", geometry.alignment_tokens),
                 geometry.alignment_tokens),
                ("retention interval",
                 getattr(config, "retention_interval", geometry.retention_interval),
                 geometry.retention_interval),
                ("lookahead block hashes", bool(getattr(
                    connector, "use_lookahead_block_hashes", geometry.hash_lookahead)),
                 bool(geometry.hash_lookahead))):
            if theirs != ours:
                return f"the connector's {what} ({theirs}) is not the geometry's ({ours})"
        return None

    def _judge_store_step(self, watch: _ConnectorWatch, connector: Any, output: Any,
                          request_id: str, status: Any, before: tuple[int, ...],
                          got: list[set[int]], refused: bool) -> None:
        geometry = watch.geometry
        assert geometry is not None
        request = status.req
        prompt, total = int(request.num_prompt_tokens), int(request.num_tokens)
        computed = int(request.num_computed_tokens)
        if getattr(request.status, "name", None) == "FINISHED_ABORTED":
            step, scheduled = RequestStatus.ABORTED, 0
        elif request.is_finished():
            step, scheduled = RequestStatus.FINISHED, 0
        else:
            step = RequestStatus.PREFILLING if computed < prompt else RequestStatus.DECODING
            if computed < prompt < total:
                # vLLM samples no token for a partial prefill: a test's stand-in model
                # runner did, so the step is prefill and decode at once (no spec status).
                self._store_skip("the request holds output tokens before its prompt is "
                                 "computed (a test's model runner sampled a partial "
                                 "prefill)", request_id)
            planned = (getattr(output, "num_scheduled_tokens", {}) or {}).get(request_id)
            if not isinstance(planned, int):
                self._store_skip("a running request the step schedules nothing for",
                                 request_id)
            scheduled = planned
        prompt_only = getattr(connector.config, "offload_prompt_only", True)
        cap = getattr(status, "max_offload_tokens", None)
        if not isinstance(prompt_only, bool) or not (cap is None or isinstance(cap, int)):
            self._store_skip("a stand-in configuration (a test's mock)", request_id)
        if stored_token_count(step, computed, scheduled, total, prompt, cap,
                              prompt_only) > total:
            self._store_skip("the step's tokens are not all the request's yet "
                             "(asynchronous scheduling's placeholders, or draft tokens)",
                             request_id)
        replay = store_replay_boundaries(geometry, prompt)
        junction = getattr(request, "shared_prefix_boundary", 0)
        history = watch.histories[request_id]
        history.advance(step, computed, scheduled, total, prompt, prompt_only, cap)
        if refused:
            history.breaks("the manager refused an offer (prepare_store returned None): "
                           "a StoreCase has no refusals")
        if geometry.retention_interval is not None and isinstance(junction, int) and junction:
            replay = tuple(sorted({*replay, junction}))  # docs/CONTRACT.md 9.3
            history.breaks(f"its shared-prefix junction {junction} (a StoreCase has none)")
        offered = watch.offered[request_id]
        bpc = geometry.blocks_per_chunk
        spec_now: list[tuple[list[int], int]] = []
        found: list[tuple[str, str, str, dict[str, Any], Impact, int, list[int]]] = []
        for g, (spec, group_state) in enumerate(zip(geometry.groups, status.group_states,
                                                    strict=True)):
            if spec.kind is GroupKind.MAMBA:
                self.report.skip("store step: a Mamba group (vLLM stores its state through "
                                 "the GPU's boundary hand-off)", self.current_test)
                history.breaks("a Mamba group (its state is stored from the GPU's hand-off, "
                               "which vLLM's engine judge does not make)")
                spec_now.append(([], before[g]))
                continue
            storable, final, live_from = step_bounds(geometry, spec, step, computed,
                                                     scheduled, total, prompt, prompt_only,
                                                     cap)
            if storable > min(len(group_state.block_ids) // bpc,
                              len(group_state.offload_keys)):
                self.report.skip("store step: vLLM's block table or block hashes hold fewer "
                                 "chunks than the spec's storable ones", self.current_test,
                                 f"request {request_id} group {g}")
                history.breaks("vLLM's block table or hashes held fewer chunks than the "
                               "spec's storable ones")
                spec_now.append(([], before[g]))
                continue
            expected, index = spec_step_offers(geometry, g, step, computed, scheduled, total,
                                               prompt, offered[g], before[g], prompt_only,
                                               replay, cap)
            spec_now.append((expected, index))
            extra = sorted(got[g] - set(expected))
            missing = sorted(set(expected) - got[g])
            null = [c for c in missing if any(
                b < len(group_state.block_ids) and not group_state.block_ids[b]
                for b in group_marked_blocks(geometry, spec, c, final, replay))]
            if null:
                self.report.skip("store step: a chunk the spec stores holds a block the "
                                 "connector's table has as null", self.current_test,
                                 f"request {request_id} group {g} chunks {null}")
                history.breaks("a chunk the spec stores held a block the connector's table "
                               "has as null")
                missing = [c for c in missing if c not in null]
            self.report.judge("C8/store-step")
            self.report.judge("C9/store-step")
            what = (f"request {request_id} group {g} ({step.value}, {computed}+{scheduled} "
                    f"of {total} tokens, prompt {prompt})")
            witness = {"geometry": geometry.to_dict(), "group": g, "status": step.value,
                       "num_computed": computed, "num_scheduled": scheduled,
                       "num_tokens": total, "prompt_len": prompt, "prompt_only": prompt_only,
                       "max_offload_tokens": cap, "replay_boundaries": list(replay),
                       "next_before": before[g], "offered_before": sorted(offered[g]),
                       "offered": sorted(got[g]), "spec_offers": list(expected)}
            if extra:
                found.append(("C8", "store-step",
                              f"{what}: offered chunks {extra} the spec's step does not "
                              f"(it offers {list(expected)}): " + _why_extra(
                                  extra, offered[g], before[g], storable, live_from,
                                  {c: group_marked_blocks(geometry, spec, c, final, replay)
                                   for c in extra}),
                              witness, Impact.WASTE, g, extra))
            if missing:
                found.append(("C9", "store-step",
                              f"{what}: never offered chunks {missing} the spec's step "
                              f"offers (it offered {sorted(got[g])})", witness,
                              Impact.LOST_HIT, g, []))
            after = int(group_state.next_stored_chunk_idx)
            if not refused and step not in (RequestStatus.FINISHED, RequestStatus.ABORTED) \
                    and after != index:
                found.append(("C9", "store-index",
                              f"{what}: next_stored_chunk_idx is {after} after the step, the "
                              f"spec's is {index} (before it: {before[g]})", witness,
                              Impact.LOST_HIT if after > index else Impact.WASTE, g, []))
        for clause, kind, message, witness, impact, g, extra in found:
            reproduced = self._store_reproduction(
                watch, connector, history, spec_now, kind, g, extra,
                offered[g] - set(range(history.start_index[g])))
            if isinstance(reproduced, str):
                self._found(clause, kind, f"{message} (no reproducer: {reproduced})", None,
                            witness, impact)
            else:
                self._found(clause, kind, message, reproduced[0], reproduced[1], impact)
        if found and history.departed is None:
            history.departed = history.steps

    def _store_skip(self, why: str, request_id: str) -> NoReturn:
        self.report.skip(f"store step: {why}", self.current_test, f"request {request_id}")
        raise _NotJudged(why)

    def _store_reproduction(self, watch: _ConnectorWatch, connector: Any,
                            history: StoreHistory, spec_now: list[tuple[list[int], int]],
                            kind: str, group: int, extra: Sequence[int],
                            offered_earlier: set[int]) -> tuple[str, dict[str, Any]] | str:
        """``(theorem, StoreCase witness)`` that replays a store-step finding of the step
        just judged (the request's history as a StoreCase, ending after this step), or why
        there is none. Only the witness is built here (its replay on vLLM's engine is the
        reproducer's): the case's spec run must give this step's expected offers and
        index (``spec_now``), and kvcontract's reference must meet the theorem on it. A
        test's mock manager has none: such a test drives the connector by hand (its block
        tables and answers are the test's, not a scheduler's), which a StoreCase replayed
        on vLLM's engine would not reproduce."""
        from unittest import mock

        from kvcontract.impl.variants import REFERENCE
        from kvcontract.live.build import unsupported
        from kvcontract.spec.build import buildable
        from kvcontract.spec.properties.catalog import replay

        geometry = watch.geometry
        assert geometry is not None
        case = history.case(geometry)
        if isinstance(case, str):
            return case
        if history.departed is not None and history.departed < history.steps:
            return ("an earlier store step of the request departed from the spec already "
                    "(that finding's witness replays it)")
        if isinstance(getattr(connector, "manager", None), mock.NonCallableMock):
            return ("the test's manager is a mock: the test drives the connector by hand "
                    "(block tables, answers), a StoreCase runs vLLM's scheduler")
        built, why_not = buildable(geometry)
        unbuilt = unsupported(geometry) or (None if built else why_not)
        if unbuilt is not None:
            return f"vLLM's engine does not build its geometry ({unbuilt})"
        index = len(history.prefill) + history.decode + (history.ended is not None) - 1
        if spec_store_step(case, index) != spec_now:
            return ("its StoreCase's spec run differs from the step the monitor judged "
                    "(vLLM's step is not the schedule's)")
        theorem = store_theorem(case, kind, group, extra, offered_earlier)
        witness = case.to_json()
        held = replay(theorem, witness, REFERENCE)
        if held is not None:
            return f"kvcontract's reference does not meet {theorem} on its StoreCase ({held})"
        return theorem, witness

    # -- the deferral bound (C13) ------------------------------------------------------------
    def _judge_deferral(self, watch: _ConnectorWatch, request_id: str, hit: Any) -> None:
        """A deferral (None) opens an episode at this step; a decision closes it, late
        past ``D`` steps a ``delay`` (``C13/deferral-bounded``, as the lifecycle judge)."""
        if hit is None:
            watch.deferred_since.setdefault(request_id, watch.steps)
            return
        if request_id in watch.deferred_since:
            self._end_deferral(watch, request_id, "decided")

    def _end_deferral(self, watch: _ConnectorWatch, request_id: str, how: str) -> None:
        """Close a request's deferral episode: ``decided`` (a late decision is a delay),
        ``ended`` (finished or aborted while deferred) or ``unfinished`` (the test or the
        run ended): past the bound with nothing deciding it, a stall."""
        first = watch.deferred_since.pop(request_id, None)
        if first is None:
            return
        bound, step = self.options.deferral_bound, watch.steps
        self.report.judge("C13/deferral-bounded")
        if within_deferral_bound(first, step, bound):
            return
        age = deferral_age(first, step)
        if how == "decided":
            self._found("C13", "deferral-bounded",
                        f"request {request_id} first deferred at step {first} was decided at "
                        f"step {step}: {age} steps, past the bound D = {bound}",
                        "C13/deferral-bounded", None, Impact.DELAY)
        else:
            self._found("C13", "deferral-bounded",
                        f"request {request_id} deferred from step {first} to step {step} "
                        f"({age} steps; bound D = {bound}) and never decided"
                        + (" before it ended" if how == "ended" else ""),
                        "C13/deferral-bounded", None, Impact.STALL)

    def flush(self) -> None:
        """Close every open deferral episode (at the end of a test or of a run)."""
        with self._lock:
            for watch in list(self._watches.values()):
                for request_id in list(watch.deferred_since):
                    self._about = (watch, request_id)
                    self._end_deferral(watch, request_id, "unfinished")
            self._about = None

    # -- failed transfers (C14, C15) ---------------------------------------------------------
    def _before_update_connector_output(self, connector: Any, signature: _Parameters,
                                        args: tuple[Any, ...],
                                        kwargs: dict[str, Any]) -> dict[str, Any] | None:
        from unittest import mock

        output = signature.named(args, kwargs).get("connector_output")
        meta = getattr(output, "kv_connector_worker_meta", None)
        failed = getattr(meta, "failed_jobs", None)
        jobs = getattr(connector, "_jobs", None)
        if not isinstance(jobs, dict):
            return None
        # The jobs that may end here (C13: what a deferral waits on); a store's keys are
        # kept on a real manager only (a test's mock answers lookups as the test says).
        real = not isinstance(getattr(connector, "manager", None), mock.NonCallableMock)
        open_jobs = dict(jobs)  # the job objects: their keys are read once one ends
        # A release whose worker reports no failures (0.33.0) has none.
        reported = {job_id: (bool(jobs[job_id].is_store), tuple(jobs[job_id].keys),
                             jobs[job_id].req_id)
                    for job_id in failed or () if job_id in jobs}
        if not reported:
            return {"open": open_jobs, "real": real, "reported": {}}
        calls: list[tuple[tuple[Any, ...], bool]] = []

        def sink(call_args: tuple[Any, ...], call_kwargs: dict[str, Any], result: Any) -> None:
            calls.append((tuple(_argument(call_args, call_kwargs, 0, "keys") or ()),
                          bool(_argument(call_args, call_kwargs, 2, "success", True))))

        observed = hook_manager_method(connector.manager, "complete_store", sink)
        return {"open": open_jobs, "real": real, "reported": reported, "calls": calls,
                "observed": observed}

    def _after_update_connector_output(self, connector: Any, signature: _Parameters,
                                       args: tuple[Any, ...], kwargs: dict[str, Any],
                                       result: Any, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        watch = self._watch(connector)
        if watch is not None:
            for job_id, job in state["open"].items():
                if job_id not in connector._jobs:
                    watch.job_ended(job_id, bool(getattr(job, "is_store", False)),
                                    tuple(getattr(job, "keys", ()) or ()), state["real"])
        if not state["reported"]:
            return
        with contextlib.suppress(Exception):
            hook_manager_method(connector.manager, "complete_store", lambda *_: None)
        for job_id, (is_store, keys, request_id) in state["reported"].items():
            if job_id in connector._jobs:
                continue  # another worker has yet to report it
            self.report.events["failed store" if is_store else "failed load"] += 1
            if watch is not None:
                watch.note(str(request_id), f"{'store' if is_store else 'load'} job "
                           f"{job_id} failed")
                self._about = (watch, str(request_id))
            if not is_store:
                if watch is not None:
                    watch.failed_loads.add(request_id)
                continue
            if not state["observed"]:
                self.report.skip("a failed store: complete_store not observable", self.current_test)
                continue
            self.report.judged["C14"] += 1
            if any(call_keys == keys and success for call_keys, success in state["calls"]):
                self._found("C14", "failed-store",
                            f"request {request_id}: store job {job_id} failed on the worker, "
                            f"and the connector published its {len(keys)} chunk(s) as stored "
                            "(complete_store success=True): later hits load bytes never "
                            "written", None, None, None)

    # -- the end of a request ---------------------------------------------------------------
    def _after_request_finished(self, connector: Any, signature: _Parameters,
                                args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
                                state: Any) -> None:
        self.report.events["finish"] += 1
        watch = self._watches.get(connector)
        request = signature.named(args, kwargs).get("request")
        if watch is not None and request is not None:
            self._about = (watch, request.request_id)
            self._end_deferral(watch, request.request_id, "ended")
            watch.forget(request.request_id)

    def _after_reset_cache(self, connector: Any, signature: _Parameters,
                           args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
                           state: Any) -> None:
        self.report.events["reset"] += 1
        watch = self._watches.get(connector)
        if watch is not None:
            # vLLM restarts every request's stores at chunk 0 (the spec has no reset).
            watch.restarted.update(watch.offered)
            watch.store_ended.clear()

    def _raised(self, connector: Any, where: str, exc: BaseException) -> None:
        self.report.events["exception"] += 1
        message = str(exc)
        if any(marker in message for marker in CRASH_MARKERS):
            self._found("C2", "crash", f"{where} raised {type(exc).__name__}: {message}",
                        None, None, Impact.CRASH)

    # -- findings ---------------------------------------------------------------------------
    def _found(self, clause: str, kind: str, message: str, theorem: str | None,
               witness: dict[str, Any] | None, impact: Impact | None) -> None:
        from kvcontract.spec.clauses import CLAUSE_IMPACT

        grade = impact or CLAUSE_IMPACT.get(clause)
        message = message.replace("system accepted", "vLLM's connector accepted")
        for earlier in reversed(self.test_violations()):
            if (earlier.clause, earlier.kind, earlier.message) == (clause, kind, message):
                earlier.repeats += 1
                return
        finding = Finding(self.current_test, clause,
                          grade.value if isinstance(grade, Impact) else str(grade), kind,
                          message, theorem, witness)
        if self._about is not None:
            watch, request_id = self._about
            finding.recent = list(watch.recent.get(request_id, ()))
        if self.options.reproducers is not None and theorem is not None and witness:
            finding.reproducer = str(self._write_reproducer(finding))
        self.report.violations.append(finding)
        if self.options.on_violation is not None:
            self.options.on_violation(finding)

    def _write_reproducer(self, finding: Finding) -> Path:
        assert self.options.reproducers is not None and finding.theorem is not None
        folder = self.options.reproducers
        folder.mkdir(parents=True, exist_ok=True)
        self._reproducer_count += 1
        path = folder / f"test_monitor_{self._reproducer_count:04d}.py"
        path.write_text(reproducer_source(finding))
        return path


def reproducer_source(finding: Finding) -> str:
    """A pytest file that replays a violation's witness without vLLM's test harness: the
    theorem on kvcontract's reference (it holds there), and the audit's theorem on vLLM's
    own engine over the same witness (:func:`engine_theorem`, where vLLM is installed),
    which fails while vLLM violates it. A lookup's witness is the states the connector
    saw; a store step's, the request's store schedule (a ``StoreCase``: prompt, prefill
    steps, decode steps, ending), replayed from its start. A witness vLLM's engine cannot
    run (a geometry it does not build, a schedule it does not realize) skips the vLLM test
    with the reason: it never claims a violation it cannot show."""
    import textwrap

    assert finding.theorem is not None
    upstream = engine_theorem(finding.theorem)
    store = upstream.split("/", 1)[1].startswith("upstream-store-")
    what = ("the request's store schedule (a StoreCase: its prompt, prefill steps, decode "
            "steps and ending, run from its start)" if store else
            "the states the connector saw")
    message = finding.message.replace('"""', "'''").replace("\\", "\\\\")
    about = textwrap.fill(
        f"Generated by kvcontract's runtime monitor. The reference test replays "
        f"{finding.theorem} on {what} with kvcontract's reference; the vLLM test replays "
        f"{upstream} on the same witness on the installed vLLM's scheduler and connector "
        "(kvcontract's live backend) and fails while vLLM violates it.", 88)
    return f'''"""kvcontract monitor: {finding.clause} ({finding.impact}) seen in {finding.test}.

{message}

{about}
"""

import importlib.util

import pytest

import kvcontract

WITNESS = {pprint.pformat(finding.witness, indent=4, sort_dicts=True)}


def test_the_contract_holds_on_the_reference():
    assert kvcontract.replay({finding.theorem!r}, WITNESS, "reference") is None


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_vllm_meets_the_contract():
    from kvcontract.api import replay_audit
    from kvcontract.errors import InputFileError

    try:
        violation = replay_audit("vllm:installed", {upstream!r}, WITNESS)
    except InputFileError as exc:
        pytest.skip(f"vLLM's engine cannot run this witness: {{exc}}")
    assert violation is None, violation
'''


def _scheduler_class() -> type | None:
    import importlib

    for module_name in SCHEDULER_MODULES:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # an older layout, or a release that does not import here
            continue
        cls = getattr(module, "OffloadingConnectorScheduler", None)
        if isinstance(cls, type):
            return cls
    return None


def variant_roles(name: str) -> tuple[list[str], list[str]]:
    """``(roles, left)``: the rebinding roles that carry variant ``name``'s differences
    from the reference into vLLM, and the bundle fields no role carries."""
    import dataclasses

    from kvcontract.impl.variants import REFERENCE, VARIANTS
    from kvcontract.live.judge.rebinding import ROLE_OF_FIELD

    variant = VARIANTS[name]
    roles: list[str] = []
    left: list[str] = []
    for item in dataclasses.fields(REFERENCE):
        if item.name in ("name", "description", "violates"):
            continue
        if getattr(variant, item.name) is getattr(REFERENCE, item.name):
            continue
        role = ROLE_OF_FIELD.get(item.name)
        (roles.append(role) if role else left.append(item.name))
    return roles, left


__all__ = ["CRASH_MARKERS", "MAX_PREFILL_STEPS", "Finding", "JunctionJudgement",
           "MonitorOptions", "MonitorReport", "RuntimeMonitor", "StatesJudgement",
           "StoreHistory", "engine_theorem", "first_sparse_group", "geometry_of",
           "judge_states", "junction_scope", "reproducer_source", "spec_junction_of",
           "spec_store_step", "store_theorem", "variant_roles"]
