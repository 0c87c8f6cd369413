"""A small complete offloading system on real tensors, built from an Implementation.

Contract: every decision is made by the functions of the given
:class:`~kvcontract.impl.bundle.Implementation` (retention, load ranges, windows,
scanners through :func:`kvcontract.impl.scheduler.lookup_complete_chunks`, store jobs
through :class:`kvcontract.impl.scheduler.StoreTracker`, which uses the variant's store
mask and final-segment horizon, unless ``SystemConfig.store_path`` plugs in another);
this module holds only bookkeeping and bytes, so a
variant's defect shows up here exactly as it would in the serving code. The system does
not judge itself: it imports no formula of :mod:`kvcontract.spec` (only the geometry
and the vocabulary) and reports each decision as an event of :mod:`.events` to the
observers given to :meth:`OffloadSystem.subscribe`, in decision order:

* :class:`~.events.LookupEvent`: the chunk states and loading chunks the lookup saw, the
  local GPU hit ``L``, the accepted hit and the load ranges, and the shared-prefix
  junction the request registered with the hit (docs/CONTRACT.md 9.3:
  ``impl.shared_prefix_junction``, handed to its store paths, see
  :meth:`OffloadSystem._junction`);
* :class:`~.events.LoadEvent` / :class:`~.events.LoadCrashEvent`: the manager accepted
  the load of an external hit, or refused it ("not found"/"not ready");
* :class:`~.events.AllocationEvent`: which blocks of a group's table are live after a hit;
* :class:`~.events.StoreEvent`: one group's store step (the tracker before and after,
  the chunks offered, the manager's answer, the junction its mask was handed);
* :class:`~.events.RestoreEvent` / :class:`~.events.AttentionEvent` (tensor-backed
  only): the restored bytes and a decode step of window attention over them, compared
  with the data oracles of :mod:`.oracle` (the comparison is data movement; the event
  carries its outcome).

The judge is :class:`kvcontract.tools.monitor.Monitor`; the test fixtures (installing
chunk states, eviction pressure, store failures) are
:class:`kvcontract.tools.harness.SystemHarness`, which uses the small public hooks
here (:meth:`OffloadSystem.chunk_key`, :meth:`OffloadSystem.chunk_keys_for`,
:meth:`OffloadSystem.local_hit_for`, :meth:`OffloadSystem.hold_loading`,
:meth:`OffloadSystem.inject_store_failure`, :meth:`BlockPool.evict_free`).

GPU prefix cache (per group, :class:`BlockPool`): a full block computed by any request
stays cached under its chained prefix hash until its slot is reallocated (LRU among
free blocks). A local hit ``L`` (a multiple of every group's block size) needs, per
group, every block of the retained range at ``L`` cached: all blocks for full
attention, ``Ret(L)`` for a sliding window (the out-of-window blocks were freed), the
chunk holding the state for Mamba, plus the block after ``L`` for an EAGLE group (the
peek, then dropped). The offload lookup then runs from ``L`` and loads ``Load(N, L)``.

Step order (docs/CONTRACT.md 7): submit the previous step's store jobs, poll completions and
acknowledge them, schedule waiting requests (local hit, lookup, allocate, load), run the
forward pass of running requests (allocation frees out-of-window blocks first), build
this step's store jobs.
"""

from __future__ import annotations

import enum
import math
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from kvcontract.errors import GeometryError, UsageError
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.reference import NO_BOUND, NO_DEFERRAL, ready_after_deadline
from kvcontract.impl.scheduler import (
    LookupOutcome,
    StoreTracker,
    group_first_live_block,
    lookup_complete_chunks,
    store_job_placement,
)
from kvcontract.impl.system.events import (
    AllocationEvent,
    AttentionEvent,
    DecisionEvent,
    DeferralEvent,
    Event,
    LifecycleEvent,
    LifecycleObserver,
    LoadCrashEvent,
    LoadError,
    LoadEvent,
    LookupEvent,
    Observer,
    RecoveryEvent,
    RestoreEvent,
    StateEvent,
    StoreEvent,
    StoreOfferEvent,
    TransferEvent,
)
from kvcontract.impl.system.offload import (
    ChunkKey,
    ChunkNotFoundError,
    ChunkNotReadyError,
    MockedOffloadManager,
    TensorOffloadManager,
    TransferJob,
    TransferWorker,
)
from kvcontract.impl.system.oracle import (
    KVLayout,
    attention_window_start,
    expected_kv,
    expected_query,
    window_decode_attention,
)
from kvcontract.spec.geometry import Geometry, GroupSpec
from kvcontract.spec.lifecycle import (
    DEFAULT_DEFERRAL_BOUND,
    DeferCause,
    JobEvent,
    JobKind,
    RequestState,
    StaleReason,
)
from kvcontract.vocabulary import GroupKind, LookupResult, RequestStatus

NULL_BLOCK = 0
"""Block id 0 of every pool is the null block: freed (out-of-window) table entries."""


class GroupStorePath(Protocol):
    """One request's store path for one group, as the system drives it: what
    :class:`~kvcontract.impl.scheduler.StoreTracker` provides (the default). A path
    built before the request's lookup learns the request's shared-prefix junction only
    if it is also a :class:`JunctionStorePath` (StoreTracker is)."""

    @property
    def offered(self) -> AbstractSet[int]: ...

    @property
    def next_stored_chunk_idx(self) -> int: ...

    def step(self, status: RequestStatus | str, num_computed: int, num_scheduled: int,
             num_tokens: int) -> list[int]: ...

    def mark_computed(self, num_chunks: int) -> None: ...


@runtime_checkable
class JunctionStorePath(Protocol):
    """A :class:`GroupStorePath` that takes the shared-prefix junction its request's
    lookup registered (docs/CONTRACT.md 9.3): after every lookup that accepts a hit the
    system calls ``register_junction(junction)`` (0: none), before the request's first
    store step from that hit, and the path passes the junction to its mask besides its
    replay boundaries (vLLM's ``_build_store_jobs`` reads the request's
    ``shared_prefix_boundary``). A plugged path without it (the audit's adapter of
    upstream's builder) is handed no junction: its :class:`~.events.StoreEvent` says
    ``junction=0``, so its stores are judged without one, while the junction the lookup
    registered is still reported and judged (:class:`~.events.LookupEvent`)."""

    def register_junction(self, junction: int) -> None: ...


StorePath = Callable[[Geometry, int, bool], Sequence[GroupStorePath]]
"""``store_path(geometry, prompt_len, prompt_only)``: a new request's store path, one
:class:`GroupStorePath` per group (the audit plugs upstream's executed store-job builder
in here: ``tools/audit/system.py``)."""


class StoreJobError(AssertionError):
    """A store job whose offload keys and GPU block ids disagree in number: upstream's
    ``assert len(offload_keys) == len(offload_block_ids)`` in ``_build_store_jobs``
    (engine-fatal in vLLM: #49118 and its duplicates)."""


RETRY_STEPS = DEFAULT_DEFERRAL_BOUND + 2
"""How long ``OffloadSystem.retry_lookups`` answers RETRY by default: past the deferral
bound, so the deadline has to decide."""


