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

from kvcontract.impl.variants import get_implementation
from kvcontract.proofs.arith_theorems import arith_theorems
from kvcontract.proofs.exhaustive_theorems import exhaustive_theorems
from kvcontract.proofs.sequence_theorems import sequence_theorems
from kvcontract.proofs.theorem import Theorem
from kvcontract.proofs.verdicts import TheoremResult, exit_code_for
from kvcontract.spec.clauses import CLAUSES, get_clause

from kvcontract.errors import UsageError


def catalog() -> list[Theorem]:
    """Every theorem, in clause order."""
    theorems: list[Theorem] = [*arith_theorems(), *sequence_theorems(), *exhaustive_theorems()]
    order = {c.id: i for i, c in enumerate(CLAUSES)}
    return sorted(theorems, key=lambda t: order[t.clause])


def select(clauses: Sequence[str] | None) -> list[int]:
    """Indices into :func:`catalog` for the requested clauses (validated)."""
    wanted = {get_clause(c).id for c in clauses} if clauses else None
    if wanted is not None:
        for clause_id in wanted:
            if get_clause(clause_id).proved_by != "prover":
                raise UsageError(
                    f"{clause_id} is checked by executing the system, not by the prover; "
                    "run `kvcontract fuzz` for it"
                )
    return [i for i, t in enumerate(catalog()) if wanted is None or t.clause in wanted]


def _run_one(args: tuple[str, int]) -> tuple[int, TheoremResult]:
    impl_name, index = args
    theorem = catalog()[index]
    return index, theorem.run(get_implementation(impl_name))


@dataclass
class ProveReport:
    target: str
    results: list[TheoremResult]
    seconds: float
    clauses: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.results)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "command": "prove",
            "target": self.target,
            "clauses": self.clauses,
            "seconds": round(self.seconds, 3),
            "exit_code": self.exit_code,
            "results": [r.to_json() for r in self.results],
        }


def prove(
    impl_name: str = "reference",
    clauses: Sequence[str] | None = None,
    jobs: int | None = None,
    on_result: Callable[[TheoremResult, int, int], None] | None = None,
) -> ProveReport:
    """Run the selected theorems against a registered implementation."""
    get_implementation(impl_name)  # validate early: a clear error before any work
    indices = select(clauses)
    if jobs is None:
        jobs = max(1, min(len(indices), os.cpu_count() or 1))
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {jobs}")
    started = time.perf_counter()
    results: dict[int, TheoremResult] = {}
    if jobs == 1:
        for index in indices:
            _, result = _run_one((impl_name, index))
            results[index] = result
            if on_result:
                on_result(result, len(results), len(indices))
    else:
        context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            # Longest first: the exhaustive lookups and the mask case splits dominate.
            futures = [pool.submit(_run_one, (impl_name, i)) for i in indices]
            for future in as_completed(futures):
                index, result = future.result()
                results[index] = result
                if on_result:
                    on_result(result, len(results), len(indices))
    ordered = [results[i] for i in indices]
    return ProveReport(
        target=impl_name,
        results=ordered,
        seconds=time.perf_counter() - started,
        clauses=sorted({r.clause for r in ordered}, key=lambda c: int(c[1:])),
    )
