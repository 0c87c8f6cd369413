"""The user's input files (reports, findings baselines, geometries): read and parsed as
JSON in one place, so every command names a bad file in the same words
(:class:`~kvcontract.errors.InputFileError`: the file, then what is wrong)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvcontract.errors import InputFileError


def read_text_file(path: str, what: str) -> str:
    """The UTF-8 text of ``path`` (``~`` expanded); ``what`` names what the file should
    hold (``a geometry``), for the message of a file that is not text."""
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputFileError(path, f"not UTF-8 text ({what} is JSON)") from None
    except OSError as exc:
        raise InputFileError(path, f"cannot read it ({exc.strerror or exc})") from None


def parse_json(text: str, source: str, what: str) -> Any:
    """``text`` (read from ``source``: a file or an option) as JSON; ``what`` it should
    be for the messages of JSON no kvcontract document is (too deep, a number of more
    than 4,300 digits)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(source, f"not valid JSON at line {exc.lineno}, column "
                                     f"{exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise InputFileError(source, f"its JSON is nested too deeply (not {what})") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise InputFileError(source, f"not {what}: {exc}") from None


def read_json_file(path: str, what: str) -> Any:
    """:func:`read_text_file` then :func:`parse_json`."""
    return parse_json(read_text_file(path, what), path, what)
