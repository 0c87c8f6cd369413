"""Conformance: the system against the formal model on Z3-enumerated boundary classes.

The prover lifts the reference's ``load_chunk_range`` (``Load(N, L)``: skipped tokens
below zero or not, the local hit reaching past the window start or not) and
``load_window_size_in_chunks`` (padding that adds a chunk or not) into path conditions.
Each feasible path, split further by whether ``N`` is aligned to the group's chunk, is
one boundary class; Z3 gives a concrete witness ``(N, L, sw, e)`` for it. The system then
runs a consumer for that witness (all chunks stored, a GPU prefix hit of exactly ``L``,
a second SWA group with smaller chunks that forces the boundary to ``N``), with the mocked
and the real manager in lockstep: the accepted hit must be ``N`` (read from the real
system's lookup event), and each system's monitor compares the load set with
``spec.multigroup`` / ``Load(N, L)``, the retained blocks with ``Ret(N)`` and the
outcomes of the byte and attention comparisons with the oracles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import z3

from kvcontract.impl import reference
from kvcontract.impl.system.events import Event, LookupEvent
from kvcontract.impl.system.offload import ChunkState
from kvcontract.impl.variants import get_implementation
from kvcontract.spec.geometry import Geometry, swa
from kvcontract.spec.symbolic import PathExplorer
from kvcontract.tools.fuzz import Lockstep, Op, Scenario

BIG_BS, SMALL_BS = 8, 4
LOCAL_STEP = 8  # lcm of the block sizes: a GPU prefix hit ends on both groups' blocks


@dataclass(frozen=True)
class Witness:
    function: str
    path: int
    aligned: bool
    hit: int
    local: int
    sliding_window: int
    extra: int


def boundary_classes(bpc: int) -> list[Witness]:
    big_tpc, small_tpc = BIG_BS * bpc, SMALL_BS * bpc
    n, local, sw, e = z3.Ints("N L sw e")
    domain = [
        sw >= 2, sw <= 40, e >= 0, e <= 3, local >= 0, local % LOCAL_STEP == 0,
        n % small_tpc == 0, n >= big_tpc, n <= 8 * big_tpc, n / big_tpc > local / big_tpc,
    ]
    functions: list[tuple[str, Any, tuple[Any, ...]]] = [
        ("load_chunk_range", reference.load_chunk_range, (n, local, BIG_BS, bpc, sw, e)),
        ("load_window_size_in_chunks", reference.load_window_size_in_chunks,
         (n, sw, e, big_tpc)),
    ]
    witnesses: list[Witness] = []
    for name, fn, args in functions:
        paths = PathExplorer(assumptions=domain, prune=True).paths(fn, args)
        assert len(paths) >= 2, name  # the classes exist (a vacuous run proves nothing)
        for index, (condition, _) in enumerate(paths):
            for aligned in (True, False):
                solver = z3.Solver()
                solver.add(*domain, condition,
                           (n % big_tpc == 0) if aligned else (n % big_tpc != 0))
                if solver.check() != z3.sat:
                    continue
                model = solver.model()
                value = {str(v): model.eval(v, model_completion=True).as_long()
                         for v in (n, local, sw, e)}
                witnesses.append(Witness(name, index, aligned, value["N"], value["L"],
                                         value["sw"], value["e"]))
    return witnesses


def _tokens(length: int) -> list[int]:
    return [(i * 11 + (i * i) % 7) % 50 for i in range(length)]


def conformance_scenario(w: Witness, bpc: int, eagle: bool) -> Scenario:
    geometry = Geometry((swa(BIG_BS, w.sliding_window, w.extra, eagle=eagle), swa(SMALL_BS, 8)),
                        blocks_per_chunk=bpc)
    big_tpc, small_tpc = BIG_BS * bpc, SMALL_BS * bpc
    prompt = w.hit + 1 + 2 * big_tpc  # keys past N, including an EAGLE peek chunk
    tokens = _tokens(prompt)
    ops: list[Op] = []
    for g, spec in enumerate(geometry.groups):
        tpc = geometry.chunk_tokens(spec)
        for k in range(prompt // tpc):
            # The small group has nothing from N on: no boundary past N is servable.
            if g == 1 and k >= w.hit // small_tpc:
                continue
            ops.append(("install_chunk", tokens, g, k, ChunkState.READY))
    if w.local:
        # A request with the first L tokens leaves exactly L on the GPU (its sample
        # differs from token L, so block L / bs is not a prefix of the consumer). An
        # EAGLE group also needs its peek block: one block more, which it then drops.
        warm = tokens[: w.local + (BIG_BS if eagle else 0)]
        ops += [("add_request", "warm", warm, 1), ("step", 512), ("step", 512), ("drain",)]
    ops += [("add_request", "consumer", tokens, 1), ("step", 1024), ("step", 1024)]
    return Scenario(f"{w} bpc={bpc} eagle={eagle}", geometry, ops)


CASES = [
    (w, bpc, eagle)
    for bpc in (1, 2, 4)
    for w in boundary_classes(bpc)
    for eagle in (False, True)
]


def test_every_boundary_class_has_a_witness() -> None:
    for bpc in (1, 2, 4):
        found = {(w.function, w.aligned) for w in boundary_classes(bpc)}
        assert ("load_window_size_in_chunks", False) in found
        assert ("load_chunk_range", True) in found
        assert any(w.local > 0 for w in boundary_classes(bpc))


@pytest.mark.parametrize(("witness", "bpc", "eagle"), CASES,
                         ids=[f"{w.function}-p{w.path}-{'al' if w.aligned else 'un'}-bpc{b}"
                              f"{'-eagle' if e else ''}" for w, b, e in CASES])
def test_system_conforms_on_boundary_class(witness: Witness, bpc: int, eagle: bool) -> None:
    scenario = conformance_scenario(witness, bpc, eagle)
    lockstep = Lockstep(get_implementation("reference"), scenario, "cpu")
    events: list[Event] = []
    lockstep.systems[1].subscribe(events.append)
    for op in [*scenario.program, ("drain",)]:
        lockstep.apply(op)
    assert lockstep.findings == [], lockstep.findings[:1]
    lookup = next(e for e in events if isinstance(e, LookupEvent) and e.request == "consumer")
    assert (lookup.local_hit, lookup.hit) == (witness.local, witness.hit), lookup
    checks = lockstep.monitors[1].checks
    assert checks["C1"] >= 1 and checks["C2"] >= 1 and checks["C11"] > 0
