"""The ``github`` format: GitHub Actions workflow commands, one line per finding.

Printed in a workflow step, each line becomes an annotation on the pull request's diff
(at the defective function's line) and in the run's summary:

* ``::error file=F,line=L,title=T::message`` for a result that fails the run (a
  counterexample whose impact ``--fail-on`` names and, under ``--fail-on new``, that is
  not in the findings baseline; an unknown or vacuous verdict);
* ``::notice ...`` for a ``latent`` finding (a geometry vLLM does not build) that does
  not fail the run;
* ``::warning ...`` for the other findings (reported, not failing: an impact outside
  ``--fail-on``, a finding in the baseline);
* ``::notice title=...::`` for each baseline entry the run shows fixed (no file).

Escaping follows GitHub's runner (``@actions/core``'s ``command.ts``): in the message
``%``, ``\\r`` and ``\\n`` become ``%25``, ``%0D``, ``%0A``; in a property value also
``:`` and ``,`` become ``%3A`` and ``%2C``. GitHub shows at most 10 errors and 10
warnings per step; the SARIF upload and the Markdown summary carry every finding.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvcontract.tools.reports.common import defect_message, finding_message, witness_text
from kvcontract.tools.reports.gate import fail_on_of, fails_run
from kvcontract.tools.reports.locate import display_path, result_location
from kvcontract.tools.reports.model import PASS, normalize

WITNESS_LIMIT = 600
"""Characters of a witness in an annotation (the JSON report keeps it whole)."""


def escape_data(text: str) -> str:
    """A workflow command's message, escaped."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value (``file``, ``title``...), escaped."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(level: str, message: str, **properties: str | int) -> str:
    """One workflow command line: ``::level key=value,...::message``."""
    props = ",".join(f"{key}={escape_property(str(value))}"
                     for key, value in properties.items() if value not in (None, ""))
    return f"::{level}{' ' + props if props else ''}::{escape_data(message)}"


def _path(path: str) -> str:
    """A location as GitHub wants it: relative to the workspace when it lies inside the
    working directory (annotations attach to the diff by relative path)."""
    return display_path(path) if Path(path).is_absolute() else path


def _level(row: Mapping[str, Any], failing: bool) -> str:
    if failing:
        return "error"
    if row.get("impact") == "latent":
        return "notice"
    return "warning"


def _defect_lines(report: Mapping[str, Any], normalized: Mapping[str, Any],
                  defects: list[Any], fail_on: Any, only_new: bool) -> list[str]:
    """One annotation per defect, at its root cause's line: an error when one of its
    findings fails the run, a notice when it is latent, else a warning."""
    rows = {f"{r['clause']}/{r['theorem']}": r for r in normalized["results"]}
    marks = {str(r.get("fingerprint")): r.get("baseline_state")
             for r in report.get("results", []) if isinstance(r, Mapping)}
    lines = []
    for d in defects:
        members = [rows[t] for t in d["theorems"] if t in rows]
        failing = any(fails_run({**r, "baseline_state": marks.get(str(fp))}, fail_on, only_new)
                      for r, fp in zip(members, d.get("findings", []), strict=False))
        level = "error" if failing else ("notice" if d["latent"] else "warning")
        if d.get("locations"):
            path, line = str(d["locations"][0]["path"]), d["locations"][0].get("line")
        else:
            loc = result_location(members[0]) if members else {"path": "", "line": 1}
            path, line = str(loc["path"]), loc["line"]
        state = {marks.get(str(fp)) for fp in d.get("findings", [])} - {None}
        title = f"kvcontract {d['impact']}: {d['title']}"
        if state:
            title += " (new)" if "new" in state else " (baseline)"
        message = defect_message(d) + f"\ntheorems: {', '.join(d['theorems'])}"
        message += f"\ndefect: {d['id']}"
        lines.append(command(level, message, file=_path(path), line=line or 1, title=title))
    return lines


def render_github(report: Mapping[str, Any]) -> str:
    normalized = normalize(report)
    fail_on, only_new = fail_on_of(report)
    lines = []
    defects = report.get("defects")
    if isinstance(defects, list):
        lines += _defect_lines(report, normalized, defects, fail_on, only_new)
    for r in normalized["results"]:
        if r["status"] == PASS:
            continue
        if isinstance(defects, list) and r["verdict"] == "COUNTEREXAMPLE":
            continue  # annotated once, with its defect
        loc = result_location(r)
        level = _level(r, fails_run(r, fail_on, only_new))
        mark = r.get("baseline_state")
        impact = r.get("impact")
        title = f"kvcontract {r['clause']} {r['verdict']}"
        if impact:
            title += f" [{impact}]"
        if mark:
            title += f" ({mark})"
        message = f"{r['id']}: {finding_message(r) or r['description'] or r['verdict']}"
        if r["witness"]:
            witness = witness_text(r["witness"])
            if len(witness) > WITNESS_LIMIT:
                witness = witness[:WITNESS_LIMIT] + "... (the JSON report has it whole)"
            message += f"\nwitness: {witness}"
        if r.get("fingerprint"):
            message += f"\nfingerprint: {r['fingerprint']}"
        lines.append(command(level, message, file=_path(str(loc["path"])), line=loc["line"],
                             title=title))
    section = report.get("findings_baseline")
    if isinstance(section, Mapping):
        for entry in section.get("fixed", []):
            lines.append(command(
                "notice",
                f"{entry['clause']}/{entry['theorem']} ({entry['fingerprint']}) is in the "
                f"findings baseline {section.get('path')} but no longer found: remove it "
                "(--write-baseline)",
                title=f"kvcontract {entry['clause']} fixed"))
    return "".join(line + "\n" for line in lines)
