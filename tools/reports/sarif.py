"""The ``sarif`` format: SARIF 2.1.0 with one rule per clause, for code-scanning uploads."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvcontract.spec.clauses import CLAUSES
from kvcontract.tools.reports.common import finding_message
from kvcontract.tools.reports.locate import result_location
from kvcontract.tools.reports.model import FAIL, PASS, exit_code, normalize

_TOOL_URI = "https://github.com/kvcontract/kvcontract"


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
        properties: dict[str, Any] = {
            "theorem": r["id"], "verdict": r["verdict"], "domain": r["domain"],
        }
        if r["witness"]:
            properties["witness"] = r["witness"]
        sarif_results.append(
            {
                "ruleId": r["clause"],
                "ruleIndex": index[r["clause"]],
                "level": "error" if r["status"] == FAIL else "warning",
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
                "partialFingerprints": {
                    "kvcontractTheorem/v1": f"{normalized['target']}:{r['id']}",
                },
                "properties": properties,
            }
        )
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
