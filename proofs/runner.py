"""The prover: select theorems, run them for an implementation, collect results.

Theorems are independent, so they run in parallel worker processes (one per core by
default), each unit of work in a fresh child (:mod:`kvcontract.proofs.pool`: a
theorem's verdict never depends on what its worker proved before). Each child runs
theorems of the catalogue by index, so nothing but indices and :class:`TheoremResult`
objects cross process boundaries.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcontract.errors import UsageError
from kvcontract.impl.variants import get_implementation
from kvcontract.proofs.cache import ProofCache
from kvcontract.proofs.pool import TaskRunner
from kvcontract.proofs.shards import Shard, partition, selection_digest, shard_section
from kvcontract.proofs.theorem import (
    ShardOutcome,
    finish_family,
    run_family,
    run_property,
)
from kvcontract.proofs.verdicts import TheoremResult
from kvcontract.spec.clauses import get_clause
from kvcontract.spec.geometry import Geometry
from kvcontract.spec.properties import CaseProperty, FormulaProperty, Property, properties
from kvcontract.vocabulary import DEFAULT_FAIL_ON, EXIT_FINDING, Impact, finding_exit_code

Scope = tuple[tuple[str, Geometry], ...]
"""``(label, geometry)`` pairs a run is scoped to (``--model``/``--geometry``);
empty: the full catalogue (:mod:`kvcontract.spec.properties.scoped`)."""


def catalog(scope: Scope = ()) -> list[Property]:
    """Every property, in clause order (:func:`kvcontract.spec.properties.properties`);
    with a ``scope``, the catalogue on those geometries
    (:func:`kvcontract.spec.properties.scoped.scoped_properties`)."""
    if scope:
        from kvcontract.spec.properties.scoped import scoped_properties

        return list(scoped_properties(scope))
    return list(properties())


def select(clauses: Sequence[str] | None, scope: Scope = ()) -> list[int]:
    """Indices into :func:`catalog` for the requested clauses (validated)."""
    wanted = {get_clause(c).id for c in clauses} if clauses else None
    if wanted is not None:
        for clause_id in wanted:
            if get_clause(clause_id).proved_by != "prover":
                raise UsageError(
                    f"{clause_id} is checked by executing the system, not by the prover; "
                    "run `kvcontract fuzz` for it"
                )
    return [i for i, t in enumerate(catalog(scope)) if wanted is None or t.clause in wanted]


Task = tuple[str, tuple[int, ...], int, int, Scope]
"""``(implementation name, theorem indices, shard, shards, scope)``: one unit of work. A
task of several indices is an exhaustive family checked in one pass over its cases."""

FAMILY_SHARDS = 4
"""Shards per exhaustive family: the lookup family is the largest single piece of work,
so it is split to keep both cores busy to the end (and per-case memos still apply)."""


def _run_task(task: Task) -> tuple[Task, list[TheoremResult] | ShardOutcome]:
    impl_name, indices, shard, shards, scope = task
    theorems = catalog(scope)
    impl = get_implementation(impl_name)
    if shards == 1 and len(indices) == 1:
        return task, [run_property(theorems[indices[0]], impl)]
    family = [t for t in (theorems[i] for i in indices) if isinstance(t, CaseProperty)]
    assert len(family) == len(indices), "only case properties form families"
    return task, run_family(family, impl, shard, shards)


def _groups(theorems: Sequence[Property], indices: Sequence[int]) -> list[tuple[int, ...]]:
    """The units of work in catalogue order: each formula theorem alone, each exhaustive
    family's selected members together (checked in one pass, cached as one entry, never
    split across ``--shard`` machines: a member's details name its co-members)."""
    groups: list[tuple[int, ...]] = []
    families: dict[str, int] = {}
    for index in indices:
        theorem = theorems[index]
        if isinstance(theorem, CaseProperty):
            if theorem.family in families:
                at = families[theorem.family]
                groups[at] = (*groups[at], index)
                continue
            families[theorem.family] = len(groups)
        groups.append((index,))
    return groups


FORMULA_CONFIG_COST = 40.0
"""Static cost (about milliseconds) of one configuration of a formula theorem's case
split (measured on two shared cores: 0.02-0.06 s each for the C7 and scanner splits)."""

SYMBOLIC_CONFIG_COST = 4.0
"""Per configuration of a theorem tried with symbolic sizes first: those are mostly
decided by one query (0.1-0.9 s for 45 configurations)."""

CASE_COST = 0.03
"""Per case and member of an exhaustive family (the lookup family: 224,330 cases times
six members took 36 s)."""


