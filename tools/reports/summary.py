"""The one-screen summary of a report with defects (an audit), as plain lines.

What a maintainer reads first, in 80 columns and under 50 lines: the target and its
release, the defects by impact and the exit code, which clauses hold and how (proved,
exhausted, tested), then a short block per defect on a geometry vLLM builds (its title
in words, impact and the clauses it breaks, its cost in the user's units, its witness
in one line, where it is, the command that draws it) and a line per latent defect.
The terminal (``tools/audit/report.print_summary``), the ``text`` format and the
Markdown comment print these same lines, so the three never disagree.

Lines that hold a path or a command are never wrapped or cut (a user copies them); the
others are cut at the width with ``...`` (the JSON report has everything whole).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from kvcontract.tools.reports.common import cost_line, live_line

SUMMARY_WIDTH = 80
"""Columns the summary is laid out for."""

EVIDENCE_WORDS = {"proved": "proved", "proved for domain": "proved for a domain",
                  "exhausted": "exhausted", "examples": "tested"}
"""How a clause holds, in the summary's words (``examples``: a bounded search)."""

Line = tuple[str, str]
"""A line of text and its rich style (empty: none)."""

_SEVERE = ("crash", "corruption", "lost-hit", "stall")


def fit(text: str, width: int = SUMMARY_WIDTH) -> str:
    """``text`` cut to ``width`` with ``...``."""
    return text if len(text) <= width else text[:width - 3] + "..."


def wrapped(text: str, indent: str, lines: int = 2, width: int = SUMMARY_WIDTH) -> list[str]:
    """``text`` in at most ``lines`` lines of ``width``, continued under ``indent``, cut
    at a word (the last line shortened with ``...``)."""
    found = textwrap.wrap(text, width=width, subsequent_indent=indent,
                          break_long_words=False, break_on_hyphens=False)
    if lines < 2:
        return [fit(text, width)]
    if len(found) > lines:
        rest = " ".join(part.strip() for part in found[lines - 1:])
        found = [*found[:lines - 1], fit(indent + rest, width)]
    return found


def clause_lines(report: Mapping[str, Any]) -> list[str]:
    """The clauses that hold and how, then those violated, latent or undecided."""
    held: dict[str, list[str]] = {}
    others: dict[str, list[str]] = {}
    for entry in report.get("summary", []):
        if entry["status"] == "holds":
            evidence = str(entry.get("evidence", ""))
            held.setdefault(EVIDENCE_WORDS.get(evidence, evidence), []).append(entry["clause"])
        else:
            others.setdefault(entry["status"], []).append(entry["clause"])
    lines = ["clauses that hold: " + ("; ".join(f"{' '.join(c)} {word}"
                                                for word, c in held.items()) or "none")]
    if others:
        lines.append("clauses " + "; ".join(f"{status}: {' '.join(c)}"
                                            for status, c in others.items()))
    return lines


