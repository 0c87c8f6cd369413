"""The report shape every renderer reads: :func:`normalize` (validation, the fuzz report
folded into per-clause results), the exit code it stands for, and reading a report file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvcontract.errors import InputFileError, KvContractError, UsageError
from kvcontract.inputs import read_json_file
from kvcontract.spec.clauses import CLAUSES
from kvcontract.tools.reports.fingerprint import fingerprint
from kvcontract.tools.reports.locate import locate
from kvcontract.vocabulary import Impact

REPORT_VERSION = 1

PASS, FAIL, ERROR = "pass", "fail", "error"
_STATUS_OF_VERDICT: dict[str, str] = {
    "PROVED": PASS,
    "PROVED-FOR-DOMAIN": PASS,
    "TESTED": PASS,
    "PASSED": PASS,
    "COUNTEREXAMPLE": FAIL,
    "UNKNOWN": ERROR,
    "VACUOUS": ERROR,
}
"""How each verdict counts: ``pass``; ``fail`` (a counterexample, exit 1); ``error``
(unknown or vacuous, exit 3). A result may carry its own ``status`` for verdicts this
table does not know (an audit's own verdicts)."""


class ReportError(KvContractError):
    """A report dictionary that does not have the versioned shape."""


def normalize(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report in the shape every renderer reads (validated; the input is not changed).

    Raises :class:`ReportError` naming the first thing that is wrong.
    """
    if not isinstance(report, Mapping):
        raise ReportError(f"a report is a JSON object, not {type(report).__name__}")
    version = report.get("version")
    if version != REPORT_VERSION:
        raise ReportError(
            f"unsupported report version {version!r} (this kvcontract reads version "
            f"{REPORT_VERSION})"
        )
    command = report.get("command")
    if not isinstance(command, str) or not command:
        raise ReportError("the report has no 'command' (prove, fuzz or audit)")
    target = report.get("target")
    if not isinstance(target, str):
        raise ReportError("the report has no 'target' (the implementation checked)")
    if "results" in report:
        raw = report["results"]
    elif command == "fuzz" and "differences" in report:
        raw = _fuzz_results(report)
    else:
        raise ReportError("the report has no 'results' list")
    if not isinstance(raw, list):
        raise ReportError("'results' must be a list")
    results = [_normalize_result(r, i, target) for i, r in enumerate(raw)]
    normalized: dict[str, Any] = {
        "version": REPORT_VERSION, "command": command, "target": target, "results": results,
    }
    own = report.get("exit_code")
    if own is not None:
        # A command may know better than its rows (an audit that checked nothing is
        # undecided, exit 3); a report that states its exit code is believed.
        if own not in (0, 1, 2, 3) or isinstance(own, bool):
            raise ReportError(f"'exit_code' must be 0, 1, 2 or 3, not {own!r}")
        normalized["exit_code"] = own
    return normalized


def _normalize_result(raw: Any, index: int, target: str) -> dict[str, Any]:
    where = f"results[{index}]"
    if not isinstance(raw, Mapping):
        raise ReportError(f"{where} is not an object")
    for key in ("clause", "theorem", "verdict"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ReportError(f"{where} has no '{key}'")
    verdict = raw["verdict"]
    status = raw.get("status", _STATUS_OF_VERDICT.get(verdict))
    if status not in (PASS, FAIL, ERROR):
        raise ReportError(
            f"{where} has the unknown verdict {verdict!r} and no 'status' (pass, fail or "
            f"error); known verdicts: {', '.join(_STATUS_OF_VERDICT)}"
        )
    seconds = raw.get("seconds", 0.0)
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        raise ReportError(f"{where}.seconds is not a number")
    witness = raw.get("witness")
    if witness is not None and not isinstance(witness, Mapping):
        raise ReportError(f"{where}.witness is not an object")
    result: dict[str, Any] = {
        "clause": raw["clause"],
        "theorem": raw["theorem"],
        "id": f"{raw['clause']}/{raw['theorem']}",
        "verdict": verdict,
        "status": status,
        "domain": str(raw.get("domain", "")),
        "seconds": float(seconds),
        "witness": dict(witness) if witness is not None else None,
        "message": str(raw.get("message", "")),
        "description": str(raw.get("description", "")),
        "impact": _impact(raw, where, status),
    }
    location = raw.get("location")
    if location is not None:
        result["location"] = _check_location(location, where)
    elif status != PASS:
        found = locate(target, result["id"])
        if found is not None:
            result["location"] = found
    if status == FAIL:
        # A finding's stable identity (tools/reports/fingerprint.py): SARIF's
        # partialFingerprints, the findings baseline, the new/baseline marks.
        result["fingerprint"] = fingerprint(result)
    mark = raw.get("baseline_state")
    if mark is not None:
        if mark not in ("new", "baseline"):
            raise ReportError(f"{where}.baseline_state must be 'new' or 'baseline', not "
                              f"{mark!r}")
        result["baseline_state"] = mark
    return result


def _impact(raw: Mapping[str, Any], where: str, status: str) -> str | None:
    """A finding's impact: its own, else its clause's; None for what is not a finding."""
    impact = raw.get("impact")
    if impact is not None:
        if impact not in {i.value for i in Impact}:
            raise ReportError(f"{where}.impact must be one of "
                              f"{', '.join(i.value for i in Impact)}, not {impact!r}")
        return str(impact)
    if status != FAIL:
        return None
    known = {c.id: c for c in CLAUSES}
    clause = known.get(raw["clause"])
    return clause.impact.value if clause is not None else None


def _check_location(location: Any, where: str) -> dict[str, Any]:
    if (
        not isinstance(location, Mapping)
        or not isinstance(location.get("path"), str)
        or not isinstance(location.get("line"), int)
        or isinstance(location.get("line"), bool)
        or location["line"] < 1
    ):
        raise ReportError(f"{where}.location must be {{\"path\": str, \"line\": int >= 1}}")
    return {"path": location["path"], "line": location["line"]}


def _fuzz_results(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The fuzz report as per-clause results: one COUNTEREXAMPLE per difference and one
    PASSED result per clause that was checked and had none."""
    differences = report.get("differences")
    per_clause = report.get("per_clause", {})
    if not isinstance(differences, list) or not isinstance(per_clause, Mapping):
        raise ReportError("a fuzz report needs 'differences' (list) and 'per_clause' (object)")
    cases = report.get("cases", 0)
    results: list[dict[str, Any]] = []
    failing: set[str] = set()
    seen: dict[str, int] = {}
    for index, diff in enumerate(differences):
        if not isinstance(diff, Mapping) or not isinstance(diff.get("clause"), str):
            raise ReportError(f"differences[{index}] has no 'clause'")
        kind = str(diff.get("kind", "difference"))
        name = f"fuzz-{kind}"
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}-{seen[name]}"
        failing.add(diff["clause"])
        witness = {"kind": "fuzz", "program": list(diff.get("program", []))}
        extra = diff.get("witness")
        if isinstance(extra, Mapping):
            witness.update({k: v for k, v in extra.items() if k not in ("kind", "program")})
        results.append(
            {
                "clause": diff["clause"],
                "theorem": name,
                "verdict": "COUNTEREXAMPLE",
                "domain": f"differential fuzzing, {cases} cases",
                "seconds": 0.0,
                "witness": witness,
                "message": str(diff.get("message", "")),
                "impact": diff.get("impact"),
            }
        )
    for clause, count in per_clause.items():
        if clause in failing:
            continue
        results.append(
            {
                "clause": str(clause),
                "theorem": "fuzz",
                "verdict": "PASSED",
                "domain": f"{count} checks over {cases} cases, no difference",
                "seconds": 0.0,
                "witness": None,
                "message": "",
            }
        )
    order = {c.id: i for i, c in enumerate(CLAUSES)}
    results.sort(key=lambda r: (order.get(r["clause"], len(order)), r["theorem"]))
    return results


def exit_code(normalized: Mapping[str, Any]) -> int:
    """The CLI exit code a normalized report stands for (0, 1 or 3), or its own."""
    if "exit_code" in normalized:
        return int(normalized["exit_code"])
    statuses = {r["status"] for r in normalized["results"]}
    if FAIL in statuses:
        return 1
    if ERROR in statuses:
        return 3
    return 0


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a JSON report; every problem is an InputFileError naming the file."""
    name = os.fspath(path)
    data = read_json_file(name, "a kvcontract report")
    try:
        normalize(data)
    except ReportError as exc:
        raise InputFileError(name, f"not a kvcontract report: {exc}") from None
    return dict(data)


def write_text(path: str, text: str) -> None:
    """Write an output file; an unwritable path is a UsageError naming it."""
    try:
        target = Path(path)
        if target.parent != Path(""):
            target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
