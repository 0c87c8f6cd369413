"""How each kind of property (:mod:`kvcontract.spec.properties`) is decided.

* a :class:`~kvcontract.spec.properties.base.FormulaProperty`
  (:func:`prove_formula`) is first tried with every size symbolic (verdict PROVED); if
  the solver cannot decide it within its budget, it is case-split over the property's
  configurations (verdict PROVED-FOR-DOMAIN, the configurations printed). Operational
  implementation functions enter the statement through :meth:`SymbolicEnv.call`, which
  lifts them to terms (:mod:`kvcontract.spec.symbolic`).
* a :class:`~kvcontract.spec.properties.base.CaseProperty` (:func:`run_family`) is
  judged on every case of its finite space (lookup-state sequences, multi-group chunk
  states, store schedules), enumerated in increasing size so the first failure is a
  minimal counterexample; the properties of one space are judged in one pass.

A counterexample is always re-executed on plain Python ints (the same statement, the
implementation called directly) before it is reported; one that does not reproduce is
reported as UNKNOWN, never as a pass.

How the prover stays fast, and why each device is sound (each is checked against the
plain form it replaces in ``tests/proofs/test_engine.py``):

* **Decision-tree lifting** (:mod:`kvcontract.spec.symbolic`): a lifted function is the
  ``If`` tree of the decisions its runs took, each branch condition once, not a chain of
  whole path conditions (which repeats every prefix). Z3 decides the tree form 10-100x
  faster on the C7 mask theorems.
* **Generalized lifts** (``SymbolicEnv.call(..., generalize=...)``): the sizes of a case
  split are lifted as placeholders and substituted per configuration, so the block mask
  is lifted once per kind instead of once per size pair; a function that needs the size
  concrete falls back to the concrete lift.
* **Boundary residues** (``spec/properties/formulas._boundary_residues``): boundaries
  ``k * step`` are split by ``k mod L``, ``L = tpc / gcd(step, tpc)`` (a complete case
  split), which makes the chunk arithmetic linear in the quotient.
* **Solver portfolio** (``proofs/solver.ATTEMPTS``): small deterministic budgets with
  both arithmetic engines and several seeds before the full budget; solving times are
  heavy-tailed, restarts cut the tail. Still rlimit-only: results do not depend on load.
* **Families and shards** (:func:`run_family`, :func:`finish_family`; ``proofs/runner``,
  ``FAMILY_SHARDS``): the exhaustive theorems over one case set (scanners, multi-group
  lookup, store schedules) are checked in one pass, in shards across workers; the
  implementation's lookup and the spec's answer are memoized per case, and the spec's
  state-independent read ranges per geometry (``spec/multigroup._requirements``). The
  first counterexample over all shards (smallest case index) is the one reported, as in
  a single pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from kvcontract.impl.bundle import Implementation
from kvcontract.proofs import solver as z3driver
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.spec.arith import Bool, Num
from kvcontract.spec.lemmas import GeneralLemma
from kvcontract.spec.properties.base import (
    CaseProperty,
    Env,
    FormulaProperty,
    Property,
    latent_reason,
    raised,
)
from kvcontract.spec.properties.unbounded import InductiveProperty, NotAFold
from kvcontract.spec.symbolic import LiftError, PathExplorer, has_symbolic


class SymbolicEnv(Env):
    """The variables of one query as Z3 terms (some may be concrete ints)."""

    def __init__(self, values: Mapping[str, Num]) -> None:
        super().__init__(values)
        self.assumptions: list[z3.BoolRef] = []
        self.lemmas: list[z3.BoolRef] = []
        self.required: list[GeneralLemma] = []
        """General lemmas the statement relies on without an instance (:meth:`requires`)."""
        self.instances: dict[int, GeneralLemma] = {}
        """Positions in :attr:`lemmas` that instantiate a general lemma (not proved in
        the query: the general form is proved once, :func:`_general_lemma`)."""

    @property
    def symbolic(self) -> bool:
        return any(isinstance(v, z3.ExprRef) for v in self.values.values())

    def assume(self, hypotheses: Sequence[Bool]) -> None:
        """Hypotheses that prune the paths of lifted functions."""
        self.assumptions.extend(h for h in hypotheses if isinstance(h, z3.BoolRef))

    def instance(self, lemma: GeneralLemma, *args: Num) -> None:
        """Recorded for :func:`_query`: the general form is proved, the instance used."""
        fact = lemma(*args)
        if isinstance(fact, z3.BoolRef):
            self.instances[len(self.lemmas)] = lemma
            self.lemmas.append(fact)

    def requires(self, lemma: GeneralLemma) -> None:
        """Recorded for :func:`_query`, which proves the general form first."""
        if lemma not in self.required:
            self.required.append(lemma)

    def lemma(self, fact: Bool) -> None:
        """Recorded for :func:`_query`, which proves the chain before the goal."""
        if isinstance(fact, z3.BoolRef):
            self.lemmas.append(fact)
        elif fact is False:
            self.lemmas.append(z3.BoolVal(False))  # a false lemma is never proved

    def call(self, fn: Callable[..., Any], *args: Any, generalize: Sequence[int] = ()) -> Any:
        """``fn(*args)``; lifted to a term when an argument is symbolic.

        Lifts are cached per function and concrete arguments: the symbolic arguments are
        replaced by placeholders, lifted once, and substituted back. ``generalize``
        names argument positions (concrete sizes of a case split) to lift as
        placeholders too, so one lift serves every configuration (measured: the C7 mask
        theorems lifted the block mask 72 times, once per size pair). If the function
        needs such an argument concrete (a loop bound, say), it is lifted without.
        """
        if not any(has_symbolic(a) for a in args):
            return fn(*args)
        if generalize:
            general = tuple(
                z3.IntVal(a) if i in generalize and type(a) is int else a
                for i, a in enumerate(args)
            )
            try:
                # Fold the substituted sizes so the solver sees the same linear terms
                # a concrete lift would give it.
                return _simplify(self._lift(fn, general))
            except LiftError:
                pass
        return self._lift(fn, args)

    def _lift(self, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        placeholders: list[tuple[z3.ExprRef, z3.ExprRef]] = []

        def abstract(value: Any) -> Any:
            if isinstance(value, tuple):
                return tuple(abstract(v) for v in value)
            if isinstance(value, z3.BoolRef):  # a flag of a scan state
                hole = z3.Bool(f"__arg{len(placeholders)}")
                placeholders.append((hole, value))
                return hole
            if isinstance(value, z3.ExprRef):
                hole = z3.Int(f"__arg{len(placeholders)}")
                placeholders.append((hole, value))
                return hole
            return value

        shape = tuple(abstract(a) for a in args)
        key = (fn, _shape_key(shape))
        lifted = _LIFT_CACHE.get(key)
        if lifted is None:
            lifted = PathExplorer().lift(fn, shape)
            _LIFT_CACHE[key] = lifted
        return _substitute(lifted, placeholders)


_LIFT_CACHE: dict[tuple[Any, Any], Any] = {}


def _simplify(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_simplify(v) for v in value)
    if isinstance(value, z3.ExprRef):
        return z3.simplify(value)
    return value


def _shape_key(value: Any) -> Any:
    """A hashable key for lifted arguments: Z3 terms by their (hash-consed) AST id,
    which is much cheaper than printing them."""
    if isinstance(value, tuple):
        return tuple(_shape_key(v) for v in value)
    if isinstance(value, z3.ExprRef):
        return ("z3", value.get_id())
    return (type(value).__name__, value)


def _substitute(value: Any, pairs: list[tuple[z3.ExprRef, z3.ExprRef]]) -> Any:
    if isinstance(value, tuple):
        return tuple(_substitute(v, pairs) for v in value)
    if isinstance(value, z3.ExprRef) and pairs:
        return z3.substitute(value, *pairs)
    return value


def prove_formula(prop: FormulaProperty, impl: Implementation) -> TheoremResult:
    """Decide a formula property: symbolic sizes first (PROVED), else its case split
    (PROVED-FOR-DOMAIN); a counterexample is minimized and re-executed on ints."""
    started = time.perf_counter()
    result = TheoremResult(
        clause=prop.clause,
        theorem=prop.name,
        verdict=Verdict.UNKNOWN,
        domain="",
        seconds=0.0,
        description=prop.description,
    )
    try:
        _decide(prop, impl, result)
    except (LiftError, NotAFold) as exc:
        if isinstance(prop, InductiveProperty) and prop.grid():
            _decide_on_grid(prop, impl, result, str(exc))
        else:
            result.verdict = Verdict.UNKNOWN
            result.message = f"the implementation could not be lifted: {exc}"
    result.seconds = time.perf_counter() - started
    return result


def _rlimit(prop: FormulaProperty) -> int:
    return int(z3driver.DEFAULT_RLIMIT) if prop.rlimit is None else prop.rlimit


def _query(
    prop: FormulaProperty,
    impl: Implementation,
    fixed: Mapping[str, int],
    free: Sequence[str],
    rlimit: int,
) -> tuple[z3driver.QueryOutcome, list[Bool], Bool, list[z3.ArithRef]]:
    variables = [z3.Int(name) for name in free]
    # By name, not str(v): Z3's printer took 0.2 s per C7 theorem here.
    env = SymbolicEnv({**fixed, **dict(zip(free, variables, strict=True))})
    hypotheses, goal = prop.statement(env, impl)
    hyps = [h for h in hypotheses if not isinstance(h, bool)]
    if any(h is False for h in hypotheses):
        return (
            z3driver.QueryOutcome(z3driver.QueryStatus.VACUOUS, None, 0, "false hypothesis"),
            hypotheses,
            goal,
            variables,
        )
    goal_term = z3.BoolVal(goal) if isinstance(goal, bool) else goal
    used = 0
    if env.lemmas or env.required:
        # Vacuity of the statement's own hypotheses, before any lemma: with the lemmas'
        # nonlinear terms added, finding a model of them is the slow part (measured: a C7
        # EAGLE goal implied propositionally by its lemmas took 14 s, all of it there).
        empty, used = z3driver.vacuous(hyps, rlimit)
        if empty:
            return (z3driver.QueryOutcome(z3driver.QueryStatus.VACUOUS, None, used,
                                          "hypotheses are unsatisfiable"),
                    hyps, goal_term, variables)
    for general_lemma in env.required:
        step = _general_lemma(general_lemma, rlimit)
        used += step.rlimit_used
        if step.status is not z3driver.QueryStatus.PROVED:
            return (z3driver.QueryOutcome(z3driver.QueryStatus.UNKNOWN, None, used,
                                          f"required lemma not proved: {step.reason}"),
                    hyps, goal_term, variables)
    for index, lemma in enumerate(env.lemmas):
        # Each lemma from the hypotheses and the lemmas before it; an instance of a
        # general lemma by proving the general form. A lemma that is not proved leaves
        # the query undecided: its model defeats a step of the proof, not necessarily
        # the goal, so it is never reported as a counterexample.
        general = env.instances.get(index)
        if general is not None:
            step = _general_lemma(general, rlimit)
        else:
            step = z3driver.prove([*hyps, *env.lemmas[:index]], lemma, variables,
                                  rlimit=rlimit, check_vacuity=False)
        used += step.rlimit_used
        if step.status is not z3driver.QueryStatus.PROVED:
            return (
                z3driver.QueryOutcome(
                    z3driver.QueryStatus.UNKNOWN, None, used,
                    f"lemma {index + 1} of {len(env.lemmas)} not proved ({step.status.value}"
                    + (f": {step.reason}" if step.reason else "") + "): "
                    + str(lemma)[:240]),
                hyps, goal_term, variables,
            )
    if env.lemmas:
        hyps = [*hyps, *env.lemmas]
    outcome = z3driver.prove(hyps, goal_term, variables, rlimit=rlimit,
                             check_vacuity=not (env.lemmas or env.required))
    outcome.rlimit_used += used
    outcome.lemmas = len(env.lemmas)
    return outcome, hyps, goal_term, variables


_GENERAL_PROOFS: dict[str, z3driver.QueryOutcome] = {}


def _general_lemma(lemma: GeneralLemma, rlimit: int) -> z3driver.QueryOutcome:
    """The general form of ``lemma`` over fresh unbounded variables, proved once per
    process (its resources are counted at its first use only)."""
    known = _GENERAL_PROOFS.get(lemma.name)
    if known is not None:
        return z3driver.QueryOutcome(known.status, None, 0, known.reason)
    fresh = [z3.Int(f"__{lemma.name}_{i}") for i in range(lemma.arity)]
    statement = lemma(*fresh)
    goal = z3.BoolVal(statement) if isinstance(statement, bool) else statement
    outcome = z3driver.prove([], goal, fresh, rlimit=rlimit, check_vacuity=False)
    if outcome.status is not z3driver.QueryStatus.PROVED:
        outcome.reason = f"general lemma {lemma.name} ({lemma.text}): " + (
            outcome.reason or outcome.status.value)
    _GENERAL_PROOFS[lemma.name] = outcome
    return outcome


def _decide(prop: FormulaProperty, impl: Implementation, result: TheoremResult) -> None:
    # A counterexample on a geometry vLLM does not build is kept aside (``latent``) while
    # the rest of the domain is searched for one that vLLM builds: the latter decides the
    # verdict's impact, the former is reported only when nothing else is found.
    latent: tuple[dict[str, int], str, str] | None = None
    for config in prop.configs()[:prop.probe_configs] if prop.symbolic_sizes else ():
        outcome, hyps, goal, variables = _query(
            prop, impl, config.values, prop.variables, _rlimit(prop))
        result.queries += 1
        result.rlimit_used += outcome.rlimit_used
        if outcome.status is z3driver.QueryStatus.REFUTED and outcome.model is not None:
            found = _counterexample(prop, impl, result, config.values, hyps, goal,
                                    variables, outcome.model, final=False)
            if found is not None and prop.grade(*found).latent is None:
                _fill(prop, result, found[0], found[1], config.label)
                return
            # Not replayed or latent: the full split below meets it again and decides.
        # Anything else is decided below: the symbolic query, else the whole split.
    if prop.symbolic_sizes:
        free = list(prop.symbolic_sizes) + list(prop.variables)
        fixed = dict(prop.symbolic_fixed)
        outcome, hyps, goal, variables = _query(prop, impl, fixed, free, prop.symbolic_rlimit)
        result.queries += 1 + outcome.lemmas
        result.rlimit_used += outcome.rlimit_used
        if outcome.status is z3driver.QueryStatus.PROVED:
            result.verdict = Verdict.PROVED
            result.domain = "all values (" + ", ".join(free) + " unbounded)"
            if prop.symbolic_domain:
                result.domain += "; " + prop.symbolic_domain
            if outcome.lemmas:
                result.domain += (f"; through {outcome.lemmas} arithmetic lemmas, each "
                                  "proved before it is used")
            if isinstance(prop, InductiveProperty) and prop.induction:
                result.domain += "; by " + prop.induction
            return
        if outcome.status is z3driver.QueryStatus.VACUOUS:
            result.verdict = Verdict.VACUOUS
            result.domain = "all values"
            result.message = outcome.reason
            return
        found = None
        spurious = False
        if outcome.status is z3driver.QueryStatus.REFUTED and outcome.model is not None:
            if prop.refine_sizes:
                # The symbolic goal is stronger than the clause (a witness block for a
                # whole chunk): its model need not violate the clause, and minimizing it
                # with every size symbolic takes minutes (_refine).
                found = _refine(prop, impl, result, fixed, free, hyps, goal, variables,
                                outcome.model)
                spurious = found is None
            else:
                found = _counterexample(prop, impl, result, fixed, hyps, goal, variables,
                                        outcome.model, final=False)
                spurious = found is None
            if found is not None:
                if prop.grade(*found).latent is None:
                    _fill(prop, result, found[0], found[1], "all values")
                    return
                latent = (found[0], found[1], "all values")
        result.details.append(
            f"symbolic sizes: {outcome.status.value} within rlimit {prop.symbolic_rlimit}"
            + (f" ({outcome.reason})" if outcome.reason else "")
            + ("; its counterexample needs a geometry vLLM does not build"
               if found is not None else "")
            + ("; its model does not violate the clause itself (the symbolic goal is "
               "stronger) and none was found at its sizes" if spurious else "")
            + "; case split instead"
        )
    configs = prop.configs()
    vacuous = 0
    for config in configs:
        outcome, hyps, goal, variables = _query(
            prop, impl, config.values, prop.variables, _rlimit(prop)
        )
        result.queries += 1
        result.rlimit_used += outcome.rlimit_used
        if outcome.status is z3driver.QueryStatus.VACUOUS:
            vacuous += 1
            continue
        if outcome.status is z3driver.QueryStatus.UNKNOWN:
            # Unknown is never a pass, and outranks a latent finding: a counterexample
            # vLLM builds may hide in the undecided configuration.
            result.verdict = Verdict.UNKNOWN
            result.domain = prop.domain
            result.message = f"Z3 said unknown for {config.label}: {outcome.reason}"
            if latent is not None:
                result.details.append(f"also a latent counterexample: {latent[1]}")
            return
        if outcome.status is z3driver.QueryStatus.REFUTED and outcome.model is not None:
            found = _counterexample(prop, impl, result, config.values, hyps, goal, variables,
                                    outcome.model)
            if found is None:
                return  # did not replay: UNKNOWN, filled by _counterexample
            if prop.grade(*found).latent is None:
                _fill(prop, result, found[0], found[1], config.label)
                return
            if latent is None or latent[2] == "all values":
                # A latent witness of the split has the grid's sizes: it is preferred to
                # the symbolic query's (which minimization drives to tiny sizes).
                latent = (found[0], found[1], config.label)
    if latent is not None:
        _fill(prop, result, *latent)
        return
    if vacuous == len(configs):
        result.verdict = Verdict.VACUOUS
        result.domain = prop.domain
        result.message = "the hypotheses are unsatisfiable for every configuration"
        return
    result.verdict = Verdict.PROVED_FOR_DOMAIN
    result.domain = f"{prop.domain}; {', '.join(prop.variables)} unbounded"
    if vacuous:
        result.details.append(f"{vacuous} configurations have no admissible values")


def _decide_on_grid(
    prop: InductiveProperty, impl: Implementation, result: TheoremResult, reason: str
) -> None:
    """The statement on plain ints at every point of the property's grid: the fallback
    for a scanner whose step cannot be lifted (PROVED-FOR-DOMAIN at best, with why)."""
    admissible = 0
    for values in prop.grid():
        if not prop.admissible(values):
            continue
        admissible += 1
        result.queries += 1
        violation = prop.violation(values, impl)
        if violation is not None:
            _fill(prop, result, dict(values), violation, f"{prop.grid_domain} ({reason})")
            return
    result.domain = f"{prop.grid_domain}; {reason}"
    if admissible == 0:
        result.verdict = Verdict.VACUOUS
        result.message = "no point of the grid satisfies the hypotheses"
        return
    result.verdict = Verdict.PROVED_FOR_DOMAIN
    result.details.append(f"{admissible} states checked on ints (no step function to lift)")


def _refine(
    prop: FormulaProperty,
    impl: Implementation,
    result: TheoremResult,
    fixed: Mapping[str, int],
    free: Sequence[str],
    hyps: Sequence[Bool],
    goal: Bool,
    variables: list[z3.ArithRef],
    model: Mapping[str, int],
) -> tuple[dict[str, int], str] | None:
    """A model of a symbolic-size query whose goal is stronger than the statement on
    ints (:attr:`FormulaProperty.refine_sizes`): its sizes are shrunk with small steps
    (each a nonlinear query; a step not decided keeps its value) and fixed, and the
    statement is asked again at those sizes, where the goal is the clause itself and the
    query is linear (measured: with the sizes left symbolic the same search took 70 s,
    minimizing it 40 s to 230 s). A counterexample there replays; else None."""
    sizes = [v for v in variables if v.decl().name() in prop.symbolic_sizes]
    small, used = z3driver.minimize(
        [h for h in hyps if isinstance(h, z3.BoolRef)], goal, sizes,
        {v.decl().name(): model[v.decl().name()] for v in sizes},
        max(1, prop.symbolic_rlimit // 100))
    result.rlimit_used += used
    pinned = {**fixed, **small}
    rest = [n for n in free if n not in pinned]
    outcome, hyps2, goal2, variables2 = _query(prop, impl, pinned, rest, _rlimit(prop))
    result.queries += 1 + outcome.lemmas
    result.rlimit_used += outcome.rlimit_used
    if outcome.status is not z3driver.QueryStatus.REFUTED or outcome.model is None:
        return None
    return _counterexample(prop, impl, result, pinned, hyps2, goal2, variables2,
                           outcome.model, final=False)


def _counterexample(
    prop: FormulaProperty,
    impl: Implementation,
    result: TheoremResult,
    fixed: Mapping[str, int],
    hyps: Sequence[Bool],
    goal: Bool,
    variables: list[z3.ArithRef],
    model: dict[str, int],
    final: bool = True,
) -> tuple[dict[str, int], str] | None:
    """Minimize a model and re-execute it on ints: ``(values, violation)``, or None when
    it does not replay; with ``final`` (the last query of the decision) ``result`` is
    then UNKNOWN, else the caller searches on."""
    goal_term = z3.BoolVal(goal) if isinstance(goal, bool) else goal
    hyp_terms = [h for h in hyps if isinstance(h, z3.BoolRef)]
    small, used = z3driver.minimize(hyp_terms, goal_term, variables, model, _rlimit(prop))
    result.rlimit_used += used
    values = {**fixed, **small}
    replay = prop.violation(values, impl)
    if replay is None:
        if not final:
            return None
        result.verdict = Verdict.UNKNOWN
        result.message = (
            f"solver model {values} did not reproduce on plain Python ints "
            "(an encoding gap, not a verdict)"
        )
        return None
    return values, replay


def _fill(prop: FormulaProperty, result: TheoremResult, values: dict[str, int],
          replay: str, label: str) -> None:
    graded = prop.grade(values, replay)
    result.verdict = Verdict.COUNTEREXAMPLE
    result.domain = label or "all values"
    result.witness = prop.witness(values)
    result.message = graded.message
    result.impact = graded.impact.value
    result.latent = graded.latent


def run_property(prop: Property, impl: Implementation) -> TheoremResult:
    """Decide one property for ``impl`` (a case property alone, in one pass)."""
    if isinstance(prop, FormulaProperty):
        return prove_formula(prop, impl)
    return finish_family([prop], [run_family([prop], impl)])[0]


@dataclass
class ShardOutcome:
    """What one shard of a family pass found, per theorem (merged by :func:`finish_family`)."""

    checked: list[int]
    seconds: list[float]
    failures: list[tuple[int, dict[str, Any], str] | None]
    """Per theorem: (case index, witness, message) of the shard's first violation on a
    geometry vLLM builds (or without a geometry)."""
    latent: list[tuple[int, dict[str, Any], str] | None] = field(default_factory=list)
    """Per theorem: the shard's first violation on a geometry vLLM does not build (the
    search goes on past it, for a violation vLLM can reach)."""
    buildable: list[int] = field(default_factory=list)
    """Per theorem: how many of its checked cases have a geometry vLLM builds."""


def run_family(
    theorems: Sequence[CaseProperty], impl: Implementation, shard: int = 0, shards: int = 1
) -> ShardOutcome:
    """Check every case with ``index % shards == shard`` against each theorem.

    A theorem stops at its first violation on a geometry vLLM builds; since cases come
    in increasing size, the smallest failing index over all shards is the minimal
    counterexample. A violation on a geometry vLLM does not build is remembered (the
    first one) and the search goes on.
    """
    if len({id(t.space) for t in theorems}) != 1:
        raise ValueError("a family's properties must share one case space")
    outcome = ShardOutcome(
        checked=[0] * len(theorems),
        seconds=[0.0] * len(theorems),
        failures=[None] * len(theorems),
        latent=[None] * len(theorems),
        buildable=[0] * len(theorems),
    )
    open_theorems = list(range(len(theorems)))
    clock = time.perf_counter
    space = theorems[0].space
    for index, case in enumerate(space.cases()):
        if index % shards != shard:
            continue
        real = space.geometry_of is None or latent_reason(space.geometry_of(case)) is None
        for j in tuple(open_theorems):
            theorem = theorems[j]
            started = clock()
            try:
                violation = theorem.check(case, impl)
            except Exception as exc:  # a crash of the implementation is a finding too
                violation = raised(exc)
            outcome.seconds[j] += clock() - started
            outcome.checked[j] += 1
            outcome.buildable[j] += real
            if violation is None:
                continue
            if real:
                outcome.failures[j] = (index, theorem.witness(case), violation)
                open_theorems.remove(j)
            elif outcome.latent[j] is None:
                outcome.latent[j] = (index, theorem.witness(case), violation)
        if not open_theorems:
            break
    return outcome


def finish_family(
    theorems: Sequence[CaseProperty], shards: Sequence[ShardOutcome]
) -> list[TheoremResult]:
    """Merge the shards of a family pass into one result per theorem."""
    results = []
    for j, theorem in enumerate(theorems):
        count = sum(s.checked[j] for s in shards)
        failures = [f for s in shards if (f := s.failures[j]) is not None]
        if not failures:
            failures = [f for s in shards if s.latent and (f := s.latent[j]) is not None]
        result = TheoremResult(
            clause=theorem.clause,
            theorem=theorem.name,
            verdict=Verdict.PROVED_FOR_DOMAIN,
            domain=f"{theorem.domain} ({count} cases, exhaustive)",
            seconds=sum(s.seconds[j] for s in shards),
            description=theorem.description,
            queries=count,
        )
        if failures:
            _, witness, message = min(failures, key=lambda f: f[0])
            graded = theorem.grade(theorem.space.decode(witness), message)
            result.verdict = Verdict.COUNTEREXAMPLE
            result.witness = witness
            result.message = graded.message
            result.impact = graded.impact.value
            result.latent = graded.latent
            result.domain = theorem.domain
        elif count == 0:
            result.verdict = Verdict.VACUOUS
            result.message = "the domain is empty"
        result.details.append(f"{count} cases checked")
        if theorem.space.geometry_of is not None:
            real = sum(s.buildable[j] for s in shards if s.buildable)
            result.details.append(
                f"{real} of them on geometries vLLM builds, {count - real} latent-only "
                "(spec.build.buildable)")
        if theorem.family and len(theorems) > 1:
            result.details.append(
                f"checked in one pass with the {theorem.family} family ({len(shards)} shards)"
            )
        results.append(result)
    return results
