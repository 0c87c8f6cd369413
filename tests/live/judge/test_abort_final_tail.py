"""An aborted producer's final tail on vLLM's engine (docs/vllm-findings.md, "the final
tail an abort stores from a stale block table"): FA16 + SWA4(sw8), bpc 8, retention None,
a 136-token prompt aborted after six prefill steps of 7 tokens.

The abort's store job rewinds below ``next_stored_chunk_idx`` to the final partial
segment (``_build_store_jobs``, ``reconsider_final_swa_tail``) and copies SWA chunk 0
from the connector's own block table, which ``_update_req_states`` stopped zeroing there:
blocks the request freed out of its window, one of them already reused for a later
position of the same request (C10), in a chunk the spec does not store (its marked
blocks are freed: C9). With a second request scheduled in the abort step on a small
pool, the two blocks the mask marks are reused and written before the deferred copy.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvcontract.live.judge import stores
from kvcontract.live.judge.engines import EnginePool, JudgeEngine
from kvcontract.live.trace import TraceRequest
from kvcontract.spec.geometry import Geometry, fa, swa
from kvcontract.spec.properties.store import (
    StoreCase,
    schedule_steps,
    spec_offers,
    store_steps,
    stores_placed,
    stores_well_formed,
)
from kvcontract.spec.reachability import group_marked_blocks
from kvcontract.vocabulary import Impact, RequestStatus
from tests.live.conftest import needs_vllm

BPC8 = Geometry((fa(16), swa(4, 8)), blocks_per_chunk=8)
ABORTED = StoreCase("FA16+SWA4(sw8),bpc8", BPC8, 136, (7,) * 6, "aborted")
"""Aborted at 42 computed tokens: SWA blocks below 8 are freed (``skipped(42) = 35``),
the final horizon is SWA chunk 1 (token 32), whose tail marks blocks 6 and 7."""


@needs_vllm
@pytest.mark.live
def test_an_abort_stores_the_final_tail_from_a_stale_block_table() -> None:
    run = stores.StoreJudge(EnginePool()).observe(ABORTED)
    # vLLM offers SWA chunk 0 at the abort; the spec does not (its marked blocks 6 and 7
    # are below the first live block 8: unstorable, C10)
    assert run.trackers[1].offers[-1] == [0]
    assert spec_offers(ABORTED, 1)[-1] == []
    steps = store_steps(ABORTED, run)
    assert steps is not None and getattr(steps, "impact", None) is Impact.WASTE
    assert "offered [0] at step 6 (aborted, 42+0 tokens)" in steps
    found = stores_well_formed(ABORTED, run)
    assert found is not None
    if stores_placed(ABORTED, run) is None:
        # null pages kept as placeholders (0.34.0): the job copies position 5's freed
        # block, which the step from 35 reused for block 9, into slot 5, which the mask
        # does not mark: no load reads the wrong bytes (waste); the marked tail blocks 6
        # and 7 are freed but not reused yet
        assert getattr(found, "impact", None) is Impact.WASTE
        assert "into chunk 0 slot 5" in found and "it is block 9 of the same request" in found
        assert "the mask does not mark the slot: no load reads it" in found
    else:
        # null pages dropped (0.33.0): the same blocks land a slot low, position 7's
        # into marked slot 6
        assert getattr(found, "impact", None) is Impact.CORRUPTION
        assert "into chunk 0 slot 6" in found and "the mask marks the slot" in found


def _drive_with_a_second_request(judge: JudgeEngine, pool: EnginePool,
                                 ) -> tuple[stores.DataTrace, list[int], list[int], str]:
    """ABORTED's producer, then a 148-token request B arriving in the abort step and
    scheduled there; the producer's tokens, B's SWA block table, the producer's id."""
    session, engine = judge.session, judge.engine
    trace = stores.DataTrace(judge)
    tokens, other = pool.tokens(ABORTED.prompt_len), pool.tokens(148)
    with stores._watch_builder(judge, "A", [], trace.positions), \
            stores._record_store_order(judge, trace):
        session.run.arrive(TraceRequest("A", tuple(tokens), max_tokens=1 << 20))
        producer = session.run.live["A"]
        for step in schedule_steps(ABORTED):
            budget = step.num_scheduled
            trace.marks = stores._step_marks(ABORTED, step)
            if step.status is RequestStatus.ABORTED:
                # vLLM's abort (EngineCore.abort_requests), B's arrival, one schedule
                engine.scheduler.finish_requests(producer.request_id,
                                                 stores._vllm_status().FINISHED_ABORTED)
                session.run.arrive(TraceRequest("B", tuple(other), max_tokens=1 << 20))
                budget = len(other)
            stores._traced_step(judge, trace, budget)
        second = session.run.live["B"]
        table = list(engine.scheduler.kv_cache_manager.get_block_ids(second.request_id)[1])
    return trace, tokens, table, str(producer.request_id)


@needs_vllm
@pytest.mark.live
def test_a_request_scheduled_in_the_abort_step_overwrites_the_marked_tail() -> None:
    pool = EnginePool()
    judge = pool.get(BPC8, replace(pool.options, gpu_blocks=50, max_model_len=150,
                                   max_num_batched_tokens=256))
    assert isinstance(judge, JudgeEngine), judge
    trace, tokens, other_swa, producer = _drive_with_a_second_request(judge, pool)
    (job,) = [j for j in trace.jobs.values() if j.request == producer]
    assert job.copied  # after the abort step's forward pass: B has written its blocks
    (swa_table,) = [t for v, t in trace.positions[job.job_id].items()
                    if judge.engine.group_of[v] == 1]
    marked = group_marked_blocks(BPC8, BPC8.groups[1], 0, 1, ABORTED.replay_boundaries)
    assert marked == [6, 7]
    copied = {b for _, blocks, _, _ in job.groups for b in blocks}
    for position in marked:
        block = swa_table[position]
        # the job copies it, B holds it, and at the copy it holds B's bytes, not the
        # producer's block at that position
        assert block in copied and block in other_swa, (position, block)
        assert trace.content[block] != stores.chain(tokens, 4, position, 4)
    # the trace reports the job's worst slot: a marked one, corruption
    (found,) = trace.found
    assert getattr(found, "impact", None) is Impact.CORRUPTION
    assert "the mask marks the slot: a load reads it" in found
