"""``kvcontract list``: the clauses, the theorems and the registered implementations.

Every theorem is one row under its full id (``C7/segment-boundaries-supplied[eagle-none]``,
what ``explain --theorem``, reports and ``replay`` take), never cut; ``--json`` prints
the same data for scripts (:func:`catalogue_json`).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from kvcontract.impl.variants import VARIANTS
from kvcontract.tools.reports.console import make_console

LIST_JSON_VERSION = 1
"""Version of the ``list --json`` document (bumped on an incompatible change)."""


@click.command(name="list")
@click.option(
    "--models", is_flag=True,
    help="list the model presets instead (groups, windows, block sizes, sources); with "
         "--json, add them to the document",
)
@click.option("--json", "as_json", is_flag=True,
              help="print the clauses, theorems (id, clause, kind, domain, impact) and "
                   "implementations as JSON (with --models, the presets too)")
def list_command(models: bool, as_json: bool) -> None:
    """List the clauses, the theorems and the registered implementations."""
    if as_json:
        sys.stdout.write(json.dumps(catalogue_json(models), indent=2) + "\n")
        sys.stdout.flush()
        return
    if models:
        _list_models()
        return
    console = make_console()
    console.print(_theorem_table())
    impls = Table(title="implementations (--impl)",
                  caption="your own functions: --impl module:FILE.py (docs/usage.md, Python API)")
    impls.add_column("name", no_wrap=True)
    impls.add_column("violates", overflow="fold")
    impls.add_column("description", overflow="fold")
    for name, impl in VARIANTS.items():
        impls.add_row(escape(name), ", ".join(impl.violates) or "-", escape(impl.description))
    console.print(impls)


def _theorem_table() -> Table:
    """One row per theorem: its full id in bold (never cut: the column is as wide as the
    longest id when the terminal allows, and folds only below that), its statement under
    it, its kind and its impact."""
    from kvcontract.proofs.runner import catalog
    from kvcontract.spec.clauses import CLAUSES

    table = Table(title="clauses and theorems (explain --theorem ID, --clause C)")
    table.add_column("theorem / statement", overflow="fold")
    table.add_column("kind", no_wrap=True)
    table.add_column("impact", no_wrap=True)
    theorems = catalog()
    for clause in CLAUSES:
        own = [t for t in theorems if t.clause == clause.id]
        if not own:
            table.add_row(_cell(f"{clause.id} ({clause.title})",
                                f"{clause.statement} (checked by `kvcontract fuzz`)"),
                          clause.proved_by, clause.impact.value)
        for t in own:
            impact = t.impact or clause.impact
            table.add_row(_cell(t.theorem_id, t.description), t.kind, impact.value)
    return table


def _cell(head: str, text: str) -> Any:
    """The bold id on its own line (folded only when the column is narrower than it) and
    the statement indented under it."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.text import Text

    return Group(Text(head, style="bold", overflow="fold"), Padding(Text(text), (0, 0, 0, 2)))


def catalogue_json(models: bool = False) -> dict[str, Any]:
    """What ``list --json`` prints: ``clauses`` (id, title, statement, proved_by, impact,
    theorems), ``theorems`` (id, clause, name, kind, domain, impact, description, uses),
    ``implementations`` (name, description, violates) and, with ``models``, ``presets``
    (name, title, hf_model, architecture, variant_of, geometry at bpc 1, buildable,
    sources)."""
    from kvcontract.proofs.runner import catalog
    from kvcontract.spec.clauses import CLAUSES, get_clause

    theorems = catalog()
    data: dict[str, Any] = {
        "version": LIST_JSON_VERSION,
        "command": "list",
        "clauses": [
            {"id": c.id, "title": c.title, "statement": c.statement,
             "proved_by": c.proved_by, "impact": c.impact.value,
             "theorems": [t.theorem_id for t in theorems if t.clause == c.id]}
            for c in CLAUSES
        ],
        "theorems": [
            {"id": t.theorem_id, "clause": t.clause, "name": t.name, "kind": t.kind,
             "domain": t.domain,
             "impact": (t.impact or get_clause(t.clause).impact).value,
             "description": t.description, "uses": list(t.uses)}
            for t in theorems
        ],
        "implementations": [
            {"name": name, "description": impl.description, "violates": list(impl.violates)}
            for name, impl in VARIANTS.items()
        ],
    }
    if models:
        data["presets"] = _presets_json()
    return data


def _presets_json() -> list[dict[str, Any]]:
    from kvcontract.spec.build import buildable
    from kvcontract.spec.models import get_preset, list_presets

    presets = []
    for name in list_presets():
        preset = get_preset(name)
        geometry = preset.geometry()
        ok, reason = buildable(geometry)
        presets.append({
            "name": preset.name, "title": preset.title, "hf_model": preset.hf_model,
            "architecture": preset.architecture, "variant_of": preset.variant_of,
            "geometry": geometry.to_dict(), "describe": geometry.describe(),
            "buildable": ok, "reason": reason, "sources": list(preset.sources),
        })
    return presets


def _list_models() -> None:
    """The model presets (spec/presets): each built at bpc 1, then their sources."""
    from kvcontract.spec.models import get_preset, list_presets

    console = make_console()
    table = Table(title="model presets (vLLM 0.33.0 planning; bpc 1, retention 0)")
    table.add_column("preset", overflow="fold")
    table.add_column("groups (vLLM groups x spec)", overflow="fold")
    table.add_column("sliding windows", overflow="fold")
    table.add_column("block sizes", overflow="fold")
    presets = [get_preset(name) for name in list_presets()]
    for preset in presets:
        geometry = preset.geometry()
        counts = geometry.extra.get("group_counts") or [1] * len(geometry.groups)
        windows = sorted({g.sliding_window for g in geometry.groups if g.sliding_window})
        table.add_row(
            escape(preset.name),
            escape("\n".join(
                f"{n} x {g.describe()}"
                for n, g in zip(counts, geometry.groups, strict=True)
            )),
            ", ".join(map(str, windows)) or "-",
            ", ".join(str(b) for b in sorted({g.block_size for g in geometry.groups})),
        )
    console.print(table)
    for preset in presets:
        console.print(f"\n[bold]{escape(preset.name)}[/]: {escape(preset.title)} "
                      f"({escape(preset.hf_model)}, {escape(preset.architecture)})")
        for source in preset.sources:
            console.print(f"  - {escape(source)}")
