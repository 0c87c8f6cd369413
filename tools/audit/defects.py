"""Defects: an audit's counterexamples grouped by root cause, the unit of its report.

A theorem is the unit of proof; a *defect* is the unit a maintainer acts on. Each
counterexample row carries its root cause (:mod:`kvcontract.tools.audit.root_cause`:
the upstream functions whose replacement by the reference removes it); rows with the
same root cause are one defect. Two refinements keep a defect one thing to fix:

* findings on geometries vLLM does not build (``latent``) are a defect apart from the
  same function's findings on geometries it builds, so a latent finding never hides
  behind, or inflates, a real one;
* a root cause that is a whole loop (upstream's ``_lookup_complete_chunks`` or
  ``_build_store_jobs`` failing where kvcontract's driver over the same primitives
  does not) is split by clause: "replace the whole loop" locates nothing finer, and the
  loop's readiness and maximality findings are different mistakes in it.

A defect's identity (:func:`defect_id`) is its root cause's function names, the latent
mark and (for a loop) the clause: not the witness, the target path or a line number.
So a findings baseline that accepted a defect keeps accepting it when its witness
changes, and a defect is "the same" across releases when the same function is to blame.

Grouping reads only report rows, so it applies alike to a fresh audit, merged shards
and a report read back from JSON (:func:`group_defects`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvcontract.spec.clauses import get_clause
from kvcontract.vocabulary import Impact, Verdict

DEFECT_RULE = "kvcontract-defect/v1"
"""The identity rule above; a new rule means new defect ids."""

_IMPACT_ORDER = {impact.value: rank for rank, impact in enumerate(Impact)}
_HOW_ORDER = {"rebound": 0, "field": 1, "inferred": 2, "loop": 3, "unisolated": 4}
_KIND_ORDER = {"arith": 1, "system": 2}
"""Witness kinds as headlines, at equal impact: a case (a geometry, a lookup state, a
schedule) reads best, a formula's values next, a system program's log last."""
_END_TO_END_CLAUSE = "C12"
"""Findings of this clause show the consequence (a lost hit end to end): preferred as a
defect's headline witness at equal impact."""


def clause_number(clause: str) -> int:
    try:
        return int(clause[1:])
    except ValueError:
        return 10_000


def _names(cause: Mapping[str, Any] | None) -> tuple[str, ...]:
    if not cause:
        return ()
    names = sorted(str(f.get("qualname")) for f in cause.get("functions", ()))
    return tuple(names) or tuple(sorted(str(f) for f in cause.get("fields", ())))


def _key(row: Mapping[str, Any]) -> tuple[tuple[str, ...], bool, str]:
    cause = row.get("root_cause")
    latent = row.get("impact") == Impact.LATENT.value
    names = _names(cause)
    if not names:
        return (("unattributed",), latent, str(row["clause"]))
    loop = isinstance(cause, Mapping) and cause.get("how") == "loop"
    return (names, latent, str(row["clause"]) if loop else "")


def defect_id(key: tuple[tuple[str, ...], bool, str]) -> str:
    """``D`` and 12 hex digits of the sha256 of the identity (module docstring)."""
    names, latent, clause = key
    text = json.dumps({"rule": DEFECT_RULE, "functions": list(names), "latent": latent,
                       "clause": clause}, sort_keys=True, separators=(",", ":"))
    return "D" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def worst_impact(impacts: Iterable[str | None]) -> str:
    """The most severe impact named (an unnamed one counts as a crash: it always fails)."""
    known = [i or Impact.CRASH.value for i in impacts]
    return min(known, key=lambda i: _IMPACT_ORDER.get(i, 0)) if known else Impact.CRASH.value


def _witness_size(row: Mapping[str, Any]) -> int:
    return len(json.dumps(row.get("witness"), sort_keys=True, default=str))


