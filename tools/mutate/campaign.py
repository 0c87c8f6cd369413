"""A mutation campaign: plan the mutants, run the baseline and every mutant in child
processes (``jobs`` at a time), classify them and compute the score.

Statuses:

* ``killed``: a theorem that holds for the unmutated target fails (COUNTEREXAMPLE,
  UNKNOWN, VACUOUS, or it crashes), or the fuzzer's seed scenarios and quick matrix
  (:func:`kvcontract.tools.mutate.worker.fuzz_scenarios`) find a difference
  the unmutated target does not have, or the module does not import, or the prover's
  summed rlimit exceeds the per-mutant resource limit (:data:`RESOURCE_FACTOR` times the
  baseline's, plus :data:`RESOURCE_SLACK`);
* ``equivalent``: it survived and is shown equal to the original function
  (:mod:`kvcontract.tools.mutate.equivalence`);
* ``survived``: it survived and no equivalence was shown;
* ``timeout``: the child ran past the wall-clock safety limit. Machine load decides
  this, so it is neither killed nor survived, and is reported apart.

score = killed / (killed + survived); equivalent and timeout mutants are excluded.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from kvcontract.errors import KvContractError, UsageError
from kvcontract.proofs.shards import Shard
from kvcontract.tools.mutate.operators import OPERATORS, MutationPoint
from kvcontract.tools.mutate.targets import Judges, Target, resolve_target, theorem_map

STATUSES = ("killed", "survived", "equivalent", "timeout")
RESOURCE_FACTOR = 8
"""A mutant may use this many times the baseline's rlimit on its theorems..."""
RESOURCE_SLACK = 50_000_000
"""... plus this much (small baselines, e.g. case-only theorems, use no rlimit at all)."""
SAFETY_TIMEOUT = 1800.0
"""Default wall-clock safety limit per child, in seconds (status ``timeout`` only)."""


class CampaignError(KvContractError):
    """The campaign itself failed (the unmutated target does not run): an internal or
    input error, never a mutant's fate."""


@dataclass
class MutantResult:
    point: MutationPoint
    status: str
    reason: str
    judges: Judges
    killed_by: dict[str, Any] | None = None
    theorems_run: int = 0
    rlimit_used: int = 0
    cases: int = 0
    fuzzed: bool = False
    equivalence: dict[str, Any] | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            **self.point.to_json(),
            "location": self.point.location,
            "status": self.status,
            "reason": self.reason,
            "killed_by": self.killed_by,
            "should_be_caught_by": list(self.judges.clauses),
            "theorems": list(self.judges.theorems),
            "judges_mapped": self.judges.mapped,
            "theorems_run": self.theorems_run,
            "rlimit_used": self.rlimit_used,
            "cases": self.cases,
            "fuzzed": self.fuzzed,
            "equivalence": self.equivalence,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class Baseline:
    """The unmutated target on the union of the mutants' theorems."""

    verdicts: dict[str, str]
    rlimit: dict[str, int]
    failing: list[str]
    fuzz_findings: list[list[str]]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"verdicts": self.verdicts, "failing": self.failing,
                "fuzz_findings": self.fuzz_findings, "seconds": round(self.seconds, 3)}