def _costs(theorems: Sequence[Property], groups: Sequence[tuple[int, ...]]) -> list[float]:
    """A static cost per group (for ``--shard`` balance and ``--fail-fast`` order): never
    a timing, so every machine computes the same partition."""
    counted: dict[int, int] = {}
    costs: list[float] = []
    for group in groups:
        first = theorems[group[0]]
        if isinstance(first, CaseProperty):
            space = id(first.space)
            if space not in counted:
                counted[space] = sum(1 for _ in first.space.cases())
            costs.append(CASE_COST * counted[space] * len(group))
        elif isinstance(first, FormulaProperty):
            per = SYMBOLIC_CONFIG_COST if first.symbolic_sizes else FORMULA_CONFIG_COST
            costs.append(per * max(1, len(first.configs())))
        else:
            costs.append(FORMULA_CONFIG_COST)
    return costs


def _tasks(impl_name: str, groups: Sequence[tuple[int, ...]], shards: int,
           scope: Scope = (), costs: Sequence[float] | None = None,
           cheapest_first: bool = False) -> list[Task]:
    """One task per formula theorem, and ``shards`` tasks per exhaustive family.

    Longest work first, so no long task starts last and runs alone (measured: the
    131-configuration C8 split, scheduled last, added 7 s of one-core tail); with
    ``cheapest_first`` (``--fail-fast``), the cheapest first, so a counterexample in a
    cheap theorem is reported before the expensive ones are started. The report is put
    back into catalogue order, so the order here only affects speed."""
    theorems = catalog(scope)
    if costs is None:
        costs = [
            len(t.configs()) if isinstance(t := theorems[g[0]], FormulaProperty) else 0
            for g in groups
        ]
    family_tasks: list[tuple[float, Task]] = []
    single: list[tuple[float, Task]] = []
    for group, cost in zip(groups, costs, strict=True):
        if isinstance(theorems[group[0]], CaseProperty):
            family_tasks += [(cost, (impl_name, group, shard, shards, scope))
                             for shard in range(shards)]
        else:
            single.append((cost, (impl_name, group, 0, 1, scope)))
    if cheapest_first:
        ordered = sorted(family_tasks + single, key=lambda pair: pair[0])
        return [task for _, task in ordered]
    return ([task for _, task in family_tasks]
            + [task for _, task in sorted(single, key=lambda pair: pair[0], reverse=True)])


@dataclass
class ProveReport:
    target: str
    results: list[TheoremResult]
    seconds: float
    clauses: list[str] = field(default_factory=list)
    fail_on: frozenset[Impact] = DEFAULT_FAIL_ON
    """The impacts whose counterexamples fail the run (``--fail-on``)."""
    geometries: list[dict[str, Any]] = field(default_factory=list)
    """The geometries a scoped run used
    (:func:`kvcontract.spec.properties.scoped.describe_scope`); empty: the catalogue."""
    cached: list[bool] = field(default_factory=list)
    """Per result: read from the proof cache (:mod:`kvcontract.proofs.cache`), not
    proved in this run (the JSON row says ``"cached": true``); empty: none."""
    not_run: list[str] = field(default_factory=list)
    """Theorem ids selected but not run: ``--fail-fast`` stopped at a counterexample."""
    shard: dict[str, Any] | None = None
    """``--shard I/N``: which shard and which positions of the unsharded theorem list
    (:func:`kvcontract.proofs.shards.shard_section`), for ``kvcontract merge``."""

    @property
    def exit_code(self) -> int:
        """0 nothing fails; 1 a counterexample whose impact is in ``fail_on``; 3 unknown
        or vacuous (:func:`kvcontract.vocabulary.finding_exit_code`)."""
        return finding_exit_code(((r.verdict, r.impact) for r in self.results), self.fail_on)

    def to_json(self) -> dict[str, Any]:
        rows = [r.to_json() for r in self.results]
        for row, cached in zip(rows, self.cached, strict=False):
            if cached:
                row["cached"] = True
        return {
            "version": 1,
            "command": "prove",
            "target": self.target,
            "clauses": self.clauses,
            "seconds": round(self.seconds, 3),
            "fail_on": sorted(i.value for i in self.fail_on),
            "exit_code": self.exit_code,
            "results": rows,
            **({"geometries": self.geometries} if self.geometries else {}),
            **({"not_run": self.not_run} if self.not_run else {}),
            **({"shard": self.shard} if self.shard is not None else {}),
        }


