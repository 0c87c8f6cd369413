"""The contract document ships with the repository and nothing cites notes outside it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kvcontract.spec.clauses import CLAUSES, clause_range

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "docs" / "CONTRACT.md"

SECTIONS = {
    1: "Actors",
    2: "Units and parameters",
    3: "Allocation retention",
    4: "Lookup coverage",
    5: "Store reachability",
    6: "Offload manager state machine",
    7: "How bytes move",
    8: "Historic defects",
    9: "The contract clauses",
    10: "Upstream test matrices",
    11: "How vLLM builds geometries",
    12: "Departures from upstream",
    13: "Narrowed domains",
    14: "Facts from vLLM this rests on",
}
"""Section number -> the start of its title. Code comments cite sections by number."""

SUBSECTIONS = ("4.1", "4.2", "4.3", "4.4")

# Built by concatenation so that this file does not match its own search.
OUTSIDE_REFERENCES = (
    "DOMAIN" + ".md",
    "Z3-NOTES" + ".md",
    ".." + "/shared",
    "/work" + "/shared",
)
CHECKED_SUFFIXES = (".py", ".md", ".toml", ".yml", ".yaml")


def _contract_text() -> str:
    assert CONTRACT.is_file(), f"{CONTRACT.relative_to(ROOT)} is missing"
    return CONTRACT.read_text(encoding="utf-8")


def test_contract_has_every_section() -> None:
    text = _contract_text()
    for number, title in SECTIONS.items():
        pattern = rf"^## {number}\. {re.escape(title)}"
        assert re.search(pattern, text, re.MULTILINE), f"section heading {number} ({title})"
    for number in SUBSECTIONS:
        assert re.search(rf"^### {re.escape(number)} ", text, re.MULTILINE), number


def test_contract_sections_in_order() -> None:
    numbers = [int(m) for m in re.findall(r"^## (\d+)\. ", _contract_text(), re.MULTILINE)]
    assert numbers == sorted(SECTIONS), numbers


def test_contract_mentions_every_clause() -> None:
    text = _contract_text()
    missing = [c.id for c in CLAUSES if not re.search(rf"\b{re.escape(c.id)}\b", text)]
    assert not missing, f"clauses not mentioned in docs/CONTRACT.md: {missing}"


def _tracked_files() -> list[Path]:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        [git, "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode("utf-8", errors="replace")
    paths = []
    for name in listed.split("\0"):
        if not name or name.startswith(".git/") or not name.endswith(CHECKED_SUFFIXES):
            continue
        path = ROOT / name
        if path.is_file():  # deleted in the working tree but still in the index
            paths.append(path)
    return paths


def test_no_references_outside_the_repository() -> None:
    offenders = []
    for path in _tracked_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), start=1):
            for needle in OUTSIDE_REFERENCES:
                if needle in line:
                    offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {needle}")
    assert not offenders, "references to documents outside the repository:\n" + "\n".join(
        offenders
    )


CLAUSE_RANGE = re.compile(r"\bC1-C(\d+)\b")
"""A stated range of clauses from the first; every one must end at the catalogue's last
clause (``spec.clauses.clause_range``), unless it is a subrange listed below."""

SUBRANGES = {
    ("tools/audit/system.py", "C1-C6"),  # the lookup's clauses, not the catalogue's range
}
"""``(path, range)`` statements of part of the catalogue on purpose."""

PROVE_SUMMARY = re.compile(
    r"`reference: N theorems over M clauses in \.\.\.: \.\.\. PROVED, \.\.\. PROVED-FOR-DOMAIN`")
"""The README's example of ``kvcontract prove``'s last line: its shape, not its counts
(a new clause or theorem changes no document but the contract's)."""


def test_every_stated_clause_range_is_the_catalogues() -> None:
    """Adding a clause (C13, ...) fails here until every document that states the range
    says so; the command line derives it (``clause_range``)."""
    stale = []
    for path in _tracked_files():
        name = path.relative_to(ROOT).as_posix()
        if name == "tests/test_docs.py":
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), start=1):
            for found in CLAUSE_RANGE.finditer(line):
                if found.group(0) != clause_range() and (name, found.group(0)) not in SUBRANGES:
                    stale.append(f"{name}:{lineno}: {found.group(0)}")
    assert not stale, (f"documents that state a clause range other than the catalogue's "
                       f"{clause_range()}:\n" + "\n".join(stale))


def test_the_readmes_prove_summary_states_no_counts() -> None:
    """The README shows the shape of ``kvcontract prove``'s last line; no document states
    how many theorems or clauses the catalogue has (``kvcontract list`` says it), so adding
    one edits no document but the contract."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert PROVE_SUMMARY.search(readme), "README.md lost the example summary line"
    counted = re.compile(r"\b\d+ theorems over \d+ clauses\b")
    stated = [f"{path.relative_to(ROOT).as_posix()}: {found.group(0)}"
              for path in _tracked_files() if path.suffix == ".md"
              for found in counted.finditer(path.read_text(encoding="utf-8"))]
    assert stated == []
