"""``kvcontract list``: the clauses, the theorems and the registered implementations."""

from __future__ import annotations

import click
from kvcontract.impl.variants import VARIANTS
from rich.console import Console
from rich.table import Table


@click.command(name="list")
def list_command() -> None:
    """List the clauses, the theorems and the registered implementations."""
    from kvcontract.proofs.runner import catalog
    from kvcontract.spec.clauses import CLAUSES

    console = Console()
    table = Table(title="clauses and theorems")
    table.add_column("clause")
    table.add_column("theorem")
    table.add_column("kind")
    table.add_column("statement", overflow="fold")
    theorems = catalog()
    for clause in CLAUSES:
        own = [t for t in theorems if t.clause == clause.id]
        if not own:
            table.add_row(clause.id, "-", clause.proved_by, clause.statement)
        for t in own:
            table.add_row(clause.id, t.name, t.kind, t.description)
    console.print(table)
    impls = Table(title="implementations (--impl)")
    impls.add_column("name")
    impls.add_column("violates")
    impls.add_column("description", overflow="fold")
    for name, impl in VARIANTS.items():
        impls.add_row(name, ", ".join(impl.violates) or "-", impl.description)
    console.print(impls)
