"""Report formats for the verifying commands (``prove``, ``fuzz``, ``audit``).

One public entry point, :func:`render`, turns the versioned JSON report of a command
into one of :data:`FORMATS`:

* ``json``     - the versioned report itself (``"version": 1``), with source locations;
* ``junit``    - JUnit XML (the Jenkins ``junit-10`` dialect), one test case per theorem;
* ``sarif``    - SARIF 2.1.0 with one rule per clause, for code-scanning uploads;
* ``markdown`` - a summary sized for a pull-request comment;
* ``mypy``     - ``path:line: error: [C2] ...`` lines that editors and CI annotators parse;
* ``text``     - a plain, uncoloured table (the CLI draws its own rich table).

Every format works on the same normalized shape (:func:`normalize`): ``{"version",
"command", "target", "results": [{clause, theorem, verdict, status, domain, seconds,
witness, message, location?}]}``. The fuzz report (per-clause check counts plus a list
of differences) is folded into that shape, so a reader of SARIF or JUnit never needs to
know which engine produced a finding.

Why locations are a field and not computed by the renderers: a finding must point at
the code that is wrong. For the built-in implementations that is the function of the
:class:`~kvcontract.impl.bundle.Implementation` that differs from the reference
(:func:`locate`, via :mod:`inspect`); an audit of upstream code knows better (the
upstream file and line) and supplies ``location: {"path", "line"}`` itself. Renderers use
a result's ``location`` when present and fall back to :func:`locate`, then to the
clause's entry in :mod:`kvcontract.spec.clauses` (SARIF and editors need some line).

All output is deterministic: no timestamps, no host names, stable ordering.
"""

from __future__ import annotations

import inspect
import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvcontract.proofs.uses import LOOKUP_FUNCTIONS, THEOREM_FUNCTIONS
from kvcontract.spec.clauses import CLAUSES

from kvcontract.errors import InputFileError, KvContractError, UsageError

REPORT_VERSION = 1
FORMATS: tuple[str, ...] = ("json", "junit", "sarif", "markdown", "mypy", "text")
"""Formats :func:`render` accepts."""

FORMAT_SUFFIXES: dict[str, str] = {
    ".json": "json",
    ".xml": "junit",
    ".sarif": "sarif",
    ".md": "markdown",
    ".txt": "text",
    ".mypy": "mypy",
}
"""Output-file suffixes from which the CLI infers a format when none is given."""

PASS, FAIL, ERROR = "pass", "fail", "error"
_STATUS_OF_VERDICT: dict[str, str] = {
    "PROVED": PASS,
    "PROVED-FOR-DOMAIN": PASS,
    "TESTED": PASS,
    "PASSED": PASS,
    "COUNTEREXAMPLE": FAIL,
    "UNKNOWN": ERROR,
    "VACUOUS": ERROR,
}
"""How each verdict counts: ``pass``; ``fail`` (a counterexample, exit 1); ``error``
(unknown or vacuous, exit 3). A result may carry its own ``status`` for verdicts this
table does not know (an audit's own verdicts)."""

MARKDOWN_LIMIT = 60_000
"""GitHub rejects comments over 65,536 characters; stay below with room for a header."""

_TOOL_URI = "https://github.com/kvcontract/kvcontract"


class ReportError(KvContractError):
    """A report dictionary that does not have the versioned shape."""


