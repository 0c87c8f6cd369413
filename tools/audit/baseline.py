"""Compare two audited targets clause by clause (``--baseline``).

Each clause is classified from the two audits and from a direct comparison of the bound
functions the clause's theorems call:

* ``fixed`` - violated in the baseline, holds in the target;
* ``regressed`` - holds in the baseline, violated in the target;
* ``still violated`` / ``still unknown`` - no change in the verdict;
* ``changed, conforming`` - holds in both, but some function behaves differently
  (the first difference is shown as a witness);
* ``unchanged (proved equivalent)`` - holds in both, and Z3 proved every function the
  clause uses equal for all inputs (or over the stated case split);
* ``no difference found (not proved)`` - holds in both, no difference in N compared
  cases, but no proof. Two versions are never called equivalent without a proof.

The baseline is a second target, or ``git:REF``: the audited target's own files at a
revision of the git repository that contains them (:func:`git_baseline_target`, read
with ``git show`` into a temporary tree; the checkout is not touched).

The function comparisons execute upstream code, so they run in sandbox children too.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import z3

from kvcontract.errors import InputFileError, UsageError
from kvcontract.impl.bundle import Implementation
from kvcontract.spec.properties.domains import BLOCK_SIZES, BLOCKS_PER_CHUNK
from kvcontract.spec.symbolic import LiftError, PathExplorer
from kvcontract.tools.audit.engine import AuditOptions, AuditRun, clause_summary
from kvcontract.tools.audit.recheck import THEOREM_FIELDS
from kvcontract.tools.audit.roles import Binding
from kvcontract.tools.audit.sandbox import run_jobs
from kvcontract.tools.audit.targets import Target, _version_of
from kvcontract.tools.audit.upstream_calls import UpstreamError
from kvcontract.vocabulary import EXIT_FINDING, EXIT_OK, LookupResult, RequestStatus, Verdict

_ARITH: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], tuple[Any, ...]]]] = {
    "get_num_skipped_tokens": (("n", "sw", "e"), lambda v: (v["n"], v["sw"], v["e"])),
    "retained_block_range": (("n", "bs", "sw", "e"),
                             lambda v: (v["n"], v["bs"], v["sw"], v["e"])),
    "load_chunk_range": (("N", "L", "bs", "bpc", "sw", "e"),
                         lambda v: (v["N"], v["L"], v["bs"], v["bpc"], v["sw"], v["e"])),
    "get_sliding_window_size_in_chunks": (("sw", "e", "tpc"),
                                          lambda v: (v["sw"], v["e"], v["tpc"])),
    "load_window_size_in_chunks": (("N", "sw", "e", "tpc"),
                                   lambda v: (v["N"], v["sw"], v["e"], v["tpc"])),
}
_SIZES = {"bs", "bpc", "tpc"}


_HOLDS = frozenset(v for v in Verdict if v.passed)
"""Verdicts under which a theorem holds (with some evidence)."""
_NOT_CHECKED = "NOT-CHECKED"
"""The verdict column of a theorem one side of the comparison did not check."""

def _hyps(values: dict[str, Any]) -> list[Any]:
    hyps = []
    for name, value in values.items():
        if name == "sw":
            hyps.append(value >= 2)
        elif name in _SIZES:
            hyps.append(value >= 1)
        else:
            hyps.append(value >= 0)
    return hyps


def _terms(value: Any) -> list[Any]:
    if isinstance(value, tuple):
        return [t for v in value for t in _terms(v)]
    return [value if isinstance(value, z3.ExprRef) else z3.IntVal(int(value))]


def _prove_equal(name: str, old: Implementation, new: Implementation) -> dict[str, Any]:
    """Z3: equal for all values, else per size configuration; or a difference witness."""
    variables, arguments = _ARITH[name]
    f_old, f_new = getattr(old, name), getattr(new, name)

    def attempt(fixed: dict[str, int]) -> tuple[str, dict[str, int] | None]:
        symbols = {v: z3.Int(v) for v in variables if v not in fixed}
        values: dict[str, Any] = {**symbols, **fixed}
        args = arguments(values)
        try:
            a = PathExplorer().lift(f_old, args)
            b = PathExplorer().lift(f_new, args)
        except (LiftError, UpstreamError) as exc:
            return f"not liftable: {exc}", None
        solver = z3.Solver()
        solver.set("rlimit", 50_000_000)  # resources, never seconds: load-independent
        solver.add(*[h for h in _hyps(symbols)])
        solver.add(z3.Or(*[x != y for x, y in zip(_terms(a), _terms(b), strict=True)]))
        verdict = solver.check()
        if verdict == z3.unsat:
            return "equal", None
        if verdict == z3.sat:
            model = solver.model()
            witness = {**fixed, **{k: model.eval(s, model_completion=True).as_long()
                                   for k, s in symbols.items()}}
            return "different", witness
        return "unknown", None

    status, witness = attempt({})
    if status == "equal":
        return {"field": name, "result": "proved equal", "domain": "all values"}
    if status == "different" and witness is not None:
        return _confirm(name, old, new, arguments, witness)
    sizes = [v for v in variables if v in _SIZES]
    configs: list[dict[str, int]] = []
    if "tpc" in sizes:
        configs = [{"tpc": bs * bpc} for bs in BLOCK_SIZES for bpc in BLOCKS_PER_CHUNK]
    elif sizes:
        pools = {"bs": BLOCK_SIZES, "bpc": BLOCKS_PER_CHUNK}
        configs = [dict(zip(sizes, combo, strict=True))
                   for combo in itertools.product(*(pools[s] for s in sizes))]
    for config in configs:
        status, witness = attempt(config)
        if status == "different" and witness is not None:
            return _confirm(name, old, new, arguments, witness)
        if status != "equal":
            return {"field": name, "result": "unknown", "domain": f"{config}: {status}"}
    if not configs:
        return {"field": name, "result": "unknown", "domain": status}
    return {"field": name, "result": "proved equal",
            "domain": f"every {'/'.join(sizes)} of the case split ({len(configs)} configurations)"}


def _confirm(name: str, old: Implementation, new: Implementation,
             arguments: Callable[[dict[str, Any]], tuple[Any, ...]],
             witness: dict[str, int]) -> dict[str, Any]:
    args = arguments(witness)
    try:
        a = getattr(old, name)(*args)
    except Exception as exc:
        a = f"raised {type(exc).__name__}"
    try:
        b = getattr(new, name)(*args)
    except Exception as exc:
        b = f"raised {type(exc).__name__}"
    return {"field": name, "result": "different", "witness": witness,
            "baseline": repr(a), "target": repr(b)}


def _compare_scanner(name: str, old: Implementation, new: Implementation) -> dict[str, Any]:
    count = 0
    states_all = tuple(LookupResult)
    for length in range(1, 7):
        for window in (1, 2, 3):
            for initial in (window, window + 1):
                for states in itertools.product(states_all, repeat=length):
                    count += 1
                    outcomes = []
                    for impl in (old, new):
                        try:
                            if name == "sliding_window_lookup":
                                outcomes.append(repr(impl.sliding_window_lookup(
                                    lambda k, s=states: s[k], 0, length, initial, window)))
                            else:
                                outcomes.append(repr(impl.prefix_lookup(
                                    lambda k, s=states: s[k], 0, length)))
                        except Exception as exc:
                            outcomes.append(f"raised {type(exc).__name__}")
                    if outcomes[0] != outcomes[1]:
                        return {"field": name, "result": "different",
                                "witness": {"states": [s.name for s in states],
                                            "initial_window": initial, "window": window},
                                "baseline": outcomes[0], "target": outcomes[1]}
                if name == "prefix_lookup":
                    break
            if name == "prefix_lookup":
                break
    return {"field": name, "result": "no difference (exhaustive)",
            "domain": f"every lookup-state sequence of length <= 6 ({count} cases); "
                      "longer sequences not proved"}


def _compare_grid(name: str, old: Implementation, new: Implementation) -> dict[str, Any]:
    count = 0
    if name == "store_final_segment_end":
        cases: Any = ((s.value, p, c, r) for s in RequestStatus for r in (None, 0, 32)
                      for p in range(0, 12) for c in range(0, 12))
    elif name == "store_replay_boundaries":
        # (prompt_len, alignment_tokens, retention_interval, use_eagle)
        cases = ((p, a, r, eagle) for a in (None, 4, 16, 48) for r in (None, 0, 96)
                 for eagle in (False, True) for p in range(0, 130))
    else:
        cases = ((b, a, bt, sw, e, eagle, r, f, ())
                 for bt in (4, 16) for a in (bt * 4, bt * 9, None) for r in (None, 0, 2 * (a or 1))
                 for sw in (2, 5, 8, 17) for e in (0, 1, 3) for eagle in (False, True)
                 for f in (None, 7, 12) for b in range(0, 24))
    for args in cases:
        count += 1
        outcomes = []
        for impl in (old, new):
            try:
                outcomes.append(repr(bool(getattr(impl, name)(*args)))
                                if name == "is_block_reachable"
                                else repr(getattr(impl, name)(*args)))
            except Exception as exc:
                outcomes.append(f"raised {type(exc).__name__}")
        if outcomes[0] != outcomes[1]:
            return {"field": name, "result": "different", "witness": {"args": repr(args)},
                    "baseline": outcomes[0], "target": outcomes[1]}
    return {"field": name, "result": "no difference found (not proved)",
            "domain": f"{count} grid cases"}


def compare_field(name: str, old: Implementation, new: Implementation) -> dict[str, Any]:
    """Behaviour of one Implementation field in two targets."""
    if name in _ARITH:
        return _prove_equal(name, old, new)
    if name in ("sliding_window_lookup", "prefix_lookup"):
        return _compare_scanner(name, old, new)
    return _compare_grid(name, old, new)


def _clause_fields(clause: str, rows: list[dict[str, Any]]) -> set[str]:
    fields: set[str] = set()
    for row in rows:
        if row["clause"] == clause:
            fields.update(THEOREM_FIELDS.get(row["theorem"].split("[", 1)[0], ()))
    return fields


def _failing(rows: list[dict[str, Any]], clause: str) -> set[str]:
    return {r["theorem"] for r in rows
            if r["clause"] == clause and r["verdict"] == Verdict.COUNTEREXAMPLE}


def _theorem_changes(base_rows: list[dict[str, Any]],
                     rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per theorem: the verdicts on both sides and whether it was fixed or regressed."""
    before = {(r["clause"], r["theorem"]): r["verdict"] for r in base_rows}
    after = {(r["clause"], r["theorem"]): r["verdict"] for r in rows}
    changes = []
    for key in sorted(set(before) | set(after), key=lambda k: (int(k[0][1:]), k[1])):
        old, new = before.get(key, _NOT_CHECKED), after.get(key, _NOT_CHECKED)
        if old == Verdict.COUNTEREXAMPLE and new != Verdict.COUNTEREXAMPLE:
            kind = "fixed" if new in _HOLDS else "changed"
        elif new == Verdict.COUNTEREXAMPLE and old != Verdict.COUNTEREXAMPLE:
            kind = "regressed" if old in _HOLDS else "changed"
        else:
            kind = "same verdict"
        changes.append({"clause": key[0], "theorem": key[1], "baseline": old, "target": new,
                        "classification": kind})
    return changes


