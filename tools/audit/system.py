"""Stateful scenarios on the bound code: the executable offloading system of issue 3.

The seed scenarios of ``kvcontract fuzz`` (the four historic defects as request
programs, plus the window bound) drive the tensor-backed system and its mocked twin
in lockstep, with the bound upstream functions as the system's implementation. The
system checks every decision against the spec as it goes (lookups, loads, stores, and
the bytes of every loaded position: C11). Each scenario becomes report rows: one per
clause it violated, or one ``C11`` row when it ran clean (evidence ``examples``: one
program, its step and check counts).

On upstream code the system's store path is upstream's own ``_build_store_jobs``,
executed (:func:`upstream_store_path`, the runner of :mod:`.store`, plugged in as
``SystemConfig.store_path``), never kvcontract's ``StoreTracker`` over a store horizon
no binding models: the system runs when every other function is bound and the builder
can run (:func:`cannot_run`). A scenario with a Mamba group is left out, named
(:func:`left_out`): upstream stores a Mamba state through the GPU's boundary hand-off,
not ``_build_store_jobs``, so the executed builder offers it nothing. The built-in
targets keep kvcontract's store path (their own functions).
"""

from __future__ import annotations

import ctypes
import gc
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvcontract.errors import KvContractError
from kvcontract.impl.scheduler import group_first_live_block
from kvcontract.tools.audit import store
from kvcontract.tools.audit.derived_spaces import LOOKAHEAD_NOTE
from kvcontract.tools.audit.roles import Binding, has_lookahead_hashes
from kvcontract.tools.audit.upstream_calls import UpstreamTimeout
from kvcontract.vocabulary import GroupKind, Impact, RequestStatus, Verdict

if TYPE_CHECKING:
    from kvcontract.impl.bundle import Implementation
    from kvcontract.impl.system.engine import GroupStorePath, StorePath
    from kvcontract.spec.geometry import Geometry, GroupSpec
    from kvcontract.tools.fuzz import Lockstep, Scenario

SYSTEM_PREFIX = "system["

SystemRunner = Callable[["Implementation", "Scenario", str], "Lockstep"]
"""``run(impl, scenario, device) -> Lockstep``: a scenario on the system."""

STORE_PATH_FIELDS = frozenset({
    "store_final_segment_end", "store_replay_boundaries", "is_block_reachable",
    "get_num_offloadable_tokens", "store_step_bounds", "store_chunk_offered"})
"""The bundle fields only kvcontract's ``StoreTracker`` reads: with upstream's store path
plugged in, the system needs none of them."""


UPSTREAM_VIA = "; its store path upstream's _build_store_jobs, executed"
"""What a scenario row's ``via`` adds on upstream code."""


# -- upstream's store path in the system ------------------------------------------------------
class _RequestSteps:
    """One request's :class:`~.store.UpstreamStorePath`, stepped once per system step: the
    system steps its groups in order with the same arguments, the builder serves every
    group at once, so the first group's step runs it and the others read its offers."""

    def __init__(self, path: store.UpstreamStorePath) -> None:
        self.path = path
        self.steps: list[tuple[tuple[str, int, int, int], list[list[int]]]] = []
        self.indices_before: list[list[int]] = []
        """Per step, every group's stored index before the builder ran."""

    def index(self, taken: int, group: int) -> int:
        """The group's stored index after its ``taken`` steps (the builder may have run
        its next step already, for an earlier group)."""
        if taken < len(self.steps):
            return self.indices_before[taken][group]
        return self.path.next_stored_chunk_idx(group)

    def offers(self, taken: int, args: tuple[str, int, int, int], group: int) -> list[int]:
        if taken == len(self.steps):
            self.indices_before.append([self.path.next_stored_chunk_idx(g) for g in
                                        range(len(self.path.geometry.groups))])
            self.steps.append((args, self.path.step(*args)))
        recorded, offers = self.steps[taken]
        if recorded != args:
            raise KvContractError(
                f"the system stepped group {group} with {args}, the builder ran with "
                f"{recorded}: one step's groups must share their arguments")
        return offers[group]


class _GroupView:
    """One group of a :class:`_RequestSteps`, as the system drives a store path
    (:class:`~kvcontract.impl.system.engine.GroupStorePath`)."""

    def __init__(self, steps: _RequestSteps, group: int) -> None:
        self._steps = steps
        self._group = group
        self._taken = 0
        self.offered: set[int] = set()

    @property
    def next_stored_chunk_idx(self) -> int:
        return self._steps.index(self._taken, self._group)

    def step(self, status: RequestStatus | str, num_computed: int, num_scheduled: int,
             num_tokens: int) -> list[int]:
        args = (RequestStatus(status).value, num_computed, num_scheduled, num_tokens)
        found = self._steps.offers(self._taken, args, self._group)
        self._taken += 1
        self.offered.update(found)
        return list(found)

    def mark_computed(self, num_chunks: int) -> None:
        self.offered.update(range(num_chunks))
        self._steps.path.mark_computed(self._group, num_chunks)


