"""What the releases the live backend drives do differently, each asserted as the
installed release does it, keyed on the capability the driver detects
(live/capabilities.py), never on the version string. The rule each capability stands
for is stated once, and the expected number is derived from it."""

from __future__ import annotations

import pytest

from kvcontract.live.build import BuildOptions
from kvcontract.live.lifecycle import run_lifecycle
from kvcontract.live.observation import LiveObservation
from kvcontract.live.run import run_trace
from kvcontract.live.session import LiveSession
from kvcontract.live.trace import Phase, Trace, TraceRequest, producer_consumer, prompt_tokens
from kvcontract.spec.geometry import Geometry, fa, swa
from tests.live.conftest import capability, has, needs_vllm

pytestmark = [needs_vllm, pytest.mark.live]


@pytest.mark.parametrize("budget", [16, 32, 48])
def test_a_load_budget_and_the_sliding_windows_last_token(budget: int) -> None:
    """A consumer whose offloaded load is capped (``max_load_tokens``) below its prompt:
    where the sliding-window groups' last prompt token comes off before the budget
    clamps, the budget is a boundary kept as it is; where it comes off after, the
    clamped boundary loses it too, and the hit drops to the chunk before."""
    reserve_first = capability("swa-reserve-before-clamps")
    if reserve_first is None:
        pytest.skip("the release's lookup has neither shape")
    geometry = Geometry((fa(16), swa(4, 8)))
    prompt = 64
    producer = TraceRequest("producer", tuple(prompt_tokens(prompt)), max_tokens=1)
    consumer = TraceRequest("consumer", tuple(prompt_tokens(prompt)), max_tokens=1,
                            kv_transfer_params=(("max_load_tokens", budget),))
    observation = run_trace(geometry, producer_consumer(producer, consumer))
    assert isinstance(observation, LiveObservation) and not observation.crashed
    tpc = geometry.chunk_tokens(geometry.groups[0])
    boundary = budget if reserve_first else budget - 1
    assert observation.accepted_hit("consumer") == boundary // tpc * tpc


def test_null_pages_in_a_stored_chunk() -> None:
    """A request whose GPU prefix hit left its sliding-window blocks below the window
    null, stored from chunk 0 (a first request with the same prompt offloaded nothing,
    ``max_offload_tokens`` 0): its chunk 3 holds a null block (6) and a live marked one
    (7). Where the release keeps null pages as placeholders, the store job copies both;
    where it leaves them out, the live block alone."""
    placeholders = capability("null-page-placeholders")
    if placeholders is None:
        pytest.skip("the release's store path has neither shape")
    geometry = Geometry((fa(16), swa(4, 5)), blocks_per_chunk=2)
    first = TraceRequest("first", tuple(prompt_tokens(33)), max_tokens=1,
                         kv_transfer_params=(("max_offload_tokens", 0),))
    second = TraceRequest("second", tuple(prompt_tokens(40)), max_tokens=1)
    run = run_lifecycle(geometry, Trace((Phase((first,)), Phase((second,)))), BuildOptions())
    assert isinstance(run, LiveObservation) and run.lifecycle is not None
    assert not run.crashed
    local = [m.local_hit for m in run.matches if m.request == "second"]
    assert local and local[0] == 32  # the first request's blocks, from the GPU cache
    jobs = [j for j in run.lifecycle.jobs.values() if j.request == "second"
            and j.kind == "store"]
    assert len(jobs) == 1 and 3 in jobs[0].chunks[1]
    swa_blocks = jobs[0].group_blocks[1]
    chunks = len(jobs[0].chunks[1])
    assert (0 in swa_blocks) == placeholders
    assert len(swa_blocks) == (2 * chunks if placeholders else 2 * chunks - 1)


def test_a_failed_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fail_next_store``: where the release's worker reports failed transfers, the
    job is reported failed and the connector drops its chunks (a later lookup misses
    them); where it does not, the job is never reported and they stay pending."""
    geometry = Geometry((fa(4), swa(4, 8)))
    session = LiveSession.open(geometry)
    assert isinstance(session, LiveSession)
    tokens = list(range(1, 18))
    try:
        session.fail_next_store()
        session.add_request("r", tokens, 1)
        session.step(8)
        assert session.observation.requests["r"].scheduled == [8]  # the budget holds
        session.step(64)
        session.drain()
        keys, context = session.offload_keys(tokens)
        first = {str(session.manager.lookup(k, context).name) for k in keys[(0, 0)]}
    finally:
        observation = session.close()
    assert not observation.exceptions
    if has("failed-transfer-jobs"):
        assert not session.worker.stalled
        assert first == {"MISS"}
    else:
        assert session.worker.stalled, "the failed store's job is never reported"
        assert first == {"HIT_PENDING"}