@dataclass
class MutationReport:
    target: str
    total_points: int
    sample: int | None
    seed: int
    mutants: list[MutantResult]
    baseline: Baseline
    seconds: float
    jobs: int
    fuzz: bool
    shard: dict[str, Any] | None = None
    """The report's ``shard`` object (``--shard I/N``, :func:`kvcontract.proofs.shards.
    shard_section`): which positions of the unsharded mutant list it ran."""
    shard_seconds: list[float] | None = None
    """A merged report's: each shard's campaign wall time, in shard order."""

    @property
    def killed(self) -> int:
        return sum(1 for m in self.mutants if m.status == "killed")

    @property
    def survived(self) -> int:
        return sum(1 for m in self.mutants if m.status == "survived")

    @property
    def score(self) -> float | None:
        """killed / (killed + survived), or None when there is nothing to score."""
        scored = self.killed + self.survived
        return None if scored == 0 else self.killed / scored

    def by_status(self) -> dict[str, int]:
        counts = Counter(m.status for m in self.mutants)
        return {s: counts.get(s, 0) for s in STATUSES}

    def by_operator(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for op in OPERATORS:
            own = [m for m in self.mutants if m.point.operator == op]
            if own:
                counts = Counter(m.status for m in own)
                table[op] = {s: counts.get(s, 0) for s in STATUSES}
        return table

    def seconds_per_mutant(self) -> float:
        """Campaign wall time (baseline included) per mutant, with ``jobs`` in parallel
        (a merged report: the shards' times summed, as if run one after another)."""
        total = sum(self.shard_seconds) if self.shard_seconds else self.seconds
        return total / len(self.mutants) if self.mutants else 0.0

    def child_seconds_per_mutant(self) -> float:
        """Mean wall time of one mutant's child process (import, prover, fuzz, equivalence)."""
        return sum(m.seconds for m in self.mutants) / len(self.mutants) if self.mutants else 0.0

    def to_json(self) -> dict[str, Any]:
        score = self.score
        return {
            "version": 1,
            "command": "mutate",
            "target": self.target,
            "score": None if score is None else round(score, 4),
            "killed": self.killed,
            "survived": self.survived,
            "equivalent": self.by_status()["equivalent"],
            "timeout": self.by_status()["timeout"],
            "total_points": self.total_points,
            "sample": self.sample,
            "seed": self.seed,
            "jobs": self.jobs,
            "fuzz": self.fuzz,
            "seconds": round(self.seconds, 3),
            "seconds_per_mutant": round(self.seconds_per_mutant(), 3),
            "child_seconds_per_mutant": round(self.child_seconds_per_mutant(), 3),
            "by_operator": self.by_operator(),
            "baseline": self.baseline.to_json(),
            "mutants": [m.to_json() for m in self.mutants],
            **({"shard": self.shard} if self.shard is not None else {}),
            **({"shards": len(self.shard_seconds),
                "shard_seconds": [round(t, 3) for t in self.shard_seconds]}
               if self.shard_seconds is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MutationReport:
        """A report read back (``kvcontract merge`` joins shards this way); raises
        KeyError/TypeError/ValueError on a malformed one."""
        baseline = data["baseline"]
        mutants = [
            MutantResult(
                point=MutationPoint.from_json(m),
                status=str(m["status"]),
                reason=str(m.get("reason", "")),
                judges=Judges(tuple(m.get("theorems", ())),
                              tuple(m.get("should_be_caught_by", ())),
                              bool(m.get("judges_mapped", True))),
                killed_by=m.get("killed_by"),
                theorems_run=int(m.get("theorems_run", 0)),
                rlimit_used=int(m.get("rlimit_used", 0)),
                cases=int(m.get("cases", 0)),
                fuzzed=bool(m.get("fuzzed", False)),
                equivalence=m.get("equivalence"),
                seconds=float(m.get("seconds", 0.0)),
            )
            for m in data["mutants"]
        ]
        for m in mutants:
            if m.status not in STATUSES:
                raise ValueError(f"{m.point.id}: unknown status {m.status!r}")
        return cls(
            target=str(data["target"]),
            total_points=int(data["total_points"]),
            sample=None if data.get("sample") is None else int(data["sample"]),
            seed=int(data.get("seed", 0)),
            mutants=mutants,
            baseline=Baseline(
                verdicts=dict(baseline.get("verdicts", {})), rlimit={},
                failing=list(baseline.get("failing", [])),
                fuzz_findings=[list(f) for f in baseline.get("fuzz_findings", [])],
                seconds=float(baseline.get("seconds", 0.0))),
            seconds=float(data.get("seconds", 0.0)),
            jobs=int(data.get("jobs", 1)),
            fuzz=bool(data.get("fuzz", True)),
            shard=data.get("shard"),
            shard_seconds=(None if data.get("shard_seconds") is None
                           else [float(t) for t in data["shard_seconds"]]),
        )


# -- planning -------------------------------------------------------------------------
@dataclass
class Plan:
    target: Target
    points: list[MutationPoint]
    total_points: int
    judges: dict[str, Judges]
    shard: dict[str, Any] | None = None
    """``--shard I/N``: the report's ``shard`` object (the positions of :attr:`points` in
    the unsharded selection); None for an unsharded campaign."""

    def judges_of(self, point: MutationPoint) -> Judges:
        return self.judges[f"{point.module}:{point.function}"]


def point_cost(judges: Judges, families: dict[str, str | None]) -> float:
    """A mutant's static cost for ``--shard``: one, plus each formula theorem that may run
    on it, plus four per case family (one pass over the family's cases; measured: the
    families are most of a survivor's time). ``families``: theorem id -> its family
    (None for a formula theorem). Never a timing: every shard must compute the same
    partition."""
    own = {families.get(t) for t in judges.theorems}
    formulas = sum(1 for t in judges.theorems if families.get(t) is None)
    return 1.0 + formulas + 4.0 * len(own - {None})


def plan(target_spec: str, sample: int | None = None, seed: int = 0,
         functions: Sequence[str] = (), shard: Shard | None = None) -> Plan:
    """Validate the arguments and enumerate the mutants (no child process yet); with
    ``shard``, only that shard's part of the selection (:func:`kvcontract.proofs.shards.
    partition` by :func:`point_cost`), whose report ``kvcontract merge`` joins with the
    others'."""
    if sample is not None and (isinstance(sample, bool) or sample < 1):
        raise UsageError(f"--sample must be a positive integer, not {sample}")
    target = resolve_target(target_spec)
    if functions:
        known = target.function_names()
        unknown = sorted(set(functions) - known)
        if unknown:
            raise UsageError(f"no function {', '.join(unknown)} in the target; known: "
                             f"{', '.join(sorted(known))}")
    points = target.points(functions or None)
    total = len(points)
    if sample is not None and sample < total:
        chosen = set(random.Random(seed).sample(range(total), sample))
        points = [p for i, p in enumerate(points) if i in chosen]
    judges = theorem_map(target)
    if shard is None:
        return Plan(target, points, total, judges)
    from kvcontract.proofs.runner import catalog
    from kvcontract.proofs.shards import partition, selection_digest, shard_section
    from kvcontract.spec.properties import CaseProperty

    families = {t.theorem_id: (t.family if isinstance(t, CaseProperty) else None)
                for t in catalog()}
    costs = [point_cost(judges[f"{p.module}:{p.function}"], families) for p in points]
    positions = partition(costs, shard.count)[shard.index - 1]
    ids = [p.id for p in points]
    selection = selection_digest(ids, {"target": target.label, "sample": sample, "seed": seed,
                                       "functions": sorted(functions),
                                       "total_points": total})
    section = shard_section(shard, positions, len(points), selection, sample=sample,
                            seed=seed, functions=sorted(functions),
                            mutants=[ids[i] for i in positions])
    return Plan(target, [points[i] for i in positions], total, judges, section)


# -- child processes ------------------------------------------------------------------
WORKER = "from kvcontract.tools.mutate.worker import main; main()"


def run_job(job: dict[str, Any], safety_timeout: float) -> tuple[dict[str, Any] | None, float]:
    """Run one job in a fresh interpreter: its result, or None after the safety timeout."""
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    env.setdefault("OMP_NUM_THREADS", "1")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvcontract-mutant-") as tmp:
        job_path, out_path = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
        with open(job_path, "w", encoding="utf-8") as f:
            json.dump(job, f)
        try:
            proc = subprocess.run(
                [sys.executable, "-c", WORKER, job_path, out_path], env=env,
                capture_output=True, text=True, timeout=safety_timeout,
            )
        except subprocess.TimeoutExpired:
            return None, time.perf_counter() - started
        elapsed = time.perf_counter() - started
        if os.path.exists(out_path):
            with open(out_path, encoding="utf-8") as f:
                return json.load(f), elapsed
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        return {
            "status": "killed", "reason": "crash", "theorems": [], "rlimit_used": 0,
            "cases": 0, "fuzz": {"ran": False}, "equivalence": None, "seconds": {},
            "killed_by": {"message": f"the child process exited with code {proc.returncode}"
                                     + (f": {' | '.join(tail)}" if tail else "")},
            "child_failed": True,
        }, elapsed


def _job(plan_: Plan, point: MutationPoint | None, theorems: Iterable[str], *,
         baseline: Baseline | None, fuzz: bool, limit: int | None) -> dict[str, Any]:
    return {
        "modules": [m.to_json() for m in plan_.target.modules],
        "field_functions": {k: list(v) for k, v in plan_.target.field_functions.items()},
        "point": None if point is None else point.to_json(),
        "impl": plan_.target.impl_name,
        "theorems": sorted(set(theorems)),
        "baseline_failing": [] if baseline is None else baseline.failing,
        "fuzz_baseline": [] if baseline is None else baseline.fuzz_findings,
        "rlimit_limit": limit,
        "fuzz": fuzz,
        "equivalence": point is not None,
        "early_stop": point is not None,
    }


def _baseline_parts(theorems: Sequence[str], parts: int) -> list[list[str]]:
    """Split the theorems into at most ``parts`` lists; a case family stays whole (it is
    one pass over its cases), the biggest units first onto the lightest list."""
    from kvcontract.proofs.runner import catalog
    from kvcontract.spec.properties import CaseProperty

    wanted = set(theorems)
    units: dict[str, list[str]] = {}
    for prop in catalog():
        if prop.theorem_id in wanted:
            key = (f"family:{prop.family}" if isinstance(prop, CaseProperty)
                   else prop.theorem_id)
            units.setdefault(key, []).append(prop.theorem_id)
    weight = {k: len(v) * (4 if k.startswith("family:") else 1) for k, v in units.items()}
    buckets: list[tuple[int, list[str]]] = [(0, []) for _ in range(max(1, parts))]
    for key in sorted(units, key=lambda k: -weight[k]):
        load, members = min(buckets, key=lambda b: b[0])
        buckets.remove((load, members))
        buckets.append((load + weight[key], members + units[key]))
    return [members for _, members in buckets if members] or [[]]


def run_baseline(plan_: Plan, fuzz: bool, safety_timeout: float, jobs: int = 1) -> Baseline:
    """The unmutated target on every theorem some mutant needs (and the fuzzer), split
    over ``jobs`` child processes."""
    theorems = sorted({t for p in plan_.points for t in plan_.judges_of(p).theorems})
    started = time.perf_counter()
    parts = _baseline_parts(theorems, jobs)
    jobs_ = [_job(plan_, None, part, baseline=None, fuzz=fuzz and i == len(parts) - 1,
                  limit=None) for i, part in enumerate(parts)]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        outs = [out for out, _ in pool.map(lambda j: run_job(j, safety_timeout), jobs_)]
    merged: list[dict[str, Any]] = []
    findings: list[list[str]] = []
    for out in outs:
        if out is None:
            raise CampaignError(f"the unmutated target ran past the safety limit "
                                f"({safety_timeout:.0f} s)")
        if out.get("import_error") or out.get("child_failed") or out.get("traceback") or (
            out.get("reason") == "crash" and not out.get("theorems")
        ):
            message = (out.get("killed_by") or {}).get("message", "unknown failure")
            if out.get("import_error") and plan_.target.label.startswith("module:"):
                raise UsageError(f"{plan_.target.label}: {message}")  # the user's file
            raise CampaignError(f"the unmutated target {plan_.target.label} does not run: "
                                f"{message}")
        merged.extend(out["theorems"])
        findings.extend(f[:3] for f in out["fuzz"].get("findings", []))
    verdicts = {r["theorem"]: r["verdict"] for r in merged}
    passing = {"PROVED", "PROVED-FOR-DOMAIN"}
    return Baseline(
        verdicts=verdicts,
        rlimit={r["theorem"]: int(r["rlimit"]) for r in merged},
        failing=sorted(t for t, v in verdicts.items() if v not in passing),
        fuzz_findings=findings,
        seconds=time.perf_counter() - started,
    )


def resource_limit(baseline: Baseline, theorems: Iterable[str]) -> int:
    return RESOURCE_FACTOR * sum(baseline.rlimit.get(t, 0) for t in theorems) + RESOURCE_SLACK


def _classify(point: MutationPoint, judges: Judges, out: dict[str, Any] | None,
              elapsed: float) -> MutantResult:
    if out is None:
        return MutantResult(point, "timeout", "safety limit", judges, seconds=elapsed)
    return MutantResult(
        point=point,
        status=str(out["status"]),
        reason=str(out.get("reason", "")),
        judges=judges,
        killed_by=out.get("killed_by"),
        theorems_run=len(out.get("theorems", [])),
        rlimit_used=int(out.get("rlimit_used", 0)),
        cases=int(out.get("cases", 0)),
        fuzzed=bool(out.get("fuzz", {}).get("ran", False)),
        equivalence=out.get("equivalence"),
        seconds=elapsed,
    )


def run_campaign(
    target_spec: str = "reference",
    *,
    sample: int | None = None,
    seed: int = 0,
    jobs: int | None = None,
    functions: Sequence[str] = (),
    fuzz: bool = True,
    safety_timeout: float = SAFETY_TIMEOUT,
    on_result: Callable[[MutantResult, int, int], None] | None = None,
    prepared: Plan | None = None,
    shard: Shard | None = None,
) -> MutationReport:
    """Plan, run the baseline, run every mutant; see the module docstring. With
    ``shard`` (or a ``prepared`` plan of one), the baseline covers that shard's mutants'
    judges only."""
    if jobs is None:
        jobs = max(1, os.cpu_count() or 1)
    if isinstance(jobs, bool) or jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {jobs}")
    if safety_timeout <= 0:
        raise UsageError(f"the safety timeout must be positive, not {safety_timeout}")
    plan_ = prepared or plan(target_spec, sample, seed, functions, shard)
    started = time.perf_counter()
    if plan_.points:
        baseline = run_baseline(plan_, fuzz, safety_timeout, jobs)
    else:  # an empty shard (more shards than mutants): nothing to compare against
        baseline = Baseline(verdicts={}, rlimit={}, failing=[], fuzz_findings=[], seconds=0.0)
    results: dict[int, MutantResult] = {}

    def one(index: int) -> tuple[int, MutantResult]:
        point = plan_.points[index]
        judges = plan_.judges_of(point)
        job = _job(plan_, point, judges.theorems, baseline=baseline, fuzz=fuzz,
                   limit=resource_limit(baseline, judges.theorems))
        out, elapsed = run_job(job, safety_timeout)
        return index, _classify(point, judges, out, elapsed)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one, i) for i in range(len(plan_.points))]
        for future in as_completed(futures):
            index, result = future.result()
            results[index] = result
            if on_result:
                on_result(result, len(results), len(plan_.points))
    section = None if plan_.shard is None else {**plan_.shard, "fuzz": fuzz}
    return MutationReport(
        target=plan_.target.label,
        total_points=plan_.total_points,
        sample=sample,
        seed=seed,
        mutants=[results[i] for i in range(len(plan_.points))],
        baseline=baseline,
        seconds=time.perf_counter() - started,
        jobs=jobs,
        fuzz=fuzz,
        shard=section,
    )
