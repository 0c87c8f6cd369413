"""The offload manager state machine and the byte-moving worker (docs/CONTRACT.md 6, 7).

Contract of :class:`ChunkBook` (the bookkeeping both managers share)::

    absent --prepare_store--> pending --complete_store(ok)--> ready(ref 0)
    ready(ref 0) <--> ready(ref > 0) via prepare_load / complete_load
    pending --complete_store(fail)--> absent
    ready(ref 0) --evicted (LRU) by prepare_store--> absent
    lookup: absent -> MISS, pending -> HIT_PENDING, ready -> HIT

``prepare_store`` skips keys already present, evicts idle (ready, ref 0) chunks in LRU
order, and returns None when it cannot make room. ``prepare_load`` raises
:class:`ChunkNotFoundError` ("Chunk ... not found in cache") or
:class:`ChunkNotReadyError` ("Chunk ... is not ready for reading") as upstream does.

:class:`MockedOffloadManager` is the bookkeeping alone (optionally with scripted lookup
answers); :class:`TensorOffloadManager` adds pinned CPU chunk tensors that a
:class:`TransferWorker` fills and reads. Workers complete jobs in FIFO order per
direction after a deterministic delay of ``delay_steps`` polls; on CUDA the copy runs on
a side stream that waits for the compute stream, and the job is complete only once its
end event has completed too (at its deadline the worker waits for it, so decisions do
not depend on timing and mocked and real managers stay in lockstep).
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from kvcontract.vocabulary import LookupResult

ChunkKey = Hashable


class ChunkState(str, enum.Enum):
    ABSENT = "absent"
    PENDING = "pending"
    READY = "ready"


class ChunkNotFoundError(RuntimeError):
    """prepare_load of an absent chunk (upstream: an assertion in the CPU manager)."""


class ChunkNotReadyError(RuntimeError):
    """prepare_load of a chunk whose store has not completed."""


@dataclass
class _Entry:
    slot: int
    ready: bool = False
    ref_count: int = 0


@dataclass(frozen=True)
class StorePlan:
    """What ``prepare_store`` decided: new keys and their slots, and evicted keys."""

    keys: tuple[ChunkKey, ...]
    slots: tuple[int, ...]
    evicted: tuple[ChunkKey, ...]


class ChunkBook:
    """Bookkeeping of CPU chunk slots: states, reference counts, LRU order."""

    def __init__(self, capacity_chunks: int) -> None:
        if capacity_chunks < 1:
            raise ValueError("the offload manager needs at least one chunk slot")
        self.capacity = capacity_chunks
        self.reset()

    def reset(self) -> None:
        # OrderedDict order is the LRU order: first = least recently used.
        self._entries: OrderedDict[ChunkKey, _Entry] = OrderedDict()
        self._free_slots: list[int] = list(range(self.capacity - 1, -1, -1))

    # -- queries --------------------------------------------------------------------
    def state(self, key: ChunkKey) -> ChunkState:
        entry = self._entries.get(key)
        if entry is None:
            return ChunkState.ABSENT
        return ChunkState.READY if entry.ready else ChunkState.PENDING

    def lookup(self, key: ChunkKey) -> LookupResult:
        state = self.state(key)
        if state is ChunkState.ABSENT:
            return LookupResult.MISS
        return LookupResult.HIT if state is ChunkState.READY else LookupResult.HIT_PENDING

    def slot(self, key: ChunkKey) -> int:
        return self._entries[key].slot

    def ref_count(self, key: ChunkKey) -> int:
        entry = self._entries.get(key)
        return 0 if entry is None else entry.ref_count

    def keys(self) -> list[ChunkKey]:
        return list(self._entries)

    # -- stores ---------------------------------------------------------------------
    def prepare_store(self, keys: Sequence[ChunkKey]) -> StorePlan | None:
        new_keys: list[ChunkKey] = []
        for key in keys:
            if key not in self._entries and key not in new_keys:
                new_keys.append(key)
        shortfall = len(new_keys) - len(self._free_slots)
        victims: list[ChunkKey] = []
        if shortfall > 0:
            for key, entry in self._entries.items():
                if len(victims) == shortfall:
                    break
                if entry.ready and entry.ref_count == 0:
                    victims.append(key)
            if len(victims) < shortfall:
                return None  # cannot make room: store nothing of this job
        for key in victims:
            self._free_slots.append(self._entries.pop(key).slot)
        slots: list[int] = []
        for key in new_keys:
            slot = self._free_slots.pop()
            self._entries[key] = _Entry(slot=slot)
            slots.append(slot)
        return StorePlan(tuple(new_keys), tuple(slots), tuple(victims))

    def complete_store(self, keys: Iterable[ChunkKey], success: bool) -> None:
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or entry.ready:
                continue
            if success:
                entry.ready = True
                self._entries.move_to_end(key)
            else:
                self._free_slots.append(self._entries.pop(key).slot)

    # -- loads ----------------------------------------------------------------------
    def prepare_load(self, keys: Sequence[ChunkKey]) -> list[int]:
        for key in keys:
            entry = self._entries.get(key)
            if entry is None:
                raise ChunkNotFoundError(f"Chunk {key!r} not found in cache")
            if not entry.ready:
                raise ChunkNotReadyError(f"Chunk {key!r} is not ready for reading")
        slots: list[int] = []
        for key in keys:
            entry = self._entries[key]
            entry.ref_count += 1
            self._entries.move_to_end(key)
            slots.append(entry.slot)
        return slots

    def complete_load(self, keys: Iterable[ChunkKey]) -> None:
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.ref_count > 0:
                entry.ref_count -= 1

    # -- lifecycle (C14, C15) ---------------------------------------------------------
    def drop(self, keys: Iterable[ChunkKey]) -> list[ChunkKey]:
        """Forget the ready, unreferenced ``keys`` (a failed load's chunks: their bytes
        are not trusted, so a later lookup answers MISS instead of loading them again);
        returns the keys dropped."""
        dropped: list[ChunkKey] = []
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.ready and entry.ref_count == 0:
                self._free_slots.append(self._entries.pop(key).slot)
                dropped.append(key)
        return dropped

    def drop_idle(self) -> list[ChunkKey]:
        """Forget every ready, unreferenced chunk (a prefix-cache reset); pending chunks
        and chunks being loaded stay, so no job in flight loses its slot."""
        return self.drop(list(self._entries))

    def pending_keys(self) -> list[ChunkKey]:
        return [k for k, e in self._entries.items() if not e.ready]

    def referenced_keys(self) -> list[ChunkKey]:
        return [k for k, e in self._entries.items() if e.ref_count > 0]

    # -- fixtures -------------------------------------------------------------------
    def force_state(self, key: ChunkKey, state: ChunkState) -> int | None:
        """Put a key into a state directly (test scenarios); returns its slot."""
        entry = self._entries.get(key)
        if state is ChunkState.ABSENT:
            if entry is not None:
                self._free_slots.append(self._entries.pop(key).slot)
            return None
        if entry is None:
            plan = self.prepare_store([key])
            if plan is None:
                raise RuntimeError("no room to install a chunk")
            entry = self._entries[key]
        entry.ready = state is ChunkState.READY
        return entry.slot


class MockedOffloadManager(ChunkBook):
    """Bookkeeping only; ``script`` overrides the lookup answer of chosen keys."""

    is_tensor_backed = False

    def __init__(
        self, capacity_chunks: int, script: Mapping[ChunkKey, LookupResult] | None = None
    ) -> None:
        super().__init__(capacity_chunks)
        self.script: dict[ChunkKey, LookupResult] = dict(script or {})

    def lookup(self, key: ChunkKey) -> LookupResult:
        if key in self.script:
            return self.script[key]
        return super().lookup(key)


class TensorOffloadManager(ChunkBook):
    """Bookkeeping plus CPU chunk tensors: ``chunks[g][slot]`` is ``[bpc, block...]``."""

    is_tensor_backed = True

    def __init__(
        self,
        capacity_chunks: int,
        block_shapes: Sequence[tuple[int, ...]],
        blocks_per_chunk: int,
        dtype: torch.dtype,
        pin_memory: bool,
    ) -> None:
        super().__init__(capacity_chunks)
        # One slot index space shared by all groups (a key names its group); each
        # group gets its own tensor because block sizes differ between groups.
        self.chunks: list[torch.Tensor] = [
            torch.zeros(
                (capacity_chunks, blocks_per_chunk, *shape), dtype=dtype, pin_memory=pin_memory
            )
            for shape in block_shapes
        ]


# -- worker ---------------------------------------------------------------------------
@dataclass
class TransferJob:
    """One batched copy: pages ``(gpu block id, slot, page within the chunk)``."""

    job_id: int
    direction: str  # "store" (GPU -> CPU) or "load" (CPU -> GPU)
    group: int
    pages: list[tuple[int, int, int]]
    deadline: int = 0
    event: object | None = None


@dataclass
class TransferWorker:
    """Moves pages between GPU block tensors and CPU chunk tensors.

    ``gpu_blocks[g]`` is ``[num_blocks, *block_shape]``; with ``cpu_chunks`` None the
    worker is the mocked one (bookkeeping of jobs and deadlines only).
    """

    gpu_blocks: list[torch.Tensor] | None
    cpu_chunks: list[torch.Tensor] | None
    delay_steps: int = 1
    now: int = 0
    queues: dict[str, deque[TransferJob]] = field(
        default_factory=lambda: {"store": deque(), "load": deque()}
    )
    streams: dict[str, object] = field(default_factory=dict)
    stalled: list[TransferJob] = field(default_factory=list)
    """Jobs submitted that never complete (a stalled write: :meth:`submit` with
    ``stall``); kept apart so later jobs of their direction still complete."""

    @property
    def on_cuda(self) -> bool:
        return self.gpu_blocks is not None and self.gpu_blocks[0].is_cuda

    def submit(self, job: TransferJob, stall: bool = False) -> None:
        if stall:
            self.stalled.append(job)  # never copied, never completed
            return
        job.deadline = self.now + self.delay_steps
        if self.gpu_blocks is not None and self.cpu_chunks is not None and job.pages:
            self._copy(job)
        self.queues[job.direction].append(job)

    def _copy(self, job: TransferJob) -> None:
        assert self.gpu_blocks is not None and self.cpu_chunks is not None
        gpu = self.gpu_blocks[job.group]
        cpu = self.cpu_chunks[job.group]
        device = gpu.device
        ids = [p[0] for p in job.pages]
        # CPU pages as one flat index space: page p of slot s is row s * bpc + p.
        bpc = cpu.shape[1]
        rows = [slot * bpc + page for _, slot, page in job.pages]
        if self.on_cuda:
            stream = self.streams.get(job.direction)
            if stream is None:
                stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
                self.streams[job.direction] = stream
            assert isinstance(stream, torch.cuda.Stream)
            # Stores must see the forward pass's writes; loads must follow any zeroing
            # of their destination: both wait for the compute stream. One stream per
            # direction keeps jobs of a direction in FIFO order.
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                # Created on the side stream, so the allocator never hands the index
                # tensor's memory to the compute stream while the copy still reads it.
                block_ids = torch.tensor(ids, device=device)
                self._copy_pages(gpu, cpu, block_ids, rows, job.direction)
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(stream)
            job.event = event
        else:
            self._copy_pages(gpu, cpu, torch.tensor(ids), rows, job.direction)

    @staticmethod
    def _runs(rows: list[int]) -> list[tuple[int, int, int]]:
        """Maximal runs of consecutive rows: ``(position in the job, first row, length)``."""
        runs: list[tuple[int, int, int]] = []
        for i, row in enumerate(rows):
            if runs and runs[-1][1] + runs[-1][2] == row:
                pos, first, length = runs[-1]
                runs[-1] = (pos, first, length + 1)
            else:
                runs.append((i, row, 1))
        return runs

    @classmethod
    def _copy_pages(
        cls, gpu: torch.Tensor, cpu: torch.Tensor, block_ids: torch.Tensor, rows: list[int],
        direction: str,
    ) -> None:
        """One batched copy per job: a gather on the GPU side, then one host copy per run
        of consecutive CPU pages (a single ``index_copy_``/``index_select`` on CPU)."""
        flat = cpu.view(-1, *cpu.shape[2:])
        if not gpu.is_cuda:
            index = torch.tensor(rows)
            if direction == "store":
                flat.index_copy_(0, index, gpu.index_select(0, block_ids))
            else:
                gpu.index_copy_(0, block_ids, flat.index_select(0, index))
            return
        # Device <-> pinned host: contiguous runs keep each transfer a plain DMA copy.
        runs = cls._runs(rows)
        if direction == "store":
            gathered = gpu.index_select(0, block_ids)
            for pos, first, length in runs:
                flat[first : first + length].copy_(gathered[pos : pos + length], non_blocking=True)
        else:
            parts = [flat[first : first + length].to(gpu.device, non_blocking=True)
                     for _, first, length in runs]
            source = parts[0] if len(parts) == 1 else torch.cat(parts)
            gpu.index_copy_(0, block_ids, source)

    def fence_compute(self) -> None:
        """Make the compute stream wait for every store job still in flight.

        A store reads GPU blocks that the scheduler may free (finish, abort, window
        freeing) and hand to another request before the job is acknowledged; the next
        forward pass must not overwrite them while the side stream still reads. The wait
        is on the GPU (``wait_event``): the host does not block. No-op on CPU, where a
        copy is complete when ``submit`` returns.
        """
        if not self.on_cuda:
            return
        assert self.gpu_blocks is not None
        compute = torch.cuda.current_stream(self.gpu_blocks[0].device)
        for job in self.queues["store"]:
            if job.event is not None:
                compute.wait_event(job.event)  # type: ignore[arg-type]

    def poll(self) -> list[TransferJob]:
        """Advance one step and return the jobs completed, oldest first per direction."""
        self.now += 1
        done: list[TransferJob] = []
        for direction in ("store", "load"):
            queue = self.queues[direction]
            while queue and queue[0].deadline <= self.now:
                job = queue[0]
                event = job.event
                if event is not None:
                    assert isinstance(event, torch.cuda.Event)
                    if not event.query():  # type: ignore[no-untyped-call]
                        event.synchronize()  # deadline reached: keep lockstep determinism
                done.append(queue.popleft())
        return done

    def cancel(self, job_id: int) -> TransferJob | None:
        """Take a job that has not completed out of the worker (its request was aborted):
        it never completes; None if no such job is in flight."""
        for queue in (*self.queues.values(), self.stalled):
            for job in queue:
                if job.job_id == job_id:
                    queue.remove(job)
                    return job
        return None

    def drain(self) -> list[TransferJob]:
        """Complete everything in flight (end of a program)."""
        done: list[TransferJob] = []
        while any(self.queues.values()):
            done.extend(self.poll())
        return done
