""":data:`FORMATS` and :func:`render`: the versioned report in one of them, dispatched to the
renderer module of that format."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvcontract.errors import UsageError
from kvcontract.tools.reports.github import render_github
from kvcontract.tools.reports.json_format import render_json
from kvcontract.tools.reports.junit import render_junit
from kvcontract.tools.reports.markdown import render_markdown
from kvcontract.tools.reports.mypy_lines import render_mypy
from kvcontract.tools.reports.sarif import render_sarif
from kvcontract.tools.reports.text import render_text

FORMATS: tuple[str, ...] = ("json", "junit", "sarif", "markdown", "mypy", "text", "github")
"""Formats :func:`render` accepts."""

_RENDERERS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "json": render_json,
    "junit": render_junit,
    "sarif": render_sarif,
    "markdown": render_markdown,
    "mypy": render_mypy,
    "text": render_text,
    "github": render_github,
}


def render(report: Mapping[str, Any], fmt: str) -> str:
    """Render a versioned report (``prove``/``fuzz``/``audit`` JSON) in format ``fmt``.

    Raises :class:`~kvcontract.errors.UsageError` for an unknown format and
    :class:`~kvcontract.tools.reports.model.ReportError` for a report without the
    versioned shape.
    """
    renderer = _RENDERERS.get(fmt)
    if renderer is None:
        raise UsageError(f"unknown report format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    return renderer(report)