@dataclass
class SystemConfig:
    geometry: Geometry
    impl: Implementation
    tensor_backed: bool = True
    device: str = "cpu"
    layout: KVLayout = field(default_factory=KVLayout)
    capacity_chunks: int = 64
    delay_steps: int = 1
    prompt_only: bool = True
    vocab: int = 50
    gpu_prefix_cache: bool = True
    deferral_bound: int | None = DEFAULT_DEFERRAL_BOUND
    """``D`` of C13: scheduler steps after a request's first deferral at which its lookup
    decides with the chunks that are ready (``impl.deferral_expired``); ``None``: no
    deadline (a request may wait on a stalled job forever)."""
    store_path: StorePath | None = None
    """Each request's store path; None: kvcontract's StoreTracker over ``impl``."""

    def __post_init__(self) -> None:
        # Bad configurations fail here with a kvcontract error, not deep inside a step.
        if not isinstance(self.geometry, Geometry):
            raise UsageError(f"geometry must be a Geometry, not {type(self.geometry).__name__}")
        for name, value, minimum in (
            ("capacity_chunks", self.capacity_chunks, 1),
            ("delay_steps", self.delay_steps, 0),
            *((("deferral_bound", self.deferral_bound, 0),)
              if self.deferral_bound is not None else ()),
            ("vocab", self.vocab, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise GeometryError(name, value, f"must be an integer >= {minimum}")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise UsageError(f"unknown device {self.device!r}; choose cpu or cuda")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise UsageError(f"device {self.device!r} needs CUDA, and torch reports none")


class Phase(str, enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"
    RUNNING = "running"
    DONE = "done"


@dataclass
class Request:
    rid: str
    tokens: list[int]
    prompt_len: int
    max_new_tokens: int
    phase: Phase = Phase.WAITING
    num_computed: int = 0
    tables: dict[int, list[int]] = field(default_factory=dict)
    trackers: dict[int, GroupStorePath] = field(default_factory=dict)
    registered: dict[int, int] = field(default_factory=dict)
    """Per group: blocks already entered into the GPU prefix cache."""
    load_keys: list[ChunkKey] = field(default_factory=list)
    load_hit: int = 0
    pending_load_jobs: int = 0
    prefix_hashes: list[int] = field(default_factory=list)
    """Chained hash of every complete hash block (``tph`` tokens) of ``tokens``."""
    future: list[int] = field(default_factory=list)
    """The tokens the request will sample, in order (deterministic per request id)."""
    deferred_since: int = NO_DEFERRAL
    """The step its current deferral started (``impl.deferral_clock``), or none."""
    preempted: bool = False
    """Preempted and not looked up again yet (its next lookup is a re-admission)."""
    load_jobs: dict[int, tuple[int, list[ChunkKey], tuple[int, ...]]] = field(
        default_factory=dict)
    """Load jobs in flight: ``job id -> (group, keys, chunks)``."""
    failed_loads: list[tuple[int, int, ChunkKey]] = field(default_factory=list)
    """``(group, chunk, key)`` of this hit's loads that failed."""
    load_local: int = 0
    state: RequestState | None = None
    junction: int = 0
    """The shared-prefix junction (tokens; 0: none) its last lookup that accepted a hit
    registered (``impl.shared_prefix_junction``; vLLM's ``shared_prefix_boundary``)."""


class BlockPool:
    """GPU blocks of one group with a prefix cache.

    ``blocks[id]`` is ``[bs, layers, 2, heads, dim]`` (only when tensor-backed). A block
    is referenced by the tables that hold it; at reference count 0 it is free but keeps
    its cached hash until :meth:`allocate` reuses it (least recently freed first).
    """

    def __init__(
        self, block_tokens: int, layout: KVLayout, device: str, tensors: bool, initial: int = 64
    ) -> None:
        self.block_shape = (block_tokens, *layout.token_shape)
        self.blocks: torch.Tensor | None = (
            torch.zeros((initial, *self.block_shape), dtype=layout.dtype, device=device)
            if tensors else None
        )
        self.size = initial
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, initial))
        self.refs: Counter[int] = Counter()
        self.cached: dict[int, int] = {}  # prefix hash -> block id
        self.hash_of: dict[int, int] = {}  # block id -> prefix hash

    def allocate(self) -> int:
        if not self.free:
            # Grow instead of preempting: block ids stay stable, so tables stay valid.
            old = self.size
            if self.blocks is not None:
                if self.blocks.is_cuda:
                    # Jobs in flight on the side streams still read or write the old
                    # tensor; let them finish before its contents are copied (rare).
                    torch.cuda.synchronize(self.blocks.device)
                self.blocks = torch.cat([self.blocks, torch.zeros_like(self.blocks)])
            self.size = 2 * old
            self.free.update((i, None) for i in range(old, 2 * old))
        block_id, _ = self.free.popitem(last=False)
        old_hash = self.hash_of.pop(block_id, None)
        if old_hash is not None:
            del self.cached[old_hash]  # the cached content is overwritten: evicted
        self.refs[block_id] += 1
        return block_id

    def touch(self, block_id: int) -> None:
        """Take a reference on a cached block (a local prefix hit)."""
        self.free.pop(block_id, None)
        self.refs[block_id] += 1

    def release(self, block_id: int) -> None:
        if block_id == NULL_BLOCK:
            return
        self.refs[block_id] -= 1
        if self.refs[block_id] <= 0:
            del self.refs[block_id]
            self.free[block_id] = None

    def register(self, prefix_hash: int, block_id: int) -> None:
        """Enter a full block into the prefix cache (first writer wins)."""
        if prefix_hash not in self.cached and block_id not in self.hash_of:
            self.cached[prefix_hash] = block_id
            self.hash_of[block_id] = prefix_hash

    def evict_free(self) -> None:
        """Drop every free block from the prefix cache (memory pressure): a later
        request finds nothing of them; blocks in use keep their cache entries."""
        for block_id in list(self.free):
            prefix = self.hash_of.pop(block_id, None)
            if prefix is not None:
                del self.cached[prefix]


class OffloadSystem:
    """Producers and consumers sharing one offload manager, stepped by a scheduler."""

    def __init__(self, config: SystemConfig) -> None:
        self.config = config
        self.impl = config.impl
        self.geometry = config.geometry
        geo = config.geometry
        self.tph = geo.tokens_per_hash
        device = config.device
        self.pools = [
            BlockPool(geo.block_tokens(g), config.layout, device, config.tensor_backed)
            for g in geo.groups
        ]
        # A local hit must end on a block boundary of every group (and on a chunk end
        # of a Mamba group, whose state exists only there).
        self.local_step = math.lcm(
            *[geo.block_tokens(g) for g in geo.groups],
            *[geo.chunk_tokens(g) for g in geo.groups if g.kind is GroupKind.MAMBA],
        )
        self.manager: MockedOffloadManager | TensorOffloadManager
        if config.tensor_backed:
            self.manager = TensorOffloadManager(
                config.capacity_chunks,
                [p.block_shape for p in self.pools],
                geo.blocks_per_chunk,
                config.layout.dtype,
                pin_memory=device.startswith("cuda"),
            )
            self.worker = TransferWorker(None, self.manager.chunks, config.delay_steps)
        else:
            self.manager = MockedOffloadManager(config.capacity_chunks)
            self.worker = TransferWorker(None, None, config.delay_steps)
        self.requests: dict[str, Request] = {}
        self.queued_store_jobs: list[tuple[TransferJob, list[ChunkKey], bool]] = []
        self.in_flight: dict[int, tuple[str, list[ChunkKey], bool, str]] = {}
        self.loading_keys: Counter[ChunkKey] = Counter()
        self.fail_stores = 0
        """Store jobs still to fail (:meth:`inject_store_failure`)."""
        self.stall_stores = 0
        """Store jobs still to stall: submitted, never completed (:meth:`stall_next_store`)."""
        self.fail_loads = 0
        self.retry_through = -1
        """The last step at which every offload lookup answers RETRY (``retry_lookups``)."""
        """Load jobs still to fail (:meth:`fail_next_load`)."""
        self.failing_loads: set[int] = set()
        self.stalled_keys: set[ChunkKey] = set()
        self.held_loads: Counter[ChunkKey] = Counter()
        """Loads counted by :meth:`hold_loading` (another request's, never ending)."""
        self.job_chunks: dict[int, tuple[str, int, tuple[int, ...]]] = {}
        """``job id -> (request, group, chunks)`` of every job built."""
        self.stale_stores: list[tuple[int, str, int, int, int, StaleReason]] = []
        """``(step, request, job id, group, block, why)`` of store pages whose block was no
        longer the request's when the job was submitted (C14)."""
        self.key_names: dict[ChunkKey, str] = {}
        self._name_counts: Counter[str] = Counter()
        self._lifecycle_observers: list[LifecycleObserver] = []
        self.next_job = 0
        self.log: list[str] = []
        """The decision log: lookups, loads, offers, completions (lockstep comparison)."""
        self.steps = 0
        self._observers: list[Observer] = []
        # Expected KV per (group, request): the oracle is a pure function of position
        # and token id, so it is computed once per token, not once per check.
        self._kv: dict[tuple[int, str], torch.Tensor] = {}
        self._q: dict[tuple[int, str], torch.Tensor] = {}

    # -- observers --------------------------------------------------------------------
    def subscribe(self, observer: Observer) -> None:
        """Call ``observer(event)`` for every event of :mod:`.events`, in decision order."""
        self._observers.append(observer)

    def _emit(self, event: Event) -> None:
        for observer in self._observers:
            observer(event)

    def subscribe_lifecycle(self, observer: LifecycleObserver) -> None:
        """Call ``observer(event)`` for every lifecycle event of :mod:`.events` (request
        states, deferrals and decisions, job lines, store offers, recoveries)."""
        self._lifecycle_observers.append(observer)

    def _emit_lifecycle(self, event: LifecycleEvent) -> None:
        for observer in self._lifecycle_observers:
            observer(event)

    def _enter(self, req: Request, state: RequestState) -> None:
        """``req`` enters ``state`` (reported once per change, and on every deferral)."""
        if req.state is state and state is not RequestState.DEFERRED:
            return
        req.state = state
        if self._lifecycle_observers:
            self._emit_lifecycle(StateEvent(req.rid, self.steps, state, req.num_computed))

    def key_name(self, key: ChunkKey) -> str:
        """A short stable name of a manager key (``g0c3``: group 0, chunk 3; a key of
        another prompt with the same position gets a ``'``)."""
        name = self.key_names.get(key)
        return name if name is not None else repr(key)

    def _name_key(self, key: ChunkKey, group: int, chunk: int) -> ChunkKey:
        if key not in self.key_names:
            base = f"g{group}c{chunk}"
            self.key_names[key] = base + "'" * self._name_counts[base]
            self._name_counts[base] += 1
        return key

    def _transfer(self, rid: str, job_id: int, kind: JobKind, event: JobEvent,
                  keys: list[ChunkKey],
                  stale: tuple[tuple[int, StaleReason], ...] = ()) -> None:
        if not self._lifecycle_observers:
            return
        _, group, chunks = self.job_chunks.get(job_id, (rid, 0, ()))
        self._emit_lifecycle(TransferEvent(rid, self.steps, job_id, kind, event, group,
                                           chunks, tuple(self.key_name(k) for k in keys),
                                           stale))

    def lifecycle_final(self) -> dict[str, tuple[str, ...]]:
        """What is left, as key names and request ids: ``pending``, ``loading_keys``,
        ``loading_requests`` (a load still counted), ``referenced``, ``open`` (requests
        not ended), ``stalled`` (keys of stalled jobs)."""
        return {
            "pending": tuple(sorted(self.key_name(k) for k in self.manager.pending_keys())),
            "loading_keys": tuple(sorted(self.key_name(k) for k, n in self.loading_keys.items()
                                         if n > self.held_loads[k])),
            "loading_requests": tuple(r.rid for r in self.requests.values()
                                      if r.phase is Phase.LOADING or r.pending_load_jobs),
            "referenced": tuple(sorted(self.key_name(k)
                                       for k in self.manager.referenced_keys())),
            "open": tuple(r.rid for r in self.requests.values() if r.phase is not Phase.DONE),
            "stalled": tuple(sorted(self.key_name(k) for k in self.stalled_keys)),
        }

    # -- helpers ----------------------------------------------------------------------
    @property
    def tensor_backed(self) -> bool:
        return self.config.tensor_backed

    def _sync_worker_tensors(self) -> None:
        if self.tensor_backed:
            self.worker.gpu_blocks = [p.blocks for p in self.pools if p.blocks is not None]

    def _prefix_hashes(self, req: Request) -> list[int]:
        """Chained hashes per hash block: ``h[i]`` names ``tokens[: (i + 1) * tph]``."""
        hashes = req.prefix_hashes
        tph = self.tph
        for i in range(len(hashes), len(req.tokens) // tph):
            parent = hashes[-1] if hashes else 0
            hashes.append(hash((parent, tuple(req.tokens[i * tph : (i + 1) * tph]))))
        return hashes

    def _prefix_hash(self, req: Request, num_tokens: int) -> int:
        return self._prefix_hashes(req)[num_tokens // self.tph - 1]

    def chunk_key(self, tokens: list[int], group: int, chunk: int) -> ChunkKey:
        """Chunk ``chunk`` of ``group``: keyed by the prefix hash at its end, plus the group."""
        tpc = self.geometry.chunk_tokens(self.geometry.groups[group])
        probe = Request("", list(tokens[: (chunk + 1) * tpc]), 0, 0)
        return self._name_key((group, self._prefix_hash(probe, (chunk + 1) * tpc)), group,
                              chunk)

    def _chunk_keys(self, req: Request) -> dict[tuple[int, int], ChunkKey]:
        geo = self.geometry
        hashes = self._prefix_hashes(req)
        keys: dict[tuple[int, int], ChunkKey] = {}
        for g, spec in enumerate(geo.groups):
            tpc = geo.chunk_tokens(spec)
            per = tpc // self.tph
            for k in range(len(req.tokens) // tpc):
                keys[(g, k)] = self._name_key((g, hashes[(k + 1) * per - 1]), g, k)
        return keys

    def _queries(self, req: Request, g: int) -> torch.Tensor:
        """Decode queries of every position of ``req`` in group ``g`` (layer 0)."""
        queries = self._q.get((g, req.rid))
        if queries is None or queries.shape[0] < len(req.tokens):
            kv = self._expected(req, g, 0, len(req.tokens))
            tokens = req.tokens + req.future[len(req.tokens) - req.prompt_len :]
            queries = expected_query(self.config.layout, g, torch.arange(len(tokens)),
                                     torch.tensor(tokens), kv.device)
            self._q[(g, req.rid)] = queries
        return queries

    def _expected(self, req: Request, g: int, lo: int, hi: int) -> torch.Tensor:
        """The producer's KV of positions ``[lo, hi)`` of ``req`` in group ``g``."""
        have = self._kv.get((g, req.rid))
        if have is None or have.shape[0] < hi:
            # Every token the request will ever hold is known up front (prompt plus the
            # deterministic samples), so the oracle runs once per request and group.
            blocks = self.pools[g].blocks
            device = blocks.device if blocks is not None else torch.device("cpu")
            tokens = req.tokens + req.future[len(req.tokens) - req.prompt_len :]
            have = expected_kv(
                self.config.layout, g, torch.arange(len(tokens)), torch.tensor(tokens), device
            )
            self._kv[(g, req.rid)] = have
        return have[lo:hi]

    # -- program operations -------------------------------------------------------------
    def add_request(self, rid: str, tokens: list[int], max_new_tokens: int = 2) -> None:
        if rid in self.requests:
            raise UsageError(f"request {rid!r} exists")
        if not tokens or any(
            isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.config.vocab
            for t in tokens
        ):
            raise UsageError(
                f"request {rid!r}: tokens must be a non-empty list of ints in "
                f"[0, {self.config.vocab})"
            )
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 1:
            raise UsageError(f"request {rid!r}: max_new_tokens must be an integer >= 1")
        req = Request(rid, list(tokens), len(tokens), max_new_tokens)
        self._enter(req, RequestState.WAITING)
        # Samples are a stable function of (request id, position): identical in the
        # mocked and the real system and across processes (no salted str hash).
        req.future = [
            zlib.crc32(f"{rid}:{len(tokens) + i}".encode()) % self.config.vocab
            for i in range(max_new_tokens)
        ]
        self.requests[rid] = req
        geo = self.geometry
        plugged = self.config.store_path
        paths = (None if plugged is None
                 else plugged(geo, req.prompt_len, self.config.prompt_only))
        for g in range(len(geo.groups)):
            req.tables[g] = []
            req.registered[g] = 0
            # The replay boundaries are the implementation's (impl.store_replay_boundaries).
            req.trackers[g] = paths[g] if paths is not None else StoreTracker(
                self.impl, geo, g, req.prompt_len,
                offload_prompt_only=self.config.prompt_only,
            )

    # -- hooks for harnesses (fixtures live in kvcontract.tools.harness) -----------------
    def chunk_keys_for(self, tokens: list[int]) -> dict[tuple[int, int], ChunkKey]:
        """The key of every complete chunk ``(group, chunk)`` of a request with ``tokens``."""
        return self._chunk_keys(Request("probe", list(tokens), len(tokens), 1))

    def local_hit_for(self, tokens: list[int]) -> int:
        """The GPU prefix hit a request with ``tokens`` would get now."""
        return self._local_hit(Request("probe", list(tokens), len(tokens), 1))

    def hold_loading(self, key: ChunkKey) -> None:
        """Count ``key`` as being loaded by another request outside the system's
        requests (a fixture: that load never completes, and the lifecycle's final state
        does not count it as one of the system's)."""
        self.loading_keys[key] += 1
        self.held_loads[key] += 1

    def inject_store_failure(self) -> None:
        """The next store job built fails: its chunks end absent, never readable."""
        self.fail_stores += 1

    def stall_next_store(self) -> None:
        """The next store job built is submitted and never completes (a stalled write:
        its chunks stay HIT_PENDING)."""
        self.stall_stores += 1
        self.log.append("stall-next-store")

    def retry_lookups(self, steps: int = RETRY_STEPS) -> None:
        """The offload tier answers RETRY to every lookup of the next ``steps`` scheduler
        steps, as an asynchronous lookup in flight that has not returned (a P2P tier's:
        vLLM #56823, #56836); the real answers come back after."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise UsageError(f"retry_lookups: steps must be an integer >= 1, not {steps!r}")
        self.retry_through = self.steps + steps
        self.log.append(f"retry-lookups {steps}")

    def fail_next_load(self) -> None:
        """The next load job submitted fails: its chunks' bytes never reach the GPU."""
        self.fail_loads += 1
        self.log.append("fail-next-load")

    def reset_prefix_cache(self) -> None:
        """Drop every free block from the GPU prefix caches and every idle chunk of the
        offload manager (pending chunks and chunks being loaded stay)."""
        for pool in self.pools:
            pool.evict_free()
        dropped = self.manager.drop_idle()
        self.log.append(f"reset-prefix-cache dropped={len(dropped)}")

    def finish(self, rid: str) -> None:
        req = self.requests.get(rid)
        if req is not None and req.phase is not Phase.DONE and \
                req.num_computed < req.prompt_len:
            # A request is finished by sampling, which needs its whole prompt computed
            # (vLLM's engine ends a waiting or prefilling request only by an abort); a
            # stop before that is an abort, and the program says so explicitly.
            self.log.append(f"finish {rid} ignored ({req.phase.value}, prompt not computed)")
            return
        self._end(rid, RequestStatus.FINISHED)

    def finish_with_error(self, rid: str) -> None:
        """End a running request as finished wherever its prefill is: vLLM's
        ``FINISHED_ERROR`` (a failed KV load under the ``fail`` policy, a grammar or
        encoder-cache error) finishes a request that has computed only part of its
        prompt; its store job may offer only what it computed (C14). A request that is
        not running (waiting, loading, done) is left alone."""
        req = self.requests.get(rid)
        if req is None or req.phase is not Phase.RUNNING:
            self.log.append(f"error-finish {rid} ignored (not running)")
            return
        self._end(rid, RequestStatus.FINISHED)

    def abort(self, rid: str) -> None:
        self._end(rid, RequestStatus.ABORTED)

    def preempt(self, rid: str) -> None:
        req = self.requests.get(rid)
        if req is None or req.phase is not Phase.RUNNING:
            return
        self._flush_store_jobs()
        self._free(req)
        req.num_computed = 0
        req.phase = Phase.WAITING
        req.preempted = True
        req.deferred_since = NO_DEFERRAL
        self._enter(req, RequestState.PREEMPTED)
        self.log.append(f"preempt {rid}")

    def _end(self, rid: str, status: RequestStatus) -> None:
        req = self.requests.get(rid)
        if req is None or req.phase is Phase.DONE:
            return
        if req.phase is Phase.LOADING:
            if status is not RequestStatus.ABORTED:
                return  # a request is finished by sampling, which needs its KV loaded
            self._cancel_loads(req)
        if req.phase is Phase.RUNNING or (
                status is RequestStatus.ABORTED and req.phase is Phase.WAITING):
            # The connector builds the store job of every request that ends, scheduled or
            # not (vLLM's finished_req_ids include a request aborted in the queue): what
            # it may store is the implementation's get_num_offloadable_tokens.
            self._build_store_jobs(req, status, req.num_computed, 0)
        self._flush_store_jobs()
        self._free(req)
        req.phase = Phase.DONE
        self._enter(req, RequestState.FINISHED if status is RequestStatus.FINISHED
                    else RequestState.ABORTED)
        self._kv = {k: v for k, v in self._kv.items() if k[1] != rid}
        self._q = {k: v for k, v in self._q.items() if k[1] != rid}
        self.log.append(f"{status.value} {rid} at {req.num_computed}")

    def _cancel_loads(self, req: Request) -> None:
        """Cancel every load job of ``req`` still in flight: each ends exactly once
        (cancelled), releases its manager references and its loading counts."""
        for job_id, (_, keys, _) in sorted(req.load_jobs.items()):
            self.worker.cancel(job_id)
            self.in_flight.pop(job_id, None)
            self.failing_loads.discard(job_id)
            self.manager.complete_load(keys)
            self._release_loading(keys)
            self._transfer(req.rid, job_id, JobKind.LOAD, JobEvent.CANCELLED, keys)
            self.log.append(f"load-cancel job{job_id} {req.rid}")
        req.load_jobs.clear()
        req.pending_load_jobs = 0

    def _release_loading(self, keys: list[ChunkKey]) -> None:
        for key in keys:
            self.loading_keys[key] -= 1
            if self.loading_keys[key] <= 0:
                del self.loading_keys[key]

    def _free(self, req: Request) -> None:
        for g, table in req.tables.items():
            for block_id in table:
                self.pools[g].release(block_id)
            req.tables[g] = []
            req.registered[g] = 0

    # -- the step -------------------------------------------------------------------------
    def step(self, token_budget: int) -> None:
        if isinstance(token_budget, bool) or not isinstance(token_budget, int) \
                or token_budget < 1:
            raise UsageError(
                f"step: the token budget must be an integer >= 1, not {token_budget!r}"
            )
        self.steps += 1
        self._flush_store_jobs()
        for job in self.worker.poll():
            self._acknowledge(job)
        for req in list(self.requests.values()):
            if req.phase is Phase.WAITING:
                self._schedule_waiting(req)
        self.worker.fence_compute()
        budget = token_budget
        for req in list(self.requests.values()):
            if req.phase is not Phase.RUNNING or budget <= 0:
                continue
            remaining = len(req.tokens) - req.num_computed
            scheduled = min(budget, remaining)
            if scheduled <= 0:
                continue
            budget -= scheduled
            self._forward(req, scheduled)

    def drain(self) -> None:
        """Submit and complete everything in flight."""
        self._flush_store_jobs()
        for job in self.worker.drain():
            self._acknowledge(job)

    def _flush_store_jobs(self) -> None:
        self._sync_worker_tensors()
        for job, keys, failed in self.queued_store_jobs:
            owner, _, _ = self.job_chunks.get(job.job_id, ("", 0, ()))
            stale = self._stale_pages(owner, job)
            stall = False
            if not failed and self.stall_stores > 0:
                self.stall_stores -= 1
                stall = True
                self.stalled_keys.update(keys)
            self.worker.submit(job, stall=stall)
            self.in_flight[job.job_id] = ("store", keys, failed, owner)
            self._transfer(owner, job.job_id, JobKind.STORE, JobEvent.SUBMITTED, keys, stale)
        self.queued_store_jobs = []

    def _stale_pages(self, rid: str, job: TransferJob) -> tuple[tuple[int, StaleReason], ...]:
        """The pages of a store job whose GPU block is no longer the request's table's:
        the copy would read a freed block or one another request now writes (C14)."""
        req = self.requests.get(rid)
        if req is None:
            return ()
        table = req.tables.get(job.group, [])
        pool = self.pools[job.group]
        stale: list[tuple[int, StaleReason]] = []
        for block_id, _, _ in job.pages:
            if block_id in table:
                continue
            reason = StaleReason.REUSED if pool.refs[block_id] > 0 else StaleReason.FREED
            stale.append((block_id, reason))
            self.stale_stores.append((self.steps, rid, job.job_id, job.group, block_id, reason))
        return tuple(stale)

    def _acknowledge(self, job: TransferJob) -> None:
        direction, keys, failed, rid = self.in_flight.pop(job.job_id)
        if direction == "store":
            # A failed store leaves its keys absent: nothing half-written becomes readable
            # (``impl.store_job_published``: the reference publishes only a success).
            self.manager.complete_store(keys, success=bool(self.impl.store_job_published(
                failed)))
            self.log.append(f"store-complete job{job.job_id} ok={not failed}")
            self._transfer(rid, job.job_id, JobKind.STORE,
                           JobEvent.FAILED if failed else JobEvent.COMPLETED, keys)
            return
        self.manager.complete_load(keys)
        self._release_loading(keys)
        req = self.requests[rid]
        req.pending_load_jobs -= 1
        group, _, chunks = req.load_jobs.pop(job.job_id)
        load_failed = job.job_id in self.failing_loads
        self.failing_loads.discard(job.job_id)
        self._transfer(rid, job.job_id, JobKind.LOAD,
                       JobEvent.FAILED if load_failed else JobEvent.COMPLETED, keys)
        if load_failed:
            req.failed_loads.extend((group, c, k) for c, k in zip(chunks, keys, strict=True))
            self.log.append(f"load-failed job{job.job_id} {rid}")
        if req.pending_load_jobs == 0:
            if req.failed_loads:
                self._recover(req)
                return
            req.num_computed = req.load_hit
            req.phase = Phase.RUNNING
            self._enter(req, self._running_state(req))
            self.log.append(f"load-complete {rid} at {req.load_hit}")
            if self.tensor_backed and self._observers:
                self._compare_restored(req)

    def _recover(self, req: Request) -> None:
        """A load of the hit failed (C15): the failed chunks' bytes are not on the GPU and
        not trusted, so they leave the manager (a later lookup answers MISS, never loads
        them again nor defers on them); the request frees its blocks and goes back to
        waiting with nothing computed, its store trackers restarted at token 0 (as vLLM
        restarts them at a new lookup), and its next lookup decides over what is left,
        so it resumes from the first token whose KV is on no GPU block (for a sliding
        window, the whole window of the new boundary is loaded or computed again)."""
        failed = list(req.failed_loads)
        dropped = self.manager.drop([key for _, _, key in failed])
        self._free(req)
        req.num_computed = 0
        req.phase = Phase.WAITING
        req.failed_loads = []
        req.deferred_since = NO_DEFERRAL
        plugged = self.config.store_path
        paths = (None if plugged is None
                 else plugged(self.geometry, req.prompt_len, self.config.prompt_only))
        for g in range(len(self.geometry.groups)):
            req.trackers[g] = paths[g] if paths is not None else StoreTracker(
                self.impl, self.geometry, g, req.prompt_len,
                offload_prompt_only=self.config.prompt_only)
        # The junction stays the request's until its next lookup registers another.
        self._hand_junction(req)
        self.log.append(f"recover {req.rid} from hit {req.load_hit}: "
                        f"{len(failed)} chunk(s) failed, {len(dropped)} dropped")
        if self._lifecycle_observers:
            self._emit_lifecycle(RecoveryEvent(
                req.rid, self.steps, req.load_local, req.load_hit,
                tuple((g, c) for g, c, _ in failed),
                tuple(self.key_name(k) for _, _, k in failed)))
        self._enter(req, RequestState.WAITING)

    @staticmethod
    def _running_state(req: Request) -> RequestState:
        return (RequestState.RUNNING_PREFILL if req.num_computed < req.prompt_len
                else RequestState.RUNNING_DECODE)

    # -- local (GPU prefix-cache) hits ----------------------------------------------------
    def _local_hit(self, req: Request) -> int:
        """The largest ``L`` every group's GPU cache can serve (0 when disabled)."""
        if not self.config.gpu_prefix_cache:
            return 0
        geo = self.geometry
        step = self.local_step
        # At least the last prompt token is computed again (its logits are needed).
        candidate = (len(req.tokens) - 1) // step * step
        hashes = self._prefix_hashes(req)
        cached: list[set[int]] = []
        for g, spec in enumerate(geo.groups):
            bs = geo.block_tokens(spec)
            per = bs // self.tph
            pool = self.pools[g]
            cached.append({
                b for b in range(len(req.tokens) // bs)
                if hashes[(b + 1) * per - 1] in pool.cached
            })
        while candidate > 0:
            if all(self._group_serves_local(g, s, candidate, cached[g])
                   for g, s in enumerate(geo.groups)):
                return candidate
            candidate -= step
        return 0

    def _group_serves_local(self, g: int, spec: GroupSpec, hit: int, cached: set[int]) -> bool:
        bs = self.geometry.block_tokens(spec)
        first = group_first_live_block(self.impl, self.geometry, spec, hit)
        # EAGLE under legacy hashes: the peek block, then dropped (docs/CONTRACT.md 2.1).
        end = hit // bs + (1 if self.geometry.drops_eagle_block(spec) else 0)
        return all(b in cached for b in range(first, end))

    # -- lookup and load ------------------------------------------------------------------
    def _schedule_waiting(self, req: Request) -> None:
        geo = self.geometry
        num_tokens = len(req.tokens)
        keys = self._chunk_keys(req)
        local = self._local_hit(req)
        if req.preempted:
            req.preempted = False
            self._enter(req, RequestState.READMITTED)

        retrying = self.steps <= self.retry_through

        def lookup(g: int, k: int) -> LookupResult:
            if retrying:
                return LookupResult.RETRY
            result: LookupResult = self.manager.lookup(keys[(g, k)])
            return result

        def is_loading(g: int, k: int) -> bool:
            key = keys.get((g, k))
            return key is not None and self.loading_keys[key] > 0

        observed = bool(self._observers)
        states: tuple[tuple[LookupResult, ...], ...] = ()
        loading: frozenset[tuple[int, int]] = frozenset()
        if observed:
            # What the lookup is about to see, for every complete chunk (it runs on the
            # same answers: lookups have no side effects).
            states = tuple(
                tuple(lookup(g, k) for k in range(num_tokens // geo.chunk_tokens(spec)))
                for g, spec in enumerate(geo.groups)
            )
            loading = frozenset(gk for gk, key in keys.items() if self.loading_keys[key] > 0)
        outcome = lookup_complete_chunks(self.impl, geo, num_tokens, local, lookup, is_loading)
        by_deadline = False
        if outcome.hit_tokens is None:
            since = self.impl.deferral_clock(req.deferred_since, self.steps)
            bound = self.config.deferral_bound
            if self.impl.deferral_expired(since, self.steps,
                                          NO_BOUND if bound is None else bound):
                # The deadline (C13): decide now over the chunks that are ready and
                # nobody else loads; the lookup runs again on that view, so it returns
                # a number (the ready hit, or the local hit: recompute).
                by_deadline = True

                def ready(g: int, k: int) -> LookupResult:
                    return ready_after_deadline(lookup(g, k), is_loading(g, k))

                if observed:
                    states = tuple(tuple(ready(g, k) for k in range(len(row)))
                                   for g, row in enumerate(states))
                    loading = frozenset()
                self.log.append(f"lookup {req.rid} deadline after "
                                f"{self.steps - since} step(s)")
                outcome = lookup_complete_chunks(self.impl, geo, num_tokens, local, ready, None)
            else:
                self._deferred(req, since, local, outcome, lookup, keys)
        reported = tuple(outcome.load_ranges.items())
        junction = self._junction(outcome, local)
        if observed:
            self._emit(LookupEvent(
                req.rid, num_tokens, local, states, loading, outcome.hit_tokens, reported,
                None if junction is None else outcome.full_attention_boundary, junction))
        if outcome.hit_tokens is None:
            self.log.append(f"lookup {req.rid} local={local} defer")
            return
        assert junction is not None
        hit = outcome.hit_tokens
        req.deferred_since = NO_DEFERRAL
        req.load_local = local
        if self._lifecycle_observers:
            ranges_now = {g: outcome.load_ranges[g] for g in sorted(outcome.load_ranges)}
            loaded = tuple(self.key_name(keys[(g, k)]) for g, (lo, hi) in ranges_now.items()
                           for k in range(lo, hi)) if hit > local else ()
            self._emit_lifecycle(DecisionEvent(req.rid, self.steps, local, hit, reported,
                                               loaded, by_deadline))
        self._enter(req, RequestState.HIT_ACCEPTED)
        ranges = {g: outcome.load_ranges[g] for g in sorted(outcome.load_ranges)}
        self.log.append(f"lookup {req.rid} local={local} hit={hit} loads={ranges}"
                        + (f" junction={junction}" if junction else ""))
        external = hit > local
        load_keys = [keys[(g, k)] for g, (lo, hi) in ranges.items() for k in range(lo, hi)]
        slots: list[int] = []
        if external:
            try:
                slots = self.manager.prepare_load(load_keys)
            except (ChunkNotFoundError, ChunkNotReadyError) as exc:
                error = (LoadError.NOT_FOUND if isinstance(exc, ChunkNotFoundError)
                         else LoadError.NOT_READY)
                self._emit(LoadCrashEvent(req.rid, hit, local, error, str(exc), reported))
                self.log.append(f"crash {req.rid}: {exc}")
                req.phase = Phase.DONE
                self._enter(req, RequestState.ABORTED)
                return
            self._emit(LoadEvent(req.rid, hit, local, reported))
        # The junction is the request's from this lookup on (replacing an earlier
        # lookup's: vLLM sets shared_prefix_boundary again at every admission), and its
        # store paths store for it from their first step on this hit.
        req.junction = junction
        self._hand_junction(req)
        for g, spec in enumerate(geo.groups):
            # Chunks covered by the hit (loaded or cached on the GPU) are never re-offered.
            req.trackers[g].mark_computed(hit // geo.chunk_tokens(spec))
        self._allocate_hit(req, local, hit)
        if observed:
            for g in range(len(geo.groups)):
                live = tuple(block_id != NULL_BLOCK for block_id in req.tables[g])
                self._emit(AllocationEvent(req.rid, g, hit, live))
        req.load_hit = hit
        if not external:
            req.num_computed = hit
            req.phase = Phase.RUNNING
            self._enter(req, self._running_state(req))
            if self.tensor_backed and hit > 0 and observed:
                self._compare_restored(req)
            return
        req.load_keys = load_keys
        req.phase = Phase.LOADING
        self._enter(req, RequestState.LOADING)
        self._sync_worker_tensors()
        slot_of = dict(zip(load_keys, slots, strict=True))
        bpc = geo.blocks_per_chunk
        for g, (lo, hi) in ranges.items():
            table = req.tables[g]
            local_blocks = -(-local // geo.block_tokens(geo.groups[g]))
            pages: list[tuple[int, int, int]] = []
            group_keys: list[ChunkKey] = []
            for k in range(lo, hi):
                key = keys[(g, k)]
                group_keys.append(key)
                self.loading_keys[key] += 1
                for page in range(bpc):
                    block = k * bpc + page
                    # Partial first chunks skip their freed (null) pages and the pages
                    # the local hit already holds.
                    if local_blocks <= block < len(table) and table[block] != NULL_BLOCK:
                        pages.append((table[block], slot_of[key], page))
            job = TransferJob(self.next_job, "load", g, pages)
            self.next_job += 1
            self.in_flight[job.job_id] = ("load", group_keys, False, req.rid)
            req.pending_load_jobs += 1
            chunks = tuple(range(lo, hi))
            req.load_jobs[job.job_id] = (g, group_keys, chunks)
            self.job_chunks[job.job_id] = (req.rid, g, chunks)
            if self.fail_loads > 0:
                self.fail_loads -= 1
                self.failing_loads.add(job.job_id)
            self.worker.submit(job)
            self._transfer(req.rid, job.job_id, JobKind.LOAD, JobEvent.SUBMITTED, group_keys)
        if req.pending_load_jobs == 0:
            req.num_computed = hit
            req.phase = Phase.RUNNING
            self._enter(req, self._running_state(req))

    def _junction(self, outcome: LookupOutcome, local: int) -> int | None:
        """The shared-prefix junction a lookup that accepted a hit registers
        (docs/CONTRACT.md 9.3; 0: none), None for a lookup that deferred: the
        implementation's ``shared_prefix_junction`` of the full-attention boundary the
        lookup saw, the local hit, the external hit past it and the retention interval.
        A lookup that ended before a sparse group's turn (or a geometry without a
        full-attention group) reports no full-attention boundary and registers none, as
        vLLM's ``_lookup`` calls ``_maybe_register_shared_prefix_junction`` only with
        one.

        The GPU side needs no rule of its own for the junction here, unlike vLLM's
        (``cache_blocks`` adds it to the reachable boundaries of its sparse retention):
        the system's GPU prefix cache is not sparse (``_register_full_blocks`` enters
        every full block a request computes, whatever the retention interval), so the
        window at the junction is cached like every block; and the store job that
        offers the junction's chunks is built in the step that completes them, from the
        tables ``_allocate`` left at the count before the step (the tracker's first
        live block is taken at that count too, C10), and submitted at the start of the
        next step, before any block is freed again. The junction vLLM's KV-cache
        manager sets from a local hit (``get_computed_blocks``: a lagging sparse group)
        is not modelled: the system's local hit is the boundary every group serves
        (docs/CONTRACT.md 12), so a request's junction is its offload lookup's alone."""
        if outcome.hit_tokens is None:
            return None
        boundary = outcome.full_attention_boundary
        if boundary is None:
            return 0
        return int(self.impl.shared_prefix_junction(
            boundary, local, outcome.hit_tokens - local, self.geometry.retention_interval))

    @staticmethod
    def _hand_junction(req: Request) -> None:
        """Hand the request's junction to each of its store paths that takes one."""
        for path in req.trackers.values():
            if isinstance(path, JunctionStorePath):
                path.register_junction(req.junction)

    def _deferred(self, req: Request, since: int, local: int, outcome: LookupOutcome,
                  lookup: Callable[[int, int], LookupResult],
                  keys: dict[tuple[int, int], ChunkKey]) -> None:
        """Record a deferral: its start (the deadline counts from it) and, for the
        lifecycle observers, what it waited on."""
        req.deferred_since = since
        if not self._lifecycle_observers:
            self._enter(req, RequestState.DEFERRED)
            return
        waited: dict[tuple[int, int], DeferCause] = {}
        for g, k in outcome.lookups:
            answer = lookup(g, k)
            if answer == LookupResult.HIT_PENDING:
                waited.setdefault((g, k), DeferCause.HIT_PENDING)
            elif answer == LookupResult.RETRY:
                waited.setdefault((g, k), DeferCause.RETRY)
        for g, k in outcome.loading:
            waited.setdefault((g, k), DeferCause.LOADING_ELSEWHERE)
        causes = tuple(dict.fromkeys(waited.values()))
        self._emit_lifecycle(DeferralEvent(
            req.rid, self.steps, local, causes,
            tuple((g, k, self.key_name(keys[(g, k)]), cause)
                  for (g, k), cause in sorted(waited.items())), since))
        self._enter(req, RequestState.DEFERRED)

    def _allocate_hit(self, req: Request, local: int, hit: int) -> None:
        """Tables for a hit: null below the window, cached blocks up to ``L``, fresh after."""
        hashes = self._prefix_hashes(req)
        for g, spec in enumerate(self.geometry.groups):
            pool = self.pools[g]
            bs = self.geometry.block_tokens(spec)
            per = bs // self.tph
            first = group_first_live_block(self.impl, self.geometry, spec, hit)
            table: list[int] = []
            for b in range(-(-hit // bs)):
                if b < first:
                    table.append(NULL_BLOCK)
                elif (b + 1) * bs <= local:
                    block_id = pool.cached[hashes[(b + 1) * per - 1]]
                    pool.touch(block_id)
                    table.append(block_id)
                else:
                    table.append(pool.allocate())
            req.tables[g] = table
            req.registered[g] = min(local // bs, len(table))

    def _allocate(self, req: Request, computed_for_freeing: int, target_tokens: int) -> None:
        """Free out-of-window blocks (given the computed count), allocate up to target."""
        for g, spec in enumerate(self.geometry.groups):
            table = req.tables[g]
            pool = self.pools[g]
            bs = self.geometry.block_tokens(spec)
            first = group_first_live_block(self.impl, self.geometry, spec, computed_for_freeing)
            for b in range(min(first, len(table))):
                if table[b] != NULL_BLOCK:
                    pool.release(table[b])
                    table[b] = NULL_BLOCK
            end = -(-target_tokens // bs)
            while len(table) < end:
                table.append(NULL_BLOCK if len(table) < first else pool.allocate())

    def _register_full_blocks(self, req: Request) -> None:
        if not self.config.gpu_prefix_cache:
            return
        hashes = self._prefix_hashes(req)
        for g, spec in enumerate(self.geometry.groups):
            bs = self.geometry.block_tokens(spec)
            per = bs // self.tph
            table = req.tables[g]
            full = min(req.num_computed // bs, len(table))
            for b in range(req.registered[g], full):
                if table[b] != NULL_BLOCK:
                    self.pools[g].register(hashes[(b + 1) * per - 1], table[b])
            req.registered[g] = max(req.registered[g], full)

    # -- oracles ----------------------------------------------------------------------------
    def _gather_blocks(self, g: int, req: Request, lo: int, hi: int
                       ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The whole blocks of group ``g`` that hold ``req``'s positions ``[lo, hi)``,
        gathered at once: ``(block ids, their contents position by position, the first
        block's first position)``."""
        pool = self.pools[g]
        assert pool.blocks is not None
        bs = pool.block_shape[0]
        first, last = lo // bs, -(-hi // bs)
        device = pool.blocks.device
        ids = torch.tensor(req.tables[g][first:last], dtype=torch.int64, device=device)
        return ids, pool.blocks.index_select(0, ids).flatten(0, 1), first * bs

    def _positions_kv(self, g: int, req: Request, lo: int, hi: int) -> torch.Tensor:
        _, flat, start = self._gather_blocks(g, req, lo, hi)
        return flat[lo - start : hi - start]

    def _compare_restored(self, req: Request) -> None:
        """Compare the KV a hit left in every group with the producer's; report it."""
        hit = req.load_hit
        for g, spec in enumerate(self.geometry.groups):
            bs = self.geometry.block_tokens(spec)
            # Tables are null below the retained range (C1); a null entry inside it
            # would read the null block and fail the byte comparison below.
            first_block = group_first_live_block(self.impl, self.geometry, spec, hit)
            lo = first_block * bs
            if spec.kind is GroupKind.MAMBA:
                lo = max(lo, hit - bs)
            if lo >= hit:
                continue
            got = self._positions_kv(g, req, lo, hit)
            want = self._expected(req, g, lo, hit)
            match = bool(torch.equal(got, want))
            first_bad: int | None = None
            if not match:
                bad = (got != want).reshape(hit - lo, -1).any(dim=1).nonzero()
                first_bad = lo + int(bad[0, 0]) if bad.numel() else lo
            self._emit(RestoreEvent(req.rid, g, hit, lo, match, first_bad))
            if not match or spec.kind is GroupKind.MAMBA or hit >= len(req.tokens):
                continue
            self._compare_attention(req, g, spec, lo, got)

    def _compare_attention(
        self, req: Request, g: int, spec: GroupSpec, lo: int, got: torch.Tensor
    ) -> None:
        """Decode the token at ``hit`` over the restored cache and over a fresh one.

        The fresh cache holds every position the window admits; the restored one is
        read through the request's table, so a position the retention lost reads the
        null block and changes the output.
        """
        hit = req.load_hit
        window = spec.sliding_window
        # The decoded token at `hit` attends [hit - sw + 1, hit] (no MTP widening).
        attend_lo = attention_window_start(hit, window)
        fresh = self._expected(req, g, attend_lo, hit + 1)
        history = got[attend_lo - lo :] if attend_lo >= lo else \
            self._positions_kv(g, req, attend_lo, hit)
        restored = torch.cat([history, fresh[-1:]])
        positions = torch.arange(attend_lo, hit + 1, device=got.device)
        query = self._queries(req, g)[hit]
        # Two batch-1 calls: a batched call is parallelized over the batch by the CPU
        # kernel, which costs far more than it saves on a busy 2-core machine (measured).
        out_restored = window_decode_attention(
            query, restored[:, 0, 0], restored[:, 0, 1], positions, hit, window
        )
        out_fresh = window_decode_attention(
            query, fresh[:, 0, 0], fresh[:, 0, 1], positions, hit, window
        )
        match = bool(torch.equal(out_restored, out_fresh))
        self._emit(AttentionEvent(req.rid, g, hit, match))

    # -- forward and stores ---------------------------------------------------------------
    def _forward(self, req: Request, scheduled: int) -> None:
        before = req.num_computed
        after = before + scheduled
        self._enter(req, self._running_state(req))
        self._allocate(req, before, after)
        if self.tensor_backed:
            for g, pool in enumerate(self.pools):
                # Write whole blocks: keep what the blocks already hold outside
                # [before, after), so a partially filled block is extended, not clobbered.
                ids, view, start = self._gather_blocks(g, req, before, after)
                view[before - start : after - start] = self._expected(req, g, before, after)
                assert pool.blocks is not None
                pool.blocks.index_copy_(0, ids, view.view(len(ids), *pool.block_shape))
        req.num_computed = after
        status = RequestStatus.PREFILLING if before < req.prompt_len else RequestStatus.DECODING
        self._build_store_jobs(req, status, before, scheduled)
        self._register_full_blocks(req)
        if after == len(req.tokens):
            generated = len(req.tokens) - req.prompt_len
            if generated >= req.max_new_tokens:
                self.finish(req.rid)
                return
            req.tokens.append(req.future[generated])

    def _build_store_jobs(
        self, req: Request, status: RequestStatus, before: int, scheduled: int
    ) -> None:
        for g in range(len(self.geometry.groups)):
            self._store_group(req, g, status, before, scheduled)

    def _store_group(
        self, req: Request, g: int, status: RequestStatus, before: int, scheduled: int
    ) -> None:
        geo = self.geometry
        bpc = geo.blocks_per_chunk
        tracker = req.trackers[g]
        offered_before = frozenset(tracker.offered)
        next_before = tracker.next_stored_chunk_idx
        offered = tracker.step(status.value, before, scheduled, len(req.tokens))
        keys = [self.chunk_key_of(req, g, c) for c in offered]
        table = req.tables[g]
        # One GPU block per offered chunk (its last: upstream's _build_store_jobs takes
        # every bpc-th entry of the table); a chunk past the table has no KV to store.
        block_ids = [table[c * bpc + bpc - 1] for c in offered if c * bpc + bpc - 1 < len(table)]
        if self._lifecycle_observers:
            self._emit_lifecycle(StoreOfferEvent(req.rid, self.steps, g, status,
                                                 req.num_computed, tuple(offered)))
        if len(keys) != len(block_ids):
            raise StoreJobError(
                f"store job of {req.rid} group {g}: {len(keys)} offload keys but "
                f"{len(block_ids)} block ids (chunks {offered}, {len(table)} blocks "
                f"allocated): len(offload_keys) == len(offload_block_ids) fails")
        plan = self.manager.prepare_store(keys) if offered else None
        if offered:
            self.log.append(
                f"offer {req.rid} g{g} {offered} -> "
                + (
                    "refused" if plan is None
                    else f"new={len(plan.keys)} evicted={len(plan.evicted)}"
                )
            )
        if self._observers:
            self._emit(StoreEvent(
                req.rid, g, status, before, scheduled, len(req.tokens), req.prompt_len,
                self.config.prompt_only, tuple(offered), offered_before, next_before,
                tracker.next_stored_chunk_idx, req.num_computed,
                refused=bool(offered) and plan is None,
                new=0 if plan is None else len(plan.keys),
                evicted=0 if plan is None else len(plan.evicted),
                junction=req.junction if isinstance(tracker, JunctionStorePath) else 0,
            ))
        if plan is None or not plan.keys:
            return
        slot_of = dict(zip(plan.keys, plan.slots, strict=True))
        # The job's chunks are the keys the manager accepted; each live block is written
        # where the implementation's placement puts it (null pages are placeholders:
        # nothing of theirs is copied).
        stored = [(chunk, key) for chunk, key in zip(offered, keys, strict=True)
                  if key in slot_of]
        laid = store_job_placement(
            self.impl, [chunk for chunk, _ in stored], bpc,
            lambda block: table[block] if block < len(table) and table[block] != NULL_BLOCK
            else None)
        pages: list[tuple[int, int, int]] = [
            (block_id, slot_of[stored[rank][1]], page) for block_id, rank, page in laid]
        failed = self.fail_stores > 0
        if failed:
            self.fail_stores -= 1
        job = TransferJob(self.next_job, "store", g, pages)
        self.next_job += 1
        self.job_chunks[job.job_id] = (
            req.rid, g, tuple(c for c, k in zip(offered, keys, strict=True) if k in slot_of))
        self.queued_store_jobs.append((job, list(plan.keys), failed))

    def chunk_key_of(self, req: Request, g: int, chunk: int) -> ChunkKey:
        tpc = self.geometry.chunk_tokens(self.geometry.groups[g])
        return self._name_key((g, self._prefix_hash(req, (chunk + 1) * tpc)), g, chunk)