# -- normalization ----------------------------------------------------------------
def normalize(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report in the shape every renderer reads (validated; the input is not changed).

    Raises :class:`ReportError` naming the first thing that is wrong.
    """
    if not isinstance(report, Mapping):
        raise ReportError(f"a report is a JSON object, not {type(report).__name__}")
    version = report.get("version")
    if version != REPORT_VERSION:
        raise ReportError(
            f"unsupported report version {version!r} (this kvcontract reads version "
            f"{REPORT_VERSION})"
        )
    command = report.get("command")
    if not isinstance(command, str) or not command:
        raise ReportError("the report has no 'command' (prove, fuzz or audit)")
    target = report.get("target")
    if not isinstance(target, str):
        raise ReportError("the report has no 'target' (the implementation checked)")
    if "results" in report:
        raw = report["results"]
    elif command == "fuzz" and "differences" in report:
        raw = _fuzz_results(report)
    else:
        raise ReportError("the report has no 'results' list")
    if not isinstance(raw, list):
        raise ReportError("'results' must be a list")
    results = [_normalize_result(r, i, target) for i, r in enumerate(raw)]
    normalized: dict[str, Any] = {
        "version": REPORT_VERSION, "command": command, "target": target, "results": results,
    }
    own = report.get("exit_code")
    if own is not None:
        # A command may know better than its rows (an audit that checked nothing is
        # undecided, exit 3); a report that states its exit code is believed.
        if own not in (0, 1, 2, 3) or isinstance(own, bool):
            raise ReportError(f"'exit_code' must be 0, 1, 2 or 3, not {own!r}")
        normalized["exit_code"] = own
    return normalized


def _normalize_result(raw: Any, index: int, target: str) -> dict[str, Any]:
    where = f"results[{index}]"
    if not isinstance(raw, Mapping):
        raise ReportError(f"{where} is not an object")
    for key in ("clause", "theorem", "verdict"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ReportError(f"{where} has no '{key}'")
    verdict = raw["verdict"]
    status = raw.get("status", _STATUS_OF_VERDICT.get(verdict))
    if status not in (PASS, FAIL, ERROR):
        raise ReportError(
            f"{where} has the unknown verdict {verdict!r} and no 'status' (pass, fail or "
            f"error); known verdicts: {', '.join(_STATUS_OF_VERDICT)}"
        )
    seconds = raw.get("seconds", 0.0)
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        raise ReportError(f"{where}.seconds is not a number")
    witness = raw.get("witness")
    if witness is not None and not isinstance(witness, Mapping):
        raise ReportError(f"{where}.witness is not an object")
    result: dict[str, Any] = {
        "clause": raw["clause"],
        "theorem": raw["theorem"],
        "id": f"{raw['clause']}/{raw['theorem']}",
        "verdict": verdict,
        "status": status,
        "domain": str(raw.get("domain", "")),
        "seconds": float(seconds),
        "witness": dict(witness) if witness is not None else None,
        "message": str(raw.get("message", "")),
        "description": str(raw.get("description", "")),
    }
    location = raw.get("location")
    if location is not None:
        result["location"] = _check_location(location, where)
    elif status != PASS:
        found = locate(target, result["id"])
        if found is not None:
            result["location"] = found
    return result


def _check_location(location: Any, where: str) -> dict[str, Any]:
    if (
        not isinstance(location, Mapping)
        or not isinstance(location.get("path"), str)
        or not isinstance(location.get("line"), int)
        or isinstance(location.get("line"), bool)
        or location["line"] < 1
    ):
        raise ReportError(f"{where}.location must be {{\"path\": str, \"line\": int >= 1}}")
    return {"path": location["path"], "line": location["line"]}


def _fuzz_results(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The fuzz report as per-clause results: one COUNTEREXAMPLE per difference and one
    PASSED result per clause that was checked and had none."""
    differences = report.get("differences")
    per_clause = report.get("per_clause", {})
    if not isinstance(differences, list) or not isinstance(per_clause, Mapping):
        raise ReportError("a fuzz report needs 'differences' (list) and 'per_clause' (object)")
    cases = report.get("cases", 0)
    results: list[dict[str, Any]] = []
    failing: set[str] = set()
    seen: dict[str, int] = {}
    for index, diff in enumerate(differences):
        if not isinstance(diff, Mapping) or not isinstance(diff.get("clause"), str):
            raise ReportError(f"differences[{index}] has no 'clause'")
        kind = str(diff.get("kind", "difference"))
        name = f"fuzz-{kind}"
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}-{seen[name]}"
        failing.add(diff["clause"])
        witness = {"kind": "fuzz", "program": list(diff.get("program", []))}
        extra = diff.get("witness")
        if isinstance(extra, Mapping):
            witness.update({k: v for k, v in extra.items() if k not in ("kind", "program")})
        results.append(
            {
                "clause": diff["clause"],
                "theorem": name,
                "verdict": "COUNTEREXAMPLE",
                "domain": f"differential fuzzing, {cases} cases",
                "seconds": 0.0,
                "witness": witness,
                "message": str(diff.get("message", "")),
            }
        )
    for clause, count in per_clause.items():
        if clause in failing:
            continue
        results.append(
            {
                "clause": str(clause),
                "theorem": "fuzz",
                "verdict": "PASSED",
                "domain": f"{count} checks over {cases} cases, no difference",
                "seconds": 0.0,
                "witness": None,
                "message": "",
            }
        )
    order = {c.id: i for i, c in enumerate(CLAUSES)}
    results.sort(key=lambda r: (order.get(r["clause"], len(order)), r["theorem"]))
    return results


