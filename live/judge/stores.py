"""A store case judged on vLLM's own engine, with every store job's data traced.

A :class:`~kvcontract.spec.properties.store.StoreCase` (a prompt, a chunked-prefill
schedule, decode steps and a finish, or an abort; optionally a cached prefix, a
``max_offload_tokens`` cap, decoded tokens stored too) becomes a request on vLLM's real
scheduler: each prefill step runs with the step's tokens as the scheduler's budget
(``Scheduler.max_num_scheduled_tokens``, read at every ``schedule()``), decode steps
with one token, the request finishes by sampling its last token or is aborted by
``finish_requests``, and one more step lets the connector build its final stores. A
cached prefix (``start_hit``) is the prefix's chunks put into vLLM's offload manager
beforehand, so the request's lookup loads them. A case vLLM schedules otherwise is
:class:`~kvcontract.live.judge.lookups.NotRealized`, never forced.

The observation is the store family's own :class:`~kvcontract.spec.properties.store.
StoreRun`: per geometry group and step, the chunks the connector offered to its
manager's ``prepare_store``, and ``next_stored_chunk_idx`` right after each
``_build_store_jobs``. Its ``integrity`` lists what the data trace found wrong.

**The data trace (C10 on the engine).** No model runs, so no byte moves; what each GPU
block holds is traced instead. A forward pass writes the tokens a step scheduled into
the blocks of the request's block table, block by block (each block's content is the
request's token chain up to its last written slot: two requests with the same prefix
write the same content, as a prefix-cache hit assumes). A store job's
``GPULoadStoreSpec`` (block ids, ``group_sizes``, ``block_indices``) is laid into its
CPU chunks the way vLLM's CPU worker lays it: per group, the blocks in order into the
job's chunks of that group (its keys, in the manager's order), skipping
``block_indices[g] mod blocks_per_chunk`` slots of the first. The worker copies a job
after the forward pass of the step that built it (before it, when the same step flushes
the job), and the copy may run into the next forward passes until the worker reports
the job done, unless a step flushes it first. So a job is corrupt when:

* a slot receives a block whose content at copy time is not the request's chain at
  that slot's position (a freed block reused, a null block, a block of another
  position, a block not fully written);
* a forward pass writes a block of the job while the job may still be copying (neither
  reported nor flushed);
* a slot the contract's mask marks (docs/CONTRACT.md 5: what a later load reads)
  receives no block.

A wrong block in a slot the mask does not mark is graded waste, not corruption: no load
reads that slot (as none reads a null placeholder there), the bytes are copied for
nothing. Each finding says which it is (``DataTrace.marks``: the mask at the horizon of
the step that built the job).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from kvcontract.impl.scheduler import StoreTracker
from kvcontract.live.judge.engines import (
    EnginePool,
    JudgeEngine,
    NotBuilt,
    driven,
    release_request,
)
from kvcontract.live.judge.lookups import NotRealized
from kvcontract.live.trace import TraceRequest
from kvcontract.spec.geometry import GroupKind
from kvcontract.spec.properties.base import Violation
from kvcontract.spec.properties.end_to_end import producer_end
from kvcontract.spec.properties.store import (
    StoreCase,
    StoreRun,
    StoreStep,
    schedule_steps,
    step_bounds,
)
from kvcontract.spec.reachability import group_marked_blocks
from kvcontract.vocabulary import Impact, RequestStatus


@dataclass
class EngineOffers:
    """One geometry group's offers to ``prepare_store``, step by step (what the store
    judges read of a producer's tracker)."""

    group_index: int
    offers: list[list[int]] = field(default_factory=list)
    placements: list[list[tuple[int, int, int]]] = field(default_factory=list)
    """Per step, ``(chunk, page, block)`` of every live block the step's store jobs
    write, laid as vLLM's CPU worker lays a job (``block``: the block's index in the
    request, from the connector's own block table; -1 when it names no block there)."""


