"""The ``sarif`` format: SARIF 2.1.0 with one rule per clause, for code-scanning uploads."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvcontract.spec.clauses import CLAUSES
from kvcontract.tools.reports.common import finding_message
from kvcontract.tools.reports.fingerprint import fingerprint
from kvcontract.tools.reports.locate import result_location
from kvcontract.tools.reports.model import FAIL, PASS, exit_code, normalize

_TOOL_URI = "https://github.com/kvcontract/kvcontract"
FINGERPRINT_KEY = "kvcontractFinding/v1"
"""The ``partialFingerprints`` key of a result (its value: the finding's fingerprint)."""
_BASELINE_STATE = {"new": "new", "baseline": "unchanged"}
"""SARIF ``baselineState`` of a finding compared with a findings baseline."""


def _rule_name(title: str) -> str:
    return "".join(word.capitalize() for word in title.replace("-", " ").split())


def render_sarif(report: Mapping[str, Any]) -> str:
    from kvcontract import __version__

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
    sarif_results = []
    for r in normalized["results"]:
        if r["status"] == PASS:
            continue
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
