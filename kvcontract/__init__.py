"""kvcontract: the KV-cache offloading contract of sliding-window attention, proved.

The public Python API (:mod:`kvcontract.api`) is re-exported here, imported on first
use, so ``import kvcontract`` loads neither Z3 nor torch::

    import kvcontract

    report = kvcontract.prove("reference", clauses=["C2"])
    kvcontract.assert_contract("module:my_patch.py", clauses=["C4"])

Subpackages (see ARCHITECTURE.md):

* :mod:`kvcontract.spec`   - the formal model, evaluable on Python ints and on Z3 terms;
* :mod:`kvcontract.impl`   - the operational reference implementation and its variants;
* :mod:`kvcontract.proofs` - theorems, the solver driver and the verdicts;
* :mod:`kvcontract.tools`  - the command line and reports;
* :mod:`kvcontract.strategies` - Hypothesis strategies for users' own tests;
* :mod:`kvcontract.pytest_plugin` - the pytest plugin (``--kvcontract-impl``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvcontract.errors import (
    GeometryError,
    InputFileError,
    KvContractError,
    ProofError,
    UnknownClauseError,
    UnknownPropertyError,
    UnknownTargetError,
    UsageError,
    WitnessError,
)

if TYPE_CHECKING:
    from kvcontract.api import (
        ContractViolation,
        FuzzReport,
        Geometry,
        Impact,
        Implementation,
        ProveReport,
        TheoremResult,
        Verdict,
        assert_contract,
        audit,
        fuzz,
        implementation_names,
        load_implementation,
        prove,
        register_implementation,
        replay,
        replay_audit,
        replay_fuzz,
    )

from kvcontract.vocabulary import VERSION as __version__

__all__ = [  # noqa: RUF022 - the API names first, then the errors
    "ContractViolation",
    "FuzzReport",
    "Geometry",
    "Impact",
    "Implementation",
    "ProveReport",
    "TheoremResult",
    "Verdict",
    "assert_contract",
    "audit",
    "fuzz",
    "implementation_names",
    "load_implementation",
    "prove",
    "register_implementation",
    "replay",
    "replay_audit",
    "replay_fuzz",
    "GeometryError",
    "InputFileError",
    "KvContractError",
    "ProofError",
    "UnknownClauseError",
    "UnknownPropertyError",
    "UnknownTargetError",
    "UsageError",
    "WitnessError",
    "__version__",
]

_API = frozenset(__all__) - {*(e.__name__ for e in (
    GeometryError, InputFileError, KvContractError, ProofError, UnknownClauseError,
    UnknownPropertyError, UnknownTargetError, UsageError, WitnessError)), "__version__"}
"""Names served from :mod:`kvcontract.api` on first access (the rest of ``__all__`` is
imported above)."""


def __getattr__(name: str) -> Any:
    if name in _API:
        from kvcontract import api

        return getattr(api, name)
    raise AttributeError(f"module 'kvcontract' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
