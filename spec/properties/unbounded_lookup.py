"""Unbounded multi-group lookup theorems: the loop's step, once, for every state.

``impl/scheduler.lookup_complete_chunks`` is a fold driver over the implementation's
step (:func:`kvcontract.impl.reference.multigroup_lookup_step`, the bundle's
``multigroup_lookup_step``): one group's turn at the current ``maxhit``. The driver only
orders the turns (FA, then SWA by window descending, then Mamba; a shrink restarts the
order), records them (trace, pops) and drops every other group's flags when ``maxhit``
changes. The theorems here lift the step with everything symbolic (``maxhit``, the local
hit, the group's chunk ``tpc = bs * bpc``, its key count, EAGLE, Mamba, its flags and
the scan's answers) and prove, in one query each, what every turn keeps; by induction
over the turns the loop's properties hold for every number of groups and every size.

The group's scan is not lifted (its loop runs over keys): it enters as its answers,
constrained only by the per-group lemma the scanner theorems prove (docs/CONTRACT.md
4.5 and C2): the plain scan of keys ``[start, stop)`` at boundary ``at`` answers None or
an end index ``x <= stop`` whose window answered HIT throughout, so every chunk the group
reads at the boundary that window serves, ``min(at, (x - eagle) * tpc)``, is HIT
(``H``: ``C3/scan-refines-spec``, ``C4/prefix-refines-spec``,
``C2/first-run-covers-load``, ``C2/later-run-covers-load``); the present-counting scan
answers None or anything. ``H`` is uninterpreted: known at the points a turn touches
(the boundary the answer serves, the boundary before the turn) and false elsewhere,
the worst case, so a proof holds for every ``H``. Answers the real scans cannot give
are allowed too: the abstract scan does all a real one does, and more.

On plain ints (a counterexample's replay, a reproducer) the same statement runs the
step with a scan that answers the witness's values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcontract.impl import reference
from kvcontract.impl.bundle import Implementation
from kvcontract.spec.arith import (
    Bool,
    Num,
    and_,
    cdiv,
    floordiv,
    implies,
    in_range,
    ite,
    ite_bool,
    mod,
    not_,
    or_,
)
from kvcontract.spec.lemmas import GeneralLemma
from kvcontract.spec.properties.base import HYPOTHESES_ONLY, Config, Env, FormulaProperty
from kvcontract.spec.properties.unbounded import InductiveProperty

# The step's codes as the fold driver reads them (impl/scheduler.lookup_complete_chunks).
GOES_ON = reference.LOOKUP_GOES_ON
ENDED_CODES = (reference.LOOKUP_GOES_ON, reference.LOOKUP_NO_CHUNK,
               reference.LOOKUP_NOTHING_BEYOND)


def abstract_turn(
    step: Callable[..., tuple[Any, ...]],
    max_hit: Any, confirmed: Any, deferred: Any, local_hit: Any, tpc: Any, keys: Any,
    eagle: Any, mamba: Any, first: Any, first_answers: Any, second: Any, second_answers: Any,
) -> tuple[Any, ...]:
    """The step with the scan replaced by its lemma: the plain scan answers ``first`` when
    ``first_answers`` (its window all HIT) and ``first`` does not pass the end of the
    keys the step asks for, else None; the present-counting scan answers ``second`` when
    ``second_answers``. Run as a whole, so a step that scans the wrong keys gets the
    answers those keys allow."""

    def scan(start: Any, stop: Any, at: Any, present_view: bool) -> Any:
        # Only the bound the theorems rely on is checked (an answer past ``stop`` would
        # claim keys the scan never looked up); every other answer is allowed, so the
        # abstract scan can do all a real one can, and more.
        del start, at
        if present_view:
            return second if second_answers else None
        if first_answers and first <= stop:
            return first
        return None

    return step(max_hit, confirmed, deferred, local_hit, tpc, keys, eagle, mamba, scan)


def _flag(env: Env, name: str) -> tuple[Bool, Bool]:
    """A truth value carried as a 0/1 integer variable: (its domain, the value)."""
    value = env[name]
    return in_range(value, 0, 2), value == 1


# -- the chunk arithmetic, linear ----------------------------------------------------------
# With the chunk size symbolic, ``q * tpc``, ``d // tpc`` and ``d % tpc`` are nonlinear,
# and Z3 needs seconds for what is linear reasoning once each of them is an atom. So in a
# lift the step gets ``tpc`` as a symbolic integer that turns each such term into a fresh
# atom, and the query gets the facts of floor division that relate the atoms (each an
# instance of a schema valid for every tpc >= 1: FACT_SCHEMAS, proved by Z3 in the tests).
# Replacing terms by atoms only forgets (a proof over atoms holds for the terms). A model
# the real arithmetic does not allow does not replay on ints: the prover then fixes the
# sizes to the model's (``refine_sizes``) and searches again, where tpc is a number and
# the arithmetic exact, so a counterexample it reports is real (measured: with the
# atoms' definitions in the query instead, every proof took 8x longer).
class _Atoms:
    """The atoms of one query: ``kind -> [(operand, atom)]`` and the chunk size."""

    def __init__(self, tpc: Any) -> None:
        self.tpc = tpc
        self.made: dict[tuple[str, int], tuple[Any, Any]] = {}

    def atom(self, kind: str, operand: Any) -> Any:
        import z3

        key = (kind, operand.get_id())
        if key not in self.made:
            self.made[key] = (operand, z3.Int(f"tpc_{kind}{len(self.made)}"))
        return self.made[key][1]

    def of(self, kind: str) -> list[tuple[Any, Any]]:
        return [pair for (k, _), pair in self.made.items() if k == kind]

    def facts(self) -> list[Bool]:
        """Every instance of :data:`FACT_SCHEMAS` over the atoms."""
        t = self.tpc
        products, floors, mods = self.of("mul"), self.of("div"), self.of("mod")
        facts: list[Bool] = []
        for q, p in products:
            for d, f in floors:
                facts += [fact_product_floor(q, p, d, f), fact_product_ceil(q, p, d, f)]
                if d.eq(p):
                    facts.append(f == q)
                elif d.eq(-p):
                    facts.append(f == -q)
                for md, m in mods:
                    if md.eq(d):
                        facts.append(fact_product_mod(q, p, d, f, m))
            for md, m in mods:
                if md.eq(p):
                    facts.append(m == 0)
        for _, m in mods:
            facts.append(and_(m >= 0, m < t))
        for d1, f1 in floors:
            for d2, f2 in floors:
                if not d1.eq(d2):
                    facts.append(fact_floor_monotone(d1, f1, d2, f2))
        return facts


def fact_product_floor(q: Num, p: Num, d: Num, f: Num) -> Bool:
    """``p = q * t``, ``f = d // t``: ``q * t <= d`` iff ``q <= d // t``."""
    return (p <= d) == (q <= f)


