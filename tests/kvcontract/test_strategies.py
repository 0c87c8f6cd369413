"""kvcontract.strategies: what they draw is valid (it decodes, replays, and vLLM builds
the geometries), and a few examples find a historic defect."""

from __future__ import annotations

import doctest
import math
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

import kvcontract
from kvcontract import strategies
from kvcontract.errors import UnknownPropertyError
from kvcontract.impl.variants import REFERENCE, VARIANTS
from kvcontract.spec.build import buildable
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.lookup import LookupResult
from kvcontract.spec.properties import CaseProperty, get_property, properties, replay
from kvcontract.spec.properties.lookup import LookupCase
from kvcontract.spec.properties.store import StoreCase
from kvcontract.strategies import (
    geometries,
    lookup_cases,
    lookup_states,
    store_schedules,
    witnesses,
)

FEW = settings(max_examples=15, deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
ROOT = Path(__file__).resolve().parents[2]


@FEW
@given(geometries())
def test_geometries_are_buildable(geometry: Geometry) -> None:
    assert buildable(geometry)[0]
    assert geometry.has_swa
    assert 1 <= len(geometry.groups) <= 3
    assert Geometry.from_dict(geometry.to_dict()) == geometry
    extras = {g.extra_retained_tokens for g in geometry.groups if g.is_swa}
    assert len(extras) == 1


def test_geometries_can_be_unbuildable() -> None:
    found = find(geometries(buildable=False), lambda g: not buildable(g)[0],
                 settings=settings(max_examples=300, database=None, derandomize=True))
    assert not buildable(found)[0]
    with warnings.catch_warnings(), pytest.raises(ValueError, match="max_window"):
        warnings.simplefilter("ignore")
        geometries(max_window=1).example()


@FEW
@given(st.data())
def test_lookup_states_cover_every_chunk(data: st.DataObject) -> None:
    geometry = Geometry((fa(4), swa(2, 5)), blocks_per_chunk=2)
    num_tokens = data.draw(st.integers(0, 40))
    states = data.draw(lookup_states(geometry, num_tokens, retry=True))
    assert [len(row) for row in states] == [num_tokens // 8, num_tokens // 4]
    assert all(isinstance(s, LookupResult) for row in states for s in row)
    plain = data.draw(lookup_states(geometry, num_tokens))
    assert LookupResult.RETRY not in {s for row in plain for s in row}


@FEW
@given(lookup_cases())
def test_lookup_cases_round_trip(case: LookupCase) -> None:
    assert LookupCase.from_json(case.to_json()) == case
    assert case.local_hit <= case.num_tokens
    assert buildable(case.geometry)[0]


@FEW
@given(store_schedules())
def test_store_schedules_are_valid(case: StoreCase) -> None:
    assert StoreCase.from_json(case.to_json()) == case  # the witness codec's checks
    assert all(step > 0 for step in case.steps)
    assert case.start_hit + sum(case.steps) <= case.prompt_len
    if case.ending == "finished":
        assert case.start_hit + sum(case.steps) == case.prompt_len
    assert case.start_hit % math.lcm(*(case.geometry.chunk_tokens(g)
                                       for g in case.geometry.groups)) == 0


HOLDING = ["C1/load-set-exact", "C2/scan-accepts-only-hit", "C2/lookup-loads-only-hit",
           "C3/lookup-defers-only-in-scope", "C7/final-boundary-supplied[none]",
           "C9/store-horizon", "C12/no-lost-hits"]
"""Theorems the reference satisfies on any geometry the strategies draw."""


@pytest.mark.parametrize("theorem_id", HOLDING)
def test_witnesses_replay_on_the_reference(theorem_id: str) -> None:
    prop = get_property(theorem_id)

    @FEW
    @given(witnesses(theorem_id))
    def check(witness: dict[str, object]) -> None:
        assert witness["theorem"] == theorem_id and witness["kind"] == prop.kind
        assert replay(theorem_id, witness, REFERENCE) is None

    check()


def test_every_theorem_has_witnesses() -> None:
    for prop in properties():
        @settings(max_examples=2, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(witnesses(prop.theorem_id))
        def decodes(witness: dict[str, object]) -> None:
            if isinstance(prop, CaseProperty):  # noqa: B023 - run before the next prop
                prop.space.decode(witness)  # noqa: B023
            else:
                assert prop.admissible(prop.decode(witness))  # noqa: B023

        decodes()
    with pytest.raises(UnknownPropertyError):
        witnesses("C2/no-such-theorem")


def test_witnesses_find_the_stale_pending_defect() -> None:
    stale = VARIANTS["stale-pending"]
    found = find(witnesses("C3/scan-defers-only-in-scope"),
                 lambda w: replay("C3/scan-defers-only-in-scope", w, stale) is not None,
                 settings=settings(max_examples=300, database=None, derandomize=True))
    assert replay("C3/scan-defers-only-in-scope", found, REFERENCE) is None
    assert "HIT_PENDING" in found["states"]  # type: ignore[operator]


def test_docstring_examples() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # .example() outside a test is fine in a doctest
        result = doctest.testmod(strategies, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 5 and result.failed == 0


def test_readme_strategies_snippet() -> None:
    text = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    section = text.split("## Hypothesis strategies\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, "<docs/usage.md>", "exec"), namespace)  # not a file linecache reads
    tests = [v for k, v in namespace.items() if k.startswith("test_") and callable(v)]
    assert len(tests) == 2
    for test in tests:
        test()
    assert kvcontract.replay  # the snippet's import
