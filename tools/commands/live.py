"""``kvcontract live``: vLLM's own scheduler in the loop (:mod:`kvcontract.live`).

``--check`` says whether the live backend can run here and what to install, and prints
the capabilities the driver found in the installed vLLM (:mod:`kvcontract.live.
capabilities`: it adapts to them, never to the release's version); exit 0 when it can
run, 3 when vLLM, a package its scheduler side imports, or an API the driver needs is
missing: nothing can be checked. ``--scenario NAME`` (repeatable, or ``all``) runs the
named scenarios (:data:`kvcontract.live.scenarios.SCENARIOS`: the two lost-hit findings
and the lifecycle) and prints each one's outcome, numbers and checks, and for a
lifecycle scenario C13-C15's verdicts with their impacts and findings; ``--json FILE``
writes them with the capabilities found. Exit 0 when every check holds, 1 when one does
not (a finding), 3 when the backend cannot run or a scenario is UNKNOWN (its run stopped
on a gap of kvcontract's driver, which says nothing about vLLM) and none failed, 2 for
an unknown scenario.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from kvcontract.errors import UsageError
from kvcontract.tools.commands._common import check_output_file
from kvcontract.tools.reports.console import make_console
from kvcontract.vocabulary import EXIT_FINDING, EXIT_OK, EXIT_UNKNOWN, worst_exit_code

LIVE_JSON_VERSION = 1
"""Version of the ``live --json`` document."""


@click.command()
@click.option("--check", "check_only", is_flag=True,
              help="say whether vLLM's scheduler side can run here and what is missing "
                   "(exit 3 when it cannot)")
@click.option("--scenario", "scenarios", multiple=True, metavar="NAME",
              help="run a named live scenario (repeatable; 'all' for every one; "
                   "--list-scenarios names them)")
@click.option("--list-scenarios", is_flag=True, help="list the scenarios and exit")
@click.option("--json", "json_path", metavar="FILE",
              help="write the scenarios' observations as JSON here")
@click.option("--vllm", "tree", metavar="PATH",
              help="run this vLLM tree (a checkout of main, an unpacked release; its "
                   "vllm/ package or the folder holding it) laid over the installed "
                   "wheel, instead of the installed vLLM")
def live(check_only: bool, scenarios: tuple[str, ...], list_scenarios: bool,
         json_path: str | None, tree: str | None) -> None:
    """Run vLLM's own Scheduler, KV-cache manager and OffloadingConnector (the
    installed wheel, CPU only, no model) on kvcontract's scenarios."""
    from kvcontract.live.env import check

    if list_scenarios:
        _list()
        return
    if not check_only and not scenarios:
        raise UsageError("kvcontract live needs --check, --scenario NAME or "
                         "--list-scenarios")
    names = _scenario_names(scenarios)
    if json_path is not None:
        check_output_file("--json", json_path)
    console = make_console()
    if tree is not None:
        console.print(escape(f"vLLM: {_activate_tree(tree)}"))
    found = check(import_modules=True)
    if check_only or not found.ok:
        for line in found.lines():
            console.print(escape(line))
        if check_only:
            for line in found.capability_lines():
                console.print(escape(line))
        if not found.ok:
            sys.exit(EXIT_UNKNOWN)
        if not names:
            sys.exit(EXIT_OK)
    sys.exit(_run(console, names, json_path, found.capabilities))


def _activate_tree(tree: str) -> str:
    """Make ``import vllm`` in this process run ``tree`` laid over the installed wheel
    (as the audit's engine runs a ``vllm:PATH`` target); its description. A tree that
    cannot be composed is a usage error naming why."""
    from pathlib import Path

    from kvcontract.errors import InputFileError
    from kvcontract.live.judge.roots import RootError, activate
    from kvcontract.tools.audit.on_engine import tree_root

    folder = Path(tree).expanduser()
    package = folder / "vllm" if (folder / "vllm" / "__init__.py").is_file() else folder
    if not (package / "__init__.py").is_file():
        raise InputFileError(f"--vllm {tree}", "not a vLLM tree (no vllm/__init__.py)")
    try:
        root = tree_root(package)
        activate(root)
    except RootError as exc:
        raise InputFileError(f"--vllm {tree}", str(exc)) from None
    return str(root.description)


def _list() -> None:
    from kvcontract.live.scenarios import SCENARIOS

    console = make_console()
    table = Table(title="live scenarios (--scenario NAME)")
    table.add_column("name", no_wrap=True)
    table.add_column("what it does", overflow="fold")
    for name, function in SCENARIOS.items():
        doc = " ".join((function.__doc__ or "").split())
        table.add_row(escape(name), escape(doc))
    console.print(table)


def _scenario_names(given: tuple[str, ...]) -> list[str]:
    from kvcontract.live.scenarios import SCENARIOS

    names: list[str] = []
    for name in given:
        if name == "all":
            names += [n for n in SCENARIOS if n not in names]
        elif name not in SCENARIOS:
            raise UsageError(f"unknown live scenario {name!r}; known: "
                             f"{', '.join(SCENARIOS)}, all")
        elif name not in names:
            names.append(name)
    return names


def _run(console: Any, names: list[str], json_path: str | None,
         capabilities: Any = None) -> int:
    from kvcontract.live.run import vllm_version
    from kvcontract.live.scenarios import run_scenario

    rows: list[dict[str, Any]] = []
    codes: list[int] = []
    for name in names:
        start = time.perf_counter()
        result = run_scenario(name)
        seconds = time.perf_counter() - start
        row = result.to_json()
        row["seconds"] = round(seconds, 3)
        rows.append(row)
        if result.unknown:
            codes.append(EXIT_UNKNOWN)
            mark = "[yellow]UNKNOWN (driver gap)[/yellow]"
        elif result.ok:
            codes.append(EXIT_OK)
            mark = "[green]ok[/green]"
        else:
            codes.append(EXIT_FINDING)
            mark = "[red]CHECK FAILED[/red]"
        console.print(f"[bold]{escape(name)}[/bold] {mark} ({seconds:.2f} s): "
                      f"{escape(result.outcome)}")
        console.print(f"  {escape(result.geometry)}")
        for key, value in result.numbers.items():
            if key != "case":
                console.print(f"  {escape(key)}: {escape(json.dumps(value, default=str))}")
        for check in result.checks:
            sign = "holds" if check.ok else "FAILS"
            console.print(f"  check {sign}: {escape(check.what)} (expected "
                          f"{escape(str(check.expected))}, observed "
                          f"{escape(str(check.observed))})")
        for clause in result.clauses:
            impact = f" ({clause.impact.value})" if clause.impact is not None else ""
            reason = f": {clause.reason}" if clause.reason else ""
            console.print(f"  {clause.clause} {clause.verdict.value}{impact}"
                          f"{escape(reason)}")
            for finding in clause.findings:
                console.print(f"    - {escape(finding)}")
    if json_path is not None:
        document = {"version": LIVE_JSON_VERSION, "command": "live",
                    "vllm": vllm_version(),
                    "capabilities": None if capabilities is None else capabilities.to_json(),
                    "scenarios": rows}
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2, default=str)
            handle.write("\n")
    return worst_exit_code(codes)
