"""The prover: select theorems, run them for an implementation, collect results.

Theorems are independent, so they run in parallel worker processes (one per core by
default). Each worker rebuilds the catalogue and runs theorems by index, so nothing but
indices and :class:`TheoremResult` objects cross process boundaries.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from kvcontract.errors import UsageError
from kvcontract.impl.variants import get_implementation
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
from kvcontract.vocabulary import DEFAULT_FAIL_ON, Impact, finding_exit_code

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


def _tasks(impl_name: str, indices: Sequence[int], shards: int,
           scope: Scope = ()) -> list[Task]:
    """One task per theorem, and ``shards`` tasks per exhaustive family, biggest first."""
    theorems = catalog(scope)
    families: dict[str, list[int]] = {}
    tasks: list[Task] = []
    for index in indices:
        theorem = theorems[index]
        if isinstance(theorem, CaseProperty):
            families.setdefault(theorem.family, []).append(index)
        else:
            tasks.append((impl_name, (index,), 0, 1, scope))
    family_tasks = [
        (impl_name, tuple(members), shard, shards, scope)
        for members in families.values()
        for shard in range(shards)
    ]
    # Longest work first, so no long task starts last and runs alone (measured: the
    # 131-configuration C8 split, scheduled last, added 7 s of one-core tail). The
    # report is put back into catalogue order, so the order here only affects speed.
    def cost(task: Task) -> int:
        theorem = theorems[task[1][0]]
        return len(theorem.configs()) if isinstance(theorem, FormulaProperty) else 0

    return family_tasks + sorted(tasks, key=cost, reverse=True)


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

    @property
    def exit_code(self) -> int:
        """0 nothing fails; 1 a counterexample whose impact is in ``fail_on``; 3 unknown
        or vacuous (:func:`kvcontract.vocabulary.finding_exit_code`)."""
        return finding_exit_code(((r.verdict, r.impact) for r in self.results), self.fail_on)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "command": "prove",
            "target": self.target,
            "clauses": self.clauses,
            "seconds": round(self.seconds, 3),
            "fail_on": sorted(i.value for i in self.fail_on),
            "exit_code": self.exit_code,
            "results": [r.to_json() for r in self.results],
            **({"geometries": self.geometries} if self.geometries else {}),
        }


def prove(
    impl_name: str = "reference",
    clauses: Sequence[str] | None = None,
    jobs: int | None = None,
    on_result: Callable[[TheoremResult, int, int], None] | None = None,
    fail_on: frozenset[Impact] = DEFAULT_FAIL_ON,
    geometries: Sequence[tuple[str, Geometry]] = (),
) -> ProveReport:
    """Run the selected theorems against a registered implementation (on ``geometries``,
    ``(label, geometry)`` pairs, when given: :mod:`kvcontract.spec.properties.scoped`)."""
    from kvcontract.spec.properties.scoped import describe_scope

    get_implementation(impl_name)  # validate early: a clear error before any work
    scope: Scope = tuple((str(label), geometry) for label, geometry in geometries)
    indices = select(clauses, scope)
    if jobs is None:
        jobs = max(1, min(len(indices), os.cpu_count() or 1))
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {jobs}")
    started = time.perf_counter()
    tasks = _tasks(impl_name, indices, FAMILY_SHARDS if jobs > 1 else 1, scope)
    results: dict[int, TheoremResult] = {}
    pending_shards: dict[tuple[int, ...], list[ShardOutcome]] = {}

    def collect(task: Task, outcome: list[TheoremResult] | ShardOutcome) -> None:
        _, members, _, shards, _ = task
        if isinstance(outcome, list):
            finished = list(zip(members, outcome, strict=True))
        else:
            done = pending_shards.setdefault(members, [])
            done.append(outcome)
            if len(done) < shards:
                return
            theorems = catalog(scope)
            family = [t for t in (theorems[i] for i in members) if isinstance(t, CaseProperty)]
            merged = finish_family(family, done)
            finished = list(zip(members, merged, strict=True))
        for index, result in finished:
            results[index] = result
            if on_result:
                on_result(result, len(results), len(indices))

    if jobs == 1:
        for task in tasks:
            collect(*_run_task(task))
    else:
        context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = [pool.submit(_run_task, task) for task in tasks]
            for future in as_completed(futures):
                collect(*future.result())
    ordered = [results[i] for i in indices]
    return ProveReport(
        target=impl_name,
        results=ordered,
        seconds=time.perf_counter() - started,
        clauses=sorted({r.clause for r in ordered}, key=lambda c: int(c[1:])),
        fail_on=fail_on,
        geometries=describe_scope(scope) if scope else [],
    )
