"""``kvcontract merge``: the shards of one run (``--shard I/N`` of ``prove``, ``fuzz``,
``audit`` or ``mutate``) joined into the report the unsharded run writes: the same
results in the same order, the same exit code;
only timing-like fields differ (``seconds`` and a result's ``cached``). Z3's resource
counts (``rlimit_used``) must be equal too: every theorem is proved in a fresh child of
one template process (:mod:`kvcontract.proofs.pool`), so its count depends on the
theorem and the commit, not on what else a machine proved.

Every shard report carries a ``shard`` object (:func:`kvcontract.proofs.shards.
shard_section`): its index and count, the positions of the unsharded work list it ran
and a digest of that list. Shards are merged only when they agree on everything the
unsharded run would have had once: command, kvcontract version, implementation,
scope, selection, ``--fail-on``, and every index 1..N is present exactly once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kvcontract.errors import UsageError
from kvcontract.vocabulary import (
    Verdict,
    finding_exit_code,
    parse_impacts,
    worst_exit_code,
)

SHARD_KEY = "shard"

MERGEABLE = ("prove", "fuzz", "audit", "mutate")
"""Commands whose reports can be sharded and merged."""

AGREE = ("command", "target", "fail_on", "geometries", "device")
"""Top-level fields every shard must share (absent counts as a value)."""

SECTION_AGREE = ("count", "total", "selection", "kvcontract_version", "family_shards",
                 "examples", "seed", "budget", "timeout", "sample", "functions", "fuzz")
"""Fields of the ``shard`` objects every shard must share."""

AUDIT_AGREE = {"target_kind": "the kind of target", "vllm_version": "the vLLM version",
               "bindings": "the bound upstream functions (different code, or files at "
                           "other paths)",
               "unchecked": "the theorems that could not be checked",
               "notes": "the report notes", "require_complete": "--require-complete"}
"""Audit report fields every shard must share (each shard binds the same target and
lists the whole run's unchecked theorems), and how a difference is named."""

IGNORED_RESULT_FIELDS = ("seconds", "cached")
"""Per-result fields that may differ between a merged and an unsharded report: times,
and whether the result was read from the proof cache."""


def _fail(message: str) -> UsageError:
    return UsageError(f"kvcontract merge: {message}")


def _section(name: str, report: Mapping[str, Any]) -> dict[str, Any]:
    section = report.get(SHARD_KEY)
    if not isinstance(section, Mapping):
        raise _fail(f"{name} is not a shard report (it has no 'shard' object); merge the "
                    "JSON reports of `kvcontract prove --shard I/N`, `kvcontract fuzz "
                    "--shard I/N` or `kvcontract audit --shard I/N` runs")
    for key in ("index", "count", "total", "positions", "selection"):
        if key not in section:
            raise _fail(f"{name}: its 'shard' object lacks {key!r} (not written by this "
                        "kvcontract?)")
    positions = section["positions"]
    if (not isinstance(positions, list)
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in positions)):
        raise _fail(f"{name}: shard.positions must be a list of integers")
    return dict(section)


