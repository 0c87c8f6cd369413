"""``kvcontract audit --model``: the scoped properties on bound upstream code, upstream's
own multi-group loop (``upstream-lookup-*``) included: it observes the scoped lookup
space's cases (Command R7B, ``sw 4097``: upstream's window bound loses the hit)."""

from __future__ import annotations

from conftest import release_tree

from kvcontract.spec.models import get_preset
from kvcontract.tools.audit.binding import bind
from kvcontract.tools.audit.engine import AuditOptions, run_audit, theorems_for
from kvcontract.tools.audit.targets import resolve_target

COMMAND_R = (("command-r7b bpc=1", get_preset("command-r7b").geometry(1)),)


def test_upstream_loop_on_a_preset_geometry() -> None:
    binding = bind(resolve_target(f"vllm:{release_tree('0.33.0')}"))
    theorems = {t.name: t for t in theorems_for(binding, COMMAND_R)}
    own = theorems["upstream-lookup-is-maximal"]
    case = next(iter(own.space.cases()))  # type: ignore[union-attr]
    assert case.geometry_name == "command-r7b bpc=1"
    run = run_audit(binding, AuditOptions(clauses=["C4"], examples=20, jobs=1,
                                          geometries=COMMAND_R))
    rows = {r["theorem"]: r for r in run.rows}
    for name in ("lookup-is-maximal", "upstream-lookup-is-maximal"):
        row = rows[name]
        assert row["verdict"] == "COUNTEREXAMPLE" and row["impact"] == "lost-hit", row
        assert row["witness"]["geometry"]["groups"][0]["sliding_window"] == 4097
        assert "command-r7b bpc=1" in row["domain"]
    assert rows["load-window-exact"]["witness"]["values"]["sw"] == 4097
    # the executable system's seed scenarios run on the preset too (C11 asks for them)
    system = run_audit(binding, AuditOptions(clauses=["C11"], jobs=1, geometries=COMMAND_R))
    names = {r["theorem"] for r in system.rows}
    assert "system[command-r7b bpc=1 P=4113 resend]" in names
    assert all(name.startswith("system[command-r7b bpc=1 ") for name in names)
    lost = [r for r in system.rows if r["clause"] == "C4"]
    assert lost and lost[0]["verdict"] == "COUNTEREXAMPLE"
