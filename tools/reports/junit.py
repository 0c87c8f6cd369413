"""The ``junit`` format: JUnit XML (the Jenkins ``junit-10`` dialect), one test case per
theorem."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from kvcontract.tools.reports.common import finding_message, witness_text
from kvcontract.tools.reports.locate import result_location
from kvcontract.tools.reports.model import ERROR, FAIL, PASS, normalize


def render_junit(report: Mapping[str, Any]) -> str:
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
            loc = result_location(r)
            body = [finding_message(r), f"at {loc['path']}:{loc['line']}", f"domain: {r['domain']}"]
            if r["witness"]:
                body.append(f"witness: {witness_text(r['witness'])}")
            tag = "failure" if r["status"] == FAIL else "error"
            element = ET.SubElement(
                case, tag,
                {"message": _xml_safe(finding_message(r)[:1000] or r["verdict"]),
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
