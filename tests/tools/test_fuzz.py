"""The differential fuzzer: variants are caught, the reference is clean, bad input errors."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from kvcontract.errors import GeometryError, UnknownTargetError, UsageError
from kvcontract.impl.system import ChunkState, LookupEvent, OffloadSystem, SystemConfig
from kvcontract.impl.system.events import AllocationEvent, StoreEvent
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lookup import LookupResult
from kvcontract.spec.reachability import RequestStatus
from kvcontract.tools.fuzz import Lockstep, Scenario, matrix_scenarios, run_fuzz, seed_scenarios
from kvcontract.tools.monitor import Monitor
from kvcontract.vocabulary import DEFAULT_FAIL_ON, Impact

VARIANTS = [
    "stale-pending", "unaligned-hit", "mtp-extra-retained", "prefill-horizon",
    "upstream-current", "abort-unscheduled-crash", "no-deadline", "resetting-deadline",
    "no-shared-prefix-junction",
]
ROOT = Path(__file__).resolve().parents[2]


def test_reference_is_clean() -> None:
    report = run_fuzz("reference", examples=15)
    assert report.differences == []
    assert report.exit_code == 0
    data = report.to_json()
    assert data["version"] == 1 and data["command"] == "fuzz" and data["target"] == "reference"
    assert data["per_clause"]["C11"] > 0 and data["cases"] > 0


SEED_CLAUSES = {
    "stale-pending": {"C3"},
    "unaligned-hit": {"C2"},
    "mtp-extra-retained": {"C2", "C4", "C7"},
    "prefill-horizon": {"C9"},
    "upstream-current": {"C4", "C13"},  # C13: no deferral deadline, as vLLM 0.33.0
    "abort-unscheduled-crash": {"C14"},
    "no-deadline": {"C13"},
    "resetting-deadline": {"C13"},
    "no-shared-prefix-junction": {"C12"},  # the junction seed (docs/CONTRACT.md 9.3)
}
"""What the seed scenarios find per variant (each a subset of the variant's ``violates``)."""


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_is_caught(variant: str) -> None:
    report = run_fuzz(variant, examples=0)
    clauses = {d.clause for d in report.differences}
    # Every difference is one of the clauses the variant violates (impl/variants.py),
    # and the seed scenarios find the ones they were written for.
    assert clauses <= set(get_implementation(variant).violates), (variant, clauses)
    assert clauses == SEED_CLAUSES[variant], (variant, clauses)
    # The run fails when a difference's impact is one --fail-on names (by default crash,
    # corruption, lost-hit); with every impact named, any difference fails it.
    failing = any(d.impact in DEFAULT_FAIL_ON for d in report.differences)
    assert report.exit_code == (1 if failing else 0)
    assert dataclasses.replace(report, fail_on=frozenset(Impact)).exit_code == 1
    assert all(d.program for d in report.differences)


@pytest.mark.parametrize("variant", ["unaligned-hit", "mtp-extra-retained"])
def test_real_manager_crashes_for_load_safety_variants(variant: str) -> None:
    report = run_fuzz(variant, examples=0)
    crashes = [d for d in report.differences if d.kind == "crash"]
    # The real manager crashes (the mocked twin's identical crash is not reported twice),
    # and the monitor files it under C2 (load safety).
    assert [d.clause for d in crashes] == ["C2"], crashes
    assert crashes[0].message.startswith("[real] ") and "not found in cache" in crashes[0].message


def test_state_machine_finds_prefill_horizon() -> None:
    # 100 programs: the lifecycle faults are rules too, so the horizon's shape is rarer.
    report = run_fuzz("prefill-horizon", examples=100, scenarios=[])
    assert report.differences
    assert report.differences[0].clause in get_implementation("prefill-horizon").violates
    assert report.differences[0].program


def test_unknown_implementation() -> None:
    with pytest.raises(UnknownTargetError):
        run_fuzz("no-such-impl", examples=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
def test_cuda_without_cuda() -> None:
    with pytest.raises(UsageError, match="CUDA"):
        run_fuzz("reference", device="cuda", examples=0)


def test_invalid_scenario() -> None:
    bad = Scenario("bad", seed_scenarios()[0].geometry, [], delay_steps=-1)
    with pytest.raises(GeometryError):
        run_fuzz("reference", examples=0, scenarios=[bad])
    with pytest.raises(GeometryError):
        run_fuzz("reference", examples=0,
                 scenarios=[Scenario("bad", Geometry((fa(4), swa(4, 8))), [], capacity_chunks=0)])
    unknown_op = Scenario("bad", Geometry((fa(4), swa(4, 8))), [("teleport", "r")])
    with pytest.raises(UsageError, match="teleport"):
        run_fuzz("reference", examples=0, scenarios=[unknown_op])
    bad_args = Scenario("bad", Geometry((fa(4), swa(4, 8))), [("step", 0)])
    with pytest.raises(UsageError, match="budget"):
        run_fuzz("reference", examples=0, scenarios=[bad_args])
    with pytest.raises(UsageError):
        run_fuzz("reference", examples=-1)


def test_quick_matrix_slice_is_clean_on_the_reference() -> None:
    scenarios = list(matrix_scenarios(quick=True))
    names = " ".join(s.name for s in scenarios)
    # The slice still spans the axes of the matrix.
    for needle in ("unaligned", "eagle=True", "bpc=4", "local=True", "left=loading",
                   "left=pending", "left=missing", "Mamba", "SWA4(sw12)+SWA8", "retention"):
        assert needle in names, needle
    report = run_fuzz("reference", examples=0, scenarios=scenarios)
    assert report.differences == [], report.differences[:1]
    assert report.cases == len(scenarios) and report.steps > 0
    for clause in ("C1", "C2", "C3", "C4", "C5", "C8", "C9", "C10", "C11"):
        assert report.per_clause.get(clause, 0) > 0, clause


# -- the monitor (the judge) and the lockstep wiring -------------------------------------
GEO = Geometry((fa(4), swa(4, 8)))
HIT, PENDING, MISS, RETRY = (LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.MISS,
                             LookupResult.RETRY)
SPEC_LOADS = ((0, (0, 4)), (1, (2, 4)))
"""``Load(16, 0)`` of 17 tokens: FA chunks 0-3; SWA (sw 8) chunks 2-3 (``skipped(16) = 9``)."""


def _lookup(states: tuple[tuple[LookupResult, ...], ...], hit: int | None,
            loading: frozenset[tuple[int, int]] = frozenset(),
            loads: tuple[tuple[int, tuple[int, int]], ...] = SPEC_LOADS) -> LookupEvent:
    return LookupEvent("r", 17, 0, states, loading, hit, loads if hit else ())


def test_monitor_judges_lookup_events() -> None:
    monitor = Monitor(GEO)
    ready = ((HIT,) * 4, (HIT,) * 4)
    monitor(_lookup(ready, 16))
    assert monitor.violations == [] and monitor.checks == {"C3": 1, "C4": 1}
    # A RETRY anywhere: nothing to compare, nothing counted.
    monitor(_lookup(((HIT,) * 4, (HIT, HIT, HIT, RETRY)), None))
    assert monitor.violations == [] and monitor.checks == {"C3": 1, "C4": 1}
    # The system's rule: a load set that touches a chunk being loaded defers.
    monitor(_lookup(ready, None, frozenset({(1, 3)})))
    # A pending chunk read at 16 defers; a pending chunk below the window does not.
    monitor(_lookup(((HIT,) * 4, (HIT, HIT, HIT, PENDING)), None))
    assert monitor.violations == []
    monitor(_lookup(((HIT,) * 4, (PENDING, MISS, HIT, HIT)), None))  # C3: defers
    monitor(_lookup(ready, 16, frozenset({(0, 0)})))  # C2: accepted, must defer
    monitor(_lookup(((HIT,) * 4, (HIT, HIT, HIT, MISS)), 16))  # C2: larger than the answer
    monitor(_lookup(ready, 12, loads=((0, (0, 3)), (1, (1, 3)))))  # C4: smaller
    monitor(_lookup(ready, 16, loads=((0, (0, 4)), (1, (1, 4)))))  # C2: wrong load set
    assert [(v.clause, v.kind) for v in monitor.violations] == [
        ("C3", "lookup"), ("C2", "lookup"), ("C2", "lookup"), ("C4", "lookup"),
        ("C2", "load-set"),
    ]
    assert [v.witness.get("spec") for v in monitor.violations[:4]] == [16, None, 12, 16]


def test_monitor_judges_allocation_and_store_events() -> None:
    monitor = Monitor(GEO)
    # Ret(16) of the SWA group (bs 4, sw 8) is blocks [2, 4); the FA group is not judged.
    monitor(AllocationEvent("r", 0, 16, (True,) * 4))
    monitor(AllocationEvent("r", 1, 16, (False, False, True, True)))
    assert monitor.violations == [] and monitor.checks == {"C1": 1}
    monitor(AllocationEvent("r", 1, 16, (False, True, True, True)))
    assert [(v.clause, v.kind) for v in monitor.violations] == [("C1", "retention")]

    def store(offered: tuple[int, ...], before: frozenset[int] = frozenset(),
              computed: int = 8) -> StoreEvent:
        return StoreEvent("r", 0, RequestStatus.PREFILLING, 0, 8, 17, 17, True, offered,
                          before, 0, 2, computed)

    monitor = Monitor(GEO)
    monitor(store((0, 1)))  # 8 tokens prefilled: FA chunks 0 and 1 are due
    assert monitor.violations == [] and monitor.checks == {"C8": 1, "C9": 1, "C10": 2}
    monitor(store((0, 1, 2)))  # chunk 2 is not computed: past the horizon, uncommitted
    monitor(store((0, 1), frozenset({0})))  # chunk 0 again
    monitor(store(()))  # nothing offered: chunks lost
    assert [(v.clause, v.kind) for v in monitor.violations] == [
        ("C9", "store"), ("C10", "store"), ("C9", "store"), ("C8", "store"), ("C7", "store"),
    ]


def test_lockstep_has_one_monitor_and_harness_per_system() -> None:
    tokens = list(range(17))
    program = [("install_chunk", tokens, g, k, ChunkState.READY)
               for g in (0, 1) for k in range(4)]
    scenario = Scenario("wiring", GEO, [*program, ("add_request", "c", tokens, 1),
                                       ("step", 64), ("step", 64), ("drain",)])
    lockstep = Lockstep(get_implementation("reference"), scenario, "cpu")
    for system, monitor in zip(lockstep.systems, lockstep.monitors, strict=True):
        assert monitor.geometry is system.geometry
    for op in scenario.program:
        lockstep.apply(op)
    assert lockstep.findings == []
    mocked, real = lockstep.monitors
    # The same decisions are judged in both; only the real system has bytes (C11).
    assert mocked.checks["C2"] == real.checks["C2"] == 1
    assert mocked.checks["C11"] == 0 < real.checks["C11"]
    assert lockstep.checks() == mocked.checks + real.checks
    # A fixture of one system is not an operation of the system itself.
    assert not hasattr(OffloadSystem(SystemConfig(GEO, get_implementation("reference"))),
                       "install_chunk")


def test_json_report(tmp_path: Path) -> None:
    report = run_fuzz("stale-pending", examples=0, scenarios=seed_scenarios()[:1])
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(report.to_json()))
    data = json.loads(path.read_text())
    assert data["cases"] == 1 and data["differences"][0]["clause"] == "C3"
    assert data["differences"][0]["program"]


def test_gpu_check_dry_run_exercises_the_copy_paths(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The GPU script's CPU paths (worker batching, bandwidth bookkeeping, the round-trip
    # integrity check, the summary) run in-process with tiny sizes.
    path = ROOT / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("kvcontract_gpu_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look modules up
    spec.loader.exec_module(module)
    assert module.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "llama-8b" in out and "gpt-oss" in out and "DRY RUN PASS" in out
    if not torch.cuda.is_available():
        assert module.main([]) == 0  # no CUDA: nothing to check, and it says so
        assert "no CUDA device" in capsys.readouterr().out


# -- long campaigns (pytest -m slow; `kvcontract fuzz --matrix` runs the same) ----------
@pytest.mark.slow
def test_full_matrix_is_clean_on_the_reference() -> None:
    report = run_fuzz("reference", examples=200, matrix=True)
    assert report.differences == [], report.differences[:3]
    assert report.cases > 4000


MATRIX_VARIANTS = [v for v in VARIANTS if v != "abort-unscheduled-crash"]
"""The matrix's programs abort nothing: the abort before scheduling is the seeds' and
the state machine's to find (test_fuzz_lifecycle)."""


@pytest.mark.slow
@pytest.mark.parametrize("variant", MATRIX_VARIANTS)
def test_matrix_catches_every_variant(variant: str) -> None:
    report = run_fuzz(variant, examples=0, scenarios=list(matrix_scenarios()))
    clauses = {d.clause for d in report.differences}
    # The matrix finds at least one clause the variant is known to violate (it may find
    # more: upstream-current's over-demanded window also shows as a C2 lookup there).
    assert clauses & set(get_implementation(variant).violates), (variant, clauses)



def test_findings_on_a_geometry_vllm_does_not_build_are_latent() -> None:
    """A lockstep on a geometry vLLM's planning cannot produce (two SWA groups with
    different e) grades its findings latent: reported, failing only under --fail-on
    latent; on the seed's buildable geometry the same stale-pending finding is a delay."""
    from kvcontract.tools.fuzz import Difference, FuzzReport

    odd = Geometry((swa(4, 8), swa(8, 16, 2)))
    lockstep = Lockstep(get_implementation("reference"), Scenario("odd", odd, []), "cpu")
    assert lockstep.latent is not None and "different e" in lockstep.latent
    finding = Difference("C2", "crash", "boom", ["step 1"], latent=lockstep.latent)
    assert finding.impact is Impact.LATENT
    report = FuzzReport("reference", "cpu", differences=[finding])
    assert report.exit_code == 0
    assert dataclasses.replace(report, fail_on=frozenset({Impact.LATENT})).exit_code == 1
    seed = next(s for s in seed_scenarios() if s.name == "seed000-stale-pending")
    assert Lockstep(get_implementation("reference"), seed, "cpu").latent is None
    buildable = run_fuzz("stale-pending", examples=0, scenarios=[seed])
    assert {d.impact for d in buildable.differences} == {Impact.DELAY}


# -- shared-prefix junctions (C12, docs/CONTRACT.md 9.3) ---------------------------------
JUNCTION_SEED = "c12-shared-prefix-junction"


def _junction_seed() -> list[Scenario]:
    return [s for s in seed_scenarios() if s.name == JUNCTION_SEED]


def test_the_junction_seed_is_clean_on_the_reference_and_finds_vllm_0_33() -> None:
    """The reference registers the junction 32 and the second consumer hits 32; vLLM
    0.33.0's connector (``no-shared-prefix-junction``) registers none: the system's
    monitor finds it (C12, a lost hit) where the first consumer registers."""
    clean = run_fuzz("reference", examples=0, scenarios=_junction_seed())
    assert clean.differences == [] and clean.per_clause["C12"] >= 6
    found = run_fuzz("no-shared-prefix-junction", examples=0, scenarios=_junction_seed())
    assert [(d.clause, d.kind, d.impact) for d in found.differences] == [
        ("C12", "junction", Impact.LOST_HIT)]
    difference = found.differences[0]
    assert (difference.witness["request"], difference.witness["system"],
            difference.witness["spec"]) == ("first", 0, 32)
    assert found.exit_code == 1


def _state_machine(impl: str, examples: int) -> None:
    """The fuzzer's state machine over the geometries of FUZZ_GEOMETRIES where junctions
    are registered (its base pool: every program draws one, whatever the draws of the
    whole list do), generation only (no shrinking: a failure raises its FuzzFinding at
    once)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from kvcontract.spec.properties.end_to_end import junction_geometry
    from kvcontract.tools.fuzz import FUZZ_GEOMETRIES, make_state_machine
    from kvcontract.tools.hypothesis_runs import deterministic_hypothesis

    pool = [g for g in FUZZ_GEOMETRIES if junction_geometry(g)]
    assert pool
    machine = make_state_machine(get_implementation(impl), "cpu", 0, base_pool=pool)
    with deterministic_hypothesis():
        run_state_machine_as_test(machine, settings=settings(
            max_examples=examples, stateful_step_count=25, deadline=None, derandomize=True,
            database=None, suppress_health_check=list(HealthCheck),
            phases=[Phase.generate], report_multiple_bugs=False))


def test_the_state_machine_registers_junctions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its programs reach shared-prefix junctions (the retention-0 geometry, requests
    run to their end with the GPU cache emptied after them), each judged (C12), and the
    reference is clean there."""
    registered: list[int] = []
    judge = Monitor._junction

    def counting(self: Monitor, event: LookupEvent) -> None:
        if event.junction:
            registered.append(event.junction)
        judge(self, event)

    monkeypatch.setattr(Monitor, "_junction", counting)
    _state_machine("reference", 10)
    assert len(registered) >= 2


def test_the_state_machine_finds_a_connector_without_junctions() -> None:
    from kvcontract.tools.fuzz import FuzzFinding

    with pytest.raises(FuzzFinding) as raised:
        _state_machine("no-shared-prefix-junction", 10)
    assert (raised.value.difference.clause, raised.value.difference.kind) == (
        "C12", "junction")
