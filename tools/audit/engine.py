"""The clause checks of an audit: the prover's catalogue, run on bound upstream code.

For every theorem whose functions are bound (:mod:`.binding`), in a sandbox child:

* a formula property (:class:`~kvcontract.spec.properties.FormulaProperty`) is first
  decided by Z3 (:func:`kvcontract.proofs.theorem.prove_formula`), lifting the
  upstream code over symbolic integers (evidence ``proved``). Upstream code that cannot
  be lifted (a block mask builds a list over a symbolic range) is searched concretely
  instead: Z3 picks admissible cases of every configuration (cases a random search
  hardly ever hits, e.g. a chunk inside a boundary's demanded range), then Hypothesis
  draws more and shrinks any failure (evidence ``examples``, with the count);
* a case property (:class:`~kvcontract.spec.properties.CaseProperty`) enumerates its
  space in
  increasing size within a budget of cases (evidence ``exhausted``, or ``examples``
  when the budget ends first); scanner theorems also get a Hypothesis search over longer
  sequences.

A failure is a minimal witness re-executed on the upstream code, blamed on the bound
function whose replacement by the reference makes it disappear (its file:line becomes
the report's location). A call that raises, hangs or returns garbage is such a failure,
except where the exception is the tool's gap (:func:`~.binding.stand_in_gap`: upstream
read what a kvcontract stand-in lacks, or kvcontract called upstream in a convention it
does not take): that theorem is UNKNOWN, naming the missing piece, never a crash finding
(:func:`_undecided`). A hang (a CPU-time limit) is UNKNOWN likewise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from kvcontract.errors import UsageError
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.variants import REFERENCE
from kvcontract.live.judge.lookups import NotRealized
from kvcontract.proofs.runner import Scope, catalog
from kvcontract.proofs.shards import Shard, partition, selection_digest, shard_section
from kvcontract.proofs.theorem import SymbolicEnv, run_property
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.spec.clauses import CLAUSES, CatalogueError, get_clause
from kvcontract.spec.properties import CaseProperty, Config, FormulaProperty, Property
from kvcontract.spec.properties.base import (
    HYPOTHESES_ONLY,
    Family,
    Observer,
    latent_reason,
    raised,
)
from kvcontract.tools.audit.derived_spaces import engine_family, stand_in_family
from kvcontract.tools.audit.lookup import UPSTREAM_LOOKUP as _UPSTREAM_LOOP_PREFIX
from kvcontract.tools.audit.recheck import (
    ALL_FIELDS,
    KVCONTRACT_ONLY_FIELDS,
    _admissible,
    _fails,
    _undecided,
    _violation,
    theorem_fields,
)
from kvcontract.tools.audit.roles import Binding
from kvcontract.tools.audit.sandbox import Outcome, run_jobs
from kvcontract.tools.audit.upstream_calls import StandInGap, UpstreamError, UpstreamTimeout
from kvcontract.tools.hypothesis_runs import deterministic_hypothesis
from kvcontract.vocabulary import Impact

UPSTREAM_LOOKUP = _UPSTREAM_LOOP_PREFIX
VIA_UPSTREAM_LOOKUP = "upstream's _lookup_complete_chunks, driven through stand-ins"
VIA_UPSTREAM_STORE = "upstream's _build_store_jobs, driven through stand-ins"
VIA_UPSTREAM_END_TO_END = ("upstream's _build_store_jobs, then upstream's "
                           "_lookup_complete_chunks, driven through stand-ins")


def theorems_for(binding: Binding, scope: Scope = ()) -> list[Property]:
    """The prover's catalogue, plus the theorems over upstream's own multi-group loop,
    store path and both composed (C12; :mod:`.store`); with a ``scope``
    (``--model``/``--geometry``), all on those geometries
    (:mod:`kvcontract.spec.properties.scoped`: upstream's code observes the scoped
    spaces' cases)."""
    from kvcontract.tools.audit.lookup import upstream_lookup_theorems
    from kvcontract.tools.audit.store import (
        upstream_end_to_end_theorems,
        upstream_store_theorems,
    )

    theorems = catalog(scope)
    _check_observers(theorems)
    # Each upstream adapter keeps the properties that declare it can observe them
    # (``observable_on``: lookup.upstream_loop_properties, store.store_path_properties,
    # store.end_to_end_path_properties).
    lookups = [t for t in theorems if isinstance(t, CaseProperty) and t.family == Family.LOOKUP]
    stores = [t for t in theorems if isinstance(t, CaseProperty) and t.family == Family.STORE]
    ends = [t for t in theorems
            if isinstance(t, CaseProperty) and t.family == Family.END_TO_END]
    if binding.engine is not None:
        # vLLM's own engine observes upstream's code (on_engine): the same theorem ids.
        from kvcontract.tools.audit.on_engine import engine_theorems

        return [*theorems, *engine_theorems(binding.engine, lookups, stores, ends)]
    return [*theorems, *upstream_lookup_theorems(binding, lookups if scope else None),
            *upstream_store_theorems(binding, stores if scope else None),
            *upstream_end_to_end_theorems(binding, ends if scope else None)]


AUDIT_OBSERVERS = (Observer.UPSTREAM_LOOP, Observer.UPSTREAM_STORE_PATH)
"""The observers the audit runs (:mod:`.lookup`, :mod:`.store`, :mod:`.on_engine`): each
observes the families of ``Observer.families``."""


def _check_observers(theorems: Iterable[Property]) -> None:
    """A property that declares an upstream observer the audit cannot run it on is the
    catalogue's error, named here (never silently left out of the audit)."""
    for theorem in theorems:
        if not isinstance(theorem, CaseProperty):
            continue
        for observer in AUDIT_OBSERVERS:
            families = observer.families
            if observer in theorem.observable_on and theorem.family not in families:
                raise CatalogueError(
                    f"property {theorem.theorem_id} declares {observer.value} but is of the "
                    f"{theorem.family} family; the audit observes upstream's code for "
                    f"{', '.join(sorted(families))} cases only")
        if Observer.UPSTREAM_LOOP in theorem.observable_on and theorem.family == Family.LOOKUP \
                and not theorem.name.startswith("lookup-"):
            raise CatalogueError(
                f"property {theorem.theorem_id} declares upstream-loop: name it lookup-... "
                f"(the audit's theorem on upstream's loop is {UPSTREAM_LOOKUP}..., the name "
                "the root cause and the reports recognise)")


def is_spec_only(theorem: Property) -> bool:
    """The sequence theorems prove the spec's scanner; they never call the implementation."""
    name: str = theorem.name
    return name.startswith("spec-")


def is_kvcontract_only(theorem: Property, binding: Binding) -> bool:
    """A formula theorem about kvcontract's own step functions (it calls a field of
    :data:`KVCONTRACT_ONLY_FIELDS`): on upstream code it would prove the reference's step,
    not upstream's, so it is not run (like the spec-only theorems); on a built-in or
    registered implementation, which has every field, it is."""
    if binding.target.kind == "builtin" or isinstance(theorem, CaseProperty):
        return False
    return any(f in KVCONTRACT_ONLY_FIELDS for f in theorem.uses)


@dataclass
class AuditOptions:
    """Knobs of one audit (the CLI's ``--clause``, ``--timeout``, ``--jobs``...)."""

    clauses: Sequence[str] | None = None
    call_timeout: float = 10.0
    """Seconds of CPU time one upstream call may use (a hang becomes UNKNOWN for that
    case's theorem, never a finding)."""
    theorem_timeout: float = 1800.0
    """Seconds of CPU time one theorem's child process may use before it is killed."""
    budget: int = 250_000
    """Cases of concrete search per theorem (a family's shared pass counts each case
    once; Z3-chosen and Hypothesis cases count too). A count, never seconds: the same
    audit finds the same things on any machine, however loaded."""
    examples: int = 300
    """Hypothesis examples per concretely searched theorem."""
    jobs: int | None = None
    seed: int = 0
    geometries: Scope = ()
    """``(label, geometry)`` pairs to check on instead of the catalogue's own
    (``--model``/``--geometry``; :func:`theorems_for`)."""
    shard: Shard | None = None
    """``--shard I/N``: check only this shard's units of work (:func:`work_units`)."""
    judge_mode: str = "auto"
    """``--judge``: ``auto``, ``engine`` or ``stand-ins``
    (:data:`kvcontract.tools.audit.on_engine.MODES`)."""


@dataclass
class AuditRun:
    """Rows (one per checked theorem), the theorems that could not be checked, timing."""

    rows: list[dict[str, Any]]
    unchecked: list[dict[str, Any]]
    seconds: float
    notes: list[str] = field(default_factory=list)
    shard: dict[str, Any] | None = None
    """``--shard I/N``: the report's ``shard`` object (:func:`kvcontract.proofs.shards.
    shard_section`) with ``row_keys``, each row's place in the unsharded order (what
    ``kvcontract merge`` sorts by)."""


# -- planning -----------------------------------------------------------------------------
def _wanted(options: AuditOptions) -> set[str] | None:
    return {get_clause(c).id for c in options.clauses} if options.clauses else None


def _runs_system(binding: Binding, options: AuditOptions) -> bool:
    """The seed scenarios run for a full audit or when C11 is asked for."""
    wanted = _wanted(options)
    return wanted is None or "C11" in wanted


def plan(binding: Binding, options: AuditOptions) -> tuple[list[int], list[dict[str, Any]]]:
    """Catalogue indices to run, and a line for every theorem that cannot run."""
    wanted = _wanted(options)
    indices: list[int] = []
    unchecked: list[dict[str, Any]] = []
    if binding.target.kind != "builtin" and binding.engine is None:
        from kvcontract.tools.audit.lookup import (
            missing_roles,
            upstream_loop_name,
            upstream_loop_properties,
        )

        absent = missing_roles(binding)
        for prop in upstream_loop_properties():
            if absent and (wanted is None or prop.clause in wanted):
                unchecked.append({
                    "clause": prop.clause, "theorem": upstream_loop_name(prop.name),
                    "reason": "upstream's multi-group lookup needs " + ", ".join(
                        _role_names(binding, absent)),
                })
        from kvcontract.tools.audit.store import unchecked as store_unchecked

        unchecked += store_unchecked(binding, wanted)
    for index, theorem in enumerate(theorems_for(binding, options.geometries)):
        if wanted is not None and theorem.clause not in wanted:
            continue
        if is_spec_only(theorem) or is_kvcontract_only(theorem, binding):
            continue
        not_on_bound = getattr(getattr(theorem, "space", None), "not_on_bound_code", "")
        if binding.target.kind != "builtin" and not_on_bound:
            unchecked.append({"clause": theorem.clause, "theorem": theorem.name,
                              "reason": not_on_bound})
            continue
        missing = [f for f in theorem_fields(theorem) if f in binding.missing_fields]
        reasons = sorted({binding.missing_fields[f] for f in missing})
        if getattr(theorem, "reads_gpu_retention", False) and \
                "get_num_skipped_tokens" in binding.missing_fields:
            missing.append("get_num_skipped_tokens")
            reasons.append(GPU_RETENTION_NOTE + binding.missing_fields["get_num_skipped_tokens"])
        if missing:
            unchecked.append({
                "clause": theorem.clause, "theorem": theorem.name,
                "reason": "; ".join(reasons),
            })
            continue
        indices.append(index)
    if _runs_system(binding, options):
        from kvcontract.tools.audit import system

        why = system.cannot_run(binding)
        if why is not None:
            unchecked.append({"clause": "C11", "theorem": "system[seed scenarios]",
                              "reason": why})
        else:
            unchecked += system.unchecked(binding, _all_scenarios(options))
    return indices, unchecked





GPU_RETENTION_NOTE = ("the GPU manager's retention is not bound (the spec's own retention "
                      "would be presented as upstream's): ")


def _role_names(binding: Binding, roles: list[str]) -> list[str]:
    from kvcontract.tools.audit.roles import ROLE_BY_NAME

    return [ROLE_BY_NAME[r].qualnames[0] + " (missing)" for r in roles]


# -- concrete search for Z3 theorems ---------------------------------------------------------
def _gap_message(exc: BaseException) -> str:
    if isinstance(exc, UpstreamTimeout):
        return _timeout_message(exc)
    return (f"not decided, the audit's gap rather than the code's: {exc}; the live backend "
            "(real vLLM objects) answers instead")


def _timeout_message(exc: UpstreamTimeout) -> str:
    return (f"{exc}: the audit's per-call limit, so this says nothing about the code (a "
            "hang, or a call slower than --timeout); rerun with a larger --timeout")


def _latent(theorem: FormulaProperty, values: Mapping[str, int]) -> bool:
    """Whether ``values`` (a witness, or a configuration's fixed sizes) describe a
    geometry vLLM does not build; sizes alone decide it for the store masks."""
    if theorem.geometry is None:
        return False
    probe = {"sw": 2, "e": 0, **values}
    return latent_reason(theorem.geometry_of(probe)) is not None


def _z3_models(theorem: FormulaProperty, config: Config, bound: int, count: int,
               seed: int) -> list[dict[str, int]]:
    """Up to ``count`` admissible assignments of the free variables, values <= bound."""
    variables = [z3.Int(name) for name in theorem.variables]
    env = SymbolicEnv({**config.values, **{str(v): v for v in variables}})
    try:
        hyps, _ = theorem.statement(env, HYPOTHESES_ONLY)
    except Exception:
        return []
    if any(h is False for h in hyps):
        return []
    solver = z3.Solver()
    solver.set("random_seed", seed)
    # A resource count, never seconds: the cases chosen do not depend on machine load.
    solver.set("rlimit", MODEL_RLIMIT)
    solver.add(*[h for h in hyps if isinstance(h, z3.BoolRef)])
    solver.add(*[z3.And(v >= 0, v <= bound) for v in variables])
    models: list[dict[str, int]] = []
    while len(models) < count and solver.check() == z3.sat:
        model = solver.model()
        values = {str(v): model.eval(v, model_completion=True).as_long() for v in variables}
        models.append({**config.values, **values})
        solver.add(z3.Or(*[v != values[str(v)] for v in variables]))
    return models


MODEL_RLIMIT = 20_000_000
"""Z3 resources per admissible-case query of the concrete search (deterministic)."""

SHRINK_STEPS = 2_000
"""Trials of the greedy shrinker (a count, so the witness does not depend on load)."""


def _shrink(theorem: FormulaProperty, impl: Implementation, values: dict[str, int],
            max_steps: int) -> dict[str, int]:
    """Greedy: lower each free variable while the case stays admissible and failing."""
    current = dict(values)
    improved = True
    steps = 0
    while improved and steps < max_steps:
        improved = False
        steps += 1
        for name in theorem.variables:
            for candidate in (0, current[name] // 2, current[name] - 1):
                if candidate < 0 or candidate >= current[name]:
                    continue
                trial = {**current, name: candidate}
                if _admissible(theorem, trial) and _violation(theorem, impl, trial):
                    current = trial
                    improved = True
                    break
    return current


def _hypothesis_search(theorem: FormulaProperty, impl: Implementation, configs: list[Config],
                       examples: int, seed: int) -> tuple[int, dict[str, int] | None]:
    """Hypothesis over configurations and free variables; a shrunk failure, if any."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    if examples < 1:
        return 0, None
    admissible = [0]
    failing: list[dict[str, int]] = []
    timed_out: list[UpstreamTimeout] = []
    variables = st.fixed_dictionaries(
        {name: st.one_of(st.integers(0, 24), st.integers(0, 2048)) for name in theorem.variables})

    @settings(max_examples=examples, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(st.sampled_from(configs), variables)
    def probe(config: Config, free: dict[str, int]) -> None:
        values = {**config.values, **free}
        if not _admissible(theorem, values):
            return
        admissible[0] += 1
        try:
            violated = _violation(theorem, impl, values)
        except UpstreamTimeout as exc:
            # A call past the per-call limit decides the theorem (UNKNOWN): stop the
            # search at once instead of shrinking case after case.
            timed_out.append(exc)
            raise _SearchStopped() from None
        if violated:
            failing.append(values)
            raise AssertionError("violated")

    with contextlib.suppress(AssertionError, _SearchStopped), deterministic_hypothesis():
        probe()
    if timed_out:
        raise timed_out[0]
    return admissible[0], (failing[-1] if failing else None)


class _SearchStopped(BaseException):
    """Ends a Hypothesis search at once (not an ``Exception``: Hypothesis neither
    counts it as a failure nor shrinks it)."""


def _concrete_z3_theorem(theorem: FormulaProperty, impl: Implementation, options: AuditOptions,
                         why: str) -> TheoremResult:
    started = time.perf_counter()
    result = TheoremResult(clause=theorem.clause, theorem=theorem.name,
                           verdict=Verdict.PROVED_FOR_DOMAIN, domain="", seconds=0.0,
                           description=theorem.description)
    try:
        return _concrete_search(theorem, impl, options, why, result, started)
    except (UpstreamTimeout, StandInGap) as exc:
        result.verdict = Verdict.UNKNOWN
        result.message = _gap_message(exc)
        result.domain = theorem.domain
        result.seconds = time.perf_counter() - started
        return result


def _concrete_search(theorem: FormulaProperty, impl: Implementation, options: AuditOptions,
                     why: str, result: TheoremResult, started: float) -> TheoremResult:
    configs = theorem.configs()
    # Smallest configurations first, so the first failure is a small witness.
    order = sorted(configs, key=lambda c: (sum(abs(v) for v in c.values.values()), c.label))
    checked = 0
    found: dict[str, int] | None = None
    # A failure on a geometry vLLM does not build is kept aside (the first one) while the
    # search goes on for one vLLM builds; it is reported (impact latent) only without.
    latent: dict[str, int] | None = None
    # Z3-chosen admissible cases: one per configuration and round, small values first.
    for round_index, bound in enumerate((16, 16, 256, 4096)):
        for config in order:
            if checked >= options.budget or found is not None:
                break
            if latent is not None and _latent(theorem, config.values):
                continue  # this configuration's geometry is already known to be latent
            for values in _z3_models(theorem, config, bound, 1 + round_index,
                                     options.seed + round_index):
                checked += 1
                if _violation(theorem, impl, values):
                    if not _latent(theorem, values):
                        found = values
                        break
                    latent = latent or values
    z3_cases = checked
    hypothesis_cases = 0
    if found is None and checked < options.budget:
        buildable_configs = [c for c in configs if not _latent(theorem, c.values)]
        hypothesis_cases, found = _hypothesis_search(
            theorem, impl, buildable_configs or configs, options.examples, options.seed)
        checked += hypothesis_cases
        if found is not None and _latent(theorem, found):
            latent, found = latent or found, None
    result.queries = checked
    result.details.append(f"symbolic lifting not possible ({why}); searched concretely")
    found = found or latent
    if found is not None:
        found = _shrink(theorem, impl, found, max_steps=SHRINK_STEPS)
        graded = theorem.grade(found, _violation(theorem, impl, found)
                               or "failure did not replay")
        result.verdict = Verdict.COUNTEREXAMPLE
        result.witness = {"kind": "arith", "theorem": theorem.theorem_id, "values": found}
        result.message = graded.message
        result.impact = graded.impact.value
        result.latent = graded.latent
        result.domain = theorem.domain
    else:
        result.domain = (f"tested, not proved: {z3_cases} Z3-chosen admissible cases over "
                         f"the configurations of {theorem.domain}, plus {hypothesis_cases} "
                         "admissible Hypothesis examples")
    result.seconds = time.perf_counter() - started
    return result


# -- exhaustive theorems within a budget ---------------------------------------------------
def _scan_hypothesis(theorem: CaseProperty, impl: Implementation, examples: int) -> tuple[
        int, Any]:
    """Longer lookup-state sequences (7 to 14 keys) than the exhaustive domain."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from kvcontract.spec.properties.scan import ALL_STATES, ScanCase

    if examples < 1:
        return 0, None
    failing: list[Any] = []
    count = [0]

    @settings(max_examples=examples, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(st.lists(st.sampled_from(ALL_STATES), min_size=7, max_size=14),
           st.integers(1, 4), st.booleans())
    def probe(states: list[Any], window: int, wider: bool) -> None:
        case = ScanCase(tuple(states), window + int(wider), window)
        count[0] += 1
        try:
            violation = theorem.check(case, impl)
        except Exception as exc:
            # A stand-in gap decides nothing: not a failure of the longer sequence.
            violation = None if _undecided(exc) is not None else raised(exc)
        if violation is not None:
            failing.append(case)
            raise AssertionError(violation)

    with contextlib.suppress(AssertionError), deterministic_hypothesis():
        probe()
    return count[0], (failing[-1] if failing else None)


def _family(theorems: Sequence[CaseProperty], impl: Implementation,
            options: AuditOptions) -> list[tuple[TheoremResult, Any]]:
    """One budgeted pass over the cases the theorems share (smallest first).

    Theorems of one family enumerate the same cases, and the per-case memos of the
    catalogue compute the implementation's answer and the spec's once per case, so a
    family pass costs little more than one theorem. Each theorem stops at its first
    violation (the minimal witness); the budget is the per-theorem budget times the
    family size. Scanner theorems then also get a Hypothesis search over longer sequences.
    The budget counts cases (``options.budget`` per family pass), never seconds.
    """
    return _families([theorems], impl, options)[0]


@dataclass
class _Pass:
    """One family's state in a shared pass (:func:`_families`)."""

    theorems: Sequence[CaseProperty]
    accepts: Callable[[Any], bool] | None
    """Which of the shared cases are this family's (None: all of them)."""
    results: list[TheoremResult]
    open_: list[int]
    witnesses: list[Any] = field(default_factory=list)
    latent: list[Any] = field(default_factory=list)
    """A theorem's first violation on a geometry vLLM does not build (the search goes on)."""
    counts: list[int] = field(default_factory=list)
    spent: list[float] = field(default_factory=list)
    seen: int = 0
    complete: bool = True
    done: bool = False


def _shared_cases(groups: Sequence[Sequence[CaseProperty]]) -> tuple[
        Callable[[], Iterable[Any]], list[Callable[[Any], bool] | None]]:
    """The case source of a shared pass and, per family, which of its cases are the
    family's. One family: its own space. Several: the first family's space, and each
    other family's space must be a filter of it (:func:`kvcontract.tools.audit.derived_spaces.
    shared_cases`), so every family meets its own cases in its own order."""
    from kvcontract.tools.audit.derived_spaces import shared_cases

    base = groups[0][0].space
    accepts: list[Callable[[Any], bool] | None] = [None]
    for group in groups[1:]:
        shared = shared_cases(group[0].space)
        if shared is None or shared[0] is not base:
            raise ValueError(f"family {group[0].space.family} does not share the cases of "
                             f"{base.family}")
        accepts.append(shared[1])
    return base.cases, accepts


def _families(groups: Sequence[Sequence[CaseProperty]], impl: Implementation,
              options: AuditOptions) -> list[list[tuple[TheoremResult, Any]]]:
    """:func:`_family` of each group of theorems, in one walk over their shared cases.

    The store family and upstream's (and C12's two, and the lookup's two) enumerate the
    same cases, upstream's store and C12 less the Mamba geometries; walked together, a
    case's per-case memos (the spec's run of a producer, its demand, the contract's
    answer) are computed once for both. Each family keeps its own
    count of cases, budget and early stop, exactly as in a pass of its own: it sees its
    cases in the same order and stops at the same one."""
    impl = _memoized(impl)
    cases, accepts = _shared_cases(groups)
    passes = [_Pass(
        theorems=group, accepts=accept,
        results=[TheoremResult(clause=t.clause, theorem=t.name,
                               verdict=Verdict.PROVED_FOR_DOMAIN, domain=t.domain,
                               seconds=0.0, description=t.description) for t in group],
        open_=list(range(len(group))), witnesses=[None] * len(group),
        latent=[None] * len(group), counts=[0] * len(group), spent=[0.0] * len(group))
        for group, accept in zip(groups, accepts, strict=True)]
    for case in cases():
        live = False
        for state in passes:
            if state.done:
                continue
            live = True
            if state.accepts is not None and not state.accepts(case):
                continue
            if not state.open_:
                state.done = True
                continue
            if state.seen >= options.budget:
                state.complete = False
                state.done = True
                continue
            state.seen += 1
            _check_case(state, case, impl)
        if not live:
            break
    return [_finish_pass(state, impl, options) for state in passes]


def _check_case(state: _Pass, case: Any, impl: Implementation) -> None:
    """Every open theorem of one family on one case."""
    clock = time.perf_counter
    results, witnesses, latent = state.results, state.witnesses, state.latent
    for j in tuple(state.open_):
        theorem = state.theorems[j]
        begun = clock()
        try:
            violation = theorem.check(case, impl)
        except NotRealized:
            # vLLM's engine cannot put a request in this case's situation: the case says
            # nothing about vLLM (counted in the row's engine section), never a verdict.
            continue
        except Exception as exc:
            undecided = _undecided(exc)
            if undecided is None:
                violation = raised(exc)
            else:
                # A CPU-time limit, or a stand-in that lacks what upstream reads, decides
                # nothing about the code: the theorem is UNKNOWN, naming why (never a
                # crash finding that machine load or kvcontract's stand-ins produced).
                if witnesses[j] is None or latent[j] is not None:
                    results[j].verdict = Verdict.UNKNOWN
                    results[j].message = _gap_message(undecided)
                    results[j].witness = {"kind": "exhaustive",
                                          "theorem": theorem.theorem_id,
                                          **theorem.space.to_json(case)}
                    results[j].impact = results[j].latent = None
                    witnesses[j] = case
                state.open_.remove(j)
                continue
        state.spent[j] += clock() - begun
        state.counts[j] += 1
        if violation is None:
            continue
        graded = theorem.grade(case, violation)
        if graded.latent is not None and latent[j] is not None:
            continue  # keep the first latent finding; search on for a buildable one
        results[j].verdict = Verdict.COUNTEREXAMPLE
        results[j].witness = {"kind": "exhaustive", "theorem": theorem.theorem_id,
                              **theorem.space.to_json(case)}
        results[j].message = graded.message
        results[j].impact = graded.impact.value
        results[j].latent = graded.latent
        witnesses[j] = case
        if graded.latent is None:
            state.open_.remove(j)
        else:
            latent[j] = case


def _finish_pass(state: _Pass, impl: Implementation,
                 options: AuditOptions) -> list[tuple[TheoremResult, Any]]:
    """The results of one family's pass (scanner theorems: the longer sequences too)."""
    clock = time.perf_counter
    witnesses, counts, spent = state.witnesses, state.counts, state.spent
    complete = state.complete
    out = []
    for j, theorem in enumerate(state.theorems):
        result = state.results[j]
        extra = 0
        if witnesses[j] is None and theorem.name.startswith("scan-"):
            begun = clock()
            extra, longer = _scan_hypothesis(theorem, impl, options.examples)
            spent[j] += clock() - begun
            if longer is not None:
                witnesses[j] = longer
                result.verdict = Verdict.COUNTEREXAMPLE
                result.witness = {"kind": "exhaustive", "theorem": theorem.theorem_id,
                                  **theorem.space.to_json(longer)}
                try:
                    result.message = theorem.check(longer, impl) or ""
                except Exception as exc:
                    result.message = f"the implementation raised {type(exc).__name__}: {exc}"
                result.impact = theorem.impact_of(result.message).value
        result.queries = counts[j] + extra
        if witnesses[j] is None:
            if complete:
                result.domain = f"{theorem.domain} ({counts[j]} cases, exhaustive)" + (
                    f" + {extra} Hypothesis sequences of 7-14 keys" if extra else "")
            else:
                result.domain = (f"tested, not exhausted: the first {counts[j]} cases "
                                 f"(smallest first) of {theorem.domain}; budget "
                                 f"{options.budget} cases")
        result.seconds = spent[j]
        out.append((result, witnesses[j]))
    return out


MEMO_ENTRIES = 1 << 17
"""Distinct calls remembered per implementation function during one family pass (a
count, so what a pass computes never depends on the machine)."""

_PLAIN = frozenset({int, bool, str, type(None)})
_IN_TUPLE = frozenset({int, str, type(None)})


def _key(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The memo key of plain arguments (ints, bools, strs, None, tuples of ints, strs or
    None: hashable, compared by value, immutable, never a Z3 term, whose ``==`` builds a
    formula), else None. The top-level types are part of the key: ``True == 1`` and both
    hash alike, but a body may tell them apart."""
    for arg in args:
        kind = type(arg)
        if kind is tuple:
            for item in arg:
                if type(item) not in _IN_TUPLE:
                    return None
        elif kind not in _PLAIN:
            return None
    return (args, tuple(map(type, args)))


def _plain(value: Any) -> bool:
    """Whether a result is plain (an int, bool, str, None or a tuple of them)."""
    kind = type(value)
    if kind is tuple:
        return all(type(v) in _PLAIN for v in value)
    return kind in _PLAIN


def _remembered(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its plain results remembered by plain positional arguments.

    A family pass calls the implementation with the same arguments over and over (a
    chunk's block mask at the same horizon in every schedule of a prompt, at every abort
    cut, with ``offload_prompt_only`` both ways: nine calls in ten on the scoped store
    family). The bound functions are pure (upstream bodies over fresh stand-ins, or the
    reference), so a repeated call returns what the first one returned: remembering it
    changes no observation. A call that raises is not remembered (it raises again); a
    result that is not plain (a list, a Z3 term) and a call with keyword or non-plain
    arguments go to ``fn`` every time."""
    cache: dict[tuple[Any, ...], Any] = {}

    def call(*args: Any, **kwargs: Any) -> Any:
        key = None if kwargs else _key(args)
        if key is None:
            return fn(*args, **kwargs)
        try:
            return cache[key]
        except KeyError:
            pass
        value = fn(*args)
        if _plain(value):
            if len(cache) >= MEMO_ENTRIES:
                cache.clear()  # bounded memory; a cleared entry is just recomputed
            cache[key] = value
        return value

    return call


def _memoized(impl: Implementation) -> Implementation:
    """``impl`` with every function remembered (:func:`_remembered`) for one family
    pass; blame and reproducers use the plain bound implementation."""
    remembered: dict[str, Any] = {name: _remembered(getattr(impl, name))
                                  for name in ALL_FIELDS if callable(getattr(impl, name))}
    return dataclasses.replace(impl, **remembered)


def _exhaustive(theorem: CaseProperty, impl: Implementation,
                options: AuditOptions) -> tuple[TheoremResult, Any]:
    return _family([theorem], impl, options)[0]


# -- blame --------------------------------------------------------------------------------------
def blame(theorem: Property, impl: Implementation, witness: Any) -> list[str]:
    """The bound fields whose replacement by the reference makes the witness pass."""
    culprits = []
    for name in theorem_fields(theorem):
        patched = dataclasses.replace(impl, **{name: getattr(REFERENCE, name)})
        try:
            if not _fails(theorem, patched, witness):
                culprits.append(name)
        except Exception:
            continue
    return culprits


# -- one theorem, in the child ------------------------------------------------------------------
def _decide(theorem: Property, impl: Implementation,
            options: AuditOptions) -> tuple[TheoremResult, str, Any]:
    """Verdict, evidence and the witness case of one non-family theorem."""
    if not isinstance(theorem, FormulaProperty):
        result, witness_case = _exhaustive(theorem, impl, options)
        return result, _exhaustive_evidence(result), witness_case
    evidence = "proved"
    why = ""
    try:
        result = run_property(theorem, impl)
        if result.verdict is Verdict.UNKNOWN and "could not be lifted" in result.message:
            why = result.message.split(": ", 1)[-1]
    except UpstreamError as exc:
        why = f"a symbolic call failed: {exc}"
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
    if why:
        result = _concrete_z3_theorem(theorem, impl, options, why)
        evidence = "examples"
    elif result.verdict is Verdict.PROVED_FOR_DOMAIN:
        evidence = "proved for domain"
    witness_case = dict(result.witness["values"]) if result.witness is not None else None
    return result, evidence, witness_case


def _exhaustive_evidence(result: TheoremResult) -> str:
    return "exhausted" if result.domain.endswith(("exhaustive)", "keys")) else "examples"


def via_of(theorem: Property) -> str:
    """How a theorem ran on bound code, for its row: upstream's own loop or store path,
    else what its space declares drives the bound functions (``CaseSpace.driver``);
    empty for a formula theorem and a space that calls the functions directly."""
    from kvcontract.tools.audit import store
    from kvcontract.tools.audit.on_engine import is_engine_theorem

    if is_engine_theorem(theorem) and isinstance(theorem, CaseProperty):
        return str(theorem.space.driver)
    if theorem.name.startswith(UPSTREAM_LOOKUP):
        return VIA_UPSTREAM_LOOKUP
    if store.is_upstream(theorem.name):
        return (VIA_UPSTREAM_END_TO_END if store.is_upstream_end_to_end(theorem.name)
                else VIA_UPSTREAM_STORE)
    if isinstance(theorem, CaseProperty):
        return theorem.space.driver
    return ""


def _row(theorem: Property, result: TheoremResult, evidence: str, witness_case: Any,
         binding: Binding, scope: Scope = ()) -> dict[str, Any]:
    """The report row: verdict, evidence, how it was checked, blame, location and the
    root cause of a counterexample (:mod:`kvcontract.tools.audit.root_cause`)."""
    impl = binding.implementation
    assert impl is not None
    row: dict[str, Any] = result.to_json()
    row["evidence"] = evidence if result.verdict.passed else None
    if row["evidence"] == "examples":
        # A search that is neither a proof nor exhaustive is not PROVED-FOR-DOMAIN.
        row["verdict"] = Verdict.TESTED.value
    row["examples"] = result.queries
    fields = theorem_fields(theorem)
    from kvcontract.tools.audit import store

    row["via"] = via_of(theorem)
    from kvcontract.tools.audit.on_engine import engine_section, is_engine_theorem

    on_engine = is_engine_theorem(theorem)
    row["judge"] = _judge_of(theorem)
    if on_engine:
        row["engine"] = engine_section(binding.engine, theorem)
        if result.verdict is Verdict.COUNTEREXAMPLE and witness_case is not None:
            from kvcontract.tools.audit.on_engine import finding_mode

            mode = finding_mode(witness_case, theorem if isinstance(
                theorem, CaseProperty) else None, binding.engine)
            if mode is not None:
                row["mode"] = mode
    if result.verdict is Verdict.COUNTEREXAMPLE and theorem.name.startswith(UPSTREAM_LOOKUP):
        row["blame"] = ["_lookup_complete_chunks"]
        location = binding.location("multi_group_lookup")
        if location:
            row["location"] = {"path": location[0], "line": location[1]}
    elif result.verdict is Verdict.COUNTEREXAMPLE and store.is_upstream(theorem.name) and \
            isinstance(theorem, CaseProperty):
        row["blame"], role = store.blame(theorem, witness_case)
        location = binding.location(role)
        if location:
            row["location"] = {"path": location[0], "line": location[1]}
    elif result.verdict is Verdict.COUNTEREXAMPLE and witness_case is not None:
        culprits = blame(theorem, impl, witness_case)
        row["blame"] = culprits
        for name in culprits or list(fields):
            location = binding.field_location(name)
            if location:
                row["location"] = {"path": location[0], "line": location[1]}
                break
    if result.verdict is Verdict.COUNTEREXAMPLE and witness_case is not None:
        row["root_cause"] = _root_cause(theorem, witness_case, binding, scope)
        if not on_engine and binding.engine is not None:
            from kvcontract.tools.audit.on_engine import replay_on_engine

            replayed = replay_on_engine(theorem, witness_case, binding)
            if replayed is not None:
                row["engine_replay"] = replayed
    return row


def _judge_of(theorem: Property) -> str:
    """Who judged a theorem's row: ``engine`` (vLLM's own objects), ``stand-ins``
    (upstream's loop or store path among kvcontract's stand-ins) or ``functions``
    (upstream's functions in kvcontract's drivers, Z3 or the executable system)."""
    from kvcontract.tools.audit import store
    from kvcontract.tools.audit.on_engine import is_engine_theorem

    if is_engine_theorem(theorem):
        return "engine"
    if theorem.name.startswith(UPSTREAM_LOOKUP) or store.is_upstream(theorem.name):
        return "stand-ins"
    return "functions"


_THEOREMS: dict[tuple[int, Scope], list[Property]] = {}


def _root_cause(theorem: Property, witness_case: Any, binding: Binding,
                scope: Scope) -> dict[str, Any] | None:
    from kvcontract.tools.audit import root_cause

    key = (id(binding), scope)
    if key not in _THEOREMS:
        _THEOREMS.clear()
        _THEOREMS[key] = theorems_for(binding, scope)
    base = root_cause.upstream_base(theorem, _THEOREMS[key])
    from kvcontract.tools.audit.on_engine import engine_root_cause, is_engine_theorem

    if is_engine_theorem(theorem) and isinstance(theorem, CaseProperty):
        return engine_root_cause(theorem, witness_case, binding, base)
    return root_cause.find_root_cause(theorem, witness_case, binding, base,
                                      root_cause.rebuild_upstream(theorem.name))


def check_theorem(theorem: Property, binding: Binding, options: AuditOptions) -> dict[str, Any]:
    """Decide one theorem on the bound implementation (runs in a sandbox child)."""
    impl = binding.implementation
    assert impl is not None
    result, evidence, witness_case = _decide(theorem, impl, options)
    return _row(theorem, result, evidence, witness_case, binding, options.geometries)


def check_family(theorems: Sequence[CaseProperty], binding: Binding,
                 options: AuditOptions) -> list[dict[str, Any]]:
    """Decide families of exhaustive theorems in one pass over their shared cases (runs
    in a sandbox child): the theorems of one family, or of families whose cases are one
    family's (:func:`_fused`), each family in its own order of appearance."""
    impl = binding.implementation
    assert impl is not None
    from kvcontract.tools.audit.derived_spaces import shared_cases

    groups: dict[str, list[CaseProperty]] = {}
    # The family whose cases the others share walks first (:func:`_shared_cases`).
    for theorem in sorted(theorems, key=lambda t: shared_cases(t.space) is not None):
        groups.setdefault(theorem.space.family, []).append(theorem)
    found = {id(t): found for group, results in zip(
        groups.values(), _families(list(groups.values()), impl, options), strict=True)
        for t, found in zip(group, results, strict=True)}
    return [_row(t, found[id(t)][0], _exhaustive_evidence(found[id(t)][0]), found[id(t)][1],
                 binding, options.geometries) for t in theorems]


def _units(theorems: Sequence[Property], indices: Sequence[int]) -> list[list[int]]:
    """Work units: one per family of exhaustive theorems (families that share their cases
    together, :func:`_fused`), one per other theorem."""
    families: dict[str, list[int]] = {}
    units: list[list[int]] = []
    for index in indices:
        name = str(getattr(theorems[index], "family", "") or "")
        if isinstance(theorems[index], CaseProperty) and name:
            if name not in families:
                families[name] = []
                units.append(families[name])
            families[name].append(index)
        else:
            units.append([index])
    return _fused(theorems, units)


def _fused(theorems: Sequence[Property], units: list[list[int]]) -> list[list[int]]:
    """Family units whose cases are another family's cases (upstream's store family is
    the store family's cases less the Mamba geometries, upstream's C12 likewise, and
    upstream's lookup family the lookup family's) joined to that family's unit, so one
    walk computes each case's spec memos once (:func:`_families`)."""
    from kvcontract.tools.audit.derived_spaces import shared_cases

    by_space: dict[int, list[int]] = {}
    for unit in units:
        first = theorems[unit[0]]
        if isinstance(first, CaseProperty):
            by_space.setdefault(id(first.space), unit)
    from kvcontract.tools.audit.on_engine import is_engine_theorem

    fused: list[list[int]] = []
    for unit in units:
        first = theorems[unit[0]]
        # vLLM's engine walks its families in units of their own: the longest walks of
        # the audit, run beside kvcontract's (parallel workers), not after them.
        shared = shared_cases(first.space) if isinstance(first, CaseProperty) and \
            not is_engine_theorem(first) else None
        host = by_space.get(id(shared[0])) if shared is not None else None
        if host is not None and host is not unit:
            host.extend(unit)
            continue
        fused.append(unit)
    return fused


# -- units of work and --shard ---------------------------------------------------------------
@dataclass(frozen=True)
class WorkUnit:
    """One unit of an audit's work, never split across ``--shard`` machines: a theorem,
    the theorems of families walked in one shared pass (:func:`_units`), or one scenario
    of the executable system."""

    name: str
    """What it checks (theorem ids, or ``system[scenario]``): the selection digest."""
    theorems: tuple[int, ...] = ()
    """Catalogue indices (:func:`theorems_for`); empty for a scenario."""
    scenario: int | None = None
    """Position in :func:`system_scenarios`; None for theorems."""
    cost: float = 0.0
    """A static cost, about milliseconds (:func:`_theorem_cost`,
    :data:`SCENARIO_TOKEN_COST`): never a timing, so every shard computes the same
    partition."""


FAMILY_CASE_COST: dict[str, float] = {
    Family.SCAN: 0.05, Family.LOOKUP: 0.1, Family.STORE: 1.0, Family.END_TO_END: 0.15,
    stand_in_family(Family.LOOKUP): 0.065, stand_in_family(Family.STORE): 0.5,
    stand_in_family(Family.END_TO_END): 0.15, engine_family(Family.LOOKUP): 0.4,
    engine_family(Family.STORE): 5.0, engine_family(Family.END_TO_END): 2.0}
"""Static cost (about milliseconds) per case of a family's walk for its first theorem,
which computes the case's memos (the implementation's answer, the spec's), calibrated
once on the audit of 0.33.0 on one core: 23 s for the 226,760 lookup cases, 15 s for
upstream's; 0.5 s for the 441 store schedules. A family not listed counts
:data:`CASE_COST`."""

MEMBER_CASE_COST = 0.005
"""Per case and further theorem of a family: a judge over memoized observations (1-2 s
per lookup theorem after the first)."""

CASE_COST = 0.1
"""Per case of a family :data:`FAMILY_CASE_COST` does not list."""

FORMULA_CONFIG_COST = 5.0
"""Per configuration of a formula theorem's case split whose upstream code is lifted and
proved (0.1-0.7 s for 45 configurations on 0.33.0)."""

MASK_CONFIG_COST = 45.0
"""Per configuration of a theorem over a geometry's store mask (the formula properties
with a ``geometry``): upstream's block mask builds a list over a symbolic range, so the
audit searches it concretely (4.6-10.6 s for 135-172 configurations on 0.33.0)."""

THEOREM_COST = 200.0
"""Per theorem outside a family walk (a child, the lift, the solver's set-up), and all
of a theorem with no configurations to count."""

SCENARIO_TOKEN_COST = 0.2
"""Per unit of :func:`kvcontract.tools.audit.system.program_weight` (a token sent, or
an operation) of a system scenario (0.8 s for seed001's 4,353-token prompt)."""


def _theorem_cost(members: Sequence[Property], options: AuditOptions,
                  counted: dict[int, int]) -> float:
    """The static cost of one theorem unit: per family of a walk, its cases (each
    family stops at ``--budget``) times its first theorem's and its further theorems'
    per-case costs; or a formula theorem's configurations."""
    first = members[0]
    if isinstance(first, CaseProperty):
        cost = 0.0
        families: dict[int, list[CaseProperty]] = {}
        for member in members:
            if isinstance(member, CaseProperty):
                families.setdefault(id(member.space), []).append(member)
        for group in families.values():
            space = group[0].space
            if id(space) not in counted:
                # Counted, never walked: a few tenths of a second for the largest space.
                counted[id(space)] = sum(1 for _ in space.cases())
            per_case = (FAMILY_CASE_COST.get(str(space.family), CASE_COST)
                        + MEMBER_CASE_COST * (len(group) - 1))
            cost += min(counted[id(space)], options.budget) * per_case
        return cost
    if isinstance(first, FormulaProperty):
        per = MASK_CONFIG_COST if first.geometry is not None else FORMULA_CONFIG_COST
        return THEOREM_COST + per * len(first.configs())
    return THEOREM_COST


def system_scenarios(binding: Binding, options: AuditOptions) -> list[Any]:
    """The executable system's scenarios an audit runs (the seed scenarios, or those of
    the given geometries), in report order; none when the system does not run."""
    from kvcontract.tools.audit import system

    if not _runs_system(binding, options) or system.cannot_run(binding) is not None:
        return []
    # Upstream's store path runs no Mamba scenario (system.left_out: named in plan).
    return system.runnable(binding, _all_scenarios(options))


def _all_scenarios(options: AuditOptions) -> list[Any]:
    from kvcontract.tools.fuzz import scoped_seed_scenarios, seed_scenarios

    if options.geometries:
        return list(scoped_seed_scenarios(options.geometries, options.seed))
    return list(seed_scenarios())  # run_system_scenarios' own default


def work_units(binding: Binding, options: AuditOptions,
               theorems: Sequence[Property] | None = None,
               indices: Sequence[int] | None = None) -> list[WorkUnit]:
    """The audit's units of work in a fixed order (the theorem units of :func:`_units`,
    then the system's scenarios), each with its static cost: what ``--shard`` splits."""
    if theorems is None:
        theorems = theorems_for(binding, options.geometries)
    if indices is None:
        indices = plan(binding, options)[0]
    counted: dict[int, int] = {}
    units = [WorkUnit(",".join(theorems[i].theorem_id for i in unit), tuple(unit),
                      cost=_theorem_cost([theorems[i] for i in unit], options, counted))
             for unit in _units(theorems, indices)]
    from kvcontract.tools.audit.system import program_weight

    units += [WorkUnit(f"system[{scenario.name}]", scenario=position,
                       cost=SCENARIO_TOKEN_COST * program_weight(scenario))
              for position, scenario in enumerate(system_scenarios(binding, options))]
    return units


@dataclass
class _ShardPlan:
    """What one ``--shard`` runs: catalogue indices, the positions of its scenarios in
    :func:`system_scenarios`, and the report's ``shard`` object."""

    indices: list[int]
    positions: list[int]
    section: dict[str, Any]


def _units_in_child(binding: Binding, options: AuditOptions, theorems: Sequence[Property],
                    indices: Sequence[int]) -> list[WorkUnit]:
    """:func:`work_units`, listed in a sandbox child: what this process computes changes
    what the children forked later find (measured on 0.33.0: once the parent had listed
    the C7 theorems' configurations, a concrete search met another witness), so a
    shard's parent stays exactly an unsharded audit's."""
    def job() -> dict[str, Any]:
        return {"units": [dataclasses.asdict(u)
                          for u in work_units(binding, options, theorems, indices)]}

    outcome = run_jobs([("units", job)], workers=1, job_timeout=options.theorem_timeout,
                       call_timeout=None)["units"]
    if not outcome.ok or outcome.value is None:
        raise RuntimeError("the audit's units of work could not be listed: "
                           + outcome.error.splitlines()[0])
    return [WorkUnit(name=str(u["name"]), theorems=tuple(u["theorems"]),
                     scenario=u["scenario"], cost=float(u["cost"]))
            for u in outcome.value["units"]]


def _shard_plan(binding: Binding, options: AuditOptions, theorems: Sequence[Property],
                indices: Sequence[int], shard: Shard) -> _ShardPlan:
    units = _units_in_child(binding, options, theorems, indices)
    mine = partition([u.cost for u in units], shard.count)[shard.index - 1]
    kept = {i for p in mine for i in units[p].theorems}
    # Everything that changes what a unit finds must agree between shards: the digest
    # covers the work list, scope and search settings; budget and timeout are fields of
    # their own (merge names them), the target and its bindings are in the reports.
    selection = selection_digest(
        [u.name for u in units],
        [[[label, g.to_dict()] for label, g in options.geometries], options.examples,
         options.seed])
    section = shard_section(shard, mine, len(units), selection,
                            units=[units[p].name for p in mine], budget=options.budget,
                            timeout=options.call_timeout)
    return _ShardPlan(indices=[i for i in indices if i in kept],
                      positions=[s for p in mine if (s := units[p].scenario) is not None],
                      section=section)


def run_audit(
    binding: Binding,
    options: AuditOptions,
    on_row: Callable[[dict[str, Any], int, int], None] | None = None,
) -> AuditRun:
    """Check every planned theorem in sandboxed children; never raises for upstream faults.

    With ``options.shard``, only that shard's units of work (:func:`work_units`,
    partitioned by static cost); the run's ``shard`` object places every row in the
    unsharded order, so ``kvcontract merge`` rebuilds the unsharded report."""
    started = time.perf_counter()
    indices, unchecked = plan(binding, options)
    theorems = theorems_for(binding, options.geometries)
    jobs = options.jobs or max(1, min(len(indices) or 1, os.cpu_count() or 1))
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {jobs}")
    sharded = (_shard_plan(binding, options, theorems, indices, options.shard)
               if options.shard is not None else None)
    if sharded is not None:
        indices = sharded.indices
    # Longest first (the families, then the masks), so two workers balance.
    weight = {"segment": 1, "replay": 1, "final": 1}
    units = _units(theorems, indices)
    units.sort(key=lambda u: -len(u) if len(u) > 1 else
               weight.get(theorems[u[0]].name.split("-", 1)[0], 2))
    rows: dict[int, dict[str, Any]] = {}

    def make_job(unit: list[int]) -> Callable[[], dict[str, Any]]:
        if len(unit) == 1:
            return lambda: {"rows": [check_theorem(theorems[unit[0]], binding, options)]}
        members = [theorems[i] for i in unit]
        family = [m for m in members if isinstance(m, CaseProperty)]
        assert len(family) == len(members), "a unit of several theorems is one family"
        return lambda: {"rows": check_family(family, binding, options)}

    def done(outcome: Outcome) -> None:
        unit = [int(i) for i in outcome.key.split(",")]
        if outcome.ok and outcome.value is not None:
            produced = list(outcome.value["rows"])
        else:
            produced = [{
                "clause": theorems[i].clause, "theorem": theorems[i].name,
                "verdict": Verdict.UNKNOWN.value, "domain": "",
                "seconds": round(outcome.seconds, 4),
                "witness": None, "evidence": None, "examples": 0, "via": "",
                "message": f"the check did not finish: {outcome.error.splitlines()[0]}",
                "description": theorems[i].description,
                "judge": _judge_of(theorems[i]),
            } for i in unit]
        for i, row in zip(unit, produced, strict=True):
            rows[i] = row
            if on_row:
                on_row(row, len(rows), len(indices))

    order = {c.id: n for n, c in enumerate(CLAUSES)}
    # A row's place in the report: (clause, 0, catalogue index, 0) for a theorem,
    # (clause, 1, scenario position, row of the scenario) for the system, whose rows
    # follow the theorems of their clause in scenario order (what merge sorts by).
    system_keyed: list[tuple[tuple[int, int, int, int], dict[str, Any]]] = []
    piece_positions: list[list[int] | None] = []
    job_list = [(",".join(map(str, unit)), make_job(unit)) for unit in units]
    if system_scenarios(binding, options) and (sharded is None or sharded.positions):
        from kvcontract.tools.audit.system import scenario_rows, shards

        pieces: list[tuple[list[Any] | None, list[int] | None]]
        if options.geometries:
            # The scenarios in shards, each a job of its own (one child's memory is one
            # scenario's at most; shards balance the workers); cut in order, so each
            # piece's positions are the next ones.
            every = system_scenarios(binding, options)
            at = list(range(len(every)))
            if sharded is not None:
                every, at = [every[p] for p in sharded.positions], list(sharded.positions)
            pieces = []
            for piece in shards(every, jobs):
                pieces.append((piece, None))
                piece_positions.append(at[:len(piece)])
                at = at[len(piece):]
        else:
            # The seed scenarios, one job; a shard's picked by position in the child,
            # which builds them as an unsharded audit's does.
            picks = None if sharded is None else list(sharded.positions)
            pieces = [(None, picks)]
            piece_positions.append(picks)

        def system_job(piece: list[Any] | None,
                       picks: list[int] | None) -> Callable[[], dict[str, Any]]:
            def job() -> dict[str, Any]:
                scenarios = piece
                if picks is not None:
                    every = system_scenarios(binding, options)
                    scenarios = [every[p] for p in picks]
                return {"rows": scenario_rows(binding, scenarios=scenarios)}

            return job

        # After the longest family (the store families' shared walk), before the rest:
        # longest first, so two workers balance.
        job_list[1:1] = [(f"system:{number}", system_job(piece, picks))
                         for number, (piece, picks) in enumerate(pieces)]

    def route(outcome: Outcome) -> None:
        if not outcome.key.startswith("system"):
            done(outcome)
            return
        positions = piece_positions[int(outcome.key.split(":", 1)[1])]
        if outcome.ok and outcome.value is not None:
            # Scenario findings keep their own clause (a stale-pending program fails C3).
            groups: list[list[dict[str, Any]]] = list(outcome.value["rows"])
            places = positions if positions is not None else range(len(groups))
            system_keyed.extend(((order[r["clause"]], 1, place, k), {"judge": "functions", **r})
                                for place, group in zip(places, groups, strict=True)
                                for k, r in enumerate(group))
            return
        system_keyed.append(((order["C11"], 1, positions[0] if positions else 0, 0), {
            "clause": "C11", "theorem": "system[seed scenarios]",
            "verdict": Verdict.UNKNOWN.value, "domain": "",
            "seconds": round(outcome.seconds, 4), "witness": None, "evidence": None,
            "examples": 0, "via": "",
            "message": f"the scenarios did not finish: {outcome.error.splitlines()[0]}",
            "description": "the seed scenarios of the executable system",
        }))

    run_jobs(job_list, workers=jobs, job_timeout=options.theorem_timeout,
             call_timeout=options.call_timeout, on_done=route)
    keyed = [((order[theorems[i].clause], 0, i, 0), rows[i]) for i in indices]
    # Whichever scenario piece finished first, the scenarios' rows in their own order.
    keyed = sorted([*keyed, *system_keyed], key=lambda kv: kv[0])
    section = None
    if sharded is not None:
        section = {**sharded.section, "row_keys": [list(key) for key, _ in keyed]}
    return AuditRun(rows=[row for _, row in keyed], unchecked=unchecked,
                    seconds=time.perf_counter() - started, shard=section)


def clause_summary(rows: Iterable[dict[str, Any]],
                   unchecked: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per clause: the worst verdict of its theorems and the weakest evidence."""
    rank = {Verdict.COUNTEREXAMPLE.value: 0, Verdict.UNKNOWN.value: 1, Verdict.VACUOUS.value: 1,
            Verdict.TESTED.value: 2, Verdict.PROVED_FOR_DOMAIN.value: 2,
            Verdict.PROVED.value: 3}
    strength = {"examples": 0, "exhausted": 1, "proved for domain": 2, "proved": 3}
    by_clause: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_clause.setdefault(row["clause"], []).append(row)
    missing: dict[str, list[str]] = {}
    for item in unchecked:
        missing.setdefault(item["clause"], []).append(item["theorem"])
    summary = []
    for clause in CLAUSES:
        own = by_clause.get(clause.id, [])
        if not own and clause.id not in missing:
            continue
        entry: dict[str, Any] = {"clause": clause.id, "title": clause.title,
                                 "theorems": len(own), "unchecked": missing.get(clause.id, [])}
        if not own:
            entry["status"] = "not checked"
        else:
            worst = min(own, key=lambda r: rank.get(r["verdict"], 1))
            found = [r for r in own if r["verdict"] == Verdict.COUNTEREXAMPLE.value]
            built = [r for r in found if r.get("impact") != Impact.LATENT.value
                     and not r.get("unconfirmed")]
            stand_ins = [r for r in found if r.get("impact") != Impact.LATENT.value
                         and r.get("unconfirmed")]
            if built:
                entry["status"] = "violated"
                entry["theorem"] = built[0]["theorem"]
            elif stand_ins:
                # Only judged on stand-ins, vLLM's engine could not run (on_engine.grade).
                entry["status"] = "unconfirmed"
                entry["theorem"] = stand_ins[0]["theorem"]
            elif found:
                # Only on geometries vLLM does not build: reported, not a violation of
                # the code as it runs (docs/CONTRACT.md, latent findings).
                entry["status"] = "latent"
                entry["theorem"] = found[0]["theorem"]
            elif rank.get(worst["verdict"], 1) < 2:
                entry["status"] = "unknown"
                entry["theorem"] = worst["theorem"]
            else:
                weakest = min((r.get("evidence") or "examples" for r in own),
                              key=lambda e: strength.get(e, 0))
                entry["status"] = "holds"
                entry["evidence"] = weakest
                entry["examples"] = sum(int(r.get("examples") or 0) for r in own)
        summary.append(entry)
    return summary