def exit_code(normalized: Mapping[str, Any]) -> int:
    """The CLI exit code a normalized report stands for (0, 1 or 3), or its own."""
    if "exit_code" in normalized:
        return int(normalized["exit_code"])
    statuses = {r["status"] for r in normalized["results"]}
    if FAIL in statuses:
        return 1
    if ERROR in statuses:
        return 3
    return 0


# -- locations ----------------------------------------------------------------------
_FUNCTIONS_OF_THEOREM: dict[str, tuple[str, ...]] = THEOREM_FUNCTIONS
"""Implementation functions each theorem exercises, most specific first
(:mod:`kvcontract.proofs.uses`); unknown theorems fall back to the lookup's."""

_LOOKUP_FUNCTIONS: tuple[str, ...] = LOOKUP_FUNCTIONS


def _project_root() -> Path:
    import kvcontract

    return Path(kvcontract.__file__).resolve().parents[1]


def display_path(path: str | Path) -> str:
    """A path as reports show it: relative to the working directory (or the project),
    POSIX separators, so SARIF uploads and editor links resolve inside a checkout."""
    resolved = Path(path).resolve()
    for base in (Path.cwd().resolve(), _project_root()):
        try:
            return resolved.relative_to(base).as_posix()
        except ValueError:
            continue
    return resolved.as_posix()


def function_location(fn: Callable[..., Any]) -> dict[str, Any] | None:
    """``{"path", "line"}`` of a Python function's definition, or None if unknown."""
    try:
        target = inspect.unwrap(fn)
        source = inspect.getsourcefile(target)
        _, line = inspect.getsourcelines(target)
    except (OSError, TypeError):
        return None
    if source is None:
        return None
    return {"path": display_path(source), "line": max(1, line)}


def locate(target: str, theorem_id: str) -> dict[str, Any] | None:
    """Where a finding about ``theorem_id`` for implementation ``target`` points.

    The function of the implementation that the theorem exercises and that differs from
    the reference (the defect's home); for the reference itself, the first function the
    theorem exercises. None when ``target`` is not a registered implementation.
    """
    from kvcontract.impl.variants import REFERENCE, VARIANTS

    impl = VARIANTS.get(target)
    if impl is None:
        return None
    name = theorem_id.split("/", 1)[-1].split("[", 1)[0]
    if name.startswith("fuzz"):
        candidates: tuple[str, ...] = ()
    else:
        candidates = _FUNCTIONS_OF_THEOREM.get(name, _LOOKUP_FUNCTIONS)
    every = tuple(f for f in REFERENCE.__dataclass_fields__ if callable(getattr(REFERENCE, f)))
    changed = [f for f in every if getattr(impl, f) is not getattr(REFERENCE, f)]
    chosen = next((f for f in candidates if f in changed), None)
    if chosen is None and not candidates:
        chosen = changed[0] if changed else None
    if chosen is None and candidates:
        chosen = candidates[0]
    if chosen is None:
        return None
    return function_location(getattr(impl, chosen))


def clause_location(clause: str) -> dict[str, Any]:
    """The clause's entry in the catalogue (the fallback location of a finding)."""
    import kvcontract.spec.clauses as catalogue

    path = inspect.getsourcefile(catalogue) or catalogue.__file__
    line = 1
    try:
        lines, _ = inspect.getsourcelines(catalogue)
        needle = f'Clause("{clause}"'
        line = next((i + 1 for i, text in enumerate(lines) if needle in text), 1)
    except OSError:
        pass
    return {"path": display_path(path), "line": line}


def _location(result: Mapping[str, Any]) -> dict[str, Any]:
    location = result.get("location")
    if isinstance(location, Mapping):
        return dict(location)
    return clause_location(result["clause"])


