"""Replay a producer/consumer case on the live engine and hold it against the spec.

The case is the end-to-end family's own :class:`~kvcontract.spec.properties.end_to_end.EndToEndCase`
(a :class:`~kvcontract.spec.properties.store.StoreCase` producer and a resend,
continuation or sibling consumer). The producer runs on vLLM's scheduler with the
case's chunked-prefill budget, finishes after its decode steps or is aborted, its store
jobs complete, the GPU prefix cache is reset (the offloaded tier kept), and the consumer
arrives: the hit its lookup accepts is the offloaded tier's alone. The promise is the
spec's (:func:`~kvcontract.spec.properties.end_to_end.promised_hit`, and the GPU floor
``gpu_promise``); the judge is C12's: below the floor is a lost hit.

:func:`replay_store_case` runs a store-schedule case (a
:class:`~kvcontract.spec.properties.store.StoreCase`: C8-C10's witnesses) the same way,
producer alone, and returns vLLM's own store offers per geometry group and per step of
the case's schedule (:func:`~kvcontract.spec.properties.store.schedule_steps`), for the
store family's judges to read; a schedule vLLM's scheduler does not make under the
case's budget is said so, never forced.

A run that stops on a gap of kvcontract's own driver (:mod:`kvcontract.live.gaps`)
confirms nothing: both raise :class:`~kvcontract.live.gaps.DriverGapError`, so a caller
reports the case not replayable, never a crash of vLLM nor a verdict about it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvcontract.live.build import BuildOptions, Refused
from kvcontract.live.gaps import DriverGapError
from kvcontract.live.observation import LiveObservation
from kvcontract.live.run import run_trace
from kvcontract.live.trace import (
    Phase,
    Trace,
    TraceRequest,
    divergent_tokens,
    producer_consumer,
    prompt_tokens,
    sampled_token,
)
from kvcontract.live.worker import Timing
from kvcontract.spec.geometry import Geometry
from kvcontract.spec.properties.end_to_end import (
    SIBLING_DIVERGENCE,
    Consumer,
    EndToEndCase,
    gpu_hit_unit,
    producer_end,
    promised_hit,
)
from kvcontract.spec.properties.store import StoreCase, schedule_steps

VERDICTS = ("lost-hit", "as-promised", "more-than-promised", "crash", "deferred",
            "refused")
"""What a live replay found: the consumer got less than the GPU floor of the promise
(``lost-hit``), the promise or between the floor and it (``as-promised``), more
(``more-than-promised``), vLLM raised (``crash``), the consumer never got an answer
(``deferred``), vLLM would not build the geometry (``refused``)."""


@dataclass(frozen=True)
class Confirmation:
    """A case replayed live: what vLLM accepted, what the spec promises."""

    case: dict[str, Any]
    observed_hit: int | None
    """The offloaded hit vLLM's connector accepted for the consumer (tokens)."""
    reused_tokens: int | None
    """Tokens the consumer had computed at its first compute step (what it reused)."""
    promised_hit: int
    """The spec's promise (C12, unaligned boundaries included)."""
    gpu_promise: int
    """The promise in whole scheduler blocks: below it is a lost hit."""
    raised: str | None
    """The exception vLLM raised, ``Type: message`` (a crash)."""
    refused: str | None
    """Why the geometry was not built (vLLM's message)."""
    verdict: str
    producer_schedule: tuple[int, ...] = ()
    """Tokens the producer was scheduled per step (prefill and decode)."""
    observation: LiveObservation | None = None

    @property
    def lost_tokens(self) -> int:
        if self.observed_hit is None:
            return 0
        return max(0, self.gpu_promise - self.observed_hit)

    def summary(self) -> str:
        return (f"{self.verdict}: observed hit {self.observed_hit}, reused "
                f"{self.reused_tokens}, promised {self.promised_hit} (GPU floor "
                f"{self.gpu_promise})" + (f"; raised {self.raised}" if self.raised else "")
                + (f"; refused: {self.refused}" if self.refused else ""))

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case, "observed_hit": self.observed_hit,
                "reused_tokens": self.reused_tokens, "promised_hit": self.promised_hit,
                "gpu_promise": self.gpu_promise, "lost_tokens": self.lost_tokens,
                "raised": self.raised, "refused": self.refused, "verdict": self.verdict,
                "producer_schedule": list(self.producer_schedule)}


