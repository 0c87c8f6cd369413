"""kvcontract.tools.monitor: allocation retention (C1) of a Mamba group, judged on hand-made
events and on the Mamba seed scenario of the fuzzer; shared-prefix junctions (C12) and the
stores made for them."""

from __future__ import annotations

from typing import Any

from kvcontract.impl.scheduler import StoreTracker
from kvcontract.impl.system import OffloadSystem, SystemConfig
from kvcontract.impl.system.events import AllocationEvent, LookupEvent, StoreEvent
from kvcontract.impl.variants import REFERENCE
from kvcontract.spec.geometry import Geometry, fa, mamba, swa
from kvcontract.tools.fuzz import run_scenario, seed_scenarios
from kvcontract.tools.harness import SystemHarness
from kvcontract.tools.monitor import Monitor, spec_full_attention_boundary
from kvcontract.vocabulary import LookupResult, RequestStatus

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


# -- shared-prefix junctions (C12, docs/CONTRACT.md 9.3) ---------------------------------
JUNCTION = Geometry((fa(16), swa(4, 8)), retention_interval=0)
HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING


def _states(fa_chunks: tuple[LookupResult, ...], swa_hits: set[int] = frozenset({10, 11}),
            swa_chunks: int = 14) -> tuple[tuple[LookupResult, ...], ...]:
    """The first consumer's view (59 tokens sharing 40 with the producer): FA chunks as
    given, the SWA chunks the producer stored (its replay window, 10-11) HIT."""
    return fa_chunks, tuple(HIT if k in swa_hits else MISS for k in range(swa_chunks))


def test_the_spec_s_full_attention_boundary() -> None:
    served = (HIT, HIT, MISS)
    assert spec_full_attention_boundary(JUNCTION, 59, 0, _states(served)) == 32
    # A pending chunk counts (the boundary the window serves), as for a deferral.
    assert spec_full_attention_boundary(JUNCTION, 59, 0, _states((HIT, HIT, PENDING))) == 48
    # From a local hit: only what lies past it counts, and nothing past it is none.
    assert spec_full_attention_boundary(JUNCTION, 59, 16, _states((MISS, HIT, MISS))) == 32
    assert spec_full_attention_boundary(JUNCTION, 59, 32, _states(served)) == 0
    assert spec_full_attention_boundary(JUNCTION, 59, 0, _states((MISS, HIT, HIT))) == 0
    # No sparse group, or no full-attention group: no junction to register.
    assert spec_full_attention_boundary(Geometry((fa(16),)), 59, 0, (served,)) == 0
    assert spec_full_attention_boundary(Geometry((swa(4, 8),)), 59, 0,
                                        (_states(served)[1],)) == 0
    # Clamped to the first sparse group's keys: FA chunks of 4 serve 39 of 40 tokens,
    # the SWA group (chunks of 16) has keys up to 32.
    fine = Geometry((fa(4), swa(16, 32)))
    assert spec_full_attention_boundary(fine, 40, 0, ((HIT,) * 10, (MISS, MISS))) == 32


def _junction_lookup(junction: int | None, hit: int | None = 0,
                     fa_chunks: tuple[LookupResult, ...] = (HIT, HIT, MISS)) -> LookupEvent:
    return LookupEvent("first", 59, 0, _states(fa_chunks), frozenset(), hit, (),
                       None if junction is None else 32, junction)


def test_the_monitor_judges_the_registered_junction() -> None:
    monitor = Monitor(JUNCTION)
    monitor(_junction_lookup(32))
    assert monitor.violations == [] and monitor.checks["C12"] == 1
    monitor(_junction_lookup(None))  # a lookup whose junction was not observed
    monitor(_junction_lookup(None, hit=None))  # a deferral registers nothing
    assert monitor.checks["C12"] == 1
    monitor.violations.clear()  # the deferral's own (C3: nothing to wait on)
    monitor(_junction_lookup(0))  # none registered: the window at 32 is never stored
    monitor(_junction_lookup(48))  # a boundary the full-attention groups do not serve
    assert [(v.clause, v.kind, v.witness["system"], v.witness["spec"])
            for v in monitor.violations] == [("C12", "junction", 0, 32),
                                             ("C12", "junction", 48, 32)]
    assert "the spec's is 32" in monitor.violations[0].message
    # Served up to the full-attention boundary: nothing was cut, no junction.
    served = LookupEvent("first", 59, 0, _states((HIT, HIT, MISS), {6, 7, 10, 11}),
                         frozenset(), 32, ((0, (0, 2)), (1, (6, 8))), 32, 0)
    monitor = Monitor(JUNCTION)
    monitor(served)
    assert monitor.violations == [] and monitor.checks["C12"] == 1
    # Without a retention interval vLLM registers none.
    monitor = Monitor(Geometry((fa(16), swa(4, 8))))
    monitor(_junction_lookup(32))
    assert [(v.clause, v.witness["spec"]) for v in monitor.violations] == [("C12", 0)]


def _first_store(offered: tuple[int, ...], junction: int) -> StoreEvent:
    """The first consumer's one prefill step (59 tokens, hit 0), SWA group."""
    return StoreEvent("first", 1, RequestStatus.PREFILLING, 0, 59, 59, 59, True, offered,
                      frozenset(), 0, 14, 59, junction=junction)


def test_store_steps_are_judged_with_the_junction_handed_to_the_path() -> None:
    monitor = Monitor(JUNCTION)
    assert monitor.spec_offers(_first_store((), 32)) == [6, 7, 10, 11]
    assert monitor.spec_offers(_first_store((), 0)) == [10, 11]
    monitor(_first_store((6, 7, 10, 11), 32))
    monitor(_first_store((10, 11), 0))
    assert monitor.violations == []
    monitor(_first_store((10, 11), 32))  # handed the junction, stored nothing for it
    monitor(_first_store((6, 7, 10, 11), 0))  # stored for a junction it was not handed
    assert [(v.clause, v.witness["spec"]) for v in monitor.violations] == [
        ("C7", [6, 7, 10, 11]), ("C9", [10, 11])]
    # Without a retention interval no store path passes a junction (vLLM's
    # _build_store_jobs), so the spec's step leaves it out too.
    dense = Monitor(Geometry((fa(16), swa(4, 8))))
    assert dense.spec_offers(_first_store((), 32)) == dense.spec_offers(_first_store((), 0))


class _DropsJunction(StoreTracker):
    """A store path that takes the junction and stores nothing for it."""

    def register_junction(self, junction: int) -> None:
        self.junction = 0


def test_the_fuzzer_s_monitor_finds_a_path_that_drops_its_junction() -> None:
    def plugged(geometry: Geometry, prompt_len: int, prompt_only: bool) -> list[Any]:
        return [_DropsJunction(REFERENCE, geometry, g, prompt_len,
                               offload_prompt_only=prompt_only)
                for g in range(len(geometry.groups))]

    scenario = next(s for s in seed_scenarios() if s.name == "c12-shared-prefix-junction")
    system = OffloadSystem(SystemConfig(scenario.geometry, REFERENCE, tensor_backed=False,
                                        store_path=plugged))
    monitor = Monitor.attach(system)
    harness = SystemHarness(system)
    for name, *args in [*scenario.program, ("drain",)]:
        getattr(harness if hasattr(harness, name) else system, name)(*args)
    found = {(v.clause, v.witness.get("request"), tuple(v.witness.get("spec", ())))
             for v in monitor.violations}
    assert ("C7", "first", (6, 7, 10, 11)) in found
    assert {clause for clause, _, _ in found} == {"C7"}
