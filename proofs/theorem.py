"""How each kind of property (:mod:`kvcontract.spec.properties`) is decided.

* a :class:`~kvcontract.spec.properties.base.FormulaProperty`
  (:func:`prove_formula`) is first tried with every size symbolic (verdict PROVED); if
  the solver cannot decide it within its budget, it is case-split over the property's
  configurations (verdict PROVED-FOR-DOMAIN, the configurations printed). Operational
  implementation functions enter the statement through :meth:`SymbolicEnv.call`, which
  lifts them to terms (:mod:`kvcontract.proofs.symbolic`).
* a :class:`~kvcontract.spec.properties.base.CaseProperty` (:func:`run_family`) is
  judged on every case of its finite space (lookup-state sequences, multi-group chunk
  states, store schedules), enumerated in increasing size so the first failure is a
  minimal counterexample; the properties of one space are judged in one pass.

A counterexample is always re-executed on plain Python ints (the same statement, the
implementation called directly) before it is reported; one that does not reproduce is
reported as UNKNOWN, never as a pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from kvcontract.impl.bundle import Implementation
from kvcontract.proofs import solver as z3driver
from kvcontract.proofs.symbolic import LiftError, PathExplorer, has_symbolic
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.spec.arith import Bool, Num
from kvcontract.spec.properties.base import (
    CaseProperty,
    Env,
    FormulaProperty,
    Property,
    latent_reason,
    raised,
)
from kvcontract.spec.properties.unbounded import InductiveProperty, NotAFold


class SymbolicEnv(Env):
    """The variables of one query as Z3 terms (some may be concrete ints)."""

    def __init__(self, values: Mapping[str, Num]) -> None:
        super().__init__(values)
        self.assumptions: list[z3.BoolRef] = []

    @property
    def symbolic(self) -> bool:
        return any(isinstance(v, z3.ExprRef) for v in self.values.values())

    def assume(self, hypotheses: Sequence[Bool]) -> None:
        """Hypotheses that prune the paths of lifted functions."""
        self.assumptions.extend(h for h in hypotheses if isinstance(h, z3.BoolRef))

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
    env = SymbolicEnv({**fixed, **{str(v): v for v in variables}})
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
    outcome = z3driver.prove(hyps, goal_term, variables, rlimit=rlimit)
    return outcome, hyps, goal_term, variables


def _decide(prop: FormulaProperty, impl: Implementation, result: TheoremResult) -> None:
    # A counterexample on a geometry vLLM does not build is kept aside (``latent``) while
    # the rest of the domain is searched for one that vLLM builds: the latter decides the
    # verdict's impact, the former is reported only when nothing else is found.
    latent: tuple[dict[str, int], str, str] | None = None
    if prop.symbolic_sizes:
        free = list(prop.symbolic_sizes) + list(prop.variables)
        outcome, hyps, goal, variables = _query(prop, impl, {}, free, prop.symbolic_rlimit)
        result.queries += 1
        result.rlimit_used += outcome.rlimit_used
        if outcome.status is z3driver.QueryStatus.PROVED:
            result.verdict = Verdict.PROVED
            result.domain = "all values (" + ", ".join(free) + " unbounded)"
            if isinstance(prop, InductiveProperty) and prop.induction:
                result.domain += "; by " + prop.induction
            return
        if outcome.status is z3driver.QueryStatus.VACUOUS:
            result.verdict = Verdict.VACUOUS
            result.domain = "all values"
            result.message = outcome.reason
            return
        found = None
        if outcome.status is z3driver.QueryStatus.REFUTED and outcome.model is not None:
            found = _counterexample(prop, impl, result, {}, hyps, goal, variables,
                                    outcome.model)
            if found is not None and prop.grade(*found).latent is None:
                _fill(prop, result, found[0], found[1], "all values")
                return
        result.details.append(
            f"symbolic sizes: {outcome.status.value} within rlimit {prop.symbolic_rlimit}"
            + (f" ({outcome.reason})" if outcome.reason else "")
            + ("; its counterexample needs a geometry vLLM does not build"
               if found is not None else "")
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
            if latent is None:
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


def _counterexample(
    prop: FormulaProperty,
    impl: Implementation,
    result: TheoremResult,
    fixed: Mapping[str, int],
    hyps: Sequence[Bool],
    goal: Bool,
    variables: list[z3.ArithRef],
    model: dict[str, int],
) -> tuple[dict[str, int], str] | None:
    """Minimize a model and re-execute it on ints: ``(values, violation)``, or None (and
    ``result`` UNKNOWN) when it does not replay."""
    goal_term = z3.BoolVal(goal) if isinstance(goal, bool) else goal
    hyp_terms = [h for h in hyps if isinstance(h, z3.BoolRef)]
    small, used = z3driver.minimize(hyp_terms, goal_term, variables, model, _rlimit(prop))
    result.rlimit_used += used
    values = {**fixed, **small}
    replay = prop.violation(values, impl)
    if replay is None:
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