def fact_product_ceil(q: Num, p: Num, d: Num, f: Num) -> Bool:
    """``p = q * t``, ``f = d // t``: ``q * t < -d`` iff ``q < cdiv(-d, t) = -f``."""
    return (p < -d) == (q < -f)


def fact_product_mod(q: Num, p: Num, d: Num, f: Num, m: Num) -> Bool:
    """``p = q * t``, ``f = d // t``, ``m = d % t``: ``q = d // t`` gives ``q * t = d - m``."""
    return implies(q == f, p == d - m)


def fact_floor_monotone(d1: Num, f1: Num, d2: Num, f2: Num) -> Bool:
    """``f1 = d1 // t``, ``f2 = d2 // t``: a larger quotient has a larger dividend."""
    return implies(f1 > f2, d1 > d2)


FACT_SCHEMAS: tuple[Callable[..., Bool], ...] = (
    fact_product_floor, fact_product_ceil, fact_product_mod, fact_floor_monotone)
"""The facts of floor division the queries use, by schema (``tests`` prove each valid
for every ``t >= 1``, with ``p = q * t``, ``f = d // t``, ``m = d % t``); the exact
ones (``(q * t) // t = q``, ``(-(q * t)) // t = -q``, ``(q * t) % t = 0``,
``0 <= d % t < t``) are written inline."""


