"""kvcontract: the KV-cache offloading contract of sliding-window attention, proved.

Subpackages (see ARCHITECTURE.md):

* :mod:`kvcontract.spec`   - the formal model, evaluable on Python ints and on Z3 terms;
* :mod:`kvcontract.impl`   - the operational reference implementation and its variants;
* :mod:`kvcontract.proofs` - theorems, the solver driver and the verdicts;
* :mod:`kvcontract.tools`  - the command line and reports.
"""

from kvcontract.errors import (
    GeometryError,
    KvContractError,
    ProofError,
    UnknownClauseError,
    UnknownTargetError,
    UsageError,
)

__version__ = "0.1.0"

__all__ = [
    "GeometryError",
    "KvContractError",
    "ProofError",
    "UnknownClauseError",
    "UnknownTargetError",
    "UsageError",
    "__version__",
]
