"""Partial tails on the live engine: vLLM's sub-chunk boundary (since 0.33.0), held
against the contract's statement (docs/CONTRACT.md 9.2, :mod:`kvcontract.spec.partial_tail`).

A producer/consumer trace (the end-to-end family's own case shape,
:func:`kvcontract.live.confirm.end_to_end_case`) runs on vLLM's scheduler, KV-cache
manager and ``OffloadingConnector`` as they are; whether partial tails are on is vLLM's
own planning's answer (``SchedulerOffloadConfig.supports_partial_tail`` and the GPU
coordinator's ``enable_partial_hash_hits``), read off the built objects. Every
``lookup``, ``prepare_load`` and ``prepare_store`` the connector makes is recorded with
the token position vLLM gave its key (``ReqContext.get_offload_key_position``): a key at
a position that is not a multiple of the chunk is a partial-tail key. The checks
(:meth:`PartialTailRun.checks`) are the stated clauses:

* vLLM turns partial tails on exactly where the contract says (``partial_tail_off``);
* C2: vLLM raised nothing (no "not found"/"not ready"), and every key the consumer loads
  was answered ``HIT`` to it and stored by the producer;
* what is stored: the producer's partial keys are at ``b(P)``, one per group;
* C12: the consumer's hit is at least ``partial_tail_promise``, and a hit at ``b(P)``
  reads every group's partial block back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcontract.live.build import BuildOptions, LiveEngine, Refused, build
from kvcontract.live.capabilities import vllm_names
from kvcontract.live.confirm import _traces, end_to_end_case, options_for
from kvcontract.live.observation import LiveObservation
from kvcontract.live.run import LiveRun, shutdown
from kvcontract.live.trace import Phase, Trace, TraceRequest, producer_consumer, prompt_tokens
from kvcontract.live.worker import Timing
from kvcontract.spec.geometry import Geometry, fa, mamba
from kvcontract.spec.partial_tail import (
    partial_tail_boundary,
    partial_tail_off,
    partial_tail_promise,
)

PARTIAL_TAIL_GEOMETRY = Geometry((fa(64), mamba(64)), hash_block_size=16)
"""FA and a Mamba group (align mode), both 64-token blocks, hashed in blocks of 16,
``bpc`` 1, retention None: vLLM (0.33.0, 0.34.0) turns partial tails on."""


@dataclass(frozen=True)
class KeyEvent:
    """One manager call on one key: ``what`` is ``lookup``, ``load`` or ``store``;
    ``position`` the token position vLLM keyed it at; ``result`` the lookup's answer,
    or for a store whether the manager took it as new."""

    step: int
    what: str
    request: str
    group: int
    position: int
    result: str
    in_flight: bool = False
    """For a ``load``: the key was among the loads vLLM had in flight for other requests
    when this one was prepared (the connector's ``_chunks_being_loaded``)."""


@dataclass
class PartialTailRun:
    """One producer/consumer trace and what the contract says about it."""

    geometry: Geometry
    prompt_len: int
    consumer: str
    consumer_tokens: int
    shared_tokens: int
    supports_partial_tail: bool | None
    """The connector's decision; None: the release has no partial-tail path."""
    partial_hash_hits: bool
    observation: LiveObservation
    events: list[KeyEvent] = field(default_factory=list)

    @property
    def chunk_tokens(self) -> int:
        return self.geometry.chunk_tokens(self.geometry.groups[0])

    @property
    def boundary(self) -> int | None:
        """``b(P)`` by the contract."""
        return partial_tail_boundary(self.geometry, self.prompt_len)

    @property
    def promise(self) -> int:
        return partial_tail_promise(self.geometry, self.prompt_len, self.consumer_tokens,
                                    self.shared_tokens)

    @property
    def hit(self) -> int | None:
        return self.observation.accepted_hit("consumer")

    def partial(self, what: str, request: str) -> dict[int, set[int]]:
        """Per geometry group, the sub-chunk positions of ``what`` calls by ``request``."""
        found: dict[int, set[int]] = {}
        for event in self.events:
            if event.what == what and event.request == request and \
                    event.position % self.chunk_tokens:
                found.setdefault(event.group, set()).add(event.position)
        return found

    def checks(self) -> list[tuple[str, Any, Any, bool]]:
        """``(what, expected, observed, ok)`` for each stated clause (module docstring)."""
        groups = set(range(len(self.geometry.groups)))
        off = partial_tail_off(self.geometry)
        on = bool(self.supports_partial_tail) and self.partial_hash_hits
        found: list[tuple[str, Any, Any, bool]] = [
            ("vLLM turns partial tails on where the contract says",
             "off: " + off if off else "on",
             "the release has no partial-tail path (0.33.0 added it)"
             if self.supports_partial_tail is None else
             f"supports_partial_tail={self.supports_partial_tail}, "
             f"enable_partial_hash_hits={self.partial_hash_hits}",
             self.supports_partial_tail is not None and on == (off is None))]
        raised = [f"{e.type}: {e.message}" for e in self.observation.exceptions]
        found.append(("C2: vLLM raised nothing (no not found / not ready)", [], raised,
                      not raised))
        answered = {(e.group, e.position) for e in self.events
                    if e.what == "lookup" and e.request == "consumer" and e.result == "HIT"}
        stored = {(e.group, e.position) for e in self.events
                  if e.what == "store" and e.request == "producer" and e.result == "new"}
        loaded = {(e.group, e.position) for e in self.events
                  if e.what == "load" and e.request == "consumer"}
        found.append(("C2: every key the consumer loads was HIT and stored by the producer",
                      "loaded <= HIT & stored", sorted(loaded - (answered & stored)),
                      loaded <= answered & stored))
        boundary = self.boundary
        partial_stores = self.partial("store", "producer")
        expected_stores = {g: {boundary} for g in groups} if boundary is not None else {}
        found.append(("the producer stores a partial block at b(P) in every group",
                      _shown(expected_stores), _shown(partial_stores),
                      partial_stores == expected_stores))
        hit = self.hit
        found.append(("C12: the consumer's hit is at least the partial-tail promise",
                      f">= {self.promise}", hit, hit is not None and hit >= self.promise))
        if boundary is not None and hit == boundary:
            read = self.partial("load", "consumer")
            found.append(("a hit at b(P) reads every group's partial block back",
                          _shown({g: {boundary} for g in groups}), _shown(read),
                          read == {g: {boundary} for g in groups}))
        return found

    @property
    def ok(self) -> bool:
        return all(check[3] for check in self.checks())

    def numbers(self) -> dict[str, Any]:
        producer = self.observation.requests.get("producer")
        return {"prompt_len": self.prompt_len, "consumer": self.consumer,
                "consumer_tokens": self.consumer_tokens, "shared": self.shared_tokens,
                "boundary": self.boundary, "promise": self.promise, "hit": self.hit,
                "producer_steps": list(producer.scheduled) if producer else [],
                "partial_stores": _shown(self.partial("store", "producer")),
                "partial_loads": _shown(self.partial("load", "consumer")),
                "supports_partial_tail": self.supports_partial_tail,
                "enable_partial_hash_hits": self.partial_hash_hits}


def _shown(found: dict[int, set[int]]) -> dict[str, list[int]]:
    return {str(g): sorted(found[g]) for g in sorted(found)}


class _KeyRecorder:
    """The connector's manager (LiveRun's recording proxy), every call delegated; each
    key of a ``lookup``, ``prepare_load`` or ``prepare_store`` logged with its position."""

    def __init__(self, inner: Any, run: LiveRun, events: list[KeyEvent]) -> None:
        self._inner = inner
        self._run = run
        self._events = events

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        what = {"lookup": "lookup", "prepare_load": "load", "prepare_store": "store"}.get(name)
        if what is None:
            return attribute

        def recorded(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            context = args[1] if len(args) > 1 else kwargs.get("req_context")
            keys = [args[0]] if what == "lookup" else list(args[0])
            new = set(result.keys_to_store) if what == "store" and result is not None \
                else set()
            for key in keys:
                outcome = (str(result.name) if what == "lookup" else
                           ("new" if key in new else "not new") if what == "store" else "")
                self._log(what, context, key, outcome)
            return result

        return recorded

    def _log(self, what: str, context: Any, key: Any, outcome: str) -> None:
        get_offload_group_idx = vllm_names("vllm.v1.kv_offload.base", "get_offload_group_idx")
        engine = self._run.engine
        rid = str(getattr(context, "req_id", ""))
        position = context.get_offload_key_position(key)
        loading = getattr(engine.connector_scheduler, "_chunks_being_loaded", None) or ()
        self._events.append(KeyEvent(
            self._run.step, what, self._run.recorder.names.get(rid, rid),
            engine.group_of[int(get_offload_group_idx(key))],
            -1 if position is None else int(position), outcome,
            what == "load" and key in loading))


def _flags(engine: LiveEngine) -> tuple[bool | None, bool]:
    """vLLM's own decisions: the connector's ``supports_partial_tail`` (None: the
    release has no partial-tail path, before 0.33) and the GPU coordinator's
    ``enable_partial_hash_hits``."""
    config = engine.connector_scheduler.config
    coordinator = engine.scheduler.kv_cache_manager.coordinator
    supports = getattr(config, "supports_partial_tail", None)
    return (None if supports is None else bool(supports),
            bool(getattr(coordinator, "enable_partial_hash_hits", False)))


def run_partial_tail(geometry: Geometry = PARTIAL_TAIL_GEOMETRY, prompt_len: int = 230,
                     consumer: str = "resend", *, shared: int | None = None,
                     steps: tuple[int, ...] | None = None,
                     options: BuildOptions | None = None) -> PartialTailRun | Refused:
    """A producer of ``prompt_len`` prompt tokens (prefill in ``steps``, one shot by
    default), its stores completed, the GPU prefix cache reset, then a ``resend``,
    ``continuation`` or ``sibling`` consumer (sharing ``shared`` tokens), on the live
    engine; or why vLLM would not build ``geometry``."""
    case = end_to_end_case(geometry, prompt_len, consumer, shared=shared, steps=steps)
    producer, consumer_request = _traces(case)
    traced = run_key_trace(geometry, producer_consumer(producer, consumer_request),
                           options_for(case, options))
    if isinstance(traced, Refused):
        return traced
    supports, partial_hits, observation, events = traced
    return PartialTailRun(geometry, prompt_len, consumer, case.consumer.num_tokens,
                          case.consumer.shared_tokens, supports, partial_hits, observation,
                          events)


LOAD_DELAY = 3
"""Steps the worker takes over each load in :func:`run_partial_tail_being_loaded`."""


@dataclass
class BeingLoadedRun:
    """A partial tail whose load is in flight for one request (``first``) when another
    (``second``, the same prompt, one step later) looks it up; both have the chunks
    below ``b(P)`` in the GPU prefix cache (a ``warm`` request loaded them), so only the
    partial keys are in question (docs/CONTRACT.md 9.2, load safety)."""

    geometry: Geometry
    prompt_len: int
    supports_partial_tail: bool | None
    observation: LiveObservation
    events: list[KeyEvent] = field(default_factory=list)

    @property
    def boundary(self) -> int | None:
        return partial_tail_boundary(self.geometry, self.prompt_len)

    def _steps(self, what: str, request: str, position: int) -> list[int]:
        return [e.step for e in self.events
                if e.what == what and e.request == request and e.position == position]

    def checks(self) -> list[tuple[str, Any, Any, bool]]:
        boundary = self.boundary
        found: list[tuple[str, Any, Any, bool]] = [
            ("vLLM has partial tails on this geometry", True, self.supports_partial_tail,
             bool(self.supports_partial_tail) and boundary is not None)]
        if boundary is None:
            return found
        first_loads = self._steps("load", "first", boundary)
        second_looks = self._steps("lookup", "second", boundary)
        reached = bool(first_loads) and any(
            0 < step - min(first_loads) < LOAD_DELAY for step in second_looks)
        found.append(("the second looks b(P) up while the first's load of it is in flight "
                      "(the case is reached)", True, reached, reached))
        raised = [f"{e.type}: {e.message}" for e in self.observation.exceptions]
        found.append(("C2: vLLM raised nothing (no not found / not ready)", [], raised,
                      not raised))
        stored = {(e.group, e.position) for e in self.events
                  if e.what == "store" and e.request == "producer" and e.result == "new"}
        for name in ("first", "second"):
            answered = {(e.group, e.position) for e in self.events
                        if e.what == "lookup" and e.request == name and e.result == "HIT"}
            loaded = {(e.group, e.position) for e in self.events
                      if e.what == "load" and e.request == name}
            found.append((f"C2: every key {name} loads was HIT and stored by the producer",
                          "loaded <= HIT & stored", sorted(loaded - (answered & stored)),
                          loaded <= answered & stored))
        in_flight = sorted((e.request, e.group, e.position) for e in self.events
                           if e.what == "load" and e.in_flight)
        found.append(("C2: no request loads a key another request's load has in flight "
                      "(the being-loaded deferral)", [], in_flight, not in_flight))
        for name in ("first", "second"):
            outcome = self.observation.requests.get(name)
            reused = outcome.reused_tokens if outcome else None
            found.append((f"C12: {name} reuses at least b(P) tokens (GPU prefix and tail)",
                          f">= {boundary}", reused, reused is not None and reused >= boundary))
        return found

    @property
    def ok(self) -> bool:
        return all(check[3] for check in self.checks())

    def numbers(self) -> dict[str, Any]:
        requests = self.observation.requests
        return {"prompt_len": self.prompt_len, "boundary": self.boundary,
                "load_delay": LOAD_DELAY,
                **{name: {"hit": self.observation.accepted_hit(name),
                          "reused_tokens": requests[name].reused_tokens,
                          "steps": list(requests[name].scheduled)}
                   for name in ("warm", "first", "second") if name in requests},
                "partial_loads": {name: _shown(self._partial_loads(name))
                                  for name in ("first", "second")},
                "loads_in_flight_elsewhere": sorted(
                    f"{e.request}: group {e.group} at {e.position}" for e in self.events
                    if e.what == "load" and e.in_flight),
                "supports_partial_tail": self.supports_partial_tail}

    def _partial_loads(self, request: str) -> dict[int, set[int]]:
        tpc = self.geometry.chunk_tokens(self.geometry.groups[0])
        found: dict[int, set[int]] = {}
        for event in self.events:
            if event.what == "load" and event.request == request and event.position % tpc:
                found.setdefault(event.group, set()).add(event.position)
        return found


def run_partial_tail_being_loaded(geometry: Geometry = PARTIAL_TAIL_GEOMETRY,
                                  prompt_len: int = 230) -> BeingLoadedRun | Refused:
    """A producer of ``prompt_len`` tokens (its stores completed, the GPU prefix cache
    reset); a ``warm`` request of its first chunks plus a few tokens loads the complete
    chunks below ``b(P)`` into the GPU prefix cache; then ``first`` (a resend) and, one
    step later, ``second`` (another resend), every load taking :data:`LOAD_DELAY` steps:
    ``first`` loads the partial tail, ``second`` finds it being loaded."""
    tokens = prompt_tokens(prompt_len)
    chunk = geometry.chunk_tokens(geometry.groups[0])
    below = (prompt_len - 1) // chunk * chunk
    trace = Trace((Phase((TraceRequest("producer", tuple(tokens)),),
                         reset_prefix_cache_after=True),
                   Phase((TraceRequest("warm", tuple(tokens[:below + 8])),)),
                   Phase((TraceRequest("first", tuple(tokens)),
                          TraceRequest("second", tuple(tokens), arrive_at=1)))),
                  Timing("delayed", LOAD_DELAY, "load"))
    length = 1 << (prompt_len + 8 - 1).bit_length()
    traced = run_key_trace(geometry, trace, BuildOptions(max_model_len=length))
    if isinstance(traced, Refused):
        return traced
    supports, _, observation, events = traced
    return BeingLoadedRun(geometry, prompt_len, supports, observation, events)


CAMPAIGN_GEOMETRIES = (
    PARTIAL_TAIL_GEOMETRY,
    Geometry((fa(32), mamba(32)), hash_block_size=8),
    Geometry((fa(64), mamba(64)), hash_block_size=32),
    Geometry((fa(64), mamba(64)), hash_block_size=16, retention_interval=0),
    Geometry((fa(64), mamba(64)), hash_block_size=16, blocks_per_chunk=2),
)
"""The geometries a partial-tail campaign draws from: FA + Mamba (align mode) with a hash
block finer than the block, at two block sizes and two hash blocks, at vLLM's default
retention interval too, and one with two blocks per chunk (partial tails off: the campaign
checks vLLM agrees). EAGLE geometries are left out: vLLM has partial tails there, keyed at
a proof position, and the contract states no promise for them
(:func:`kvcontract.spec.partial_tail.partial_tail_off` says "not checked")."""

CAMPAIGN_CONSUMERS = ("resend", "continuation", "sibling")


@dataclass(frozen=True)
class PartialTailDraw:
    """One drawn producer/consumer case of a partial-tail campaign."""

    geometry_index: int
    prompt_len: int
    consumer: str
    shared: int | None
    steps: tuple[int, ...] | None

    @property
    def geometry(self) -> Geometry:
        return CAMPAIGN_GEOMETRIES[self.geometry_index]

    def describe(self) -> str:
        steps = "one shot" if self.steps is None else "+".join(map(str, self.steps))
        shared = "" if self.shared is None else f" sharing {self.shared}"
        return (f"{self.geometry.describe()} P={self.prompt_len} ({steps}), "
                f"{self.consumer}{shared}")


def draw_partial_tail_cases(seed: int, count: int) -> list[PartialTailDraw]:
    """``count`` cases drawn from ``seed`` alone: a geometry of
    :data:`CAMPAIGN_GEOMETRIES`, a prompt of one to five chunks (a sub-chunk tail most of
    the time), a consumer (a sibling sharing any prefix), a prefill in one shot or in up
    to four steps."""
    import random

    rng = random.Random(f"partial-tails/{seed}")
    drawn: list[PartialTailDraw] = []
    for _ in range(count):
        index = rng.randrange(len(CAMPAIGN_GEOMETRIES))
        geometry = CAMPAIGN_GEOMETRIES[index]
        chunk = geometry.chunk_tokens(geometry.groups[0])
        prompt = rng.randint(2, 5 * chunk)
        consumer = rng.choice(CAMPAIGN_CONSUMERS)
        shared = rng.randint(1, prompt) if consumer == "sibling" else None
        steps: tuple[int, ...] | None = None
        if prompt > 4 and rng.random() < 0.5:
            cuts = sorted(rng.sample(range(1, prompt), min(3, prompt - 1, rng.randint(1, 3))))
            steps = tuple(b - a for a, b in zip([0, *cuts], [*cuts, prompt], strict=True))
        drawn.append(PartialTailDraw(index, prompt, consumer, shared, steps))
    return drawn


@dataclass
class PartialTailCampaign:
    """Drawn partial-tail cases run on vLLM's engine, each judged by
    :meth:`PartialTailRun.checks`."""

    seed: int
    runs: int = 0
    refused: list[str] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    """Per failing case: the case, its numbers and each failed check."""
    served_at_tail: int = 0
    """Consumers vLLM served at a sub-chunk boundary (the path is reached)."""

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "runs": self.runs, "served_at_tail": self.served_at_tail,
                "refused": self.refused, "violations": self.violations}

    def clauses(self) -> set[str]:
        """The clauses a failed check states (C2, C12); a check that states none (vLLM
        turns partial tails on where the contract does not say so) is the model's gap."""
        return {str(c["clause"]) for v in self.violations for c in v["failed"] if c["clause"]}

    @property
    def model_gaps(self) -> int:
        return sum(1 for v in self.violations for c in v["failed"] if not c["clause"])

    def summary(self) -> str:
        return (f"partial tails on vLLM: {self.runs} drawn cases (seed {self.seed}), "
                f"{self.served_at_tail} served at a sub-chunk boundary, "
                f"{len(self.violations)} violating, {len(self.refused)} refused")


def run_partial_tail_campaign(seed: int, count: int) -> PartialTailCampaign:
    """:func:`draw_partial_tail_cases` run on the installed vLLM's engine
    (:func:`run_partial_tail`) and judged; a case vLLM refuses to build is listed with
    why. Depends only on ``seed``, ``count`` and the release."""
    campaign = PartialTailCampaign(seed)
    for draw in draw_partial_tail_cases(seed, count):
        run = run_partial_tail(draw.geometry, draw.prompt_len, draw.consumer,
                               shared=draw.shared, steps=draw.steps)
        if isinstance(run, Refused):
            campaign.refused.append(f"{draw.describe()}: {run.reason}")
            continue
        campaign.runs += 1
        hit = run.hit
        if hit and hit % run.chunk_tokens:
            campaign.served_at_tail += 1
        failed = [{"check": what, "clause": what.split(":", 1)[0] if what.startswith("C")
                   else None, "expected": str(expected), "observed": str(observed)}
                  for what, expected, observed, ok in run.checks() if not ok]
        if failed:
            campaign.violations.append({"case": draw.describe(), "numbers": run.numbers(),
                                        "failed": failed})
    return campaign


KeyTrace = tuple[bool | None, bool, LiveObservation, list[KeyEvent]]
"""vLLM's ``supports_partial_tail`` and ``enable_partial_hash_hits`` (:func:`_flags`), the
run's observation and every key event of its manager calls."""


def run_key_trace(geometry: Geometry, trace: Trace,
                  options: BuildOptions | None = None) -> KeyTrace | Refused:
    """Any ``trace`` on the live engine for ``geometry``, every ``lookup``,
    ``prepare_load`` and ``prepare_store`` logged with its key's position
    (:class:`KeyEvent`); or why vLLM would not build ``geometry``."""
    engine = build(geometry, options)
    if isinstance(engine, Refused):
        return engine
    try:
        run = LiveRun(engine, trace)
        events: list[KeyEvent] = []
        connector_scheduler = engine.connector_scheduler
        connector_scheduler.manager = _KeyRecorder(connector_scheduler.manager, run, events)
        supports, partial_hits = _flags(engine)
        observation = run.run()
    finally:
        shutdown(engine)
    return supports, partial_hits, observation, events


__all__ = ["CAMPAIGN_GEOMETRIES", "LOAD_DELAY", "PARTIAL_TAIL_GEOMETRY", "BeingLoadedRun",
           "KeyEvent", "KeyTrace", "PartialTailCampaign", "PartialTailDraw", "PartialTailRun",
           "draw_partial_tail_cases", "run_key_trace", "run_partial_tail",
           "run_partial_tail_being_loaded", "run_partial_tail_campaign"]
