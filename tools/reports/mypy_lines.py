"""The ``mypy`` format: ``path:line: error: [C2] ...`` lines that editors and CI
annotators parse, with the witness as a note and mypy's summary line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcontract.tools.reports.common import finding_message, witness_text
from kvcontract.tools.reports.locate import result_location
from kvcontract.tools.reports.model import PASS, normalize


def render_mypy(report: Mapping[str, Any]) -> str:
    normalized = normalize(report)
    lines: list[str] = []
    files: set[str] = set()
    for r in normalized["results"]:
        if r["status"] == PASS:
            continue
        loc = result_location(r)
        files.add(loc["path"])
        message = finding_message(r) or r["description"] or r["verdict"]
        lines.append(
            f"{loc['path']}:{loc['line']}: error: [{r['clause']}] {r['id']} "
            f"{r['verdict']}: {message}  [kvcontract-{r['clause']}]"
        )
        if r["witness"]:
            witness = witness_text(r["witness"])
            lines.append(f"{loc['path']}:{loc['line']}: note: witness: {witness}")
    count = len([r for r in normalized["results"] if r["status"] != PASS])
    checked = len(normalized["results"])
    if count:
        plural = "s" if count != 1 else ""
        lines.append(
            f"Found {count} error{plural} in {len(files)} file{'s' if len(files) != 1 else ''} "
            f"(checked {checked} theorems)"
        )
    else:
        lines.append(f"Success: no issues found in {checked} theorems")
    return "\n".join(lines) + "\n"
