"""A small complete offloading system on real tensors, built from an Implementation.

Contract: every decision is made by the functions of the given
:class:`~kvcontract.impl.bundle.Implementation` (retention, load ranges, windows,
scanners through :func:`kvcontract.impl.scheduler.lookup_complete_chunks`, the store
mask and the final-segment horizon); this module holds only bookkeeping and bytes, so a
variant's defect shows up here exactly as it would in the serving code. Alongside, the
system checks itself against the formal model (:mod:`kvcontract.spec`) and the data
oracles, recording violations instead of raising:

* lookups: the accepted hit equals :func:`kvcontract.spec.multigroup.contract_answer`
  (C2, C3, C4) and every group's load range equals the spec's (C2);
* stores: the chunks offered equal the spec's reachability mask at the spec's horizon
  (C8, C9), are offered at most once and never contain uncommitted slots (C8, C10);
* allocation: the live SWA blocks after a hit are ``Ret(N)`` (C1);
* loads: a "not found"/"not ready" crash is a C2 violation; loaded bytes and a decode
  step of window attention over the restored cache match the oracles (C11).

Step order (DOMAIN.md 7): submit the previous step's store jobs, poll completions and
acknowledge them, schedule waiting requests (lookup, allocate, load), run the forward
pass of running requests (allocation frees out-of-window blocks first), build this
step's store jobs.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from kvcontract.impl.bundle import Implementation
from kvcontract.impl.scheduler import lookup_complete_chunks
from kvcontract.impl.system.offload import (
    ChunkKey,
    ChunkNotFoundError,
    ChunkNotReadyError,
    ChunkState,
    MockedOffloadManager,
    TensorOffloadManager,
    TransferJob,
    TransferWorker,
)
from kvcontract.impl.system.oracle import (
    KVLayout,
    expected_kv,
    expected_query,
    window_decode_attention,
)
from kvcontract.spec import multigroup as spec_mg
from kvcontract.spec import reachability as spec_reach
from kvcontract.spec import retention as spec_ret
from kvcontract.spec.geometry import Geometry, GroupKind, GroupSpec
from kvcontract.spec.lookup import LookupResult
from kvcontract.spec.reachability import RequestStatus

NULL_BLOCK = 0
"""Block id 0 of every pool is the null block: freed (out-of-window) table entries."""


@dataclass(frozen=True)
class Violation:
    clause: str
    kind: str
    message: str
    witness: dict[str, object] = field(default_factory=dict)


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


class Phase(str, enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"
    RUNNING = "running"
    DONE = "done"


@dataclass
class _Tracker:
    next_stored: int = 0
    offered: set[int] = field(default_factory=set)


@dataclass
class Request:
    rid: str
    tokens: list[int]
    prompt_len: int
    max_new_tokens: int
    phase: Phase = Phase.WAITING
    num_computed: int = 0
    tables: dict[int, list[int]] = field(default_factory=dict)
    trackers: dict[int, _Tracker] = field(default_factory=dict)
    load_keys: list[ChunkKey] = field(default_factory=list)
    load_hit: int = 0
    pending_load_jobs: int = 0


class BlockPool:
    """GPU blocks of one group: ``blocks[id]`` is ``[bs, layers, 2, heads, dim]``."""

    def __init__(self, block_tokens: int, layout: KVLayout, device: str, initial: int = 64) -> None:
        self.block_shape = (block_tokens, *layout.token_shape)
        self.blocks = torch.zeros((initial, *self.block_shape), dtype=layout.dtype, device=device)
        self.free: list[int] = list(range(initial - 1, 0, -1))  # id 0 is the null block

    def allocate(self) -> int:
        if not self.free:
            # Grow instead of preempting: block ids stay stable, so tables stay valid.
            old = self.blocks.shape[0]
            extra = torch.zeros_like(self.blocks)
            self.blocks = torch.cat([self.blocks, extra])
            self.free = list(range(2 * old - 1, old - 1, -1))
        return self.free.pop()

    def release(self, block_id: int) -> None:
        if block_id != NULL_BLOCK:
            self.free.append(block_id)


class OffloadSystem:
    """Producers and consumers sharing one offload manager, stepped by a scheduler."""

    def __init__(self, config: SystemConfig) -> None:
        self.config = config
        self.impl = config.impl
        self.geometry = config.geometry
        geo = config.geometry
        self.tph = int(geo.hash_block_size or 1)
        device = config.device
        self.pools = [
            BlockPool(geo.block_tokens(g), config.layout, device) for g in geo.groups
        ]
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
        self.next_job = 0
        self.log: list[str] = []
        self.violations: list[Violation] = []
        self.checks: Counter[str] = Counter()
        self.steps = 0

    # -- helpers ----------------------------------------------------------------------
    @property
    def tensor_backed(self) -> bool:
        return self.config.tensor_backed

    def _sync_worker_tensors(self) -> None:
        if self.tensor_backed:
            self.worker.gpu_blocks = [p.blocks for p in self.pools]

    def chunk_key(self, tokens: list[int], group: int, chunk: int) -> ChunkKey:
        """Chunk ``chunk`` of ``group``: keyed by the prefix up to its end, plus the group."""
        tpc = self.geometry.chunk_tokens(self.geometry.groups[group])
        return (group, hash(tuple(tokens[: (chunk + 1) * tpc])))

    def _violate(self, clause: str, kind: str, message: str, **witness: object) -> None:
        self.violations.append(Violation(clause, kind, message, dict(witness)))

    def _live_first_block(self, group: GroupSpec, num_tokens: int) -> int:
        """First block a group must keep after ``num_tokens`` computed (allocation)."""
        bs = self.geometry.block_tokens(group)
        if group.kind is GroupKind.SLIDING_WINDOW:
            assert group.sliding_window is not None
            first, _ = self.impl.retained_block_range(
                num_tokens, bs, group.sliding_window, group.extra_retained_tokens
            )
            return int(first)
        if group.kind is GroupKind.MAMBA:
            tpc = self.geometry.chunk_tokens(group)
            return int(max(0, (num_tokens // tpc - 1) * self.geometry.blocks_per_chunk))
        return 0

    # -- program operations -------------------------------------------------------------
    def add_request(self, rid: str, tokens: list[int], max_new_tokens: int = 2) -> None:
        if rid in self.requests:
            raise ValueError(f"request {rid} exists")
        self.requests[rid] = Request(rid, list(tokens), len(tokens), max_new_tokens)
        for g in range(len(self.geometry.groups)):
            self.requests[rid].tables[g] = []
            self.requests[rid].trackers[g] = _Tracker()

    def install_chunk(self, tokens: list[int], group: int, chunk: int, state: ChunkState) -> None:
        """Fixture: put a chunk into ``state``; a ready chunk gets the producer's bytes."""
        key = self.chunk_key(tokens, group, chunk)
        slot = self.manager.force_state(key, state)
        if slot is not None and isinstance(self.manager, TensorOffloadManager):
            spec = self.geometry.groups[group]
            tpc = self.geometry.chunk_tokens(spec)
            positions = torch.arange(chunk * tpc, (chunk + 1) * tpc)
            ids = torch.tensor(tokens[chunk * tpc : (chunk + 1) * tpc])
            kv = expected_kv(self.config.layout, group, positions, ids)
            target = self.manager.chunks[group][slot]
            target.copy_(kv.view(target.shape))

    def mark_loading(self, tokens: list[int], group: int, chunk: int) -> None:
        """Fixture: another request is loading this chunk."""
        self.loading_keys[self.chunk_key(tokens, group, chunk)] += 1

    def fail_next_store(self) -> None:
        self.fail_stores += 1

    def finish(self, rid: str) -> None:
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
        self.log.append(f"preempt {rid}")

    def _end(self, rid: str, status: RequestStatus) -> None:
        req = self.requests.get(rid)
        if req is None or req.phase in (Phase.DONE, Phase.LOADING):
            return
        if req.phase is Phase.RUNNING:
            self._build_store_jobs(req, status, 0)
        self._flush_store_jobs()
        self._free(req)
        req.phase = Phase.DONE
        self.log.append(f"{status.value} {rid} at {req.num_computed}")

    def _free(self, req: Request) -> None:
        for g, table in req.tables.items():
            for block_id in table:
                self.pools[g].release(block_id)
            req.tables[g] = []

    # -- the step -------------------------------------------------------------------------
    def step(self, token_budget: int) -> None:
        self.steps += 1
        self._flush_store_jobs()
        for job in self.worker.poll():
            self._acknowledge(job)
        for req in list(self.requests.values()):
            if req.phase is Phase.WAITING:
                self._schedule_waiting(req)
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
            self.worker.submit(job)
            self.in_flight[job.job_id] = ("store", keys, failed, "")
        self.queued_store_jobs = []

    def _acknowledge(self, job: TransferJob) -> None:
        direction, keys, failed, rid = self.in_flight.pop(job.job_id)
        if direction == "store":
            self.manager.complete_store(keys, success=not failed)
            self.log.append(f"store-complete job{job.job_id} ok={not failed}")
            return
        self.manager.complete_load(keys)
        for key in keys:
            self.loading_keys[key] -= 1
            if self.loading_keys[key] <= 0:
                del self.loading_keys[key]
        req = self.requests[rid]
        req.pending_load_jobs -= 1
        if req.pending_load_jobs == 0:
            req.num_computed = req.load_hit
            req.phase = Phase.RUNNING
            self.log.append(f"load-complete {rid} at {req.load_hit}")
            if self.tensor_backed:
                self._check_restored(req)

    # -- lookup and load ------------------------------------------------------------------
    def _schedule_waiting(self, req: Request) -> None:
        geo = self.geometry
        num_tokens = len(req.tokens)
        keys = {
            (g, k): self.chunk_key(req.tokens, g, k)
            for g, spec in enumerate(geo.groups)
            for k in range(num_tokens // geo.chunk_tokens(spec))
        }

        def lookup(g: int, k: int) -> LookupResult:
            return self.manager.lookup(keys[(g, k)])

        def is_loading(g: int, k: int) -> bool:
            key = keys.get((g, k))
            return key is not None and self.loading_keys[key] > 0

        outcome = lookup_complete_chunks(self.impl, geo, num_tokens, 0, lookup, is_loading)
        self._check_lookup(req, keys, outcome.hit_tokens, outcome.load_ranges)
        if outcome.hit_tokens is None:
            self.log.append(f"lookup {req.rid} defer")
            return
        hit = outcome.hit_tokens
        ranges = {g: outcome.load_ranges[g] for g in sorted(outcome.load_ranges)}
        self.log.append(f"lookup {req.rid} hit={hit} loads={ranges}")
        if hit <= 0:
            req.phase = Phase.RUNNING
            return
        load_keys = [keys[(g, k)] for g, (lo, hi) in ranges.items() for k in range(lo, hi)]
        try:
            slots = self.manager.prepare_load(load_keys)
        except (ChunkNotFoundError, ChunkNotReadyError) as exc:
            self._violate("C2", "crash", str(exc), request=req.rid, hit=hit, loads=str(ranges))
            self.log.append(f"crash {req.rid}: {exc}")
            req.phase = Phase.DONE
            return
        self.checks["C2"] += 1
        for g, spec in enumerate(geo.groups):
            # Loaded chunks count as stored: the consumer never re-offers them.
            loaded_chunks = hit // geo.chunk_tokens(spec)
            tracker = req.trackers[g]
            tracker.offered.update(range(loaded_chunks))
            tracker.next_stored = max(tracker.next_stored, loaded_chunks)
        slot_of = dict(zip(load_keys, slots, strict=True))
        self._allocate(req, hit, hit)
        self._check_retention(req, hit)
        req.load_keys = load_keys
        req.load_hit = hit
        req.phase = Phase.LOADING
        self._sync_worker_tensors()
        bpc = geo.blocks_per_chunk
        for g, (lo, hi) in ranges.items():
            table = req.tables[g]
            pages: list[tuple[int, int, int]] = []
            group_keys: list[ChunkKey] = []
            for k in range(lo, hi):
                key = keys[(g, k)]
                group_keys.append(key)
                self.loading_keys[key] += 1
                for page in range(bpc):
                    block = k * bpc + page
                    # Partial first chunks skip their freed (null) pages.
                    if block < len(table) and table[block] != NULL_BLOCK:
                        pages.append((table[block], slot_of[key], page))
            job = TransferJob(self.next_job, "load", g, pages)
            self.next_job += 1
            self.in_flight[job.job_id] = ("load", group_keys, False, req.rid)
            req.pending_load_jobs += 1
            self.worker.submit(job)
        if req.pending_load_jobs == 0:
            req.num_computed = hit
            req.phase = Phase.RUNNING

    def _check_lookup(
        self,
        req: Request,
        keys: dict[tuple[int, int], ChunkKey],
        hit: int | None,
        load_ranges: dict[int, tuple[int, int]],
    ) -> None:
        geo = self.geometry
        num_tokens = len(req.tokens)
        states = {
            g: [self.manager.lookup(keys[(g, k)]) for k in range(num_tokens // geo.chunk_tokens(s))]
            for g, s in enumerate(geo.groups)
        }
        if any(LookupResult.RETRY in row for row in states.values()):
            return  # an asynchronous lookup in flight may defer anything: nothing to compare
        answer = spec_mg.contract_answer(geo, num_tokens, 0, states)
        expected: int | None
        expected_ranges: dict[int, tuple[int, int]] = {}
        if answer.best_present is None:
            expected = 0
        elif answer.pending_in_window:
            expected = None
        else:
            expected = answer.best_present
            expected_ranges = {
                g: spec_mg.load_range(geo, s, expected, 0) for g, s in enumerate(geo.groups)
            }
            if any(
                self.loading_keys[keys[(g, k)]] > 0
                for g, (lo, hi) in expected_ranges.items()
                for k in range(lo, hi)
            ):
                expected = None
        for clause in ("C3", "C4"):
            self.checks[clause] += 1
        if any(s.eagle for s in geo.groups):
            self.checks["C5"] += 1
        if hit != expected:
            if hit is None:
                clause = "C3"
            elif expected is None or hit > expected:
                clause = "C2"
            else:
                clause = "C4"
            self._violate(
                clause,
                "lookup",
                f"request {req.rid}: system accepted {hit}, the contract answers {expected}",
                request=req.rid, system=hit, spec=expected,
                states={g: [int(r) for r in row] for g, row in states.items()},
            )
            return
        if hit and load_ranges != expected_ranges:
            self._violate(
                "C2", "load-set",
                f"request {req.rid}: load ranges {load_ranges}, the spec says {expected_ranges}",
                request=req.rid,
            )

    def _allocate(self, req: Request, computed_for_freeing: int, target_tokens: int) -> None:
        """Free out-of-window blocks (given the computed count), allocate up to target."""
        for g, spec in enumerate(self.geometry.groups):
            table = req.tables[g]
            bs = self.geometry.block_tokens(spec)
            first = self._live_first_block(spec, computed_for_freeing)
            for b in range(min(first, len(table))):
                if table[b] != NULL_BLOCK:
                    self.pools[g].release(table[b])
                    table[b] = NULL_BLOCK
            end = -(-target_tokens // bs)
            while len(table) < end:
                table.append(NULL_BLOCK if len(table) < first else self.pools[g].allocate())

    def _check_retention(self, req: Request, hit: int) -> None:
        for g, spec in enumerate(self.geometry.groups):
            if spec.kind is not GroupKind.SLIDING_WINDOW:
                continue
            assert spec.sliding_window is not None
            bs = self.geometry.block_tokens(spec)
            first, end = spec_ret.retained_block_range(
                hit, bs, spec.sliding_window, spec.extra_retained_tokens
            )
            live = [b for b, block_id in enumerate(req.tables[g]) if block_id != NULL_BLOCK]
            self.checks["C1"] += 1
            if live != list(range(int(first), int(end))):
                self._violate(
                    "C1", "retention",
                    f"request {req.rid} group {g}: live blocks {live[:3]}..{live[-3:]} "
                    f"!= Ret({hit}) = [{first}, {end})",
                    request=req.rid, group=g,
                )

    # -- oracles ----------------------------------------------------------------------------
    def _positions_kv(self, g: int, req: Request, lo: int, hi: int) -> torch.Tensor:
        pool = self.pools[g]
        bs = pool.block_shape[0]
        positions = torch.arange(lo, hi)
        ids = torch.tensor(req.tables[g], dtype=torch.int64)[positions // bs]
        offsets = positions % bs
        device = pool.blocks.device
        return pool.blocks[ids.to(device), offsets.to(device)]

    def _check_restored(self, req: Request) -> None:
        hit = req.load_hit
        layout = self.config.layout
        for g, spec in enumerate(self.geometry.groups):
            bs = self.geometry.block_tokens(spec)
            table = req.tables[g]
            first_block = next((b for b, i in enumerate(table) if i != NULL_BLOCK), len(table))
            lo = first_block * bs
            if spec.kind is GroupKind.MAMBA:
                lo = max(lo, hit - bs)
            if lo >= hit:
                continue
            device = self.pools[g].blocks.device
            got = self._positions_kv(g, req, lo, hit)
            want = expected_kv(
                layout, g, torch.arange(lo, hit), torch.tensor(req.tokens[lo:hit]), device
            )
            self.checks["C11"] += 1
            if not torch.equal(got, want):
                bad = (got != want).reshape(hit - lo, -1).any(dim=1).nonzero()
                first_bad = lo + int(bad[0, 0]) if bad.numel() else lo
                self._violate(
                    "C11", "bytes",
                    f"request {req.rid} group {g}: restored KV differs from the producer's "
                    f"at position {first_bad} (hit {hit})",
                    request=req.rid, group=g, position=first_bad,
                )
                continue
            if spec.kind is GroupKind.MAMBA or hit >= len(req.tokens):
                continue
            window = spec.sliding_window
            attend_lo = 0 if window is None else max(0, hit - window + 1)
            attend_lo = max(attend_lo, lo)
            positions = torch.arange(attend_lo, hit + 1)
            token_ids = torch.tensor(req.tokens[attend_lo : hit + 1])
            fresh = expected_kv(layout, g, positions, token_ids, device)
            restored = torch.cat([self._positions_kv(g, req, attend_lo, hit), fresh[-1:]])
            query = expected_query(layout, g, hit, req.tokens[hit], device)
            out_restored = window_decode_attention(
                query, restored[:, 0, 0], restored[:, 0, 1], positions.to(device), hit, window
            )
            out_fresh = window_decode_attention(
                query, fresh[:, 0, 0], fresh[:, 0, 1], positions.to(device), hit, window
            )
            self.checks["C11"] += 1
            if not torch.equal(out_restored, out_fresh):
                self._violate(
                    "C11", "attention",
                    f"request {req.rid} group {g}: decode attention over the restored cache "
                    f"differs from a recomputed cache (hit {hit})",
                    request=req.rid, group=g,
                )

    # -- forward and stores ---------------------------------------------------------------
    def _forward(self, req: Request, scheduled: int) -> None:
        before = req.num_computed
        after = before + scheduled
        self._allocate(req, before, after)
        if self.tensor_backed:
            for g in range(len(self.geometry.groups)):
                pool = self.pools[g]
                bs = pool.block_shape[0]
                device = pool.blocks.device
                positions = torch.arange(before, after)
                ids = torch.tensor(req.tables[g], dtype=torch.int64)[positions // bs]
                kv = expected_kv(
                    self.config.layout, g, positions, torch.tensor(req.tokens[before:after]),
                    device,
                )
                pool.blocks[ids.to(device), (positions % bs).to(device)] = kv
        req.num_computed = after
        status = RequestStatus.PREFILLING if before < req.prompt_len else RequestStatus.DECODING
        self._build_store_jobs(req, status, scheduled, computed_before=before)
        if after == len(req.tokens):
            generated = len(req.tokens) - req.prompt_len
            if generated >= req.max_new_tokens:
                self.finish(req.rid)
                return
            req.tokens.append(hash((req.rid, len(req.tokens))) % self.config.vocab)

    def _offers(
        self,
        req: Request,
        g: int,
        status: RequestStatus,
        storable: int,
        reachable: Callable[[int, int], bool],
    ) -> list[int]:
        """Chunks to offer given a block predicate ``reachable(block, final_end_block)``."""
        tracker = req.trackers[g]
        candidates = list(range(tracker.next_stored, storable))
        if status in (RequestStatus.FINISHED, RequestStatus.ABORTED):
            candidates = list(range(0, storable))
        bpc = self.geometry.blocks_per_chunk
        table = req.tables[g]
        chosen: list[int] = []
        for chunk in candidates:
            if chunk in tracker.offered:
                continue
            marked = [b for b in range(chunk * bpc, (chunk + 1) * bpc) if reachable(b, chunk)]
            if not marked:
                continue
            # C10: a marked block that is null (freed) makes the chunk unstorable.
            if any(b >= len(table) or table[b] == NULL_BLOCK for b in marked):
                continue
            chosen.append(chunk)
        return chosen

    def _build_store_jobs(
        self,
        req: Request,
        status: RequestStatus,
        scheduled: int,
        computed_before: int | None = None,
    ) -> None:
        geo = self.geometry
        before = req.num_computed if computed_before is None else computed_before
        tokens = int(
            spec_reach.stored_token_count(
                status, before, scheduled, len(req.tokens), req.prompt_len,
                None, self.config.prompt_only,
            )
        )
        for g, spec in enumerate(geo.groups):
            self._store_group(req, g, spec, status, tokens)

    def _store_group(
        self, req: Request, g: int, spec: GroupSpec, status: RequestStatus, tokens: int
    ) -> None:
        geo = self.geometry
        align = geo.alignment_tokens
        tpc = geo.chunk_tokens(spec)
        bs = geo.block_tokens(spec)
        bpc = geo.blocks_per_chunk
        storable = int(spec_reach.storable_chunks(tokens, tpc, spec.eagle, status))
        prompt_horizon = req.prompt_len // tpc
        tracker = req.trackers[g]
        if spec.kind is not GroupKind.SLIDING_WINDOW:
            offered = self._offers(req, g, status, storable, lambda b, c: True)
            expected = offered
        else:
            assert spec.sliding_window is not None
            sw, extra = spec.sliding_window, spec.extra_retained_tokens
            replay: tuple[int, ...] = ()
            if geo.retention_interval is not None and align is not None:
                replay = (
                    int(spec_reach.replay_boundary_block(req.prompt_len - 1, align, bs)),
                )
            final_impl = self.impl.store_final_segment_end(
                status.value, prompt_horizon, storable
            )

            def impl_reachable(block: int, chunk: int) -> bool:
                return bool(
                    self.impl.is_block_reachable(
                        block, align, bs, sw, extra, spec.eagle, geo.retention_interval,
                        final_impl * bpc, replay,
                    )
                )

            offered = self._offers(req, g, status, storable, impl_reachable)
            final_spec = spec_reach.final_segment_end_chunk(status, prompt_horizon, storable)
            rule = spec_reach.mask_rule(align, bs, geo.retention_interval)
            need = spec_reach.store_need_blocks(sw, extra, bs, spec.eagle)

            def spec_reachable(block: int, chunk: int) -> bool:
                return bool(
                    spec_reach.block_is_reachable(
                        block, rule, need, spec.eagle,
                        None if final_spec is None else int(final_spec) * bpc, replay,
                    )
                )

            expected = self._offers(req, g, status, storable, spec_reachable)
        self.checks["C8"] += 1
        self.checks["C9"] += 1
        if offered != expected:
            extra_chunks = sorted(set(offered) - set(expected))
            missing_chunks = sorted(set(expected) - set(offered))
            self._violate(
                "C9" if extra_chunks and status is RequestStatus.PREFILLING else
                ("C8" if extra_chunks else "C7"),
                "store",
                f"request {req.rid} group {g} ({status.value}, {tokens} tokens): "
                f"offered {offered}, the spec's mask says {expected} "
                f"(extra {extra_chunks}, missing {missing_chunks})",
                request=req.rid, group=g, offered=offered, spec=expected,
            )
        for chunk in offered:
            self.checks["C10"] += 1
            if (chunk + 1) * tpc > req.num_computed:
                self._violate(
                    "C10", "store",
                    f"request {req.rid} group {g}: chunk {chunk} holds uncommitted slots",
                    request=req.rid, group=g,
                )
        tracker.offered.update(offered)
        # next_stored_chunk_idx never moves back.
        tracker.next_stored = max(tracker.next_stored, storable)
        if not offered:
            return
        keys = [self.chunk_key(req.tokens, g, c) for c in offered]
        plan = self.manager.prepare_store(keys)
        self.log.append(
            f"offer {req.rid} g{g} {offered} -> "
            + (
                "refused" if plan is None
                else f"new={len(plan.keys)} evicted={len(plan.evicted)}"
            )
        )
        if plan is None or not plan.keys:
            return
        slot_of = dict(zip(plan.keys, plan.slots, strict=True))
        pages: list[tuple[int, int, int]] = []
        for chunk, key in zip(offered, keys, strict=True):
            if key not in slot_of:
                continue
            for page in range(bpc):
                block = chunk * bpc + page
                if block < len(req.tables[g]) and req.tables[g][block] != NULL_BLOCK:
                    pages.append((req.tables[g][block], slot_of[key], page))
        failed = self.fail_stores > 0
        if failed:
            self.fail_stores -= 1
        job = TransferJob(self.next_job, "store", g, pages)
        self.next_job += 1
        self.queued_store_jobs.append((job, list(plan.keys), failed))