# -- rendering ------------------------------------------------------------------------
def render(report: Mapping[str, Any], fmt: str) -> str:
    """Render a versioned report (``prove``/``fuzz``/``audit`` JSON) in format ``fmt``.

    Raises :class:`~kvcontract.errors.UsageError` for an unknown format and
    :class:`ReportError` for a report without the versioned shape.
    """
    renderer = _RENDERERS.get(fmt)
    if renderer is None:
        raise UsageError(f"unknown report format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    return renderer(report)


def _render_json(report: Mapping[str, Any]) -> str:
    normalized = normalize(report)
    data = dict(report)
    if "results" in report:
        results = []
        for original, norm in zip(report["results"], normalized["results"], strict=True):
            row = dict(original)
            if "location" in norm:
                row["location"] = norm["location"]
            results.append(row)
        data["results"] = results
    else:  # fuzz: keep its own fields, add the per-clause view every format reads
        data["results"] = [
            {k: v for k, v in r.items() if k not in ("id", "status")}
            for r in normalized["results"]
        ]
    data.setdefault("exit_code", exit_code(normalized))
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def _counts(results: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in results:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return dict(sorted(counts.items()))


def _title(normalized: Mapping[str, Any]) -> str:
    # `audit` names what it checks with --target; `prove` and `fuzz` with --impl.
    option = "--target" if normalized["command"] == "audit" else "--impl"
    return f"kvcontract {normalized['command']} {option} {normalized['target']}"


def _witness_text(witness: Mapping[str, Any] | None) -> str:
    return json.dumps(witness, sort_keys=True) if witness else ""


def _render_text(report: Mapping[str, Any]) -> str:
    normalized = normalize(report)
    results = normalized["results"]
    widths = [6, 8, 17]
    for r in results:
        widths[0] = max(widths[0], len(r["clause"]))
        widths[1] = max(widths[1], len(r["theorem"]))
    lines = [_title(normalized), ""]
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
            lines.append(f"{r['id']}: {r['verdict']}: {r['message']}")
            if r["witness"]:
                lines.append(f"  witness: {_witness_text(r['witness'])}")
    summary = ", ".join(f"{n} {v}" for v, n in _counts(results).items())
    lines += ["", f"{normalized['target']}: {len(results)} results: {summary or 'none'}"]
    return "\n".join(lines) + "\n"


def _render_mypy(report: Mapping[str, Any]) -> str:
    normalized = normalize(report)
    lines: list[str] = []
    files: set[str] = set()
    for r in normalized["results"]:
        if r["status"] == PASS:
            continue
        loc = _location(r)
        files.add(loc["path"])
        message = " ".join(r["message"].split()) or r["description"] or r["verdict"]
        lines.append(
            f"{loc['path']}:{loc['line']}: error: [{r['clause']}] {r['id']} "
            f"{r['verdict']}: {message}  [kvcontract-{r['clause']}]"
        )
        if r["witness"]:
            witness = _witness_text(r["witness"])
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


def _md_cell(text: str, limit: int = 300) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _render_markdown(report: Mapping[str, Any]) -> str:
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
    counts = ", ".join(f"{n} {v}" for v, n in _counts(results).items()) or "no results"
    out = [
        f"### {mark} `{_title(normalized)}`: {headline}",
        "",
        f"{len(results)} results: {counts}.",
        "",
    ]
    failing = [r for r in results if r["status"] != PASS]
    if failing:
        out += ["| clause | theorem | verdict | where | message |", "|---|---|---|---|---|"]
        for r in failing:
            loc = _location(r)
            out.append(
                f"| {r['clause']} | `{r['theorem']}` | **{r['verdict']}** | "
                f"`{loc['path']}:{loc['line']}` | {_md_cell(r['message'])} |"
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


def _render_junit(report: Mapping[str, Any]) -> str:
    normalized = normalize(report)
    results = normalized["results"]
    failures = sum(1 for r in results if r["status"] == FAIL)
    errors = sum(1 for r in results if r["status"] == ERROR)
    total_time = f"{sum(r['seconds'] for r in results):.3f}"
    suite_name = f"kvcontract.{normalized['command']}.{normalized['target']}"
    root = ET.Element(
        "testsuites",
        {"name": "kvcontract", "tests": str(len(results)), "failures": str(failures),
         "errors": str(errors), "time": total_time},
    )
    suite = ET.SubElement(
        root, "testsuite",
        {"name": suite_name, "tests": str(len(results)), "failures": str(failures),
         "errors": str(errors), "skipped": "0", "time": total_time},
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in (("command", normalized["command"]), ("target", normalized["target"])):
        ET.SubElement(properties, "property", {"name": name, "value": value})
    for r in results:
        case = ET.SubElement(
            suite, "testcase",
            {"name": r["id"], "classname": f"{suite_name}.{r['clause']}",
             "time": f"{r['seconds']:.3f}"},
        )
        if r["status"] != PASS:
            loc = _location(r)
            body = [r["message"], f"at {loc['path']}:{loc['line']}", f"domain: {r['domain']}"]
            if r["witness"]:
                body.append(f"witness: {_witness_text(r['witness'])}")
            tag = "failure" if r["status"] == FAIL else "error"
            element = ET.SubElement(
                case, tag,
                {"message": _xml_safe(" ".join(r["message"].split())[:1000] or r["verdict"]),
                 "type": r["verdict"]},
            )
            element.text = _xml_safe("\n".join(body))
        else:
            out = ET.SubElement(case, "system-out")
            out.text = _xml_safe(f"{r['verdict']}: {r['domain']}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _xml_safe(text: str) -> str:
    """Drop characters XML 1.0 cannot carry (control characters from messages)."""
    return "".join(
        ch for ch in text
        if ch in "\t\n\r" or 0x20 <= ord(ch) <= 0xD7FF or 0xE000 <= ord(ch) <= 0xFFFD
        or 0x10000 <= ord(ch) <= 0x10FFFF
    )


def _rule_name(title: str) -> str:
    return "".join(word.capitalize() for word in title.replace("-", " ").split())


def _render_sarif(report: Mapping[str, Any]) -> str:
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
        loc = _location(r)
        message = r["message"] or r["description"] or r["verdict"]
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


_RENDERERS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "json": _render_json,
    "junit": _render_junit,
    "sarif": _render_sarif,
    "markdown": _render_markdown,
    "mypy": _render_mypy,
    "text": _render_text,
}


# -- files ----------------------------------------------------------------------------
def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a JSON report; every problem is an InputFileError naming the file."""
    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputFileError(name, f"cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise InputFileError(name, "it is not UTF-8 text (expected a JSON report)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(
            name, f"not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    try:
        normalize(data)
    except ReportError as exc:
        raise InputFileError(name, f"not a kvcontract report: {exc}") from None
    return dict(data)


def format_for_path(path: str) -> str:
    """The format an output file's suffix implies (``.sarif`` -> ``sarif``, ...)."""
    suffix = Path(path).suffix.lower()
    fmt = FORMAT_SUFFIXES.get(suffix)
    if fmt is None:
        raise UsageError(
            f"cannot tell the format of {path} from its suffix; give --format "
            f"({', '.join(FORMATS)}) or use one of {', '.join(sorted(FORMAT_SUFFIXES))}"
        )
    return fmt


def pair_outputs(
    formats: tuple[str, ...], outputs: tuple[str, ...]
) -> list[tuple[str, str | None]]:
    """Match ``--format`` and ``--output`` options: pairwise, one format to stdout, or
    formats inferred from the output suffixes. ``None`` as a path means stdout."""
    for fmt in formats:
        if fmt not in FORMATS:
            raise UsageError(f"unknown report format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if not outputs:
        if len(formats) > 1:
            raise UsageError("several --format options need one --output FILE each")
        return [(fmt, None) for fmt in formats]
    if not formats:
        return [(format_for_path(path), path) for path in outputs]
    if len(formats) != len(outputs):
        raise UsageError(
            f"{len(formats)} --format options but {len(outputs)} --output options; "
            "give one --output per --format (in the same order)"
        )
    return list(zip(formats, outputs, strict=True))


def write_text(path: str, text: str) -> None:
    """Write an output file; an unwritable path is a UsageError naming it."""
    try:
        target = Path(path)
        if target.parent != Path(""):
            target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
