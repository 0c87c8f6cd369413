"""The rich console every command and report printer writes through: its width on a
terminal, a pipe or a file."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

PIPE_WIDTH = 100
"""Columns of output that goes to a file or a pipe when ``COLUMNS`` is not set."""


def console_width(stream: Any) -> int | None:
    """The width for output to ``stream``: None on a terminal (rich asks the terminal,
    and honours ``COLUMNS``); piped or redirected, ``COLUMNS`` when it is a positive
    integer, else :data:`PIPE_WIDTH`."""
    import os

    try:
        terminal = bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        terminal = False
    if terminal:
        return None
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


def make_console(stderr: bool = False) -> Console:
    """The rich console of a command (every command makes its own through here), on
    stdout or ``stderr``, at :func:`console_width`."""
    return Console(stderr=stderr, width=console_width(sys.stderr if stderr else sys.stdout))