def end_to_end_case(geometry: Geometry, prompt_len: int, consumer: str = "resend", *,
                    shared: int | None = None, steps: tuple[int, ...] | None = None,
                    ending: str = "finished", decode: int = 3,
                    name: str = "live") -> EndToEndCase:
    """The :class:`EndToEndCase` of a producer of ``prompt_len`` tokens (prefill in
    ``steps``, one shot by default; finished after ``decode`` steps or ``aborted``) and
    a ``resend``, ``continuation`` or ``sibling`` consumer (sharing ``shared`` tokens of
    the prompt; ``prompt_len - 1`` by default)."""
    producer = StoreCase(name, geometry, prompt_len, steps or (prompt_len,), ending,
                         decode=decode if ending == "finished" else 0)
    if consumer == "resend":
        who = Consumer("resend", prompt_len, prompt_len)
    elif consumer == "continuation":
        tokens = prompt_len + producer_end(producer).output_tokens
        who = Consumer("continuation", tokens + SIBLING_DIVERGENCE, tokens)
    elif consumer == "sibling":
        k = prompt_len - 1 if shared is None else shared
        who = Consumer("sibling", k + SIBLING_DIVERGENCE, k)
    else:
        raise ValueError(f"consumer must be resend, continuation or sibling, not {consumer!r}")
    return EndToEndCase(producer, who)


def _traces(case: EndToEndCase) -> tuple[TraceRequest, TraceRequest]:
    producer, consumer = case.producer, case.consumer
    prompt = prompt_tokens(producer.prompt_len)
    end = producer_end(producer)
    finished = producer.ending == "finished"
    abort_at = None if finished else len(producer.steps)
    first = TraceRequest("producer", tuple(prompt),
                         max_tokens=end.output_tokens if finished else 1 << 20,
                         abort_at=abort_at)
    shared = consumer.shared_tokens
    history = prompt + [sampled_token(i) for i in range(end.output_tokens)]
    tokens = history[:shared] + divergent_tokens(consumer.num_tokens - shared)
    second = TraceRequest("consumer", tuple(tokens), max_tokens=1)
    return first, second


def options_for(case: EndToEndCase, base: BuildOptions | None = None) -> BuildOptions:
    """The engine settings a case needs: its chunked-prefill budget, a model length
    that holds both requests."""
    base = base or BuildOptions()
    producer = case.producer
    budget = max(producer.steps) if producer.steps else producer.prompt_len
    longest = max(producer.prompt_len + producer.decode + 8, case.consumer.num_tokens + 8)
    length = max(base.max_model_len, 1 << (longest - 1).bit_length())
    return replace(base, max_num_batched_tokens=budget, max_model_len=length,
                   offload_prompt_only=producer.prompt_only)


JUNCTION_NOT_CONFIRMED = ("a junction consumer needs its first consumer (docs/CONTRACT.md "
                          "9.3), which the producer-consumer trace does not run: the "
                          "engine's end-to-end judge (live/judge/resends.py) runs it")


def confirm_case(case: EndToEndCase, options: BuildOptions | None = None, *,
                 timing: Timing | None = None, keep_observation: bool = True,
                 ) -> Confirmation:
    """Run ``case`` live; the observed hit, the spec's promise and the verdict
    (:class:`~kvcontract.live.gaps.DriverGapError` when the driver did not fit the
    installed vLLM: no verdict)."""
    geometry = case.geometry
    if case.consumer.kind == "junction":
        # A junction consumer needs the request between (docs/CONTRACT.md 9.3), which this
        # two-request trace does not run: the engine judge (live/judge/resends.py) does.
        raise ValueError(JUNCTION_NOT_CONFIRMED)
    promised = promised_hit(geometry, case.producer, case.consumer.num_tokens,
                            case.consumer.shared_tokens)
    floor = promised_hit(geometry, case.producer, case.consumer.num_tokens,
                         case.consumer.shared_tokens, unit=gpu_hit_unit(geometry))
    producer, consumer = _traces(case)
    result = run_trace(geometry, producer_consumer(producer, consumer, timing=timing),
                       options_for(case, options))
    if isinstance(result, Refused):
        return Confirmation(case.to_json(), None, None, promised, floor, None,
                            result.reason, "refused")
    _no_driver_gap(result)
    raised = (f"{result.exceptions[0].type}: {result.exceptions[0].message}"
              if result.exceptions else None)
    observed = result.accepted_hit("consumer")
    outcome = result.requests.get("consumer")
    reused = outcome.reused_tokens if outcome is not None else None
    if raised is not None:
        verdict = "crash"
    elif observed is None:
        verdict = "deferred"
    elif observed < floor:
        verdict = "lost-hit"
    elif observed > promised:
        verdict = "more-than-promised"
    else:
        verdict = "as-promised"
    schedule = tuple(result.requests["producer"].scheduled) if "producer" in result.requests \
        else ()
    return Confirmation(case.to_json(), observed, reused, promised, floor, raised, None,
                        verdict, schedule, result if keep_observation else None)


