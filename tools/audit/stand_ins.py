"""The stand-ins for upstream's collaborators, and the namespace upstream code runs in.

Each upstream function is compiled on its own (:mod:`.binding`) in :func:`_namespace`:
small stand-ins named like upstream's (the KV-cache spec classes, ``RequestStatus``, the
transfer records, ``cdiv``/``round_down``, a logger) and an ``assert`` that ends a
symbolic path instead of failing it (:func:`_kvc_assert`). The parts of the fake ``self``
the adapters, upstream's loop and its store path share (:class:`GroupConfig`, a manager,
an events tracker, the ``SlidingWindowManager`` class of :func:`_manager_class`) are here
too: its own module below the three that build calls out of them.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvcontract.spec import symbolic
from kvcontract.tools.audit.roles import SWM_CLS, Binding
from kvcontract.vocabulary import LookupResult


def cdiv(a: Any, b: Any) -> Any:
    """``ceil(a / b)`` for b > 0, written so Z3's Euclidean division agrees with it."""
    return -(-a // b)


def round_down(x: Any, multiple: Any) -> Any:
    return (x // multiple) * multiple


class KVCacheSpec:
    """Stand-in base of upstream's spec classes (only ``isinstance`` is used)."""


@dataclass
class FullAttentionSpec(KVCacheSpec):
    block_size: Any = 16


@dataclass
class SlidingWindowSpec(KVCacheSpec):
    block_size: Any = 16
    sliding_window: Any = 0
    extra_retained_tokens: Any = 0


@dataclass
class ChunkedLocalAttentionSpec(KVCacheSpec):
    block_size: Any = 16
    attention_chunk_size: Any = 0


@dataclass
class MambaSpec(KVCacheSpec):
    block_size: Any = 16
    mamba_cache_mode: str = "align"
    """Offloading needs prefix caching, and Mamba prefix caching needs ``align`` mode
    (``MambaManager.__init__``, vLLM 0.30-0.33)."""


class UpstreamRequestStatus(enum.IntEnum):
    """Stand-in of ``vllm.v1.request.RequestStatus`` (the store path compares a request's
    status with ``FINISHED_ABORTED`` and asks ``is_finished``: every status past
    ``PREEMPTED`` is a finished one)."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: UpstreamRequestStatus) -> bool:
        return status > UpstreamRequestStatus.PREEMPTED


class _Record:
    """A plain record of what upstream builds (transfer jobs, block specs): the store
    path only creates them and reads back the fields it set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.__dict__.update(kwargs)


class GPULoadStoreSpec(_Record):
    """Stand-in of the GPU side of a transfer (block ids, group sizes, block indices)."""


class TransferJob(_Record):
    """Stand-in of a transfer job (request, source and destination specs)."""


class TransferJobStatus(_Record):
    """Stand-in of the scheduler's record of a transfer job."""

    is_store = False
    is_sync_load = False
    deferred_fence_block_ids: Any = None
    fenced_block_ids: Any = None


class ConnectorMetricName(enum.Enum):
    """Stand-in of the connector's metric names (an allocation failure is counted)."""

    ALLOCATION_FAILURE = "allocation_failure"


def spec_stand_in(geometry: Any, group: Any) -> KVCacheSpec:
    """The stand-in KV-cache spec upstream's code reads for one group of ``geometry``
    (its block size in tokens; a sliding window with its ``e``; Mamba in align mode)."""
    from kvcontract.vocabulary import GroupKind

    bs = geometry.block_tokens(group)
    if group.kind is GroupKind.SLIDING_WINDOW:
        return SlidingWindowSpec(block_size=bs, sliding_window=group.sliding_window,
                                 extra_retained_tokens=group.extra_retained_tokens)
    if group.kind is GroupKind.MAMBA:
        return MambaSpec(block_size=bs)
    return FullAttentionSpec(block_size=bs)


class _AssertFailed(AssertionError):
    pass


def _kvc_assert(condition: Any, message: Any = None) -> None:
    """Replacement of upstream ``assert`` statements.

    On concrete values it raises like ``assert``. During symbolic execution a failing
    assertion ends the path instead (its condition is one of upstream's stated
    preconditions, e.g. ``sliding_window > 0``, which every theorem's hypotheses
    imply); concrete replays and the grids still execute every assertion for real.
    """
    if symbolic._current:
        if not condition:
            raise symbolic._Fork()
        return
    if not condition:
        raise _AssertFailed(message if message is not None else "assertion failed")


def _namespace() -> dict[str, Any]:
    from collections.abc import Iterable, Mapping
    from typing import ClassVar

    return {
        "__name__": "kvcontract_audit_upstream",
        "__builtins__": __builtins__,
        "LookupResult": LookupResult,
        "cdiv": cdiv,
        "round_down": round_down,
        "KVCacheSpec": KVCacheSpec,
        "AttentionSpec": KVCacheSpec,
        "FullAttentionSpec": FullAttentionSpec,
        "SlidingWindowSpec": SlidingWindowSpec,
        "ChunkedLocalAttentionSpec": ChunkedLocalAttentionSpec,
        "MambaSpec": MambaSpec,
        "replace": dataclasses.replace,
        "chain": itertools.chain,
        "islice": itertools.islice,
        "RequestStatus": UpstreamRequestStatus,
        "GPULoadStoreSpec": GPULoadStoreSpec,
        "TransferJob": TransferJob,
        "TransferJobStatus": TransferJobStatus,
        "_ConnectorMetricName": ConnectorMetricName,
        "logger": logging.getLogger("kvcontract.audit.upstream"),
        "Sequence": Sequence,
        "Iterable": Iterable,
        "Mapping": Mapping,
        "ClassVar": ClassVar,
        "Any": Any,
        "__kvc_assert__": _kvc_assert,
    }


class _Manager:
    def __init__(self, lookup: Callable[[int], LookupResult]) -> None:
        self._lookup = lookup
        self.calls = 0

    def lookup(self, key: Any, req_context: Any = None) -> LookupResult:
        self.calls += 1
        result = self._lookup(key)
        return result


class _EventsTracker:
    def record_lookup(self, *args: Any, **kwargs: Any) -> None:
        return None

    def record_store(self, *args: Any, **kwargs: Any) -> None:
        return None


class GroupConfig:
    """Stand-in for upstream's ``GroupOffloadConfig`` (attributes the bodies read)."""

    def __init__(self, **fields: Any) -> None:
        self.group_idx = 0
        self.tokens_per_block = 16
        self.tokens_per_chunk = 16
        self.hashes_per_chunk = 1
        self.sliding_window_size_in_chunks: Any = None
        self.kv_cache_spec: Any = None
        self.manager_cls: Any = None
        self.requires_cow_source = False
        self.alignment_chunk_count: Any = None
        self.is_eagle_group = False
        for key, value in fields.items():
            setattr(self, key, value)


def _assumed_contiguous_blocks(cls: Any, window_size: Any, block_size: Any,
                               use_eagle: bool) -> Any:
    """Upstream's blocks-per-hit rule, used where ``_contiguous_blocks_for_hit`` is absent."""
    return cdiv(window_size - 1, block_size) + (1 if use_eagle else 0)


def _manager_class(binding: Binding) -> Any:
    """A ``SlidingWindowManager`` stand-in class carrying the bound block mask and
    contiguous-blocks rule (the assumed rule, recorded as derived, when that is absent);
    None without a block mask."""
    f = binding.functions
    if "block_mask" not in f:
        return None
    contiguous = f.get("contiguous_blocks")
    if contiguous is None:
        contiguous = _assumed_contiguous_blocks
        binding.roles["contiguous_blocks"].status = "derived"
        binding.roles["contiguous_blocks"].note = "absent; cdiv(window - 1, block) + eagle assumed"
    return type(SWM_CLS, (), {
        "reachable_block_mask": classmethod(f["block_mask"]),
        "_contiguous_blocks_for_hit": classmethod(contiguous),
    })