def check_shards(reports: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The ``shard`` objects of ``(file name, report)`` pairs, in shard order, once every
    shard is present exactly once and all agree; a :class:`UsageError` saying what to
    fix otherwise."""
    if not reports:
        raise _fail("give the JSON reports of every shard (kvcontract merge A.json B.json)")
    sections = [_section(name, report) for name, report in reports]
    first_name, first = reports[0]
    if first.get("command") not in MERGEABLE:
        raise _fail(f"{first_name}: merging {first.get('command')!r} reports is not "
                    f"supported (only {', '.join(MERGEABLE)})")
    for (name, report), section in zip(reports[1:], sections[1:], strict=True):
        for key in AGREE:
            if report.get(key) != first.get(key):
                raise _fail(f"{name} and {first_name} differ in {key!r} "
                            f"({report.get(key)!r} vs {first.get(key)!r}): they are shards "
                            "of different runs")
        for key in SECTION_AGREE:
            if section.get(key) != sections[0].get(key):
                what = {"selection": "the selected theorems or scenarios",
                        "kvcontract_version": "the kvcontract version",
                        "total": "the size of the work list (another selection)",
                        "budget": "--budget", "timeout": "--timeout"}.get(key, key)
                raise _fail(f"{name} and {first_name} differ in {what} "
                            f"({section.get(key)!r} vs {sections[0].get(key)!r}): they are "
                            "shards of different runs")
        if first.get("command") == "audit":
            for key, what in AUDIT_AGREE.items():
                if report.get(key) != first.get(key):
                    raise _fail(f"{name} and {first_name} differ in {what}: they are "
                                "shards of different runs")
    count = sections[0]["count"]
    seen: dict[int, str] = {}
    for (name, _), section in zip(reports, sections, strict=True):
        index = section["index"]
        if index in seen:
            raise _fail(f"shard {index}/{count} is given twice ({seen[index]} and {name})")
        seen[index] = name
    missing = [i for i in range(1, count + 1) if i not in seen]
    if missing:
        raise _fail(f"shard{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(f'{i}/{count}' for i in missing)} missing: give the "
                    f"reports of all {count} shards")
    order = sorted(range(len(sections)), key=lambda k: sections[k]["index"])
    positions = [p for section in sections for p in section["positions"]]
    if sorted(positions) != list(range(int(sections[0]["total"]))):
        raise _fail("the shards do not cover the run's work list exactly once (reports "
                    "edited, or written by different kvcontract versions)")
    return [sections[k] for k in order]


def merge(reports: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The unsharded report of ``(file name, report)`` pairs (validated by
    :func:`check_shards`); the prove report's findings baseline is left to the
    caller (``finish_gate``), as the prove command applies it."""
    check_shards(reports)
    if reports[0][1]["command"] == "prove":
        return _merge_prove(reports)
    if reports[0][1]["command"] == "mutate":
        return merge_mutate(reports)
    if reports[0][1]["command"] == "audit":
        return _merge_audit(reports)
    return _merge_fuzz(reports)


def _fail_on(report: Mapping[str, Any]) -> frozenset[Any]:
    words = report.get("fail_on")
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise _fail("a shard report has no 'fail_on' list")
    try:
        return parse_impacts(",".join(words)) if words else frozenset()
    except ValueError as exc:
        raise _fail(f"a shard report's fail_on: {exc}") from None


def _merge_prove(reports: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    first = reports[0][1]
    placed: list[tuple[int, dict[str, Any]]] = []
    not_run: list[tuple[int, str]] = []
    for name, report in reports:
        section = report[SHARD_KEY]
        ids = section.get("theorems")
        if not isinstance(ids, list) or len(ids) != len(section["positions"]):
            raise _fail(f"{name}: shard.theorems must list the shard's theorem ids")
        where = dict(zip(ids, section["positions"], strict=True))
        rows = report.get("results")
        if not isinstance(rows, list):
            raise _fail(f"{name} has no 'results' list")
        done = set()
        for row in rows:
            theorem_id = f"{row.get('clause')}/{row.get('theorem')}"
            if theorem_id not in where:
                raise _fail(f"{name}: the result {theorem_id} is not one of its shard's "
                            "theorems")
            done.add(theorem_id)
            placed.append((where[theorem_id], dict(row)))
        not_run += [(where[i], i) for i in ids if i not in done]
    placed.sort(key=lambda pair: pair[0])
    results = [row for _, row in placed]
    fail_on = _fail_on(first)
    merged: dict[str, Any] = {
        "version": first["version"],
        "command": "prove",
        "target": first["target"],
        "clauses": sorted({r["clause"] for r in results}, key=lambda c: int(c[1:])),
        "seconds": max(float(r.get("seconds", 0.0)) for _, r in reports),
        "fail_on": first["fail_on"],
        "exit_code": finding_exit_code(((Verdict(r["verdict"]), r.get("impact"))
                                        for r in results), fail_on),
        "results": results,
    }
    if first.get("geometries"):
        merged["geometries"] = first["geometries"]
    from kvcontract.tools.audit.defects import attach_defects

    attach_defects(merged)  # the shards' rows carry their root causes
    if not_run:
        merged["not_run"] = [i for _, i in sorted(not_run)]
    return merged


def _merge_fuzz(reports: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    first = reports[0][1]
    per_clause: Counter[str] = Counter()
    placed: list[tuple[int, int, dict[str, Any]]] = []
    for name, report in reports:
        section = report[SHARD_KEY]
        differences = report.get("differences")
        at = section.get("difference_positions")
        if (not isinstance(differences, list) or not isinstance(at, list)
                or len(at) != len(differences)):
            raise _fail(f"{name}: a fuzz shard report needs 'differences' and "
                        "shard.difference_positions of the same length")
        per_clause.update({str(k): int(v) for k, v in report.get("per_clause", {}).items()})
        placed += [(int(p), n, dict(d)) for n, (p, d) in enumerate(zip(at, differences,
                                                                         strict=True))]
    placed.sort(key=lambda item: (item[0], item[1]))
    differences = [d for _, _, d in placed]
    merged: dict[str, Any] = {
        "version": first["version"],
        "command": "fuzz",
        "target": first["target"],
        "device": first.get("device"),
        "cases": sum(int(r.get("cases", 0)) for _, r in reports),
        "steps": sum(int(r.get("steps", 0)) for _, r in reports),
        "per_clause": dict(sorted(per_clause.items())),
        "fail_on": first["fail_on"],
        "differences": differences,
    }
    if first.get("geometries"):
        merged["geometries"] = first["geometries"]
    return merged


def _row_keys(name: str, report: Mapping[str, Any]) -> list[tuple[int, ...]]:
    """An audit shard's ``shard.row_keys``: each result's place in the unsharded order
    (:func:`kvcontract.tools.audit.engine.run_audit`), one list of integers per row."""
    keys = report[SHARD_KEY].get("row_keys")
    rows = report.get("results")
    if not isinstance(rows, list):
        raise _fail(f"{name} has no 'results' list")
    if (not isinstance(keys, list) or len(keys) != len(rows) or not all(
            isinstance(k, list) and k and all(isinstance(x, int) and not isinstance(x, bool)
                                              for x in k) for k in keys)):
        raise _fail(f"{name}: an audit shard report needs shard.row_keys, a list of "
                    "integers per result")
    return [tuple(k) for k in keys]


def _merge_audit(reports: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The unsharded audit report: the rows in their unsharded order, the clause
    summary recomputed over all of them, the exit code as the audit computes it without
    a findings baseline (the caller applies one with ``apply_gate``, which recomputes
    it); shards never apply one (they refuse it)."""
    from kvcontract.tools.audit.engine import clause_summary
    from kvcontract.vocabulary import EXIT_UNKNOWN

    first = reports[0][1]
    placed: list[tuple[tuple[int, ...], dict[str, Any]]] = []
    for name, report in reports:
        placed += [(key, dict(row)) for key, row in zip(
            _row_keys(name, report), report["results"], strict=True)]
    placed.sort(key=lambda pair: pair[0])
    if len({key for key, _ in placed}) != len(placed):
        raise _fail("two shards report a result at the same place of the run (reports "
                    "edited?)")
    results = [row for _, row in placed]
    unchecked = list(first.get("unchecked") or [])
    fail_on = _fail_on(first)
    if first.get("engine") is not None:
        # Graded over every shard's rows (a shard sees part of the engine's findings).
        from kvcontract.tools.audit.on_engine import grade

        grade(results, first.get("engine"))
    merged: dict[str, Any] = {
        key: first[key] for key in ("version", "command", "target", "target_kind",
                                    "target_description", "vllm_version") if key in first}
    merged.update({
        "seconds": max(float(r.get("seconds", 0.0)) for _, r in reports),
        "results": results,
        "summary": clause_summary(results, unchecked),
        "unchecked": unchecked,
        "bindings": first.get("bindings", []),
        "notes": first.get("notes", []),
        "fail_on": first["fail_on"],
        "exit_code": finding_exit_code(
            ((Verdict.UNKNOWN, None) if r.get("unconfirmed")
             else (Verdict(r["verdict"]), r.get("impact")) for r in results),
            fail_on, empty=EXIT_UNKNOWN),
    })
    if first.get("engine") is not None:
        merged["engine"] = first["engine"]
    from kvcontract.tools.audit.defects import attach_defects

    # Defects group rows alone, so the merge groups all shards' rows; their costs need
    # the bound code, which a shard does not measure (the unsharded audit does).
    attach_defects(merged)
    if first.get("geometries"):
        merged["geometries"] = first["geometries"]
    if first.get("require_complete"):
        merged["require_complete"] = True  # the gate's: unchecked theorems exit 3
        if unchecked:
            merged["exit_code"] = worst_exit_code([merged["exit_code"], EXIT_UNKNOWN])
    # Files a shard wrote stay on its machine: listed in shard order.
    for key in ("reproducers", "pictures", "picture_notes"):
        if any(key in r for _, r in reports):
            merged[key] = [item for _, r in reports for item in r.get(key, [])]
    return merged


def load_mutate_report(name: str, data: Any) -> dict[str, Any]:
    """A ``kvcontract mutate --shard I/N --json`` report, validated enough to merge (its
    mutants and baseline read back): an :class:`InputFileError` naming the file and what
    is wrong otherwise."""
    from kvcontract.errors import InputFileError
    from kvcontract.tools.mutate.campaign import MutationReport

    if not isinstance(data, Mapping) or data.get("command") != "mutate":
        raise InputFileError(name, "not a kvcontract mutate report")
    if data.get("version") != 1:
        raise InputFileError(name, f"unsupported mutate report version {data.get('version')!r}")
    try:
        MutationReport.from_json(dict(data))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputFileError(name, f"not a complete mutate report ({type(exc).__name__}: "
                                   f"{exc})") from None
    return dict(data)


def merge_mutate(reports: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The unsharded campaign's report from its shards' (validated by
    :func:`check_shards`): the mutants in the unsharded order (each shard's
    ``shard.mutants`` names them by id at its positions), the counts, score and
    per-operator table recomputed, the baselines joined (a theorem's verdict is the
    same in every shard: the same unmutated code), ``shard_seconds`` per shard and
    ``seconds`` the longest (the matrix's wall time)."""
    from kvcontract.tools.mutate.campaign import Baseline, MutationReport

    check_shards(reports)
    placed: list[tuple[int, Any]] = []
    verdicts: dict[str, str] = {}
    failing: set[str] = set()
    findings: list[list[str]] = []
    parts: list[tuple[int, MutationReport]] = []
    for name, data in reports:
        report = MutationReport.from_json(dict(data))
        section = data[SHARD_KEY]
        ids = section.get("mutants")
        if not isinstance(ids, list) or len(ids) != len(section["positions"]):
            raise _fail(f"{name}: shard.mutants must list the shard's mutant ids")
        if [m.point.id for m in report.mutants] != ids:
            raise _fail(f"{name}: its mutants are not the ones its shard lists (report "
                        "edited?)")
        placed += list(zip(section["positions"], report.mutants, strict=True))
        for theorem, verdict in report.baseline.verdicts.items():
            if verdicts.setdefault(theorem, verdict) != verdict:
                raise _fail(f"{name}: its baseline verdict of {theorem} ({verdict}) differs "
                            f"from another shard's ({verdicts[theorem]}): shards of "
                            "different code")
        failing |= set(report.baseline.failing)
        findings += [f for f in report.baseline.fuzz_findings if f not in findings]
        parts.append((int(section["index"]), report))
    placed.sort(key=lambda pair: pair[0])
    parts.sort(key=lambda pair: pair[0])
    first = parts[0][1]
    merged = MutationReport(
        target=first.target, total_points=first.total_points, sample=first.sample,
        seed=first.seed, mutants=[m for _, m in placed],
        baseline=Baseline(verdicts=dict(sorted(verdicts.items())), rlimit={},
                          failing=sorted(failing), fuzz_findings=findings,
                          seconds=sum(r.baseline.seconds for _, r in parts)),
        seconds=max(r.seconds for _, r in parts), jobs=max(r.jobs for _, r in parts),
        fuzz=first.fuzz, shard_seconds=[r.seconds for _, r in parts],
    )
    return merged.to_json()


def fuzz_exit_code(report: Mapping[str, Any]) -> int:
    """The exit code of a fuzz report (as ``FuzzReport.exit_code``): 1 when a
    difference's impact is in its ``fail_on``."""
    fail_on = _fail_on(report)
    return finding_exit_code(((Verdict.COUNTEREXAMPLE, d.get("impact"))
                              for d in report.get("differences", [])), fail_on)


DEFECT_RUN_FIELDS = ("explain", "reproduce", "cost")
"""Fields of a defect that depend on the run, not the rows: left out by :func:`comparable`."""


def comparable(report: Mapping[str, Any]) -> dict[str, Any]:
    """``report`` without what may differ between a merged and an unsharded run (its
    ``seconds``, :data:`IGNORED_RESULT_FIELDS`, the ``shard`` object): what tests and
    ``benchmarks/prove_time.py`` compare."""
    data = {k: v for k, v in report.items() if k not in ("seconds", SHARD_KEY)}
    if isinstance(data.get("defects"), list):
        # A defect's commands name the report's file, and its preset cost is measured by
        # an unsharded audit only (it needs the bound code, which the merge does not bind).
        data["defects"] = [{k: v for k, v in d.items() if k not in DEFECT_RUN_FIELDS}
                           for d in data["defects"]]
    if isinstance(data.get("results"), list):
        data["results"] = [{k: v for k, v in row.items() if k not in IGNORED_RESULT_FIELDS}
                           for row in data["results"]]
    return data
