"""What vLLM 0.34.0 fixed (issue 27): the lookup's first candidate under a scheduling
budget (C4/lookup-cap-exact, variant ``minus-one-after-clamps``) and the store horizon of
a request finished with an error before its prefill completed (C10, C14, variant
``full-horizon-unfinished-prefill``)."""

from __future__ import annotations

import pytest

from kvcontract.impl.scheduler import lookup_complete_chunks
from kvcontract.impl.system.lifecycle import run_program
from kvcontract.impl.variants import REFERENCE, get_implementation
from kvcontract.proofs.theorem import prove_formula
from kvcontract.spec import multigroup
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lookup import LookupResult
from kvcontract.spec.properties import lifecycle as lc
from kvcontract.spec.properties.catalog import get_property
from kvcontract.spec.reachability import stored_token_count
from kvcontract.vocabulary import RequestStatus, Verdict

CAP = "C4/lookup-cap-exact"
CLAMPS = get_implementation("minus-one-after-clamps")
FULL_HORIZON = get_implementation("full-horizon-unfinished-prefill")
SWA = Geometry((swa(4, 8),))


def test_spec_cap_subtracts_before_the_budget() -> None:
    assert multigroup.lookup_cap(SWA, 17, None) == 16
    assert multigroup.lookup_cap(SWA, 17, 12) == 12  # the budget is not lowered again
    assert multigroup.lookup_cap(SWA, 17, 20) == 16
    assert multigroup.lookup_cap(Geometry((fa(4),)), 17, None) == 17


def test_cap_theorem_proved_on_reference_refuted_on_clamps() -> None:
    prop = get_property(CAP)
    proved = prove_formula(prop, REFERENCE)
    assert proved.verdict is Verdict.PROVED
    refuted = prove_formula(prop, CLAMPS)
    assert refuted.verdict is Verdict.COUNTEREXAMPLE
    assert refuted.witness is not None
    values = refuted.witness["values"]
    # Only a window (r) with a budget (k) below the request shows it.
    assert values["r"] == 1 and values["k"] == 1 and values["B"] < values["N"]
    assert prop.replay(refuted.witness, CLAMPS)
    assert prop.replay(refuted.witness, REFERENCE) is None


def test_cap_picture_names_both_candidates() -> None:
    picture = get_property(CAP).draw(
        {"kind": "arith", "theorem": CAP, "values": {"r": 1, "k": 1, "N": 17, "B": 12}},
        CLAMPS)
    assert "the spec's first candidate is 12, the implementation's 11" in picture.notes[0]


@pytest.mark.parametrize(("impl", "hit"), [(REFERENCE, 12), (CLAMPS, 11)])
def test_issue_example_budget_twelve(impl: object, hit: int) -> None:
    """SWA block 4, sw 8, 17 tokens, every chunk HIT, a budget of 12 tokens."""
    outcome = lookup_complete_chunks(impl, SWA, 17, 0, lambda g, k: LookupResult.HIT,
                                     max_hit_tokens=12)  # type: ignore[arg-type]
    assert outcome.hit_tokens == hit
    assert outcome.max_hit_trace[0] == hit


def test_error_finish_horizon_is_the_computed_tokens() -> None:
    # Finished with an error after 8 of 17 prompt tokens, nothing sampled.
    args = ("finished", 8, 0, 17, 17, None, True)
    assert REFERENCE.get_num_offloadable_tokens(*args) == 8
    assert FULL_HORIZON.get_num_offloadable_tokens(*args) == 17
    assert stored_token_count(RequestStatus.FINISHED, 8, 0, 17, 17) == 8
    # A request that finished by sampling keeps its horizon: all but the final slot.
    assert REFERENCE.get_num_offloadable_tokens("finished", 20, 0, 21, 17, None, False) == 20


def _seed(label: str) -> list[lc.LifecycleCase]:
    return [case for case in lc.lifecycle_cases(depth=0) if case.label == label]


def test_error_mid_prefill_seed() -> None:
    cases = _seed("error-mid-prefill")
    assert len(cases) == len(lc.lifecycle_geometries())
    for case in cases:
        clean = run_program(case.geometry, REFERENCE, case.program(), case.config())
        assert not any(lc.judge_trace(clean, case.geometry).values())
        assert any(o.status == "finished" and o.num_computed < case.config().prompt_len
                   for o in clean.offers)  # the error finish reached the store path
        bad = run_program(case.geometry, FULL_HORIZON, case.program(), case.config())
        found = lc.judge_trace(bad, case.geometry)
        assert found["C14/ended-store-horizon"]
        assert "8 tokens computed" in str(found["C14/ended-store-horizon"][0])


def test_error_finish_of_a_waiting_request_is_ignored() -> None:
    geometry = lc.lifecycle_geometries()[0][1]
    trace = run_program(geometry, REFERENCE, ["add p", "error p", "step"])
    assert not any(lc.judge_trace(trace, geometry).values())
    # It ran on and finished by sampling, its whole prompt computed.
    finished = [o for o in trace.offers if o.status == "finished"]
    assert finished and all(o.num_computed > 17 for o in finished)