# -- the data trace --------------------------------------------------------------------------
Content = tuple[int, int]
"""What a block holds: (chain digest of the request's tokens up to the block's last
written slot, slots written)."""

Marks = Callable[[int, int], Sequence[int]]
"""Per geometry group and chunk, the blocks the contract's mask marks (docs/CONTRACT.md
5: the slots a load at a reachable boundary reads), at the horizon of the step that
built a job."""


@dataclass
class _Table:
    """A request's view for the trace: its tokens and, per vLLM group, its block ids
    (the last block table seen: a finished request's blocks stay named after it)."""

    tokens: list[int]
    blocks: dict[int, list[int]] = field(default_factory=dict)


@dataclass
class _Job:
    job_id: int
    request: str
    built: int
    """The step that built it."""
    groups: list[tuple[int, list[int], int, list[tuple[int, int]]]]
    """Per vLLM group: (group, block ids, block index of the first, its chunks (geometry
    group, chunk) in the worker's order)."""
    copied: bool = False
    done: bool = False
    placed: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(geometry group, chunk, page, block index in the request) per live block, as the
    worker lays the job (null pages are placeholders: nothing of theirs is placed)."""
    marks: Marks | None = None
    """The mask at the step that built the job (None: not known to the trace)."""


def chain(tokens: list[int], block_size: int, position: int, filled: int) -> Content:
    """The content of block ``position`` with its first ``filled`` slots written."""
    start = position * block_size
    return hash((tuple(tokens[:start]), tuple(tokens[start:start + filled]))), filled


@dataclass
class DataTrace:
    """What every GPU block holds, step by step, and what each store job copies."""

    judge: JudgeEngine
    content: dict[int, Content] = field(default_factory=dict)
    tables: dict[str, _Table] = field(default_factory=dict)
    jobs: dict[int, _Job] = field(default_factory=dict)
    found: list[str] = field(default_factory=list)
    chunk_of: dict[Any, tuple[int, int]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    """vLLM request id -> the case's name for it."""
    store_order: dict[frozenset[Any], list[Any]] = field(default_factory=dict)
    """The keys of each ``prepare_store`` the manager accepted, in its order."""
    positions: dict[int, dict[int, list[int]]] = field(default_factory=dict)
    """Per store job, per vLLM group: the connector's own block table of the job's
    request when the job was built (a freed block keeps its id there until it is
    reallocated and zeroed)."""
    marks: Marks | None = None
    """The mask of the step being traced (set by the driver before each step; a job
    keeps the one of the step that built it), so a corrupt slot is said to be one a
    load reads or not."""
    _starts: dict[str, int] = field(default_factory=dict)

    def _block_size(self, vgroup: int) -> int:
        return int(self.judge.engine.tokens_per_chunk[vgroup]
                   // self.judge.engine.geometry.blocks_per_chunk)

    def scheduled(self, step: int, output: Any, metadata: Any) -> None:
        """After ``schedule()``: the block tables, the step's new store jobs (copied now
        when flushed at once), the jobs this step flushes."""
        scheduler = self.judge.engine.scheduler
        self._starts = {}
        for rid, count in output.num_scheduled_tokens.items():
            request = scheduler.requests.get(rid)
            if request is None:
                continue
            table = self.tables.setdefault(rid, _Table([]))
            table.tokens = list(request.all_token_ids)
            ids = scheduler.kv_cache_manager.get_block_ids(rid)
            table.blocks = {v: list(group) for v, group in enumerate(ids)}
            # schedule() has advanced the request past the tokens it scheduled
            self._starts[rid] = int(request.num_computed_tokens) - int(count)
        flushed = set(getattr(metadata, "jobs_to_flush", None) or ())
        for job_id in flushed:
            job = self.jobs.get(job_id)
            if job is not None and not job.copied:
                self._copy(job, f"flushed at step {step}")
            if job is not None:
                job.done = True
        for job_id, transfer in (getattr(metadata, "store_jobs", None) or {}).items():
            job = self._job(step, job_id, transfer)
            if job is None:
                continue
            self.jobs[job_id] = job
            if job_id in flushed:
                self._copy(job, f"flushed at step {step}, before its forward pass")
                job.done = True

    def computed(self, step: int, output: Any, completed: list[int]) -> None:
        """After the step's forward pass (``update_from_output``): its writes, then the
        copies of the jobs built this step, then the jobs the worker reported done."""
        writes: dict[int, Content] = {}
        for rid, count in output.num_scheduled_tokens.items():
            table = self.tables.get(rid)
            if table is None or rid not in self._starts:
                continue
            start = self._starts[rid]
            end = start + int(count)
            for v, blocks in table.blocks.items():
                bs = self._block_size(v)
                for position in range(start // bs, -(-end // bs)):
                    if position >= len(blocks) or not blocks[position]:
                        continue
                    filled = min(end, (position + 1) * bs) - position * bs
                    writes[blocks[position]] = chain(table.tokens, bs, position, filled)
        for job in self.jobs.values():
            if job.copied and not job.done:
                for _, blocks, _, _ in job.groups:
                    for block in blocks:
                        if block in writes and writes[block] != self.content.get(block):
                            self.found.append(
                                f"store job {job.job_id} of {self._name(job)} (built at step "
                                f"{job.built}) was still copying when step {step}'s forward "
                                f"pass wrote GPU block {block} (neither reported nor "
                                "flushed)")
                            job.done = True
                            break
        self.content.update(writes)
        for job in self.jobs.values():
            if not job.copied and job.built == step:
                self._copy(job, f"after step {step}'s forward pass")
        for job_id in completed:
            if job_id in self.jobs:
                self.jobs[job_id].done = True

    def _name(self, job: _Job) -> str:
        return self.names.get(job.request, job.request)

    def _job(self, step: int, job_id: int, transfer: Any) -> _Job | None:
        spec = transfer.src_spec
        ids = [int(b) for b in getattr(spec, "block_ids", [])]
        sizes = [int(s) for s in (getattr(spec, "group_sizes", None) or [len(ids)])]
        starts = [int(s) for s in (getattr(spec, "block_indices", None) or [0] * len(sizes))]
        status = self.judge.engine.connector_scheduler._jobs.get(job_id)
        keys = list(getattr(status, "keys", ()) or ())
        order = self.store_order.get(frozenset(keys))
        if order is not None:
            keys = order
        chunks: dict[int, list[tuple[int, int]]] = {}
        group_of = self.judge.engine.group_of
        from kvcontract.live.capabilities import vllm_names

        get_offload_group_idx = vllm_names("vllm.v1.kv_offload.base", "get_offload_group_idx")
        for key in keys:
            v = int(get_offload_group_idx(key))
            found = self.chunk_of.get(key)
            if found is not None:
                chunks.setdefault(v, []).append((group_of[v], found[1]))
        groups = []
        offset = 0
        for v, (size, first) in enumerate(zip(sizes, starts, strict=False)):
            groups.append((v, ids[offset:offset + size], first, chunks.get(v, [])))
            offset += size
        job = _Job(job_id, str(transfer.req_id), step, groups, marks=self.marks)
        bpc = self.judge.engine.geometry.blocks_per_chunk
        tables = self.positions.get(job_id, {})
        for v, blocks, first, group_chunks in groups:
            table = tables.get(v, [])
            pages = [c * bpc + p for _, c in group_chunks for p in range(bpc)]
            slot = first % bpc
            for block in blocks:
                index, page = divmod(slot, bpc)
                slot += 1
                if block and index < len(group_chunks):
                    g, chunk = group_chunks[index]
                    job.placed.append((g, chunk, page, _position(table, block,
                                                                 chunk * bpc + page, pages)))
        return job

    def _copy(self, job: _Job, when: str) -> None:
        """The job's copy: every slot it fills must hold its position's content. A wrong
        slot the mask marks (a load reads it) is corruption; one it does not mark holds
        bytes no load reads, copied for nothing (waste). The job's worst slot is
        reported."""
        job.copied = True
        table = self.tables.get(job.request)
        if table is None:
            return
        bpc = self.judge.engine.geometry.blocks_per_chunk
        geometry = self.judge.engine.geometry
        wrong: list[Violation] = []
        for v, blocks, first, chunks in job.groups:
            if not blocks:
                continue
            g = self.judge.engine.group_of[v]
            if geometry.groups[g].kind is GroupKind.MAMBA:
                continue
            bs = self._block_size(v)
            slot = first % bpc
            for block in blocks:
                index, position_in_chunk = divmod(slot, bpc)
                slot += 1
                if not block and index < len(chunks):
                    # A null page kept as a placeholder (vLLM 0.34.0): the null block is
                    # zeroed, and a slot a load reads left with it is unfilled
                    # (_unfilled).
                    continue
                if index >= len(chunks):
                    self.found.append(Violation(
                        f"store job {job.job_id} of {self._name(job)}: vLLM group {v} has "
                        f"more GPU blocks than its {len(chunks)} CPU chunks hold",
                        Impact.CORRUPTION))
                    return
                chunk = chunks[index][1]
                position = chunk * bpc + position_in_chunk
                expected = chain(table.tokens, bs, position, bs)
                held = self.content.get(block)
                if held != expected:
                    what = ("nothing (never written)" if held is None
                            else f"{held[1]} written slots of another position or request"
                            if held[1] != bs or held[0] != expected[0] else "")
                    owner = _owner(self.tables, block, v, job.request)
                    read, impact = "", Impact.CORRUPTION
                    if job.marks is not None and position not in job.marks(g, chunk):
                        read, impact = ("; the mask does not mark the slot: no load reads "
                                        "it", Impact.WASTE)
                    elif job.marks is not None:
                        read = "; the mask marks the slot: a load reads it"
                    wrong.append(Violation(
                        f"store job {job.job_id} of {self._name(job)} (built at step "
                        f"{job.built}, copied {when}) puts GPU block {block} into chunk "
                        f"{chunk} slot {position_in_chunk} of geometry group {g} (block "
                        f"{position} of the request), but the block holds {what}"
                        + (f"; it is {owner}" if owner else "") + read, impact))
        if wrong:
            self.found.append(next((w for w in wrong if w.impact is Impact.CORRUPTION),
                                   wrong[0]))


def _position(table: list[int], block: int, slot_block: int, pages: list[int]) -> int:
    """The index in the request of ``block`` written where block ``slot_block`` belongs:
    ``slot_block`` itself when the table holds the block there, else its place among
    the job's own chunks' ``pages``, -1 for none (the table may name a reallocated block
    at an earlier place too: which bytes a copy holds is the data trace's question)."""
    if 0 <= slot_block < len(table) and table[slot_block] == block:
        return slot_block
    return next((p for p in pages if p < len(table) and table[p] == block), -1)


def _owner(tables: dict[str, _Table], block: int, vgroup: int, own: str) -> str:
    if block == 0:
        return "vLLM's null block"
    for rid, table in tables.items():
        positions = [i for i, b in enumerate(table.blocks.get(vgroup, ())) if b == block]
        if positions and rid != own:
            return f"block {positions[0]} of request {rid}"
        if positions:
            return f"block {positions[0]} of the same request"
    return ""


# -- the store judge ---------------------------------------------------------------------------
MAMBA_NOTE = ("a Mamba group's state is stored from the GPU's boundary hand-off (the model "
              "runner's copies), which the host-only worker does not make: kvcontract's gap")


class StoreJudge:
    """Store cases observed on vLLM (the module docstring)."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.runs = 0

    def why_not(self, case: StoreCase) -> str | None:
        from dataclasses import replace

        found = self.pool.get(case.geometry, replace(self.pool.options,
                                                     offload_prompt_only=case.prompt_only))
        if isinstance(found, NotBuilt):
            return found.describe()
        if any(g.kind is GroupKind.MAMBA for g in case.geometry.groups):
            return MAMBA_NOTE
        if case.max_offload_tokens is not None and not found.capabilities.max_offload_tokens:
            return "this release's requests cannot cap their stores (max_offload_tokens)"
        return None

    def observe(self, case: StoreCase) -> StoreRun:
        from dataclasses import replace

        options = replace(self.pool.options, offload_prompt_only=case.prompt_only,
                          max_num_batched_tokens=max(self.pool.options.max_num_batched_tokens,
                                                     case.prompt_len + 8))
        judge = self.pool.get(case.geometry, options)
        if isinstance(judge, NotBuilt):
            raise NotRealized(judge.describe())
        self.runs += 1
        return _run(judge, case, self.pool, f"judge-store-{self.runs}")


def _run(judge: JudgeEngine, case: StoreCase, pool: EnginePool, name: str,
         history: list[int] | None = None) -> StoreRun:
    """The case's producer on ``judge``'s engine; ``history`` (when given) receives the
    request's tokens at its end (prompt and sampled)."""
    session = judge.session
    engine = judge.engine
    geometry = case.geometry
    steps = schedule_steps(case)
    tokens = pool.tokens(case.prompt_len)
    trace = DataTrace(judge)
    keys, context = session.offload_keys(tokens)
    if case.start_hit:
        for (g, k), found in keys.items():
            if (k + 1) * geometry.chunk_tokens(geometry.groups[g]) <= case.start_hit:
                output = session.manager.prepare_store(found, context)
                if output is None:
                    raise NotRealized("vLLM's offload manager has no room for the prefix")
                session.manager.complete_store(output.keys_to_store, context)
    end = producer_end(case)
    params: tuple[tuple[str, int], ...] = ()
    if case.max_offload_tokens is not None:
        params = (("max_offload_tokens", case.max_offload_tokens),)
    finished = case.ending == "finished"
    request_spec = TraceRequest(name, tuple(tokens),
                                max_tokens=end.output_tokens if finished else 1 << 20,
                                kv_transfer_params=params)
    offers = [EngineOffers(g) for g in range(len(geometry.groups))]
    next_indices: list[list[int]] = [[] for _ in geometry.groups]
    frontiers = [s.num_computed for s in steps if s.status is RequestStatus.PREFILLING]
    snapshots: list[list[int]] = []
    with _watch_builder(judge, name, snapshots, trace.positions), \
            _record_store_order(judge, trace):
        session.run.arrive(request_spec)
        request = session.run.live[name]
        trace.names[request.request_id] = "the producer"
        outcome = session.observation.requests[name]
        expected = [s.num_scheduled for s in steps if s.num_scheduled]
        for index, step in enumerate(steps):
            marks = len(session.observation.stores)
            jobs_before = len(trace.jobs)
            trace.marks = _step_marks(case, step)
            if step.status is RequestStatus.ABORTED:
                engine.scheduler.finish_requests(request.request_id,
                                                 _vllm_status().FINISHED_ABORTED)
            _traced_step(judge, trace, step.num_scheduled)
            if index == 0 and case.start_hit:
                # The cached prefix loads first (asynchronously): the request computes
                # from a later step; what the load's steps offered belongs to step 0.
                for _ in range(4):
                    if outcome.scheduled:
                        break
                    _traced_step(judge, trace, step.num_scheduled)
                if outcome.reused_tokens != case.start_hit:
                    release_request(judge, request)
                    raise NotRealized(
                        f"the request reused {outcome.reused_tokens} tokens, not the "
                        f"case's cached prefix of {case.start_hit}")
            if step.num_scheduled and list(outcome.scheduled) != expected[:index + 1]:
                release_request(judge, request)
                raise NotRealized(f"vLLM scheduled the request {list(outcome.scheduled)} "
                                  f"where the case's steps are {expected}")
            for g in range(len(geometry.groups)):
                offers[g].offers.append([])
                offers[g].placements.append([])
            for job in list(trace.jobs.values())[jobs_before:]:
                if job.request == request.request_id:
                    for g, chunk, page, block in job.placed:
                        offers[g].placements[index].append((chunk, page, block))
            for offer in session.observation.stores[marks:]:
                if offer.request == name:
                    for g, chunks in offer.offered.items():
                        offers[g].offers[index].extend(chunks)
            for g in range(len(geometry.groups)):
                previous = next_indices[g][-1] if next_indices[g] else 0
                next_indices[g].append(snapshots[-1][g] if snapshots else previous)
            snapshots.clear()
        if finished and not request.is_finished():
            release_request(judge, request)
            raise NotRealized("vLLM did not finish the request after the case's decode "
                              "steps")
        if history is not None:
            history[:] = [int(t) for t in request.all_token_ids]
        release_request(judge, request)
    run = StoreRun(cast(list[StoreTracker], offers), next_indices, frontiers,
                   steps[-1].num_computed)
    run.integrity = tuple(trace.found) + _unfilled(case, trace, offers)
    return run


def _step_marks(case: StoreCase, step: StoreStep) -> Marks:
    """The contract's mask at ``step`` of ``case``: each group's final segment closed
    where the spec's step closes it (the prompt horizon while running, the real one on
    finish or abort), with the spec's replay boundaries."""
    geometry = case.geometry
    finals = [step_bounds(geometry, group, step.status, step.num_computed,
                          step.num_scheduled, step.num_tokens, case.prompt_len,
                          case.prompt_only, case.max_offload_tokens)[1]
              for group in geometry.groups]
    boundaries = case.replay_boundaries

    def marked(g: int, chunk: int) -> Sequence[int]:
        return group_marked_blocks(geometry, geometry.groups[g], chunk, finals[g],
                                   boundaries)

    return marked


def run_producer(judge: JudgeEngine, case: StoreCase, pool: EnginePool, name: str,
                 ) -> tuple[StoreRun, list[int]]:
    """``case`` run on ``judge``'s engine as a producer: its run and its tokens at the end
    (what a consumer shares)."""
    history: list[int] = []
    return _run(judge, case, pool, name, history), history


def _unfilled(case: StoreCase, trace: DataTrace,
              offers: list[EngineOffers]) -> tuple[str, ...]:
    """Slots the contract's mask marks (docs/CONTRACT.md 5: the blocks a later load
    reads) in a chunk vLLM stored, that no store job filled: the chunk is HIT and its
    load reads what was never written there."""
    geometry = case.geometry
    bpc = geometry.blocks_per_chunk
    filled: dict[tuple[int, int], set[int]] = {}
    for job in trace.jobs.values():
        for _, blocks, first, chunks in job.groups:
            slot = first % bpc
            for block in blocks:
                index, position = divmod(slot, bpc)
                slot += 1
                if block and index < len(chunks):
                    filled.setdefault(chunks[index], set()).add(position)
    found: list[str] = []
    final = case.prompt_len
    for g, group in enumerate(geometry.groups):
        if group.kind is GroupKind.MAMBA:
            continue
        stored = {c for offer in offers[g].offers for c in offer}
        for chunk in sorted(stored):
            marked = group_marked_blocks(geometry, group, chunk,
                                         final // geometry.chunk_tokens(group),
                                         case.replay_boundaries)
            missing = [b - chunk * bpc for b in marked
                       if b - chunk * bpc not in filled.get((g, chunk), set())]
            if (g, chunk) in filled and missing:
                found.append(f"geometry group {g} chunk {chunk} was stored without slots "
                             f"{missing}, which its mask marks: a load reads them unwritten")
    return tuple(found)


def _vllm_status() -> Any:
    from kvcontract.live.capabilities import vllm_names

    return vllm_names("vllm.v1.request", "RequestStatus")


def _traced_step(judge: JudgeEngine, trace: DataTrace, budget: int) -> None:
    """One schedule / worker / update_from_output step with the trace's two hooks."""
    session = judge.session
    run = session.run
    scheduler = judge.engine.scheduler
    scheduler.max_num_scheduled_tokens = int(budget)
    run.recorder.step = run.step
    output = driven("schedule", run.step, scheduler.schedule)
    run._observe_schedule(output)
    metadata = output.kv_connector_metadata
    trace.scheduled(run.step, output, metadata)
    before = len(run.worker.completed)
    run.worker.submit(metadata)
    model_output = driven("model output", run.step, lambda: run._model_output(output))
    driven("update_from_output", run.step,
           lambda: scheduler.update_from_output(output, model_output))
    completed = [job for _, job, _ in run.worker.completed[before:]]
    trace.computed(run.step, output, completed)
    run.step += 1


@contextlib.contextmanager
def _watch_builder(judge: JudgeEngine, name: str, snapshots: list[list[int]],
                   positions: dict[int, dict[int, list[int]]] | None = None,
                   ) -> Iterator[None]:
    """``_build_store_jobs`` wrapped on the connector's instance: after each call,
    ``next_stored_chunk_idx`` of the case's request per geometry group (before the
    connector drops a finished request's state), and into ``positions`` each new store
    job's block positions from the connector's own block table of its request."""
    scheduler = judge.engine.connector_scheduler
    original = scheduler._build_store_jobs
    group_of = judge.engine.group_of

    def watched(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if positions is not None:
            for job_id, transfer in (result or {}).items():
                owner = scheduler._req_status.get(getattr(transfer, "req_id", None))
                if owner is None:
                    continue
                positions[job_id] = {
                    int(config.group_idx): [int(b) for b in state.block_ids]
                    for config, state in zip(owner.config.kv_group_configs,
                                             owner.group_states, strict=False)}
        rid = next((r for r, n in judge.session.run.recorder.names.items() if n == name),
                   None)
        state = scheduler._req_status.get(rid) if rid is not None else None
        if state is not None:
            values: dict[int, int] = {}
            for config, group_state in zip(state.config.kv_group_configs,
                                           state.group_states, strict=False):
                values.setdefault(group_of[config.group_idx],
                                  int(group_state.next_stored_chunk_idx))
            snapshots.append([values.get(g, 0) for g in range(len(judge.geometry.groups))])
        return result

    scheduler._build_store_jobs = watched
    try:
        yield
    finally:
        del scheduler._build_store_jobs


@contextlib.contextmanager
def _record_store_order(judge: JudgeEngine, trace: DataTrace) -> Iterator[None]:
    """The keys each ``prepare_store`` accepted, in the manager's order (the order of a
    job's CPU chunks)."""
    proxy = judge.engine.connector_scheduler.manager
    inner = proxy._inner
    orders = trace.store_order
    chunk_of = judge.session.run.recorder.chunk_of

    class _Ordering:
        def __getattr__(self, attr: str) -> Any:
            value = getattr(inner, attr)
            if attr != "prepare_store":
                return value

            def prepare_store(keys: Any, *args: Any, **kwargs: Any) -> Any:
                keys = list(keys)
                context = args[0] if args else kwargs.get("req_context")
                for key in keys:
                    g, _, k = chunk_of(key, context)
                    trace.chunk_of[key] = (g, k)
                result = value(keys, *args, **kwargs)
                if result is not None:
                    stored = list(result.keys_to_store)
                    orders[frozenset(stored)] = stored
                return result

            return prepare_store

    proxy._inner = _Ordering()
    try:
        yield
    finally:
        proxy._inner = inner


__all__ = ["DataTrace", "EngineOffers", "StoreJudge", "chain", "run_producer"]
