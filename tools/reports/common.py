"""Small pieces several renderers share: verdict counts, the title line, a witness on
one line, a defect in one line and what the live stage found of it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def counts(results: list[dict[str, Any]]) -> dict[str, int]:
    """How many results have each verdict, by verdict name."""
    tally: dict[str, int] = {}
    for r in results:
        tally[r["verdict"]] = tally.get(r["verdict"], 0) + 1
    return dict(sorted(tally.items()))


def title(normalized: Mapping[str, Any]) -> str:
    """The command line that produced the report (``kvcontract prove --impl NAME``)."""
    # `audit` names what it checks with --target; `prove` and `fuzz` with --impl.
    option = "--target" if normalized["command"] == "audit" else "--impl"
    return f"kvcontract {normalized['command']} {option} {normalized['target']}"


def witness_text(witness: Mapping[str, Any] | None) -> str:
    """A witness as one line of JSON (empty when there is none)."""
    return json.dumps(witness, sort_keys=True) if witness else ""


def finding_message(result: Mapping[str, Any]) -> str:
    """A result's message, led by its impact when it is a finding: ``[crash] ...``."""
    message = " ".join(str(result.get("message") or "").split())
    impact = result.get("impact")
    return f"[{impact}] {message}" if impact and message else message


IMPACT_LEVEL = {"crash": "error", "corruption": "error", "lost-hit": "error", "stall": "error",
                "delay": "warning", "waste": "warning", "latent": "note"}
"""The severity of a defect by its worst impact (SARIF level; GitHub annotation)."""


def cost_line(defect: Mapping[str, Any]) -> str:
    """A defect's cost in the user's units: for a delay, what the deferral waits on and
    whether that is bounded; for a crash, when the request fails; otherwise the preset
    measurement's summary (empty when none was measured)."""
    keys = {"delay": ("delay", "cost"), "crash": ("crash", "cost", "delay")}.get(
        str(defect.get("impact")), ("cost", "delay"))
    for key in keys:
        value = defect.get(key)
        if isinstance(value, Mapping):
            text = value.get("summary") or value.get("text")
            if text:
                return str(text)
    return ""


def live_line(defect: Mapping[str, Any]) -> str:
    """What ``audit --live`` found of a defect on vLLM itself, in one line (empty when
    the report has no live stage): ``live: confirmed on vLLM 0.33.0 (the patch laid
    over it): ...``; every format says it in these words."""
    live = defect.get("live")
    if not isinstance(live, Mapping):
        return ""
    text = f"live: {live['status']}"
    if live.get("vllm"):
        text += f" on vLLM {live['vllm']}"
        if live.get("patched"):
            text += " (the target's code laid over it)"
    detail = live.get("text") or live.get("why")
    return f"{text}: {detail}" if detail else text


def defect_message(defect: Mapping[str, Any]) -> str:
    """A defect in one line: impact, title, cost, clauses and the witness."""
    cost = cost_line(defect)
    parts = [f"[{defect['impact']}] {defect['title']}"]
    if cost:
        parts.append(f"cost: {cost}")
    parts.append(f"breaks {', '.join(defect['clauses'])} ({len(defect['theorems'])} "
                 "theorems)")
    parts.append(f"witness: {defect['witness']['line']}")
    live = live_line(defect)
    if live:
        parts.append(live)
    return "; ".join(parts)
