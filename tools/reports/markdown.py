"""The ``markdown`` format: a summary sized for a pull-request comment."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvcontract.tools.reports.common import counts, finding_message, live_line, title
from kvcontract.tools.reports.locate import result_location
from kvcontract.tools.reports.model import PASS, exit_code, normalize

MARKDOWN_LIMIT = 60_000
"""GitHub rejects comments over 65,536 characters; stay below with room for a header."""


def _md_cell(text: str, limit: int = 300) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _baseline_line(section: Mapping[str, Any]) -> str:
    """The findings-baseline summary line."""
    text = (f"Findings baseline `{section['path']}`: **{section['new']} new**, "
            f"{section['baseline']} in the baseline, {len(section['fixed'])} fixed")
    if section.get("not_rechecked"):
        text += f", {len(section['not_rechecked'])} not rechecked"
    only = " (`--fail-on new`: only new findings fail)" if section.get("only_new") else ""
    return text + "." + only


def _defects_section(report: Mapping[str, Any], defects: list[Any]) -> list[str]:
    """The summary's shape (``tools/reports/summary``): how the clauses hold, then a row
    per defect (latent ones last), then every counterexample of each defect folded."""
    from kvcontract.tools.reports.common import cost_line
    from kvcontract.tools.reports.summary import clause_lines

    out = [f"{line}." for line in clause_lines(report)] + [""]
    if not defects:
        return [*out, "No defect.", ""]
    out += ["| # | impact | defect | cost | clauses | where | witness |",
            "|---|---|---|---|---|---|---|"]
    for number, d in enumerate(defects, 1):
        where = ", ".join(f"`{loc['display']}`" for loc in d.get("locations", [])) or "-"
        impact = "latent" if d["latent"] else f"**{d['impact']}**"
        live = d.get("live")
        if isinstance(live, Mapping):
            impact += f" (live: {live['status']})"
        out.append(f"| {number} | {impact} | {_md_cell(d['title'], 120)} `{d['id']}` | "
                   f"{_md_cell(cost_line(d) or '-', 200)} | {' '.join(d['clauses'])} | "
                   f"{where} | {_md_cell(d['witness']['line'], 200)} |")
    out.append("")
    for d in defects:
        out += [f"<details><summary>{d['id']}: {len(d['theorems'])} theorems</summary>", ""]
        out += [f"* `{t}`" for t in d["theorems"]]
        if d.get("live"):
            out += ["", _md_cell(live_line(d), 600)]
        if d.get("explain"):
            out += ["", f"`{d['explain']}`"]
        out += ["", "</details>", ""]
    return out


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
    failing = [r for r in results if r["status"] != PASS]
    found = report.get("findings_baseline")
    section: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    gated = "path" in section
    if code == 0 and failing:
        # Findings that do not fail the run: outside --fail-on, or accepted in the baseline.
        headline = ("nothing new" if gated and section["new"] == 0
                    else "no finding fails the run")
    out = [
        f"### {mark} `{title(normalized)}`: {headline}",
        "",
        f"{len(results)} results: {tally}.",
        "",
    ]
    if gated:
        out += [_baseline_line(section), ""]
    defects = report.get("defects")
    if isinstance(defects, list):
        out += _defects_section(report, defects)
        # Each counterexample is in its defect; the theorem table keeps the rest visible.
        failing = [r for r in failing if r["verdict"] != "COUNTEREXAMPLE"]
    if failing:
        marked = any(r.get("baseline_state") for r in failing)
        extra = (" finding |", "---|") if marked else ("", "")
        out += [f"| clause | theorem | verdict | where | message |{extra[0]}",
                f"|---|---|---|---|---|{extra[1]}"]
        for r in failing:
            loc = result_location(r)
            cell = f" {r.get('baseline_state') or '-'} |" if marked else ""
            out.append(
                f"| {r['clause']} | `{r['theorem']}` | **{r['verdict']}** | "
                f"`{loc['path']}:{loc['line']}` | {_md_cell(finding_message(r))} |{cell}"
            )
        out.append("")
    if gated and section["fixed"]:
        out += [f"Fixed since the baseline ({len(section['fixed'])}; remove them with "
                "`--write-baseline`):", ""]
        out += [f"* {e['clause']} `{e['theorem']}` [{e['impact']}] `{e['fingerprint']}`"
                for e in section["fixed"]]
        out.append("")
    if failing:
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
