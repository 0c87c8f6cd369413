"""The audit's default budget exhausts every case family of the catalogue, so a ten
times larger budget cannot find more there (issue 9: findings do not depend on it)."""

from __future__ import annotations

import pytest

from kvcontract.spec.properties import CaseProperty, properties
from kvcontract.tools.audit.engine import AuditOptions


@pytest.mark.parametrize("family", sorted({p.family for p in properties()
                                            if isinstance(p, CaseProperty)}))
def test_default_budget_exhausts_the_family(family: str) -> None:
    space = next(p.space for p in properties()
                 if isinstance(p, CaseProperty) and p.family == family)
    count = sum(1 for _ in space.cases())
    assert 0 < count <= AuditOptions().budget, (family, count)