def _violations(rows: list[dict[str, Any]], clause: str) -> str:
    """The clause's failing theorems and the functions blamed, e.g. ``store-horizon
    (store_final_segment_end)``."""
    found = [f"{r['theorem']} ({', '.join(r.get('blame') or []) or '?'})" for r in rows
             if r["clause"] == clause and r["verdict"] == Verdict.COUNTEREXAMPLE]
    return "; ".join(found) or "none"


def compare(base: Binding, base_run: AuditRun, target: Binding, run: AuditRun,
            options: AuditOptions) -> dict[str, Any]:
    """The report's ``comparison`` section."""
    old, new = base.implementation, target.implementation
    assert old is not None and new is not None
    wanted = sorted({f for row in run.rows + base_run.rows
                     for f in THEOREM_FIELDS.get(row["theorem"].split("[", 1)[0], ())
                     if f not in base.missing_fields and f not in target.missing_fields})

    def job(name: str) -> Callable[[], dict[str, Any]]:
        return lambda: compare_field(name, old, new)

    outcomes = run_jobs([(name, job(name)) for name in wanted],
                        workers=options.jobs or 2, job_timeout=options.theorem_timeout,
                        call_timeout=options.call_timeout)
    fields: dict[str, dict[str, Any]] = {}
    for name in wanted:
        outcome = outcomes[name]
        fields[name] = outcome.value if outcome.ok and outcome.value is not None else {
            "field": name, "result": "unknown", "domain": outcome.error.splitlines()[0]}
    base_summary = {e["clause"]: e for e in clause_summary(base_run.rows, base_run.unchecked)}
    new_summary = {e["clause"]: e for e in clause_summary(run.rows, run.unchecked)}
    clauses = []
    for clause in sorted(set(base_summary) | set(new_summary), key=lambda c: int(c[1:])):
        b = base_summary.get(clause, {}).get("status", "not checked")
        t = new_summary.get(clause, {}).get("status", "not checked")
        # A clause with latent findings only holds on every geometry vLLM builds.
        b, t = ("holds" if s == "latent" else s for s in (b, t))
        used = sorted(_clause_fields(clause, run.rows + base_run.rows))
        diffs = [fields[f] for f in used if f in fields and fields[f]["result"] == "different"]
        entry: dict[str, Any] = {"clause": clause, "baseline_status": b, "target_status": t,
                                 "fields": used}
        if b == "violated" and t == "holds":
            entry["classification"] = "fixed"
        elif b == "holds" and t == "violated":
            entry["classification"] = "regressed"
        elif b == t == "violated":
            old_failing = _failing(base_run.rows, clause)
            new_failing = _failing(run.rows, clause)
            if new_failing < old_failing:
                entry["classification"] = "partly fixed"
            elif new_failing > old_failing:
                entry["classification"] = "partly regressed"
            else:
                entry["classification"] = "still violated"
            before = _violations(base_run.rows, clause)
            after = _violations(run.rows, clause)
            entry["evidence"] = (f"same findings: {after}" if before == after else
                                 f"findings changed: {before} -> {after}")
        elif b == t == "holds":
            if diffs:
                entry["classification"] = "changed, conforming"
                first = diffs[0]
                entry["evidence"] = (f"{first['field']} differs at {first['witness']}: "
                                     f"{first['baseline']} -> {first['target']}")
            elif used and all(fields.get(f, {}).get("result") == "proved equal" for f in used):
                entry["classification"] = "unchanged (proved equivalent)"
                entry["evidence"] = "; ".join(f"{f}: {fields[f]['domain']}" for f in used)
            else:
                entry["classification"] = "no difference found (not proved)"
                entry["evidence"] = "; ".join(
                    f"{f}: {fields[f]['result']} ({fields[f].get('domain', '')})"
                    for f in used if f in fields)
        else:
            entry["classification"] = f"{b} -> {t}"
        clauses.append(entry)
    regressed = any(e["classification"] == "regressed" for e in clauses)
    return {
        "baseline": base.target.spec,
        "target": target.target.spec,
        "clauses": clauses,
        "fields": [fields[f] for f in wanted],
        "theorems": _theorem_changes(base_run.rows, run.rows),
        "baseline_results": base_run.rows,
        "exit_code": EXIT_FINDING if regressed else EXIT_OK,
    }


