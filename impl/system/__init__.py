"""The executable offloading system on torch tensors (issue 3).

:mod:`.engine` composes the reference functions of an Implementation into block pools,
per-group GPU managers, the offload scheduler and store jobs; :mod:`.offload` holds the
offload manager state machine (mocked and tensor-backed) and the transfer worker;
:mod:`.oracle` holds the data oracles of C11; :mod:`.events` holds the records the system
emits to its observers. The system judges nothing: :class:`kvcontract.tools.monitor.Monitor`
subscribes to the events and judges them against the spec.
"""

from kvcontract.impl.system.engine import BlockPool, OffloadSystem, SystemConfig
from kvcontract.impl.system.events import (
    AllocationEvent,
    AttentionEvent,
    Event,
    LoadCrashEvent,
    LoadError,
    LoadEvent,
    LookupEvent,
    Observer,
    RestoreEvent,
    StoreEvent,
)
from kvcontract.impl.system.offload import (
    ChunkBook,
    ChunkNotFoundError,
    ChunkNotReadyError,
    ChunkState,
    MockedOffloadManager,
    TensorOffloadManager,
    TransferWorker,
)
from kvcontract.impl.system.oracle import (
    KVLayout,
    attention_window_start,
    expected_kv,
    window_decode_attention,
)

__all__ = [
    "AllocationEvent",
    "AttentionEvent",
    "BlockPool",
    "ChunkBook",
    "ChunkNotFoundError",
    "ChunkNotReadyError",
    "ChunkState",
    "Event",
    "KVLayout",
    "LoadCrashEvent",
    "LoadError",
    "LoadEvent",
    "LookupEvent",
    "MockedOffloadManager",
    "Observer",
    "OffloadSystem",
    "RestoreEvent",
    "StoreEvent",
    "SystemConfig",
    "TensorOffloadManager",
    "TransferWorker",
    "attention_window_start",
    "expected_kv",
    "window_decode_attention",
]
