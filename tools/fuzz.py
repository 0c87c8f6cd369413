"""Differential fuzzing of the offloading system: mocked vs tensor-backed managers.

Contract of :func:`run_fuzz`: every program (a list of operations) runs through two
:class:`~kvcontract.impl.system.engine.OffloadSystem` instances built from the same
Implementation, one with the bookkeeping-only manager and one with the tensor-backed
manager and worker, in lockstep. A finding (a :class:`Difference`) is any difference in
their decision logs (lookup answers, accepted hits, load sets, store offers, evictions,
completions) or any violation either system records against the formal model and the
data oracles (a "not found"/"not ready" crash, a lookup or load set that differs from
``spec.multigroup``, stores that differ from ``spec.reachability``, a C11 byte or
attention mismatch). Programs come from fixed seed scenarios (DOMAIN.md section 8),
from the matrix (``matrix=True``: DOMAIN.md section 10 and boundary/e/EAGLE/bpc/
geometry combinations) and from a Hypothesis state machine whose failures shrink to a
short printed program. Exit semantics for the CLI: 0 when ``differences`` is empty, 1
otherwise; bad input raises :mod:`kvcontract.errors` exceptions.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.system.engine import OffloadSystem, SystemConfig
from kvcontract.impl.system.offload import ChunkState
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.geometry import Geometry, fa, mamba, swa

from kvcontract.errors import GeometryError, UsageError

Op = tuple[Any, ...]


@dataclass
class Difference:
    clause: str
    kind: str
    message: str
    program: list[str]
    witness: dict[str, Any] = field(default_factory=dict)


@dataclass
class FuzzReport:
    target: str
    device: str
    cases: int = 0
    steps: int = 0
    per_clause: dict[str, int] = field(default_factory=dict)
    differences: list[Difference] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.differences else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "command": "fuzz",
            "target": self.target,
            "device": self.device,
            "cases": self.cases,
            "steps": self.steps,
            "per_clause": dict(sorted(self.per_clause.items())),
            "differences": [_jsonable(asdict(d)) for d in self.differences],
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


# -- programs ---------------------------------------------------------------------------
@dataclass
class Scenario:
    """A geometry, system settings and a program of operations."""

    name: str
    geometry: Geometry
    program: list[Op]
    delay_steps: int = 1
    capacity_chunks: int = 4096
    prompt_only: bool = True


def format_op(op: Op) -> str:
    name, *args = op
    shown = []
    for arg in args:
        if isinstance(arg, list) and len(arg) > 8:
            shown.append(f"<{len(arg)} tokens>")
        else:
            shown.append(repr(arg))
    return f"{name}({', '.join(shown)})"


class Lockstep:
    """Two systems (mocked, tensor-backed) driven by the same operations."""

    def __init__(self, impl: Implementation, scenario: Scenario, device: str) -> None:
        self.scenario = scenario
        self.systems = [
            OffloadSystem(
                SystemConfig(
                    scenario.geometry, impl, tensor_backed=backed, device=device,
                    capacity_chunks=scenario.capacity_chunks,
                    delay_steps=scenario.delay_steps, prompt_only=scenario.prompt_only,
                )
            )
            for backed in (False, True)
        ]
        self.program: list[str] = []
        self.findings: list[Difference] = []
        self._seen = [0, 0]

    def apply(self, op: Op) -> None:
        self.program.append(format_op(op))
        name, *args = op
        for system in self.systems:
            getattr(system, name)(*args)
        self._compare()

    def _compare(self) -> None:
        mocked, real = self.systems
        if mocked.log != real.log:
            index = next(
                (i for i, (a, b) in enumerate(zip(mocked.log, real.log, strict=False)) if a != b),
                min(len(mocked.log), len(real.log)),
            )
            self.findings.append(
                Difference(
                    "C11", "lockstep",
                    f"mocked and real managers decided differently at decision {index}: "
                    f"{mocked.log[index:index + 1]} vs {real.log[index:index + 1]}",
                    list(self.program),
                )
            )
            real.log[:] = mocked.log  # report once
        for which, system in enumerate(self.systems):
            for violation in system.violations[self._seen[which] :]:
                backend = "real" if system.tensor_backed else "mocked"
                if which == 0 and violation.kind == "crash":
                    continue  # the real manager reports the same crash with its bytes
                self.findings.append(
                    Difference(
                        violation.clause, violation.kind,
                        f"[{backend}] {violation.message}", list(self.program),
                        dict(violation.witness),
                    )
                )
            self._seen[which] = len(system.violations)

    @property
    def steps(self) -> int:
        return int(self.systems[1].steps)

    def checks(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for system in self.systems:
            total.update(system.checks)
        return total


def run_scenario(impl: Implementation, scenario: Scenario, device: str) -> Lockstep:
    lockstep = Lockstep(impl, scenario, device)
    for op in scenario.program:
        lockstep.apply(op)
    lockstep.apply(("drain",))
    return lockstep


def _tokens(length: int, salt: int) -> list[int]:
    return [(i * 7 + salt * 13 + (i * i) % 11) % 50 for i in range(length)]


def _install_all(
    tokens: list[int], geometry: Geometry, overrides: dict[tuple[int, int], str]
) -> list[Op]:
    ops: list[Op] = []
    for g, spec in enumerate(geometry.groups):
        for k in range(len(tokens) // geometry.chunk_tokens(spec)):
            state = overrides.get((g, k), "ready")
            if state == "loading":
                ops.append(("install_chunk", tokens, g, k, ChunkState.READY))
                ops.append(("mark_loading", tokens, g, k))
            elif state != "absent":
                ops.append(("install_chunk", tokens, g, k, ChunkState(state)))
    return ops


def _consume(tokens: list[int], budget: int, steps: int = 4) -> list[Op]:
    return [("add_request", "consumer", tokens, 1)] + [("step", budget)] * steps


def seed_scenarios(salt: int = 0) -> list[Scenario]:
    """The four historic defects of DOMAIN.md section 8 as concrete programs."""
    scenarios: list[Scenario] = []
    # seed 000: stale pending flag.
    geo = Geometry((fa(4), swa(4, 8)))
    toks = _tokens(17, salt)
    ops = _install_all(toks, geo, {(1, 2): "absent", (1, 3): "pending"})
    scenarios.append(Scenario("seed000-stale-pending", geo, ops + _consume(toks, 64)))
    # seed 001: unaligned hit (boundary 3904 forced by the bs-8 group).
    geo = Geometry((fa(256), swa(64, 128), swa(8, 128)), blocks_per_chunk=4)
    toks = _tokens(4353, salt)
    ops = _install_all(toks, geo, {(2, 122): "absent", (2, 126): "absent", (1, 14): "absent"})
    scenarios.append(Scenario("seed001-unaligned-hit", geo, ops + _consume(toks, 512, 2)))
    # seed 003: MTP extra retained tokens, producer then consumer.
    geo = Geometry((fa(64), swa(16, 32, 3)))
    toks = _tokens(65, salt)
    producer = [("add_request", "producer", toks, 1)] + [("step", 40)] * 4 + [("drain",)]
    scenarios.append(
        Scenario("seed003-mtp", geo, producer + _consume([*toks, 1], 128))
    )
    # seed 004: chunked-prefill store horizon, then an abort and a finish.
    geo = Geometry((fa(36), swa(4, 16)))
    toks = _tokens(1200, salt)
    ops = [
        ("add_request", "long", toks, 1), ("step", 1000), ("abort", "long"),
        ("add_request", "whole", _tokens(1200, salt + 1), 1), ("step", 1000), ("step", 1000),
        ("step", 1000),
    ]
    scenarios.append(Scenario("seed004-prefill-horizon", geo, ops))
    return scenarios


def matrix_scenarios(salt: int = 0) -> Iterator[Scenario]:
    """DOMAIN.md section 10 matrices plus boundary / e / EAGLE / bpc / geometry combinations."""
    # Unaligned-hit matrix.
    for (sw, extra), boundary, eagle, left in itertools.product(
        ((128, 0), (128, 3), (256, 1), (256, 3)), (3840, 3904, 3968), (False, True),
        ("ready", "absent", "pending", "loading"),
    ):
        geo = Geometry(
            (fa(256), swa(64, sw, extra, eagle=eagle), swa(8, 128)), blocks_per_chunk=4
        )
        toks = _tokens(4353, salt)
        x = boundary // 32
        left_chunk = -(-boundary // 256) - 2
        overrides = {(2, x): "absent", (2, x + 4): "absent", (1, left_chunk): left}
        ops = _install_all(toks, geo, overrides)
        yield Scenario(
            f"unaligned sw={sw} e={extra} N={boundary} eagle={eagle} left={left}",
            geo, ops + _consume(toks, 8192, 2),
        )
    # Producer -> consumer over geometries, e, EAGLE, bpc and boundary positions.
    geometries: list[Callable[[int, bool], tuple[Any, ...]]] = [
        lambda e, eg: (fa(16), swa(4, 8, e, eagle=eg)),
        lambda e, eg: (fa(16), swa(8, 24, e, eagle=eg)),
        lambda e, eg: (swa(4, 12, e, eagle=eg), swa(8, 20)),
        lambda e, eg: (swa(8, 16, e, eagle=eg), mamba(8)),
    ]
    combos = itertools.product(geometries, (0, 1, 2, 3), (False, True), (1, 2, 4))
    for make, extra, eagle, bpc in combos:
        geo = Geometry(make(extra, eagle), blocks_per_chunk=bpc)
        align = geo.alignment_tokens or 16
        block = min(geo.block_tokens(g) for g in geo.groups)
        tpc = min(geo.chunk_tokens(g) for g in geo.groups)
        for base in (3 * align, 4 * tpc, 5 * block):
            for delta in (-1, 0, 1):
                length = base + delta + 1  # +1: the last prompt token is recomputed
                toks = _tokens(length, salt + length)
                for left in ("ready", "absent", "pending"):
                    producer = [("add_request", "producer", toks, 1), ("step", 2 * align + 3)]
                    producer += [("step", 2 * align + 3)] * (length // (2 * align) + 2)
                    producer.append(("drain",))
                    perturb: list[Op] = []
                    if left != "ready" and length < geo.chunk_tokens(geo.groups[0]):
                        continue  # no complete chunk to perturb
                    if left != "ready":
                        perturb = [("install_chunk", toks, 0, 0, ChunkState(left))]
                    yield Scenario(
                        f"{geo.describe()} P={length} left={left}", geo,
                        producer + perturb + _consume(toks, 64, 6),
                    )
    # Retention interval (upstream: FA 16, SWA 4, sw 8, 64 tokens, interval 32 / 0).
    for interval in (32, 0):
        geo = Geometry((fa(16), swa(4, 8)), retention_interval=interval)
        toks = _tokens(64, salt)
        producer = [("add_request", "producer", toks, 1), ("step", 64), ("drain",)]
        yield Scenario(
            f"retention={interval}", geo, producer + _consume([*toks, 5], 64)
        )


# -- the state machine ------------------------------------------------------------------
FUZZ_GEOMETRIES: list[Geometry] = [
    Geometry((fa(4), swa(4, 8))),
    Geometry((fa(16), swa(4, 8, 3))),
    Geometry((fa(16), swa(4, 8, 1, eagle=True))),
    Geometry((fa(8), swa(4, 12, 2)), blocks_per_chunk=2),
    Geometry((fa(16), swa(8, 16), swa(4, 8))),
    Geometry((swa(4, 8), swa(8, 16, 2))),
    Geometry((fa(36), swa(4, 16))),
    Geometry((swa(8, 16, 1), mamba(8)), blocks_per_chunk=2),
    Geometry((fa(16), swa(4, 8)), retention_interval=32),
]


class FuzzFinding(AssertionError):
    def __init__(self, difference: Difference) -> None:
        super().__init__(f"{difference.clause} {difference.kind}: {difference.message}")
        self.difference = difference


def make_state_machine(impl: Implementation, device: str, salt: int) -> type[RuleBasedStateMachine]:
    class OffloadPrograms(RuleBasedStateMachine):
        """Arrivals with shared prefixes, prefill steps, decode, finish, abort, preemption,
        eviction pressure, store failures and delayed completions."""

        requests = Bundle("requests")

        def __init__(self) -> None:
            super().__init__()
            self.lockstep: Lockstep | None = None
            self.counter = 0
            self.prefixes: list[list[int]] = []

        @initialize(
            geometry_index=st.integers(0, len(FUZZ_GEOMETRIES) - 1),
            delay=st.integers(0, 3),
            capacity=st.sampled_from([6, 12, 4096]),
            prompt_only=st.booleans(),
        )
        def setup(self, geometry_index: int, delay: int, capacity: int, prompt_only: bool) -> None:
            geo = FUZZ_GEOMETRIES[geometry_index]
            scenario = Scenario("fuzz", geo, [], delay, capacity, prompt_only)
            self.lockstep = Lockstep(impl, scenario, device)
            self.prefixes = [_tokens(160, salt + i) for i in range(3)]

        def _apply(self, op: Op) -> None:
            assert self.lockstep is not None
            self.lockstep.apply(op)
            if self.lockstep.findings:
                raise FuzzFinding(self.lockstep.findings[0])

        @rule(
            target=requests,
            prefix=st.integers(0, 2),
            shared=st.integers(0, 160),
            suffix=st.integers(0, 40),
            new_tokens=st.integers(1, 6),
        )
        def arrive(self, prefix: int, shared: int, suffix: int, new_tokens: int) -> str:
            self.counter += 1
            rid = f"r{self.counter}"
            tokens = self.prefixes[prefix][:shared] + _tokens(suffix, salt + 1000 + self.counter)
            if len(tokens) < 2:
                tokens = [*tokens, 1, 2]
            self._apply(("add_request", rid, tokens, new_tokens))
            return rid

        @rule(budget=st.sampled_from([1, 5, 16, 37, 64, 500]))
        def step(self, budget: int) -> None:
            self._apply(("step", budget))

        @rule(rid=requests)
        def finish(self, rid: str) -> None:
            self._apply(("finish", rid))

        @rule(rid=requests)
        def abort(self, rid: str) -> None:
            self._apply(("abort", rid))

        @rule(rid=requests)
        def preempt(self, rid: str) -> None:
            self._apply(("preempt", rid))

        @rule()
        def fail_next_store(self) -> None:
            self._apply(("fail_next_store",))

        def teardown(self) -> None:
            if self.lockstep is not None and not self.lockstep.findings:
                self.lockstep.apply(("drain",))
                _STATS["steps"] += self.lockstep.steps
                _STATS["cases"] += 1
                _CHECKS.update(self.lockstep.checks())
                if self.lockstep.findings:
                    raise FuzzFinding(self.lockstep.findings[0])

    return OffloadPrograms


_STATS: Counter[str] = Counter()
_CHECKS: Counter[str] = Counter()


def _check_device(device: str) -> str:
    if device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device {device!r}; choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            "--device cuda needs a CUDA device, and torch reports none on this machine; "
            "use --device cpu (the same code with a deterministic completion delay)"
        )
    return device


def run_fuzz(
    impl_name: str,
    *,
    device: str = "cpu",
    examples: int = 200,
    matrix: bool = False,
    seed: int = 0,
    scenarios: list[Scenario] | None = None,
) -> FuzzReport:
    """Fuzz one implementation; see the module docstring for what counts as a finding."""
    impl = get_implementation(impl_name)
    device = _check_device(device)
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 0:
        raise UsageError(f"examples must be a non-negative integer, got {examples!r}")
    report = FuzzReport(target=impl.name, device=device)
    checks: Counter[str] = Counter()

    def record(lockstep: Lockstep) -> None:
        report.cases += 1
        report.steps += lockstep.steps
        checks.update(lockstep.checks())
        seen: set[tuple[str, str]] = set()
        for finding in lockstep.findings:
            # One finding per (clause, kind) and scenario keeps reports readable.
            if (finding.clause, finding.kind) in seen:
                continue
            seen.add((finding.clause, finding.kind))
            finding.witness.setdefault("scenario", lockstep.scenario.name)
            report.differences.append(finding)

    fixed = list(scenarios) if scenarios is not None else seed_scenarios(seed)
    if matrix and scenarios is None:
        fixed.extend(matrix_scenarios(seed))
    for scenario in fixed:
        _validate(scenario)
        record(run_scenario(impl, scenario, device))

    if examples > 0:
        _STATS.clear()
        _CHECKS.clear()
        machine = make_state_machine(impl, device, seed)
        lines: list[str] = []
        try:
            def collect(text: object) -> None:
                lines.append(str(text))

            with with_reporter(collect):
                run_state_machine_as_test(  # type: ignore[no-untyped-call]
                    machine,
                    settings=settings(
                        max_examples=examples,
                        stateful_step_count=25,
                        deadline=None,
                        derandomize=True,
                        database=None,
                        suppress_health_check=list(HealthCheck),
                        phases=[Phase.generate, Phase.shrink],
                        report_multiple_bugs=False,
                    ),
                )
        except FuzzFinding as finding:
            program = [ln for text in lines for ln in str(text).splitlines() if ln.strip()]
            difference = finding.difference
            difference.program = program or difference.program
            report.differences.append(difference)
        report.cases += _STATS["cases"]
        report.steps += _STATS["steps"]
        checks.update(_CHECKS)
    report.per_clause = dict(checks)
    return report


def _validate(scenario: Scenario) -> None:
    if scenario.delay_steps < 0:
        raise GeometryError("delay_steps", scenario.delay_steps, "must be >= 0")
    if scenario.capacity_chunks < 1:
        raise GeometryError("capacity_chunks", scenario.capacity_chunks, "must be >= 1")
