"""The family registry (spec/properties/base.Family): every case space of the catalogue
is one of its members, and every per-family table covers every member."""

from __future__ import annotations

from kvcontract.spec.properties import CaseProperty, properties
from kvcontract.spec.properties.base import OBSERVED_FAMILIES, Family, Observer
from kvcontract.spec.properties.scoped import SCOPED_CASES
from kvcontract.strategies import FAMILY_CASES


def test_every_catalogue_space_is_a_family_member() -> None:
    families = {p.space.family for p in properties() if isinstance(p, CaseProperty)}
    assert families == set(Family)
    assert all(isinstance(f, Family) for f in families)


def test_every_table_covers_every_family() -> None:
    assert set(SCOPED_CASES) == set(Family)
    assert set(FAMILY_CASES) == set(Family)
    assert set(OBSERVED_FAMILIES) == set(Observer)


def test_a_family_keeps_its_plain_name() -> None:
    """Reports and JSON carry the name, not the enum."""
    assert Family.END_TO_END == "end-to-end"
    assert f"{Family.LOOKUP}" == str(Family.LOOKUP) == "lookup"
    assert f"upstream-{Family.END_TO_END}" == "upstream-end-to-end"
    assert {Family.STORE: 1}["store"] == 1
