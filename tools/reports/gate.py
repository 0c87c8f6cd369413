"""The pull-request gate: a findings baseline file and what a run is judged against.

A findings baseline (the convention of mypy, ruff and semgrep baselines) records the
findings a project has accepted, by :func:`~kvcontract.tools.reports.fingerprint.
fingerprint`. ``--write-baseline FILE`` writes one from a run; ``--baseline-file FILE``
reads one; ``--fail-on new`` fails the run only on findings whose fingerprint is not in
it. Every counterexample of the report is then marked ``new`` or ``baseline``
(``baseline_state``), and baseline entries that no longer occur on a theorem the run
checked are listed as ``fixed``.

The file (JSON, deterministic: no time stamps, no paths of the machine, entries sorted)::

    {"version": 1, "kind": "kvcontract-findings-baseline",
     "fingerprint_rule": "kvcontract-finding/v1",
     "command": "audit", "target": "vllm:.", "target_description": "vllm 0.33.0",
     "findings": [{"fingerprint": "3f0c...", "clause": "C4",
                   "theorem": "load-window-exact", "impact": "lost-hit",
                   "message": "lw(N) demands no chunk outside ..."}]}

Extra keys in an entry (a ``reason`` for accepting it, say) are kept by readers and
ignored.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcontract.errors import InputFileError
from kvcontract.inputs import parse_json
from kvcontract.tools.reports.fingerprint import (
    FINGERPRINT_LENGTH,
    FINGERPRINT_RULE,
    fingerprint,
    theorem_identity,
)
from kvcontract.tools.reports.model import FAIL, PASS, normalize, write_text
from kvcontract.vocabulary import (
    DEFAULT_FAIL_ON,
    EXIT_OK,
    Impact,
    Verdict,
    finding_exit_code,
)

BASELINE_VERSION = 1
BASELINE_KIND = "kvcontract-findings-baseline"
NEW, BASELINE = "new", "baseline"
"""The two marks of a finding (``baseline_state``)."""
MESSAGE_LIMIT = 200
"""Characters of a finding's message kept in a baseline entry (one line)."""
_FINGERPRINT = re.compile(rf"^[0-9a-f]{{{FINGERPRINT_LENGTH}}}$")
_DEFECT = re.compile(r"^D[0-9a-f]{12}$")
_MAX_BASELINE_BYTES = 16 * 1024 * 1024
"""A baseline holds one short entry per finding; a larger file is not one."""


@dataclass(frozen=True)
class BaselineEntry:
    fingerprint: str
    clause: str
    theorem: str
    impact: str | None
    message: str = ""
    defect: str | None = None
    """The id of the audit defect the finding belongs to (``tools/audit/defects``): a
    finding of an accepted defect stays accepted when its witness changes."""

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"fingerprint": self.fingerprint, "clause": self.clause,
                                 "theorem": self.theorem, "impact": self.impact,
                                 "message": self.message}
        if self.defect is not None:
            found["defect"] = self.defect
        return found

    @property
    def id(self) -> str:
        return f"{self.clause}/{self.theorem}"


@dataclass(frozen=True)
class FindingsBaseline:
    """A baseline file as read (or as just written)."""

    path: str
    entries: tuple[BaselineEntry, ...]
    command: str | None = None
    target: str | None = None

    @property
    def fingerprints(self) -> frozenset[str]:
        return frozenset(e.fingerprint for e in self.entries)

    @property
    def defects(self) -> frozenset[str]:
        return frozenset(e.defect for e in self.entries if e.defect is not None)


