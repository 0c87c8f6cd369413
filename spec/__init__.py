"""The formal model of the SWA offload coverage contract (docs/CONTRACT.md sections 2-5, 9).

Every formula is written once, with :mod:`kvcontract.spec.arith`, and evaluates both on
Python ints and on Z3 terms.
"""

from kvcontract.spec.clauses import CLAUSES, Clause, clause_ids, get_clause
from kvcontract.spec.geometry import Geometry, GroupKind, GroupSpec, fa, mamba, swa
from kvcontract.spec.lookup import (
    HIT,
    HIT_PENDING,
    MISS,
    RETRY,
    LookupResult,
    load_window_chunks,
    prefix_answer,
    sliding_window_answer,
    window_chunks,
)
from kvcontract.spec.reachability import RequestStatus, block_is_reachable, mask_rule
from kvcontract.spec.retention import (
    load_chunk_range,
    retained_block_range,
    skipped_tokens,
)

__all__ = [
    "CLAUSES",
    "HIT",
    "HIT_PENDING",
    "MISS",
    "RETRY",
    "Clause",
    "Geometry",
    "GroupKind",
    "GroupSpec",
    "LookupResult",
    "RequestStatus",
    "block_is_reachable",
    "clause_ids",
    "fa",
    "get_clause",
    "load_chunk_range",
    "load_window_chunks",
    "mamba",
    "mask_rule",
    "prefix_answer",
    "retained_block_range",
    "skipped_tokens",
    "sliding_window_answer",
    "swa",
    "window_chunks",
]
