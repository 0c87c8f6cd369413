"""``kvcontract list``: the clauses, the theorems and the registered implementations."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from kvcontract.impl.variants import VARIANTS


@click.command(name="list")
@click.option(
    "--models", is_flag=True,
    help="list the model presets instead (groups, windows, block sizes, sources)",
)
def list_command(models: bool) -> None:
    """List the clauses, the theorems and the registered implementations."""
    if models:
        _list_models()
        return
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


def _list_models() -> None:
    """The model presets (spec/presets): each built at bpc 1, then their sources."""
    from rich.markup import escape

    from kvcontract.spec.models import get_preset, list_presets

    console = Console()
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
            preset.name,
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