def upstream_store_path(binding: Binding) -> StorePath:
    """``SystemConfig.store_path`` of upstream's executed ``_build_store_jobs`` on
    ``binding`` (:func:`~.store.make_store_path`): the blocks freed below a group's
    window are the system's own (the bound retention, ``group_first_live_block``)."""
    new_path = store.make_store_path(binding)
    impl = binding.implementation
    assert impl is not None

    def store_path(geometry: Geometry, prompt_len: int,
                   prompt_only: bool) -> list[GroupStorePath]:
        def first_live(group: GroupSpec, num_computed: int) -> int:
            return group_first_live_block(impl, geometry, group, num_computed)

        steps = _RequestSteps(new_path(geometry, prompt_len, prompt_only=prompt_only,
                                       first_live=first_live))
        return [_GroupView(steps, g) for g in range(len(geometry.groups))]

    return store_path


def runner(binding: Binding) -> SystemRunner:
    """How the audit runs a scenario on ``binding``: with upstream's store path plugged
    in for upstream code, kvcontract's for a built-in target. On upstream code the
    monitors do not judge the lifecycle (C13-C15): kvcontract's system is not vLLM's
    scheduler (the lifecycle space's ``not_on_bound_code``; ``audit --live`` judges
    vLLM's own)."""
    from kvcontract.tools.fuzz import run_scenario

    if binding.target.kind == "builtin":
        return run_scenario
    plugged = upstream_store_path(binding)

    def run(impl: Implementation, scenario: Scenario, device: str) -> Lockstep:
        return run_scenario(impl, scenario, device, plugged, judge_lifecycle=False)

    return run


def cannot_run(binding: Binding) -> str | None:
    """Why the executable system cannot run on ``binding`` (None: it can): a function
    it reads is not bound, or upstream's store path cannot run."""
    reasons: list[str] = []
    if binding.target.kind == "builtin":
        reasons += binding.missing_fields.values()
    else:
        absent = store.missing(binding)
        if absent:
            reasons.append("its store path, upstream's _build_store_jobs, needs "
                           + ", ".join(absent))
        reasons += (r for f, r in binding.missing_fields.items()
                    if f not in STORE_PATH_FIELDS)
    if reasons:
        return "the executable system needs every function; " + "; ".join(
            sorted(set(reasons)))
    return None


def left_out(binding: Binding, scenario: Scenario) -> str | None:
    """Why ``scenario`` is not run on ``binding`` (None: it runs)."""
    if binding.target.kind != "builtin" and any(
            group.kind is GroupKind.MAMBA for group in scenario.geometry.groups):
        return store.MAMBA_NOTE
    if (binding.target.kind != "builtin" and scenario.geometry.hash_lookahead
            and not has_lookahead_hashes(binding)):
        return LOOKAHEAD_NOTE
    from kvcontract.tools.fuzz import exercises_junctions

    if binding.target.kind != "builtin" and exercises_junctions(scenario):
        # The bound store path takes no junction and no release's junction rule is bound:
        # the reference's would stand in for it, judging kvcontract, not the release
        # (elsewhere a junction is incidental: the store path is the release's).
        return store.JUNCTION_NOTE
    return None


def runnable(binding: Binding, scenarios: Sequence[Scenario]) -> list[Scenario]:
    """The ``scenarios`` that run on ``binding``, in order (:func:`left_out`)."""
    return [s for s in scenarios if left_out(binding, s) is None]


def unchecked(binding: Binding, scenarios: Sequence[Scenario]) -> list[dict[str, Any]]:
    """The plan's line for each scenario :func:`left_out` leaves out."""
    lines = []
    for scenario in scenarios:
        why = left_out(binding, scenario)
        if why is not None:
            lines.append({"clause": "C11", "theorem": f"{SYSTEM_PREFIX}{scenario.name}]",
                          "reason": why})
    return lines


def run_system_scenarios(binding: Binding, seed: int = 0,
                         scenarios: Sequence[Scenario] | None = None) -> list[dict[str, Any]]:
    """Report rows for every seed scenario, or for ``scenarios`` (those of given
    geometries: :func:`kvcontract.tools.fuzz.scoped_seed_scenarios`); runs in a sandbox
    child."""
    return [row for rows in scenario_rows(binding, seed, scenarios) for row in rows]


