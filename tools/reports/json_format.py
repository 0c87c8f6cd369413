"""The ``json`` format: the versioned report itself, with source locations and the exit
code (a fuzz report also gets the per-clause view every format reads)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvcontract.tools.reports.model import exit_code, normalize


def render_json(report: Mapping[str, Any]) -> str:
    return json.dumps(json_document(report), indent=2, sort_keys=False) + "\n"


def json_document(report: Mapping[str, Any]) -> dict[str, Any]:
    """The document the ``json`` format writes: ``report`` with each row's source
    location and fingerprint, and the exit code (idempotent: a document in, the same
    document out)."""
    normalized = normalize(report)
    data = dict(report)
    if "results" in report:
        results = []
        for original, norm in zip(report["results"], normalized["results"], strict=True):
            row = dict(original)
            if "location" in norm:
                row["location"] = norm["location"]
            if "fingerprint" in norm:
                row["fingerprint"] = norm["fingerprint"]
            results.append(row)
        data["results"] = results
    else:  # fuzz: keep its own fields, add the per-clause view every format reads
        data["results"] = [
            {k: v for k, v in r.items() if k not in ("id", "status")}
            for r in normalized["results"]
        ]
    data.setdefault("exit_code", exit_code(normalized))
    return data
