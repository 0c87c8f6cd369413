"""The ``sarif`` format: SARIF 2.1.0 with one rule per clause, for code-scanning uploads."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvcontract.spec.clauses import CLAUSES
from kvcontract.tools.reports.common import IMPACT_LEVEL, defect_message, finding_message
from kvcontract.tools.reports.fingerprint import fingerprint
from kvcontract.tools.reports.locate import result_location
from kvcontract.tools.reports.model import FAIL, PASS, exit_code, normalize

_TOOL_URI = "https://github.com/kvcontract/kvcontract"
FINGERPRINT_KEY = "kvcontractFinding/v1"
DEFECT_KEY = "kvcontractDefect/v1"
"""The ``partialFingerprints`` key of an audit defect's result (its defect id)."""
"""The ``partialFingerprints`` key of a result (its value: the finding's fingerprint)."""
_BASELINE_STATE = {"new": "new", "baseline": "unchanged"}
"""SARIF ``baselineState`` of a finding compared with a findings baseline."""


def _rule_name(title: str) -> str:
    return "".join(word.capitalize() for word in title.replace("-", " ").split())


def _physical(path: str, line: Any) -> dict[str, Any]:
    return {"physicalLocation": {"artifactLocation": {"uri": path, "uriBaseId": "SRCROOT"},
                                 "region": {"startLine": int(line or 1)}}}


def _defect_results(report: Mapping[str, Any], normalized: Mapping[str, Any],
                    defects: list[Any], index: Mapping[str, int]) -> list[dict[str, Any]]:
    """One SARIF result per audit defect: its level by its worst impact (crash,
    corruption, lost-hit, stall an error; delay, waste a warning; latent a note), its root
    cause's location, and a related location per theorem it breaks."""
    rows = {f"{r['clause']}/{r['theorem']}": r for r in normalized["results"]}
    states = {str(r.get("fingerprint")): r.get("baseline_state")
              for r in report.get("results", []) if isinstance(r, Mapping)}
    found = []
    for defect in defects:
        clause = defect["clauses"][0]
        related = []
        for number, theorem in enumerate(defect["theorems"]):
            row = rows.get(theorem)
            if row is None:
                continue
            loc = result_location(row)
            related.append({"id": number, **_physical(loc["path"], loc["line"]),
                            "message": {"text": f"{theorem}: {finding_message(row)}"}})
        if defect.get("locations"):
            first = defect["locations"][0]
            locations = [_physical(first["path"], first.get("line"))]
        elif related:
            locations = [{"physicalLocation": related[0]["physicalLocation"]}]
        else:
            loc = result_location(rows[defect["theorems"][0]])
            locations = [_physical(loc["path"], loc["line"])]
        properties: dict[str, Any] = {
            "defect": defect["id"], "impact": defect["impact"],
            "impacts": defect["impacts"], "theorems": defect["theorems"],
            "clauses": defect["clauses"], "witness": defect["witness"],
            "findings": defect["findings"],
        }
        for key in ("cost", "delay", "crash", "live"):
            if defect.get(key):
                properties[key] = defect[key]
        result: dict[str, Any] = {
            "ruleId": clause, "ruleIndex": index[clause],
            "level": IMPACT_LEVEL.get(defect["impact"], "error"), "kind": "fail",
            "message": {"text": defect_message(defect)},
            "locations": locations, "relatedLocations": related,
            "partialFingerprints": {DEFECT_KEY: defect["id"]},
            "properties": properties,
        }
        marks = {states.get(fp) for fp in defect.get("findings", ())} - {None}
        if marks:
            result["baselineState"] = "new" if "new" in marks else "unchanged"
        found.append(result)
    return found


def render_sarif(report: Mapping[str, Any]) -> str:
    from kvcontract.vocabulary import VERSION as __version__

    normalized = normalize(report)
    clauses = [c.id for c in CLAUSES]
    extra = sorted({r["clause"] for r in normalized["results"]} - set(clauses))
    rules: list[dict[str, Any]] = [
        {
            "id": c.id,
            "name": _rule_name(c.title),
            "shortDescription": {"text": f"{c.id} {c.title}"},
            "fullDescription": {"text": c.statement},
            "defaultConfiguration": {"level": "error"},
            "properties": {"checkedBy": c.proved_by},
        }
        for c in CLAUSES
    ]
    rules += [
        {"id": c, "shortDescription": {"text": c}, "defaultConfiguration": {"level": "error"}}
        for c in extra
    ]
    index = {rule["id"]: i for i, rule in enumerate(rules)}
    defects = report.get("defects")
    sarif_results = _defect_results(report, normalized, defects, index) \
        if isinstance(defects, list) else []
    for r in normalized["results"]:
        if r["status"] == PASS:
            continue
        if isinstance(defects, list) and r["verdict"] == "COUNTEREXAMPLE":
            continue  # reported once, with its defect
        loc = result_location(r)
        message = finding_message(r) or r["description"] or r["verdict"]
        if "fingerprint" not in r:  # an undecided result: not a finding of a baseline
            r = {**r, "fingerprint": fingerprint(r)}
        properties: dict[str, Any] = {
            "theorem": r["id"], "verdict": r["verdict"], "domain": r["domain"],
        }
        if r["witness"]:
            properties["witness"] = r["witness"]
        if r.get("impact"):
            properties["impact"] = r["impact"]
        # A latent finding (a geometry vLLM does not build) is a note, not an error.
        level = ("note" if r.get("impact") == "latent"
                 else "error" if r["status"] == FAIL else "warning")
        sarif_results.append(
            {
                "ruleId": r["clause"],
                "ruleIndex": index[r["clause"]],
                "level": level,
                "kind": "fail",
                "message": {
                    "text": f"{r['clause']} violated ({r['id']}, {r['verdict']}): {message}"
                },
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": loc["path"], "uriBaseId": "SRCROOT"},
                            "region": {"startLine": loc["line"]},
                        }
                    }
                ],
                # The finding's stable identity (tools/reports/fingerprint.py): no
                # target, line or run time in it, so code scanning matches an alert
                # across runners, checkouts and unrelated edits.
                "partialFingerprints": {FINGERPRINT_KEY: r["fingerprint"]},
                "properties": properties,
            }
        )
        if r.get("baseline_state"):
            sarif_results[-1]["baselineState"] = _BASELINE_STATE[r["baseline_state"]]
    log = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "kvcontract",
                        "version": __version__,
                        "informationUri": _TOOL_URI,
                        "rules": rules,
                    }
                },
                "automationDetails": {
                    "id": f"kvcontract/{normalized['command']}/{normalized['target']}/"
                },
                "columnKind": "unicodeCodePoints",
                "results": sarif_results,
                "properties": {
                    "command": normalized["command"],
                    "target": normalized["target"],
                    "exitCode": exit_code(normalized),
                },
            }
        ],
    }
    return json.dumps(log, indent=2) + "\n"
