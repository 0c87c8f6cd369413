"""``kvcontract audit --model``: the scoped properties on bound upstream code, upstream's
own multi-group loop (``upstream-lookup-*``) included: it observes the scoped lookup
space's cases (Command R7B, ``sw 4097``: upstream's window bound loses the hit)."""

from __future__ import annotations

from audit_releases import release_tree

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
    # The executable system's scenarios on the preset run with upstream's store path
    # executed (issue 20: no horizon modelled): the resend loses the window formula's hit.
    system = run_audit(binding, AuditOptions(clauses=["C11"], jobs=1, geometries=COMMAND_R))
    rows = {(r["clause"], r["theorem"]): r for r in system.rows}
    resend = rows[("C4", "system[command-r7b bpc=1 P=4113 resend]")]
    assert resend["verdict"] == "COUNTEREXAMPLE" and resend["impact"] == "lost-hit"
    assert not system.unchecked
