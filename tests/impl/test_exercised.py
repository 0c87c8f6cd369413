"""Every function of the implementation under test is exercised by some property.

A function that no property runs can be broken without any verdict changing (issue
13: ``group_first_live_block`` was used by no theorem). The properties are run on a few
cases each (formula properties on one admissible witness, case properties on the first
cases of their space and on the cases that touch each group kind), and every function
defined in ``impl/reference.py`` and ``impl/scheduler.py`` must have been called.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from kvcontract.impl import reference, scheduler
from kvcontract.impl.variants import REFERENCE
from kvcontract.spec.lookup import LookupResult
from kvcontract.spec.properties import CaseProperty, FormulaProperty, properties
from kvcontract.spec.properties.lookup import LookupCase

MODULES = (reference, scheduler)
UNEXERCISED_BY_DESIGN: dict[str, str] = {}
"""Functions no property needs to run, and why (empty: every function is exercised)."""


def _defined(module: Any) -> set[str]:
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
    return names


def _witness_values(prop: FormulaProperty) -> dict[str, int] | None:
    """A small admissible assignment of the property's variables, if one is found."""
    for config in prop.configs()[:3]:
        for values in itertools.product(range(0, 7), repeat=len(prop.variables)):
            candidate = {**config.values, **dict(zip(prop.variables, values, strict=True))}
            if prop.admissible(candidate):
                return candidate
    return None


def test_every_implementation_function_is_exercised() -> None:
    files = {inspect.getfile(m) for m in MODULES}
    called: set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename in files:
            called.add(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        for prop in properties():
            if isinstance(prop, FormulaProperty):
                values = _witness_values(prop)
                if values is not None:
                    prop.violation(values, REFERENCE)
        spaces: dict[int, list[CaseProperty]] = {}
        for prop in properties():
            if isinstance(prop, CaseProperty):
                spaces.setdefault(id(prop.space), []).append(prop)
        for family in spaces.values():
            seen_geometries: set[tuple[str, str]] = set()
            for case in family[0].space.cases():
                # per geometry, and per consumer kind of the end-to-end family (a
                # junction consumer runs the junction's decision)
                consumer = getattr(case, "consumer", None)
                name = (getattr(case, "geometry_name", "scan"),
                        getattr(consumer, "kind", ""))
                if name in seen_geometries:
                    continue
                seen_geometries.add(name)
                samples = [case]
                if isinstance(case, LookupCase):  # all ready, and all pending
                    samples += [
                        dataclasses.replace(case, states=tuple(
                            tuple(state for _ in row) for row in case.states))
                        for state in (LookupResult.HIT, LookupResult.HIT_PENDING)
                    ]
                for sample in samples:
                    for prop in family:
                        prop.check(sample, REFERENCE)
    finally:
        sys.setprofile(None)
    defined = set().union(*(_defined(m) for m in MODULES))
    missing = sorted(defined - called - set(UNEXERCISED_BY_DESIGN) - {"<lambda>"})
    assert not missing, f"functions no property exercises: {missing}"
