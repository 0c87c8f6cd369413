"""Latent grading: a counterexample on a geometry vLLM does not build is ``latent``, and the
search goes on for one vLLM builds (docs/CONTRACT.md 11, "Latent findings")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcontract.impl import get_implementation
from kvcontract.proofs.theorem import finish_family, prove_formula, run_family
from kvcontract.proofs.verdicts import Verdict
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.properties import CaseProperty, get_property
from kvcontract.spec.properties.base import (
    CaseSpace,
    Config,
    Env,
    FormulaProperty,
    latent_reason,
)
from kvcontract.spec.properties.formulas import mask_geometry
from kvcontract.vocabulary import DEFAULT_FAIL_ON, Impact, finding_exit_code

REFERENCE = get_implementation("reference")
UNBUILDABLE = Geometry((fa(10), swa(4, 5)))
"""FA block 10 is not a multiple of the SWA block 4: no page unification yields it."""
BUILDABLE = Geometry((fa(4), swa(8, 12)))


def test_buildability_of_the_two_geometries() -> None:
    assert latent_reason(BUILDABLE) is None
    reason = latent_reason(UNBUILDABLE)
    assert reason is not None and "not an integer multiple" in reason
    assert latent_reason(None) is None


def _space(geometries: list[Geometry]) -> CaseSpace[Any, Any]:
    return CaseSpace(
        family="latent-test", cases=lambda: iter(geometries), describe=lambda: "two",
        to_json=lambda g: {"geometry": g.to_dict()},
        from_json=lambda data: Geometry.from_dict(dict(data["geometry"])),
        observe=lambda case, impl: None, geometry_of=lambda case: case,
    )


def _always_violated(space: CaseSpace[Any, Any]) -> CaseProperty:
    return CaseProperty("C2", "always", "every case fails", space,
                        judge=lambda case, observation: "violated", uses=())


def test_family_prefers_a_buildable_witness_found_later() -> None:
    prop = _always_violated(_space([UNBUILDABLE, BUILDABLE]))
    [result] = finish_family([prop], [run_family([prop], REFERENCE)])
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.impact == Impact.CRASH.value  # C2's own impact, not latent
    assert result.latent is None
    assert result.witness is not None
    assert Geometry.from_dict(result.witness["geometry"]) == BUILDABLE


def test_family_with_only_latent_witnesses_is_latent_and_passes_by_default() -> None:
    prop = _always_violated(_space([UNBUILDABLE]))
    [result] = finish_family([prop], [run_family([prop], REFERENCE)])
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.impact == Impact.LATENT.value
    assert result.latent is not None and "not an integer multiple" in result.latent
    assert "would be crash" in result.message
    findings = [(result.verdict, result.impact)]
    assert finding_exit_code(findings, DEFAULT_FAIL_ON) == 0
    assert finding_exit_code(findings, frozenset({Impact.LATENT})) == 1


def test_shards_keep_the_buildable_witness() -> None:
    prop = _always_violated(_space([UNBUILDABLE, UNBUILDABLE, BUILDABLE]))
    shards = [run_family([prop], REFERENCE, shard, 2) for shard in range(2)]
    [result] = finish_family([prop], shards)
    assert result.latent is None and result.impact == Impact.CRASH.value


def _false_statement(env: Env, impl: Any) -> tuple[list[Any], Any]:
    del impl
    return [env["x"] >= 0], env["x"] < 0


def _formula(labels: list[tuple[str, Geometry]]) -> FormulaProperty:
    by_label = dict(labels)

    def geometry(values: Mapping[str, int]) -> Geometry:
        return by_label[list(by_label)[values["which"]]]

    return FormulaProperty(
        "C7", "false", "never holds", ("x",), _false_statement,
        lambda: [Config(label, {"which": i}) for i, (label, _) in enumerate(labels)],
        "two geometries", uses=(), geometry=geometry,
    )


def test_formula_case_split_goes_on_past_a_latent_witness() -> None:
    result = prove_formula(_formula([("odd", UNBUILDABLE), ("real", BUILDABLE)]), REFERENCE)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.latent is None and result.domain == "real"


def test_formula_with_only_latent_witnesses_is_latent() -> None:
    result = prove_formula(_formula([("odd", UNBUILDABLE)]), REFERENCE)
    assert result.verdict is Verdict.COUNTEREXAMPLE
    assert result.impact == Impact.LATENT.value and result.latent is not None


def test_the_mask_properties_grade_their_witnesses() -> None:
    """The C7/C8 mask properties describe a FA + SWA geometry: FA bs 528 with SWA bs 32
    (the segment-form witness of the EAGLE peek chunk) is latent, FA 4 + SWA 8 is not."""
    prop = get_property("C7/segment-boundaries-supplied[eagle-none]")
    assert isinstance(prop, FormulaProperty) and prop.geometry is mask_geometry
    latent = {"A": 1056, "B": 32, "bpc": 2, "eagle": 1, "R": -1, "sw": 2, "e": 0}
    real = {"A": 8, "B": 8, "bpc": 2, "eagle": 1, "R": 0, "sw": 2, "e": 0}
    assert prop.grade(latent, "x").impact is Impact.LATENT
    assert prop.grade(real, "x").latent is None