def _division_facts_hold(q: Num, d: Num, d2: Num, t: Num) -> Bool:
    p, f, f2, m = q * t, floordiv(d, t), floordiv(d2, t), mod(d, t)
    return implies(t >= 1, and_(
        fact_product_floor(q, p, d, f), fact_product_ceil(q, p, d, f),
        fact_product_mod(q, p, d, f, m), fact_floor_monotone(d, f, d2, f2),
        floordiv(p, t) == q, floordiv(-p, t) == -q, mod(p, t) == 0, m >= 0, m < t))


CHUNK_DIVISION_FACTS = GeneralLemma(
    "chunk-division-facts", 4, _division_facts_hold,
    "every schema of FACT_SCHEMAS and the exact facts, for every t >= 1")
"""What the lookup-step theorems instantiate over their atoms: proved for all values by
the prover before each of them (:meth:`Env.requires`)."""


def _purifying_chunk(atoms: _Atoms) -> Any:
    """``tpc`` as the lift's symbolic integer whose products, quotients and remainders
    are the atoms of ``atoms`` (a subclass, so Python asks it first: ``q * tpc``)."""
    from kvcontract.spec.symbolic import SymInt  # the prover's own integers

    def operand(value: Any) -> Any:
        import z3

        return value.term if isinstance(value, SymInt) else z3.IntVal(int(value))

    class ChunkTokens(SymInt):
        __slots__ = ()

        def __mul__(self, other: Any) -> SymInt:
            return SymInt(atoms.atom("mul", operand(other)))

        __rmul__ = __mul__

        def __rfloordiv__(self, other: Any) -> SymInt:
            return SymInt(atoms.atom("div", operand(other)))

        def __rmod__(self, other: Any) -> SymInt:
            return SymInt(atoms.atom("mod", operand(other)))

    return ChunkTokens(atoms.tpc)


