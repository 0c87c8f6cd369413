"""The proof engine's speed devices are sound: each is checked against the plain form.

* the decision-tree lift equals the chain of whole path conditions it replaced;
* a lift generalized over concrete sizes equals the lift for those sizes;
* a family checked in shards finds the same first counterexample as one pass;
* the boundary-residue case split covers every boundary index exactly once.
"""

from __future__ import annotations

import math

import pytest
import z3

from kvcontract.impl import get_implementation
from kvcontract.impl.reference import is_block_reachable, load_chunk_range
from kvcontract.proofs.theorem import SymbolicEnv, finish_family, run_family, run_property
from kvcontract.proofs.verdicts import Verdict
from kvcontract.spec.properties import CaseProperty, get_property, properties
from kvcontract.spec.properties.domains import mask_configs
from kvcontract.spec.properties.formulas import _boundary_residues, _segment_tokens
from kvcontract.spec.symbolic import PathExplorer


def _equivalent(a: z3.ExprRef, b: z3.ExprRef) -> bool:
    solver = z3.Solver()
    solver.add(a != b)
    return solver.check() == z3.unsat


def _chain(explorer: PathExplorer, fn: object, args: list[object]) -> z3.ExprRef:
    paths = explorer.paths(fn, args)  # type: ignore[arg-type]
    merged = paths[-1][1]
    for cond, value in reversed(paths[:-1]):
        merged = z3.If(cond, value, merged)
    return merged  # type: ignore[no-any-return]


def test_tree_lift_equals_path_chain() -> None:
    hit, local, sw, e = z3.Ints("hit local sw e")
    args: list[object] = [hit, local, 4, 2, sw, e]
    tree = PathExplorer().lift(load_chunk_range, args)
    chain_lo = _chain(PathExplorer(), lambda *a: load_chunk_range(*a)[0], args)
    chain_hi = _chain(PathExplorer(), lambda *a: load_chunk_range(*a)[1], args)
    assert _equivalent(tree[0], chain_lo)
    assert _equivalent(tree[1], chain_hi)


@pytest.mark.parametrize(
    ("align", "block", "retention"), [(2112, 64, None), (64, 16, 128), (36, 4, 0)]
)
def test_generalized_lift_equals_concrete_lift(
    align: int, block: int, retention: int | None
) -> None:
    block_index, sw, e, final = z3.Ints("i sw e F")
    env = SymbolicEnv({"i": block_index})
    args = (block_index, align, block, sw, e, False, retention, final, (final - 3,))
    general = env.call(is_block_reachable, *args, generalize=(1, 2))
    concrete = env.call(is_block_reachable, *args)
    domain = z3.And(sw >= 2, e >= 0, block_index >= 0, final >= 0)
    solver = z3.Solver()
    solver.add(domain, general != concrete)
    assert solver.check() == z3.unsat


def test_sharded_family_finds_the_same_first_counterexample() -> None:
    scan_family = [t for t in properties() if isinstance(t, CaseProperty) and t.family == "scan"]
    impl = get_implementation("stale-pending")
    whole = finish_family(scan_family, [run_family(scan_family, impl)])
    sharded = finish_family(scan_family, [run_family(scan_family, impl, s, 3) for s in range(3)])
    assert [r.verdict for r in whole] == [r.verdict for r in sharded]
    assert [r.witness for r in whole] == [r.witness for r in sharded]
    assert Verdict.COUNTEREXAMPLE in {r.verdict for r in whole}
    reference = finish_family(
        scan_family,
        [run_family(scan_family, get_implementation("reference"), s, 2) for s in range(2)],
    )
    assert all(r.verdict is Verdict.PROVED_FOR_DOMAIN for r in reference)
    assert reference[0].queries == 32760  # every case, over both shards


def test_boundary_residues_cover_every_index() -> None:
    configs = mask_configs(False, "none")
    split = _boundary_residues(configs, _segment_tokens)
    by_base: dict[str, list[int]] = {}
    for config in split:
        base = config.label.rsplit(", index", 1)[0]
        values = config.values
        tpc = values["B"] * values["bpc"]
        assert values["L"] == tpc // math.gcd(values["A"], tpc)
        by_base.setdefault(base, []).append(values["j"])
    assert len(by_base) == len(configs)
    for residues in by_base.values():
        assert sorted(residues) == list(range(len(residues)))
    assert max(len(r) for r in by_base.values()) > 1  # the split is exercised


def test_store_economy_catches_prefill_horizon() -> None:
    theorem = get_property("C8/stores-only-demanded")
    assert run_property(theorem, get_implementation("prefill-horizon")).verdict is \
        Verdict.COUNTEREXAMPLE
    assert run_property(theorem, get_implementation("reference")).verdict is \
        Verdict.PROVED_FOR_DOMAIN


def test_budget_used_is_reported() -> None:
    result = run_property(get_property("C4/window-exact"), get_implementation("reference"))
    assert result.verdict.passed
    assert result.rlimit_used > 0  # Z3's deterministic resource count reaches the report


def test_every_theorem_names_the_functions_it_exercises() -> None:
    from dataclasses import fields

    from kvcontract.impl.bundle import Implementation
    from kvcontract.proofs.runner import catalog
    from kvcontract.proofs.uses import THEOREM_FUNCTIONS

    bundle = {f.name for f in fields(Implementation)}
    names = {t.name.split("[", 1)[0] for t in catalog()}
    spec_only = {"spec-scan-hit-only", "spec-scan-pending-scope", "spec-scan-rightmost",
                 "spec-scan-fold-is-declarative", "spec-prefix-fold-is-declarative"}
    assert names - spec_only <= set(THEOREM_FUNCTIONS)
    assert all(set(used) <= bundle for used in THEOREM_FUNCTIONS.values())