def scenario_rows(binding: Binding, seed: int = 0,
                  scenarios: Sequence[Scenario] | None = None) -> list[list[dict[str, Any]]]:
    """:func:`run_system_scenarios`, the rows of each scenario apart (one or more per
    scenario: the audit's ``--shard`` places each by its scenario's position)."""
    from kvcontract.tools.fuzz import seed_scenarios

    impl = binding.implementation
    assert impl is not None
    if scenarios is None:
        scenarios = runnable(binding, seed_scenarios(seed))
    run_scenario = runner(binding)
    rows: list[list[dict[str, Any]]] = []
    # What the child inherited (the binding, the catalogue, Z3) is never garbage here:
    # frozen, the collections below walk only what the scenarios allocate, and touch no
    # inherited page (a full collection in a forked child copies every page it walks).
    gc.freeze()
    try:
        for scenario in scenarios:
            rows.append(_scenario_rows(impl, scenario, run_scenario, binding))
            if binding.target.kind != "builtin":
                for row in rows[-1]:
                    row["via"] += UPSTREAM_VIA
            # The scenario's system (block pools of up to gigabytes on a 16k-token prompt
            # at 16 blocks per chunk) is garbage now: collect it before the next one
            # allocates its own, and hand the freed heap back, so the child's peak is one
            # scenario's, not two.
            gc.collect()
            _trim_heap()
    finally:
        gc.unfreeze()
    return rows


def _trim_heap() -> None:
    """Return freed heap pages to the system (glibc ``malloc_trim``; elsewhere a no-op)."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM: Any = None


def _stand_in_gap_of(exc: BaseException) -> str | None:
    """The stand-in gap behind a system crash, if any: a :class:`~.binding.StandInGap`
    (or one it was raised from) anywhere in the exception's chain."""
    from kvcontract.tools.audit.upstream_calls import StandInGap

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StandInGap):
            return f"{type(current).__name__}: {current}"
        current = current.__cause__ or current.__context__
    return None


def _scenario_rows(impl: Implementation, scenario: Scenario,
                   run_scenario: SystemRunner,
                   binding: Binding | None = None) -> list[dict[str, Any]]:
    """The rows of one scenario (its lockstep systems are dropped on return); with the
    ``binding``, each violated clause's root cause (:func:`scenario_root_cause`)."""
    rows: list[dict[str, Any]] = []
    name = f"{SYSTEM_PREFIX}{scenario.name}]"
    started = time.perf_counter()
    try:
        lockstep = run_scenario(impl, scenario, "cpu")
    except KvContractError as exc:
        rows.append(_row("C11", name, Verdict.UNKNOWN, started,
                         message=f"could not run: {exc}"))
        return rows
    except UpstreamTimeout as exc:  # a hang: says nothing about the code's verdict
        rows.append(_row("C11", name, Verdict.UNKNOWN, started,
                         message=f"{exc}: the per-call limit (CPU time, a hang "
                                 "detector); rerun with a larger --timeout if the call "
                                 "only needs more"))
        return rows
    except Exception as exc:  # a crash inside the bound code is a finding
        gap = _stand_in_gap_of(exc)
        if gap is not None:  # the tool's gap, not the code's defect (as every theorem)
            rows.append(_row("C11", name, Verdict.UNKNOWN, started,
                             message=f"could not run: {gap}"))
            return rows
        rows.append(_row("C11", name, Verdict.COUNTEREXAMPLE, started,
                         message=f"the system crashed: {type(exc).__name__}: {exc}",
                         impact=Impact.CRASH.value,
                         witness={"kind": "system", "scenario": scenario.name}))
        return rows
    checks = sum(lockstep.checks().values())
    domain = (f"scenario {scenario.name}: {lockstep.steps} steps, {checks} checks, mocked "
              "and tensor-backed managers in lockstep (one program, not exhaustive)")
    seen: dict[str, Any] = {}
    for finding in lockstep.findings:
        seen.setdefault(finding.clause, finding)
    if not seen:
        rows.append(_row("C11", name, Verdict.TESTED, started, domain=domain,
                         evidence="examples", examples=checks))
        return rows
    for clause, finding in sorted(seen.items(), key=lambda kv: int(kv[0][1:])):
        cause = (scenario_root_cause(binding, scenario, clause, run_scenario)
                 if binding is not None else None)
        rows.append(_row(
            clause, name, Verdict.COUNTEREXAMPLE, started, domain=domain,
            message=f"{finding.kind}: {finding.message}", impact=finding.impact.value,
            witness={"kind": "system", "scenario": scenario.name,
                     "program": list(finding.program)[-12:],
                     **{k: v for k, v in finding.witness.items()
                        if isinstance(v, (int, str, bool, list))}}))
        if cause is not None:
            rows[-1]["root_cause"] = cause
    return rows