class _Turn:
    """The variables of one turn, its hypotheses, and the step's outcomes: one on ints;
    in a symbolic query one per path of the step, each with its path condition (a goal
    per path is a small query; the step's results as one ``If`` tree make every goal
    search the whole tree: measured 70x slower)."""

    def __init__(self, env: Env, impl: Implementation, extra: list[Bool]) -> None:
        self.max_hit, self.local, self.tpc, self.keys = env["M"], env["L"], env["tpc"], env["keys"]
        self.eagle, self.first, self.second = env["eagle"], env["x1"], env["x2"]
        domains: list[Bool] = []
        flags: dict[str, Bool] = {}
        for name in ("mamba", "conf", "dfr", "a1", "h1", "a2", "hM"):
            domain, flags[name] = _flag(env, name)
            domains.append(domain)
        self.mamba, self.confirmed, self.deferred = flags["mamba"], flags["conf"], flags["dfr"]
        self.first_hit, self.hit_before = flags["h1"], flags["hM"]
        self.first_answers = and_(flags["a1"], flags["h1"])
        self.second_answers = flags["a2"]
        self.hyps: list[Bool] = [
            self.tpc >= 1, self.local >= 0, self.keys >= 0, in_range(self.eagle, 0, 2),
            *domains, not_(and_(self.eagle == 1, self.mamba)),
            # The loop's invariant before the turn (C6): a confirmation is HIT-backed or
            # deferred, a deferral is a confirmation, and both lie beyond the local hit.
            implies(self.confirmed, or_(self.hit_before, self.deferred)),
            implies(self.deferred, self.confirmed),
            implies(self.confirmed, self.max_hit > self.local),
            *extra,
        ]
        self.atoms: _Atoms | None = None
        self.outcomes: list[tuple[Bool, tuple[Any, ...]]] = []
        self._served: dict[Any, Num] = {}
        if impl is HYPOTHESES_ONLY:
            return
        env.assume(self.hyps)
        step = impl.multigroup_lookup_step
        args = (self.max_hit, self.confirmed, self.deferred, self.local, self.tpc, self.keys,
                self.eagle, self.mamba, self.first, self.first_answers, self.second,
                self.second_answers)
        if env.symbolic:
            # Enumerated here, not lifted through env.call: its lifts stand placeholders
            # for the arguments (the atoms' facts must name the statement's variables),
            # and a goal per path is what keeps the query small.
            from kvcontract.spec.symbolic import PathExplorer

            chunk = self.tpc
            if not isinstance(self.tpc, int):
                # A concrete chunk (a refinement, a case split) keeps the arithmetic exact
                # and linear; a symbolic one becomes atoms.
                self.atoms = _Atoms(self.tpc)
                chunk = _purifying_chunk(self.atoms)
                env.requires(CHUNK_DIVISION_FACTS)  # what the atoms' facts instantiate
            self.outcomes = PathExplorer().paths(
                abstract_turn, [step, *args[:4], chunk, *args[5:]])
        else:
            self.outcomes = [(True, env.call(abstract_turn, step, *args))]

    def served(self, scanned_at: Any) -> Num:
        """The boundary the plain scan's answer serves (the lemma's ``H(x1)``): the scanned
        boundary, or the end of the chunk before the window's end (an EAGLE window's last
        chunk is its peek chunk). In a symbolic query the step's own atom: its operand is
        ``x1 - 1`` or ``x1 - 0``, as the step subtracts."""
        if self.atoms is None:
            below = (self.first - self.eagle) * self.tpc
            return ite(scanned_at <= below, scanned_at, below)
        key = scanned_at.get_id()  # a Z3 term here; the paths share a few boundaries
        if key not in self._served:
            below = ite(self.eagle == 1, self.atoms.atom("mul", self.first - 1),
                        self.atoms.atom("mul", self.first - 0))
            self._served[key] = ite(scanned_at <= below, scanned_at, below)
        return self._served[key]

    def cdiv(self, tokens: Num) -> Num:
        if self.atoms is None:
            return cdiv(tokens, self.tpc)
        return -self.atoms.atom("div", -tokens)

    def floordiv(self, tokens: Num) -> Num:
        if self.atoms is None:
            return floordiv(tokens, self.tpc)
        return self.atoms.atom("div", tokens)

    def hit_at(self, boundary: Num, scanned_at: Num) -> Bool:
        """``H`` at ``boundary``: known where the scan's answer serves and at the boundary
        before the turn, false elsewhere (the worst case); where both points coincide,
        ``consistent`` gives them one value."""
        return ite_bool(boundary == self.served(scanned_at), self.first_hit,
                        ite_bool(boundary == self.max_hit, self.hit_before, False))

    def consistent(self, scanned_at: Num) -> Bool:
        return implies(self.served(scanned_at) == self.max_hit,
                       self.first_hit == self.hit_before)

    def goal(self, per_outcome: Callable[..., Bool]) -> Bool:
        """``per_outcome(after, confirmed, deferred, scanned_at, ended, popped)`` on every
        outcome, under the facts of the atoms it made. Paths with the same results share
        one goal (124 paths of the reference's step have 40 distinct results)."""
        conditions: dict[tuple[Any, ...], list[Bool]] = {}
        results: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for condition, outcome in self.outcomes:
            key = tuple(_identity(value) for value in outcome)
            conditions.setdefault(key, []).append(condition)
            results[key] = outcome
        goals = [implies(or_(*conditions[key]), per_outcome(*results[key]))
                 for key in results]
        facts = [] if self.atoms is None else self.atoms.facts()
        return implies(and_(*facts), and_(*goals))


