"""Theorem kinds and how each is decided.

* :class:`Z3Theorem` - an arithmetic statement over unbounded integers. It is first
  tried with every size symbolic (verdict PROVED); if the solver cannot decide it within
  its budget, it is case-split over the theorem's configurations (verdict
  PROVED-FOR-DOMAIN, the configurations printed). Operational implementation functions
  enter the statement through :meth:`Env.call`, which lifts them to terms
  (:mod:`kvcontract.proofs.symbolic`).
* :class:`ExhaustiveTheorem` - a property checked on every case of a finite domain
  (lookup-state sequences, multi-group chunk states, store schedules), enumerated in
  increasing size so the first failure is a minimal counterexample.

A counterexample is always re-executed on plain Python ints (the same statement, the
implementation called directly) before it is reported; one that does not reproduce is
reported as UNKNOWN, never as a pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3
from kvcontract.impl.bundle import Implementation
from kvcontract.proofs import solver as z3driver
from kvcontract.proofs.symbolic import LiftError, PathExplorer, has_symbolic
from kvcontract.proofs.verdicts import TheoremResult, Verdict
from kvcontract.spec.arith import Bool, Num


class Env:
    """The variables of one query: Z3 terms (symbolic) or ints (concrete)."""

    def __init__(self, values: Mapping[str, Num]) -> None:
        self.values = dict(values)
        self.assumptions: list[z3.BoolRef] = []

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

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


Statement = Callable[[Env, Implementation], tuple[list[Bool], Bool]]


@dataclass(frozen=True)
class Config:
    """Concrete parameters of one case of a case split."""

    label: str
    values: Mapping[str, int]


@dataclass
class Z3Theorem:
    clause: str
    name: str
    description: str
    variables: tuple[str, ...]
    """Unbounded integer variables (always symbolic)."""
    statement: Statement
    configs: Callable[[], list[Config]]
    domain: str
    """The case split in words, e.g. ``bs in {4..1648}, bpc in {1,2,4,8,16}``."""
    symbolic_sizes: tuple[str, ...] = ()
    """Size parameters to try symbolically first (PROVED for all values if it works)."""
    symbolic_rlimit: int = 3_000_000
    rlimit: int = z3driver.DEFAULT_RLIMIT
    kind: str = "z3"

    @property
    def theorem_id(self) -> str:
        return f"{self.clause}/{self.name}"

    def run(self, impl: Implementation) -> TheoremResult:
        started = time.perf_counter()
        result = TheoremResult(
            clause=self.clause,
            theorem=self.name,
            verdict=Verdict.UNKNOWN,
            domain="",
            seconds=0.0,
            description=self.description,
        )
        try:
            self._decide(impl, result)
        except LiftError as exc:
            result.verdict = Verdict.UNKNOWN
            result.message = f"the implementation could not be lifted: {exc}"
        result.seconds = time.perf_counter() - started
        return result

    def _query(
        self, impl: Implementation, fixed: Mapping[str, int], free: Sequence[str], rlimit: int
    ) -> tuple[z3driver.QueryOutcome, list[Bool], Bool, list[z3.ArithRef]]:
        variables = [z3.Int(name) for name in free]
        env = Env({**fixed, **{str(v): v for v in variables}})
        hypotheses, goal = self.statement(env, impl)
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

    def _decide(self, impl: Implementation, result: TheoremResult) -> None:
        if self.symbolic_sizes:
            free = list(self.symbolic_sizes) + list(self.variables)
            outcome, hyps, goal, variables = self._query(impl, {}, free, self.symbolic_rlimit)
            result.queries += 1
            result.rlimit_used += outcome.rlimit_used
            if outcome.status is z3driver.QueryStatus.PROVED:
                result.verdict = Verdict.PROVED
                result.domain = "all values (" + ", ".join(free) + " unbounded)"
                return
            if outcome.status is z3driver.QueryStatus.VACUOUS:
                result.verdict = Verdict.VACUOUS
                result.domain = "all values"
                result.message = outcome.reason
                return
            if (
                outcome.status is z3driver.QueryStatus.REFUTED
                and outcome.model is not None
                and self._report_counterexample(
                    impl, result, {}, hyps, goal, variables, outcome.model
                )
            ):
                return
            result.details.append(
                f"symbolic sizes: {outcome.status.value} within rlimit {self.symbolic_rlimit}"
                + (f" ({outcome.reason})" if outcome.reason else "")
                + "; case split instead"
            )
        configs = self.configs()
        vacuous = 0
        for config in configs:
            outcome, hyps, goal, variables = self._query(
                impl, config.values, self.variables, self.rlimit
            )
            result.queries += 1
            result.rlimit_used += outcome.rlimit_used
            if outcome.status is z3driver.QueryStatus.VACUOUS:
                vacuous += 1
                continue
            if outcome.status is z3driver.QueryStatus.UNKNOWN:
                result.verdict = Verdict.UNKNOWN
                result.domain = self.domain
                result.message = f"Z3 said unknown for {config.label}: {outcome.reason}"
                return
            if outcome.status is z3driver.QueryStatus.REFUTED and outcome.model is not None:
                self._report_counterexample(
                    impl,
                    result,
                    config.values,
                    hyps,
                    goal,
                    variables,
                    outcome.model,
                    label=config.label,
                )
                return
        if vacuous == len(configs):
            result.verdict = Verdict.VACUOUS
            result.domain = self.domain
            result.message = "the hypotheses are unsatisfiable for every configuration"
            return
        result.verdict = Verdict.PROVED_FOR_DOMAIN
        result.domain = f"{self.domain}; {', '.join(self.variables)} unbounded"
        if vacuous:
            result.details.append(f"{vacuous} configurations have no admissible values")

    def _report_counterexample(
        self,
        impl: Implementation,
        result: TheoremResult,
        fixed: Mapping[str, int],
        hyps: Sequence[Bool],
        goal: Bool,
        variables: list[z3.ArithRef],
        model: dict[str, int],
        label: str = "",
    ) -> bool:
        """Minimize, re-execute on ints, and fill ``result``. False if it did not replay."""
        goal_term = z3.BoolVal(goal) if isinstance(goal, bool) else goal
        hyp_terms = [h for h in hyps if isinstance(h, z3.BoolRef)]
        small, used = z3driver.minimize(hyp_terms, goal_term, variables, model, self.rlimit)
        result.rlimit_used += used
        values = {**fixed, **small}
        replay = self.replay(impl, values)
        if replay is None:
            result.verdict = Verdict.UNKNOWN
            result.message = (
                f"solver model {values} did not reproduce on plain Python ints "
                "(an encoding gap, not a verdict)"
            )
            return False
        result.verdict = Verdict.COUNTEREXAMPLE
        result.domain = label or "all values"
        result.witness = {"kind": "arith", "theorem": self.theorem_id, "values": values}
        result.message = replay
        return True

    def replay(self, impl: Implementation, values: Mapping[str, int]) -> str | None:
        """Re-execute on ints: a message if the hypotheses hold and the goal fails."""
        env = Env(values)
        hypotheses, goal = self.statement(env, impl)
        if not all(bool(h) for h in hypotheses):
            return None
        if bool(goal):
            return None
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        return f"{self.description} fails for {shown}"


@dataclass
class ExhaustiveTheorem:
    clause: str
    name: str
    description: str
    cases: Callable[[], Iterable[Any]]
    """Cases in increasing size, each JSON-serializable via ``case_to_json``."""
    check: Callable[[Any, Implementation], str | None]
    """A violation message, or None when the case satisfies the property."""
    domain: str
    case_to_json: Callable[[Any], dict[str, Any]] = field(default=lambda case: {"case": case})
    kind: str = "exhaustive"
    family: str = ""
    """Theorems of one family enumerate the same cases; the runner checks them in one
    pass (and in shards), so evaluations their checks memoize per case (the
    implementation's lookup, the spec's answer) are computed once, not once per clause."""

    @property
    def theorem_id(self) -> str:
        return f"{self.clause}/{self.name}"

    def run(self, impl: Implementation) -> TheoremResult:
        return finish_family([self], [run_family([self], impl)])[0]

    def replay(self, impl: Implementation, case: Any) -> str | None:
        return self.check(case, impl)


@dataclass
class ShardOutcome:
    """What one shard of a family pass found, per theorem (merged by :func:`finish_family`)."""

    checked: list[int]
    seconds: list[float]
    failures: list[tuple[int, dict[str, Any], str] | None]
    """Per theorem: (case index, witness, message) of the shard's first violation."""