def _clause_fields(clause: str) -> tuple[str, ...]:
    """The bundle fields a scenario's violation of ``clause`` can come from: the lookup's
    for C1-C6 (C1 judges the retention after a hit), the store path's for C7-C10, both
    for C11 and C12."""
    from kvcontract.proofs.uses import LOOKUP_FUNCTIONS, STORE_FUNCTIONS

    number = int(clause[1:])
    lookup = (*LOOKUP_FUNCTIONS, "get_num_skipped_tokens", "retained_block_range")
    if number <= 6:
        return lookup
    if number <= 10:
        return STORE_FUNCTIONS
    return (*lookup, *STORE_FUNCTIONS)


def _roles(binding: Binding, names: Sequence[str],
           field_role: Callable[[Binding, str], str | None]) -> list[str]:
    roles: list[str] = []
    for name in names:
        role = field_role(binding, name)
        if role and role not in roles:
            roles.append(role)
    return roles


def scenario_root_cause(binding: Binding, scenario: Scenario, clause: str,
                        run_scenario: SystemRunner) -> dict[str, Any] | None:
    """The smallest replacement of the bound code by the reference under which the
    scenario no longer violates ``clause`` (:mod:`kvcontract.tools.audit.root_cause`):
    an upstream function replaced in its own signature first, then one adapted field.
    One rerun of the scenario per candidate (at most 2 + 45), in a fixed order; None if
    none removes it
    (the row then has no root cause and its defect is reported unattributed)."""
    import dataclasses
    import itertools

    from kvcontract.impl.variants import REFERENCE
    from kvcontract.tools.audit import root_cause
    from kvcontract.tools.audit.roles import FIELD_ROLES

    def still_fails(candidate: Implementation, run: SystemRunner = run_scenario) -> bool:
        try:
            lockstep = run(candidate, scenario, "cpu")
        except Exception:
            return True
        return any(f.clause == clause for f in lockstep.findings)

    upstream = binding.target.kind != "builtin"
    if upstream:
        for role in root_cause.REFERENCE_ROLES:
            if role in binding.functions:
                rebinding = root_cause.rebind(binding, [role])
                rebound = rebinding.implementation
                # Upstream's store path rebuilt over the replaced function too.
                if rebound is not None and cannot_run(rebinding) is None and \
                        not still_fails(rebound, runner(rebinding)):
                    return root_cause.describe(binding, [role], "rebound")
    impl = binding.implementation
    assert impl is not None
    # One field of the clause's side, then a pair (an unaligned boundary needs both the
    # load window and the scanner's initial window), in a fixed order: a counted budget.
    # With upstream's store path plugged in, the fields only StoreTracker reads decide
    # nothing: they are not candidates.
    side = [f for f in FIELD_ROLES if f in _clause_fields(clause)
            and f not in binding.missing_fields
            and not (upstream and f in STORE_PATH_FIELDS)]
    for size in (1, 2):
        for names in itertools.combinations(side, size):
            patched = dataclasses.replace(impl, **{n: getattr(REFERENCE, n) for n in names})
            if not still_fails(patched):
                return root_cause.describe(
                    binding, _roles(binding, names, root_cause.field_role), "field",
                    list(names))
    return None


SHARDS_PER_WORKER = 3
"""Shards of the scoped scenarios per worker (:func:`shards`)."""


def program_weight(scenario: Scenario) -> int:
    """About what a scenario costs: the tokens its requests send, plus one per operation."""
    return sum(len(op[2]) if op[0] == "add_request" and len(op) > 2
               and isinstance(op[2], list) else 1 for op in scenario.program)


def shards(scenarios: Sequence[Scenario], workers: int) -> list[list[Scenario]]:
    """``scenarios`` cut into consecutive runs of about equal :func:`program_weight`
    (in order, so the rows keep theirs), :data:`SHARDS_PER_WORKER` per worker: each is a
    sandbox job of its own, so the scenarios of many geometries spread over the workers
    next to the theorem families instead of holding one worker for the whole audit.
    Which scenarios run, and how, does not change."""
    weights = [program_weight(s) for s in scenarios]
    count = max(1, min(len(scenarios), SHARDS_PER_WORKER * max(1, workers)))
    target = sum(weights) / count
    found: list[list[Scenario]] = [[]]
    filled = 0
    for scenario, weight in zip(scenarios, weights, strict=True):
        if found[-1] and filled >= target * len(found) and len(found) < count:
            found.append([])
        found[-1].append(scenario)
        filled += weight
    return found


def _row(clause: str, name: str, verdict: Verdict, started: float, *, domain: str = "",
         message: str = "", witness: dict[str, Any] | None = None, evidence: str | None = None,
         examples: int = 0, impact: str | None = None) -> dict[str, Any]:
    return {
        "clause": clause, "theorem": name, "verdict": verdict.value, "domain": domain,
        "impact": impact,
        "seconds": round(time.perf_counter() - started, 4), "witness": witness,
        "message": message, "description": "a seed scenario of the executable system",
        "evidence": evidence, "examples": examples,
        "via": "the executable offloading system (mocked and tensor-backed) over the bound "
               "functions",
    }
