"""The executable offloading system on torch tensors (issue 3).

:mod:`.engine` composes the reference functions of an Implementation into block pools,
per-group GPU managers, the offload scheduler and store jobs; :mod:`.offload` holds the
offload manager state machine (mocked and tensor-backed) and the transfer worker;
:mod:`.oracle` holds the data oracles of C11.
"""

from kvcontract.impl.system.engine import OffloadSystem, SystemConfig, Violation
from kvcontract.impl.system.offload import (
    ChunkBook,
    ChunkNotFoundError,
    ChunkNotReadyError,
    ChunkState,
    MockedOffloadManager,
    TensorOffloadManager,
    TransferWorker,
)
from kvcontract.impl.system.oracle import KVLayout, expected_kv, window_decode_attention

__all__ = [
    "ChunkBook",
    "ChunkNotFoundError",
    "ChunkNotReadyError",
    "ChunkState",
    "KVLayout",
    "MockedOffloadManager",
    "OffloadSystem",
    "SystemConfig",
    "TensorOffloadManager",
    "TransferWorker",
    "Violation",
    "expected_kv",
    "window_decode_attention",
]