@dataclass(frozen=True)
class StoreReplay:
    """A store-schedule case's producer run live: what vLLM offered ``prepare_store``."""

    case: dict[str, Any]
    offers: tuple[tuple[tuple[int, ...], ...], ...]
    """Per geometry group, per step of the case's schedule, the chunks offered (those
    offered after the producer's last scheduled step belong to its ending step)."""
    scheduled: tuple[int, ...]
    """Tokens vLLM scheduled the producer per step."""
    expected_schedule: tuple[int, ...]
    """Tokens the case's schedule gives per step (prefill, then decode)."""
    raised: str | None
    refused: str | None

    @property
    def schedule_differs(self) -> bool:
        """vLLM scheduled the producer otherwise than the case (its budget makes another
        chunked prefill): the offers are not those of the case's steps."""
        return self.refused is None and self.raised is None and \
            self.scheduled != self.expected_schedule

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case, "offers": [[list(o) for o in g] for g in self.offers],
                "scheduled": list(self.scheduled),
                "expected_schedule": list(self.expected_schedule),
                "raised": self.raised, "refused": self.refused}


def replay_store_case(case: StoreCase, options: BuildOptions | None = None, *,
                      timing: Timing | None = None) -> StoreReplay:
    """Run the producer of ``case`` alone on vLLM (its prefill budget the largest of its
    steps, finished after its decode steps or aborted after its prefill steps) and
    collect the store offers step by step."""
    if case.start_hit:
        raise ValueError("a store case with a cached prefix (start_hit) is not replayed "
                         "live: the producer would need a first request to hit")
    steps = schedule_steps(case)
    running = [s.num_scheduled for s in steps if s.num_scheduled]
    groups = len(case.geometry.groups)
    e2e = EndToEndCase(case, Consumer("resend", case.prompt_len, case.prompt_len))
    producer, _ = _traces(e2e)
    trace = Trace((Phase((producer,), max_steps=4 * len(steps) + 50),), timing or Timing())
    result = run_trace(case.geometry, trace, options_for(e2e, options))
    if isinstance(result, Refused):
        return StoreReplay(case.to_json(), (), (), tuple(running), None, result.reason)
    _no_driver_gap(result)
    raised = (f"{result.exceptions[0].type}: {result.exceptions[0].message}"
              if result.exceptions else None)
    outcome = result.requests.get("producer")
    first = outcome.first_compute_step if outcome is not None and \
        outcome.first_compute_step is not None else 0
    offers: list[list[set[int]]] = [[set() for _ in steps] for _ in range(groups)]
    for offer in result.stores:
        if offer.request != "producer":
            continue
        index = min(max(offer.step - first, 0), len(steps) - 1)
        for g, chunks in offer.offered.items():
            offers[g][index].update(chunks)
    scheduled = tuple(outcome.scheduled) if outcome is not None else ()
    return StoreReplay(case.to_json(),
                       tuple(tuple(tuple(sorted(s)) for s in group) for group in offers),
                       scheduled, tuple(running), raised, None)


def _no_driver_gap(observation: LiveObservation) -> None:
    """Raise :class:`DriverGapError` when the run stopped on a gap of the driver."""
    gap = observation.driver_gap
    if gap is not None:
        raise DriverGapError(gap)


def confirm(geometry: Geometry, prompt_len: int, consumer: str = "resend", *,
            shared: int | None = None, steps: tuple[int, ...] | None = None,
            ending: str = "finished", decode: int = 3,
            options: BuildOptions | None = None) -> Confirmation:
    """:func:`confirm_case` of :func:`end_to_end_case` (the audit's entry point for a
    lost-hit row: geometry, prompt, consumer kind; the retention is the geometry's)."""
    case = end_to_end_case(geometry, prompt_len, consumer, shared=shared, steps=steps,
                           ending=ending, decode=decode)
    return confirm_case(case, options)
