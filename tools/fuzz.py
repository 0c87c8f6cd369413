"""Differential fuzzing of the offloading system: mocked vs tensor-backed managers.

Contract of :func:`run_fuzz`: every program (a list of operations) runs through two
:class:`~kvcontract.impl.system.engine.OffloadSystem` instances built from the same
Implementation, one with the bookkeeping-only manager and one with the tensor-backed
manager and worker, in lockstep; each system has a
:class:`~kvcontract.tools.monitor.Monitor` subscribed to its events, and the program's
fixtures (installed chunk states, eviction pressure, store failures) go through a
:class:`~kvcontract.tools.harness.SystemHarness`. A finding (a :class:`Difference`) is
any difference in their decision logs (lookup answers, accepted hits, load sets, store
offers, evictions, completions) or any violation either monitor records against the
formal model and the data oracles (a "not found"/"not ready" crash, a lookup or load set
that differs from ``spec.multigroup``, stores that differ from ``spec.reachability``, a
C11 byte or attention mismatch, a shared-prefix junction other than the spec's). Programs
come from fixed seed scenarios (docs/CONTRACT.md section 8, plus the window bound of
``upstream-current`` and a shared-prefix junction, 9.3), from the
matrix (``matrix=True``: docs/CONTRACT.md section 10 and boundary / e / EAGLE / bpc /
geometry / left-chunk state / GPU prefix hit combinations;
``matrix_scenarios(quick=True)`` is a fixed sample of it for the test suite) and from a
Hypothesis state machine whose failures shrink to a short printed program.

With ``live=True`` the installed vLLM is a third backend (:func:`run_live_scenario`,
:mod:`kvcontract.live.differential`): every seed or matrix scenario, and every program
the state machine generated, runs again on kvcontract's executable system (mocked
manager, the implementation under test: normally ``upstream-current``, kvcontract's
model of vLLM) and on vLLM's own scheduler in lockstep; any difference in accepted
hits, load sets or store offers is a ``model-gap``: a finding about kvcontract's model
of vLLM, reported in ``FuzzReport.live``, never graded as a contract violation.

Exit semantics for the CLI: 0 when no difference's impact is in ``fail_on``, 1
otherwise; model gaps never change it unless ``fail_on_model_gap`` (then an
``unexplained`` gap, one no documented class explains, is exit 1 too); bad input raises
:mod:`kvcontract.errors` exceptions.
"""

from __future__ import annotations

import inspect
import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvcontract.errors import GeometryError, KvContractError, UsageError, WitnessError
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.system.engine import RETRY_STEPS, OffloadSystem, StorePath, SystemConfig
from kvcontract.impl.system.lifecycle import TraceRecorder
from kvcontract.impl.system.offload import ChunkState
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.build import buildable
from kvcontract.spec.clauses import CLAUSE_IMPACT, get_clause
from kvcontract.spec.geometry import Geometry, fa, mamba, swa
from kvcontract.spec.lifecycle import DEFAULT_DEFERRAL_BOUND, ExceptionRecord
from kvcontract.spec.properties.base import latent_reason
from kvcontract.spec.properties.end_to_end import junction_geometry
from kvcontract.tools.harness import FIXTURE_OPERATIONS, SystemHarness
from kvcontract.tools.hypothesis_runs import deterministic_hypothesis
from kvcontract.tools.monitor import Monitor
from kvcontract.vocabulary import DEFAULT_FAIL_ON, Impact, Verdict, finding_exit_code

Op = tuple[Any, ...]


@dataclass
class Difference:
    clause: str
    kind: str
    message: str
    program: list[str]
    witness: dict[str, Any] = field(default_factory=dict)
    latent: str | None = None
    """Why vLLM does not build the scenario's geometry (then the impact is ``latent``)."""
    graded: Impact | None = None
    """The impact the finding's judge gave it (a lifecycle judge grades each finding:
    a deferral decided late is ``delay``, one never decided ``stall``); None: the
    clause's."""

    @property
    def impact(self) -> Impact:
        """``latent`` on a geometry vLLM does not build; else a crash of the manager is a
        crash, a graded finding its judge's impact, and otherwise what the clause's
        findings cost."""
        if self.latent is not None:
            return Impact.LATENT
        if self.kind == "crash":
            return Impact.CRASH
        return self.graded if self.graded is not None else get_clause(self.clause).impact


@dataclass
class FuzzReport:
    target: str
    device: str
    cases: int = 0
    steps: int = 0
    per_clause: dict[str, int] = field(default_factory=dict)
    differences: list[Difference] = field(default_factory=list)
    fail_on: frozenset[Impact] = DEFAULT_FAIL_ON
    geometries: list[dict[str, Any]] = field(default_factory=list)
    """The geometries of a scoped run (``--model``/``--geometry``); empty: the built-in
    seed scenarios."""
    live: Any = None
    """The live comparison (a ``kvcontract.live.differential.LiveComparisonReport``)
    when the run had ``live=True``; None otherwise."""
    fail_on_model_gap: bool = False

    @property
    def exit_code(self) -> int:
        """1 when a difference's impact is in ``fail_on`` (or, with
        ``fail_on_model_gap``, when a model gap is ``unexplained``), else 0."""
        code = finding_exit_code(
            ((Verdict.COUNTEREXAMPLE, d.impact) for d in self.differences), self.fail_on)
        tails = getattr(self.live, "partial_tails", None)
        if code == 0 and tails is not None and not isinstance(tails, str):
            # Judged on vLLM's own engine: a contract violation of the release.
            code = finding_exit_code(((Verdict.COUNTEREXAMPLE, CLAUSE_IMPACT[clause])
                                      for clause in tails.clauses()), self.fail_on)
        if code == 0 and self.fail_on_model_gap and self.live is not None and (any(
                gap.gap_class == "unexplained" for gap in self.live.gaps) or (
                    tails is not None and not isinstance(tails, str) and tails.model_gaps)):
            return 1
        return code

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "command": "fuzz",
            "target": self.target,
            "device": self.device,
            "cases": self.cases,
            "steps": self.steps,
            "per_clause": dict(sorted(self.per_clause.items())),
            "fail_on": sorted(i.value for i in self.fail_on),
            "differences": [_jsonable({**_without_graded(asdict(d)), "impact": d.impact.value})
                            for d in self.differences],
            **({"geometries": self.geometries} if self.geometries else {}),
            **({"live": _jsonable(self.live.to_json())} if self.live is not None else {}),
        }