def run_family(
    theorems: Sequence[ExhaustiveTheorem], impl: Implementation, shard: int = 0, shards: int = 1
) -> ShardOutcome:
    """Check every case with ``index % shards == shard`` against each theorem.

    A theorem stops at its first violation; since cases come in increasing size, the
    smallest failing index over all shards is the minimal counterexample.
    """
    if len({id(t.cases) for t in theorems}) != 1:
        raise ValueError("a family's theorems must share one case enumeration")
    outcome = ShardOutcome(
        checked=[0] * len(theorems),
        seconds=[0.0] * len(theorems),
        failures=[None] * len(theorems),
    )
    open_theorems = list(range(len(theorems)))
    clock = time.perf_counter
    for index, case in enumerate(theorems[0].cases()):
        if index % shards != shard:
            continue
        for j in tuple(open_theorems):
            theorem = theorems[j]
            started = clock()
            try:
                violation = theorem.check(case, impl)
            except Exception as exc:  # a crash of the implementation is a finding too
                violation = f"the implementation raised {type(exc).__name__}: {exc}"
            outcome.seconds[j] += clock() - started
            outcome.checked[j] += 1
            if violation is not None:
                witness = {
                    "kind": "exhaustive",
                    "theorem": theorem.theorem_id,
                    **theorem.case_to_json(case),
                }
                outcome.failures[j] = (index, witness, violation)
                open_theorems.remove(j)
        if not open_theorems:
            break
    return outcome


def finish_family(
    theorems: Sequence[ExhaustiveTheorem], shards: Sequence[ShardOutcome]
) -> list[TheoremResult]:
    """Merge the shards of a family pass into one result per theorem."""
    results = []
    for j, theorem in enumerate(theorems):
        count = sum(s.checked[j] for s in shards)
        failures = [f for s in shards if (f := s.failures[j]) is not None]
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
            result.verdict = Verdict.COUNTEREXAMPLE
            result.witness = witness
            result.message = message
            result.domain = theorem.domain
        elif count == 0:
            result.verdict = Verdict.VACUOUS
            result.message = "the domain is empty"
        result.details.append(f"{count} cases checked")
        if theorem.family and len(theorems) > 1:
            result.details.append(
                f"checked in one pass with the {theorem.family} family ({len(shards)} shards)"
            )
        results.append(result)
    return results


Theorem = Z3Theorem | ExhaustiveTheorem
