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
    # The executable system's scenarios need a store horizon, which the audit no longer
    # models from _build_store_jobs' text (issue 20): unchecked on upstream code, named.
    system = run_audit(binding, AuditOptions(clauses=["C11"], jobs=1, geometries=COMMAND_R))
    assert not system.rows
    unchecked = {u["theorem"]: u["reason"] for u in system.unchecked}
    assert "store horizon is not modelled" in unchecked["system[seed scenarios]"]