def _without_graded(shown: dict[str, Any]) -> dict[str, Any]:
    shown.pop("graded", None)  # the report's "impact" says it
    return shown


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
    gpu_prefix_cache: bool = True


def format_op(op: Op) -> str:
    name, *args = op
    shown = []
    for arg in args:
        if isinstance(arg, list) and len(arg) > 8:
            shown.append(f"<{len(arg)} tokens>")
        else:
            shown.append(repr(arg))
    return f"{name}({', '.join(shown)})"


def encode_program(ops: Sequence[Op]) -> dict[str, Any]:
    """``ops`` as JSON: each operation a list ``[name, arg, ...]``, a token list as
    ``{"tokens": i}`` into ``token_lists`` (each distinct list once: a program's requests
    share prompts), a chunk state as ``{"chunk_state": value}``."""
    token_lists: list[list[int]] = []
    index: dict[tuple[int, ...], int] = {}
    encoded: list[list[Any]] = []
    for name, *args in ops:
        shown: list[Any] = [name]
        for arg in args:
            if isinstance(arg, list):
                key = tuple(int(t) for t in arg)
                if key not in index:
                    index[key] = len(token_lists)
                    token_lists.append(list(key))
                shown.append({"tokens": index[key]})
            elif isinstance(arg, ChunkState):
                shown.append({"chunk_state": arg.value})
            else:
                shown.append(arg)
        encoded.append(shown)
    return {"token_lists": token_lists, "ops": encoded}


def decode_program(data: Mapping[str, Any]) -> list[Op]:
    """:func:`encode_program`'s output back as operations; :class:`WitnessError` naming
    what is malformed."""
    token_lists = data.get("token_lists")
    ops = data.get("ops")
    if not isinstance(token_lists, list) or not isinstance(ops, list) or not all(
            isinstance(t, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                        for x in t) for t in token_lists):
        raise WitnessError("a fuzz program needs 'ops' (a list) and 'token_lists' (lists "
                           "of integers)")
    decoded: list[Op] = []
    for number, op in enumerate(ops):
        if not isinstance(op, list) or not op or op[0] not in OPERATIONS:
            raise WitnessError(f"ops[{number}]: {op!r} is not [operation, arg, ...] with a "
                               f"known operation ({', '.join(sorted(OPERATIONS))})")
        args: list[Any] = []
        for arg in op[1:]:
            if isinstance(arg, dict) and set(arg) == {"tokens"}:
                at = arg["tokens"]
                if not isinstance(at, int) or not 0 <= at < len(token_lists):
                    raise WitnessError(f"ops[{number}]: no token list {at!r}")
                args.append(list(token_lists[at]))
            elif isinstance(arg, dict) and set(arg) == {"chunk_state"}:
                try:
                    args.append(ChunkState(arg["chunk_state"]))
                except ValueError:
                    raise WitnessError(f"ops[{number}]: unknown chunk state "
                                       f"{arg['chunk_state']!r}") from None
            elif isinstance(arg, (int, str)) and not isinstance(arg, bool):
                args.append(arg)
            else:
                raise WitnessError(f"ops[{number}]: argument {arg!r} is not an integer, a "
                                   "string, a token list or a chunk state")
        decoded.append((op[0], *args))
    return decoded


def replay_program(replay: Mapping[str, Any], impl: Implementation) -> list[Difference]:
    """A fuzz witness's ``replay`` object (:meth:`Lockstep.replay_witness`) run again on
    ``impl``: its program on the scenario's geometry and settings, then a drain; every
    difference the lockstep finds. :class:`WitnessError` for a malformed object."""
    if not isinstance(replay, Mapping):
        raise WitnessError("a fuzz witness's 'replay' is an object")
    try:
        geometry = Geometry.from_dict(dict(replay["geometry"]))
        settings = {name: replay[name] for name in (
            "delay_steps", "capacity_chunks", "prompt_only", "gpu_prefix_cache")}
    except (KeyError, TypeError, ValueError, KvContractError) as exc:
        raise WitnessError(f"a fuzz witness's 'replay' cannot be read: "
                           f"{type(exc).__name__}: {exc}") from None
    ops = decode_program(replay)
    if ops and ops[-1][0] == "drain":
        ops = ops[:-1]  # run_scenario drains
    scenario = Scenario("replay", geometry, ops, int(settings["delay_steps"]),
                        int(settings["capacity_chunks"]), bool(settings["prompt_only"]),
                        bool(settings["gpu_prefix_cache"]))
    _validate(scenario)
    return run_scenario(impl, scenario, "cpu").findings


SYSTEM_OPERATIONS = frozenset({"add_request", "step", "finish", "finish_with_error", "abort",
                               "preempt", "drain", "stall_next_store", "fail_next_load",
                               "reset_prefix_cache", "retry_lookups"})
"""The program operations that are methods of ``OffloadSystem``: the scheduler's and
the environment's lifecycle faults (a request finished with an error wherever its
prefill is, the next store job never completes, the next load job fails, the prefix
caches are dropped, the offload tier answers RETRY for a while)."""

OPERATIONS = SYSTEM_OPERATIONS | FIXTURE_OPERATIONS
"""The operations a program may use: the system's own and the fixtures of
:class:`~kvcontract.tools.harness.SystemHarness`."""