def prove(
    impl_name: str = "reference",
    clauses: Sequence[str] | None = None,
    jobs: int | None = None,
    on_result: Callable[[TheoremResult, int, int], None] | None = None,
    fail_on: frozenset[Impact] = DEFAULT_FAIL_ON,
    geometries: Sequence[tuple[str, Geometry]] = (),
    cache: ProofCache | None = None,
    shard: Shard | None = None,
    fail_fast: bool = False,
) -> ProveReport:
    """Run the selected theorems against a registered implementation (on ``geometries``,
    ``(label, geometry)`` pairs, when given: :mod:`kvcontract.spec.properties.scoped`).

    ``cache``: reuse and store results (:mod:`kvcontract.proofs.cache`); ``shard``: run
    only this shard's part of the selection (:mod:`kvcontract.proofs.shards`);
    ``fail_fast``: stop at the first counterexample whose impact is in ``fail_on``
    (the rest is listed in ``not_run``)."""
    from kvcontract.spec.properties.scoped import describe_scope

    get_implementation(impl_name)  # validate early: a clear error before any work
    scope: Scope = tuple((str(label), geometry) for label, geometry in geometries)
    # Forked before anything that depends on --jobs, the cache or the order of results:
    # every task starts from this state, so a theorem's Z3 history, and so its verdict,
    # never depends on which worker ran what before it (proofs/pool.py).
    with TaskRunner(prepare=functools.partial(catalog, scope)) as runner:
        theorems = catalog(scope)
        selected = select(clauses, scope)
        if jobs is None:
            jobs = max(1, min(len(selected), os.cpu_count() or 1))
        if jobs < 1:
            raise UsageError(f"--jobs must be at least 1, not {jobs}")
        started = time.perf_counter()
        # Not from --jobs: the family shard count is in the families' details, and a
        # report must not depend on the number of cores.
        family_shards = FAMILY_SHARDS
        groups = _groups(theorems, selected)
        costs = _costs(theorems, groups) if shard is not None or fail_fast else None
        section: dict[str, Any] | None = None
        if shard is not None:
            assert costs is not None
            mine = set(partition(costs, shard.count)[shard.index - 1])
            groups = [g for i, g in enumerate(groups) if i in mine]
            costs = [c for i, c in enumerate(costs) if i in mine]
            kept = {i for g in groups for i in g}
            ids = [theorems[i].theorem_id for i in selected]
            section = shard_section(
                shard, [p for p, i in enumerate(selected) if i in kept], len(selected),
                selection_digest(ids, [[label, g.to_dict()] for label, g in scope]),
                theorems=[theorems[i].theorem_id for i in selected if i in kept],
                family_shards=family_shards)
        indices = sorted(i for g in groups for i in g)
        results: dict[int, TheoremResult] = {}
        from_cache: set[int] = set()
        stop = False

        def finished(members: Sequence[int], outcome: Sequence[TheoremResult]) -> None:
            nonlocal stop
            for index, result in zip(members, outcome, strict=True):
                results[index] = result
                if on_result:
                    on_result(result, len(results), len(indices))
            if fail_fast and finding_exit_code(
                    ((r.verdict, r.impact) for r in outcome), fail_on) == EXIT_FINDING:
                stop = True

        keys: dict[int, str | None] = {}
        if cache is not None:
            from kvcontract.proofs.cache import group_key, theorem_keys

            keys = theorem_keys(impl_name, theorems, groups, scope, family_shards)
            remaining = []
            for group, cost in zip(groups, costs or [0.0] * len(groups), strict=True):
                key = group_key(keys, group)
                hit = cache.get(key, len(group)) if key is not None and not stop else None
                if hit is None:
                    remaining.append((group, cost))
                    continue
                from_cache.update(group)
                finished(group, hit)
            groups = [g for g, _ in remaining]
            costs = [c for _, c in remaining] if costs is not None else None

        tasks = [] if stop else _tasks(impl_name, groups, family_shards, scope, costs,
                                       cheapest_first=fail_fast)
        pending_shards: dict[tuple[int, ...], list[ShardOutcome]] = {}

        def collect(task: Task, outcome: list[TheoremResult] | ShardOutcome) -> None:
            _, members, _, shards, _ = task
            if isinstance(outcome, list):
                merged = outcome
            else:
                done = pending_shards.setdefault(members, [])
                done.append(outcome)
                if len(done) < shards:
                    return
                family = [t for t in (theorems[i] for i in members) if isinstance(t, CaseProperty)]
                merged = finish_family(family, done)
            if cache is not None:
                key = group_key(keys, members)
                if key is not None:
                    cache.put(key, merged)
            finished(members, merged)

        for _, (task, outcome) in runner.run(_run_task, tasks, jobs):
            collect(task, outcome)
            if stop:
                break
    ordered = [i for i in indices if i in results]
    return ProveReport(
        target=impl_name,
        results=[results[i] for i in ordered],
        seconds=time.perf_counter() - started,
        clauses=sorted({results[i].clause for i in ordered}, key=lambda c: int(c[1:])),
        fail_on=fail_on,
        geometries=describe_scope(scope) if scope else [],
        cached=[i in from_cache for i in ordered] if from_cache else [],
        not_run=[theorems[i].theorem_id for i in indices if i not in results],
        shard=section,
    )