def _identity(value: Any) -> Any:
    """A Z3 term by its (hash-consed) id, a plain value as itself."""
    get_id = getattr(value, "get_id", None)
    return ("term", get_id()) if get_id is not None else ("value", value)


def lookup_step_converges(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """C6, one turn of any group from any state of the loop: ``maxhit`` never grows; a
    turn either leaves a confirmed group alone, confirms the group at ``maxhit``, defers
    there, or strictly lowers ``maxhit``; a turn that does not end the lookup leaves it
    beyond the local hit; and the invariant holds after it (every confirmation at the
    new ``maxhit`` is backed by a window all HIT, or deferred), so a boundary every
    group confirmed without deferring reads only HIT chunks (C2 at the final N)."""
    turn = _Turn(env, impl, [])
    before = turn.max_hit

    def holds(after: Num, confirmed: Bool, deferred: Bool, at: Num, ended: Num,
              popped: Bool) -> Bool:
        goes_on = ended == GOES_ON
        never_grows = and_(after <= at, at <= before)
        skips = implies(turn.confirmed, and_(after == before, confirmed,
                                             deferred == turn.deferred, goes_on,
                                             not_(popped)))
        ranks = implies(and_(not_(turn.confirmed), goes_on),
                        or_(after < before, and_(after == before, confirmed)))
        beyond_local = implies(goes_on, after > turn.local)
        invariant = implies(goes_on, and_(
            implies(confirmed, or_(turn.hit_at(after, at), deferred)),
            implies(deferred, confirmed)))
        return implies(turn.consistent(at), and_(
            never_grows, skips, ranks, beyond_local, invariant,
            or_(*(ended == code for code in ENDED_CODES))))

    return turn.hyps, turn.goal(holds)


def eagle_step_peeks_once(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """C5, one turn of any group from any state: only an EAGLE group pops, only after
    scanning through its peek chunk ``cdiv(at, tpc)`` (whose key must exist), and each
    pop is at a boundary strictly below every earlier pop of the group (at most one pop
    per boundary); a window that is complete through the peek chunk confirms the
    boundary with one pop; and the window behind a confirmation ends at the peek chunk
    of the confirmed boundary, so the load range (which ends at ``cdiv(N, tpc)``,
    ``C2/first-run-covers-load``) never includes the peek chunk."""
    popped_dom, popped_before = _flag(env, "hp")
    last_pop = env["P"]
    turn = _Turn(env, impl, [
        popped_dom,
        # Every earlier pop was at a larger boundary, or at this one, which the group
        # then confirmed (a pop confirms or shrinks).
        implies(popped_before, or_(last_pop > env["M"],
                                   and_(last_pop == env["M"], env["conf"] == 1)))])
    eagle = turn.eagle

    def holds(after: Num, confirmed: Bool, deferred: Bool, at: Num, ended: Num,
              popped: Bool) -> Bool:
        goes_on = ended == GOES_ON
        peek = turn.cdiv(at)
        only_eagle_pops = implies(popped, and_(eagle == 1, not_(turn.confirmed),
                                               peek + 1 <= turn.keys))
        once = implies(popped, or_(not_(popped_before), at < last_pop))
        last_after = ite(popped, at, last_pop)
        still = implies(and_(or_(popped_before, popped), goes_on),
                        or_(last_after > after, and_(last_after == after, confirmed)))
        complete = and_(eagle == 1, not_(turn.confirmed), turn.first_answers,
                        turn.first == peek + 1, peek + 1 <= turn.keys,
                        turn.floordiv(at) > turn.floordiv(turn.local))
        confirms_with_one_pop = implies(complete, and_(after == at, confirmed, popped,
                                                       goes_on))
        window_at_peek = implies(
            and_(goes_on, not_(turn.confirmed), confirmed, not_(deferred)),
            and_(turn.first_answers, turn.first == turn.cdiv(after) + eagle))
        return and_(only_eagle_pops, once, still, confirms_with_one_pop, window_at_peek)

    return turn.hyps, turn.goal(holds)


def chunk_division_facts(env: Env, impl: Implementation) -> tuple[list[Bool], Bool]:
    """Every schema of :data:`FACT_SCHEMAS` (and the exact facts written inline) for every
    chunk size ``t >= 1`` and all integers: what the lookup-step theorems may assume. A
    statement the tests prove (in the catalogue it would cost a query per theorem run
    for facts that never change)."""
    del impl
    t = env["t"]
    return [t >= 1], _division_facts_hold(env["q"], env["d"], env["d2"], t)


# -- the catalogue -------------------------------------------------------------------------
TURN_VARIABLES = ("M", "L", "keys", "conf", "dfr", "x1", "a1", "h1", "x2", "a2", "hM")
INDUCTION = (
    "induction over the loop's turns (impl/scheduler.lookup_complete_chunks folds the "
    "bundle's multigroup_lookup_step over the groups and drops the other groups' flags "
    "when maxhit changes), for every number of groups, every chunk tpc = bs * bpc >= 1, "
    "EAGLE and Mamba groups (a Mamba group is not EAGLE); the scan enters as its "
    "answers under the per-group lemma (an answer never passes the end of the scanned "
    "keys, and a plain scan's answer is a window all HIT: C3/scan-refines-spec, "
    "C4/prefix-refines-spec, C2/first-run-covers-load, C2/later-run-covers-load), with "
    "H uninterpreted; the chunk arithmetic as atoms related by the floor-division facts "
    "FACT_SCHEMAS (the general lemma chunk-division-facts, proved for every tpc >= 1 "
    "before each query)"
)


def _kinds() -> list[Config]:
    """The case split if the symbolic query were undecided: small chunks, each kind."""
    return [Config(f"tpc={tpc}, eagle={eagle}, mamba={mamba}",
                   {"tpc": tpc, "eagle": eagle, "mamba": mamba})
            for tpc in (1, 2, 4, 8) for eagle in (0, 1) for mamba in (0, 1)
            if not (eagle and mamba)]


def unbounded_lookup_properties() -> list[FormulaProperty]:
    return [
        InductiveProperty(
            "C5", "eagle-step-peeks-once",
            "one turn of the multi-group lookup pops only for an EAGLE group that scanned "
            "through its peek chunk, strictly below every earlier pop (once per boundary), "
            "and confirms only a window ending at the peek chunk of the boundary",
            (*TURN_VARIABLES, "hp", "P"), eagle_step_peeks_once, _kinds,
            "tpc in {1, 2, 4, 8}, each kind", uses=("multigroup_lookup_step",),
            symbolic_sizes=("tpc", "eagle", "mamba"), refine_sizes=("tpc", "eagle", "mamba"),
            induction=INDUCTION + "; the central theorem of C5",
        ),
        InductiveProperty(
            "C6", "lookup-step-converges",
            "one turn of the multi-group lookup never raises maxhit, confirms, defers or "
            "strictly lowers it, stays beyond the local hit, and keeps every confirmation "
            "at maxhit backed by a window all HIT (or deferred)",
            TURN_VARIABLES, lookup_step_converges, _kinds,
            "tpc in {1, 2, 4, 8}, each kind", uses=("multigroup_lookup_step",),
            symbolic_sizes=("tpc", "eagle", "mamba"), refine_sizes=("tpc", "eagle", "mamba"),
            induction=INDUCTION + "; the central theorem of C6 (ranking: (maxhit, groups "
            "not confirmed at it) falls lexicographically at every turn that does not "
            "skip, so the loop ends within (distinct maxhit values) x (groups) turns)",
        ),
    ]


__all__ = [
    "FACT_SCHEMAS",
    "abstract_turn",
    "chunk_division_facts",
    "eagle_step_peeks_once",
    "lookup_step_converges",
    "unbounded_lookup_properties",
]