def _headline(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The row whose witness stands for the defect: the worst impact, then an end-to-end
    consequence, then the smallest witness."""
    return min(rows, key=lambda r: (_IMPACT_ORDER.get(r.get("impact") or Impact.CRASH.value, 0),
                                    r["clause"] != _END_TO_END_CLAUSE,
                                    _KIND_ORDER.get(str((r.get("witness") or {}).get("kind")),
                                                    0),
                                    _witness_size(r), clause_number(r["clause"])))


_STATE_LETTERS = {"HIT": "H", "HIT_PENDING": "P", "MISS": "M", "RETRY": "R"}


def _states(states: Mapping[str, Sequence[str]]) -> str:
    """Lookup states as ``explain --states`` spells them: ``0=MMMPH``."""
    return " ".join(f"{g}=" + "".join(_STATE_LETTERS.get(str(s), "?") for s in seq)
                    for g, seq in states.items())


def witness_line(row: Mapping[str, Any], limit: int = 200) -> str:
    """A witness in one line: a formula witness's values; a case's geometry label, its
    sizes and lookup states, and the finding's message; a producer/consumer case's
    geometry, prompt and what the consumer got."""
    witness = row.get("witness") or {}
    message = " ".join(str(row.get("message") or "").split()).split(" [latent: ", 1)[0]
    if witness.get("kind") == "arith" and isinstance(witness.get("values"), Mapping):
        text = ", ".join(f"{k}={v}" for k, v in witness["values"].items())
    elif witness.get("kind") == "system":
        text = f"scenario {witness.get('scenario')}: {message}"
    elif isinstance(witness.get("producer"), Mapping):
        producer = witness["producer"]
        consumer = witness.get("consumer") or {}
        outcome = message.rsplit(": ", 2)[-2:] if ": " in message else [message]
        text = (f"{producer.get('geometry_name')}, P={producer.get('prompt_len')}, "
                f"{consumer.get('kind', 'consumer')} of {consumer.get('num_tokens')}: "
                + ": ".join(outcome))
    else:
        parts = [str(witness["geometry_name"])] if witness.get("geometry_name") else []
        for key, name in (("num_tokens", "N"), ("local_hit", "L"), ("prompt_len", "P")):
            if key in witness:
                parts.append(f"{name}={witness[key]}")
        if isinstance(witness.get("states"), Mapping):
            parts.append(_states(witness["states"]))
        text = (" ".join(parts) + ": " if parts else "") + message
    return text if len(text) <= limit else text[:limit - 3] + "..."


def short_what(what: str) -> str:
    """A role's description without its parenthesised detail (the title's words)."""
    return what.split(" (", 1)[0].split(";", 1)[0].strip()


def _short(qualname: str) -> str:
    return qualname.rsplit(".", 1)[-1]


def _title(cause: Mapping[str, Any] | None, rows: Sequence[Mapping[str, Any]]) -> str:
    """The defect in words: what the blamed upstream code computes, and (for a whole
    loop) which clause of it fails."""
    functions = list((cause or {}).get("functions", ()))
    if not functions:
        fields = list((cause or {}).get("fields", ()))
        if fields:
            return " + ".join(f"{_field_what(f)} ({f})" for f in fields)
        clause = rows[0]["clause"]
        return f"{get_clause(clause).title} ({clause}): no single function isolated"
    fields = list((cause or {}).get("fields", ()))
    if (cause or {}).get("how") in ("field", "inferred") and fields:
        # The field says what is wrong; the function where it lives.
        where = ", ".join(_short(str(f["qualname"])) for f in functions)
        return f"{' + '.join(_field_what(f) for f in fields)} ({where})"
    what = "; ".join(f"{short_what(str(f.get('what', f.get('role'))))} "
                     f"({_short(str(f['qualname']))})" for f in functions)
    if (cause or {}).get("how") == "loop":
        clause = rows[0]["clause"]
        loops = ", ".join(_short(str(f["qualname"])) for f in functions)
        return f"{get_clause(clause).title} ({clause}) in {loops}"
    return what


FIELD_TITLES: dict[str, str] = {
    "get_num_skipped_tokens": "tokens skipped below the window (retention)",
    "retained_block_range": "retained block range",
    "load_chunk_range": "chunks a hit loads",
    "get_sliding_window_size_in_chunks": "window size W in chunks",
    "load_window_size_in_chunks": "load window lw(N) of an unaligned boundary",
    "sliding_window_lookup": "sliding-window scanner",
    "prefix_lookup": "full-attention prefix scanner",
    "is_block_reachable": "store reachability mask",
    "store_final_segment_end": "store horizon of the final segment",
    "store_replay_boundaries": "replay boundaries the store path stores for",
    "initial_lookup_cap": "the lookup's first candidate under a budget",
    "get_num_offloadable_tokens": "tokens a store step may store",
}
"""What each bundle field computes, in a title's words (a defect located at a field
names what is wrong, not the whole upstream function the field is adapted from)."""


def _field_what(field_name: str) -> str:
    return FIELD_TITLES.get(field_name, field_name.replace("_", " "))


def _relative(path: str) -> str:
    """A location inside the vLLM tree (``vllm/...``), not the audit machine's prefix."""
    marker = "/vllm/"
    if marker in path:
        return "vllm/" + path.rsplit(marker, 1)[1]
    return path


