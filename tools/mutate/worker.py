"""The child process of a campaign: install the (mutated) modules, then try to kill.

Run as ``python -c "from kvcontract.tools.mutate.worker import main; main()" JOB OUT``
(:func:`kvcontract.tools.mutate.campaign.run_job` does): ``JOB`` is a JSON file (the
module sources, the mutation point or none for the baseline, the theorems, the
limits), ``OUT`` receives the JSON result.

Before anything imports ``kvcontract.impl``, a meta-path finder serves the target's
module sources (one of them mutated, compiled from the changed tree so line numbers
are the file's) under their original names. The registered implementations and the
property layer's drivers (``lookup_complete_chunks``, ``StoreTracker``) are then built
from the mutant. Nothing here depends on wall-clock time: a theorem's work is bounded
by the prover's rlimits and finite case spaces, the campaign's resource limit is a sum
of rlimits, and the parent's safety timeout only marks a mutant ``timeout``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import time
import traceback
import types
from collections.abc import Sequence
from typing import Any

from kvcontract.tools.mutate.operators import MutationPoint, mutate_tree


class _Loader(importlib.abc.Loader):
    def __init__(self, entry: dict[str, Any], code: types.CodeType) -> None:
        self.entry = entry
        self.code = code

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        base = self.entry.get("base_source")
        if base is not None:
            exec(compile(base, self.entry["base_path"], "exec"), module.__dict__)
        exec(self.code, module.__dict__)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, loaders: dict[str, tuple[str, _Loader]]) -> None:
        self.loaders = loaders

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        found = self.loaders.get(fullname)
        if found is None:
            return None
        origin, loader = found
        return importlib.util.spec_from_file_location(fullname, origin, loader=loader)


def install(modules: list[dict[str, Any]], point: MutationPoint | None) -> None:
    """Serve ``modules`` (``ModuleSource.to_json()`` dicts) under their names, ``point``
    applied to its module; then import them, so they are in ``sys.modules`` before the
    registry and the properties are imported."""
    loaders: dict[str, tuple[str, _Loader]] = {}
    for entry in modules:
        if point is not None and entry["name"] == point.module:
            tree: ast.Module = mutate_tree(entry["source"], point)
        else:
            tree = ast.parse(entry["source"])
        code = compile(tree, entry["path"], "exec")
        loaders[entry["name"]] = (entry["path"], _Loader(entry, code))
    for name in loaders:
        if name in sys.modules:
            raise RuntimeError(f"{name} was imported before the mutant was installed")
    sys.meta_path.insert(0, _Finder(loaders))
    for name in loaders:
        importlib.import_module(name)


def _original_function(entry: dict[str, Any], qualname: str) -> Any:
    """The unmutated function, from a private copy of its module."""
    name = f"{entry['name']}__kvcontract_original"
    module = types.ModuleType(name)
    module.__file__ = entry["path"]
    sys.modules[name] = module
    if entry.get("base_source") is not None:
        exec(compile(entry["base_source"], entry["base_path"], "exec"), module.__dict__)
    exec(compile(entry["source"], entry["path"], "exec"), module.__dict__)
    return _lookup(module, qualname)


def _lookup(module: types.ModuleType, qualname: str) -> Any:
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _result(prop: Any, verdict: str, message: str, rlimit: int = 0, cases: int = 0,
            seconds: float = 0.0, witness: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"theorem": prop.theorem_id, "clause": prop.clause, "verdict": verdict,
            "message": message, "rlimit": rlimit, "cases": cases,
            "seconds": round(seconds, 4), "witness": witness}


def run_theorems(job: dict[str, Any], out: dict[str, Any]) -> None:
    """The selected theorems in catalogue order (a case family in one pass, as the
    prover's ``run_family``); stops at the first counted failure when ``early_stop``."""
    from kvcontract.impl.variants import get_implementation
    from kvcontract.proofs.runner import catalog
    from kvcontract.proofs.theorem import prove_formula
    from kvcontract.spec.properties import CaseProperty

    impl = get_implementation(job["impl"])
    wanted = set(job["theorems"])
    ignored = set(job.get("baseline_failing") or ())
    early = bool(job.get("early_stop", True))
    limit = job.get("rlimit_limit")
    selected = [t for t in catalog() if t.theorem_id in wanted]
    items: list[Any] = []
    families: dict[str, list[Any]] = {}
    for prop in selected:
        if isinstance(prop, CaseProperty):
            if prop.family not in families:
                families[prop.family] = []
                items.append(families[prop.family])
            families[prop.family].append(prop)
        else:
            items.append(prop)
    results: list[dict[str, Any]] = out["theorems"]

    def kill(reason: str, detail: dict[str, Any]) -> None:
        if out["status"] != "killed":
            out["status"], out["reason"], out["killed_by"] = "killed", reason, detail

    for item in items:
        if isinstance(item, list):
            _run_family(item, impl, results, ignored, early, kill)
        else:
            started = time.perf_counter()
            try:
                r = prove_formula(item, impl)
                results.append(_result(item, r.verdict.value, r.message, r.rlimit_used, 0,
                                       time.perf_counter() - started, r.witness))
                if not r.verdict.passed and item.theorem_id not in ignored:
                    kill("theorem", results[-1])
            except Exception as exc:
                results.append(_result(item, "CRASH", f"{type(exc).__name__}: {exc}", 0, 0,
                                       time.perf_counter() - started))
                if item.theorem_id not in ignored:
                    kill("crash", results[-1])
        out["rlimit_used"] = sum(r["rlimit"] for r in results)
        out["cases"] = sum(r["cases"] for r in results)
        if limit is not None and out["rlimit_used"] > limit:
            kill("resource", {"message": f"the prover used {out['rlimit_used']:,} rlimit, "
                              f"over the per-mutant limit {limit:,}"})
        if early and out["status"] == "killed":
            return


def _run_family(family: list[Any], impl: Any, results: list[dict[str, Any]],
                ignored: set[str], early: bool, kill: Any) -> None:
    open_ = list(range(len(family)))
    cases = [0] * len(family)
    seconds = [0.0] * len(family)
    failures: list[tuple[str, dict[str, Any]] | None] = [None] * len(family)
    stop = False
    for case in family[0].space.cases():
        for j in tuple(open_):
            started = time.perf_counter()
            try:
                violation = family[j].check(case, impl)
            except Exception as exc:  # a crash of the implementation is a finding too
                violation = f"the implementation raised {type(exc).__name__}: {exc}"
            seconds[j] += time.perf_counter() - started
            cases[j] += 1
            if violation is not None:
                failures[j] = (violation, family[j].witness(case))
                open_.remove(j)
                if early and family[j].theorem_id not in ignored:
                    stop = True
                    break
        if stop or not open_:
            break
    for j, prop in enumerate(family):
        failure = failures[j]
        if failure is not None:
            results.append(_result(prop, "COUNTEREXAMPLE", failure[0], 0, cases[j], seconds[j],
                                   failure[1]))
            if prop.theorem_id not in ignored:
                kill("theorem", results[-1])
        elif j in open_ and not stop:
            verdict = "PROVED-FOR-DOMAIN" if cases[j] else "VACUOUS"
            results.append(_result(prop, verdict, "", 0, cases[j], seconds[j]))
            if verdict == "VACUOUS" and prop.theorem_id not in ignored:
                kill("theorem", results[-1])


def fuzz_scenarios() -> list[Any]:
    """The system scenarios that judge a survivor of the theorems: the fuzzer's seed
    scenarios and the fixed quick sample of its matrix (docs/CONTRACT.md 10 and the
    left-chunk states: a chunk of the load set being loaded by another request is there
    and nowhere in the theorems' case spaces). Fixed lists, no Hypothesis programs: the
    same scenarios for the baseline and every mutant."""
    from kvcontract.tools.fuzz import matrix_scenarios, seed_scenarios

    return [*seed_scenarios(), *matrix_scenarios(quick=True)]


def run_fuzz(job: dict[str, Any], out: dict[str, Any]) -> None:
    """The system scenarios of :func:`fuzz_scenarios` (no Hypothesis programs): a finding
    the unmutated target does not have kills the mutant."""
    from kvcontract.tools.fuzz import run_fuzz as fuzz

    started = time.perf_counter()
    try:
        report = fuzz(job["impl"], examples=0, scenarios=fuzz_scenarios())
    except Exception as exc:
        out["fuzz"] = {"ran": True, "cases": 0, "findings": []}
        out["status"], out["reason"] = "killed", "crash"
        out["killed_by"] = {"message": f"the fuzzer's run raised {type(exc).__name__}: {exc}"}
        return
    finally:
        out["seconds"]["fuzz"] = round(time.perf_counter() - started, 3)
    findings = [[d.clause, d.kind, str(d.witness.get("scenario", "")), d.message]
                for d in report.differences]
    out["fuzz"] = {"ran": True, "cases": report.cases, "findings": findings}
    known = {tuple(f[:3]) for f in job.get("fuzz_baseline") or ()}
    new = [f for f in findings if tuple(f[:3]) not in known]
    if new and out["status"] != "killed":
        clause, kind, scenario, message = new[0]
        out["status"], out["reason"] = "killed", "fuzz"
        out["killed_by"] = {"clause": clause, "kind": kind, "scenario": scenario,
                            "message": message}


def run_equivalence(job: dict[str, Any], point: MutationPoint, out: dict[str, Any]) -> None:
    """Is the survivor equivalent? First the rules read off the source (an assignment
    that cannot change a value, a change confined to messages, a flag argument: they
    apply to methods and drivers too), then the comparison of the two functions."""
    from kvcontract.tools.mutate.equivalence import (
        SourceIndex,
        compare,
        syntactic_equivalence,
    )

    started = time.perf_counter()
    entry = next(m for m in job["modules"] if m["name"] == point.module)
    try:
        index = SourceIndex(
            {m["name"]: (m["source"], m.get("base_source")) for m in job["modules"]},
            {k: (v[0], v[1]) for k, v in (job.get("field_functions") or {}).items()})
        outcome = syntactic_equivalence(entry["source"], point, index)
        if outcome is None:
            original = _original_function(entry, point.function)
            mutant = _lookup(sys.modules[point.module], point.function)
            outcome = compare(original, mutant)
        out["equivalence"] = outcome.to_json()
        if outcome.equivalent:
            out["status"] = "equivalent"
    except Exception as exc:  # not shown: the mutant stays a survivor
        out["equivalence"] = {"equivalent": None, "method": "none",
                              "detail": f"comparison raised {type(exc).__name__}: {exc}",
                              "distinguishing_input": None, "evaluations": 0}
    out["seconds"]["equivalence"] = round(time.perf_counter() - started, 3)


def execute(job: dict[str, Any]) -> dict[str, Any]:
    """One job, in this (fresh) process."""
    point = MutationPoint.from_json(job["point"]) if job.get("point") else None
    out: dict[str, Any] = {
        "status": "survived", "reason": "", "killed_by": None, "theorems": [],
        "rlimit_used": 0, "cases": 0, "fuzz": {"ran": False, "cases": 0, "findings": []},
        "equivalence": None, "seconds": {},
    }
    started = time.perf_counter()
    try:
        install(job["modules"], point)
    except Exception as exc:
        out["status"], out["reason"] = "killed", "crash"
        out["killed_by"] = {"message": f"the module does not import: {type(exc).__name__}: "
                                       f"{exc}"}
        out["import_error"] = True
        return out
    out["seconds"]["import"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    try:
        run_theorems(job, out)
    except Exception as exc:  # outside a theorem: the registry or the catalogue broke
        out["status"], out["reason"] = "killed", "crash"
        out["killed_by"] = {"message": f"{type(exc).__name__}: {exc}"}
        out["traceback"] = traceback.format_exc(limit=8)
    out["seconds"]["prove"] = round(time.perf_counter() - started, 3)
    if out["status"] == "killed" and job.get("early_stop", True):
        return out
    if job.get("fuzz"):
        run_fuzz(job, out)
        if out["status"] == "killed" and job.get("early_stop", True):
            return out
    if point is not None and out["status"] == "survived" and job.get("equivalence", True):
        run_equivalence(job, point, out)
    return out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    job_path, out_path = args[0], args[1]
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    out = execute(job)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
