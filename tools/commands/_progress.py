"""Progress of a long command on stderr: a bar on a terminal, one line per finished item
otherwise (a CI log is never silent for minutes), nothing under ``--quiet``."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kvcontract.tools.reports.console import make_console

Advance = Callable[[str, int, int], None]
"""``advance(name, done, total)``: ``name`` (a theorem, a scenario) has finished, the
``done``-th of ``total``."""


@contextlib.contextmanager
def progress(verb: str, label: str, *, quiet: bool = False) -> Iterator[Advance]:
    """A callback for finished items: on a terminal a transient bar on stderr, else a
    ``kvcontract: VERB [done/total] name`` line on stderr per item."""
    console = make_console(stderr=True)
    if quiet:
        yield lambda name, done, total: None
        return
    if not console.is_terminal:
        def line(name: str, done: int, total: int) -> None:
            print(f"kvcontract: {verb} [{done}/{total}] {name}", file=sys.stderr, flush=True)

        yield line
        return
    with Progress(
        TextColumn(f"[bold]{verb}[/] {{task.description}}"), BarColumn(),
        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
        console=console, transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)

        def advance(name: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=name)

        yield advance