def _locations(cause: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    found = []
    for f in (cause or {}).get("functions", ()):
        if f.get("path"):
            found.append({"path": f["path"], "line": f.get("line"),
                          "display": f"{_relative(str(f['path']))}:{f.get('line')}",
                          "qualname": f.get("qualname")})
    return found


def group_defects(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The defects of a report's rows (counterexamples only), most severe first, then by
    clause; every counterexample belongs to exactly one."""
    groups: dict[tuple[tuple[str, ...], bool, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("verdict") != Verdict.COUNTEREXAMPLE.value:
            continue
        groups.setdefault(_key(row), []).append(row)
    defects: list[dict[str, Any]] = []
    for key, members in groups.items():
        causes: list[Mapping[str, Any]] = [r["root_cause"] for r in members
                                           if isinstance(r.get("root_cause"), Mapping)]
        cause = min(causes, key=lambda c: _HOW_ORDER.get(str(c.get("how")), 9)) \
            if causes else None
        head = _headline(members)
        impacts = sorted({str(r.get("impact") or Impact.CRASH.value) for r in members},
                         key=lambda i: _IMPACT_ORDER.get(i, 0))
        clauses = sorted({str(r["clause"]) for r in members}, key=clause_number)
        from kvcontract.tools.reports.fingerprint import fingerprint

        # A configuration every member needs beyond vLLM's defaults (on_engine.finding_mode):
        # none where one member is found in the default mode, each where they differ
        modes = {r.get("mode") for r in members}
        mode = None if None in modes else " or ".join(sorted(str(m) for m in modes))

        defects.append({
            "id": defect_id(key),
            "title": _title(cause, members),
            "impact": worst_impact(r.get("impact") for r in members),
            "impacts": impacts,
            "latent": key[1],
            # Judged on stand-ins where vLLM's engine could not run (on_engine.grade):
            # shown, never called a defect of the release.
            "unconfirmed": bool(members) and all(r.get("unconfirmed") for r in members),
            "root_cause": cause,
            **({"mode": mode} if mode else {}),
            "locations": _locations(cause),
            "clauses": clauses,
            "theorems": [f"{r['clause']}/{r['theorem']}" for r in members],
            "findings": [fingerprint(r) for r in members],
            "witness": {"theorem": f"{head['clause']}/{head['theorem']}",
                        "impact": head.get("impact"), "line": witness_line(head),
                        "witness": head.get("witness")},
        })
    return sort_defects(defects)


def sort_defects(defects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Most severe first, then by clause and id (how every report lists them)."""
    return sorted(defects, key=lambda d: (_IMPACT_ORDER.get(d["impact"], 0),
                                          clause_number(d["clauses"][0]), d["id"]))


def add_commands(defects: Sequence[dict[str, Any]], target: str,
                 report_file: str | None, command: str = "audit") -> None:
    """Each defect's reproducer and ``explain`` commands, as a user types them (an
    audit's reproducers bind the upstream files; prove's are ``gen-tests``)."""
    report = report_file or "FILE"
    for defect in defects:
        theorem = defect["witness"]["theorem"]
        clause = theorem.split("/", 1)[0]
        if command == "prove":
            defect["reproduce"] = (f"kvcontract gen-tests --impl {target} --clause {clause} "
                                   "--out repro/")
        else:
            defect["reproduce"] = (f"kvcontract audit --target {target} --clause {clause} "
                                   f"--json {report} --reproducers repro/")
        defect["explain"] = f"kvcontract explain --report {report} --defect {defect['id']}"


def prove_clause_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per clause of a prove report: ``holds`` (with the weakest evidence: proved,
    proved for domain) or ``violated`` / ``latent`` / ``unknown``, as the audit's."""
    from kvcontract.spec.clauses import CLAUSES

    evidence = {Verdict.PROVED.value: "proved",
                Verdict.PROVED_FOR_DOMAIN.value: "proved for domain"}
    summary = []
    for clause in CLAUSES:
        own = [r for r in rows if r["clause"] == clause.id]
        if not own:
            continue
        found = [r for r in own if r["verdict"] == Verdict.COUNTEREXAMPLE.value]
        real = [r for r in found if r.get("impact") != Impact.LATENT.value]
        if real:
            status = "violated"
        elif found:
            status = "latent"
        elif any(r["verdict"] not in evidence for r in own):
            status = "unknown"
        else:
            status = "holds"
        entry: dict[str, Any] = {"clause": clause.id, "title": clause.title, "status": status}
        if status == "holds":
            entry["evidence"] = ("proved for domain" if any(
                r["verdict"] == Verdict.PROVED_FOR_DOMAIN.value for r in own) else "proved")
        summary.append(entry)
    return summary


def attach_defects(report: dict[str, Any], report_file: str | None = None) -> None:
    """A report's ``defects`` from its rows (and, for ``prove``, its per-clause
    ``summary``), with the commands that name ``report_file``: what ``audit``, ``prove``
    and ``merge`` all call, so a merged report groups as the unsharded one does. A
    ``prove`` report without a counterexample gets neither."""
    rows = report.get("results") or []
    command = str(report.get("command", "audit"))
    if command == "prove":
        if not any(r.get("verdict") == Verdict.COUNTEREXAMPLE.value for r in rows):
            return
        report["summary"] = prove_clause_summary(rows)
    report["defects"] = group_defects(rows)
    add_commands(report["defects"], str(report["target"]), report_file, command=command)
    add_delays(report["defects"], rows)
    add_crashes(report["defects"], rows)


def add_crashes(defects: Sequence[dict[str, Any]], rows: Sequence[Mapping[str, Any]]) -> None:
    """Each crash defect's ``crash``: the condition under which its headline witness
    fails the request (:func:`kvcontract.tools.audit.costs.crash_of_row`: what is loaded
    while absent or pending, and vLLM's error)."""
    from kvcontract.tools.audit.costs import crash_of_row

    by_id = {f"{r['clause']}/{r['theorem']}": r for r in rows}
    for defect in defects:
        row = by_id.get(defect["witness"]["theorem"])
        if defect["impact"] != Impact.CRASH.value or row is None:
            continue
        crash = crash_of_row(row)
        if crash.get("group") is None and not crash.get("error"):
            continue  # no load to name (a formula's witness): the witness says it all
        crash["text"] = f"fails the request: {crash['condition']}"
        defect["crash"] = crash


def add_delays(defects: Sequence[dict[str, Any]], rows: Sequence[Mapping[str, Any]]) -> None:
    """Each delay defect's ``delay``: what its C3 deferral waits on and whether that is
    bounded (:func:`kvcontract.tools.audit.costs.delay_of`), read from the witness of its
    first C3 finding with lookup states (a scanner's or a program's names no chunk)."""
    from kvcontract.tools.audit.costs import delay_of

    by_id = {f"{r['clause']}/{r['theorem']}": r for r in rows}
    for defect in defects:
        if defect["latent"] or Impact.DELAY.value not in defect["impacts"]:
            continue
        found = [by_id[t] for t in defect["theorems"] if t.startswith("C3/") and t in by_id
                 and by_id[t].get("impact") == Impact.DELAY.value
                 and isinstance((by_id[t].get("witness") or {}).get("states"), Mapping)]
        if found:
            try:
                defect["delay"] = delay_of(found[0])
            except (ValueError, KeyError, TypeError) as exc:
                defect["delay"] = {"text": "", "error": f"{found[0]['theorem']}: {exc}"}


def compare_defects(baseline: Sequence[Mapping[str, Any]],
                    target: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per defect of either side: ``fixed`` (only the baseline has it), ``new`` (only the
    target), ``changed`` (both, with another worst impact or other clauses), ``still
    present``; new ones first, then changed, still present, fixed."""
    before = {str(d["id"]): d for d in baseline}
    after = {str(d["id"]): d for d in target}
    entries = []
    for defect_id_, defect in after.items():
        old = before.get(defect_id_)
        if old is None:
            classification = "new"
        elif (old["impact"], old["clauses"]) != (defect["impact"], defect["clauses"]):
            classification = "changed"
        else:
            classification = "still present"
        entries.append({"id": defect_id_, "classification": classification,
                        "title": defect["title"], "impact": defect["impact"],
                        "baseline_impact": old["impact"] if old else None,
                        "clauses": defect["clauses"]})
    entries += [{"id": i, "classification": "fixed", "title": d["title"],
                 "impact": d["impact"], "baseline_impact": d["impact"],
                 "clauses": d["clauses"]} for i, d in before.items() if i not in after]
    order = {"new": 0, "changed": 1, "still present": 2, "fixed": 3}
    entries.sort(key=lambda e: (order[e["classification"]], e["id"]))
    return entries


__all__ = [
    "DEFECT_RULE",
    "add_commands",
    "add_crashes",
    "add_delays",
    "attach_defects",
    "clause_number",
    "compare_defects",
    "defect_id",
    "group_defects",
    "prove_clause_summary",
    "short_what",
    "witness_line",
    "worst_impact",
]
