"""A producer/consumer case judged on vLLM's own engine (C12 and what it reads).

An :class:`~kvcontract.spec.properties.end_to_end.EndToEndCase` is a producer (a store
case: prefill schedule, finish or abort) and a consumer (a resend, a continuation of
the producer's conversation, a sibling sharing a prefix). The producer runs on vLLM
exactly as a store case does (:mod:`~kvcontract.live.judge.stores`) and its store jobs
complete; vLLM's GPU prefix cache is then reset (``reset_prefix_cache(
reset_connector=False)``: the offloaded tier is kept), so the consumer's hit is the
offload tier's alone; the consumer (the producer's tokens up to the shared prefix, then
tokens nobody else has) arrives and one ``schedule()`` runs: its accepted hit and its
load set are what vLLM's connector decided over exactly what vLLM's manager holds.

Consecutive cases of one producer share its run (the enumeration keeps a producer's
consumers together): each consumer's own stores are capped at zero tokens
(``max_offload_tokens``) and the GPU prefix cache is reset before each, so no consumer
changes what the next one meets.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvcontract.live.judge.engines import (
    EnginePool,
    JudgeEngine,
    NotBuilt,
    check_gaps,
    release_request,
)
from kvcontract.live.judge.lookups import NotRealized
from kvcontract.live.judge.stores import MAMBA_NOTE, run_producer
from kvcontract.live.trace import TraceRequest
from kvcontract.spec.geometry import GroupKind
from kvcontract.spec.properties.end_to_end import (
    EndToEndCase,
    EndToEndObservation,
    consumer_keys,
    first_consumer,
)
from kvcontract.spec.properties.store import StoreCase, StoreRun, offered_chunks


@dataclass
class _Producer:
    case: StoreCase
    run: StoreRun
    history: list[int]
    judge: JudgeEngine


class EndToEndJudge:
    """Producer/consumer cases observed on vLLM (the module docstring)."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.runs = 0
        self.consumers = 0
        self._last: _Producer | None = None

    def _options(self, case: EndToEndCase) -> Any:
        producer = case.producer
        longest = max(producer.prompt_len + producer.decode + 8,
                      case.consumer.num_tokens + 8)
        if case.consumer.kind == "junction":
            longest = max(longest, first_consumer(case).num_tokens + 8)
        return replace(self.pool.options, offload_prompt_only=producer.prompt_only,
                       max_num_batched_tokens=max(self.pool.options.max_num_batched_tokens,
                                                  longest))

    def why_not(self, case: EndToEndCase) -> str | None:
        found = self.pool.get(case.geometry, self._options(case))
        if isinstance(found, NotBuilt):
            return found.describe()
        if any(g.kind is GroupKind.MAMBA for g in case.geometry.groups):
            return MAMBA_NOTE
        if not found.capabilities.max_offload_tokens:
            return ("this release's requests cannot cap their own stores "
                    "(max_offload_tokens): consumers of one producer would change what "
                    "the next one meets")
        return None

    def observe(self, case: EndToEndCase) -> EndToEndObservation:
        judge = self.pool.get(case.geometry, self._options(case))
        if isinstance(judge, NotBuilt):
            raise NotRealized(judge.describe())
        producer = self._producer(judge, case.producer)
        consumer = case.consumer
        if consumer.shared_tokens > len(producer.history):
            raise NotRealized(f"the producer ended with {len(producer.history)} tokens, the "
                              f"consumer shares {consumer.shared_tokens}")
        tokens = producer.history[:consumer.shared_tokens] + self.pool.tokens(
            consumer.num_tokens - consumer.shared_tokens)
        offered = [offered_chunks(tracker) for tracker in producer.run.trackers]
        keys = consumer_keys(case.geometry, consumer.num_tokens, consumer.shared_tokens)
        if consumer.kind == "junction":
            # The first consumer runs to its end and stores (what vLLM's connector
            # decides for it, its junction included): the offload tier now holds its
            # chunks, so the next case runs its producer afresh.
            self._last = None
            first = first_consumer(case)
            stored, junction = self._first_consumer(
                judge, producer.history[:first.shared_tokens]
                + self.pool.tokens(first.num_tokens - first.shared_tokens))
            offered = [chunks | {c for c in stored.get(g, ()) if c < keys[g]}
                       for g, chunks in enumerate(offered)]
        observation = EndToEndObservation(None, offered, keys)
        if consumer.kind == "junction":
            observation.junction = junction
        hit, loads = self._consume(judge, tokens)
        observation.hit_tokens = hit
        observation.load_ranges = {g: (min(c), max(c) + 1) for g, c in loads.items() if c}
        return observation

    def _producer(self, judge: JudgeEngine, case: StoreCase) -> _Producer:
        last = self._last
        if last is not None and last.case == case and last.judge is judge:
            return last
        self.runs += 1
        run, history = run_producer(judge, case, self.pool, f"judge-producer-{self.runs}")
        self._last = _Producer(case, run, history, judge)
        return self._last

    def _first_consumer(self, judge: JudgeEngine, tokens: list[int]
                        ) -> tuple[dict[int, set[int]], int]:
        """A junction case's first consumer: it arrives after a GPU prefix-cache reset,
        runs (no store cap) until it finished, and its store jobs complete; the chunks
        it offered, per group, and the junction it registered (the request's
        ``shared_prefix_boundary`` once it ran: the GPU cache was reset, so only the
        connector's lookup can have raised it from 0, and nothing lowers it)."""
        session = judge.session
        if not judge.engine.scheduler.reset_prefix_cache(reset_connector=False):
            raise NotRealized("vLLM refused to reset its GPU prefix cache before the "
                              "first consumer")
        self.consumers += 1
        name = f"judge-first-consumer-{self.consumers}"
        observation = session.observation
        mark = len(observation.stores)
        session.run.arrive(TraceRequest(name, tuple(tokens), max_tokens=1))
        request = session.run.live[name]
        for _ in range(8):
            session.step(len(tokens) + 1)
            if request.is_finished():
                break
        junction = int(request.shared_prefix_boundary)
        check_gaps(session)
        stored: dict[int, set[int]] = {}
        for offer in observation.stores[mark:]:
            if offer.request == name:
                for g, chunks in offer.offered.items():
                    stored.setdefault(g, set()).update(chunks)
        finished = request.is_finished()
        release_request(judge, request)
        if not finished:
            raise NotRealized("vLLM did not finish the first consumer in eight steps")
        return stored, junction

    def _consume(self, judge: JudgeEngine, tokens: list[int],
                 ) -> tuple[int | None, dict[int, tuple[int, ...]]]:
        session = judge.session
        scheduler = judge.engine.scheduler
        if not scheduler.reset_prefix_cache(reset_connector=False):
            raise NotRealized("vLLM refused to reset its GPU prefix cache between the "
                              "producer and the consumer")
        self.consumers += 1
        name = f"judge-consumer-{self.consumers}"
        observation = session.observation
        marks = (len(observation.matches), len(observation.loads))
        session.run.arrive(TraceRequest(name, tuple(tokens), max_tokens=1,
                                        kv_transfer_params=(("max_offload_tokens", 0),)))
        request = session.run.live[name]
        session.step(len(tokens) + 1)
        check_gaps(session)
        matches = [m for m in observation.matches[marks[0]:] if m.request == name]
        loads: dict[int, tuple[int, ...]] = {}
        for record in observation.loads[marks[1]:]:
            if record.request == name:
                for g, chunks in record.chunks.items():
                    loads[g] = tuple(sorted(set(loads.get(g, ())) | set(chunks)))
        release_request(judge, request)
        if not matches:
            raise NotRealized("vLLM's scheduler did not look the consumer up in its first "
                              "step")
        match = matches[0]
        if match.local_hit:
            raise NotRealized(f"the consumer met a GPU prefix-cache hit of "
                              f"{match.local_hit} tokens after the reset")
        return (None if match.external is None else int(match.external)), loads


__all__ = ["EndToEndJudge"]
