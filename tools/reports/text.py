"""The ``text`` format: a plain, uncoloured table (the CLI draws its own rich table)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcontract.tools.reports.common import counts, finding_message, title, witness_text
from kvcontract.tools.reports.gate import summary_lines
from kvcontract.tools.reports.model import PASS, normalize


def render_text(report: Mapping[str, Any]) -> str:
    normalized = normalize(report)
    results = normalized["results"]
    widths = [6, 8, 17]
    for r in results:
        widths[0] = max(widths[0], len(r["clause"]))
        widths[1] = max(widths[1], len(r["theorem"]))
    lines = [title(normalized), ""]
    if isinstance(report.get("defects"), list):
        # The one-screen summary first (tools/reports/summary), then the theorem table.
        from kvcontract.tools.reports.summary import summary_text

        lines = [*summary_text(report).splitlines(), "", *lines]
    header = ("clause", "theorem", "verdict")
    lines.append("  ".join(f"{h:<{w}}" for h, w in zip(header, widths, strict=True)) + "  domain")
    for r in results:
        lines.append(
            f"{r['clause']:<{widths[0]}}  {r['theorem']:<{widths[1]}}  "
            f"{r['verdict']:<{widths[2]}}  {r['domain']}"
        )
    for r in results:
        if r["status"] != PASS:
            lines.append("")
            mark = f" [{r['baseline_state']}]" if r.get("baseline_state") else ""
            lines.append(f"{r['id']}: {r['verdict']}{mark}: {finding_message(r)}")
            if r["witness"]:
                lines.append(f"  witness: {witness_text(r['witness'])}")
            if r.get("fingerprint"):
                lines.append(f"  fingerprint: {r['fingerprint']}")
    gate = summary_lines(report)
    if gate:
        lines += ["", *gate]
    summary = ", ".join(f"{n} {v}" for v, n in counts(results).items())
    lines += ["", f"{normalized['target']}: {len(results)} results: {summary or 'none'}"]
    return "\n".join(lines) + "\n"