def _tally(defects: list[Mapping[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for defect in defects:
        counts[defect["impact"]] = counts.get(defect["impact"], 0) + 1
    from kvcontract.vocabulary import Impact

    order = [i.value for i in Impact]
    return ", ".join(f"{counts[i]} {i}" for i in order if i in counts)


def defect_block(number: int, defect: Mapping[str, Any]) -> list[Line]:
    """The lines of one defect on a geometry vLLM builds."""
    also = [i for i in defect["impacts"] if i != defect["impact"]]
    impact = defect["impact"].upper() + (f" (+{', '.join(also)})" if also else "")
    theorems = len(defect["theorems"])
    style = "bold red" if defect["impact"] in _SEVERE else "bold yellow"
    lines: list[Line] = [
        (fit(f"[{number}] {defect['title']}"), "bold"),
        (fit(f"    {impact}; breaks {' '.join(defect['clauses'])} ({theorems} "
             f"theorem{'s' if theorems != 1 else ''}); {defect['id']}"), style),
    ]
    cost = cost_line(defect)
    condition = str((defect.get("crash") or {}).get("condition") or "")
    if cost and condition and condition in defect["witness"]["line"]:
        cost = ""  # the witness says it already
    if cost:
        label = defect["impact"] if defect["impact"] in ("delay", "crash") else "cost"
        indent = " " * (len(label) + 6)
        lines += [(line, "") for line in wrapped(f"    {label}: {cost}", indent)]
    lines += [(line, "") for line in wrapped(f"    witness: {defect['witness']['line']}",
                                             " " * 13)]
    if defect.get("mode"):
        lines += [(line, "") for line in wrapped(f"    needs: {defect['mode']}", " " * 11)]
    live = defect.get("live")
    if isinstance(live, Mapping):
        style = {"confirmed": "bold red", "not reproduced": "bold yellow"}.get(
            str(live["status"]), "")
        lines += [(line, style) for line in wrapped("    " + live_line(defect), " " * 10)]
    lines += [(f"    at {loc['display']}", "") for loc in defect.get("locations", [])[:2]]
    command = defect.get("explain")
    if command:
        lines.append((f"    {command}", ""))
    return lines


def _judge_lines(report: Mapping[str, Any]) -> list[Line]:
    """Who judged upstream's behaviour: vLLM's own engine (its release), or, where it
    could not run, kvcontract's stand-ins and why (an audit of upstream code only)."""
    engine = report.get("engine")
    if not isinstance(engine, Mapping):
        return []
    if engine.get("ran"):
        return [(fit(f"judged on vLLM's engine: {engine.get('release')}"), "")]
    return [(line, "yellow") for line in wrapped(
        f"judged on stand-ins, not run on vLLM: {engine.get('why') or 'stand-ins chosen'}",
        "  ")]


def summary_lines(report: Mapping[str, Any]) -> list[Line]:
    """The summary of a report with ``defects``, as ``(text, style)`` lines."""
    defects = list(report.get("defects") or [])
    release = report.get("vllm_version")
    head = f"kvcontract {report.get('command', 'audit')}: {report['target']}"
    code = report.get("exit_code", 0)
    tally = _tally(defects)
    lines: list[Line] = [
        (head + (f" (vLLM {release})" if release else ""), "bold"),
        (f"{len(defects)} defect{'s' if len(defects) != 1 else ''}"
         + (f" ({tally})" if tally else "") + f"; exit {code}",
         "bold red" if code == 1 else "bold"),
        *((fit(line), "") for line in clause_lines(report)),
    ]
    lines += _judge_lines(report)
    real = [d for d in defects if not d["latent"] and not d.get("unconfirmed")]
    if real:
        lines.append(("", ""))
    for number, defect in enumerate(real, 1):
        lines += defect_block(number, defect)
    unconfirmed = [d for d in defects if not d["latent"] and d.get("unconfirmed")]
    if unconfirmed:
        engine = report.get("engine")
        why = ("vLLM's engine did not reach it before its search stopped"
               if isinstance(engine, Mapping) and engine.get("ran")
               else "judged on stand-ins, not run on vLLM")
        lines += [("", ""), (f"unconfirmed ({why}; exit 3, never a defect of the "
                             "release):", "yellow")]
        lines += [(fit(f"  {d['impact']} {' '.join(d['clauses'])} {d['title']} "
                       f"[{d['id']}]"), "") for d in unconfirmed]
    latent = [d for d in defects if d["latent"]]
    if latent:
        lines += [("", ""), ("latent (a geometry vLLM does not build, or no run of its "
                             "engine shows it; never fail by default):", "cyan")]
        lines += [(fit(f"  {' '.join(d['clauses'])} {d['title']} [{d['id']}]"), "")
                  for d in latent]
    if report.get("unchecked"):
        lines.append((f"{len(report['unchecked'])} theorems not checked (--verbose lists "
                      "them)", "yellow"))
    if defects and report.get("command") == "audit":
        lines.append(("details: --verbose; a pytest reproducer per finding: --reproducers "
                      "DIR", ""))
    elif defects:
        lines += [("", ""), ("reproducers: " + str(defects[0].get("reproduce", "")), "")]
    return lines


def summary_text(report: Mapping[str, Any]) -> str:
    """The summary as plain text (the ``text`` format's first section)."""
    return "\n".join(text for text, _ in summary_lines(report)) + "\n"


__all__ = ["EVIDENCE_WORDS", "SUMMARY_WIDTH", "clause_lines", "cost_line", "defect_block",
           "fit", "summary_lines", "summary_text", "wrapped"]
