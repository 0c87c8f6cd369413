"""The property layer: each clause's theorems, stated once (see :mod:`.base`).

The prover, the exhaustive runner, ``gen-tests``, ``explain``, the audit and the
fuzzer's monitor all use these objects; none of them restates a property. Importable
without Z3: a reproducer replays a property by id with :func:`replay`.
"""

from kvcontract.errors import UnknownPropertyError, WitnessError
from kvcontract.spec.properties.base import (
    CaseProperty,
    CaseSpace,
    Config,
    Env,
    FormulaProperty,
    Picture,
    Property,
)
from kvcontract.spec.properties.catalog import get_property, properties, replay

__all__ = [
    "CaseProperty",
    "CaseSpace",
    "Config",
    "Env",
    "FormulaProperty",
    "Picture",
    "Property",
    "UnknownPropertyError",
    "WitnessError",
    "get_property",
    "properties",
    "replay",
]