# -- reading ----------------------------------------------------------------------------------
def _entry(raw: Any, index: int, path: str) -> BaselineEntry:
    where = f"findings[{index}]"
    if not isinstance(raw, Mapping):
        raise InputFileError(path, f"{where} is not an object (a baseline entry has "
                                   "fingerprint, clause, theorem, impact, message)")
    value = raw.get("fingerprint")
    if not isinstance(value, str) or not _FINGERPRINT.match(value):
        raise InputFileError(path, f"{where}.fingerprint must be {FINGERPRINT_LENGTH} "
                                   f"lowercase hex digits, not {value!r}")
    for key in ("clause", "theorem"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise InputFileError(path, f"{where} has no '{key}' (a non-empty string)")
    impact = raw.get("impact")
    known = [i.value for i in Impact]
    if impact is not None and impact not in known:
        raise InputFileError(path, f"{where}.impact must be one of {', '.join(known)} or "
                                   f"null, not {impact!r}")
    message = raw.get("message", "")
    if not isinstance(message, str):
        raise InputFileError(path, f"{where}.message must be a string")
    defect = raw.get("defect")
    if defect is not None and (not isinstance(defect, str) or not _DEFECT.match(defect)):
        raise InputFileError(path, f"{where}.defect must be an audit defect id (D and 12 "
                                   f"lowercase hex digits), not {defect!r}")
    return BaselineEntry(value, raw["clause"], raw["theorem"], impact, message, defect)


def load_baseline(path: str | os.PathLike[str]) -> FindingsBaseline:
    """Read and validate a findings baseline; every problem is an
    :class:`~kvcontract.errors.InputFileError` naming the file and what is wrong (the
    command line checks it before any work: exit 2)."""
    name = os.fspath(path)
    if not name or not name.strip():
        raise InputFileError("--baseline-file", "needs a file name, not an empty string")
    file = Path(name).expanduser()
    try:
        if file.is_dir():
            raise InputFileError(name, "a folder, not a baseline file (write one with "
                                       "--write-baseline FILE)")
        if file.stat().st_size > _MAX_BASELINE_BYTES:
            raise InputFileError(name, "larger than 16 MiB: not a findings baseline")
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(name, "no such file; write one with --write-baseline "
                                   f"{name}") from None
    except UnicodeDecodeError:
        raise InputFileError(name, "not UTF-8 text (a baseline is JSON)") from None
    except OSError as exc:
        raise InputFileError(name, f"cannot read it ({exc.strerror or exc})") from None
    data = parse_json(text, name, "a findings baseline")
    if not isinstance(data, Mapping):
        raise InputFileError(name, "a findings baseline is a JSON object with 'version' "
                                   "and 'findings'")
    if data.get("kind", BASELINE_KIND) != BASELINE_KIND:
        raise InputFileError(name, f"'kind' is {data.get('kind')!r}, not {BASELINE_KIND!r} "
                                   "(a report is not a baseline: write one with "
                                   "--write-baseline)")
    if "results" in data and "findings" not in data:
        raise InputFileError(name, "a kvcontract report, not a findings baseline (write "
                                   "one with --write-baseline FILE)")
    if data.get("version") != BASELINE_VERSION:
        raise InputFileError(name, f"unsupported baseline version {data.get('version')!r} "
                                   f"(this kvcontract reads version {BASELINE_VERSION})")
    rule = data.get("fingerprint_rule", FINGERPRINT_RULE)
    if rule != FINGERPRINT_RULE:
        raise InputFileError(name, f"written under fingerprint rule {rule!r}; this "
                                   f"kvcontract uses {FINGERPRINT_RULE!r}: write it again "
                                   "with --write-baseline")
    findings = data.get("findings")
    if not isinstance(findings, list):
        raise InputFileError(name, "'findings' must be a list (empty for no accepted "
                                   "finding)")
    entries = tuple(_entry(raw, i, name) for i, raw in enumerate(findings))
    command, target = data.get("command"), data.get("target")
    return FindingsBaseline(name, entries,
                            command if isinstance(command, str) else None,
                            target if isinstance(target, str) else None)


# -- the findings of a report -------------------------------------------------------------------
def _one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def report_findings(report: Mapping[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(raw row, normalized row)`` of every counterexample of a report with a
    ``results`` list (``prove``, ``audit``), in report order."""
    normalized = normalize(report)
    rows = report.get("results")
    if not isinstance(rows, list):
        return []
    return [(raw, norm) for raw, norm in zip(rows, normalized["results"], strict=True)
            if norm["status"] == FAIL]


def entry_of(row: Mapping[str, Any], defect: str | None = None) -> BaselineEntry:
    """The baseline entry of a (normalized) finding (``defect``: its audit defect)."""
    return BaselineEntry(fingerprint(row), str(row["clause"]), str(row["theorem"]),
                         row.get("impact"), _one_line(str(row.get("message") or "")),
                         defect)


def _defect_of(report: Mapping[str, Any]) -> dict[str, str]:
    """Finding fingerprint -> its defect id, for a report with ``defects`` (an audit)."""
    return {fp: str(d["id"]) for d in report.get("defects") or ()
            for fp in d.get("findings", ())}


def _clause_order(clause: str) -> tuple[int, str]:
    from kvcontract.spec.clauses import CLAUSES

    order = {c.id: i for i, c in enumerate(CLAUSES)}
    return order.get(clause, len(order)), clause


def _sorted(entries: Iterable[BaselineEntry]) -> list[BaselineEntry]:
    unique = {e.fingerprint: e for e in entries}
    return sorted(unique.values(),
                  key=lambda e: (_clause_order(e.clause), e.theorem, e.fingerprint))


def target_description(report: Mapping[str, Any]) -> str:
    """What was checked, without the machine's paths (a committed baseline must not
    change from one machine to the next)."""
    if report.get("command") == "audit" and report.get("target_kind") == "vllm":
        version = report.get("vllm_version")
        return f"vllm {version}" if version else "vllm (version unknown)"
    if report.get("command") == "audit":
        return str(report.get("target"))
    return f"implementation {report.get('target')}"


def baseline_document(report: Mapping[str, Any]) -> dict[str, Any]:
    """The baseline file a report's findings make (see the module docstring)."""
    defect_of = _defect_of(report)
    entries = _sorted(entry_of(norm, defect_of.get(fingerprint(norm)))
                      for _, norm in report_findings(report))
    return {
        "version": BASELINE_VERSION,
        "kind": BASELINE_KIND,
        "fingerprint_rule": FINGERPRINT_RULE,
        "command": report.get("command"),
        "target": report.get("target"),
        "target_description": target_description(report),
        "findings": [e.to_json() for e in entries],
    }


def write_baseline(path: str, report: Mapping[str, Any]) -> FindingsBaseline:
    """Write the baseline of ``report`` to ``path``; returns it as read back."""
    document = baseline_document(report)
    write_text(path, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    entries = tuple(BaselineEntry(**e) for e in document["findings"])
    return FindingsBaseline(path, entries, document["command"], document["target"])


# -- judging a run against a baseline ---------------------------------------------------------
def _checked_theorems(report: Mapping[str, Any]) -> set[tuple[str, str]]:
    """``(clause, theorem)`` of every theorem the run decided (a pass or a
    counterexample); an undecided or unchecked theorem proves nothing fixed."""
    checked = set()
    for row in normalize(report)["results"]:
        if row["status"] in (PASS, FAIL):
            checked.add((row["clause"], theorem_identity(row["theorem"])))
    return checked


def apply_baseline(report: dict[str, Any], baseline: FindingsBaseline | None, *,
                   only_new: bool, written: str | None = None) -> dict[str, Any]:
    """Mark every finding of ``report`` (in place) with its ``fingerprint`` and, given a
    baseline, ``baseline_state`` (``new`` or ``baseline``); add the report's
    ``findings_baseline`` section (path, counts, the ``fixed`` entries and those not
    rechecked) and return it. ``report["exit_code"]`` is left to :func:`gate_exit_code`."""
    found = report_findings(report)
    for raw, norm in found:
        raw["fingerprint"] = fingerprint(norm)
    section: dict[str, Any] = {"rule": FINGERPRINT_RULE, "only_new": only_new}
    if written is not None:
        section["written"] = written
    if baseline is None:
        report["findings_baseline"] = section
        return section
    accepted = baseline.fingerprints
    accepted_defects = baseline.defects
    defect_of = _defect_of(report)
    current = set()
    current_defects = set()
    new = matched = 0
    for raw, _ in found:
        current.add(raw["fingerprint"])
        defect = defect_of.get(raw["fingerprint"])
        if defect is not None:
            current_defects.add(defect)
        if raw["fingerprint"] in accepted or (defect is not None
                                              and defect in accepted_defects):
            raw["baseline_state"] = BASELINE
            matched += 1
        else:
            raw["baseline_state"] = NEW
            new += 1
    checked = _checked_theorems(report)
    # An entry is gone when neither its finding nor (for an audit) its defect is found.
    gone = [e for e in _sorted(baseline.entries) if e.fingerprint not in current
            and (e.defect is None or e.defect not in current_defects)]
    fixed = [e for e in gone if (e.clause, theorem_identity(e.theorem)) in checked]
    unverified = [e for e in gone if (e.clause, theorem_identity(e.theorem)) not in checked]
    notes = []
    if baseline.command and baseline.command != report.get("command"):
        notes.append(f"the baseline was written by `kvcontract {baseline.command}`, this "
                     f"is `kvcontract {report.get('command')}`")
    section.update({
        "path": baseline.path,
        "entries": len(baseline.entries),
        "new": new,
        "baseline": matched,
        "fixed": [e.to_json() for e in fixed],
        "not_rechecked": [e.to_json() for e in unverified],
        "notes": notes,
    })
    report["findings_baseline"] = section
    return section


def fail_on_of(report: Mapping[str, Any]) -> tuple[frozenset[Impact], bool]:
    """The report's ``--fail-on``: its impacts and whether only new findings fail."""
    words = report.get("fail_on")
    impacts = DEFAULT_FAIL_ON
    if isinstance(words, list):
        known = {i.value: i for i in Impact}
        impacts = frozenset(known[w] for w in words if w in known)
    section = report.get("findings_baseline")
    only_new = bool(section.get("only_new")) if isinstance(section, Mapping) else False
    return impacts, only_new


def fails_run(row: Mapping[str, Any], fail_on: frozenset[Impact], only_new: bool) -> bool:
    """Whether one (normalized) result fails the run: a counterexample whose impact
    ``fail_on`` names (one without an impact always), unless ``only_new`` and it is in
    the baseline; an undecided result (unknown, vacuous) always does."""
    status = row.get("status")
    if status == PASS:
        return False
    if status != FAIL:
        return True
    if only_new and row.get("baseline_state") == BASELINE:
        return False
    impact = row.get("impact")
    return impact is None or Impact(impact) in fail_on


def gate_exit_code(results: Iterable[Mapping[str, Any]], fail_on: frozenset[Impact],
                   only_new: bool, *, empty: int = EXIT_OK) -> int:
    """The exit code of report rows under ``--fail-on`` (``only_new``: a finding in the
    baseline passes), by :func:`kvcontract.vocabulary.finding_exit_code`."""
    pairs: list[tuple[Verdict | str, Impact | str | None]] = []
    for row in results:
        if only_new and row.get("baseline_state") == BASELINE:
            pairs.append((Verdict.PASSED, None))
        elif row.get("unconfirmed"):
            # Judged on stand-ins where vLLM's engine could not run: undecided (3).
            pairs.append((Verdict.UNKNOWN, None))
        else:
            pairs.append((row["verdict"], row.get("impact")))
    return finding_exit_code(pairs, fail_on, empty=empty)


def gate_summary(report: Mapping[str, Any]) -> str:
    """``; 1 new, 2 in the baseline, 0 fixed`` for a summary line (empty without a
    findings baseline)."""
    section = report.get("findings_baseline")
    if not isinstance(section, Mapping) or "path" not in section:
        return ""
    return (f"; {section['new']} new, {section['baseline']} in the baseline, "
            f"{len(section['fixed'])} fixed")


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """Plain lines for a terminal or a text report: each finding new or in the
    baseline, then the fixed entries and those the run did not recheck."""
    section = report.get("findings_baseline")
    if not isinstance(section, Mapping) or "path" not in section:
        return []
    lines = [f"findings baseline {section['path']}: {section['new']} new, "
             f"{section['baseline']} in the baseline, {len(section['fixed'])} fixed"
             + (f", {len(section['not_rechecked'])} not rechecked"
                if section["not_rechecked"] else "")]
    for row in report.get("results", []):
        status = row.get("baseline_state")
        if status:
            lines.append(f"  {status}: {row['clause']}/{row['theorem']} "
                         f"[{row.get('impact')}] {row.get('fingerprint')}")
    for entry in section["fixed"]:
        lines.append(f"  fixed: {entry['clause']}/{entry['theorem']} [{entry['impact']}] "
                     f"{entry['fingerprint']} (remove it: --write-baseline)")
    for entry in section["not_rechecked"]:
        lines.append(f"  not rechecked: {entry['clause']}/{entry['theorem']} "
                     f"{entry['fingerprint']} (its theorem did not run or was undecided)")
    lines.extend(f"  note: {note}" for note in section.get("notes", []))
    return lines


def finish_gate(report: dict[str, Any], baseline: Any, *, only_new: bool,
                write_to: str | None) -> dict[str, Any]:
    """After the run: write the baseline (``--write-baseline``), then mark every finding
    against the baseline read before the run, or, without one, the one just written.
    Returns the report's ``findings_baseline`` section."""
    written = write_baseline(write_to, report) if write_to is not None else None
    section: dict[str, Any] = apply_baseline(
        report, baseline if baseline is not None else written, only_new=only_new,
        written=write_to)
    if written is not None:
        section["written_findings"] = len(written.entries)
    return section


def print_gate(console: Any, report: dict[str, Any]) -> None:
    """The findings-baseline lines of a run (each finding new or baseline, the fixed
    ones), and where a baseline was written."""
    from rich.markup import escape

    for line in summary_lines(report):
        console.print(escape(line), highlight=False)
    section = report.get("findings_baseline") or {}
    if section.get("written"):
        console.print(escape(f"wrote the findings baseline {section['written']} "
                             f"({section.get('written_findings', 0)} findings)"),
                      highlight=False)