class Lockstep:
    """Two systems (mocked, tensor-backed) driven by the same operations, each judged by
    its own :class:`~kvcontract.tools.monitor.Monitor` (``monitors[i]`` judges
    ``systems[i]``) and manipulated by its own harness (``harnesses[i]``)."""

    def __init__(self, impl: Implementation, scenario: Scenario, device: str,
                 store_path: StorePath | None = None, judge_lifecycle: bool = True) -> None:
        self.scenario = scenario
        self.judge_lifecycle = judge_lifecycle
        """Whether the monitors judge C13-C15 (not on a target's functions bound into
        kvcontract's system: ``LIFECYCLE_SPACE.not_on_bound_code`` says why)."""
        self.systems = [
            OffloadSystem(
                SystemConfig(
                    scenario.geometry, impl, tensor_backed=backed, device=device,
                    capacity_chunks=scenario.capacity_chunks,
                    delay_steps=scenario.delay_steps, prompt_only=scenario.prompt_only,
                    gpu_prefix_cache=scenario.gpu_prefix_cache, store_path=store_path,
                )
            )
            for backed in (False, True)
        ]
        self.monitors = [Monitor.attach(system) for system in self.systems]
        # A refused load is the monitor's C2 crash already, not a lifecycle record too.
        self.recorders = [TraceRecorder.attach(system, load_crashes=False)
                          for system in self.systems]
        """Each system's lifecycle so far, judged (C13-C15) by its monitor once the
        program drains or stops at an exception."""
        self.harnesses = [SystemHarness(system) for system in self.systems]
        self.program: list[str] = []
        self.ops: list[Op] = []
        """The operations applied so far (a live replay runs them again)."""
        self.findings: list[Difference] = []
        self._seen = [0, 0]
        self.latent = latent_reason(scenario.geometry)
        """Why vLLM does not build the scenario's geometry: its findings are latent."""
        self.stopped = False
        """An operation raised: the program stopped there, as an engine-fatal error
        stops vLLM's engine (the exception is a C14 finding); later operations are
        not applied."""

    def apply(self, op: Op) -> None:
        if not op or op[0] not in OPERATIONS:
            raise UsageError(
                f"unknown program operation {op[0] if op else op!r}; "
                f"known: {', '.join(sorted(OPERATIONS))}"
            )
        if self.stopped:
            return
        self.program.append(format_op(op))
        self.ops.append(op)
        name, *args = op
        for system, harness, recorder in zip(self.systems, self.harnesses, self.recorders,
                                             strict=True):
            target: OffloadSystem | SystemHarness = (
                harness if name in FIXTURE_OPERATIONS else system
            )
            method = getattr(target, name)
            try:
                inspect.signature(method).bind(*args)
            except TypeError as exc:  # wrong number of arguments in a hand-written program
                raise UsageError(f"bad operation {format_op(op)}: {exc}") from None
            recorder.step = system.steps
            try:
                method(*args)
            except KvContractError:
                raise  # bad input (a program, a geometry): the user's to fix
            except Exception as exc:  # engine-fatal: the lifecycle judges it (C14)
                if not self.judge_lifecycle:
                    raise  # the caller's to judge (the audit: a crash or a stand-in gap)
                request = args[0] if args and isinstance(args[0], str) else None
                recorder.exceptions.append(ExceptionRecord(
                    system.steps, request, name, type(exc).__name__, str(exc)))
                self.stopped = True
        if self.judge_lifecycle and (self.stopped or name == "drain"):
            self._judge_lifecycle()
        self._compare()

    def _judge_lifecycle(self) -> None:
        for system, monitor, recorder in zip(self.systems, self.monitors, self.recorders,
                                             strict=True):
            monitor.judge_lifecycle(recorder.trace(system, fatal=self.stopped))

    def replay_witness(self, clause: str) -> dict[str, Any]:
        """What replays this program (:func:`replay_program`): the scenario's geometry
        and settings, the clause found, and the operations so far (:func:`encode_program`)."""
        scenario = self.scenario
        return {"clause": clause, "geometry": scenario.geometry.to_dict(),
                "delay_steps": scenario.delay_steps,
                "capacity_chunks": scenario.capacity_chunks,
                "prompt_only": scenario.prompt_only,
                "gpu_prefix_cache": scenario.gpu_prefix_cache,
                **encode_program(self.ops)}

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
                    list(self.program), {"replay": self.replay_witness("C11")},
                    latent=self.latent,
                )
            )
            real.log[:] = mocked.log  # report once
        for which, (system, monitor) in enumerate(zip(self.systems, self.monitors, strict=True)):
            for violation in monitor.violations[self._seen[which] :]:
                backend = "real" if system.tensor_backed else "mocked"
                if which == 0 and violation.kind == "crash":
                    continue  # the real manager reports the same crash with its bytes
                self.findings.append(
                    Difference(
                        violation.clause, violation.kind,
                        f"[{backend}] {violation.message}", list(self.program),
                        {**violation.witness,
                         "replay": self.replay_witness(violation.clause)},
                        latent=self.latent, graded=violation.impact,
                    )
                )
            self._seen[which] = len(monitor.violations)

    @property
    def steps(self) -> int:
        return int(self.systems[1].steps)

    def checks(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for monitor in self.monitors:
            total.update(monitor.checks)
        return total


def run_scenario(impl: Implementation, scenario: Scenario, device: str,
                 store_path: StorePath | None = None, judge_lifecycle: bool = True,
                 ) -> Lockstep:
    """``scenario`` on ``impl`` (``store_path``: ``SystemConfig.store_path``;
    ``judge_lifecycle``: :attr:`Lockstep.judge_lifecycle`)."""
    lockstep = Lockstep(impl, scenario, device, store_path, judge_lifecycle)
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


def _produce(rid: str, tokens: list[int], budget: int) -> list[Op]:
    """A producer that prefills ``tokens`` in ``budget``-token steps, decodes and finishes."""
    steps = -(-len(tokens) // budget) + 2
    return [("add_request", rid, tokens, 1)] + [("step", budget)] * steps + [("drain",)]


EVICT_GPU: Op = ("evict_gpu_cache",)
"""Consumers after a producer would otherwise hit the GPU prefix cache, not the CPU."""


def _junction_program(producer_len: int, shared: int, first_len: int, second_len: int,
                      salt: int, budget: int = 64) -> list[Op]:
    """A shared-prefix junction (docs/CONTRACT.md 9.3): a producer of ``producer_len``
    tokens finishes; a first consumer of ``first_len`` tokens sharing its first
    ``shared`` gets a hit a sparse group cuts below the full-attention boundary,
    registers the junction and stores for it; a second consumer of ``second_len``
    tokens sharing the same prefix with both then reads at the junction. The GPU prefix
    cache is emptied before each consumer, so every hit is the offload's."""
    produced = _tokens(producer_len, salt)
    first = produced[:shared] + _tokens(first_len - shared, salt + 7)
    second = produced[:shared] + _tokens(second_len - shared, salt + 9)
    return [*_produce("producer", produced, budget), EVICT_GPU,
            *_produce("first", first, budget), EVICT_GPU,
            ("add_request", "second", second, 1),
            *[("step", budget)] * (-(-second_len // budget) + 2)]


def seed_scenarios(salt: int = 0) -> list[Scenario]:
    """The four historic defects of docs/CONTRACT.md section 8 as concrete programs, the
    window bound, an EAGLE group under lookahead block hashes, a Mamba group's
    retention, and a shared-prefix junction."""
    scenarios: list[Scenario] = []
    # seed 000: stale pending flag.
    geo = Geometry((fa(4), swa(4, 8)))
    toks = _tokens(17, salt)
    ops = _install_all(toks, geo, {(1, 2): "absent", (1, 3): "pending"})
    scenarios.append(Scenario("seed000-stale-pending", geo, ops + _consume(toks, 64)))
    # vLLM #49829 (C13): the producer's first store job stalls (HIT_PENDING forever);
    # a resend's window reads its chunks, so the resend waits on them: the deferral
    # deadline must decide it within D steps (recompute, or a smaller hit).
    scenarios.append(Scenario("c13-stalled-store", geo, [
        ("stall_next_store",), *_produce("producer", toks, 8), EVICT_GPU,
        *_consume(toks, 64, 2 * DEFAULT_DEFERRAL_BOUND + 2)]))
    # seed 001: unaligned hit (boundary 3904 forced by the bs-8 group).
    geo = Geometry((fa(256), swa(64, 128), swa(8, 128)), blocks_per_chunk=4)
    toks = _tokens(4353, salt)
    ops = _install_all(toks, geo, {(2, 122): "absent", (2, 126): "absent", (1, 14): "absent"})
    scenarios.append(Scenario("seed001-unaligned-hit", geo, ops + _consume(toks, 512, 2)))
    # seed 003: MTP extra retained tokens, producer then consumer.
    geo = Geometry((fa(64), swa(16, 32, 3)))
    toks = _tokens(65, salt)
    scenarios.append(
        Scenario("seed003-mtp", geo,
                 [*_produce("producer", toks, 40), EVICT_GPU, *_consume([*toks, 1], 128)])
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
    # Window bound (docs/CONTRACT.md 12, departures): sw = 1 (mod tpc), e = 0; the store
    # mask supplies cdiv(sw - 1, tpc) chunks, upstream's lookup demands one more.
    geo = Geometry((fa(16), swa(4, 9)))
    toks = _tokens(49, salt)
    scenarios.append(
        Scenario("window-sw9-tpc4", geo,
                 [*_produce("producer", toks, 35), EVICT_GPU, *_consume(toks, 64)])
    )
    # Lookahead block hashes (docs/CONTRACT.md 2.1): a full-attention EAGLE group drops
    # nothing, so a resend of 17 tokens is served its four complete chunks (16 tokens);
    # a lookup that still peeks past them finds no key and pops to 12 (C4, C5).
    geo = Geometry((fa(4, eagle=True), swa(4, 8)), retention_interval=0, hash_lookahead=1)
    toks = _tokens(17, salt)
    scenarios.append(
        Scenario("lookahead-eagle", geo,
                 [*_produce("producer", toks, 8), EVICT_GPU, *_consume(toks, 64)])
    )
    # A Mamba group as vLLM builds it (align mode: the Mamba block is the base block):
    # after a resend's external hit, the Mamba group keeps only the chunk holding the
    # state at the hit (C1), and a continuation hits at a chunk end past the prompt's.
    geo = Geometry((mamba(4), swa(8, 12)))
    toks = _tokens(33, salt)
    scenarios.append(
        Scenario("mamba-retention", geo,
                 [*_produce("producer", toks, 11), EVICT_GPU, *_consume(toks, 64),
                  EVICT_GPU, ("add_request", "continuation", [*toks, 1, 2, 3], 1),
                  *[("step", 64)] * 4])
    )
    # A shared-prefix junction (docs/CONTRACT.md 9.3, vLLM 0.34.0's engine numbers): FA bs
    # 16 + SWA bs 4, sw 8, retention 0 (vLLM's default). The 53-token producer stores FA
    # chunks 0-2 and SWA 10-11 (its replay boundary 52 -> 48); a first consumer of 59
    # tokens sharing 40 is served FA 0-1 (boundary 32) but not the window at 32 (SWA
    # 6-7): hit 0, junction 32, so it stores SWA 6-7; a second consumer of 43 tokens
    # sharing 40 hits 32. Registering no junction (vLLM 0.33.0's connector,
    # ``no-shared-prefix-junction``) loses it (C12).
    geo = Geometry((fa(16), swa(4, 8)), retention_interval=0)
    scenarios.append(Scenario(JUNCTION_SEED, geo, _junction_program(53, 40, 59, 43, salt)))
    return scenarios


JUNCTION_SEED = "c12-shared-prefix-junction"
JUNCTION_MATRIX_PREFIX = "junction "


def exercises_junctions(scenario: Scenario) -> bool:
    """Whether ``scenario`` is one of the programs built to exercise shared-prefix
    junctions (the seed, the matrix's junction programs), whose verdicts hang on the
    junction rule under test."""
    return scenario.name == JUNCTION_SEED or scenario.name.startswith(JUNCTION_MATRIX_PREFIX)


SCOPED_MAX_PROMPT = 16_384
"""The longest prompt of a scoped seed scenario (``--model``/``--geometry``): a window
longer than that (none of the presets has one) is exercised up to it, not past it."""


def scoped_prompts(geometry: Geometry) -> list[int]:
    """Prompt lengths of the seed scenarios on a given geometry: one token past the first
    multiple of ``A`` beyond every group's window (so history is skipped and the last
    token recomputed), and, when the largest chunk holds 256 tokens or more, one token
    past four such chunks (4k-16k tokens); at most :data:`SCOPED_MAX_PROMPT`."""
    unit = geometry.alignment_tokens or max(geometry.chunk_tokens(g) for g in geometry.groups)
    reach = 2 * unit
    for group in geometry.groups:
        if group.sliding_window is not None:
            tpc = geometry.chunk_tokens(group)
            window = -(-(group.sliding_window - 1 + group.extra_retained_tokens) // tpc)
            reach = max(reach, (window + 1) * tpc)
    lengths = [-(-reach // unit) * unit + 1]
    largest = max(geometry.chunk_tokens(g) for g in geometry.groups)
    if largest >= 256:
        lengths.append(max(lengths[0], 4 * largest + 1))
    return sorted({min(n, SCOPED_MAX_PROMPT) for n in lengths})


def scoped_seed_scenarios(geometries: Sequence[tuple[str, Geometry]],
                          salt: int = 0) -> list[Scenario]:
    """The seed scenarios' shapes on given geometries (``(label, geometry)`` pairs), at
    the prompts of :func:`scoped_prompts`: a producer in unaligned prefill steps, then a
    resend (the window bound); a continuation (seed 003's shape); a resend of a producer
    whose first store job stalls (``c13-stalled-store``: C13); a lookup over stored
    chunks whose first chunk in an SWA group's window is absent and last one pending
    (seed 000: stale pending); a miss in the finest group right after a boundary that is
    not a multiple of ``A`` (seed 001: unaligned hit); a chunked prefill aborted, then a
    request prefilled in large steps (seed 004: prefill horizon)."""
    from kvcontract.spec import multigroup

    scenarios: list[Scenario] = []
    for label, geo in geometries:
        unit = geo.alignment_tokens or max(geo.chunk_tokens(g) for g in geo.groups)
        finest = min(range(len(geo.groups)), key=lambda g: geo.chunk_tokens(geo.groups[g]))
        swa_groups = [g for g, spec in enumerate(geo.groups) if spec.is_swa]
        for length in scoped_prompts(geo):
            keys = sum(length // geo.chunk_tokens(g) for g in geo.groups)
            capacity = max(4096, 4 * keys)
            toks = _tokens(length, salt)
            steps = max(unit + geo.chunk_tokens(geo.groups[finest]) + 1, -(-length // 8))
            whole = length + 64  # a step budget that prefills the prompt at once
            name = f"{label} P={length}"

            def add(kind: str, program: list[Op], name: str = name, geo: Geometry = geo,
                    capacity: int = capacity) -> None:
                scenarios.append(Scenario(f"{name} {kind}", geo, program,
                                          capacity_chunks=capacity))

            add("resend", [*_produce("producer", toks, steps), EVICT_GPU,
                           *_consume(toks, whole)])
            add("continuation", [*_produce("producer", toks, steps), EVICT_GPU,
                                 *_consume([*toks, 1, 2, 3], whole)])
            add("stalled-store", [("stall_next_store",), *_produce("producer", toks, steps),
                                  EVICT_GPU, *_consume(toks, whole, LIFECYCLE_TAIL_STEPS * 2)])
            top = multigroup.initial_max_hit(geo, length)
            if swa_groups:
                g = swa_groups[0]
                lo, hi = multigroup.load_range(geo, geo.groups[g], top, 0)
                if hi - lo >= 2:
                    overrides = {(g, lo): "absent", (g, hi - 1): "pending"}
                    add("stale-pending", _install_all(toks, geo, overrides)
                        + _consume(toks, whole))
            tpc = geo.chunk_tokens(geo.groups[finest])
            x = top // tpc - 1
            while x > 0 and (x * tpc) % unit == 0:
                x -= 1
            if x > 0:
                add("unaligned", _install_all(toks, geo, {(finest, x): "absent"})
                    + _consume(toks, whole, 2))
            add("prefill-horizon", [
                ("add_request", "long", toks, 1), ("step", steps), ("abort", "long"),
                ("add_request", "whole", _tokens(length, salt + 1), 1),
                *[("step", whole)] * 3])
    return scenarios


MATRIX_GEOMETRIES: list[tuple[str, Callable[[int, bool], tuple[Any, ...]]]] = [
    ("FA16+SWA4(sw8)", lambda e, eg: (fa(16), swa(4, 8, e, eagle=eg))),
    # sw = 1 (mod tpc) for bpc 1 and 2: upstream's window bound demands a chunk too many.
    ("FA16+SWA8(sw17)", lambda e, eg: (fa(16), swa(8, 17, e, eagle=eg))),
    ("SWA4(sw12)+SWA8(sw20)", lambda e, eg: (swa(4, 12, e, eagle=eg), swa(8, 20))),
    ("SWA8(sw16)+Mamba8", lambda e, eg: (swa(8, 16, e, eagle=eg), mamba(8))),
]
"""Multi-group geometries of the matrix: FA + SWA with different block sizes, two SWA
groups, SWA + Mamba; the first SWA group takes ``e`` and the EAGLE flag."""

LEFT_STATES: tuple[tuple[str, bool], ...] = (
    ("present", False), ("present", True), ("missing", False), ("pending", True),
    ("loading", False), ("stale", False),
)
"""(left-chunk state, GPU prefix hit first): every left state once, local hits
(``L > 0``) with a present and with a pending left chunk; ``stale`` is seed 000's shape
(the left chunk missing, the group's last chunk pending: a MISS between a pending chunk
and the next complete window)."""


def _unaligned_matrix(salt: int) -> Iterator[Scenario]:
    """docs/CONTRACT.md section 10: the upstream unaligned-hit matrix."""
    for (sw, extra), boundary, eagle, left in itertools.product(
        ((128, 0), (128, 3), (256, 1), (256, 3)), (3840, 3904, 3968), (False, True),
        ("ready", "absent", "pending", "loading"),
    ):
        geo = Geometry(
            (fa(256), swa(64, sw, extra, eagle=eagle), swa(8, 128)), blocks_per_chunk=4
        )
        toks = _tokens(4353, salt)
        # The bs-8 group misses the chunks right after `boundary` and one window
        # further, so `boundary` is the largest boundary it serves.
        x = boundary // 32
        left_chunk = -(-boundary // 256) - 2
        overrides = {(2, x): "absent", (2, x + 4): "absent", (1, left_chunk): left}
        ops = _install_all(toks, geo, overrides)
        yield Scenario(
            f"unaligned sw={sw} e={extra} N={boundary} eagle={eagle} left={left}",
            geo, ops + _consume(toks, 8192, 2),
        )


QUICK_STRIDE = 53
"""The quick slice keeps one producer/consumer case in this many (about 80 cases)."""


def _producer_consumer_matrix(salt: int, quick: bool) -> Iterator[Scenario]:
    """Producer -> consumer over geometries, e, EAGLE, bpc, boundary positions (aligned to
    A, to a chunk, to a block, and +-1 token), left-chunk states and local GPU hits."""
    combos = list(itertools.product(MATRIX_GEOMETRIES, (0, 1, 2, 3), (False, True), (1, 2, 4)))
    for index, ((name, make), extra, eagle, bpc) in enumerate(combos):
        geo = Geometry(make(extra, eagle), blocks_per_chunk=bpc)
        align = geo.alignment_tokens or 16
        block = min(geo.block_tokens(g) for g in geo.groups)
        tpc = min(geo.chunk_tokens(g) for g in geo.groups)
        lengths = sorted({base + delta + 1  # +1: the last prompt token is recomputed
                          for base in (3 * align, 4 * tpc, 5 * block) for delta in (-1, 0, 1)})
        for li, length in enumerate(lengths):
            toks = _tokens(length, salt + length)
            for si, (left, local) in enumerate(LEFT_STATES):
                if quick and (index + li + si) % QUICK_STRIDE:
                    continue  # the quick slice: a fixed sample of the matrix
                # Prefill steps of A + tpc + 1 tokens end between A boundaries, so
                # every intermediate frontier is a chance to store a wrong final tail.
                ops = [*_produce("producer", toks, align + tpc + 1), EVICT_GPU]
                if local:
                    # A shorter request sharing the prefix leaves a GPU prefix hit L > 0.
                    warm = toks[: max(1, length // 2)]
                    ops += _produce("warm", warm, align + tpc + 1)
                if left != "present":
                    state = {"missing": "absent"}.get(left, left)
                    ops.append(("perturb_left_chunk", toks, state))
                yield Scenario(
                    f"{name} e={extra} eagle={eagle} bpc={bpc} P={length} left={left} "
                    f"local={local}", geo, ops + _consume(toks, 64, 6),
                )


def matrix_scenarios(salt: int = 0, quick: bool = False) -> Iterator[Scenario]:
    """docs/CONTRACT.md section 10 matrices plus boundary / e / EAGLE / bpc / geometry /
    left-state / local-hit combinations; ``quick`` is a fixed sample for the test suite."""
    if quick:
        yield from itertools.islice(_unaligned_matrix(salt), 0, None, 16)
    else:
        yield from _unaligned_matrix(salt)
    yield from _producer_consumer_matrix(salt, quick)
    # Retention interval (upstream: FA 16, SWA 4, sw 8, 64 tokens, interval 32 / 0).
    for interval in (32, 0):
        geo = Geometry((fa(16), swa(4, 8)), retention_interval=interval)
        toks = _tokens(64, salt)
        producer = [("add_request", "producer", toks, 1), ("step", 64), ("drain",), EVICT_GPU]
        yield Scenario(
            f"retention={interval}", geo, producer + _consume([*toks, 5], 64)
        )
    # Two groups FA + SWA, bs 4, sw 8: a 13-token consumer loads FA {0, 1, 2}, SWA {1, 2}.
    geo = Geometry((fa(4), swa(4, 8)))
    toks = _tokens(13, salt)
    yield Scenario("upstream FA4+SWA4 13 tokens", geo,
                   _install_all(toks, geo, {}) + _consume(toks, 64))
    if not quick:
        yield from _junction_matrix(salt)


def _junction_matrix(salt: int) -> Iterator[Scenario]:
    """Shared-prefix junctions (docs/CONTRACT.md 9.3) as the seed's program scaled to the
    alignment ``A``: a producer of ``3A + 5`` tokens, a first consumer sharing ``2.5A``
    (its hit cut below the full-attention boundary ``2A``) and a second sharing the
    same; retention 0 (vLLM's default), ``4A`` (a segment longer than the junction) and
    None (no junction: the producer's segment tails serve ``2A``), chunks of 1, 2 and 4
    blocks."""
    for (name, make), bpc, units in itertools.product(
            MATRIX_GEOMETRIES[:2], (1, 2, 4), (0, 4, None)):
        shape = Geometry(make(0, False), blocks_per_chunk=bpc)
        align = shape.alignment_tokens
        assert align is not None
        geo = Geometry(shape.groups, blocks_per_chunk=bpc,
                       retention_interval=None if units is None else units * align)
        shared = 2 * align + align // 2
        yield Scenario(
            f"{JUNCTION_MATRIX_PREFIX}{name} bpc={bpc} retention={geo.retention_interval}", geo,
            _junction_program(3 * align + 5, shared, shared + align + 3, shared + 3, salt))


# -- the state machine ------------------------------------------------------------------
FUZZ_GEOMETRIES: list[Geometry] = [
    Geometry((fa(4), swa(4, 8))),
    Geometry((fa(16), swa(4, 8, eagle=True)), blocks_per_chunk=4),
    Geometry((fa(8), swa(4, 12, 1, eagle=True)), blocks_per_chunk=2),
    Geometry((fa(16), swa(4, 8, 3))),
    Geometry((fa(16), swa(4, 8, 1, eagle=True))),
    Geometry((fa(8), swa(4, 12, 2)), blocks_per_chunk=2),
    Geometry((fa(16), swa(8, 16), swa(4, 8))),
    Geometry((swa(4, 8), swa(8, 16, 2))),
    Geometry((fa(36), swa(4, 16))),
    Geometry((swa(8, 16, 1), mamba(8)), blocks_per_chunk=2),
    Geometry((fa(16), swa(4, 8)), retention_interval=32),
    # Lookahead block hashes (docs/CONTRACT.md 2.1): EAGLE groups drop nothing.
    Geometry((fa(16), swa(4, 8, eagle=True)), blocks_per_chunk=4, hash_lookahead=1),
    Geometry((fa(4, eagle=True), swa(4, 8)), retention_interval=0, hash_lookahead=1),
    # vLLM's default retention interval (0): a consumer whose hit the window cuts below
    # the full-attention boundary registers a shared-prefix junction (docs/CONTRACT.md
    # 9.3) and stores for it.
    Geometry((fa(16), swa(4, 8)), retention_interval=0),
]


class FuzzFinding(AssertionError):
    def __init__(self, difference: Difference) -> None:
        super().__init__(f"{difference.clause} {difference.kind}: {difference.message}")
        self.difference = difference


PARTIAL_TAIL_CASES = 40
"""Producer/consumer cases of the partial-tail campaign a ``--live`` run draws on vLLM's
engine (:func:`kvcontract.live.partial_tail.run_partial_tail_campaign`: about 5 s)."""

LIFECYCLE_TAIL_STEPS = RETRY_STEPS + 2
"""Steps a state-machine program ends with (before its drain): past the deferral bound
``D`` and past a RETRY window opened just before."""


def make_state_machine(impl: Implementation, device: str, salt: int,
                       geometries: Sequence[Geometry] = (),
                       base_pool: Sequence[Geometry] = (),
                       live: bool = False) -> type[RuleBasedStateMachine]:
    """The Hypothesis state machine over :data:`FUZZ_GEOMETRIES` (or ``base_pool``, a
    subset of them: a live run's), or over ``geometries`` (a scoped run), whose shared
    prefixes then reach the longest prompt of :func:`scoped_prompts` and whose steps
    include budgets of a third and all of it. Programs may also stall the next store,
    have the offload tier answer RETRY for a while, fail the next load (on vLLM: its
    recompute policy) and finish a request with an error, and, unless ``live`` (a run
    replayed on vLLM, whose session has no such knob), reset the prefix caches; on a
    geometry that registers shared-prefix junctions
    (``end_to_end.junction_geometry``) they also run requests to their end with the GPU
    cache emptied after them (``produce``); each ends with :data:`LIFECYCLE_TAIL_STEPS`
    steps."""
    pool = list(geometries) or list(base_pool) or FUZZ_GEOMETRIES
    prefix_len = max([160, *(n for g in geometries for n in scoped_prompts(g))])
    budgets = [1, 5, 16, 37, 64, 500]
    if geometries:
        budgets += [prefix_len // 3, prefix_len + 64]

    class OffloadPrograms(RuleBasedStateMachine):
        """Arrivals with shared prefixes, prefill steps, decode, finish, abort, preemption,
        eviction pressure, store failures and delayed completions, stalled stores and
        RETRY answers, failed loads, error finishes; unless live, prefix-cache resets; and requests
        run to their end with the GPU prefix cache emptied after them (``produce``: the
        producers whose stores later arrivals, and shared-prefix junctions, read)."""

        requests = Bundle("requests")

        def __init__(self) -> None:
            super().__init__()
            self.lockstep: Lockstep | None = None
            self.counter = 0
            self.prefixes: list[list[int]] = []

        @initialize(
            geometry_index=st.integers(0, len(pool) - 1),
            delay=st.integers(0, 3),
            capacity=st.sampled_from([6, 12, 4096]),
            prompt_only=st.booleans(),
        )
        def setup(self, geometry_index: int, delay: int, capacity: int, prompt_only: bool) -> None:
            geo = pool[geometry_index]
            scenario = Scenario("fuzz", geo, [], delay, capacity, prompt_only)
            self.lockstep = Lockstep(impl, scenario, device)
            self.prefixes = [_tokens(prefix_len, salt + i) for i in range(3)]

        def _apply(self, op: Op) -> None:
            assert self.lockstep is not None
            self.lockstep.apply(op)
            if self.lockstep.findings:
                raise FuzzFinding(self.lockstep.findings[0])

        @rule(
            target=requests,
            prefix=st.integers(0, 2),
            shared=st.integers(0, prefix_len),
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

        def _junctions(self) -> bool:
            return self.lockstep is not None and junction_geometry(
                self.lockstep.scenario.geometry)

        @precondition(_junctions)
        @rule(
            prefix=st.integers(0, 2),
            shared=st.integers(0, prefix_len),
            suffix=st.integers(0, 40),
        )
        def produce(self, prefix: int, shared: int, suffix: int) -> None:
            """A request run to its end at once (prefilled in the largest step, one token
            decoded, every job completed), then the GPU prefix cache emptied: the next
            request sharing its prefix is served by the offload tier, and where a sparse
            group cuts that hit below the full-attention boundary it registers a
            shared-prefix junction (docs/CONTRACT.md 9.3). Only on a geometry where
            junctions are registered (``end_to_end.junction_geometry``), so the programs
            on the others stay what they were."""
            self.counter += 1
            tokens = self.prefixes[prefix][:shared] + _tokens(suffix,
                                                              salt + 1000 + self.counter)
            if len(tokens) < 2:
                tokens = [*tokens, 1, 2]
            self._apply(("add_request", f"r{self.counter}", tokens, 1))
            for _ in range(-(-len(tokens) // max(budgets)) + 2):
                self._apply(("step", max(budgets)))
            self._apply(("drain",))
            self._apply(EVICT_GPU)

        @rule(budget=st.sampled_from(budgets))
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

        @rule()
        def evict_gpu_cache(self) -> None:
            self._apply(EVICT_GPU)

        # The environment's faults of the lifecycle clauses (C13-C15).
        @rule()
        def stall_next_store(self) -> None:
            self._apply(("stall_next_store",))

        @rule()
        def retry_lookups(self) -> None:
            self._apply(("retry_lookups",))

        # (Rules are drawn in the order they are defined: this order keeps a model-only
        # run's programs as they were before the live run had the first and last.)
        @rule()
        def fail_next_load(self) -> None:
            # Live: reported through vLLM's failure API under its recompute policy.
            self._apply(("fail_next_load",))

        if not live:
            # The live session cannot drop the offload tier's idle chunks (vLLM's manager
            # has no API for it), so a live run omits this one.
            @rule()
            def reset_prefix_cache(self) -> None:
                self._apply(("reset_prefix_cache",))

        @rule(rid=requests)
        def finish_with_error(self, rid: str) -> None:
            # vLLM's FINISHED_ERROR mid-prefill (docs/CONTRACT.md 9.1): it stores only
            # what it computed (C14 ended-store-horizon).
            self._apply(("finish_with_error", rid))

        def teardown(self) -> None:
            if self.lockstep is not None and not self.lockstep.findings:
                # More steps than the deferral bound, so a deadline that should fire
                # can be seen not to (C13), as the lifecycle family's tail.
                for _ in range(LIFECYCLE_TAIL_STEPS):
                    self.lockstep.apply(("step", max(budgets)))
                self.lockstep.apply(("drain",))
                _STATS["steps"] += self.lockstep.steps
                _STATS["cases"] += 1
                _CHECKS.update(self.lockstep.checks())
                if self.lockstep.findings:
                    raise FuzzFinding(self.lockstep.findings[0])

    return OffloadPrograms


_STATS: Counter[str] = Counter()
_CHECKS: Counter[str] = Counter()


def keeping_programs(machine: type[RuleBasedStateMachine], kept: list[Scenario],
                     limit: int) -> type[RuleBasedStateMachine]:
    """``machine`` that also keeps (in ``kept``, in generation order, at most ``limit``)
    every program it ran without a finding, as a :class:`Scenario` for a live replay.
    A subclass, so the state machine's own source, from which Hypothesis derives its
    derandomized seed, stays the same in a run that keeps nothing."""

    class KeptPrograms(machine):  # type: ignore[valid-type,misc]
        def teardown(self) -> None:
            super().teardown()  # raises FuzzFinding on a finding: nothing kept then
            lockstep: Lockstep | None = self.lockstep
            if lockstep is not None and not lockstep.findings and len(kept) < limit:
                base = lockstep.scenario
                kept.append(Scenario(
                    f"state machine program {len(kept) + 1}", base.geometry,
                    list(lockstep.ops), base.delay_steps, base.capacity_chunks,
                    base.prompt_only, base.gpu_prefix_cache))

    return KeptPrograms


def run_live_scenario(impl: Implementation, scenario: Scenario) -> Any:
    """``scenario`` on kvcontract's executable system (the mocked manager: the live
    comparison is about decisions, not bytes) and on the installed vLLM in lockstep: a
    :class:`kvcontract.live.differential.ProgramComparison`."""
    from kvcontract.live.differential import build_options, compare_program

    system = OffloadSystem(SystemConfig(
        scenario.geometry, impl, tensor_backed=False,
        capacity_chunks=scenario.capacity_chunks, delay_steps=scenario.delay_steps,
        prompt_only=scenario.prompt_only, gpu_prefix_cache=scenario.gpu_prefix_cache))
    harness = SystemHarness(system)

    def apply(op: Op) -> None:
        target: OffloadSystem | SystemHarness = (
            harness if op[0] in FIXTURE_OPERATIONS else system)
        getattr(target, op[0])(*op[1:])

    # The default capacity (4096 chunks) is "plenty": the live tier then keeps its own
    # (larger) default; a scenario's smaller capacity is the live tier's too.
    capacity = None if scenario.capacity_chunks >= 4096 else scenario.capacity_chunks
    options = build_options(scenario.program, capacity_chunks=capacity,
                            prompt_only=scenario.prompt_only)
    return compare_program(scenario.name, scenario.geometry, scenario.program,
                           model=system, apply_model=apply, options=options,
                           delay_steps=scenario.delay_steps)


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
    fail_on: frozenset[Impact] = DEFAULT_FAIL_ON,
    geometries: Sequence[tuple[str, Geometry]] = (),
    on_progress: Callable[[str, int, int], None] | None = None,
    live: bool = False,
    fail_on_model_gap: bool = False,
) -> FuzzReport:
    """Fuzz one implementation; see the module docstring for what counts as a finding.

    ``live``: the installed vLLM as the third backend (``FuzzReport.live``); raises
    :class:`kvcontract.live.env.LiveUnavailable` (with the install recipe) when it
    cannot run here. ``fail_on_model_gap``: an unexplained model gap is exit 1.

    ``geometries`` (``(label, geometry)`` pairs, ``--model``/``--geometry``) replace the
    built-in seed scenarios by :func:`scoped_seed_scenarios` (unless ``scenarios`` are
    given) and the state machine's geometries by these; not with ``matrix``.
    ``on_progress(name, done, total)`` is called after each scenario and after the state
    machine (``total`` counts both)."""
    impl = get_implementation(impl_name)
    device = _check_device(device)
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 0:
        raise UsageError(f"examples must be a non-negative integer, got {examples!r}")
    if geometries and matrix:
        raise UsageError("--matrix runs the built-in geometry matrix; drop it to fuzz the "
                         "geometries of --model/--geometry (or drop those)")
    report = FuzzReport(target=impl.name, device=device, fail_on=fail_on,
                        fail_on_model_gap=fail_on_model_gap)
    if live:
        from kvcontract.live.differential import LiveComparisonReport
        from kvcontract.live.env import require
        from kvcontract.live.run import vllm_version

        require()
        report.live = LiveComparisonReport(impl.name, vllm_version())
        from kvcontract.live.capabilities import has
        from kvcontract.live.partial_tail import run_partial_tail_campaign

        report.live.partial_tails = (
            run_partial_tail_campaign(seed, PARTIAL_TAIL_CASES) if has("partial-tails")
            else "the installed vLLM has no partial-tail path "
                 "(SchedulerOffloadConfig.supports_partial_tail)")
    if geometries:
        from kvcontract.spec.properties.scoped import describe_scope

        report.geometries = describe_scope(tuple(geometries))
        if scenarios is None:
            scenarios = scoped_seed_scenarios(geometries, seed)
    checks: Counter[str] = Counter()
    threads = torch.get_num_threads()
    if device == "cpu":
        # The tensors are a few KiB: intra-op threads cost more than they save (and
        # batched kernels spin on a shared machine). Restored before returning.
        torch.set_num_threads(1)
    try:
        _run_programs(impl, report, checks, device, examples, matrix, seed, scenarios,
                      [geometry for _, geometry in geometries], on_progress)
    finally:
        torch.set_num_threads(threads)
    report.per_clause = dict(checks)
    return report


def _run_programs(
    impl: Implementation,
    report: FuzzReport,
    checks: Counter[str],
    device: str,
    examples: int,
    matrix: bool,
    seed: int,
    scenarios: list[Scenario] | None,
    geometries: Sequence[Geometry] = (),
    on_progress: Callable[[str, int, int], None] | None = None,
) -> None:

    def compare_live(scenario: Scenario) -> None:
        if report.live is not None:
            report.live.programs.append(run_live_scenario(impl, scenario))

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
    total = len(fixed) + (1 if examples > 0 else 0)
    for done, scenario in enumerate(fixed, 1):
        _validate(scenario)
        record(run_scenario(impl, scenario, device))
        compare_live(scenario)
        if on_progress is not None:
            on_progress(scenario.name, done, total)

    if examples > 0:
        _STATS.clear()
        _CHECKS.clear()
        kept: list[Scenario] = []
        live_pool: list[Geometry] = []
        if report.live is not None:
            from kvcontract.live.build import unsupported

            # The live backend cannot declare every geometry (unsupported names why:
            # dcp > 1 needs several ranks, two EAGLE groups two drafter layers; e > 0
            # it builds from an MTP drafter), and vLLM plans some otherwise (buildable
            # names why: SWA groups with different e, as it tags every SWA spec with
            # one e): a live run's programs draw from the rest, so they compare.
            live_pool = [g for g in FUZZ_GEOMETRIES
                         if unsupported(g) is None and buildable(g)[0]]
        machine = make_state_machine(impl, device, seed, geometries, live_pool,
                                     live=report.live is not None)
        if report.live is not None:
            machine = keeping_programs(machine, kept, examples)
        lines: list[str] = []
        try:
            def collect(text: object) -> None:
                lines.append(str(text))

            # Without local constants: the programs depend on the seed alone, never on
            # how kvcontract is installed or what else the process loaded. (Newer
            # Hypothesis releases type the call: the ignore may be unused there.)
            with with_reporter(collect), deterministic_hypothesis():
                run_state_machine_as_test(  # type: ignore[no-untyped-call,unused-ignore]
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
        for generated in kept:
            compare_live(generated)
        if on_progress is not None:
            on_progress(f"state machine ({examples} programs)", total, total)


def _validate(scenario: Scenario) -> None:
    if scenario.delay_steps < 0:
        raise GeometryError("delay_steps", scenario.delay_steps, "must be >= 0")
    if scenario.capacity_chunks < 1:
        raise GeometryError("capacity_chunks", scenario.capacity_chunks, "must be >= 1")