# -- --baseline git:REF: the target's own files at a git revision --------------------------
GIT_PREFIX = "git:"
"""``--baseline git:REF``: the audited target's files at revision REF of the git
repository that contains them (read with ``git show``; the checkout is not touched)."""


def is_git_baseline(spec: str | None) -> bool:
    return spec is not None and spec.strip().startswith(GIT_PREFIX)


@dataclass(frozen=True)
class GitTarget(Target):
    """The audited target's files as they were at a git revision."""

    ref: str = ""
    commit: str = ""
    original: str = ""
    """What the audited target itself displays as."""

    def display(self) -> str:
        return f"{self.original} at git {self.ref} ({self.commit[:12]})"


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    git = shutil.which("git")
    if git is None:
        raise UsageError("--baseline git:REF needs git, which is not on PATH")
    try:
        return subprocess.run([git, *args], cwd=cwd, capture_output=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--baseline git:REF: git {' '.join(args[:2])} failed: {exc}") from None


def _first_line(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return text.splitlines()[0] if text else "no message"


def git_baseline_target(spec: str, target: Target, into: Path) -> GitTarget:
    """Materialize ``git:REF`` for ``target``: every file the target audits, read at REF
    from the repository that contains it, written under ``into`` in the same layout.

    A target outside a git repository, an unknown revision, or a revision holding none
    of the target's files is a usage/input error (exit 2) naming it."""
    ref = spec.strip()[len(GIT_PREFIX):].strip()
    if not ref:
        raise UsageError("--baseline git:REF needs a revision, e.g. git:HEAD~1, git:main, "
                         "git:origin/main or a commit")
    if ref.startswith("-") or any(c in ref for c in "\0\n\r"):
        raise UsageError(f"--baseline git:{ref}: not a revision")
    if target.kind == "builtin" or not target.files:
        raise UsageError(f"--baseline {spec}: the target {target.spec} has no files in a "
                         "git repository; git:REF needs --target vllm:PATH or "
                         "module:FILE.py")
    files = [Path(f).resolve() for f in target.files]
    anchor = (target.package_dir.resolve() if target.package_dir is not None
              else files[0].parent)
    top = _git(["rev-parse", "--show-toplevel"], anchor)
    if top.returncode != 0:
        raise InputFileError(str(anchor), f"not inside a git repository, so --baseline "
                                          f"{spec} has nothing to read ({_first_line(top.stderr)})")
    root = Path(top.stdout.decode().strip()).resolve()
    found = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], root)
    if found.returncode != 0:
        raise UsageError(f"--baseline git:{ref}: no such revision in the git repository at "
                         f"{root} (a branch, tag or commit; fetch it first, e.g. "
                         "actions/checkout with fetch-depth: 0)")
    commit = found.stdout.decode().strip()
    tree = into / "tree"
    written: list[Path] = []
    for path in files:
        try:
            relative = path.relative_to(root)
        except ValueError:
            raise InputFileError(str(path), f"outside the git repository at {root}") from None
        shown = _git(["show", f"{commit}:{relative.as_posix()}"], root)
        if shown.returncode != 0:
            continue  # not in that revision: its functions are reported missing
        copy = tree / relative
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(shown.stdout)
        written.append(copy)
    if not written:
        shown_files = ", ".join(str(p.relative_to(root)) for p in files)
        raise InputFileError(f"git:{ref}", f"none of the audited files ({shown_files}) "
                                           f"exists at {commit[:12]} in {root}")
    package_dir = None
    version = None
    if target.package_dir is not None:
        package_dir = tree / target.package_dir.resolve().relative_to(root)
        version_file = target.package_dir.resolve() / "_version.py"
        with contextlib.suppress(ValueError):
            shown = _git(["show", f"{commit}:{version_file.relative_to(root).as_posix()}"],
                         root)
            if shown.returncode == 0:
                (package_dir / "_version.py").write_bytes(shown.stdout)
                version = _version_of(package_dir)
    # A patch laid over a base release is compared with its revision over the same base.
    return GitTarget(spec=f"{GIT_PREFIX}{ref}", kind=target.kind,
                     name=f"{target.name}@{ref}", package_dir=package_dir,
                     files=tuple(written), version=version, ref=ref, commit=commit,
                     original=target.display(), base=target.base)
