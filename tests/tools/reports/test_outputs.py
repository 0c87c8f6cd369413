"""kvcontract.tools.reports.outputs: formats from suffixes and writing output files.

(The pairing of --format and --output is in tests/tools/test_reports.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcontract.errors import UsageError
from kvcontract.tools.reports.formats import FORMATS
from kvcontract.tools.reports.model import write_text
from kvcontract.tools.reports.outputs import FORMAT_SUFFIXES, format_for_path


@pytest.mark.parametrize(
    ("path", "fmt"),
    [("r.json", "json"), ("out/r.xml", "junit"), ("r.sarif", "sarif"), ("R.MD", "markdown"),
     ("r.txt", "text"), ("r.mypy", "mypy"), ("a.b.Sarif", "sarif")],
)
def test_format_for_path(path: str, fmt: str) -> None:
    assert format_for_path(path) == fmt


@pytest.mark.parametrize("path", ["report.html", "report", "json"])
def test_unknown_suffix(path: str) -> None:
    with pytest.raises(UsageError) as info:
        format_for_path(path)
    message = str(info.value)
    assert message.startswith(f"cannot tell the format of {path} from its suffix")
    assert "json, junit, sarif, markdown, mypy, text" in message
    assert ".json, .md, .mypy, .sarif, .txt, .xml" in message


def test_every_suffix_names_a_format() -> None:
    assert set(FORMAT_SUFFIXES.values()) == set(FORMATS)


def test_write_text_creates_folders(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "report.md"
    write_text(str(target), "### title\n")
    assert target.read_text(encoding="utf-8") == "### title\n"
    write_text(str(target), "✓\n")  # overwritten, UTF-8
    assert target.read_text(encoding="utf-8") == "✓\n"


def test_write_text_in_the_working_directory(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_text("plain.txt", "x")
    assert (tmp_path / "plain.txt").read_text() == "x"


def test_unwritable_path_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match=r"cannot write .*file/report\.json"):
        write_text(str(blocker / "report.json"), "{}")
    with pytest.raises(UsageError, match="cannot write"):
        write_text(str(tmp_path), "{}")  # a folder
