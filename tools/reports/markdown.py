"""The ``markdown`` format: a summary sized for a pull-request comment."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvcontract.tools.reports.common import counts, finding_message, title
from kvcontract.tools.reports.locate import result_location
from kvcontract.tools.reports.model import PASS, exit_code, normalize

MARKDOWN_LIMIT = 60_000
"""GitHub rejects comments over 65,536 characters; stay below with room for a header."""


def _md_cell(text: str, limit: int = 300) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_markdown(report: Mapping[str, Any]) -> str:
    normalized = normalize(report)
    results = normalized["results"]
    code = exit_code(normalized)
    headline = {
        0: "all clauses hold",
        1: "counterexample found",
        2: "usage or input error",
        3: "undecided (unknown, vacuous or nothing checked)",
    }[code]
    mark = {0: "✅", 1: "❌", 2: "⚠️", 3: "⚠️"}[code]
    tally = ", ".join(f"{n} {v}" for v, n in counts(results).items()) or "no results"
    out = [
        f"### {mark} `{title(normalized)}`: {headline}",
        "",
        f"{len(results)} results: {tally}.",
        "",
    ]
    failing = [r for r in results if r["status"] != PASS]
    if failing:
        out += ["| clause | theorem | verdict | where | message |", "|---|---|---|---|---|"]
        for r in failing:
            loc = result_location(r)
            out.append(
                f"| {r['clause']} | `{r['theorem']}` | **{r['verdict']}** | "
                f"`{loc['path']}:{loc['line']}` | {_md_cell(finding_message(r))} |"
            )
        out.append("")
        for r in failing:
            if r["witness"]:
                witness = json.dumps(r["witness"], indent=1, sort_keys=True)
                if len(witness) > 4000:
                    witness = witness[:4000] + "\n… (truncated; see the JSON report)"
                out += [
                    f"<details><summary>witness of {r['id']}</summary>",
                    "",
                    "```json",
                    witness,
                    "```",
                    "",
                    "</details>",
                    "",
                ]
    passing = [r for r in results if r["status"] == PASS]
    if passing:
        out += [
            f"<details><summary>{len(passing)} passing</summary>",
            "",
            "| clause | theorem | verdict | domain |",
            "|---|---|---|---|",
        ]
        out += [
            f"| {r['clause']} | `{r['theorem']}` | {r['verdict']} | {_md_cell(r['domain'], 160)} |"
            for r in passing
        ]
        out += ["", "</details>", ""]
    text = "\n".join(out)
    if len(text) > MARKDOWN_LIMIT:
        cut = text.rfind("\n", 0, MARKDOWN_LIMIT - 200)
        text = text[:cut] + "\n\n… (truncated to fit a pull-request comment; see the JSON report)\n"
    return text
