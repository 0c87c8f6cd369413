"""kvcontract.tools.monitor: allocation retention (C1) of a Mamba group, judged on hand-made
events and on the Mamba seed scenario of the fuzzer."""

from __future__ import annotations

from kvcontract.impl.system.events import AllocationEvent
from kvcontract.impl.variants import REFERENCE
from kvcontract.spec.geometry import Geometry, mamba, swa
from kvcontract.tools.fuzz import run_scenario, seed_scenarios
from kvcontract.tools.monitor import Monitor

MAMBA = Geometry((mamba(4), swa(8, 12)))


def test_mamba_group_keeps_only_the_state_chunk() -> None:
    """Mamba bs 4 (bpc 1): after a hit of 32 tokens the state lives in chunk 7 (the chunk
    that ends at 32), so block 7 is live and blocks 0-6 are null."""
    monitor = Monitor(MAMBA)
    monitor(AllocationEvent("r", 0, 32, (False,) * 7 + (True,)))
    assert monitor.violations == [] and monitor.checks == {"C1": 1}
    monitor(AllocationEvent("r", 0, 32, (True,) * 8))  # keeps every block: too much
    monitor(AllocationEvent("r", 0, 32, (False,) * 8))  # frees the state itself
    monitor(AllocationEvent("r", 0, 32, (False,) * 6 + (True,)))  # a table too short
    assert [(v.clause, v.kind) for v in monitor.violations] == [("C1", "retention")] * 3
    assert monitor.violations[0].message == (
        "request r group 0: live blocks [0, 1, 2]..[5, 6, 7] != the state chunk at 32 = "
        "[7, 8)")
    # A hit below the first chunk end: no state yet, nothing freed.
    monitor = Monitor(MAMBA)
    monitor(AllocationEvent("r", 0, 0, ()))
    assert monitor.violations == [] and monitor.checks == {"C1": 1}


def test_mamba_seed_scenario_is_judged_and_clean() -> None:
    """The Mamba seed: a producer, a resend and a continuation hit at a chunk end past
    the first, so the Mamba group's allocation is judged with blocks freed below it."""
    scenario = next(s for s in seed_scenarios() if s.name == "mamba-retention")
    assert scenario.geometry == MAMBA
    lockstep = run_scenario(REFERENCE, scenario, "cpu")
    assert lockstep.findings == []
    hits = [line for line in lockstep.systems[0].log if line.startswith("lookup ")]
    assert [line.split()[1:4] for line in hits] == [
        ["producer", "local=0", "hit=0"], ["consumer", "local=0", "hit=32"],
        ["continuation", "local=0", "hit=32"]]
    assert all(monitor.checks["C1"] >= 4 for monitor in lockstep.monitors)
